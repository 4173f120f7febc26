/* Every SIMD kernel against its reference, for every ISA level this CPU has
 * (so the AVX-512 tables run wherever the machine has AVX-512): random shapes
 * with ragged row ranges and tails, n_tok 1..9, and a stated tolerance.
 *
 * Tolerances: gemv outputs differ from the reference only by the order of
 * float additions (integer block dots are exact), so NMSE <= 1e-9 for every
 * weight type; activation quantizers and f16/bf16 dequantization must match
 * the reference bit for bit; rmsnorm and silu_mul within 1e-5 relative. */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "kern_util.h"
#include "kernels/kernels_ref.h"

#define GEMV_TOL 1e-9

static int isa_levels(tk_isa out[2]) {
    tk_cpu c;
    cpu_detect(&c);
    tk_isa best = cpu_best_isa(&c);
    int n = 0;
    for (int i = TK_ISA_AVX2; i <= (int)best; i++) out[n++] = (tk_isa)i;
    return n;
}

static int64_t pick_k(kt_rng *r, tk_dtype t) {
    int be = dtype_block_elems(t);
    if (be == 1) return kt_int(r, 0, 3) == 0 ? 1024 : kt_int(r, 1, 300);
    if (be == 32) return 32 * kt_int(r, 1, 12);
    return 256 * kt_int(r, 1, 4);
}

/* One random gemv case: weights from Gaussian rows, activations quantized by
 * the reference, y prefilled with NaN to catch writes outside [r0, r1). */
static void gemv_case(const tk_kernels *K, tk_dtype t, int n_tok, kt_rng *r) {
    const tk_kernels *R = kernels_get(TK_ISA_SCALAR);
    int64_t k = pick_k(r, t);
    int64_t rows = kt_int(r, 1, 23);
    int64_t r0 = kt_int(r, 0, (int)rows - 1), r1 = kt_int(r, (int)r0 + 1, (int)rows);
    if (kt_int(r, 0, 7) == 0) r1 = r0; /* an empty range writes nothing */
    int64_t ldy = rows + kt_int(r, 0, 5);
    uint64_t rb;
    assert_true(dtype_row_bytes(t, (uint64_t)k, &rb));
    size_t xb = kern_act_row_bytes(t, k) + (size_t)kt_int(r, 0, 3) * 4; /* padded stride */
    float *wf = malloc((size_t)k * sizeof *wf), *xf = malloc((size_t)k * sizeof *xf);
    char *wq = malloc((size_t)(rows * rb)), *xq = malloc(xb * (size_t)n_tok);
    float *y = malloc((size_t)(ldy * n_tok) * sizeof *y),
          *want = malloc((size_t)(ldy * n_tok) * sizeof *want);
    for (int64_t i = 0; i < rows; i++) {
        kt_fill(r, wf, k, 0.5f);
        assert_true(kern_quantize_row(t, wf, wq + i * rb, k));
    }
    for (int i = 0; i < n_tok; i++) {
        kt_fill(r, xf, k, 2.0f);
        kern_quant_act(R, t, xf, xq + (size_t)i * xb, k);
    }
    for (int64_t i = 0; i < ldy * n_tok; i++) y[i] = want[i] = NAN;
    R->gemv[t](k, wq, r0, r1, xq, xb, n_tok, want, ldy);
    K->gemv[t](k, wq, r0, r1, xq, xb, n_tok, y, ldy);
    double num = 0, den = 0;
    for (int tt = 0; tt < n_tok; tt++)
        for (int64_t i = 0; i < ldy; i++) {
            float a = y[tt * ldy + i], b = want[tt * ldy + i];
            if (i < r0 || i >= r1) {
                if (!isnan(a))
                    fail_msg("%s %s wrote outside rows: t %d row %lld", cpu_isa_name(K->isa), dtype_name(t),
                             tt, (long long)i);
                continue;
            }
            num += ((double)a - b) * ((double)a - b);
            den += (double)b * b;
        }
    double e = den > 0 ? num / den : num;
    if (!(e <= GEMV_TOL))
        fail_msg("%s gemv %s k %lld rows [%lld,%lld) n_tok %d: nmse %.3g > %.3g", cpu_isa_name(K->isa),
                 dtype_name(t), (long long)k, (long long)r0, (long long)r1, n_tok, e, GEMV_TOL);
    free(wf);
    free(xf);
    free(wq);
    free(xq);
    free(y);
    free(want);
}

static void test_simd_gemv(void **state) {
    (void)state;
    static const tk_dtype types[] = {TK_DTYPE_F32,  TK_DTYPE_F16,  TK_DTYPE_BF16, TK_DTYPE_Q8_0,
                                     TK_DTYPE_Q4_0, TK_DTYPE_Q4_K, TK_DTYPE_Q6_K};
    tk_isa levels[2];
    int nl = isa_levels(levels);
    if (nl == 0) print_message("no SIMD level on this CPU: nothing to compare\n");
    kt_rng r = {1234};
    for (int l = 0; l < nl; l++) {
        const tk_kernels *K = kernels_get(levels[l]);
        print_message("gemv at %s\n", cpu_isa_name(levels[l]));
        for (size_t c = 0; c < sizeof types / sizeof types[0]; c++)
            for (int n_tok = 1; n_tok <= 9; n_tok++)
                for (int rep = 0; rep < 4; rep++) gemv_case(K, types[c], n_tok, &r);
    }
}

/* Qwen3-0.6B-like shapes with a full row range, the decode case. */
static void test_simd_gemv_model_shapes(void **state) {
    (void)state;
    tk_isa levels[2];
    int nl = isa_levels(levels);
    const tk_kernels *R = kernels_get(TK_ISA_SCALAR);
    kt_rng r = {99};
    const int64_t k = 1024, rows = 64;
    static const tk_dtype types[] = {TK_DTYPE_BF16, TK_DTYPE_Q8_0, TK_DTYPE_Q4_K, TK_DTYPE_Q6_K};
    float *wf = malloc(k * sizeof *wf), *xf = malloc(k * sizeof *xf);
    for (int l = 0; l < nl; l++) {
        const tk_kernels *K = kernels_get(levels[l]);
        for (size_t c = 0; c < sizeof types / sizeof types[0]; c++) {
            tk_dtype t = types[c];
            uint64_t rb;
            assert_true(dtype_row_bytes(t, k, &rb));
            size_t xb = kern_act_row_bytes(t, k);
            char *wq = malloc(rows * rb), *xq = malloc(xb * 4);
            for (int64_t i = 0; i < rows; i++) {
                kt_fill(&r, wf, k, 0.05f);
                assert_true(kern_quantize_row(t, wf, wq + i * rb, k));
            }
            for (int i = 0; i < 4; i++) {
                kt_fill(&r, xf, k, 1.0f);
                kern_quant_act(K, t, xf, xq + i * xb, k);
            }
            float y[4 * 64], want[4 * 64];
            for (int n_tok = 1; n_tok <= 4; n_tok += 3) {
                R->gemv[t](k, wq, 0, rows, xq, xb, n_tok, want, rows);
                K->gemv[t](k, wq, 0, rows, xq, xb, n_tok, y, rows);
                double e = kt_nmse(y, want, rows * n_tok);
                if (!(e <= GEMV_TOL))
                    fail_msg("%s %s n_tok %d nmse %.3g", cpu_isa_name(K->isa), dtype_name(t), n_tok, e);
            }
            free(wq);
            free(xq);
        }
    }
    free(wf);
    free(xf);
}

/* Blocks of raw random bytes reach values the quantizers never write (q8_0
 * weights of -128, q6_k scales of -128, every 6-bit q4_k scale and min), which
 * is where an int8/int16 overflow in a SIMD path would show. */
static void fill_raw_blocks(kt_rng *r, tk_dtype t, char *p, int64_t nblocks) {
    size_t bb = dtype_block_bytes(t);
    for (size_t i = 0; i < (size_t)nblocks * bb; i++) p[i] = (char)kt_u32(r);
    for (int64_t b = 0; b < nblocks; b++) {
        char *blk = p + (size_t)b * bb;
        tk_f16 d = tk_f32_to_f16((kt_unif(r) - 0.5f) * 0.02f), dmin = tk_f32_to_f16(kt_unif(r) * 0.01f);
        switch (t) {
        case TK_DTYPE_Q8_0:
            memcpy(blk + offsetof(tk_block_q8_0, d), &d, 2);
            break;
        case TK_DTYPE_Q4_0:
            memcpy(blk + offsetof(tk_block_q4_0, d), &d, 2);
            break;
        case TK_DTYPE_Q4_K:
            memcpy(blk + offsetof(tk_block_q4_k, d), &d, 2);
            memcpy(blk + offsetof(tk_block_q4_k, dmin), &dmin, 2);
            break;
        default:
            memcpy(blk + offsetof(tk_block_q6_k, d), &d, 2);
            break;
        }
    }
}

static void test_simd_gemv_raw_blocks(void **state) {
    (void)state;
    static const tk_dtype types[] = {TK_DTYPE_Q8_0, TK_DTYPE_Q4_0, TK_DTYPE_Q4_K, TK_DTYPE_Q6_K};
    tk_isa levels[2];
    int nl = isa_levels(levels);
    const tk_kernels *R = kernels_get(TK_ISA_SCALAR);
    kt_rng r = {2024};
    const int64_t k = 512, rows = 9;
    const int n_tok = 5;
    float xf[512];
    for (int l = 0; l < nl; l++) {
        const tk_kernels *K = kernels_get(levels[l]);
        for (size_t c = 0; c < sizeof types / sizeof types[0]; c++) {
            tk_dtype t = types[c];
            int64_t nb = k / dtype_block_elems(t);
            size_t rb = (size_t)nb * dtype_block_bytes(t), xb = kern_act_row_bytes(t, k);
            char *wq = malloc(rows * rb), *xq = malloc(xb * n_tok);
            fill_raw_blocks(&r, t, wq, rows * nb);
            for (int i = 0; i < n_tok; i++) {
                kt_fill(&r, xf, k, 1.0f);
                if (i == 0) /* full-scale activations: q = +-127 everywhere */
                    for (int64_t j = 0; j < k; j++) xf[j] = j % 3 ? 1.0f : -1.0f;
                kern_quant_act(R, t, xf, xq + i * xb, k);
            }
            float y[5 * 9], want[5 * 9];
            R->gemv[t](k, wq, 0, rows, xq, xb, n_tok, want, rows);
            K->gemv[t](k, wq, 0, rows, xq, xb, n_tok, y, rows);
            double e = kt_nmse(y, want, rows * n_tok);
            if (!(e <= GEMV_TOL)) fail_msg("%s raw %s: nmse %.3g", cpu_isa_name(K->isa), dtype_name(t), e);
            free(wq);
            free(xq);
        }
    }
}

static void test_simd_quant_act_exact(void **state) {
    (void)state;
    tk_isa levels[2];
    int nl = isa_levels(levels);
    const int64_t k = 1024;
    float *x = malloc(k * sizeof *x);
    void *a = malloc(k * 2), *b = malloc(k * 2);
    kt_rng r = {5};
    for (int l = 0; l < nl; l++) {
        const tk_kernels *K = kernels_get(levels[l]);
        for (int rep = 0; rep < 6; rep++) {
            kt_fill(&r, x, k, rep == 0 ? 1e-3f : 3.0f);
            if (rep == 1) memset(x, 0, 256 * sizeof *x); /* zero blocks: d = 0 */
            if (rep == 2)                                /* exact halves: ties round to even */
                for (int64_t i = 0; i < k; i++) x[i] = (float)((int)(i % 255) - 127) * 0.5f;
            if (rep == 3) x[17] = 1e30f; /* one huge value */
            kern_quant_q8_0_ref(x, a, k);
            K->quant_q8_0(x, b, k);
            assert_memory_equal(a, b, kern_act_row_bytes(TK_DTYPE_Q8_0, k));
            kern_quant_q8_k_ref(x, a, k);
            K->quant_q8_k(x, b, k);
            assert_memory_equal(a, b, kern_act_row_bytes(TK_DTYPE_Q4_K, k));
        }
    }
    free(x);
    free(a);
    free(b);
}

static void test_simd_elementwise(void **state) {
    (void)state;
    tk_isa levels[2];
    int nl = isa_levels(levels);
    kt_rng r = {11};
    float x[300], w[300], u[300], a[300], b[300];
    tk_f16 h[300];
    tk_bf16 bf[300];
    for (int l = 0; l < nl; l++) {
        const tk_kernels *K = kernels_get(levels[l]);
        for (int rep = 0; rep < 20; rep++) {
            int64_t n = kt_int(&r, 1, 300);
            kt_fill(&r, x, n, rep % 2 ? 30.0f : 1.0f); /* large gates reach the exp clamps */
            kt_fill(&r, w, n, 1.0f);
            kt_fill(&r, u, n, 1.0f);
            kern_rmsnorm_ref(a, x, w, n, 1e-6f);
            K->rmsnorm(b, x, w, n, 1e-6f);
            for (int64_t i = 0; i < n; i++) assert_true(fabsf(a[i] - b[i]) <= 1e-5f * (fabsf(a[i]) + 1e-3f));
            memcpy(b, x, n * sizeof *b);
            K->rmsnorm(b, b, w, n, 1e-6f); /* in place */
            for (int64_t i = 0; i < n; i++) assert_true(fabsf(a[i] - b[i]) <= 1e-5f * (fabsf(a[i]) + 1e-3f));
            kern_silu_mul_ref(a, x, u, n);
            K->silu_mul(b, x, u, n);
            for (int64_t i = 0; i < n; i++)
                if (!(fabsf(a[i] - b[i]) <= 1e-5f * fabsf(a[i]) + 1e-30f))
                    fail_msg("silu_mul %s: x %g: %g vs %g", cpu_isa_name(K->isa), x[i], b[i], a[i]);
            memcpy(a, x, n * sizeof *a);
            memcpy(b, x, n * sizeof *b);
            kern_add_ref(a, u, n);
            K->add(b, u, n);
            assert_memory_equal(a, b, n * sizeof *a);
            for (int64_t i = 0; i < n; i++) {
                h[i] = tk_f32_to_f16(x[i]);
                bf[i] = tk_f32_to_bf16(x[i]);
            }
            kern_dequant_f16_ref(h, a, n);
            K->dequant_row[TK_DTYPE_F16](h, b, n);
            assert_memory_equal(a, b, n * sizeof *a);
            kern_dequant_bf16_ref(bf, a, n);
            K->dequant_row[TK_DTYPE_BF16](bf, b, n);
            assert_memory_equal(a, b, n * sizeof *a);
        }
    }
}

static void test_simd_gemv_invariance(void **state) {
    (void)state;
    static const tk_dtype types[] = {TK_DTYPE_F32,  TK_DTYPE_F16,  TK_DTYPE_BF16, TK_DTYPE_Q8_0,
                                     TK_DTYPE_Q4_0, TK_DTYPE_Q4_K, TK_DTYPE_Q6_K};
    kt_rng r = {31};
    for (int isa = 0; isa <= (int)TK_ISA_AVX512; isa++) {
        tk_isa levels[2];
        int nl = isa_levels(levels);
        if (isa > 0 && (nl == 0 || isa > (int)levels[nl - 1])) break;
        const tk_kernels *K = kernels_get((tk_isa)isa);
        for (size_t c = 0; c < sizeof types / sizeof types[0]; c++)
            kt_check_invariance(K->gemv[types[c]], types[c], &r, cpu_isa_name(K->isa));
    }
}

/* The 8-row interleaved Q8_0 layout: the scalar kernel equals the row-order
 * reference bit for bit; each SIMD level is within the gemv tolerance, and
 * batch/split invariant with rows cut inside groups; a row dequantized from
 * the interleaved copy is the row-order one. */
static void test_simd_gemv_q8_0_x8(void **state) {
    (void)state;
    kt_rng r = {808};
    for (int n_tok = 1; n_tok <= 11; n_tok++)
        for (int rep = 0; rep < 4; rep++)
            kt_x8_case(kernels_get(TK_ISA_SCALAR)->gemv_q8_0_x8, &r, n_tok, true, "scalar q8_0 x8");
    kt_check_invariance_x8(kernels_get(TK_ISA_SCALAR)->gemv_q8_0_x8, &r, "scalar");
    tk_isa levels[2];
    int nl = isa_levels(levels);
    for (int l = 0; l < nl; l++) {
        const tk_kernels *K = kernels_get(levels[l]);
        for (int n_tok = 1; n_tok <= 11; n_tok++)
            for (int rep = 0; rep < 4; rep++) kt_x8_case(K->gemv_q8_0_x8, &r, n_tok, false, cpu_isa_name(K->isa));
        kt_check_invariance_x8(K->gemv_q8_0_x8, &r, cpu_isa_name(K->isa));
    }
    const int64_t k = 160, rows = 16;
    char *wq, *w8;
    kt_q8_0_x8_matrix(&r, rows, k, &wq, &w8);
    float a[160], b[160];
    for (int64_t i = 0; i < rows; i++) {
        kern_dequant_q8_0_ref(wq + i * (int64_t)(k / 32 * sizeof(tk_block_q8_0)), a, k);
        kern_dequant_q8_0_x8_row(w8, k, i, b);
        assert_memory_equal(a, b, sizeof a);
    }
    assert_false(kern_pack_q8_0_x8(wq, w8, 12, k)); /* rows not a multiple of 8 */
    assert_false(kern_pack_q8_0_x8(wq, w8, 8, 40)); /* k not a multiple of 32 */
    free(wq);
    free(w8);
}

/* The 4-row interleaved BF16 layout gives the row layout's bits at every
 * level (scalar included); rows dequantize to the same floats. */
static void test_simd_gemv_bf16_x4(void **state) {
    (void)state;
    kt_rng r = {404};
    for (int isa = 0; isa <= (int)TK_ISA_AVX512; isa++) {
        tk_isa levels[2];
        int nl = isa_levels(levels);
        if (isa > 0 && (nl == 0 || isa > (int)levels[nl - 1])) break;
        const tk_kernels *K = kernels_get((tk_isa)isa);
        for (int n_tok = 1; n_tok <= 9; n_tok++)
            for (int rep = 0; rep < 4; rep++)
                kt_bf16_x4_case(K->gemv_bf16_x4, K->gemv[TK_DTYPE_BF16], &r, n_tok, cpu_isa_name(K->isa));
    }
    const int64_t k = 48, rows = 8;
    uint16_t w[8 * 48], w4[8 * 48];
    for (int i = 0; i < rows * k; i++) w[i] = tk_f32_to_bf16(kt_gauss(&r));
    assert_true(kern_pack_bf16_x4(w, w4, rows, k));
    float a[48], b[48];
    for (int64_t i = 0; i < rows; i++) {
        kern_dequant_bf16_ref(w + i * k, a, k);
        kern_dequant_bf16_x4_row(w4, k, i, b);
        assert_memory_equal(a, b, sizeof a);
    }
    assert_false(kern_pack_bf16_x4(w, w4, 6, k));  /* rows not a multiple of 4 */
    assert_false(kern_pack_bf16_x4(w, w4, 4, 40)); /* k not a multiple of 16 */
}

static void test_simd_tables_complete(void **state) {
    (void)state;
    static const tk_dtype types[] = {TK_DTYPE_F32,  TK_DTYPE_F16,  TK_DTYPE_BF16, TK_DTYPE_Q8_0,
                                     TK_DTYPE_Q4_0, TK_DTYPE_Q4_K, TK_DTYPE_Q6_K};
    for (int isa = 0; isa <= (int)TK_ISA_AVX512; isa++) {
        const tk_kernels *K = kernels_get((tk_isa)isa);
        for (size_t c = 0; c < sizeof types / sizeof types[0]; c++) {
            assert_non_null(K->gemv[types[c]]);
            assert_non_null(K->dequant_row[types[c]]);
        }
        assert_non_null(K->dequant_row[TK_DTYPE_Q8_K]);
        assert_non_null(K->gemv_q8_0_x8);
        assert_non_null(K->gemv_bf16_x4);
        assert_true(K->quant_q8_0 && K->quant_q8_k && K->rmsnorm && K->add && K->silu_mul);
    }
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_simd_tables_complete),   cmocka_unit_test(test_simd_gemv),
        cmocka_unit_test(test_simd_gemv_model_shapes), cmocka_unit_test(test_simd_gemv_raw_blocks),
        cmocka_unit_test(test_simd_gemv_invariance),   cmocka_unit_test(test_simd_quant_act_exact),
        cmocka_unit_test(test_simd_elementwise),       cmocka_unit_test(test_simd_gemv_q8_0_x8),
        cmocka_unit_test(test_simd_gemv_bf16_x4),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
