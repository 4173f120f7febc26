/* Speculative decoding with a draft model: the accept/residual rule of
 * speculative sampling (the emitted token follows the target's distribution:
 * chi-square over many seeded trials, and a broken residual fails it);
 * sampler_dist is the distribution sampler_sample draws from; the controller
 * prices draft passes; the draft KV after a rejection equals that of a draft
 * run that never saw the rejected tokens; the engine over the tiny synthetic
 * qwen3 as target and draft gives the same greedy tokens with the draft model
 * as without (the same model: every draft accepted; other weights: most
 * rejected), and seeded sampling with drafts is reproducible. */
#include <math.h>
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "backend/backend.h"
#include "core/alloc.h"
#include "core/error.h"
#include "engine/draft.h"
#include "engine/engine.h"
#include "engine/sampler.h"
#include "engine/spec.h"
#include "model/model.h"
#include "tiny_draft.h"
#include "tiny_model.h"
#include "tokamak.h"

/* ---- speculative sampling --------------------------------------------------------------- */

enum { SV = 12 };

/* The 0.999 quantile of chi-square with dof degrees of freedom (Wilson-Hilferty). */
static double chi2_q999(int dof) {
    double a = 2.0 / (9.0 * dof), z = 3.0902;
    double t = 1 - a + z * sqrt(a);
    return dof * t * t * t;
}

/* Chi-square of counts (n trials) against p; a token p rules out that was
 * emitted makes it infinite. */
static double chi2_of(const long *count, const float *p, long n, int *dof) {
    double x = 0;
    *dof = -1;
    for (int i = 0; i < SV; i++) {
        if (p[i] <= 0) {
            if (count[i]) return INFINITY;
            continue;
        }
        double e = (double)n * p[i];
        x += (count[i] - e) * (count[i] - e) / e;
        (*dof)++;
    }
    return x;
}

/* A deliberately wrong rule: on rejection, draw from p itself. */
static int32_t verify_wrong(const float *p, const float *q, int32_t x, double ua, double ur) {
    if (q[x] > 0 && ua * q[x] < p[x]) return x;
    return spec_draw(p, SV, ur);
}

/* A distribution from seeded logits; tokens in `zero` (bit mask) get none. */
static void make_dist(float *p, uint64_t seed, unsigned zero, double spread) {
    double z = 0;
    for (int i = 0; i < SV; i++) {
        p[i] = (zero >> i) & 1 ? 0 : (float)exp(spread * sampler_uniform(seed, (uint64_t)i));
        z += p[i];
    }
    for (int i = 0; i < SV; i++) p[i] = (float)(p[i] / z);
}

static void test_spec_draft_residual_chi2(void **state) {
    (void)state;
    struct {
        uint64_t sp, sq;
        unsigned zp, zq; /* tokens p / q rule out */
        int q_kind;      /* 0: seeded, 1: q = p, 2: a point mass on token 3 */
    } cases[] = {
        {1, 2, 0, 0, 0},         {3, 4, 0x0f0, 0, 0}, /* the draft proposes tokens the target rules out */
        {5, 6, 0, 0x0ff, 0},                          /* the draft never proposes most tokens */
        {7, 7, 0x003, 0x003, 1},                      /* q = p: every draft accepted */
        {8, 0, 0, 0, 2},                              /* a point-mass drafter (n-gram) */
    };
    const long N = 200000;
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        float p[SV], q[SV];
        make_dist(p, cases[c].sp, cases[c].zp, 3.0);
        if (cases[c].q_kind == 1)
            memcpy(q, p, sizeof q);
        else if (cases[c].q_kind == 2) {
            memset(q, 0, sizeof q);
            q[3] = 1;
        } else
            make_dist(q, cases[c].sq, cases[c].zq, 3.0);
        long count[SV] = {0}, wrong[SV] = {0}, accepted = 0;
        double overlap = 0;
        for (int i = 0; i < SV; i++) overlap += p[i] < q[i] ? p[i] : q[i];
        for (long t = 0; t < N; t++) {
            uint64_t seed = 1000 + c;
            int32_t x = spec_draw(q, SV, sampler_uniform(seed ^ SPEC_SALT_DRAFT, (uint64_t)t));
            double ua = sampler_uniform(seed ^ SPEC_SALT_ACCEPT, (uint64_t)t),
                   ur = sampler_uniform(seed, (uint64_t)t);
            bool acc;
            int32_t tok = spec_verify_token(p, q, SV, x, ua, ur, &acc);
            assert_true(tok >= 0 && tok < SV);
            assert_int_equal(acc, tok == x); /* a rejected draft is never the residual's draw */
            count[tok]++;
            accepted += acc;
            wrong[verify_wrong(p, q, x, ua, ur)]++;
        }
        int dof, dof_w;
        double x2 = chi2_of(count, p, N, &dof), x2_w = chi2_of(wrong, p, N, &dof_w);
        double rate = (double)accepted / (double)N;
        print_message("case %zu: chi-square %.1f (dof %d, 0.999 quantile %.1f), broken residual %.1f; "
                      "accepted %.4f, sum min(p, q) %.4f\n",
                      c, x2, dof, chi2_q999(dof), x2_w, rate, overlap);
        assert_true(x2 < chi2_q999(dof));
        assert_true(fabs(rate - overlap) < 0.01); /* the acceptance rate is the overlap */
        if (cases[c].q_kind != 1) assert_true(x2_w > chi2_q999(dof_w)); /* the test can fail */
    }
    /* No mass: nothing to draw. */
    float none[SV] = {0};
    bool acc;
    assert_int_equal(spec_draw(none, SV, 0.5), -1);
    assert_int_equal(spec_verify_token(none, none, SV, 0, 0.5, 0.5, &acc), -1);
}

/* sampler_dist is what sampler_sample draws from: over a small vocabulary
 * with top-k, top-p and min-p, seeded draws match it (chi-square). */
static void test_spec_draft_sampler_dist(void **state) {
    (void)state;
    tk_sampling sp[3];
    for (int i = 0; i < 3; i++) tk_sampling_default(&sp[i]);
    sp[0].temperature = 1.0f;
    sp[1].temperature = 0.7f;
    sp[1].top_k = 6;
    sp[2].temperature = 1.3f;
    sp[2].top_p = 0.8f;
    sp[2].min_p = 0.02f;
    float lg0[SV];
    for (int i = 0; i < SV; i++) lg0[i] = (float)(4 * sampler_uniform(77, (uint64_t)i));
    for (int c = 0; c < 3; c++) {
        tk_sampler *s;
        assert_int_equal(sampler_init(&sp[c], SV, &s), TK_OK);
        float lg[SV], p[SV];
        memcpy(lg, lg0, sizeof lg);
        int32_t best = sampler_dist(s, lg, NULL, 0, p, NULL);
        assert_int_equal(sampler_draws(s), 0); /* draws nothing */
        double z = 0;
        for (int i = 0; i < SV; i++) z += p[i];
        assert_true(fabs(z - 1) < 1e-5 && p[best] > 0);
        long count[SV] = {0};
        const long N = 50000;
        for (long t = 0; t < N; t++) {
            memcpy(lg, lg0, sizeof lg);
            tk_token_event ev;
            count[sampler_sample(s, lg, NULL, 0, &ev)]++;
        }
        int dof;
        double x2 = chi2_of(count, p, N, &dof);
        print_message("sampling %d: chi-square %.1f (dof %d, quantile %.1f)\n", c, x2, dof, chi2_q999(dof));
        assert_true(x2 < chi2_q999(dof));
        sampler_free(s);
    }
}

/* A fit of c0 + c1 T from steps of sizes 1..9. */
static void fit_of(spec_cost *c, double c0, double c1) {
    memset(c, 0, sizeof *c);
    for (int i = 0; i < 60; i++) spec_cost_observe(c, 1 + i % 9, c0 + c1 * (1 + i % 9));
}

static void test_spec_draft_controller(void **state) {
    (void)state;
    spec_ctl ctl = {.k_max = 8, .max_total = 256, .draft_model = true};
    int k[16], av[16];
    double hi[16];
    for (int i = 0; i < 16; i++) {
        hi[i] = 0.8;
        av[i] = 8;
    }
    /* Batch 1, bandwidth-bound target (10 ms + 0.1 ms a token), a draft pass
     * of 1 ms: drafting pays. A draft pass that costs what the target does:
     * it does not (k drafts cost k target steps for 1 + ... < k + 1 tokens). */
    fit_of(&ctl.cost, 0.010, 0.0001);
    fit_of(&ctl.draft, 0.001, 0.00001);
    assert_true(spec_choose(&ctl, 1, hi, av, k) >= 2);
    fit_of(&ctl.draft, 0.010, 0.0001);
    assert_int_equal(spec_choose(&ctl, 1, hi, av, k), 0);
    /* Batch 16 of a compute-bound target (1 ms + 1 ms a token): an expensive
     * draft (half the target) never pays; a free one does at this acceptance. */
    fit_of(&ctl.cost, 0.001, 0.001);
    fit_of(&ctl.draft, 0.0005, 0.0005);
    assert_int_equal(spec_choose(&ctl, 16, hi, av, k), 0);
    memset(&ctl.draft, 0, sizeof ctl.draft);
    fit_of(&ctl.cost, 0.010, 0.0001);
    assert_true(spec_choose(&ctl, 16, hi, av, k) >= 16);
    /* The mean price before the draft's fit is trusted. */
    spec_cost one = {0};
    double e0, e1;
    assert_false(spec_cost_price(&one, &e0, &e1));
    for (int i = 0; i < 5; i++) spec_cost_observe(&one, 4, 0.008);
    assert_true(spec_cost_price(&one, &e0, &e1));
    assert_true(e0 == 0 && fabs(e1 - 0.002) < 1e-9);
    /* Probes without a fit: the fewest drafts that add SPEC_PROBE_TOKENS tokens. */
    spec_ctl p = {.k_max = 8, .max_total = 256, .draft_model = true};
    int drafted1 = 0, drafted16 = 0;
    for (int i = 0; i < SPEC_PROBE_EVERY; i++) drafted1 += spec_choose(&p, 1, hi, av, k);
    for (int i = 0; i < SPEC_PROBE_EVERY; i++) drafted16 += spec_choose(&p, 16, hi, av, k);
    assert_int_equal(drafted1, SPEC_PROBE_TOKENS);
    assert_int_equal(drafted16, SPEC_PROBE_TOKENS);
    /* No probes while a draft pass costs more than its drafts could gain even
     * if verifying were free; probes again once it is cheap. */
    spec_ctl np = {.k_max = 8, .max_total = 256, .draft_model = true};
    for (int i = 0; i < 20; i++) spec_cost_observe(&np.cost, 1, 0.010); /* one size: no fit */
    fit_of(&np.draft, 0.010, 0.001);
    int probed = 0;
    for (int i = 0; i < 2 * SPEC_PROBE_EVERY; i++) probed += spec_choose(&np, 1, hi, av, k);
    assert_int_equal(probed, 0);
    fit_of(&np.draft, 0.001, 0.0001);
    for (int i = 0; i < 2 * SPEC_PROBE_EVERY; i++) probed += spec_choose(&np, 1, hi, av, k);
    assert_int_equal(probed, 2 * SPEC_PROBE_TOKENS);
}

/* ---- the draft KV after a rejection ------------------------------------------------------- */

/* A drafter over the tiny model drafts for one sequence in rounds: k drafts,
 * of which the target "accepted" the first acc and replaced the next with
 * another token; drafter_settle drops the rest (with INT8 per-head scales,
 * by putting back the copy of the block taken before the passes, or by
 * feeding the block again from its first slot). A second sequence on the
 * same drafter is fed the prompt and then every kept token in one step. The
 * draft KV of the two is equal bit for bit, for every KV type. */
static void test_spec_draft_kv_after_rejection(void **state) {
    (void)state;
    char path[512];
    tk_model *m = open_tiny();
    if (!m || !tiny_path(0, path, sizeof path)) skip();
    const int V = model_hparams(m)->n_vocab, L = model_hparams(m)->n_layer;
    const int kvd = model_hparams(m)->n_head_kv * model_hparams(m)->head_dim;
    struct {
        tk_kv_type t;
        tk_kv_scale s;
    } kinds[] = {
        {TK_KV_F16, TK_KV_SCALE_HEAD}, {TK_KV_INT8, TK_KV_SCALE_HEAD}, {TK_KV_INT8, TK_KV_SCALE_TOKEN}};
    enum { NP = 16, NMAX = 31 };
    float *kv[4];
    for (int i = 0; i < 4; i++) kv[i] = tk_calloc((size_t)kvd, sizeof(float));
    tk_sampling greedy;
    tk_sampling_default(&greedy);
    for (size_t c = 0; c < sizeof kinds / sizeof kinds[0]; c++) {
        backend be;
        backend_cpu_opts bo = {.n_threads = 2,
                               .block_size = 16,
                               .kv_type = kinds[c].t,
                               .kv_scale = kinds[c].s,
                               .n_blocks = 8,
                               .max_tokens = 64,
                               .max_seqs = 2,
                               .max_ctx = 64};
        assert_int_equal(backend_cpu_create(m, &bo, &be), TK_OK);
        drafter *d = NULL;
        assert_int_equal(drafter_create(path, &be, 8, 64, 2, 64, &d), TK_OK);
        draft_seq a, b;
        assert_int_equal(drafter_seq_init(d, &a), TK_OK);
        assert_int_equal(drafter_seq_init(d, &b), TK_OK);
        int32_t toks[64], ref[64];
        for (int i = 0; i < NP; i++) toks[i] = (int32_t)(sampler_uniform(9, (uint64_t)i) * V);
        int n = NP, round = 0, rejected = 0, restored = 0;
        const bool rescales = kinds[c].t == TK_KV_INT8 && kinds[c].s == TK_KV_SCALE_HEAD;
        while (n < NMAX - 8) {
            int k = 2 + round % 3;
            draft_job jb = {
                .ds = &a, .tokens = toks, .n_tokens = n, .n_prompt = NP, .sampling = &greedy, .k = k};
            drafter_run(d, &jb, 1, NULL);
            assert_int_equal(jb.k, k);
            assert_int_equal(a.n_done, n + k - 1);
            int acc = round % k; /* < k: draft acc + 1 is replaced */
            toks[n + acc] = (toks[n + acc] + 7) % V;
            drafter_settle(d, &a, n + acc);
            /* a rescaling KV fed again from the block's first slot would stop at a multiple of 16 */
            restored += rescales && a.n_done % 16 != 0 && a.n_done < n + acc;
            rejected++;
            n += acc + 1;
            round++;
        }
        /* A last round rejects its first draft (the fed drafts are dropped),
         * and one more catches up to n. */
        draft_job jl = {.ds = &a, .tokens = toks, .n_tokens = n, .n_prompt = NP, .sampling = &greedy, .k = 3};
        drafter_run(d, &jl, 1, NULL);
        toks[n] = (toks[n] + 7) % V;
        drafter_settle(d, &a, n);
        assert_true(a.n_done <= n);
        rejected++;
        n++;
        draft_job jb = {.ds = &a, .tokens = toks, .n_tokens = n, .n_prompt = NP, .sampling = &greedy, .k = 1};
        drafter_run(d, &jb, 1, NULL);
        assert_int_equal(a.n_done, n);
        memcpy(ref, toks, sizeof ref);
        draft_job r1 = {.ds = &b, .tokens = ref, .n_tokens = NP, .n_prompt = NP, .sampling = &greedy, .k = 1};
        drafter_run(d, &r1, 1, NULL);
        assert_int_equal(b.n_done, NP);
        memcpy(ref, toks, sizeof ref);
        draft_job r2 = {.ds = &b, .tokens = ref, .n_tokens = n, .n_prompt = NP, .sampling = &greedy, .k = 1};
        drafter_run(d, &r2, 1, NULL);
        assert_int_equal(b.n_done, n);
        assert_int_equal(ref[n], toks[n]); /* the same draft after the same tokens */
        const backend *dbe = drafter_backend(d);
        int diff = 0;
        for (int l = 0; l < L; l++)
            for (int q = 0; q < n; q++) {
                dbe->kv_read(dbe->ctx, l, a.bt, q, kv[0], kv[1]);
                dbe->kv_read(dbe->ctx, l, b.bt, q, kv[2], kv[3]);
                size_t nb = (size_t)kvd * sizeof(float);
                diff += memcmp(kv[0], kv[2], nb) != 0 || memcmp(kv[1], kv[3], nb) != 0;
            }
        print_message("kv %d scale %d: %d rejections (%d blocks put back), %d of %d (layer, position) pairs "
                      "differ\n",
                      (int)kinds[c].t, (int)kinds[c].s, rejected, restored, diff, L * n);
        assert_true(rejected >= 4);
        if (rescales) assert_true(restored > 0);
        assert_int_equal(diff, 0);
        drafter_seq_free(d, &a);
        drafter_seq_free(d, &b);
        drafter_free(d);
        backend_free(&be);
    }
    for (int i = 0; i < 4; i++) tk_free(kv[i]);
    tk_model_free(m);
}

/* ---- the engine ------------------------------------------------------------------------- */

static void test_spec_draft_options(void **state) {
    (void)state;
    char path[512], other[512];
    tk_model *m = open_tiny();
    if (!m || !tiny_path(0, path, sizeof path)) skip();
    tk_engine_opts o;
    tk_engine_opts_default(&o);
    o.ctx = 64;
    o.block_size = 16;
    o.max_batch = 2;
    o.n_threads = 2;
    tk_engine *e = NULL;
    o.spec = TK_SPEC_DRAFT;
    assert_int_equal(tk_engine_create(m, &o, &e), TK_ERR_INVALID);
    assert_non_null(strstr(tk_last_error(), "draft model"));
    o.spec = TK_SPEC_NGRAM;
    o.draft_model = path;
    assert_int_equal(tk_engine_create(m, &o, &e), TK_ERR_INVALID);
    assert_non_null(strstr(tk_last_error(), "spec draft"));
    o.spec = TK_SPEC_OFF;
    o.draft_model = "/nonexistent/draft.gguf";
    assert_int_not_equal(tk_engine_create(m, &o, &e), TK_OK);
    assert_non_null(strstr(tk_last_error(), "draft model"));
    /* Another vocabulary: refused, naming both sizes. */
    const char *tmp = getenv("TK_TMP"), *cli = getenv("TK_CLI");
    snprintf(other, sizeof other, "%s/engine_tiny_q4_0_vocab151680.gguf", tmp);
    struct stat sb;
    if (stat(other, &sb) != 0) {
        char cmd[2048];
        snprintf(cmd, sizeof cmd,
                 "'%s' synth --preset tiny --dtype q4_0 --layers 1 --vocab 151680 -o '%s.%d' 2>/dev/null && "
                 "mv '%s.%d' '%s'",
                 cli, other, (int)getpid(), other, (int)getpid(), other);
        assert_int_equal(system(cmd), 0);
    }
    o.draft_model = other;
    assert_int_equal(tk_engine_create(m, &o, &e), TK_ERR_INVALID);
    assert_non_null(strstr(tk_last_error(), "151680"));
    /* spec off with a draft model: the draft model drafts. */
    o.draft_model = path;
    assert_int_equal(tk_engine_create(m, &o, &e), TK_OK);
    tk_engine_stats st;
    tk_engine_stats_get(e, &st);
    assert_int_equal(st.spec, TK_SPEC_DRAFT);
    tk_engine_free(e);
    tk_model_free(m);
}

/* Greedy tokens with the draft model (the same model, and one with other
 * weights) equal those without, at batch 4; seeded sampling with drafts
 * gives the same tokens twice and at batch 1 on one thread. Every draft on
 * offer is verified (spec_fixed). */
static void test_spec_draft_engine_same_tokens(void **state) {
    (void)state;
    char same[512], other[512];
    tk_model *m = open_tiny();
    if (!m || !tiny_path(0, same, sizeof same) || !tiny_path(1, other, sizeof other)) skip();
    const int V = model_hparams(m)->n_vocab;
    enum { NR = 4, NP = 24, NOUT = 10 };
    static int32_t prompts[NR * NP];
    for (int i = 0; i < NR * NP; i++) prompts[i] = (int32_t)(sampler_uniform(41, (uint64_t)i) * V);
    enum { NS = 17 }; /* prompts of one minimum chunk and a token */
    static int32_t odd[NR * NS];
    for (int i = 0; i < NR * NS; i++) odd[i] = (int32_t)(sampler_uniform(42, (uint64_t)i) * V);
    static td_rec ref[NR], got[NR], again[NR];
    tk_engine_opts o;
    tk_engine_opts_default(&o);
    o.ctx = 64;
    o.block_size = 16;
    o.max_batch = NR;
    o.n_threads = 2;
    o.spec_k = 3;
    td_run(m, &o, false, prompts, NP, NR, NOUT, 0, ref);
    const char *drafts[2] = {same, other};
    for (int dm = 0; dm < 2; dm++) {
        o.draft_model = drafts[dm];
        tk_engine_stats st = td_run(m, &o, true, prompts, NP, NR, NOUT, 0, got);
        for (int i = 0; i < NR; i++) assert_memory_equal(got[i].out, ref[i].out, NOUT * sizeof(int32_t));
        print_message("draft %s: %llu drafted, %llu accepted\n", dm ? "other weights" : "same model",
                      (unsigned long long)st.spec_drafted, (unsigned long long)st.spec_accepted);
        assert_true(st.spec_drafted > 0);
        /* The draft prefilled every prompt but its last token following the
         * target (the first draft pass feeds that one). */
        assert_int_equal(st.spec_follow_tokens, NR * (NP - 1));
        assert_true(st.spec_follow_seconds > 0);
        if (dm == 0) assert_int_equal(st.spec_accepted, st.spec_drafted);
        if (dm == 1) assert_true(st.spec_accepted < st.spec_drafted);
    }
    /* Seeded sampling with every draft verified (spec_fixed): the same tokens
     * twice, and at batch 1 on one thread, with a draft that is mostly
     * rejected (the residual draws) and one always accepted. */
    for (int dm = 0; dm < 2; dm++) {
        o.draft_model = drafts[dm];
        o.max_batch = NR;
        o.n_threads = 2;
        tk_engine_stats s1 = td_run(m, &o, true, prompts, NP, NR, NOUT, 0.8f, got);
        td_run(m, &o, true, prompts, NP, NR, NOUT, 0.8f, again);
        for (int i = 0; i < NR; i++) assert_memory_equal(got[i].out, again[i].out, NOUT * sizeof(int32_t));
        assert_true(s1.spec_accepted > 0);
        assert_true(s1.spec_fixed);
        o.max_batch = 1;
        o.n_threads = 1;
        td_run(m, &o, true, prompts, NP, NR, NOUT, 0.8f, again);
        for (int i = 0; i < NR; i++) assert_memory_equal(got[i].out, again[i].out, NOUT * sizeof(int32_t));
        /* A step cap of 25 tokens, four at once: the prompts go in at 25
         * tokens a step and the draft follows them as they go in, so every
         * decode drafts from the first on, as above. (The cap is also the
         * draft's pass: a whole prompt caught up at the first decode, 25
         * tokens, fills a pass alone, and a sequence that starts drafting
         * beside another's feed would go without drafts that step.) */
        o.max_batch = NR;
        o.n_threads = 2;
        o.step_tokens = 25;
        td_run(m, &o, true, prompts, NP, NR, NOUT, 0.8f, again);
        for (int i = 0; i < NR; i++) assert_memory_equal(got[i].out, again[i].out, NOUT * sizeof(int32_t));
        o.step_tokens = 0;
        /* However the prompts fall into chunks: whole, or 16 tokens a step
         * (a step target of 1 us leaves the budget at its minimum chunk) so
         * that each prompt's last token runs alone. Drafting starts at a
         * request's second token: that last token is sampled as the end of a
         * prefill would be, not drafted on. */
        o.max_batch = NR;
        o.no_chunking = true;
        td_run(m, &o, true, odd, NS, NR, NOUT, 0.8f, got);
        o.no_chunking = false;
        o.step_ms = 0.001;
        tk_engine_stats sc = td_run(m, &o, true, odd, NS, NR, NOUT, 0.8f, again);
        for (int i = 0; i < NR; i++) assert_memory_equal(got[i].out, again[i].out, NOUT * sizeof(int32_t));
        assert_true(sc.steps >= (uint64_t)(NR * NS + 15) / 16); /* 16 prompt tokens a step at most */
        o.step_ms = 0;
    }
    tk_model_free(m);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_spec_draft_residual_chi2), cmocka_unit_test(test_spec_draft_sampler_dist),
        cmocka_unit_test(test_spec_draft_controller),    cmocka_unit_test(test_spec_draft_kv_after_rejection),
        cmocka_unit_test(test_spec_draft_options),       cmocka_unit_test(test_spec_draft_engine_same_tokens),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
