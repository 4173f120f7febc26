/* The clip-search weight quantizer (kernels/quantize.c) against plain round
 * to nearest: never a larger importance-weighted error, a clearly smaller one
 * where a few channels carry most of the activation energy, the same bytes
 * without importance, and blocks every reader dequantizes (the GGML layouts). */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "kern_util.h"
#include "kernels/kernels.h"
#include "kernels/kernels_ref.h"

static const tk_dtype TYPES[] = {TK_DTYPE_Q8_0, TK_DTYPE_Q6_K, TK_DTYPE_Q4_K, TK_DTYPE_Q4_0};
enum { K = 4096 };

static void dequant(tk_dtype t, const void *q, float *o, int64_t k) {
    const tk_kernels *kt = kernels_default();
    kt->dequant_row[t](q, o, k);
}

/* Weighted error of quantizing x as t with and without the search. */
static void errors(tk_dtype t, const float *x, const float *imp, double *rtn, double *srch) {
    static uint8_t q[K * 2];
    static float o[K];
    assert_true(kern_quantize_row(t, x, q, K));
    dequant(t, q, o, K);
    *rtn = kern_weighted_error(x, o, imp, K);
    assert_true(kern_quantize_row_imp(t, x, imp, q, K));
    dequant(t, q, o, K);
    *srch = kern_weighted_error(x, o, imp, K);
}

static void test_quantize_search_never_worse(void **state) {
    (void)state;
    kt_rng r = {7};
    static float x[K], imp[K];
    for (int trial = 0; trial < 3; trial++) {
        kt_fill(&r, x, K, 0.02f);
        for (int64_t j = 0; j < K; j += 97) x[j] *= 6.0f; /* heavy-tailed weights: clipping pays */
        for (int64_t j = 0; j < K; j++) imp[j] = 0.5f + kt_unif(&r);
        for (int64_t j = 0; j < K; j += 61) imp[j] = 400.0f; /* outlier input channels */
        for (size_t i = 0; i < sizeof TYPES / sizeof TYPES[0]; i++) {
            double a, b;
            errors(TYPES[i], x, imp, &a, &b);
            if (b > a)
                fail_msg("%s: search error %.4g above round to nearest %.4g", dtype_name(TYPES[i]), b, a);
            /* 4-bit: the search must find a real gain (measured 10-30%) */
            if (dtype_block_bytes(TYPES[i]) * 8 < 5 * (size_t)dtype_block_elems(TYPES[i]) && b > 0.97 * a)
                fail_msg("%s: search error %.4g not below 0.97 x %.4g", dtype_name(TYPES[i]), b, a);
        }
    }
}

static void test_quantize_no_importance_is_rtn(void **state) {
    (void)state;
    kt_rng r = {11};
    static float x[K];
    static uint8_t a[K * 2], b[K * 2];
    kt_fill(&r, x, K, 1.0f);
    for (size_t i = 0; i < sizeof TYPES / sizeof TYPES[0]; i++) {
        assert_true(kern_quantize_row(TYPES[i], x, a, K));
        assert_true(kern_quantize_row_imp(TYPES[i], x, NULL, b, K));
        size_t bytes = (size_t)(K / dtype_block_elems(TYPES[i])) * dtype_block_bytes(TYPES[i]);
        assert_memory_equal(a, b, bytes);
    }
    /* float types ignore importance; ragged rows are refused */
    static float imp[K];
    for (int64_t j = 0; j < K; j++) imp[j] = 1.0f;
    assert_true(kern_quantize_row_imp(TK_DTYPE_BF16, x, imp, a, K));
    assert_false(kern_quantize_row_imp(TK_DTYPE_Q4_K, x, imp, a, 128));
    assert_false(kern_quantize_row_imp(TK_DTYPE_Q4_0, x, imp, a, 33));
}

/* Error bounds per type with the search, on gaussian rows (normalised MSE). */
static void test_quantize_search_error_bounds(void **state) {
    (void)state;
    static const double tol[] = {6e-5, 8e-4, 1.2e-2, 1.2e-2}; /* as test_quant's round-to-nearest bounds */
    kt_rng r = {3};
    static float x[K], imp[K], o[K];
    static uint8_t q[K * 2];
    kt_fill(&r, x, K, 0.7f);
    for (int64_t j = 0; j < K; j++) imp[j] = 0.1f + kt_unif(&r);
    for (size_t i = 0; i < sizeof TYPES / sizeof TYPES[0]; i++) {
        assert_true(kern_quantize_row_imp(TYPES[i], x, imp, q, K));
        dequant(TYPES[i], q, o, K);
        double e = kt_nmse(o, x, K);
        if (e > tol[i]) fail_msg("%s: nmse %.3g > %.3g", dtype_name(TYPES[i]), e, tol[i]);
    }
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_quantize_search_never_worse),
        cmocka_unit_test(test_quantize_no_importance_is_rtn),
        cmocka_unit_test(test_quantize_search_error_bounds),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
