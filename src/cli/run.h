/* tokamak run: one option set for both ways it runs.
 *
 * One prompt (-p TEXT or --tokens IDS) runs as one sequence in cmd_run.c;
 * --prompts FILE or --parallel N run many through the engine (run_many.c).
 * Both parse the same rows (run_parse) and build prompts the same way
 * (run_encode): plain text with special-token text parsed (default) or as
 * text (--no-special), or a chat conversation whose messages are text. */
#ifndef TK_CLI_RUN_H
#define TK_CLI_RUN_H

#include <stdbool.h>
#include <stdint.h>

#include "backend/backend.h"
#include "backend/runner.h"
#include "cli/opts.h"
#include "tokamak.h"

/* Prompt tokens a step of one sequence (run's one prompt, chat) feeds at most. */
#define RUN_CHUNK 512

/* Bytes read from --prompts at most. */
#define RUN_PROMPTS_MAX ((size_t)64 << 20)

typedef struct run_stops {
    const char *s[TK_MAX_STOP];
    int n;
} run_stops;

typedef struct run_args {
    const char *prompt;  /* -p */
    const char *tokens;  /* --tokens */
    const char *prompts; /* --prompts FILE */
    const char *dump;    /* --dump-logits FILE */
    const char *system;  /* --system TEXT (chat) */
    int parallel;        /* --parallel N (0: not given) */
    int n;               /* -n: tokens to generate at most; 0: until the context is full */
    double bw;           /* --bw GB/s for the timing line's % (0: probed) */
    run_stops stop;      /* --stop */
    bool ignore_eos, no_probe, quiet, no_special, chat, no_think;
} run_args;

/* Parse `tokamak run` (argv[0] is "run") into o (model, engine and sampling
 * options) and a. CLI_GO_ON, or the exit code (0 after --help, 2 after a
 * usage error, printed). */
int run_parse(int argc, char **argv, cli_opts *o, run_args *a);

/* True when a asks for many prompts through the engine. */
static inline bool run_is_many(const run_args *a) { return a->prompts || a->parallel; }

/* The prompt ids for text (tk_malloc'd, free with tk_free): with a->chat, the
 * conversation [system a->system,] user text, in the model's chat format,
 * opened for the assistant (its thinking skipped with a->no_think); else the
 * text itself, BOS added where the vocabulary asks, special-token text parsed
 * unless a->no_special. TK_ERR_UNSUPPORTED without a vocabulary. */
tk_status run_encode(const tk_model *m, const run_args *a, const char *text, int32_t **ids, int *n);

/* The backend and runner of one sequence of up to ctx tokens, fed at most
 * max_tokens a step (run's one prompt, chat): o's threads, placement, KV type
 * and scales, --unfused and --even-rows, and KV blocks of 64 tokens unless
 * --block-size is given. The runner is to be freed before the backend. */
tk_status run_one_sequence(const cli_opts *o, const tk_model *m, int ctx, int max_tokens, backend *be,
                           runner **r);

/* The many-prompt path: 0 ok, 1 runtime error, 2 usage error. */
int run_many(const cli_opts *o, const run_args *a);

#endif
