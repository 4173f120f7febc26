/* tokamak run with many prompts: every prompt is one engine request; they run
 * together under continuous batching. Output lines are tagged "[i] " with the
 * prompt's number (0-based, file order), released a line at a time as tokens
 * stream in; the summary goes to stderr. */
#include "cli/run.h"

#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bench/report.h"
#include "bench/stats.h"
#include "cli/cli.h"
#include "core/alloc.h"
#include "core/error.h"
#include "core/names.h"
#include "model/model.h"
#include "tokamak.h"
#include "tokenizer/tokenizer.h"

typedef struct rm_req {
    int idx;
    int32_t *ids; /* (n_ids) prompt */
    int n_ids;
    char *line; /* (line_cap) text not yet printed (no newline yet) */
    size_t line_len, line_cap;
    tk_finish reason;
    tk_request_times times;
    double t_last; /* time of the last token */
    bool done;
    bool text; /* print text (else ids) */
    FILE *out;
} rm_req;

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
    if (ev->reason == TK_FINISH_ERROR)
        fprintf(stderr, "[%d] error: %s\n", r->idx, ev->message ? ev->message : "?");
    r->reason = ev->reason;
    r->times = ev->times;
    pthread_mutex_lock(&c->sync->mu);
    r->done = true;
    c->sync->finished++;
    pthread_cond_signal(&c->sync->cv);
    pthread_mutex_unlock(&c->sync->mu);
}

/* FILE's lines (empty ones skipped; "\n" or "\r\n" ends one), at most
 * RUN_PROMPTS_MAX bytes; a NUL byte is an error naming its line. */
static char **read_lines(const char *path, int *n_out) {
    FILE *f = fopen(path, "rb");
    if (!f) {
        fprintf(stderr, "tokamak run: cannot open %s: %s\n", path, strerror(errno));
        return NULL;
    }
    size_t len = 0;
    char *text = NULL;
    tk_status st = cli_read_all(f, path, RUN_PROMPTS_MAX, &text, &len);
    fclose(f);
    if (st != TK_OK) {
        fprintf(stderr, "tokamak run: --prompts %s\n", tk_last_error());
        return NULL;
    }
    char **lines = NULL;
    int n = 0, cap = 0, line_no = 0;
    for (size_t pos = 0; pos < len;) {
        const char *nl = memchr(text + pos, '\n', len - pos);
        size_t end = nl ? (size_t)(nl - text) : len, k = end - pos;
        line_no++;
        if (memchr(text + pos, 0, k)) {
            fprintf(stderr, "tokamak run: --prompts %s: line %d holds a NUL byte\n", path, line_no);
            goto fail;
        }
        if (k > 0 && text[pos + k - 1] == '\r') k--;
        if (k > 0) {
            if (n == cap) {
                int nc = cap ? cap * 2 : 16;
                char **nl2 = tk_realloc(lines, (size_t)nc * sizeof *nl2);
                if (!nl2) goto nomem;
                lines = nl2;
                cap = nc;
            }
            if (!(lines[n] = tk_malloc(k + 1))) goto nomem;
            memcpy(lines[n], text + pos, k);
            lines[n++][k] = 0;
        }
        pos = end + 1;
    }
    tk_free(text);
    if (n == 0) {
        tk_free(lines);
        fprintf(stderr, "tokamak run: %s has no prompts\n", path);
        return NULL;
    }
    *n_out = n;
    return lines;
nomem:
    fprintf(stderr, "tokamak run: out of memory reading %s\n", path);
fail:
    for (int i = 0; i < n; i++) tk_free(lines[i]);
    tk_free(lines);
    tk_free(text);
    return NULL;
}

int run_many(const cli_opts *o, const run_args *a) {
    const char *model_path = o->model_path;
    tk_request base;
    tk_request_default(&base);
    base.sampling = o->sampling;
    base.ignore_eos = a->ignore_eos;
    base.max_tokens = a->n; /* 0: until the context is full */
    for (int i = 0; i < a->stop.n; i++) base.stop[i] = a->stop.s[i];
    tk_engine_opts eo = o->engine;
    bool quiet = a->quiet;
    const char *prompts_path = a->prompts, *prompt_text = a->prompt, *token_list = a->tokens;

    tk_model *m = NULL;
    if (tk_model_open(model_path, &o->model, &m) != TK_OK) {
        fprintf(stderr, "tokamak run: %s\n", tk_last_error());
        return 1;
    }
    cli_opts fit = *o;
    cli_opts_fit_model(&fit, m);
    eo.ctx = fit.engine.ctx;
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
        n_req = a->parallel;
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
        if (lines)
            st = run_encode(m, a, lines[i], &r->ids, &r->n_ids);
        else if (prompt_text)
            st = run_encode(m, a, prompt_text, &r->ids, &r->n_ids);
        else if (cli_parse_ids(token_list, &r->ids, &r->n_ids))
            st = TK_OK;
        else
            st = tk_fail(TK_ERR_INVALID, "--tokens '%s' is not a list of token ids", token_list);
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

    /* Summary. TTFT: queued -> first token. TPOT: (finished-ish last token - first token) / (n_output - 1).
     */
    tk_engine_stats es;
    tk_engine_stats_get(e, &es);
    fprintf(stderr, "\n%-5s %7s %7s %10s %10s %-9s %s\n", "req", "prompt", "output", "TTFT ms", "TPOT ms",
            "finish", "preempted");
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
                names_str(&NAMES_FINISH, (int)r->reason), t->n_preempted);
    }
    double med = 0;
    if (n_tpot && tpots && stats_percentile(tpots, (size_t)n_tpot, 50, &med) != TK_OK) med = 0;
    tk_free(tpots);
    char budget[256];
    if (es.step_adaptive) {
        char target[32] = "auto";
        if (es.step_ms > 0) snprintf(target, sizeof target, "%g ms", es.step_ms);
        char model[160];
        report_step_model(&es, model, sizeof model);
        snprintf(budget, sizeof budget, "time-based: target %s, cap %d (measured: %s)", target,
                 es.step_tokens, model);
    } else {
        snprintf(budget, sizeof budget, "fixed %d tokens", es.step_tokens);
    }
    fprintf(
        stderr,
        "requests %d  wall %.3f s  output %llu tok (%.2f tok/s)  total %llu tok (%.2f tok/s)  median TPOT "
        "%.2f ms\n"
        "engine: steps %llu  preemptions %llu  kv blocks peak %d/%d (block %d, %zu B/token)  max batch %d  "
        "threads %d\n"
        "step budget %s\n",
        n_req, wall, (unsigned long long)out_tok, wall > 0 ? (double)out_tok / wall : 0,
        (unsigned long long)(out_tok + in_tok), wall > 0 ? (double)(out_tok + in_tok) / wall : 0, med,
        (unsigned long long)es.steps, (unsigned long long)es.preemptions, es.kv_blocks_peak,
        es.kv_blocks_total, es.block_size, es.kv_bytes_per_token, es.max_batch, es.n_threads, budget);
    if (es.prefix_cache)
        fprintf(stderr, "prefix cache: %llu of %llu prompt tokens cached, %d blocks cached, %llu evicted\n",
                (unsigned long long)es.prefix_cache_hit_tokens,
                (unsigned long long)es.prefix_cache_query_tokens, es.prefix_cache_blocks,
                (unsigned long long)es.prefix_cache_evictions);
    else
        fprintf(stderr, "prefix cache: off\n");
    if (es.spec != TK_SPEC_OFF)
        fprintf(
            stderr,
            "speculation %s: %llu drafted, %llu accepted (%.1f%%), drafts in %llu of %llu decodes "
            "with a draft on offer (k %s %d), step cost %.3f ms + %.3f ms/token; %llu positions fed again "
            "after rejections (%llu blocks put back)\n",
            names_str(&NAMES_SPEC, (int)es.spec), (unsigned long long)es.spec_drafted,
            (unsigned long long)es.spec_accepted,
            es.spec_drafted ? 100.0 * (double)es.spec_accepted / (double)es.spec_drafted : 0.0,
            (unsigned long long)es.spec_verifies, (unsigned long long)es.spec_decodes,
            es.spec_fixed ? "fixed at" : "cap", es.spec_k, es.spec_step_ms_base, es.spec_step_ms_per_token,
            (unsigned long long)es.spec_refed_tokens, (unsigned long long)es.spec_kv_restores);
    if (es.spec == TK_SPEC_DRAFT)
        fprintf(stderr,
                "draft model: %.3f s drafting, %.1f%% of the speculating decode steps, pass cost %.3f ms + "
                "%.3f ms/sequence; %.3f s prefilling %llu prompt tokens\n",
                es.spec_draft_seconds,
                es.spec_turn_seconds > 0 ? 100.0 * es.spec_draft_seconds / es.spec_turn_seconds : 0.0,
                es.spec_draft_ms_base, es.spec_draft_ms_per_seq, es.spec_follow_seconds,
                (unsigned long long)es.spec_follow_tokens);
    if (es.spec == TK_SPEC_OFF) fprintf(stderr, "speculation: off\n");
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
