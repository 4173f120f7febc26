/* The sampler: parameter validation, greedy, penalties, bias, truncation,
 * seeded reproducibility, and the empirical distribution of temperature draws. */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "core/alloc.h"
#include "core/error.h"
#include "engine/sampler.h"
#include "engine/sampler_simd.h"

#define V 50

static void fill_logits(float *l, uint64_t seed) {
    for (int t = 0; t < V; t++) l[t] = (float)(sampler_uniform(seed, (uint64_t)t) * 4.0 - 2.0);
}

static int32_t sample_once(const tk_sampling *p, const float *src, const int32_t *hist, int nh,
                           tk_token_event *ev) {
    tk_sampler *s = NULL;
    assert_int_equal(sampler_init(p, V, &s), TK_OK);
    float l[V];
    memcpy(l, src, sizeof l);
    int32_t t = sampler_sample(s, l, hist, nh, ev);
    sampler_free(s);
    return t;
}

static void test_sampler_rejects_bad_params(void **state) {
    (void)state;
    tk_sampling p;
    tk_sampler *s = (tk_sampler *)0x1;
    tk_sampling_default(&p);
    p.temperature = -1;
    assert_int_equal(sampler_init(&p, V, &s), TK_ERR_INVALID);
    assert_null(s);
    assert_non_null(strstr(tk_last_error(), "temperature"));
    tk_sampling_default(&p);
    p.temperature = NAN;
    assert_int_equal(sampler_check(&p, V), TK_ERR_INVALID);
    tk_sampling_default(&p);
    p.top_p = 0;
    assert_int_equal(sampler_check(&p, V), TK_ERR_INVALID);
    assert_non_null(strstr(tk_last_error(), "top_p"));
    p.top_p = 1.5f;
    assert_int_equal(sampler_check(&p, V), TK_ERR_INVALID);
    p.top_p = NAN;
    assert_int_equal(sampler_check(&p, V), TK_ERR_INVALID);
    tk_sampling_default(&p);
    p.n_logprobs = 21;
    assert_int_equal(sampler_check(&p, V), TK_ERR_INVALID);
    assert_non_null(strstr(tk_last_error(), "n_logprobs"));
    tk_sampling_default(&p);
    p.top_k = -3;
    assert_int_equal(sampler_check(&p, V), TK_ERR_INVALID);
    tk_sampling_default(&p);
    p.min_p = 2;
    assert_int_equal(sampler_check(&p, V), TK_ERR_INVALID);
    tk_sampling_default(&p);
    p.repetition_penalty = 0;
    assert_int_equal(sampler_check(&p, V), TK_ERR_INVALID);
    tk_sampling_default(&p);
    p.frequency_penalty = INFINITY;
    assert_int_equal(sampler_check(&p, V), TK_ERR_INVALID);
    tk_sampling_default(&p);
    tk_logit_bias b = {V, 1.0f};
    p.logit_bias = &b;
    p.n_logit_bias = 1;
    assert_int_equal(sampler_check(&p, V), TK_ERR_RANGE);
    assert_non_null(strstr(tk_last_error(), "50"));
    b.token = 3;
    b.bias = NAN;
    assert_int_equal(sampler_check(&p, V), TK_ERR_INVALID);
    b.bias = -INFINITY;
    assert_int_equal(sampler_check(&p, V), TK_OK);
    p.logit_bias = NULL;
    assert_int_equal(sampler_check(&p, V), TK_ERR_INVALID);
    assert_int_equal(sampler_check(NULL, V), TK_ERR_INVALID);
    sampler_free(NULL);
}

static void test_sampler_greedy_and_logprobs(void **state) {
    (void)state;
    float l[V];
    fill_logits(l, 7);
    l[17] = 5.0f;
    l[30] = 4.0f;
    l[9] = 5.0f; /* tie with 17: the lower id wins */
    tk_sampling p;
    tk_sampling_default(&p);
    p.n_logprobs = 3;
    tk_token_event ev;
    memset(&ev, 0, sizeof ev);
    assert_int_equal(sample_once(&p, l, NULL, 0, &ev), 9);
    assert_int_equal(ev.n_top, 3);
    assert_int_equal(ev.top_tokens[0], 9);
    assert_int_equal(ev.top_tokens[1], 17);
    assert_int_equal(ev.top_tokens[2], 30);
    double z = 0;
    for (int t = 0; t < V; t++) z += exp((double)l[t]);
    assert_true(fabs(ev.logprob - (5.0 - log(z))) < 1e-4);
    assert_true(fabs(ev.top_logprobs[2] - (4.0 - log(z))) < 1e-4);
    /* the token's logprob alone; none asked for: NAN, the same token */
    p.n_logprobs = 0;
    p.logprobs = true;
    assert_int_equal(sample_once(&p, l, NULL, 0, &ev), 9);
    assert_int_equal(ev.n_top, 0);
    assert_true(fabs(ev.logprob - (5.0 - log(z))) < 1e-4);
    p.logprobs = false;
    assert_int_equal(sample_once(&p, l, NULL, 0, &ev), 9);
    assert_true(isnan(ev.logprob) && ev.n_top == 0);
    p.temperature = 0.7f;
    assert_true(sample_once(&p, l, NULL, 0, &ev) >= 0);
    assert_true(isnan(ev.logprob) && ev.n_top == 0);
    p.logprobs = true;
    const int32_t drawn = sample_once(&p, l, NULL, 0, &ev);
    assert_true(fabs(ev.logprob - (l[drawn] - log(z))) < 1e-4);
    p.temperature = 0;
    p.n_logprobs = 3;
    /* NaN counts as -inf; all -inf gives -1. */
    float bad[V];
    for (int t = 0; t < V; t++) bad[t] = NAN;
    bad[4] = -1.0f;
    assert_int_equal(sample_once(&p, bad, NULL, 0, &ev), 4);
    for (int t = 0; t < V; t++) bad[t] = -INFINITY;
    assert_int_equal(sample_once(&p, bad, NULL, 0, &ev), -1);
}

static void test_sampler_bias_and_penalties(void **state) {
    (void)state;
    float l[V];
    for (int t = 0; t < V; t++) l[t] = 0;
    l[5] = 3.0f;
    l[6] = 2.5f;
    l[7] = -1.0f;
    tk_sampling p;
    tk_sampling_default(&p);
    tk_token_event ev;
    tk_logit_bias b[2] = {{5, -INFINITY}, {8, 2.6f}};
    p.logit_bias = b;
    p.n_logit_bias = 2;
    assert_int_equal(sample_once(&p, l, NULL, 0, &ev), 8);
    p.n_logit_bias = 1;
    assert_int_equal(sample_once(&p, l, NULL, 0, &ev), 6);

    /* Repetition (HF): 3.0 / 2 = 1.5 < 2.5. */
    tk_sampling_default(&p);
    p.repetition_penalty = 2.0f;
    int32_t hist[4] = {5, 5, 7, 99 /* out of range: ignored */};
    assert_int_equal(sample_once(&p, l, hist, 4, &ev), 6);
    /* Frequency: 3.0 - 0.3 * 2 = 2.4 < 2.5; presence alone: 3.0 - 0.4 = 2.6 > 2.5. */
    tk_sampling_default(&p);
    p.frequency_penalty = 0.3f;
    assert_int_equal(sample_once(&p, l, hist, 4, &ev), 6);
    tk_sampling_default(&p);
    p.presence_penalty = 0.4f;
    assert_int_equal(sample_once(&p, l, hist, 4, &ev), 5);
    /* Presence/frequency skip the prompt part of history. */
    tk_sampling_default(&p);
    p.frequency_penalty = 0.3f;
    tk_sampler *s;
    assert_int_equal(sampler_init(&p, V, &s), TK_OK);
    sampler_set_n_prompt(s, 2);
    float c[V];
    memcpy(c, l, sizeof c);
    assert_int_equal(sampler_sample(s, c, hist, 4, &ev), 5);
    /* Scratch counts are left zeroed: the same call again gives the same answer. */
    memcpy(c, l, sizeof c);
    sampler_set_n_prompt(s, 0);
    assert_int_equal(sampler_sample(s, c, hist, 4, &ev), 6);
    memcpy(c, l, sizeof c);
    assert_int_equal(sampler_sample(s, c, hist, 4, &ev), 6);
    assert_int_equal(sampler_draws(s), 3);
    sampler_free(s);
}

static void test_sampler_seed_reproduces(void **state) {
    (void)state;
    tk_sampling p;
    tk_sampling_default(&p);
    p.temperature = 0.9f;
    p.top_p = 0.95f;
    p.seed = 1234;
    int32_t a[64], b[64];
    for (int run = 0; run < 2; run++) {
        tk_sampler *s;
        assert_int_equal(sampler_init(&p, V, &s), TK_OK);
        /* A second, unrelated sampler drawing in between must not matter. */
        tk_sampling q = p;
        q.seed = 99;
        tk_sampler *other;
        assert_int_equal(sampler_init(&q, V, &other), TK_OK);
        for (int i = 0; i < 64; i++) {
            float l[V];
            fill_logits(l, (uint64_t)i);
            tk_token_event ev;
            for (int k = 0; k < run * 3; k++) {
                float o[V];
                fill_logits(o, 1000u + (uint64_t)k);
                sampler_sample(other, o, NULL, 0, &ev);
            }
            (run ? b : a)[i] = sampler_sample(s, l, NULL, 0, &ev);
        }
        sampler_free(s);
        sampler_free(other);
    }
    assert_memory_equal(a, b, sizeof a);
    /* A different seed gives a different stream. */
    p.seed = 4321;
    tk_sampler *s;
    assert_int_equal(sampler_init(&p, V, &s), TK_OK);
    int same = 0;
    for (int i = 0; i < 64; i++) {
        float l[V];
        fill_logits(l, (uint64_t)i);
        tk_token_event ev;
        same += sampler_sample(s, l, NULL, 0, &ev) == a[i];
    }
    sampler_free(s);
    assert_true(same < 64);
}

/* Count draws per token over many seeds and compare with the expected
 * truncated distribution. */
static void histogram(const tk_sampling *base, const float *l, int n, int *hist) {
    memset(hist, 0, V * sizeof *hist);
    tk_sampler *s;
    assert_int_equal(sampler_init(base, V, &s), TK_OK);
    for (int i = 0; i < n; i++) {
        float c[V];
        memcpy(c, l, sizeof c);
        tk_token_event ev;
        int32_t t = sampler_sample(s, c, NULL, 0, &ev);
        assert_true(t >= 0 && t < V);
        hist[t]++;
    }
    sampler_free(s);
}

static void test_sampler_truncation(void **state) {
    (void)state;
    float l[V];
    for (int t = 0; t < V; t++) l[t] = -10.0f;
    /* probabilities at T=1 roughly .5, .3, .15, .05 over tokens 3, 11, 20, 40 */
    l[3] = logf(0.5f);
    l[11] = logf(0.3f);
    l[20] = logf(0.15f);
    l[40] = logf(0.05f);
    tk_sampling p;
    tk_sampling_default(&p);
    p.temperature = 1.0f;
    p.seed = 5;
    int h[V];
    const int N = 20000;

    p.top_k = 2;
    histogram(&p, l, N, h);
    assert_int_equal(h[3] + h[11], N);
    assert_true(fabs(h[3] / (double)N - 0.625) < 0.02);

    p.top_k = 0;
    p.top_p = 0.85f; /* .5 + .3 = .8 < .85: the nucleus takes token 20 as well */
    histogram(&p, l, N, h);
    assert_int_equal(h[3] + h[11] + h[20], N);
    assert_true(fabs(h[20] / (double)N - 0.15 / 0.95) < 0.02);

    p.top_p = 1;
    p.min_p = 0.25f; /* keeps p >= .125 */
    histogram(&p, l, N, h);
    assert_int_equal(h[3] + h[11] + h[20], N);

    p.min_p = 0;
    histogram(&p, l, N, h);
    assert_true(fabs(h[40] / (double)N - 0.05) < 0.01);
    assert_true(fabs(h[3] / (double)N - 0.5) < 0.02);

    /* A low temperature sharpens towards the argmax. */
    p.temperature = 0.05f;
    histogram(&p, l, 2000, h);
    assert_int_equal(h[3], 2000);
}

static void test_sampler_large_vocab_top_p(void **state) {
    (void)state;
    /* The growing-head nucleus search must agree with a full sort. */
    enum { BIG = 5000 };
    float *l = tk_malloc(BIG * sizeof *l);
    for (int t = 0; t < BIG; t++) l[t] = (float)(sampler_uniform(77, (uint64_t)t) * 0.5);
    tk_sampling p;
    tk_sampling_default(&p);
    p.temperature = 1.0f;
    p.top_p = 0.9f;
    p.n_logprobs = 20;
    tk_sampler *s;
    assert_int_equal(sampler_init(&p, BIG, &s), TK_OK);
    float *c = tk_malloc(BIG * sizeof *c);
    for (int i = 0; i < 200; i++) {
        memcpy(c, l, BIG * sizeof *c);
        tk_token_event ev;
        int32_t t = sampler_sample(s, c, NULL, 0, &ev);
        assert_true(t >= 0 && t < BIG);
        assert_int_equal(ev.n_top, 20);
        for (int k = 1; k < 20; k++) assert_true(ev.top_logprobs[k] <= ev.top_logprobs[k - 1]);
    }
    sampler_free(s);
    tk_free(c);
    tk_free(l);
}

/* The draw of a temperature sampler by the definition, with a full qsort:
 * candidates (scaled logit v = l / T, id) best first (larger, then lower id),
 * weighted by w = exp(v - vmax) as the sampler's vector pass computes it
 * (samp_simd: float exp by its polynomial); top-k keeps the k first; top-p
 * the shortest head whose weight (summed in that order) reaches top_p times
 * the weight of what is left; min-p those with vmax - v <= -log(min_p); then
 * the walk, r = u times the kept weight. Sums in double; the sampler adds
 * whole buckets in id order, so the two agree but for rounding. Leaves the
 * kept tokens in c[0, *n_kept) and their weight in *z_kept. */
typedef struct {
    float v;
    int32_t id;
} ref_cand;
static int ref_cmp(const void *pa, const void *pb) {
    const ref_cand *a = pa, *b = pb;
    if (a->v != b->v) return a->v > b->v ? -1 : 1;
    return a->id < b->id ? -1 : a->id > b->id;
}
static int32_t ref_draw(const tk_sampling *p, const float *l, int n_vocab, double u, ref_cand *c, float *w,
                        uint16_t *bkt, int *n_kept, double *z_kept) {
    const float inv_t = 1.0f / p->temperature;
    int n = 0;
    for (int t = 0; t < n_vocab; t++)
        if (l[t] != -INFINITY) c[n++] = (ref_cand){l[t] * inv_t, t};
    float vmax = c[0].v;
    for (int i = 1; i < n; i++) vmax = c[i].v > vmax ? c[i].v : vmax;
    samp_simd_default()->scale_exp(l, n_vocab, inv_t, vmax, w, bkt);
    qsort(c, (size_t)n, sizeof *c, ref_cmp);
    if (p->top_k > 0 && p->top_k < n) n = p->top_k;
    if (p->top_p < 1) {
        double z = 0, cum = 0;
        for (int i = 0; i < n; i++) z += w[c[i].id];
        for (int i = 0; i < n; i++) {
            cum += w[c[i].id];
            if (cum >= (double)p->top_p * z) {
                n = i + 1;
                break;
            }
        }
    }
    if (p->min_p > 0) {
        int k = 1;
        while (k < n && (double)(vmax - c[k].v) <= -log((double)p->min_p)) k++;
        n = k;
    }
    double z = 0, cum = 0;
    for (int i = 0; i < n; i++) z += w[c[i].id];
    *n_kept = n;
    *z_kept = z;
    for (int i = 0; i < n; i++) {
        cum += w[c[i].id];
        if (u * z < cum) return c[i].id;
    }
    return c[n - 1].id;
}

/* Nuclei of thousands of tokens over many tied logits, both signs of zero
 * and banned tokens, under every truncation: the definition's draws, and
 * sampler_dist the definition's kept tokens and weights. */
static void test_sampler_wide_nucleus_exact(void **state) {
    (void)state;
    enum { BIG = 20000 };
    float *l = tk_malloc(BIG * sizeof *l), *c = tk_malloc(BIG * sizeof *c);
    float *w = tk_malloc(BIG * sizeof *w), *prob = tk_malloc(BIG * sizeof *prob);
    uint16_t *bkt = tk_malloc(BIG * sizeof *bkt);
    ref_cand *rc = tk_malloc(BIG * sizeof *rc);
    const struct {
        float temp, top_p, min_p;
        int top_k;
    } cases[] = {{0.8f, 0.95f, 0, 0},  {0.8f, 0.999f, 0, 0},   {0.8f, 1.0f, 0, 12000},  {0.8f, 0.9f, 0, 5000},
                 {0.8f, 1.0f, 0, 0},   {0.8f, 1.0f, 0.05f, 0}, {0.8f, 0.7f, 0.2f, 300}, {2.5f, 0.5f, 0, 0},
                 {0.05f, 0.99f, 0, 0}, {1.0f, 0.3f, 0, 1}};
    for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++) {
        tk_sampling p;
        tk_sampling_default(&p);
        p.temperature = cases[k].temp;
        p.top_p = cases[k].top_p;
        p.top_k = cases[k].top_k;
        p.min_p = cases[k].min_p;
        p.seed = 31 + k;
        tk_sampler *s;
        assert_int_equal(sampler_init(&p, BIG, &s), TK_OK);
        for (int i = 0; i < 40; i++) {
            for (int t = 0; t < BIG; t++) { /* 64 levels: ties everywhere */
                l[t] = (float)((int)(sampler_uniform(1000u + (uint64_t)i, (uint64_t)t) * 64) - 32) / 16.0f;
                if (l[t] == 0.0f && t % 2) l[t] = -0.0f;
                if (t % 97 == 5) l[t] = -INFINITY;
            }
            int n_kept;
            double z;
            const int32_t want =
                ref_draw(&p, l, BIG, sampler_uniform(p.seed, (uint64_t)i), rc, w, bkt, &n_kept, &z);
            memcpy(c, l, BIG * sizeof *c);
            tk_token_event ev;
            assert_int_equal(sampler_sample(s, c, NULL, 0, &ev), want);
            memcpy(c, l, BIG * sizeof *c);
            tk_sampler *d;
            assert_int_equal(sampler_init(&p, BIG, &d), TK_OK);
            sampler_dist(d, c, NULL, 0, prob, NULL);
            sampler_free(d);
            int nz = 0;
            for (int t = 0; t < BIG; t++) nz += prob[t] != 0;
            for (int j = 0; j < n_kept; j++) {
                const double want_p = w[rc[j].id] / z;
                assert_true(fabs(prob[rc[j].id] - want_p) <= 1e-6 * want_p + 1e-30);
            }
            int nz_ref = 0;
            for (int j = 0; j < n_kept; j++) nz_ref += (float)(w[rc[j].id] / z) != 0;
            assert_int_equal(nz, nz_ref);
        }
        sampler_free(s);
    }
    tk_free(rc);
    tk_free(bkt);
    tk_free(prob);
    tk_free(w);
    tk_free(c);
    tk_free(l);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_sampler_rejects_bad_params), cmocka_unit_test(test_sampler_greedy_and_logprobs),
        cmocka_unit_test(test_sampler_bias_and_penalties), cmocka_unit_test(test_sampler_seed_reproduces),
        cmocka_unit_test(test_sampler_truncation),         cmocka_unit_test(test_sampler_large_vocab_top_p),
        cmocka_unit_test(test_sampler_wide_nucleus_exact),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
