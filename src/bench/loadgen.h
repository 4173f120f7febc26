/* tokamak loadgen: the bench's load and report, against any OpenAI-compatible
 * server over HTTP (libcurl), timed from the client (definitions in
 * docs/benchmarking.md).
 *
 * Every request is a streaming POST /v1/completions whose prompt is a list of
 * token ids of exactly --in tokens: real words, tokenized by the model's own
 * tokenizer (a local model file, or the server's POST /tokenize), so that the
 * prompt's length does not depend on how a server counts text. A token
 * arrives with the SSE frame that carries it; the output length is the
 * server's usage count.
 *
 * Ownership: loadgen_run fills a bench_result that the caller frees with
 * bench_result_free, also after a failed run. One thread does everything. */
#ifndef TK_BENCH_LOADGEN_H
#define TK_BENCH_LOADGEN_H

#include <stdbool.h>
#include <stddef.h>

#include "bench/bench.h"

typedef struct loadgen_opts {
    bench_opts b;          /* the load: in/out, levels or rates, requests, warmup, repeat, seed,
                            * background; its model and engine fields are not used */
    const char *url;       /* the server: "http://host:port" (a trailing "/" or "/v1" is dropped) */
    const char *model;     /* the request's "model"; NULL: the first of GET /v1/models */
    const char *api_key;   /* sent as "Authorization: Bearer KEY"; NULL: none */
    const char *tokenizer; /* a model file whose tokenizer makes the prompts; NULL: POST /tokenize */
    double duration_s;     /* > 0: each run submits for this long instead of a request count */
    double timeout_s;      /* a request that receives nothing for this long fails (default 300) */
} loadgen_opts;

void loadgen_opts_default(loadgen_opts *o);

/* Run every level (or rate) `repeat` times against the server. A request that
 * fails is counted in its run's bench_level.err by status and does not stop
 * the run; what stops it is a failure before the load starts (server
 * unreachable, no model, no tokenizer) or a background stream that does not
 * start. Progress goes to stderr unless o->b.quiet. */
tk_status loadgen_run(const loadgen_opts *o, bench_result *out);

/* ---- the SSE reader (pure; exposed for its tests and fuzz target) ---------- */

/* Server-sent events as the WHATWG spec reads them: lines end with LF, CR or
 * CRLF; "data:" lines (one optional space after the colon) accumulate, joined
 * by LF; a blank line dispatches the event; comments (":...") and other fields
 * are ignored. */
typedef struct lg_sse {
    char *line; /* the current, unfinished line */
    size_t n_line, cap_line;
    char *data; /* the current event's data */
    size_t n_data, cap_data;
    bool has_data; /* a data field was seen (an empty "data:" still dispatches) */
    bool cr;       /* the last byte was CR: a following LF belongs to it */
} lg_sse;

#define LG_SSE_MAX_LINE (1u << 20) /* longer lines or events fail the stream */

/* Called once per dispatched event with its data (NUL-terminated, n bytes).
 * Return false to stop reading. */
typedef bool (*lg_sse_fn)(void *user, const char *data, size_t n);

/* Feed n bytes; calls fn for each event they complete. False when fn stopped
 * or a line or an event passed LG_SSE_MAX_LINE (or memory ran out). */
bool lg_sse_feed(lg_sse *p, const char *buf, size_t n, lg_sse_fn fn, void *user);
void lg_sse_free(lg_sse *p);

/* What one data payload of a completion stream says. */
typedef struct lg_frame {
    bool done;             /* "[DONE]" */
    bool json_ok;          /* parsed as a JSON object */
    bool has_text;         /* choices[0] carries non-empty text (text, delta.content or reasoning) */
    int completion_tokens; /* usage.completion_tokens, -1 when absent */
    int prompt_tokens;     /* usage.prompt_tokens, -1 when absent */
    tk_finish finish;      /* choices[0].finish_reason; TK_FINISH_NONE when absent */
    char error[128];       /* an "error" object's message ("" when none) */
} lg_frame;

void lg_frame_parse(const char *data, size_t n, lg_frame *out);

#endif
