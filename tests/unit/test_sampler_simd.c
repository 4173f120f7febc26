/* The sampler's vectorised vocabulary passes against the scalar reference and
 * libm: exp accuracy, the maximum and its first index (ties, NaN, -inf, +inf),
 * NaN cleaning in place, the sum of exponentials, temperature sampling's
 * weights and buckets and the bucket search, at ragged lengths up to
 * a real vocabulary, on every ISA level this CPU has (the others are skipped). */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include <cmocka.h>

#include "core/alloc.h"
#include "core/cpu.h"
#include "engine/sampler.h"
#include "engine/sampler_simd.h"

#define VOCAB 151936

static void test_samp_expf_accuracy(void **state) {
    (void)state;
    double worst = 0;
    for (int i = 0; i <= 800000; i++) {
        float x = -80.0f * (float)i / 800000.0f;
        double want = exp((double)x), got = samp_expf(x);
        double rel = fabs(got - want) / want;
        if (rel > worst) worst = rel;
    }
    assert_true(worst < 3e-7);
    for (float x = -87.3f; x < -80.0f; x += 0.01f) assert_true(fabs(samp_expf(x) - exp((double)x)) < 2e-35);
    assert_true(samp_expf(-INFINITY) == 0.0f);
    assert_true(samp_expf(-100.0f) == 0.0f);
    assert_true(samp_expf(NAN) == 0.0f);
    assert_true(samp_expf(0.0f) == 1.0f);
}

static uint64_t rng(uint64_t *s) {
    *s ^= *s << 13, *s ^= *s >> 7, *s ^= *s << 17;
    return *s;
}

static void check_level(tk_isa isa) {
    const samp_simd *ref = samp_simd_for(TK_ISA_SCALAR), *t = samp_simd_for(isa);
    static const int lens[] = {0, 1, 7, 8, 9, 15, 16, 17, 31, 33, 64, 100, 1000, 4099, VOCAB};
    float *a = tk_alloc_aligned(VOCAB * sizeof(float) + 64, 64),
          *b = tk_alloc_aligned(VOCAB * sizeof(float) + 64, 64);
    assert_non_null(a);
    assert_non_null(b);
    uint64_t seed = 0x1234567ull + (uint64_t)isa;
    for (size_t li = 0; li < sizeof lens / sizeof lens[0]; li++)
        for (int kind = 0; kind < 6; kind++) {
            int n = lens[li];
            /* offset 1: unaligned rows */
            float *x = a + 1, *y = b + 1;
            for (int i = 0; i < n; i++) x[i] = (float)((double)(rng(&seed) % 2000000) / 1e5 - 10.0);
            if (n > 0) {
                if (kind == 1) x[rng(&seed) % (uint64_t)n] = NAN, x[n - 1] = NAN;
                if (kind == 2) /* ties at the maximum: the lowest index wins */
                    for (int r = 0; r < 3; r++) x[rng(&seed) % (uint64_t)n] = 50.0f;
                if (kind == 3)
                    for (int i = 0; i < n; i++) x[i] = -INFINITY;
                if (kind == 4) x[n / 2] = INFINITY, x[n - 1] = INFINITY;
                if (kind == 5) /* banned tokens and a deep tail */
                    for (int i = 0; i < n; i += 3) x[i] = i % 2 ? -INFINITY : -200.0f;
            }
            memcpy(y, x, (size_t)n * sizeof(float));
            int32_t ia = -2, ib = -2;
            float ma = ref->max_clean(x, n, &ia), mb = t->max_clean(y, n, &ib);
            assert_int_equal(ia, ib);
            assert_true(ma == mb || (isinf(ma) && isinf(mb) && ma == mb));
            assert_memory_equal(x, y, (size_t)n * sizeof(float)); /* NaNs cleaned the same way */
            for (int i = 0; i < n; i++) assert_false(isnan(y[i]));
            if (n == 0 || isinf(ma)) continue;
            double want = 0;
            for (int i = 0; i < n; i++) want += exp((double)x[i] - (double)ma);
            double sa = ref->sum_exp(x, n, ma), sb = t->sum_exp(y, n, mb);
            assert_true(fabs(sa - want) <= 2e-6 * want);
            assert_true(fabs(sb - want) <= 2e-6 * want);
        }
    tk_free_aligned(a);
    tk_free_aligned(b);
}

/* Temperature sampling's weights and buckets, and the bucket search, at one
 * level against the scalar reference: buckets bit for bit (and equal to
 * samp_bucket), weights within 4e-7 relative of exp() (0 for banned tokens),
 * indices in order, over ragged lengths, temperatures and spreads that fill
 * the tail. */
static void check_scale_find(tk_isa isa) {
    const samp_simd *ref = samp_simd_for(TK_ISA_SCALAR), *t = samp_simd_for(isa);
    static const int lens[] = {0, 1, 7, 8, 9, 15, 16, 17, 31, 32, 33, 64, 100, 1000, 4099, VOCAB};
    static const float temps[] = {1.0f, 0.8f, 0.05f, 3.0f};
    float *l = tk_malloc((VOCAB + 1) * sizeof *l), *wa = tk_malloc(VOCAB * sizeof *wa),
          *wb = tk_malloc(VOCAB * sizeof *wb);
    uint16_t *ba = tk_malloc((VOCAB + 1) * sizeof *ba), *bb = tk_malloc(VOCAB * sizeof *bb);
    int32_t *ia = tk_malloc(VOCAB * sizeof *ia), *ib = tk_malloc(VOCAB * sizeof *ib);
    assert_true(l && wa && wb && ba && bb && ia && ib);
    uint64_t seed = 0xabcdefull + (uint64_t)isa;
    for (size_t li = 0; li < sizeof lens / sizeof lens[0]; li++)
        for (size_t ti = 0; ti < sizeof temps / sizeof temps[0]; ti++) {
            const int n = lens[li];
            float *x = l + 1; /* unaligned */
            for (int i = 0; i < n; i++) {
                x[i] = (float)((double)(rng(&seed) % 4000000) / 1e5 - 30.0);
                if (rng(&seed) % 11 == 0) x[i] = -INFINITY;
                if (rng(&seed) % 17 == 0) x[i] = 10.0f; /* ties at the maximum */
            }
            const float inv_t = 1.0f / temps[ti];
            float lmax = -INFINITY;
            for (int i = 0; i < n; i++) lmax = x[i] > lmax ? x[i] : lmax;
            const float vmax = lmax == -INFINITY ? 0.0f : lmax * inv_t;
            ref->scale_exp(x, n, inv_t, vmax, wa, ba);
            t->scale_exp(x, n, inv_t, vmax, wb, bb);
            assert_memory_equal(ba, bb, (size_t)n * sizeof *ba);
            for (int i = 0; i < n; i++) {
                assert_int_equal(ba[i], samp_bucket(x[i], inv_t, vmax));
                if (x[i] == -INFINITY) {
                    assert_true(wa[i] == 0.0f && wb[i] == 0.0f);
                    continue;
                }
                const float v = x[i] * inv_t;
                const double want = exp((double)(v - vmax));
                for (int k = 0; k < 2; k++) {
                    const double got = k ? wb[i] : wa[i];
                    if (want > 1e-30)
                        assert_true(fabs(got - want) <= 4e-7 * want);
                    else
                        assert_true(fabs(got - want) < 2e-35);
                }
            }
            /* the search, for buckets present and absent, and in the tail */
            const uint16_t probes[] = {0, 1, 5, 40, SAMP_TAIL, SAMP_NONE, 7000};
            for (size_t p = 0; p < sizeof probes / sizeof probes[0]; p++) {
                uint16_t *bu = ba + 1; /* unaligned */
                memmove(bu, ba, (size_t)n * sizeof *ba);
                const int ma = ref->find_u16(bu, n, probes[p], ia), mb = t->find_u16(bu, n, probes[p], ib);
                assert_int_equal(ma, mb);
                assert_memory_equal(ia, ib, (size_t)ma * sizeof *ia);
                int m = 0;
                for (int i = 0; i < n; i++)
                    if (bu[i] == probes[p]) assert_int_equal(ia[m++], i);
                assert_int_equal(m, ma);
                memmove(ba, bu, (size_t)n * sizeof *ba);
            }
        }
    tk_free(l);
    tk_free(wa);
    tk_free(wb);
    tk_free(ba);
    tk_free(bb);
    tk_free(ia);
    tk_free(ib);
}

static void test_samp_levels(void **state) {
    (void)state;
    tk_cpu c;
    cpu_detect(&c);
    tk_isa best = cpu_best_isa(&c);
    for (int isa = TK_ISA_SCALAR; isa < TK_ISA_COUNT; isa++) {
        if (isa > (int)best) {
            printf("skip: %s is not on this CPU\n", cpu_isa_name((tk_isa)isa));
            continue;
        }
        check_level((tk_isa)isa);
        check_scale_find((tk_isa)isa);
    }
}

/* Greedy over a real vocabulary: the argmax, and a logprob within float
 * rounding of the double log-sum-exp. */
static void test_samp_greedy_vocab(void **state) {
    (void)state;
    float *l = tk_alloc_aligned(VOCAB * sizeof(float), 64);
    assert_non_null(l);
    uint64_t seed = 99;
    for (int i = 0; i < VOCAB; i++) l[i] = (float)((double)(rng(&seed) % 3000000) / 1e5 - 15.0);
    l[77777] = 40.0f;
    double z = 0;
    for (int i = 0; i < VOCAB; i++) z += exp((double)l[i] - 40.0);
    tk_sampling p;
    tk_sampling_default(&p);
    p.logprobs = true;
    tk_sampler *s = NULL;
    assert_int_equal(sampler_init(&p, VOCAB, &s), TK_OK);
    tk_token_event ev;
    assert_int_equal(sampler_sample(s, l, NULL, 0, &ev), 77777);
    assert_true(fabs((double)ev.logprob + log(z)) < 1e-5);
    sampler_free(s);
    tk_free_aligned(l);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_samp_expf_accuracy),
        cmocka_unit_test(test_samp_levels),
        cmocka_unit_test(test_samp_greedy_vocab),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
