/* tokamak run: one sequence, prefill then decode, on the backend's runner
 * (no engine: the runner hands back every logit of a step), streaming text
 * (or ids without a tokenizer) to stdout and a timing line to stderr.
 * --prompts / --parallel go to run_many (the engine); both parse the same
 * options (run_opts.c).
 *
 * --dump-logits FILE writes float32 little-endian rows of n_vocab logits, raw
 * (before any sampling step): row 0 is the last prompt position, row i (1..n-1)
 * the step that consumed generated token i-1; so n rows for -n N, fewer if EOS
 * stops generation early (one row per generated token). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/backend.h"
#include "backend/runner.h"
#include "bench/probe.h"
#include "bench/report.h"
#include "cli/cli.h"
#include "cli/run.h"
#include "core/alloc.h"
#include "engine/sampler.h"
#include "model/model.h"
#include "tokamak.h"
#include "tokenizer/tokenizer.h"

#define RUN_BLOCK 64

/* Everything one run holds, freed in one place. */
typedef struct run_state {
    tk_model *m;
    backend be;
    runner *r;
    tk_sampler *smp;
    tok_stream *ts;
    int32_t *ids;  /* (n_prompt + n) prompt, then generated tokens */
    float *logits; /* (n_vocab) */
    char *text;    /* (tok_stream_bound) */
    FILE *dump;
} run_state;

static void run_free(run_state *s) {
    if (s->dump) fclose(s->dump);
    tk_free(s->text);
    tk_free(s->logits);
    tk_free(s->ids);
    tok_stream_free(s->ts);
    sampler_free(s->smp);
    runner_free(s->r);
    backend_free(&s->be);
    tk_model_free(s->m);
}

static int fail(run_state *s, const char *what) {
    fprintf(stderr, "tokamak run: %s%s%s\n", what, *tk_last_error() ? ": " : "", tk_last_error());
    run_free(s);
    return 1;
}

static void emit(run_state *s, int32_t tok) {
    if (s->ts) {
        size_t n = tok_stream_push(s->ts, tok, s->text, tok_stream_bound(model_tokenizer(s->m)));
        fwrite(s->text, 1, n, stdout);
    } else {
        printf("%d ", (int)tok);
    }
    fflush(stdout);
}

tk_status run_one_sequence(const cli_opts *o, const tk_model *m, int ctx, int max_tokens, backend *be,
                           runner **r) {
    const int block = cli_opts_given(o, "--block-size") ? o->engine.block_size : RUN_BLOCK;
    backend_cpu_opts bo = {.n_threads = o->engine.n_threads,
                           .pin_threads = o->engine.pin_threads,
                           .cpus = o->engine.cpus,
                           .numa = o->engine.numa,
                           .block_size = block,
                           .kv_type = o->engine.kv_type,
                           .kv_scale = o->engine.kv_scale,
                           .n_blocks = (ctx + block - 1) / block,
                           .max_tokens = max_tokens,
                           .max_seqs = 1,
                           .max_ctx = ctx,
                           .unfused = o->engine.unfused,
                           .even_rows = o->engine.even_rows};
    tk_status st = backend_cpu_create(m, &bo, be);
    if (st != TK_OK) return st;
    return runner_init(be, r);
}

static bool is_eog(const run_state *s, int32_t tok) {
    const tk_tokenizer *t = model_tokenizer(s->m);
    return t ? tok_is_eog(t, tok) : tok == model_hparams(s->m)->eos_id;
}

int cmd_run(int argc, char **argv) {
    cli_opts o;
    run_args a;
    int rc = run_parse(argc, argv, &o, &a);
    if (rc != CLI_GO_ON) return rc;
    if (run_is_many(&a)) return run_many(&o, &a);
    run_state s;
    memset(&s, 0, sizeof s);
    double probe = 0;
    probe_stats ps = {0}; /* the probe's passes (none when --bw gives the rate) */
    if (a.bw > 0) {
        probe = a.bw;
    } else if (!a.no_probe) {
        probe_read_bw_stats(o.engine.n_threads, &ps); /* before our pool pins anything */
        probe = ps.best;
    }

    if (tk_model_open(o.model_path, &o.model, &s.m) != TK_OK) return fail(&s, "cannot load the model");
    cli_opts_fit_model(&o, s.m);
    const tk_hparams *hp = model_hparams(s.m);
    const tk_tokenizer *tok = model_tokenizer(s.m);

    /* the prompt */
    int n_prompt = 0;
    int32_t *prompt = NULL;
    if (a.prompt) {
        if (run_encode(s.m, &a, a.prompt, &prompt, &n_prompt) != TK_OK)
            return fail(&s, "cannot encode the prompt");
    } else if (!cli_parse_ids(a.tokens, &prompt, &n_prompt)) {
        fprintf(stderr, "tokamak run: --tokens '%s' is not a list of token ids\n", a.tokens);
        run_free(&s);
        return 2;
    }
    for (int i = 0; i < n_prompt; i++)
        if (prompt[i] >= hp->n_vocab) {
            fprintf(stderr, "tokamak run: token id %d outside the vocabulary of %d\n", (int)prompt[i],
                    hp->n_vocab);
            tk_free(prompt);
            run_free(&s);
            return 2;
        }
    if (n_prompt == 0 || n_prompt > o.engine.ctx) {
        if (n_prompt)
            fprintf(stderr, "tokamak run: a %d-token prompt does not fit in --ctx %d\n", n_prompt,
                    o.engine.ctx);
        else
            fprintf(stderr, "tokamak run: the prompt is empty\n");
        tk_free(prompt);
        run_free(&s);
        return 2;
    }
    /* -n 0 and an -n past the context both generate until the context is full,
     * as the engine does: the last token is sampled but never stored */
    long room = (long)o.engine.ctx - n_prompt + 1, n_max = a.n == 0 || a.n > room ? room : a.n;
    if (a.n > room)
        fprintf(
            stderr,
            "tokamak run: generating at most %ld tokens: the %d-token prompt fills --ctx %d but for %ld\n",
            n_max, n_prompt, o.engine.ctx, room - 1);
    long ctx = (long)n_prompt + n_max;
    s.ids = tk_calloc((size_t)ctx, sizeof *s.ids);
    if (!s.ids) {
        tk_free(prompt);
        return fail(&s, "out of memory");
    }
    memcpy(s.ids, prompt, (size_t)n_prompt * sizeof *prompt);
    tk_free(prompt);

    /* backend (pool, KV, forward), its runner, sampler */
    if (run_one_sequence(&o, s.m, (int)ctx, n_prompt < RUN_CHUNK ? n_prompt : RUN_CHUNK, &s.be, &s.r) !=
        TK_OK)
        return fail(&s, "cannot set up the backend");
    if (sampler_init(&o.sampling, hp->n_vocab, &s.smp) != TK_OK) return fail(&s, "bad sampling parameters");
    sampler_set_n_prompt(s.smp, n_prompt);
    s.logits = tk_calloc((size_t)hp->n_vocab, sizeof *s.logits);
    if (!s.logits) return fail(&s, "out of memory");
    if (tok) {
        if (tok_stream_init(tok, false, &s.ts) != TK_OK) return fail(&s, "cannot start the detokenizer");
        if (!(s.text = tk_malloc(tok_stream_bound(tok) + 1))) return fail(&s, "out of memory");
    }
    if (a.dump && !(s.dump = fopen(a.dump, "wb"))) {
        fprintf(stderr, "tokamak run: cannot write %s\n", a.dump);
        run_free(&s);
        return 1;
    }

    /* prefill in chunks; logits of the last prompt position only */
    double t0 = tk_now_s();
    if (runner_feed(s.r, s.ids, n_prompt, s.logits) != TK_OK) return fail(&s, "prefill failed");
    double t_prefill = tk_now_s() - t0;

    /* decode: token i comes from the logits of step i (step 0 = prefill) */
    int n_gen = 0, n_decode = 0;
    uint64_t decode_bytes = 0;
    double t_decode = 0;
    for (;;) {
        if (s.dump && fwrite(s.logits, sizeof(float), (size_t)hp->n_vocab, s.dump) != (size_t)hp->n_vocab)
            return fail(&s, "writing the logits failed");
        tk_token_event ev;
        memset(&ev, 0, sizeof ev);
        int32_t t = sampler_sample(s.smp, s.logits, s.ids, n_prompt + n_gen, &ev);
        if (t < 0) return fail(&s, "no token has a finite logit");
        s.ids[n_prompt + n_gen++] = t;
        bool stop = !a.ignore_eos && is_eog(&s, t);
        if (!stop) emit(&s, t);
        if (stop || n_gen >= n_max) break;
        double ts = tk_now_s();
        if (runner_step(s.r, &s.ids[n_prompt + n_gen - 1], 1, 1, s.logits) != TK_OK)
            return fail(&s, "decode failed");
        t_decode += tk_now_s() - ts;
        decode_bytes += s.be.last_bytes(s.be.ctx);
        n_decode++;
    }
    if (s.ts) {
        size_t n = tok_stream_flush(s.ts, s.text, tok_stream_bound(tok));
        fwrite(s.text, 1, n, stdout);
    }
    printf("\n");
    fflush(stdout);

    double tpot = n_decode ? t_decode / n_decode : 0;
    fprintf(stderr,
            "prefill %d tok in %.3f s (%.1f tok/s) | decode %d tok in %.3f s (%.2f tok/s), TPOT %.3f ms",
            n_prompt, t_prefill, t_prefill > 0 ? n_prompt / t_prefill : 0.0, n_decode, t_decode,
            t_decode > 0 ? n_decode / t_decode : 0.0, tpot * 1e3);
    if (n_decode && tpot > 0) {
        double gbs = (double)decode_bytes / n_decode / tpot / 1e9;
        fprintf(stderr, " | %.2f GB/s", gbs);
        /* A decode that read faster than the probe shows what the probe
         * missed, not an efficiency above 100%. */
        const char *what = a.bw > 0 ? "given" : "probe";
        if (probe > 0 && gbs > probe) {
            fprintf(stderr, " > the %.2f GB/s %s (%s)", probe, what,
                    a.bw > 0 ? "the decode read faster" : "a probe shortfall: the decode read faster");
        } else if (probe > 0) {
            fprintf(stderr, " = %.1f%% of %.2f GB/s %s", 100.0 * gbs / probe, probe, what);
            /* the best pass is the probe; where the machine's memory speed
             * swings from pass to pass, the median pass is the steadier yardstick */
            if (ps.n > 1 && ps.median > 0)
                fprintf(stderr, " (best of %d passes; %.1f%% of the median pass, %.2f GB/s)", ps.n,
                        100.0 * gbs / ps.median, ps.median);
        }
    }
    fprintf(stderr, " | %d threads, kv %s, weights %s\n", s.be.n_threads,
            names_str(&NAMES_KV_TYPE, (int)o.engine.kv_type), s.be.weight_dtype);
    report_rt_throttle_now(stderr);
    run_free(&s);
    return 0;
}
