/* tokamak run: one sequence, prefill then decode, on the backend's runner
 * (no engine: the runner hands back every logit of a step), streaming text
 * (or ids without a tokenizer) to stdout and a timing line to stderr.
 * --prompts / --parallel go to run_many (the engine).
 *
 * --dump-logits FILE writes float32 little-endian rows of n_vocab logits, raw
 * (before any sampling step): row 0 is the last prompt position, row i (1..n-1)
 * the step that consumed generated token i-1; so n rows for -n N, fewer if EOS
 * stops generation early (one row per generated token). */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/backend.h"
#include "backend/runner.h"
#include "bench/probe.h"
#include "cli/cli.h"
#include "cli/run_many.h"
#include "core/alloc.h"
#include "engine/sampler.h"
#include "model/model.h"
#include "tokamak.h"
#include "tokenizer/tokenizer.h"

#define RUN_BLOCK 64
#define RUN_CHUNK 512 /* prefill tokens per step */

static void run_usage(FILE *f) {
    fprintf(f,
            "usage: tokamak run -m MODEL (-p TEXT | --tokens IDS) -n N [options]\n"
            "  -m MODEL            a GGUF file or a Hugging Face directory\n"
            "  -p TEXT             prompt text (needs the model's tokenizer; BOS added if the vocabulary asks)\n"
            "  --tokens IDS        prompt token ids, comma or space separated\n"
            "  -n N                tokens to generate (default 32)\n"
            "  --temp T --top-k K --top-p P --min-p P --seed S   sampling (default greedy)\n"
            "  --ignore-eos        keep generating past end-of-generation tokens\n"
            "  --threads N         threads (default: every core)\n"
            "  --kv-type T         f32, f16 (default), bf16, int8\n"
            "  --repack TYPE       repack matmul weights at load (e.g. q8_0)\n"
            "  --mmap              read weights through the file mapping (default: huge-page copy)\n"
            "  --row-layout        keep Q8_0/BF16 weights in file row order (default: interleaved)\n"
            "  --unfused           the unfused forward plan (ablation)\n"
            "  --dump-logits FILE  raw float32 logits: last prompt position, then each decode step\n"
            "  --no-probe          skip the bandwidth probe (no %% of peak in the timing line)\n"
            "  --prompts FILE | --parallel N   many prompts through the engine (see run --prompts --help)\n");
}

static bool parse_float(const char *s, double lo, double hi, double *out) {
    char *end;
    errno = 0;
    double v = strtod(s, &end);
    if (errno || end == s || *end || !(v >= lo && v <= hi)) return false;
    *out = v;
    return true;
}

/* "1,2, 3" -> ids (tk_malloc'd). */
static int32_t *parse_ids(const char *s, int *n_out) {
    size_t cap = strlen(s) / 2 + 2;
    int32_t *ids = tk_calloc(cap, sizeof *ids);
    int n = 0;
    if (!ids) return NULL;
    const char *p = s;
    while (*p) {
        while (*p == ',' || *p == ' ' || *p == '\t' || *p == '\n') p++;
        if (!*p) break;
        char *end;
        errno = 0;
        long v = strtol(p, &end, 10);
        if (errno || end == p || v < 0 || v > INT32_MAX || (*end && *end != ',' && *end != ' ' && *end != '\t' && *end != '\n')) {
            tk_free(ids);
            return NULL;
        }
        ids[n++] = (int32_t)v;
        p = end;
    }
    *n_out = n;
    return ids;
}

typedef struct run_args {
    const char *model, *prompt, *tokens, *dump;
    long n, threads;
    tk_sampling samp;
    bool ignore_eos, unfused, no_probe, use_mmap, row_layout;
    tk_kv_type kv_type;
    tk_weight_type repack;
} run_args;

static int parse_args(int argc, char **argv, run_args *a) {
    memset(a, 0, sizeof *a);
    a->n = 32;
    a->kv_type = TK_KV_F16;
    a->repack = TK_WEIGHTS_KEEP;
    tk_sampling_default(&a->samp);
    for (int i = 1; i < argc; i++) {
        const char *o = argv[i];
        bool has = i + 1 < argc;
        const char *v = has ? argv[i + 1] : NULL;
        double d = 0;
        long l = 0;
        if (!strcmp(o, "-h") || !strcmp(o, "--help")) {
            run_usage(stdout);
            return 0;
        }
        if (!strcmp(o, "--ignore-eos")) { a->ignore_eos = true; continue; }
        if (!strcmp(o, "--unfused")) { a->unfused = true; continue; }
        if (!strcmp(o, "--mmap")) { a->use_mmap = true; continue; }
        if (!strcmp(o, "--row-layout")) { a->row_layout = true; continue; }
        if (!strcmp(o, "--no-probe")) { a->no_probe = true; continue; }
        if (!has) {
            fprintf(stderr, "tokamak run: unknown or incomplete option '%s'\n", o);
            return 2;
        }
        i++;
        bool ok = true;
        if (!strcmp(o, "-m")) a->model = v;
        else if (!strcmp(o, "-p")) a->prompt = v;
        else if (!strcmp(o, "--tokens")) a->tokens = v;
        else if (!strcmp(o, "--dump-logits")) a->dump = v;
        else if (!strcmp(o, "-n")) ok = cli_parse_long(v, 1, 1 << 24, &a->n);
        else if (!strcmp(o, "--threads")) ok = cli_parse_long(v, 1, 4096, &a->threads);
        else if (!strcmp(o, "--temp")) ok = parse_float(v, 0, 100, &d), a->samp.temperature = (float)d;
        else if (!strcmp(o, "--top-p")) ok = parse_float(v, 0, 1, &d), a->samp.top_p = (float)d;
        else if (!strcmp(o, "--min-p")) ok = parse_float(v, 0, 1, &d), a->samp.min_p = (float)d;
        else if (!strcmp(o, "--top-k")) ok = cli_parse_long(v, 0, 1 << 24, &l), a->samp.top_k = (int)l;
        else if (!strcmp(o, "--seed")) {
            char *end;
            errno = 0;
            a->samp.seed = strtoull(v, &end, 10);
            ok = !errno && *end == 0 && end != v;
        } else if (!strcmp(o, "--kv-type")) {
            if (!strcmp(v, "f32")) a->kv_type = TK_KV_F32;
            else if (!strcmp(v, "f16")) a->kv_type = TK_KV_F16;
            else if (!strcmp(v, "bf16")) a->kv_type = TK_KV_BF16;
            else if (!strcmp(v, "int8")) a->kv_type = TK_KV_INT8;
            else ok = false;
        } else if (!strcmp(o, "--repack")) {
            ok = tk_weight_type_from_name(v, &a->repack);
        } else {
            fprintf(stderr, "tokamak run: unknown option '%s'\n", o);
            return 2;
        }
        if (!ok) {
            fprintf(stderr, "tokamak run: bad value '%s' for %s\n", v, o);
            return 2;
        }
    }
    if (!a->model || (!a->prompt == !a->tokens)) {
        fprintf(stderr, "tokamak run: need -m MODEL and exactly one of -p TEXT or --tokens IDS\n");
        run_usage(stderr);
        return 2;
    }
    return -1; /* go on */
}

/* Everything one run holds, freed in one place. */
typedef struct run_state {
    tk_model *m;
    backend be;
    runner *r;
    tk_sampler *smp;
    tok_stream *ts;
    int32_t *ids;   /* (n_prompt + n) prompt, then generated tokens */
    float *logits;  /* (n_vocab) */
    char *text;     /* (tok_stream_bound) */
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

static bool is_eog(const run_state *s, int32_t tok) {
    const tk_tokenizer *t = model_tokenizer(s->m);
    return t ? tok_is_eog(t, tok) : tok == model_hparams(s->m)->eos_id;
}

int cmd_run(int argc, char **argv) {
    if (run_many_wanted(argc, argv)) return run_many(argc, argv);
    run_args a;
    int rc = parse_args(argc, argv, &a);
    if (rc >= 0) return rc;
    run_state s;
    memset(&s, 0, sizeof s);
    double probe = 0;
    if (!a.no_probe) probe = probe_read_bw((int)a.threads); /* before our pool pins anything */

    tk_model_opts mo;
    tk_model_opts_default(&mo);
    mo.repack = a.repack;
    mo.use_mmap = a.use_mmap;
    mo.row_layout = a.row_layout;
    if (tk_model_open(a.model, &mo, &s.m) != TK_OK) return fail(&s, "cannot load the model");
    const tk_hparams *hp = model_hparams(s.m);
    const tk_tokenizer *tok = model_tokenizer(s.m);

    /* the prompt */
    int n_prompt = 0;
    int32_t *prompt = NULL;
    if (a.prompt) {
        if (!tok) {
            fprintf(stderr, "tokamak run: -p needs a tokenizer and %s has no vocabulary; use --tokens IDS\n", a.model);
            run_free(&s);
            return 2;
        }
        size_t cap = tok_encode_bound(tok, strlen(a.prompt)), n = 0;
        prompt = tk_calloc(cap ? cap : 1, sizeof *prompt);
        if (!prompt || tok_encode(tok, a.prompt, strlen(a.prompt), true, true, prompt, cap, &n) != TK_OK) {
            tk_free(prompt);
            return fail(&s, "cannot encode the prompt");
        }
        n_prompt = (int)n;
    } else if (!(prompt = parse_ids(a.tokens, &n_prompt))) {
        fprintf(stderr, "tokamak run: --tokens '%s' is not a list of token ids\n", a.tokens);
        run_free(&s);
        return 2;
    }
    for (int i = 0; i < n_prompt; i++)
        if (prompt[i] >= hp->n_vocab) {
            fprintf(stderr, "tokamak run: token id %d outside the vocabulary of %d\n", (int)prompt[i], hp->n_vocab);
            tk_free(prompt);
            run_free(&s);
            return 2;
        }
    if (n_prompt == 0) {
        fprintf(stderr, "tokamak run: the prompt is empty\n");
        tk_free(prompt);
        run_free(&s);
        return 2;
    }
    long ctx = (long)n_prompt + a.n;
    if (ctx > (1 << 24)) {
        tk_free(prompt);
        return fail(&s, "prompt + n exceeds 16M tokens");
    }
    s.ids = tk_calloc((size_t)ctx, sizeof *s.ids);
    if (!s.ids) {
        tk_free(prompt);
        return fail(&s, "out of memory");
    }
    memcpy(s.ids, prompt, (size_t)n_prompt * sizeof *prompt);
    tk_free(prompt);

    /* backend (pool, KV, forward), its runner, sampler */
    int n_blocks = (int)((ctx + RUN_BLOCK - 1) / RUN_BLOCK);
    int chunk = n_prompt < RUN_CHUNK ? n_prompt : RUN_CHUNK;
    backend_cpu_opts bo = {.n_threads = (int)a.threads, .block_size = RUN_BLOCK, .kv_type = a.kv_type,
                           .kv_scale = TK_KV_SCALE_HEAD, .n_blocks = n_blocks, .max_tokens = chunk, .max_seqs = 1,
                           .max_ctx = (int)ctx, .unfused = a.unfused};
    if (backend_cpu_create(s.m, &bo, &s.be) != TK_OK) return fail(&s, "cannot set up the backend");
    if (runner_init(&s.be, &s.r) != TK_OK) return fail(&s, "cannot set up the runner");
    if (sampler_init(&a.samp, hp->n_vocab, &s.smp) != TK_OK) return fail(&s, "bad sampling parameters");
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
    for (int p = 0; p < n_prompt; p += chunk) {
        int n1 = n_prompt - p < chunk ? n_prompt - p : chunk;
        bool last = p + n1 == n_prompt;
        if (runner_step(s.r, s.ids + p, n1, last, s.logits) != TK_OK) return fail(&s, "prefill failed");
    }
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
        if (stop || n_gen >= a.n) break;
        double ts = tk_now_s();
        if (runner_step(s.r, &s.ids[n_prompt + n_gen - 1], 1, 1, s.logits) != TK_OK) return fail(&s, "decode failed");
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
    fprintf(stderr, "prefill %d tok in %.3f s (%.1f tok/s) | decode %d tok in %.3f s (%.2f tok/s), TPOT %.3f ms",
            n_prompt, t_prefill, t_prefill > 0 ? n_prompt / t_prefill : 0.0, n_decode, t_decode,
            t_decode > 0 ? n_decode / t_decode : 0.0, tpot * 1e3);
    if (n_decode && tpot > 0) {
        double gbs = (double)decode_bytes / n_decode / tpot / 1e9;
        fprintf(stderr, " | %.2f GB/s", gbs);
        if (probe > 0) fprintf(stderr, " = %.1f%% of %.1f GB/s probe", 100.0 * gbs / probe, probe);
    }
    fprintf(stderr, " | %d threads, kv %s, weights %s\n", s.be.n_threads,
            a.kv_type == TK_KV_F32 ? "f32" : a.kv_type == TK_KV_BF16 ? "bf16" : a.kv_type == TK_KV_INT8 ? "int8" : "f16",
            s.be.weight_dtype);
    run_free(&s);
    return 0;
}
