/* The AVX2 kernels rebuilt with 4-token tiles for every weight type and
 * 8-token tiles for interleaved Q8_0 (the shapes the AVX-512 build uses), so
 * that tile code is checked against the reference on any machine with AVX2,
 * not only on AVX-512 ones. Exits 77 (ctest: skipped) without AVX2. */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "kern_util.h"
#include "kernels/kernels_ref.h"

#if defined(__x86_64__)
#if defined(__clang__)
#pragma clang attribute push(__attribute__((target("avx2,fma,f16c"))), apply_to = function)
#else
#pragma GCC push_options
#pragma GCC target("avx2,fma,f16c")
#endif
#define KNT       4
#define KNT_K     4
#define KNT_X8    8
#define KFN(name) t4_##name
#include "kernels/x86/kernels_avx2.c"
#if defined(__clang__)
#pragma clang attribute pop
#else
#pragma GCC pop_options
#endif
#define HAVE_T4 1
#endif

#define GEMV_TOL 1e-9

#ifdef HAVE_T4
static const tk_gemv_fn T4[TK_DTYPE_COUNT] = {
    [TK_DTYPE_F32] = t4_gemv_f32,   [TK_DTYPE_F16] = t4_gemv_f16,   [TK_DTYPE_BF16] = t4_gemv_bf16,
    [TK_DTYPE_Q8_0] = t4_gemv_q8_0, [TK_DTYPE_Q4_0] = t4_gemv_q4_0, [TK_DTYPE_Q4_K] = t4_gemv_q4_k,
    [TK_DTYPE_Q6_K] = t4_gemv_q6_k,
};
#endif

static void test_simd_tiles_four_tokens(void **state) {
    (void)state;
#ifdef HAVE_T4
    static const tk_dtype types[] = {TK_DTYPE_F32,  TK_DTYPE_F16,  TK_DTYPE_BF16, TK_DTYPE_Q8_0,
                                     TK_DTYPE_Q4_0, TK_DTYPE_Q4_K, TK_DTYPE_Q6_K};
    const tk_kernels *R = kernels_get(TK_ISA_SCALAR);
    kt_rng r = {77};
    for (size_t ci = 0; ci < sizeof types / sizeof types[0]; ci++) {
        tk_dtype t = types[ci];
        int be = dtype_block_elems(t);
        for (int n_tok = 1; n_tok <= 9; n_tok++) {
            int64_t k = be == 1 ? kt_int(&r, 1, 200) : be * kt_int(&r, 1, 3);
            int64_t rows = kt_int(&r, 1, 13), r0 = kt_int(&r, 0, (int)rows - 1),
                    r1 = kt_int(&r, (int)r0 + 1, (int)rows);
            uint64_t rb;
            assert_true(dtype_row_bytes(t, (uint64_t)k, &rb));
            size_t xb = kern_act_row_bytes(t, TK_LAYOUT_ROWS, k);
            float *f = malloc((size_t)k * sizeof *f);
            char *wq = malloc(rows * rb), *xq = malloc(xb * n_tok);
            float *y = malloc(rows * n_tok * sizeof *y), *want = malloc(rows * n_tok * sizeof *want);
            for (int64_t i = 0; i < rows; i++) {
                kt_fill(&r, f, k, 0.5f);
                assert_true(kern_quantize_row(t, f, wq + i * rb, k));
            }
            for (int i = 0; i < n_tok; i++) {
                kt_fill(&r, f, k, 1.0f);
                kern_quant_act(R, t, TK_LAYOUT_ROWS, f, xq + i * xb, k);
            }
            for (int64_t i = 0; i < rows * n_tok; i++) y[i] = want[i] = NAN;
            kern_gemv(R, t, TK_LAYOUT_ROWS)(k, wq, r0, r1, xq, xb, n_tok, want, rows);
            T4[t](k, wq, r0, r1, xq, xb, n_tok, y, rows);
            double num = 0, den = 0;
            for (int tt = 0; tt < n_tok; tt++)
                for (int64_t i = 0; i < rows; i++) {
                    float a = y[tt * rows + i], b = want[tt * rows + i];
                    if (i < r0 || i >= r1) {
                        assert_true(isnan(a));
                        continue;
                    }
                    num += ((double)a - b) * ((double)a - b);
                    den += (double)b * b;
                }
            if (!(num <= GEMV_TOL * den))
                fail_msg("4-token tiles %s n_tok %d k %lld: nmse %.3g", dtype_name(t), n_tok, (long long)k,
                         num / den);
            free(f);
            free(wq);
            free(xq);
            free(y);
            free(want);
        }
    }
    for (size_t ci = 0; ci < sizeof types / sizeof types[0]; ci++)
        kt_check_invariance(T4[types[ci]], types[ci], &r, "avx2 4-token tiles");
    /* the interleaved Q8_0 kernel with AVX-512's 8-token tile */
    for (int n_tok = 1; n_tok <= 17; n_tok++)
        kt_xr_case(TK_DTYPE_Q8_0, t4_gemv_q8_0_x8, TK_LAYOUT_X8, &r, n_tok, false, "avx2 8-token x8 tiles");
    kt_check_invariance_xr(TK_DTYPE_Q8_0, t4_gemv_q8_0_x8, TK_LAYOUT_X8, &r, 96, 11, "avx2 8-token x8 tiles");
    for (int n_tok = 1; n_tok <= 17; n_tok++)
        kt_xr_case(TK_DTYPE_Q8_0, t4_gemv_q8_0_x16, TK_LAYOUT_X16, &r, n_tok, false,
                   "avx2 8-token x16 tiles");
    kt_check_invariance_xr(TK_DTYPE_Q8_0, t4_gemv_q8_0_x16, TK_LAYOUT_X16, &r, 96, 11,
                           "avx2 8-token x16 tiles");
    for (int n_tok = 1; n_tok <= 17; n_tok++)
        kt_xr_case(TK_DTYPE_Q4_0, t4_gemv_q4_0_x16, TK_LAYOUT_X16, &r, n_tok, false,
                   "avx2 8-token x16 tiles");
    kt_check_invariance_xr(TK_DTYPE_Q4_0, t4_gemv_q4_0_x16, TK_LAYOUT_X16, &r, 96, 11,
                           "avx2 8-token x16 tiles");
    for (int n_tok = 1; n_tok <= 17; n_tok++)
        kt_xr_case(TK_DTYPE_Q4_K, t4_gemv_q4_k_x16, TK_LAYOUT_X16, &r, n_tok, true,
                   "avx2 8-token q4_k x16 tiles");
    kt_check_invariance_xr(TK_DTYPE_Q4_K, t4_gemv_q4_k_x16, TK_LAYOUT_X16, &r, 768, 17,
                           "avx2 8-token q4_k x16 tiles");
    for (int n_tok = 1; n_tok <= 17; n_tok++)
        kt_xr_case(TK_DTYPE_Q6_K, t4_gemv_q6_k_x16, TK_LAYOUT_X16, &r, n_tok, true,
                   "avx2 8-token q6_k x16 tiles");
    kt_check_invariance_xr(TK_DTYPE_Q6_K, t4_gemv_q6_k_x16, TK_LAYOUT_X16, &r, 768, 17,
                           "avx2 8-token q6_k x16 tiles");
    for (int n_tok = 1; n_tok <= 17; n_tok++)
        kt_xr_case(TK_DTYPE_Q8_0, t4_gemv_q8_0_x16s, TK_LAYOUT_X16S, &r, n_tok, true,
                   "avx2 8-token x16s tiles");
    kt_check_invariance_xr(TK_DTYPE_Q8_0, t4_gemv_q8_0_x16s, TK_LAYOUT_X16S, &r, 768, 17,
                           "avx2 8-token x16s tiles");
    for (int n_tok = 1; n_tok <= 9; n_tok++)
        kt_bf16_x4_case(t4_gemv_bf16_x4, t4_gemv_bf16, &r, n_tok, "avx2 4-token tiles");
#endif
}

int main(void) {
#ifdef HAVE_T4
    tk_cpu c;
    cpu_detect(&c);
    if (cpu_best_isa(&c) < TK_ISA_AVX2) {
        printf("SKIP: this CPU has no AVX2\n");
        return 77;
    }
#else
    printf("SKIP: not x86-64\n");
    return 77;
#endif
    const struct CMUnitTest tests[] = {cmocka_unit_test(test_simd_tiles_four_tokens)};
    return cmocka_run_group_tests(tests, NULL, NULL);
}
