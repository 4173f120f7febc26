/* tokamak run with many prompts: every prompt is one engine request; they run
 * together under continuous batching. Output lines are tagged "[i] " with the
 * prompt's number (0-based, file order), released a line at a time as tokens
 * stream in; the summary goes to stderr. */
#include "cli/run_many.h"

#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli/cli.h"
#include "core/alloc.h"
#include "core/error.h"
#include "model/model.h"
#include "tokenizer/tokenizer.h"
#include "tokamak.h"

typedef struct rm_req {
    int idx;
    int32_t *ids;        /* (n_ids) prompt */
    int n_ids;
    char *line;          /* (line_cap) text not yet printed (no newline yet) */
    size_t line_len, line_cap;
    tk_finish reason;
    tk_request_times times;
    double t_last;       /* time of the last token */
    bool done;
    bool text;           /* print text (else ids) */
    FILE *out;
} rm_req;

static void usage(void) {
    fprintf(stderr,
            "usage: tokamak run -m MODEL (--prompts FILE | --parallel N (-p TEXT | --tokens IDS)) [-n N]\n"
            "         [--temp T] [--top-k K] [--top-p P] [--min-p P] [--seed S] [--ignore-eos] [--stop STR]...\n"
            "         [--threads N] [--pin] [--ctx N] [--max-batch N] [--max-seqs N] [--kv-mem BYTES]\n"
            "         [--block-size 16|32|64|128|256] [--kv-type f32|f16|bf16|int8] [--kv-scale head|token]\n"
            "         [--step-ms MS] [--step-tokens N] [--no-chunking] [--static-batching] [--unfused] [--quiet]\n"
            "  --prompts FILE: one prompt per line (empty lines skipped); --parallel N: N copies of -p/--tokens.\n"
            "  --step-ms MS: target time of a step; prefill chunks are sized from measured costs to fit it\n"
            "  (default: automatic, 2 x the step's decode time, at most 1000 ms). --step-tokens N alone: a fixed\n"
            "  budget of N tokens a step; with --step-ms, the cap of the time-based one (default 1024).\n"
            "  Text is printed as \"[i] line\" per prompt i; the summary (TTFT, TPOT, throughput) goes to stderr.\n");
}

bool run_many_wanted(int argc, char **argv) {
    for (int i = 1; i < argc; i++)
        if (!strcmp(argv[i], "--prompts") || !strcmp(argv[i], "--parallel")) return true;
    return false;
}

/* Append bytes to the request's pending line; print every complete line. */
static void rm_emit(rm_req *r, const char *s, size_t n, bool final) {
    for (size_t i = 0; i < n; i++) {
        if (s[i] == '\n') {
            fprintf(r->out, "[%d] %.*s\n", r->idx, (int)r->line_len, r->line);
            r->line_len = 0;
            continue;
        }
        if (r->line_len + 1 >= r->line_cap) {
            size_t nc = r->line_cap ? r->line_cap * 2 : 256;
            char *nl = tk_realloc(r->line, nc);
            if (!nl) return; /* drop text rather than crash; the summary still prints */
            r->line = nl;
            r->line_cap = nc;
        }
        r->line[r->line_len++] = s[i];
    }
    if (final && r->line_len) {
        fprintf(r->out, "[%d] %.*s\n", r->idx, (int)r->line_len, r->line);
        r->line_len = 0;
    }
    fflush(r->out);
}

typedef struct rm_sync {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int finished;
} rm_sync;

typedef struct rm_fin_ctx {
    rm_req *r;
    rm_sync *sync;
} rm_fin_ctx;

static void rm_on_token(void *user, const tk_token_event *ev) {
    rm_req *r = ((rm_fin_ctx *)user)->r;
    r->t_last = ev->t;
    if (r->text) {
        rm_emit(r, ev->text, ev->text_len, false);
    } else {
        char b[24];
        int k = snprintf(b, sizeof b, " %d", (int)ev->token);
        rm_emit(r, b, (size_t)k, false);
    }
}

static void rm_on_finish(void *user, const tk_finish_event *ev) {
    rm_fin_ctx *c = user;
    rm_req *r = c->r;
    if (ev->text_len) rm_emit(r, ev->text, ev->text_len, false);
    rm_emit(r, "", 0, true);
    if (ev->reason == TK_FINISH_ERROR) fprintf(stderr, "[%d] error: %s\n", r->idx, ev->message ? ev->message : "?");
    r->reason = ev->reason;
    r->times = ev->times;
    pthread_mutex_lock(&c->sync->mu);
    r->done = true;
    c->sync->finished++;
    pthread_cond_signal(&c->sync->cv);
    pthread_mutex_unlock(&c->sync->mu);
}

static const char *finish_name(tk_finish f) {
    switch (f) {
    case TK_FINISH_STOP: return "stop";
    case TK_FINISH_LENGTH: return "length";
    case TK_FINISH_CANCELLED: return "cancelled";
    case TK_FINISH_ERROR: return "error";
    default: return "none";
    }
}

static bool parse_float(const char *s, float *out) {
    char *end;
    errno = 0;
    float v = strtof(s, &end);
    if (errno || end == s || *end) return false;
    *out = v;
    return true;
}

/* "1,2,3" -> ids (tk_malloc'd). */
static bool parse_ids(const char *s, int32_t **out, int *n_out) {
    int cap = 1;
    for (const char *p = s; *p; p++) cap += *p == ',';
    int32_t *ids = tk_calloc((size_t)cap, sizeof *ids);
    if (!ids) return false;
    int n = 0;
    const char *p = s;
    while (*p) {
        char *end;
        errno = 0;
        long v = strtol(p, &end, 10);
        if (errno || end == p || v < 0 || v > INT32_MAX || (*end && *end != ',')) {
            tk_free(ids);
            return false;
        }
        ids[n++] = (int32_t)v;
        p = *end ? end + 1 : end;
    }
    if (n == 0) {
        tk_free(ids);
        return false;
    }
    *out = ids;
    *n_out = n;
    return true;
}

static tk_status encode_text(const tk_tokenizer *tok, const char *text, int32_t **ids, int *n) {
    size_t len = strlen(text);
    size_t cap = tok_encode_bound(tok, len);
    if (cap == 0 || cap > (size_t)INT32_MAX) return tk_fail(TK_ERR_RANGE, "prompt too long (%zu bytes)", len);
    int32_t *buf = tk_calloc(cap, sizeof *buf);
    if (!buf) return tk_fail(TK_ERR_NOMEM, "out of memory encoding a prompt");
    size_t got = 0;
    tk_status st = tok_encode(tok, text, len, true, true, buf, cap, &got);
    if (st != TK_OK) {
        tk_free(buf);
        return st;
    }
    *ids = buf;
    *n = (int)got;
    return TK_OK;
}

/* Read FILE into lines (empty ones skipped). */
static char **read_lines(const char *path, int *n_out) {
    FILE *f = fopen(path, "rb");
    if (!f) {
        fprintf(stderr, "tokamak run: cannot open %s: %s\n", path, strerror(errno));
        return NULL;
    }
    char **lines = NULL;
    int n = 0, cap = 0;
    char *buf = NULL;
    size_t bcap = 0;
    ssize_t k;
    while ((k = getline(&buf, &bcap, f)) >= 0) {
        while (k > 0 && (buf[k - 1] == '\n' || buf[k - 1] == '\r')) buf[--k] = 0;
        if (k == 0) continue;
        if (n == cap) {
            int nc = cap ? cap * 2 : 16;
            char **nl = tk_realloc(lines, (size_t)nc * sizeof *nl);
            if (!nl) break;
            lines = nl;
            cap = nc;
        }
        lines[n] = tk_strdup(buf);
        if (!lines[n]) break;
        n++;
    }
    free(buf);
    fclose(f);
    *n_out = n;
    if (n == 0) {
        tk_free(lines);
        fprintf(stderr, "tokamak run: %s has no prompts\n", path);
        return NULL;
    }
    return lines;
}

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

int run_many(int argc, char **argv) {
    const char *model_path = NULL, *prompts_path = NULL, *prompt_text = NULL, *token_list = NULL;
    long parallel = 0, n_predict = 128;
    bool quiet = false;
    tk_engine_opts eo;
    tk_engine_opts_default(&eo);
    tk_request base;
    tk_request_default(&base);
    int n_stop = 0;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        const char *v = i + 1 < argc ? argv[i + 1] : NULL;
        long n;
#define NEED_VALUE                                                                                                     \
    do {                                                                                                               \
        if (!v) {                                                                                                      \
            fprintf(stderr, "tokamak run: %s needs a value\n", a);                                                     \
            return 2;                                                                                                  \
        }                                                                                                              \
        i++;                                                                                                           \
    } while (0)
#define BAD_VALUE                                                                                                      \
    do {                                                                                                               \
        fprintf(stderr, "tokamak run: bad value '%s' for %s\n", v, a);                                                 \
        return 2;                                                                                                      \
    } while (0)
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            usage();
            return 0;
        } else if (!strcmp(a, "-m") || !strcmp(a, "--model")) {
            NEED_VALUE;
            model_path = v;
        } else if (!strcmp(a, "--prompts")) {
            NEED_VALUE;
            prompts_path = v;
        } else if (!strcmp(a, "--parallel")) {
            NEED_VALUE;
            if (!cli_parse_long(v, 1, 100000, &parallel)) BAD_VALUE;
        } else if (!strcmp(a, "-p") || !strcmp(a, "--prompt")) {
            NEED_VALUE;
            prompt_text = v;
        } else if (!strcmp(a, "--tokens")) {
            NEED_VALUE;
            token_list = v;
        } else if (!strcmp(a, "-n") || !strcmp(a, "--n-predict")) {
            NEED_VALUE;
            if (!cli_parse_long(v, 0, 1 << 24, &n_predict)) BAD_VALUE;
        } else if (!strcmp(a, "--temp")) {
            NEED_VALUE;
            if (!parse_float(v, &base.sampling.temperature)) BAD_VALUE;
        } else if (!strcmp(a, "--top-k")) {
            NEED_VALUE;
            if (!cli_parse_long(v, 0, 1 << 24, &n)) BAD_VALUE;
            base.sampling.top_k = (int)n;
        } else if (!strcmp(a, "--top-p")) {
            NEED_VALUE;
            if (!parse_float(v, &base.sampling.top_p)) BAD_VALUE;
        } else if (!strcmp(a, "--min-p")) {
            NEED_VALUE;
            if (!parse_float(v, &base.sampling.min_p)) BAD_VALUE;
        } else if (!strcmp(a, "--repeat-penalty")) {
            NEED_VALUE;
            if (!parse_float(v, &base.sampling.repetition_penalty)) BAD_VALUE;
        } else if (!strcmp(a, "--seed")) {
            NEED_VALUE;
            char *end;
            errno = 0;
            unsigned long long s = strtoull(v, &end, 10);
            if (errno || end == v || *end) BAD_VALUE;
            base.sampling.seed = s;
        } else if (!strcmp(a, "--ignore-eos")) {
            base.ignore_eos = true;
        } else if (!strcmp(a, "--stop")) {
            NEED_VALUE;
            if (n_stop >= TK_MAX_STOP) {
                fprintf(stderr, "tokamak run: at most %d --stop strings\n", TK_MAX_STOP);
                return 2;
            }
            base.stop[n_stop++] = v;
        } else if (!strcmp(a, "--threads") || !strcmp(a, "-t")) {
            NEED_VALUE;
            if (!cli_parse_long(v, 0, 4096, &n)) BAD_VALUE;
            eo.n_threads = (int)n;
        } else if (!strcmp(a, "--pin")) {
            eo.pin_threads = true;
        } else if (!strcmp(a, "--ctx")) {
            NEED_VALUE;
            if (!cli_parse_long(v, 1, 1 << 24, &n)) BAD_VALUE;
            eo.ctx = (int)n;
        } else if (!strcmp(a, "--max-batch")) {
            NEED_VALUE;
            if (!cli_parse_long(v, 1, 4096, &n)) BAD_VALUE;
            eo.max_batch = (int)n;
        } else if (!strcmp(a, "--max-seqs")) {
            NEED_VALUE;
            if (!cli_parse_long(v, 1, 1 << 20, &n)) BAD_VALUE;
            eo.max_seqs = (int)n;
        } else if (!strcmp(a, "--kv-mem")) {
            NEED_VALUE;
            char *end;
            errno = 0;
            unsigned long long b = strtoull(v, &end, 10);
            if (errno || end == v) BAD_VALUE;
            /* optional K/M/G suffix */
            if (*end == 'K' || *end == 'k') b <<= 10, end++;
            else if (*end == 'M' || *end == 'm') b <<= 20, end++;
            else if (*end == 'G' || *end == 'g') b <<= 30, end++;
            if (*end) BAD_VALUE;
            eo.kv_mem = (size_t)b;
        } else if (!strcmp(a, "--block-size")) {
            NEED_VALUE;
            if (!cli_parse_long(v, 1, 4096, &n)) BAD_VALUE;
            eo.block_size = (int)n;
        } else if (!strcmp(a, "--kv-type")) {
            NEED_VALUE;
            if (!strcmp(v, "f32")) eo.kv_type = TK_KV_F32;
            else if (!strcmp(v, "f16")) eo.kv_type = TK_KV_F16;
            else if (!strcmp(v, "bf16")) eo.kv_type = TK_KV_BF16;
            else if (!strcmp(v, "int8")) eo.kv_type = TK_KV_INT8;
            else BAD_VALUE;
        } else if (!strcmp(a, "--kv-scale")) {
            NEED_VALUE;
            if (!strcmp(v, "head")) eo.kv_scale = TK_KV_SCALE_HEAD;
            else if (!strcmp(v, "token")) eo.kv_scale = TK_KV_SCALE_TOKEN;
            else BAD_VALUE;
        } else if (!strcmp(a, "--step-tokens")) {
            NEED_VALUE;
            if (!cli_parse_long(v, 1, 1 << 20, &n)) BAD_VALUE;
            eo.step_tokens = (int)n;
        } else if (!strcmp(a, "--step-ms")) {
            NEED_VALUE;
            char *end;
            errno = 0;
            double ms = strtod(v, &end);
            if (errno || end == v || *end || !(ms > 0) || ms > 3600e3) BAD_VALUE;
            eo.step_ms = ms;
        } else if (!strcmp(a, "--no-chunking")) {
            eo.no_chunking = true;
        } else if (!strcmp(a, "--static-batching")) {
            eo.static_batching = true;
        } else if (!strcmp(a, "--unfused")) {
            eo.unfused = true;
        } else if (!strcmp(a, "--quiet") || !strcmp(a, "-q")) {
            quiet = true;
        } else {
            fprintf(stderr, "tokamak run: unknown option '%s'\n", a);
            usage();
            return 2;
        }
#undef NEED_VALUE
#undef BAD_VALUE
    }
    if (!model_path) {
        fprintf(stderr, "tokamak run: -m MODEL is required\n");
        return 2;
    }
    if (!!prompts_path == !!parallel) {
        fprintf(stderr, "tokamak run: give exactly one of --prompts FILE or --parallel N\n");
        return 2;
    }
    if (parallel && !!prompt_text == !!token_list) {
        fprintf(stderr, "tokamak run: --parallel needs exactly one of -p TEXT or --tokens IDS\n");
        return 2;
    }
    if (prompts_path && (prompt_text || token_list)) {
        fprintf(stderr, "tokamak run: --prompts takes its prompts from the file, not -p/--tokens\n");
        return 2;
    }
    base.max_tokens = (int)n_predict;
    if (n_predict == 0) base.max_tokens = 0; /* until the context limit */

    tk_model *m = NULL;
    if (tk_model_open(model_path, NULL, &m) != TK_OK) {
        fprintf(stderr, "tokamak run: %s\n", tk_last_error());
        return 1;
    }
    const tk_tokenizer *tok = model_tokenizer(m);
    int rc = 1;
    int n_req = 0;
    char **lines = NULL;
    rm_req *reqs = NULL;
    rm_fin_ctx *fctx = NULL;
    tk_engine *e = NULL;
    rm_sync sync = {.finished = 0};
    FILE *devnull = NULL;
    pthread_mutex_init(&sync.mu, NULL);
    pthread_cond_init(&sync.cv, NULL);

    if (prompts_path) {
        lines = read_lines(prompts_path, &n_req);
        if (!lines) goto done;
        if (!tok) {
            fprintf(stderr, "tokamak run: --prompts needs a tokenizer and %s has none\n", model_path);
            goto done;
        }
    } else {
        n_req = (int)parallel;
        if (prompt_text && !tok) {
            fprintf(stderr, "tokamak run: -p needs a tokenizer and %s has none; use --tokens\n", model_path);
            goto done;
        }
    }
    reqs = tk_calloc((size_t)n_req, sizeof *reqs);
    fctx = tk_calloc((size_t)n_req, sizeof *fctx);
    if (!reqs || !fctx) {
        fprintf(stderr, "tokamak run: out of memory\n");
        goto done;
    }
    for (int i = 0; i < n_req; i++) {
        rm_req *r = &reqs[i];
        r->idx = i;
        r->out = stdout;
        r->text = tok != NULL;
        tk_status st;
        if (lines) st = encode_text(tok, lines[i], &r->ids, &r->n_ids);
        else if (prompt_text) st = encode_text(tok, prompt_text, &r->ids, &r->n_ids);
        else st = parse_ids(token_list, &r->ids, &r->n_ids) ? TK_OK : tk_fail(TK_ERR_INVALID, "bad --tokens '%s'", token_list);
        if (st != TK_OK) {
            fprintf(stderr, "tokamak run: prompt %d: %s\n", i, tk_last_error());
            goto done;
        }
    }
    if (tk_engine_create(m, &eo, &e) != TK_OK) {
        fprintf(stderr, "tokamak run: %s\n", tk_last_error());
        goto done;
    }
    if (quiet) devnull = fopen("/dev/null", "w");
    double t0 = tk_now_s();
    int n_sub = 0;
    for (int i = 0; i < n_req; i++) {
        rm_req *r = &reqs[i];
        if (quiet && devnull) r->out = devnull;
        tk_request q = base;
        q.prompt = r->ids;
        q.n_prompt = r->n_ids;
        q.want_text = tok != NULL;
        q.on_token = rm_on_token;
        q.on_finish = rm_on_finish;
        fctx[i] = (rm_fin_ctx){r, &sync};
        q.user = &fctx[i];
        uint64_t id;
        tk_status st = tk_engine_submit(e, &q, &id);
        if (st != TK_OK) {
            fprintf(stderr, "tokamak run: prompt %d: %s\n", i, tk_last_error());
            r->done = true;
            r->reason = TK_FINISH_ERROR;
            continue;
        }
        n_sub++;
    }
    pthread_mutex_lock(&sync.mu);
    while (sync.finished < n_sub) pthread_cond_wait(&sync.cv, &sync.mu);
    pthread_mutex_unlock(&sync.mu);
    double wall = tk_now_s() - t0;

    /* Summary. TTFT: queued -> first token. TPOT: (finished-ish last token - first token) / (n_output - 1). */
    tk_engine_stats es;
    tk_engine_stats_get(e, &es);
    fprintf(stderr, "\n%-5s %7s %7s %10s %10s %-9s %s\n", "req", "prompt", "output", "TTFT ms", "TPOT ms", "finish",
            "preempted");
    double *tpots = tk_calloc((size_t)n_req + 1, sizeof *tpots);
    int n_tpot = 0;
    uint64_t out_tok = 0, in_tok = 0;
    bool any_error = false;
    for (int i = 0; i < n_req; i++) {
        rm_req *r = &reqs[i];
        const tk_request_times *t = &r->times;
        double ttft = t->first_token > 0 ? (t->first_token - t->queued) * 1e3 : 0;
        double tpot = t->n_output > 1 && r->t_last > t->first_token
                          ? (r->t_last - t->first_token) * 1e3 / (t->n_output - 1)
                          : 0;
        if (t->n_output > 1 && tpots) tpots[n_tpot++] = tpot;
        out_tok += (uint64_t)t->n_output;
        in_tok += (uint64_t)t->n_prompt;
        any_error |= r->reason == TK_FINISH_ERROR;
        fprintf(stderr, "%-5d %7d %7d %10.2f %10.2f %-9s %d\n", i, t->n_prompt, t->n_output, ttft, tpot,
                finish_name(r->reason), t->n_preempted);
    }
    double med = 0;
    if (n_tpot && tpots) {
        qsort(tpots, (size_t)n_tpot, sizeof *tpots, cmp_double);
        med = tpots[n_tpot / 2];
    }
    tk_free(tpots);
    char budget[160];
    if (es.step_adaptive) {
        char target[32] = "auto";
        if (es.step_ms > 0) snprintf(target, sizeof target, "%g ms", es.step_ms);
        snprintf(budget, sizeof budget, "time-based: target %s, cap %d (measured: decode %.2f, prefill %.2f ms/token)",
                 target, es.step_tokens, es.decode_ms_per_token, es.prefill_ms_per_token);
    } else {
        snprintf(budget, sizeof budget, "fixed %d tokens", es.step_tokens);
    }
    fprintf(stderr,
            "requests %d  wall %.3f s  output %llu tok (%.2f tok/s)  total %llu tok (%.2f tok/s)  median TPOT %.2f ms\n"
            "engine: steps %llu  preemptions %llu  kv blocks peak %d/%d (block %d, %zu B/token)  max batch %d  "
            "threads %d\n"
            "step budget %s\n",
            n_req, wall, (unsigned long long)out_tok, wall > 0 ? (double)out_tok / wall : 0,
            (unsigned long long)(out_tok + in_tok), wall > 0 ? (double)(out_tok + in_tok) / wall : 0, med,
            (unsigned long long)es.steps, (unsigned long long)es.preemptions, es.kv_blocks_peak, es.kv_blocks_total,
            es.block_size, es.kv_bytes_per_token, es.max_batch, es.n_threads, budget);
    rc = any_error ? 1 : 0;
done:
    tk_engine_free(e);
    if (reqs)
        for (int i = 0; i < n_req; i++) {
            tk_free(reqs[i].ids);
            tk_free(reqs[i].line);
        }
    if (lines)
        for (int i = 0; i < n_req; i++) tk_free(lines[i]);
    tk_free(lines);
    tk_free(reqs);
    tk_free(fctx);
    if (devnull) fclose(devnull);
    tk_model_free(m);
    pthread_mutex_destroy(&sync.mu);
    pthread_cond_destroy(&sync.cv);
    return rc;
}
