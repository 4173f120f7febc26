/* tokamak kvcheck: how much a KV cache type changes the model's predictions.
 * For each prompt seed: a random prompt, then greedy positions teacher-forced
 * from an F32-KV run (every run is fed the F32 run's token, so one flip does
 * not derail the rest); per KV type, the top-1 agreement with the F32 run and
 * the mean KL(F32 || type) of the next-token distributions. The weights are
 * shared, so only the KV storage differs. This is the INT8 KV agreement check
 * at any model size (the CI test runs it on the tiny model). Float weights
 * only make sense here: quantized weights quantize the activations, whose
 * rounding flips amplify any KV difference. */
#include <math.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/backend.h"
#include "backend/runner.h"
#include "cli/cli.h"
#include "cli/compare.h"
#include "cli/opts.h"
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

typedef struct kc_seed_list {
    int v[KC_MAX_SEEDS], n;
} kc_seed_list;

typedef struct kc_args {
    kc_seed_list seeds;
    int np, ngen;
} kc_args;

/* "5,6,7" -> up to KC_MAX_SEEDS seeds in [0, 2^30]. */
static bool kc_seeds(const char *v, void *dst) {
    kc_seed_list *a = dst;
    int n = 0;
    for (const char *p = v; *p;) {
        char num[16];
        size_t k = strcspn(p, ",");
        long l;
        if (n == KC_MAX_SEEDS || k == 0 || k >= sizeof num) return false;
        memcpy(num, p, k);
        num[k] = 0;
        if (!cli_parse_long(num, 0, 1 << 30, &l)) return false;
        a->v[n++] = (int)l;
        p += k + (p[k] == ',');
    }
    if (n == 0) return false;
    a->n = n;
    return true;
}

static const cli_opt KC_ROWS[] = {
    {.name = "--seeds",
     .arg = "LIST",
     .help = "prompt seeds (default 99,1,2,3,4)",
     .kind = CLI_FN,
     .off = offsetof(kc_args, seeds),
     .fn = kc_seeds,
     .want = "up to 16 comma-separated integers in [0, 1073741824]"},
    {.name = "--prompt",
     .arg = "N",
     .help = "prompt tokens (default 32)",
     .kind = CLI_INT,
     .off = offsetof(kc_args, np),
     .lo = 1,
     .hi = 4096},
    {.name = "--gen",
     .arg = "N",
     .help = "teacher-forced greedy positions compared (default 256)",
     .kind = CLI_INT,
     .off = offsetof(kc_args, ngen),
     .lo = 1,
     .hi = 1 << 16},
    {.name = "--block-size",
     .arg = "N",
     .help = "KV block tokens: 16, 32, 64, 128 or 256 (default 16)",
     .kind = CLI_INT,
     .dest = CLI_D_ENGINE,
     .off = offsetof(tk_engine_opts, block_size),
     .lo = 16,
     .hi = 256,
     .flags = CLI_POW2},
    {0},
};

static const cli_cmd KC_CMD = {
    "kvcheck",
    "usage: tokamak kvcheck -m MODEL [options]",
    CLI_G_MODEL | CLI_G_THREADS,
    KC_ROWS,
    "Compares int8 (per-head and per-token scales), bf16 and f16 KV against f32 KV:\n"
    "top-1 agreement and mean KL divergence per seed and over all seeds.\n"
    "Use float weights (F32/F16/BF16): with Q8_0/Q4 weights the activations are\n"
    "quantized too, and a tiny KV difference that flips their rounding swamps the\n"
    "KV error (even f16 KV then shows a KL of ~6e-5 on qwen3-0.6b).",
    0,
    NULL,
};

static bool kc_step(cli_seq *r, const int32_t *toks, int n, int pos0, float *logits) {
    return runner_len(r->r) == pos0 && runner_step(r->r, toks, n, 1, logits) == TK_OK;
}

int cmd_kvcheck(int argc, char **argv) {
    kc_args ka = {{{99, 1, 2, 3, 4}, 5}, 32, 256};
    cli_opts o;
    cli_opts_init(&o, &KC_CMD, &ka);
    o.engine.block_size = 16;
    int prc = cli_opts_parse(&o, argc, argv);
    if (prc != CLI_GO_ON) return prc;
    if (!o.model_path) {
        cli_error(&KC_CMD, "-m MODEL is required; 'tokamak kvcheck --help' lists the options");
        return 2;
    }
    const char *path = o.model_path;
    const int *seeds = ka.seeds.v;
    int n_seeds = ka.seeds.n, np = ka.np, ngen = ka.ngen, bs = o.engine.block_size,
        threads = o.engine.n_threads;
    tk_model *m = NULL;
    if (tk_model_open(path, &o.model, &m) != TK_OK) {
        fprintf(stderr, "tokamak kvcheck: %s\n", tk_last_error());
        return 1;
    }
    const int vocab = model_hparams(m)->n_vocab, ctx = np + ngen;
    if (threads == 0) {
        tk_cpu c;
        cpu_detect(&c);
        threads = c.n_cores;
    }
    cli_seq ref, runs[N_KINDS];
    memset(&ref, 0, sizeof ref);
    memset(runs, 0, sizeof runs);
    float *lr = tk_malloc((size_t)vocab * sizeof *lr), *lq = tk_malloc((size_t)vocab * sizeof *lq);
    int32_t *prompt = tk_malloc((size_t)np * sizeof *prompt);
    int rc = 1;
    if (!lr || !lq || !prompt) {
        fprintf(stderr, "tokamak kvcheck: out of memory\n");
        goto out;
    }
    printf("kvcheck: %s, %d-token prompts, %d teacher-forced greedy positions, block %d, %d threads\n\n",
           path, np, ngen, bs, threads);
    printf("| seed | F32 top-2 gap mean | near-ties < 1e-3 |");
    for (int k = 0; k < N_KINDS; k++) printf(" %s agree | %s KL |", KINDS[k].name, KINDS[k].name);
    printf("\n|---:|---:|---:|");
    for (int k = 0; k < N_KINDS; k++) printf("---:|---:|");
    printf("\n");
    long tot_agree[N_KINDS] = {0}, tot_ties = 0;
    double tot_kl[N_KINDS] = {0};
    for (int si = 0; si < n_seeds; si++) {
        /* fresh caches per prompt (the others run on the F32 run's threads, so it goes last) */
        for (int k = 0; k < N_KINDS; k++) cli_seq_free(&runs[k]);
        cli_seq_free(&ref);
        bool ok = cli_seq_init(&ref, m, NULL, threads, o.engine.pin_threads, TK_KV_F32, TK_KV_SCALE_HEAD, ctx,
                               bs, np, NULL, NULL);
        for (int k = 0; ok && k < N_KINDS; k++)
            ok = cli_seq_init(&runs[k], m, &ref, threads, o.engine.pin_threads, KINDS[k].type, KINDS[k].scale,
                              ctx, bs, np, NULL, NULL);
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
            int32_t next = (int32_t)cli_argmax(lr, vocab);
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
                agree[k] += cli_argmax(lq, vocab) == next;
                kl[k] += cli_kl(lr, lq, vocab);
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
        printf(" %.2f%% | %.3g |", 100.0 * (double)tot_agree[k] / ((double)ngen * n_seeds),
               tot_kl[k] / ((double)ngen * n_seeds));
    printf("\n");
    rc = 0;
    goto out;
fail:
    fprintf(stderr, "tokamak kvcheck: %s\n", tk_last_error());
out:
    for (int k = 0; k < N_KINDS; k++) cli_seq_free(&runs[k]);
    cli_seq_free(&ref);
    tk_free(lr);
    tk_free(lq);
    tk_free(prompt);
    tk_model_free(m);
    return rc;
}
