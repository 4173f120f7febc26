/* tokamak kvcheck: how much a KV cache type changes the model's predictions.
 * For each prompt seed: a random prompt, then greedy positions teacher-forced
 * from an F32-KV run (every run is fed the F32 run's token, so one flip does
 * not derail the rest); per KV type, the top-1 agreement with the F32 run and
 * the mean KL(F32 || type) of the next-token distributions. The weights are
 * shared, so only the KV storage differs. This is the INT8 KV check
 * at any model size (the CI test runs it on the tiny model). Float weights
 * only make sense here: quantized weights quantize the activations, whose
 * rounding flips amplify any KV difference. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/backend.h"
#include "backend/runner.h"
#include "cli/cli.h"
#include "core/alloc.h"
#include "core/cpu.h"
#include "core/error.h"
#include "engine/sampler.h"
#include "model/model.h"
#include "tokamak.h"

#define KC_MAX_SEEDS 16

typedef struct {
    const char *name;
    tk_kv_type type;
    tk_kv_scale scale;
} kc_kind;

static const kc_kind KINDS[] = {
    {"int8-head", TK_KV_INT8, TK_KV_SCALE_HEAD},
    {"int8-token", TK_KV_INT8, TK_KV_SCALE_TOKEN},
    {"bf16", TK_KV_BF16, TK_KV_SCALE_HEAD},
    {"f16", TK_KV_F16, TK_KV_SCALE_HEAD},
};
enum { N_KINDS = sizeof KINDS / sizeof KINDS[0] };

/* One KV type's run: a backend over the shared model (and the F32 run's
 * threads) and the sequence on it. */
typedef struct {
    backend be;
    runner *r;
} kc_run;

static void kc_usage(FILE *f) {
    fprintf(f, "usage: tokamak kvcheck -m MODEL [options]\n"
               "  -m MODEL          a GGUF file or a Hugging Face directory\n"
               "  --seeds LIST      prompt seeds (default 99,1,2,3,4)\n"
               "  --prompt N        prompt tokens (default 32)\n"
               "  --gen N           teacher-forced greedy positions compared (default 256)\n"
               "  --block-size N    KV block tokens (default 16)\n"
               "  --threads N       threads (default: every core)\n"
               "Compares int8 (per-head and per-token scales), bf16 and f16 KV against f32 KV:\n"
               "top-1 agreement and mean KL divergence per seed and over all seeds.\n"
               "Use float weights (F32/F16/BF16): with Q8_0/Q4 weights the activations are\n"
               "quantized too, and a tiny KV difference that flips their rounding swamps the\n"
               "KV error (even f16 KV then shows a KL of ~6e-5 on qwen3-0.6b).\n");
}

/* pool_of: NULL for the first run (it starts the threads), else that run. */
static bool kc_run_init(kc_run *r, tk_model *m, const kc_run *pool_of, int threads, tk_kv_type t, tk_kv_scale s,
                        int ctx, int bs, int max_tok) {
    int nb = (ctx + bs - 1) / bs;
    backend_cpu_opts o = {.n_threads = threads, .block_size = bs, .kv_type = t, .kv_scale = s, .n_blocks = nb,
                          .max_tokens = max_tok, .max_seqs = 1, .max_ctx = nb * bs,
                          .share_pool = pool_of ? &pool_of->be : NULL};
    memset(r, 0, sizeof *r);
    return backend_cpu_create(m, &o, &r->be) == TK_OK && runner_init(&r->be, &r->r) == TK_OK;
}

static void kc_run_free(kc_run *r) {
    runner_free(r->r);
    backend_free(&r->be);
    memset(r, 0, sizeof *r);
}

static bool kc_step(kc_run *r, const int32_t *toks, int n, int pos0, float *logits) {
    return runner_len(r->r) == pos0 && runner_step(r->r, toks, n, 1, logits) == TK_OK;
}

static int kc_argmax(const float *l, int n) {
    int b = 0;
    for (int i = 1; i < n; i++)
        if (l[i] > l[b]) b = i;
    return b;
}

/* KL(p || q) of the softmaxes of two logit vectors, in double. */
static double kc_kl(const float *lp, const float *lq, int n) {
    double mp = lp[kc_argmax(lp, n)], mq = lq[kc_argmax(lq, n)], zp = 0, zq = 0, kl = 0;
    for (int i = 0; i < n; i++) {
        zp += exp(lp[i] - mp);
        zq += exp(lq[i] - mq);
    }
    double lzp = log(zp) + mp, lzq = log(zq) + mq;
    for (int i = 0; i < n; i++) {
        double a = lp[i] - lzp, b = lq[i] - lzq;
        kl += exp(a) * (a - b);
    }
    return kl;
}

static bool kc_int(const char *s, int lo, int hi, int *out) {
    long v;
    if (!cli_parse_long(s, lo, hi, &v)) return false;
    *out = (int)v;
    return true;
}

int cmd_kvcheck(int argc, char **argv) {
    const char *path = NULL;
    int seeds[KC_MAX_SEEDS] = {99, 1, 2, 3, 4}, n_seeds = 5, np = 32, ngen = 256, bs = 16, threads = 0;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        bool has = i + 1 < argc;
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            kc_usage(stdout);
            return 0;
        } else if (!strcmp(a, "-m") && has) {
            path = argv[++i];
        } else if (!strcmp(a, "--seeds") && has) {
            char buf[256];
            snprintf(buf, sizeof buf, "%s", argv[++i]);
            n_seeds = 0;
            for (char *tok = strtok(buf, ","); tok; tok = strtok(NULL, ",")) {
                if (n_seeds == KC_MAX_SEEDS || !kc_int(tok, 0, 1 << 30, &seeds[n_seeds])) {
                    fprintf(stderr, "tokamak kvcheck: --seeds wants up to %d integers, got '%s'\n", KC_MAX_SEEDS,
                            argv[i]);
                    return 2;
                }
                n_seeds++;
            }
            if (n_seeds == 0) {
                fprintf(stderr, "tokamak kvcheck: --seeds is empty\n");
                return 2;
            }
        } else if (!strcmp(a, "--prompt") && has) {
            if (!kc_int(argv[++i], 1, 4096, &np)) {
                fprintf(stderr, "tokamak kvcheck: --prompt wants 1..4096 tokens, got '%s'\n", argv[i]);
                return 2;
            }
        } else if (!strcmp(a, "--gen") && has) {
            if (!kc_int(argv[++i], 1, 1 << 16, &ngen)) {
                fprintf(stderr, "tokamak kvcheck: --gen wants 1..65536 positions, got '%s'\n", argv[i]);
                return 2;
            }
        } else if (!strcmp(a, "--block-size") && has) {
            if (!kc_int(argv[++i], 16, 256, &bs) || (bs & (bs - 1))) {
                fprintf(stderr, "tokamak kvcheck: --block-size wants 16, 32, 64, 128 or 256, got '%s'\n", argv[i]);
                return 2;
            }
        } else if (!strcmp(a, "--threads") && has) {
            if (!kc_int(argv[++i], 1, 4096, &threads)) {
                fprintf(stderr, "tokamak kvcheck: --threads wants 1..4096, got '%s'\n", argv[i]);
                return 2;
            }
        } else {
            fprintf(stderr, "tokamak kvcheck: unknown or incomplete option '%s'\n", a);
            kc_usage(stderr);
            return 2;
        }
    }
    if (!path) {
        kc_usage(stderr);
        return 2;
    }
    tk_model *m = NULL;
    if (tk_model_open(path, NULL, &m) != TK_OK) {
        fprintf(stderr, "tokamak kvcheck: %s\n", tk_last_error());
        return 1;
    }
    const int vocab = model_hparams(m)->n_vocab, ctx = np + ngen;
    if (threads == 0) {
        tk_cpu c;
        cpu_detect(&c);
        threads = c.n_cores;
    }
    kc_run ref, runs[N_KINDS];
    memset(&ref, 0, sizeof ref);
    memset(runs, 0, sizeof runs);
    float *lr = tk_malloc((size_t)vocab * sizeof *lr), *lq = tk_malloc((size_t)vocab * sizeof *lq);
    int32_t *prompt = tk_malloc((size_t)np * sizeof *prompt);
    int rc = 1;
    if (!lr || !lq || !prompt) {
        fprintf(stderr, "tokamak kvcheck: out of memory\n");
        goto out;
    }
    printf("kvcheck: %s, %d-token prompts, %d teacher-forced greedy positions, block %d, %d threads\n\n", path, np,
           ngen, bs, threads);
    printf("| seed | F32 top-2 gap mean | near-ties < 1e-3 |");
    for (int k = 0; k < N_KINDS; k++) printf(" %s agree | %s KL |", KINDS[k].name, KINDS[k].name);
    printf("\n|---:|---:|---:|");
    for (int k = 0; k < N_KINDS; k++) printf("---:|---:|");
    printf("\n");
    long tot_agree[N_KINDS] = {0}, tot_ties = 0;
    double tot_kl[N_KINDS] = {0};
    for (int si = 0; si < n_seeds; si++) {
        /* fresh caches per prompt (the others run on the F32 run's threads, so it goes last) */
        for (int k = 0; k < N_KINDS; k++) kc_run_free(&runs[k]);
        kc_run_free(&ref);
        bool ok = kc_run_init(&ref, m, NULL, threads, TK_KV_F32, TK_KV_SCALE_HEAD, ctx, bs, np);
        for (int k = 0; ok && k < N_KINDS; k++)
            ok = kc_run_init(&runs[k], m, &ref, threads, KINDS[k].type, KINDS[k].scale, ctx, bs, np);
        if (!ok) goto fail;
        /* the CI test's prompts (ids below 151,000, clear of Qwen's special tokens) */
        const double id_range = vocab - 1 < 151000 ? vocab - 1 : 151000;
        for (int i = 0; i < np; i++)
            prompt[i] = (int32_t)(sampler_uniform((uint64_t)seeds[si], (uint64_t)i) * id_range);
        int agree[N_KINDS] = {0}, ties = 0;
        double kl[N_KINDS] = {0}, gaps = 0;
        int32_t tok = 0;
        for (int step = 0; step <= ngen; step++) {
            const int32_t *in = step == 0 ? prompt : &tok;
            int n = step == 0 ? np : 1, pos = step == 0 ? 0 : np + step - 1;
            if (!kc_step(&ref, in, n, pos, lr)) goto fail;
            int32_t next = (int32_t)kc_argmax(lr, vocab);
            if (step > 0) {
                float second = -INFINITY;
                for (int i = 0; i < vocab; i++)
                    if (i != next && lr[i] > second) second = lr[i];
                gaps += (double)lr[next] - (double)second;
                ties += (double)lr[next] - (double)second < 1e-3;
            }
            for (int k = 0; k < N_KINDS; k++) {
                if (!kc_step(&runs[k], in, n, pos, lq)) goto fail;
                if (step == 0) continue;
                agree[k] += kc_argmax(lq, vocab) == next;
                kl[k] += kc_kl(lr, lq, vocab);
            }
            tok = next;
        }
        printf("| %d | %.3f | %d |", seeds[si], gaps / ngen, ties);
        for (int k = 0; k < N_KINDS; k++) {
            printf(" %d/%d | %.3g |", agree[k], ngen, kl[k] / ngen);
            tot_agree[k] += agree[k];
            tot_kl[k] += kl[k];
        }
        printf("\n");
        fflush(stdout);
        tot_ties += ties;
    }
    printf("| all | | %ld |", tot_ties);
    for (int k = 0; k < N_KINDS; k++)
        printf(" %.2f%% | %.3g |", 100.0 * (double)tot_agree[k] / ((double)ngen * n_seeds), tot_kl[k] / ((double)ngen * n_seeds));
    printf("\n");
    rc = 0;
    goto out;
fail:
    fprintf(stderr, "tokamak kvcheck: %s\n", tk_last_error());
out:
    for (int k = 0; k < N_KINDS; k++) kc_run_free(&runs[k]);
    kc_run_free(&ref);
    tk_free(lr);
    tk_free(lq);
    tk_free(prompt);
    tk_model_free(m);
    return rc;
}
