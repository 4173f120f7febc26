/* tokamak eval: what a model's weights or KV type cost in quality, on text.
 * Perplexity over the text in sliding windows (each window --ctx tokens, moved
 * by half of it; every token after the first window is predicted with at least
 * half a window of context). With --ref (the reference: usually the BF16 or
 * F32 weights of the same model, run with f32 KV): per predicted position
 * KL(ref || model) of the next-token distributions (mean and P99) and top-1
 * agreement, both teacher-forced on the text; and greedy continuations of
 * prompts cut from the text, stopped at EOS or the stop string, whose mean
 * length is compared (a model that stops early only looks faster). */
#include <math.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli/calib.h"
#include "cli/cli.h"
#include "cli/compare.h"
#include "core/alloc.h"
#include "core/cpu.h"
#include "core/error.h"
#include "model/model.h"
#include "tokamak.h"

#define EV_CHUNK    64
#define EV_MAX_TEXT (64u << 20)

typedef struct ev_args {
    const char *ref, *file, *stop;
    int max_tokens, n_gen, gen_len, prompt_len;
    bool json, quiet;
} ev_args;

static const cli_opt EV_ROWS[] = {
    {.name = "--ref",
     .arg = "MODEL",
     .help = "reference model (same tokenizer; run with f32 KV and f32 activations)",
     .kind = CLI_STR,
     .off = offsetof(ev_args, ref)},
    {.name = "-f",
     .alias = "--file",
     .arg = "TEXT",
     .help = "the text evaluated (held-out, never the calibration text)",
     .kind = CLI_STR,
     .off = offsetof(ev_args, file)},
    {.name = "--max-tokens",
     .arg = "N",
     .help = "evaluate the first N tokens of the text (default all)",
     .kind = CLI_INT,
     .off = offsetof(ev_args, max_tokens),
     .lo = 2,
     .hi = 1 << 30},
    {.name = "--gen",
     .arg = "N",
     .help = "greedy continuations compared with --ref (default 8, 0: none)",
     .kind = CLI_INT,
     .off = offsetof(ev_args, n_gen),
     .lo = 0,
     .hi = 4096},
    {.name = "--gen-len",
     .arg = "N",
     .help = "most tokens of a continuation (default 64)",
     .kind = CLI_INT,
     .off = offsetof(ev_args, gen_len),
     .lo = 1,
     .hi = 4096},
    {.name = "--gen-prompt",
     .arg = "N",
     .help = "prompt tokens of a continuation (default 32)",
     .kind = CLI_INT,
     .off = offsetof(ev_args, prompt_len),
     .lo = 1,
     .hi = 4096},
    {.name = "--stop",
     .arg = "STR",
     .help = "a continuation ends at this text (default a newline) or at EOS",
     .kind = CLI_STR,
     .off = offsetof(ev_args, stop)},
    {.name = "--json",
     .help = "one JSON object on stdout instead of the table",
     .kind = CLI_FLAG,
     .off = offsetof(ev_args, json)},
    {.name = "--quiet",
     .alias = "-q",
     .help = "no progress bar on stderr",
     .kind = CLI_FLAG,
     .off = offsetof(ev_args, quiet)},
    {0},
};

static const cli_cmd EV_CMD = {
    "eval",
    "usage: tokamak eval -m MODEL -f TEXT [--ref REF_MODEL] [options]",
    CLI_G_MODEL | CLI_G_THREADS | CLI_G_KV,
    EV_ROWS,
    "Perplexity of MODEL over TEXT in sliding windows of --ctx tokens (default 512),\n"
    "moved by half a window. With --ref: KL(ref || model) of the next-token\n"
    "distributions (mean, P99) and top-1 agreement at every scored position, and the\n"
    "mean length of greedy continuations that stop at EOS or --stop, model vs ref.\n"
    "--kv-type/--kv-scale apply to MODEL (the reference runs with f32 KV), so\n"
    "`eval -m BF16 --ref BF16 --kv-type int8` measures INT8 KV alone.",
    0,
    NULL,
};

typedef struct ev_result {
    long n_scored, n_agree;
    double nll, ref_nll, kl_sum, kl_p99;
    int n_gen, stopped, ref_stopped;
    double len_mean, ref_len_mean;
} ev_result;

static int ev_cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

/* Greedy continuation of prompt on q: tokens until EOS, the stop string or max. */
static tk_status ev_continue(cli_seq *q, const tk_model *m, const int32_t *prompt, int np, int max,
                             const char *stop, float *logits, int32_t *gen, int *len, bool *stopped) {
    const int vocab = model_hparams(m)->n_vocab, eos = model_hparams(m)->eos_id;
    tk_status st = runner_truncate(q->r, 0);
    *len = 0, *stopped = false;
    if (!st) st = runner_feed(q->r, prompt, np, logits);
    while (!st && *len < max) {
        int32_t t = (int32_t)cli_argmax(logits, vocab);
        gen[(*len)++] = t;
        if (t == eos) {
            *stopped = true;
            break;
        }
        char *text = NULL;
        size_t tl = 0;
        if ((st = tk_detokenize(m, gen, (size_t)*len, false, &text, &tl))) break;
        bool hit = strstr(text, stop) != NULL;
        tk_free_buf(text);
        if (hit) {
            *stopped = true;
            break;
        }
        if (*len < max) st = runner_step(q->r, &t, 1, 1, logits);
    }
    return st;
}

static tk_status ev_run(const cli_opts *o, const ev_args *a, tk_model *m, tk_model *ref, const int32_t *toks,
                        long n, ev_result *res) {
    const int vocab = model_hparams(m)->n_vocab, ctx = o->engine.ctx, stride = ctx / 2;
    int threads = o->engine.n_threads;
    if (ref && model_hparams(ref)->n_vocab != vocab)
        return tk_fail(TK_ERR_INVALID, "eval: the reference has %d tokens, the model %d",
                       model_hparams(ref)->n_vocab, vocab);
    if (threads == 0) {
        tk_cpu c;
        cpu_detect(&c);
        threads = c.n_cores;
    }
    int gen_ctx = a->prompt_len + a->gen_len + 1;
    int seq_ctx = ctx > gen_ctx ? ctx : gen_ctx;
    cli_seq sm, sr;
    memset(&sm, 0, sizeof sm);
    memset(&sr, 0, sizeof sr);
    float *lm = tk_malloc((size_t)EV_CHUNK * vocab * sizeof *lm);
    float *lr = ref ? tk_malloc((size_t)EV_CHUNK * vocab * sizeof *lr) : NULL;
    double *kls = ref ? tk_malloc((size_t)n * sizeof *kls) : NULL;
    int32_t *gen = tk_malloc((size_t)a->gen_len * sizeof *gen);
    tk_status st = TK_OK;
    if (!lm || !gen || (ref && (!lr || !kls))) {
        st = tk_fail(TK_ERR_NOMEM, "eval: out of memory");
        goto out;
    }
    if (!cli_seq_init(&sm, m, NULL, threads, o->engine.pin_threads, o->engine.kv_type, o->engine.kv_scale,
                      seq_ctx, o->engine.block_size, EV_CHUNK, NULL, NULL) ||
        (ref && !cli_seq_init(&sr, ref, &sm, threads, o->engine.pin_threads, TK_KV_F32, TK_KV_SCALE_HEAD,
                              seq_ctx, o->engine.block_size, EV_CHUNK, NULL, NULL))) {
        tk_error_prefix("eval: ");
        st = TK_ERR_INVALID;
        goto out;
    }
    memset(res, 0, sizeof *res);
    long next = 0;
    long n_windows = n <= ctx ? 1 : 1 + (n - ctx + stride - 1) / stride;
    for (long w = 0; w < n_windows && !st; w++) {
        /* positions from `from` on are scored: those the previous window did not */
        long s0 = w * stride, end = s0 + ctx < n ? s0 + ctx : n, from = next;
        next = end - 1;
        if ((st = runner_truncate(sm.r, 0)) || (ref && (st = runner_truncate(sr.r, 0)))) break;
        for (long c0 = s0; c0 < end - 1 && !st; c0 += EV_CHUNK) {
            int cn = (int)(end - 1 - c0 < EV_CHUNK ? end - 1 - c0 : EV_CHUNK);
            if ((st = runner_step(sm.r, toks + c0, cn, cn, lm)) ||
                (ref && (st = runner_step(sr.r, toks + c0, cn, cn, lr))))
                break;
            for (int i = 0; i < cn; i++) {
                long p = c0 + i;
                if (p < from) continue;
                const float *pm = lm + (size_t)i * vocab;
                const int tgt = toks[p + 1];
                const double lzm = cli_log_z(pm, vocab);
                res->nll -= pm[tgt] - lzm;
                if (ref) {
                    const float *pr = lr + (size_t)i * vocab;
                    const double lzr = cli_log_z(pr, vocab);
                    res->ref_nll -= pr[tgt] - lzr;
                    kls[res->n_scored] = cli_kl_z(pr, lzr, pm, lzm, vocab);
                    res->kl_sum += kls[res->n_scored];
                    res->n_agree += cli_argmax(pm, vocab) == cli_argmax(pr, vocab);
                }
                res->n_scored++;
            }
        }
        if (!a->quiet) cli_progress("eval", w + 1, n_windows);
    }
    if (!st && ref && res->n_scored > 0) {
        qsort(kls, (size_t)res->n_scored, sizeof *kls, ev_cmp_double);
        long i99 = (long)ceil(0.99 * (double)res->n_scored) - 1;
        res->kl_p99 = kls[i99 < 0 ? 0 : i99];
    }
    /* continuations: prompts evenly spaced over the text */
    if (!st && ref && a->n_gen > 0 && n > a->prompt_len) {
        long span = n - a->prompt_len;
        long sum = 0, rsum = 0;
        for (int g = 0; g < a->n_gen && !st; g++) {
            long p0 = span * g / a->n_gen;
            int len, rlen;
            bool stp, rstp;
            if ((st = ev_continue(&sm, m, toks + p0, a->prompt_len, a->gen_len, a->stop, lm, gen, &len,
                                  &stp)) ||
                (st = ev_continue(&sr, ref, toks + p0, a->prompt_len, a->gen_len, a->stop, lr, gen, &rlen,
                                  &rstp)))
                break;
            sum += len, rsum += rlen;
            res->stopped += stp, res->ref_stopped += rstp;
            res->n_gen++;
            if (!a->quiet) cli_progress("continuations", g + 1, a->n_gen);
        }
        if (res->n_gen)
            res->len_mean = (double)sum / res->n_gen, res->ref_len_mean = (double)rsum / res->n_gen;
    }
out:
    cli_seq_free(&sr);
    cli_seq_free(&sm);
    tk_free(lm);
    tk_free(lr);
    tk_free(kls);
    tk_free(gen);
    return st;
}

static const char *ev_kv_name(const cli_opts *o) {
    switch (o->engine.kv_type) {
    case TK_KV_F32:
        return "f32";
    case TK_KV_F16:
        return "f16";
    case TK_KV_BF16:
        return "bf16";
    default:
        return o->engine.kv_scale == TK_KV_SCALE_TOKEN ? "int8-token" : "int8-head";
    }
}

static void ev_print(const cli_opts *o, const ev_args *a, const ev_result *r, long n_tok) {
    double ppl = exp(r->nll / (double)r->n_scored), rppl = exp(r->ref_nll / (double)r->n_scored);
    double agree = 100.0 * (double)r->n_agree / (double)r->n_scored, kl = r->kl_sum / (double)r->n_scored;
    if (a->json) {
        printf("{\"model\":\"%s\",\"kv\":\"%s\",\"ctx\":%d,\"tokens\":%ld,\"scored\":%ld,\"ppl\":%.6f",
               o->model_path, ev_kv_name(o), o->engine.ctx, n_tok, r->n_scored, ppl);
        if (a->ref)
            printf(",\"ref\":\"%s\",\"ref_ppl\":%.6f,\"kl_mean\":%.6e,\"kl_p99\":%.6e,\"top1_pct\":%.4f,"
                   "\"gen\":%d,\"len_mean\":%.4f,\"ref_len_mean\":%.4f,\"len_drift\":%.4f,\"stopped\":%d,"
                   "\"ref_stopped\":%d",
                   a->ref, rppl, kl, r->kl_p99, agree, r->n_gen, r->len_mean, r->ref_len_mean,
                   r->len_mean - r->ref_len_mean, r->stopped, r->ref_stopped);
        printf("}\n");
        return;
    }
    printf("eval: %s, kv %s, %ld tokens, %ld scored, windows of %d\n", o->model_path, ev_kv_name(o), n_tok,
           r->n_scored, o->engine.ctx);
    printf("perplexity: %.4f\n", ppl);
    if (!a->ref) return;
    printf("reference: %s, perplexity %.4f\n", a->ref, rppl);
    printf("KL(ref || model): mean %.4e, P99 %.4e\n", kl, r->kl_p99);
    printf("top-1 agreement: %.2f%%\n", agree);
    if (r->n_gen)
        printf("greedy continuations: %d, mean length %.2f (ref %.2f), drift %+.2f tokens; stopped %d (ref "
               "%d)\n",
               r->n_gen, r->len_mean, r->ref_len_mean, r->len_mean - r->ref_len_mean, r->stopped,
               r->ref_stopped);
}

int cmd_eval(int argc, char **argv) {
    ev_args a = {.n_gen = 8, .gen_len = 64, .prompt_len = 32, .stop = "\n"};
    cli_opts o;
    cli_opts_init(&o, &EV_CMD, &a);
    o.engine.ctx = 512;
    o.engine.block_size = 16;
    o.engine.kv_type = TK_KV_F32;
    int prc = cli_opts_parse(&o, argc, argv);
    if (prc != CLI_GO_ON) return prc;
    if (!o.model_path || !a.file) {
        cli_error(&EV_CMD, "-m MODEL and -f TEXT are required; 'tokamak eval --help' lists the options");
        return 2;
    }
    if (o.engine.ctx < 2 || !a.stop[0]) {
        cli_error(&EV_CMD, "--ctx must be at least 2 and --stop not empty");
        return 2;
    }
    tk_model *m = NULL, *ref = NULL;
    char *text = NULL;
    size_t len = 0, n_ids = 0;
    int32_t *ids = NULL;
    ev_result res;
    FILE *f = fopen(a.file, "rb");
    tk_status st =
        f ? cli_read_all(f, a.file, EV_MAX_TEXT, &text, &len) : tk_fail(TK_ERR_IO, "cannot read %s", a.file);
    if (f) fclose(f);
    if (!st) st = tk_model_open(o.model_path, &o.model, &m);
    /* the reference keeps its file's weights and multiplies f32 activations */
    tk_model_opts ref_opts = o.model;
    ref_opts.repack = ref_opts.repack_output = TK_WEIGHTS_KEEP;
    ref_opts.bf16_dot = ref_opts.q8_coarse = false;
    if (!st && a.ref) st = tk_model_open(a.ref, &ref_opts, &ref);
    if (!st) st = tk_tokenize(m, text, len, true, false, &ids, &n_ids);
    long n = (long)n_ids;
    if (!st && a.max_tokens && n > a.max_tokens) n = a.max_tokens;
    if (!st && n < 2) st = tk_fail(TK_ERR_INVALID, "%s: fewer than 2 tokens", a.file);
    if (!st) st = ev_run(&o, &a, m, ref, ids, n, &res);
    if (!st) ev_print(&o, &a, &res, n);
    tk_free_buf(ids);
    tk_free(text);
    tk_model_free(ref);
    tk_model_free(m);
    if (st) {
        fprintf(stderr, "tokamak eval: %s\n", tk_last_error());
        return 1;
    }
    return 0;
}
