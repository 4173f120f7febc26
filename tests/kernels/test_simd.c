/* Every kernel the dispatcher has at one ISA level against its reference:
 * random shapes with ragged row ranges and tails, n_tok 1..9, and a stated
 * tolerance; every row of the weight table (each weight type and layout) and
 * the attention kernels as kern_attn_for picks them.
 *   kernels_test_simd LEVEL   LEVEL = scalar, avx2, avxvnni or avx512. Exits 77 (ctest
 *                             reports it skipped) when this build or this CPU
 *                             does not have the level, so a missing level is
 *                             never counted as a pass.
 *   kernels_test_simd         the tables: complete at every level of the
 *                             build, rows consistent, the attention fallback
 *                             rule, the layouts' pack and row readers.
 *
 * Tolerances: gemv outputs differ from the reference only by the order of
 * float additions (integer block dots are exact), so NMSE <= 1e-9 for every
 * weight type; activation quantizers and f16/bf16 dequantization must match
 * the reference bit for bit; rmsnorm and silu_mul within 1e-5 relative,
 * silu_mul at the wider levels with the AVX2 level's bits. */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "core/alloc.h"
#include "kern_util.h"
#include "kernels/kernels_ref.h"
#include "kv/kv.h"
#include "kv/kv_simd.h"

#define GEMV_TOL 1e-9

static const tk_dtype TYPES[] = {TK_DTYPE_F32,  TK_DTYPE_F16,  TK_DTYPE_BF16, TK_DTYPE_Q8_0,
                                 TK_DTYPE_Q4_0, TK_DTYPE_Q4_K, TK_DTYPE_Q6_K};
#define N_TYPES ((int)(sizeof TYPES / sizeof TYPES[0]))

/* The table of the level under test (the cmocka state is its tk_isa). */
static const tk_kernels *level_of(void **state) { return kernels_get(*(const tk_isa *)*state); }

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
    size_t xb = kern_act_row_bytes(t, TK_LAYOUT_ROWS, k) + (size_t)kt_int(r, 0, 3) * 4; /* padded stride */
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
        kern_quant_act(R, t, TK_LAYOUT_ROWS, xf, xq + (size_t)i * xb, k);
    }
    for (int64_t i = 0; i < ldy * n_tok; i++) y[i] = want[i] = NAN;
    kern_gemv(R, t, TK_LAYOUT_ROWS)(k, wq, r0, r1, xq, xb, n_tok, want, ldy);
    kern_gemv(K, t, TK_LAYOUT_ROWS)(k, wq, r0, r1, xq, xb, n_tok, y, ldy);
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
    const tk_kernels *K = level_of(state);
    kt_rng r = {1234 + (uint64_t)K->isa};
    for (int c = 0; c < N_TYPES; c++)
        for (int n_tok = 1; n_tok <= 9; n_tok++)
            for (int rep = 0; rep < 4; rep++) gemv_case(K, TYPES[c], n_tok, &r);
}

/* Qwen3-0.6B-like shapes with a full row range, the decode case. */
static void test_simd_gemv_model_shapes(void **state) {
    const tk_kernels *K = level_of(state);
    const tk_kernels *R = kernels_get(TK_ISA_SCALAR);
    kt_rng r = {99};
    const int64_t k = 1024, rows = 64;
    static const tk_dtype types[] = {TK_DTYPE_BF16, TK_DTYPE_Q8_0, TK_DTYPE_Q4_K, TK_DTYPE_Q6_K};
    float *wf = malloc(k * sizeof *wf), *xf = malloc(k * sizeof *xf);
    for (size_t c = 0; c < sizeof types / sizeof types[0]; c++) {
        tk_dtype t = types[c];
        uint64_t rb;
        assert_true(dtype_row_bytes(t, k, &rb));
        size_t xb = kern_act_row_bytes(t, TK_LAYOUT_ROWS, k);
        char *wq = malloc(rows * rb), *xq = malloc(xb * 4);
        for (int64_t i = 0; i < rows; i++) {
            kt_fill(&r, wf, k, 0.05f);
            assert_true(kern_quantize_row(t, wf, wq + i * rb, k));
        }
        for (int i = 0; i < 4; i++) {
            kt_fill(&r, xf, k, 1.0f);
            kern_quant_act(K, t, TK_LAYOUT_ROWS, xf, xq + i * xb, k);
        }
        float y[4 * 64], want[4 * 64];
        for (int n_tok = 1; n_tok <= 4; n_tok += 3) {
            kern_gemv(R, t, TK_LAYOUT_ROWS)(k, wq, 0, rows, xq, xb, n_tok, want, rows);
            kern_gemv(K, t, TK_LAYOUT_ROWS)(k, wq, 0, rows, xq, xb, n_tok, y, rows);
            double e = kt_nmse(y, want, rows * n_tok);
            if (!(e <= GEMV_TOL))
                fail_msg("%s %s n_tok %d nmse %.3g", cpu_isa_name(K->isa), dtype_name(t), n_tok, e);
        }
        free(wq);
        free(xq);
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
    const tk_kernels *K = level_of(state);
    static const tk_dtype types[] = {TK_DTYPE_Q8_0, TK_DTYPE_Q4_0, TK_DTYPE_Q4_K, TK_DTYPE_Q6_K};
    const tk_kernels *R = kernels_get(TK_ISA_SCALAR);
    kt_rng r = {2024};
    const int64_t k = 512, rows = 9;
    const int n_tok = 5;
    float xf[512];
    for (size_t c = 0; c < sizeof types / sizeof types[0]; c++) {
        tk_dtype t = types[c];
        int64_t nb = k / dtype_block_elems(t);
        size_t rb = (size_t)nb * dtype_block_bytes(t), xb = kern_act_row_bytes(t, TK_LAYOUT_ROWS, k);
        char *wq = malloc(rows * rb), *xq = malloc(xb * n_tok);
        fill_raw_blocks(&r, t, wq, rows * nb);
        for (int i = 0; i < n_tok; i++) {
            kt_fill(&r, xf, k, 1.0f);
            if (i == 0) /* full-scale activations: q = +-127 everywhere */
                for (int64_t j = 0; j < k; j++) xf[j] = j % 3 ? 1.0f : -1.0f;
            kern_quant_act(R, t, TK_LAYOUT_ROWS, xf, xq + i * xb, k);
        }
        float y[5 * 9], want[5 * 9];
        kern_gemv(R, t, TK_LAYOUT_ROWS)(k, wq, 0, rows, xq, xb, n_tok, want, rows);
        kern_gemv(K, t, TK_LAYOUT_ROWS)(k, wq, 0, rows, xq, xb, n_tok, y, rows);
        double e = kt_nmse(y, want, rows * n_tok);
        if (!(e <= GEMV_TOL)) fail_msg("%s raw %s: nmse %.3g", cpu_isa_name(K->isa), dtype_name(t), e);
        free(wq);
        free(xq);
    }
}

static void test_simd_quant_act_exact(void **state) {
    const tk_kernels *K = level_of(state);
    const int64_t k = 1024;
    float *x = malloc(k * sizeof *x);
    void *a = malloc(k * 2), *b = malloc(k * 2);
    kt_rng r = {5};
    for (int rep = 0; rep < 6; rep++) {
        kt_fill(&r, x, k, rep == 0 ? 1e-3f : 3.0f);
        if (rep == 1) memset(x, 0, 256 * sizeof *x); /* zero blocks: d = 0 */
        if (rep == 2)                                /* exact halves: ties round to even */
            for (int64_t i = 0; i < k; i++) x[i] = (float)((int)(i % 255) - 127) * 0.5f;
        if (rep == 3) x[17] = 1e30f; /* one huge value */
        kern_quant_q8_0_ref(x, a, k);
        K->quant_q8_0(x, b, k);
        assert_memory_equal(a, b, kern_act_row_bytes(TK_DTYPE_Q8_0, TK_LAYOUT_ROWS, k));
        kern_quant_q8_k_ref(x, a, k);
        K->quant_q8_k(x, b, k);
        assert_memory_equal(a, b, kern_act_row_bytes(TK_DTYPE_Q4_K, TK_LAYOUT_ROWS, k));
    }
    free(x);
    free(a);
    free(b);
}

static void test_simd_elementwise(void **state) {
    const tk_kernels *K = level_of(state);
    kt_rng r = {11};
    float x[300], w[300], u[300], a[300], b[300];
    tk_f16 h[300];
    tk_bf16 bf[300];
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
        if (K->isa > TK_ISA_AVX2) { /* the same operations in wider registers: the AVX2 level's bits */
            kernels_get(TK_ISA_AVX2)->silu_mul(a, x, u, n);
            assert_memory_equal(a, b, n * sizeof *a);
        }
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
        /* KV conversion to half: the same bits as the reference, any n */
        tk_f16 h2[300];
        kv_to_f16_ref(x, h, (int)n);
        K->kv_to_f16(x, h2, (int)n);
        assert_memory_equal(h, h2, n * sizeof *h);
    }
}

static void test_simd_gemv_invariance(void **state) {
    const tk_kernels *K = level_of(state);
    kt_rng r = {31};
    for (int c = 0; c < N_TYPES; c++)
        kt_check_invariance(kern_gemv(K, TYPES[c], TK_LAYOUT_ROWS), TYPES[c], &r, cpu_isa_name(K->isa));
}

/* Every row of the weight table at this level, whatever its layout: rows
 * packed by the row's pack against the file-order reference gemv (NMSE <=
 * GEMV_TOL, nothing written outside [r0, r1)), split and batch invariant, and
 * each row read back through kern_dequant_tensor_row equal to the file-order
 * row. A layout whose pack rounds the weights (its activation format differs
 * from the file order's: X16S) is held instead to its own scalar gemv, bit
 * for bit, and its rows read back to within half its step of the file's. A
 * new row is checked here without a new test. */
static bool weight_matrix(kt_rng *r, const tk_weight_kernels *w, tk_dtype t, int64_t rows, int64_t k,
                          char **wq, char **wl) {
    uint64_t rb;
    if (!dtype_row_bytes(t, (uint64_t)k, &rb)) return false;
    *wq = malloc((size_t)(rows * (int64_t)rb));
    *wl = malloc((size_t)(rows * (int64_t)rb));
    float *f = malloc((size_t)k * sizeof *f);
    for (int64_t i = 0; i < rows; i++) {
        kt_fill(r, f, k, 0.5f);
        assert_true(kern_quantize_row(t, f, *wq + i * (int64_t)rb, k));
    }
    free(f);
    if (!w->pack) {
        memcpy(*wl, *wq, (size_t)(rows * (int64_t)rb));
        return true;
    }
    if (w->pack(*wq, *wl, rows, k)) return true;
    free(*wq);
    free(*wl);
    return false;
}

static void weight_row_check(const tk_kernels *K, tk_dtype t, tk_layout layout, kt_rng *r) {
    const tk_kernels *R = kernels_get(TK_ISA_SCALAR);
    const tk_weight_kernels *w = kern_weight(t, layout);
    /* requant: the pack rounds, so the reference reads the packed matrix */
    bool requant;
    const tk_gemv_fn fn = kern_gemv(K, t, layout), ref = kt_xr_ref(t, layout, &requant);
    const int be = dtype_block_elems(t);
    for (int n_tok = 1; n_tok <= 11; n_tok++) {
        /* Shapes the layout takes, drawn at random (packs refuse the others). */
        char *wq = NULL, *wl = NULL;
        int64_t rows = 0, k = 0;
        for (int tries = 0; tries < 1000; tries++) {
            rows = kt_int(r, 1, 32);
            k = be == 1 ? kt_int(r, 1, 20) * 16 + (kt_int(r, 0, 3) ? 0 : kt_int(r, 1, 15))
                        : be * kt_int(r, 1, 6) * (kt_int(r, 0, 1) ? 8 : 1);
            if (weight_matrix(r, w, t, rows, k, &wq, &wl)) break;
            wq = NULL;
        }
        if (!wq) fail_msg("%s layout %d: no random shape taken by its pack", dtype_name(t), (int)layout);
        int64_t r0 = kt_int(r, 0, (int)rows - 1), r1 = kt_int(r, (int)r0 + 1, (int)rows),
                ldy = rows + kt_int(r, 0, 3);
        size_t xb = kern_act_row_bytes(t, layout, k) + (size_t)kt_int(r, 0, 3) * 4;
        char *xq = malloc(xb * (size_t)n_tok);
        float *xf = malloc((size_t)k * sizeof *xf), *y = malloc((size_t)(ldy * n_tok) * sizeof *y),
              *want = malloc((size_t)(ldy * n_tok) * sizeof *want);
        /* a layout whose gemv rounds activations to BF16 is held to the
         * file-order reference given the rounded activations */
        char *xr = malloc(xb * (size_t)n_tok);
        for (int i = 0; i < n_tok; i++) {
            kt_fill(r, xf, k, 2.0f);
            kern_quant_act(R, t, layout, xf, xq + (size_t)i * xb, k);
            if (w->opt_in && !requant) /* P16R */
                for (int64_t j = 0; j < k; j++) xf[j] = tk_bf16_to_f32(kern_act_bf16_ref(xf[j]));
            kern_quant_act(R, t, layout, xf, xr + (size_t)i * xb, k);
        }
        for (int64_t i = 0; i < ldy * n_tok; i++) y[i] = want[i] = NAN;
        ref(k, requant ? wl : wq, r0, r1, xr, xb, n_tok, want, ldy);
        free(xr);
        fn(k, wl, r0, r1, xq, xb, n_tok, y, ldy);
        double num = 0, den = 0;
        for (int tt = 0; tt < n_tok; tt++)
            for (int64_t i = 0; i < ldy; i++) {
                float a = y[tt * ldy + i], b = want[tt * ldy + i];
                if (i < r0 || i >= r1) {
                    if (!isnan(a))
                        fail_msg("%s %s layout %d wrote outside rows: t %d row %lld", cpu_isa_name(K->isa),
                                 dtype_name(t), (int)layout, tt, (long long)i);
                    continue;
                }
                num += ((double)a - b) * ((double)a - b);
                den += (double)b * b;
            }
        if (!(num <= GEMV_TOL * den) || (requant && num != 0))
            fail_msg("%s %s layout %d k %lld rows [%lld,%lld) n_tok %d: nmse %.3g", cpu_isa_name(K->isa),
                     dtype_name(t), (int)layout, (long long)k, (long long)r0, (long long)r1, n_tok,
                     num / den);
        /* all rows at once, and one token at a time, give the same bits */
        float *part = malloc((size_t)(ldy * n_tok) * sizeof *part);
        for (int pass = 0; pass < 2; pass++) {
            if (pass == 0)
                fn(k, wl, 0, rows, xq, xb, n_tok, part, ldy);
            else
                for (int i = 0; i < n_tok; i++)
                    fn(k, wl, r0, r1, xq + (size_t)i * xb, xb, 1, part + i * ldy, ldy);
            for (int tt = 0; tt < n_tok; tt++)
                for (int64_t i = r0; i < r1; i++)
                    if (memcmp(&part[tt * ldy + i], &y[tt * ldy + i], sizeof *y))
                        fail_msg("%s %s layout %d: token %d row %lld differs %s", cpu_isa_name(K->isa),
                                 dtype_name(t), (int)layout, tt, (long long)i,
                                 pass ? "one token at a time" : "with all rows at once");
        }
        /* rows read back through the table */
        uint64_t rb;
        assert_true(dtype_row_bytes(t, (uint64_t)k, &rb));
        tk_tensor tw = {.type = t, .n_dims = 2, .ne = {k, rows, 1, 1}, .data = wl, .layout = layout};
        float *a = malloc((size_t)k * sizeof *a), *b = malloc((size_t)k * sizeof *b);
        for (int64_t i = 0; i < rows; i++) {
            R->dequant_row[t](wq + i * (int64_t)rb, a, k);
            kern_dequant_tensor_row(K, &tw, i, b);
            if (requant) { /* round(a / d) d, d = max |a| / 127 per 256 values */
                for (int64_t j0 = 0; j0 < k; j0 += 256) {
                    float amax = 0.0f;
                    for (int64_t j = j0; j < j0 + 256; j++) amax = fmaxf(amax, fabsf(a[j]));
                    for (int64_t j = j0; j < j0 + 256; j++)
                        if (!(fabsf(a[j] - b[j]) <= 0.5001f * amax / 127.0f))
                            fail_msg("%s %s layout %d: row %lld element %lld: %g read back as %g",
                                     cpu_isa_name(K->isa), dtype_name(t), (int)layout, (long long)i,
                                     (long long)j, a[j], b[j]);
                }
            } else if (memcmp(a, b, (size_t)k * sizeof *a)) {
                fail_msg("%s %s layout %d: row %lld read back differs", cpu_isa_name(K->isa), dtype_name(t),
                         (int)layout, (long long)i);
            }
        }
        free(a), free(b), free(part), free(wq), free(wl), free(xq), free(xf), free(y), free(want);
    }
}

static void test_simd_weight_rows(void **state) {
    const tk_kernels *K = level_of(state);
    kt_rng r = {606};
    int n = 0;
    for (int t = 0; t < TK_DTYPE_COUNT; t++)
        for (int l = 0; l < TK_LAYOUT_COUNT; l++)
            if (kern_weight((tk_dtype)t, (tk_layout)l)) {
                weight_row_check(K, (tk_dtype)t, (tk_layout)l, &r);
                n++;
            }
    print_message("%s: %d rows of the weight table checked\n", cpu_isa_name(K->isa), n);
    assert_true(n >= N_TYPES + 2);
}

/* The 8-row interleaved Q8_0 layout: the scalar kernel equals the row-order
 * reference bit for bit; each SIMD level is within the gemv tolerance, and
 * batch/split invariant with rows cut inside groups. */
static void test_simd_gemv_q8_0_x8(void **state) {
    const tk_kernels *K = level_of(state);
    const tk_gemv_fn fn = kern_gemv(K, TK_DTYPE_Q8_0, TK_LAYOUT_X8);
    const bool exact = K->isa == TK_ISA_SCALAR;
    kt_rng r = {808};
    for (int n_tok = 1; n_tok <= 11; n_tok++)
        for (int rep = 0; rep < 4; rep++)
            kt_xr_case(TK_DTYPE_Q8_0, fn, TK_LAYOUT_X8, &r, n_tok, exact, cpu_isa_name(K->isa));
    kt_check_invariance_xr(TK_DTYPE_Q8_0, fn, TK_LAYOUT_X8, &r, 96, 11, cpu_isa_name(K->isa));
}

/* The 16-row interleaved layouts (Q8_0 and Q4_0), as X8, with the token
 * counts of every AVX-512 tile (one token reads one row group; from two
 * tokens on, two row groups per tile of at most 7 where both are whole, here
 * among 1 to 4 groups and random row cuts, and in the invariance checks'
 * three groups) and the stack's per-pass share of tokens:
 * k = 16384 has 512 blocks, so 14 tokens a pass and 29 tokens make three
 * passes (14, 14, 1: full and partial tiles); k beyond 229376 takes no pass
 * (the definition). Q4_0's scalar kernel equals its row-order reference. */
static void test_simd_gemv_x16(void **state) {
    const tk_kernels *K = level_of(state);
    const bool exact = K->isa == TK_ISA_SCALAR;
    const char *what = cpu_isa_name(K->isa);
    static const tk_dtype types[] = {TK_DTYPE_Q8_0, TK_DTYPE_Q4_0};
    kt_rng r = {1616};
    for (int c = 0; c < 2; c++) {
        const tk_dtype t = types[c];
        const tk_gemv_fn fn = kern_gemv(K, t, TK_LAYOUT_X16);
        for (int n_tok = 1; n_tok <= 30; n_tok++)
            for (int rep = 0; rep < 2; rep++) kt_xr_case(t, fn, TK_LAYOUT_X16, &r, n_tok, exact, what);
        kt_check_invariance_xr(t, fn, TK_LAYOUT_X16, &r, 96, 29, what);
        kt_check_invariance_xr(t, fn, TK_LAYOUT_X16, &r, 16384, 29, what);
        kt_xr_shape(t, fn, TK_LAYOUT_X16, &r, 48, 16384, 29, exact, what);
        kt_xr_shape(t, fn, TK_LAYOUT_X16, &r, 16, 32 * 8200, 2, exact, what);
    }
}

/* Q8_0 by one scale per 256 values (X16S) gives its own scalar gemv's bits
 * at every level (exact integer sums, the same float step per block), for
 * 1..30 tokens (past the AVX-512 tile of 14: pairs of groups), rows cut
 * inside groups, several passes of the activation table (k = 16384: 64
 * blocks, 16 tokens a pass) and a k beyond the table (the definition). */
static void test_simd_gemv_x16s(void **state) {
    const tk_kernels *K = level_of(state);
    const char *what = cpu_isa_name(K->isa);
    const tk_gemv_fn fn = kern_gemv(K, TK_DTYPE_Q8_0, TK_LAYOUT_X16S);
    kt_rng r = {2560};
    for (int n_tok = 1; n_tok <= 30; n_tok++)
        for (int rep = 0; rep < 2; rep++)
            kt_xr_case(TK_DTYPE_Q8_0, fn, TK_LAYOUT_X16S, &r, n_tok, true, what);
    kt_check_invariance_xr(TK_DTYPE_Q8_0, fn, TK_LAYOUT_X16S, &r, 512, 29, what);
    kt_check_invariance_xr(TK_DTYPE_Q8_0, fn, TK_LAYOUT_X16S, &r, 16384, 29, what);
    kt_xr_shape(TK_DTYPE_Q8_0, fn, TK_LAYOUT_X16S, &r, 48, 16384, 29, true, what);
    kt_xr_shape(TK_DTYPE_Q8_0, fn, TK_LAYOUT_X16S, &r, 16, 256 * 1100, 2, true, what);
}

/* The 16-row interleaved Q4_K and Q6_K layouts give the row-order
 * reference's bits at every level (their integer sums are exact and their
 * float steps the reference's), for 1..32 tokens (past the AVX-512 tile of
 * 8), rows cut inside groups, several passes of the activation table
 * (k = 24576: 96 super-blocks, 10 tokens a pass) and a k beyond the table
 * (the definition). */
static void test_simd_gemv_qk_x16(void **state) {
    const tk_kernels *K = level_of(state);
    const char *what = cpu_isa_name(K->isa);
    static const tk_dtype types[] = {TK_DTYPE_Q4_K, TK_DTYPE_Q6_K};
    kt_rng r = {4416};
    for (int c = 0; c < 2; c++) {
        const tk_dtype t = types[c];
        const tk_gemv_fn fn = kern_gemv(K, t, TK_LAYOUT_X16);
        for (int n_tok = 1; n_tok <= 32; n_tok++)
            for (int rep = 0; rep < 2; rep++) kt_xr_case(t, fn, TK_LAYOUT_X16, &r, n_tok, true, what);
        kt_check_invariance_xr(t, fn, TK_LAYOUT_X16, &r, 512, 29, what);
        kt_check_invariance_xr(t, fn, TK_LAYOUT_X16, &r, 24576, 29, what);
        kt_xr_shape(t, fn, TK_LAYOUT_X16, &r, 48, 24576, 29, true, what);
        kt_xr_shape(t, fn, TK_LAYOUT_X16, &r, 16, 256 * 961, 2, true, what);
    }
}

/* The 4-row interleaved BF16 layout gives the row layout's bits at every
 * level (scalar included). */
static void test_simd_gemv_bf16_x4(void **state) {
    const tk_kernels *K = level_of(state);
    kt_rng r = {404};
    for (int n_tok = 1; n_tok <= 9; n_tok++)
        for (int rep = 0; rep < 4; rep++)
            kt_bf16_x4_case(kern_gemv(K, TK_DTYPE_BF16, TK_LAYOUT_X4),
                            kern_gemv(K, TK_DTYPE_BF16, TK_LAYOUT_ROWS), &r, n_tok, cpu_isa_name(K->isa));
}

/* One P16 case: rows x k BF16 weights (Gaussian, 0.5), n_tok Gaussian
 * activations; every gemv in fns must give kern_gemv_bf16_p16r_ref's bits
 * over [r0, r1) and write nothing else, and the reference must be within
 * the stated bound of the float64 dot with the unrounded activations:
 * |y - dot| <= (2^-8 + 1.01 k 2^-24) sum |w x| (2^-8: the unit roundoff of
 * BF16, one rounding of each activation; the second term: k f32 adds).
 * Returns the largest |y - dot| / sum |w x| seen. */
static double p16_case(bool round, const tk_gemv_fn *fns, int n_fn, kt_rng *r, int64_t rows, int64_t k,
                       int n_tok, const char *what) {
    kt_bf16_case c;
    kt_bf16_case_make(r, rows, k, n_tok, &c);
    assert_true(kern_pack_bf16_p16(c.w, c.wp, rows, k));
    for (int64_t i = 0; i < c.ldy * n_tok; i++) c.want[i] = NAN;
    (round ? kern_gemv_bf16_p16r_ref : kern_gemv_bf16_p16_ref)(k, c.wp, c.r0, c.r1, c.x, c.xs, n_tok, c.want,
                                                               c.ldy);
    for (int f = 0; f < n_fn; f++) {
        for (int64_t i = 0; i < c.ldy * n_tok; i++) c.y[i] = NAN;
        fns[f](k, c.wp, c.r0, c.r1, c.x, c.xs, n_tok, c.y, c.ldy);
        for (int64_t i = 0; i < c.ldy * n_tok; i++)
            if (memcmp(&c.y[i], &c.want[i], sizeof *c.y) && !(isnan(c.y[i]) && isnan(c.want[i])))
                fail_msg("%s bf16 p16 (gemv %d): k %lld rows [%lld,%lld) n_tok %d: output %lld %.9g != "
                         "reference %.9g",
                         what, f, (long long)k, (long long)c.r0, (long long)c.r1, n_tok, (long long)i, c.y[i],
                         c.want[i]);
    }
    double worst = 0;
    for (int t = 0; t < n_tok; t++)
        for (int64_t i = c.r0; i < c.r1; i++) {
            const float *xt = (const float *)((const char *)c.x + (size_t)t * c.xs);
            double dot = 0, mag = 0;
            for (int64_t j = 0; j < k; j++) {
                double p = (double)tk_bf16_to_f32(c.w[i * k + j]) * xt[j];
                dot += p;
                mag += fabs(p);
            }
            double err = fabs((double)c.want[t * c.ldy + i] - dot),
                   bound = ((round ? ldexp(1, -8) : 0) + 1.01 * (double)k * ldexp(1, -24)) * mag;
            if (!(err <= bound))
                fail_msg("%s bf16 p16: k %lld row %lld token %d: |y - dot| %.3g > bound %.3g", what,
                         (long long)k, (long long)i, t, err, bound);
            if (mag > 0 && err / mag > worst) worst = err / mag;
        }
    kt_bf16_case_free(&c);
    return worst;
}

/* The BF16 pair layouts: P16 (f32 activations) and P16R (rounded to BF16;
 * vdpbf16ps's arithmetic) at every level give their reference's bits (P16R
 * also by vdpbf16ps itself, kern_gemv_bf16_p16r_avx512bf16, on a CPU that has
 * it), for token counts past the 12-token tile, k that makes several
 * activation passes and row blocks, k beyond the pass (the reference), rows
 * cut inside groups (the reference computes each (row, token) alone, so its
 * bits for every n_tok and range are batch and split invariance); and the
 * bounds against float64: P16 the f32 accumulation's, P16R 2^-8 of sum |w x|
 * more for the rounding. */
static void test_simd_gemv_bf16_p16(void **state) {
    const tk_kernels *K = level_of(state);
    const char *what = cpu_isa_name(K->isa);
    for (int round = 0; round < 2; round++) {
        tk_gemv_fn fns[2] = {kern_gemv(K, TK_DTYPE_BF16, round ? TK_LAYOUT_P16R : TK_LAYOUT_P16), NULL};
        int n_fn = 1;
#if defined(__x86_64__)
        tk_cpu c;
        cpu_detect(&c);
        if (round && K->isa == TK_ISA_AVX512) {
            /* both forms, whichever the dispatcher picked (the faster here) */
            double ratio;
            const bool hw = kern_bf16_dot_hw(&ratio);
            assert_true(fns[0] == (hw ? kern_gemv_bf16_p16r_avx512bf16 : kern_gemv_bf16_p16r_avx512));
            assert_true(c.avx512bf16 ? ratio > 0 : !hw && ratio == 0);
            print_message("p16r dispatches %s (two FMAs take %.2fx its time)\n",
                          hw ? "vdpbf16ps" : "two FMAs", ratio);
            fns[0] = kern_gemv_bf16_p16r_avx512;
            if (c.avx512bf16) fns[n_fn++] = kern_gemv_bf16_p16r_avx512bf16;
        }
#endif
        kt_rng r = {1632};
        double worst = 0, e;
        for (int n_tok = 1; n_tok <= 30; n_tok++) {
            e = p16_case(round, fns, n_fn, &r, 16 * kt_int(&r, 1, 4), 32 * kt_int(&r, 1, 24), n_tok, what);
            worst = e > worst ? e : worst;
        }
        /* several row blocks and passes; one token a pass at k = P16_PAIRS; beyond it; few tokens
         * over many groups (tiles of several groups, the rest one at a time, cut ranges) */
        const int64_t shapes[][3] = {{160, 2048, 13}, {32, P16_PAIRS, 3}, {16, P16_PAIRS + 32, 2},
                                     {208, 64, 1},    {176, 96, 2},       {112, 32, 3},
                                     {144, 4096, 1},  {16 * 37, 512, 1},  {16 * 35, 512, 2}};
        for (int i = 0; i < (int)(sizeof shapes / sizeof shapes[0]); i++) {
            e = p16_case(round, fns, n_fn, &r, shapes[i][0], shapes[i][1], (int)shapes[i][2], what);
            worst = e > worst ? e : worst;
        }
        print_message("%s bf16 %s: max |y - dot| / sum |w x| = %.3g (%d kernels)\n", what,
                      round ? "p16r" : "p16", worst, n_fn);
    }
}

/* Attention through the dispatcher at this level: a pool opened at the level
 * runs kern_attn_for's kernel (the level's own, or the one below for a
 * head_dim it does not take); its output is compared with the reference
 * kernel's on the same pool, for every KV type, GQA ratios that fill and
 * split the head tiles, decode and prefill queries, and blocks small enough
 * for K rows and large enough for K columns (kv_k_cols: 128, a context past
 * one part whose last block is ragged, and one of three whole blocks and a
 * ragged one). The last query alone (a decode tile) must give the bits it
 * gave inside the chunk's tiles. */
static void test_simd_attention(void **state) {
    const tk_kernels *K = level_of(state);
    static const struct {
        tk_kv_type t;
        tk_kv_scale sc;
    } kinds[] = {{TK_KV_F32, TK_KV_SCALE_HEAD},
                 {TK_KV_F16, TK_KV_SCALE_HEAD},
                 {TK_KV_BF16, TK_KV_SCALE_HEAD},
                 {TK_KV_INT8, TK_KV_SCALE_TOKEN},
                 {TK_KV_INT8, TK_KV_SCALE_HEAD}};
    static const int shapes[][3] = {{8, 2, 64}, {6, 1, 128}, {5, 5, 16},  {6, 2, 40},
                                    {4, 2, 20}, {12, 2, 72}, {16, 8, 128}};
    /* size, context: short blocks; a context past one part whose last block
     * is ragged; an odd number of whole blocks before the last */
    static const int blocks[][2] = {
        {16, 53}, {KV_KT_BLOCK, KV_ATTN_PART + 93}, {KV_KT_BLOCK, 3 * KV_KT_BLOCK + 40}};
    kt_rng r = {4242};
    for (size_t bi = 0; bi < sizeof blocks / sizeof blocks[0]; bi++)
        for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++)
            for (size_t ki = 0; ki < sizeof kinds / sizeof kinds[0]; ki++) {
                const int n_head = shapes[s][0], nkv = shapes[s][1], hd = shapes[s][2], bs = blocks[bi][0],
                          len = blocks[bi][1], n_q = 4, nb = (len + bs - 1) / bs;
                tk_kv_opts o = {.n_layer = 1,
                                .n_head_kv = nkv,
                                .head_dim = hd,
                                .block_size = bs,
                                .n_blocks = nb,
                                .type = kinds[ki].t,
                                .scale = kinds[ki].sc};
                tk_kv *kv;
                assert_int_equal(kv_init_isa(&o, K->isa, &kv), TK_OK);
                tk_isa want_level;
                const kv_attn_fn fn = kern_attn_for(K->isa, hd, &want_level);
                assert_int_equal(kv_isa(kv), want_level);
                assert_true(want_level <= K->isa);
                if (hd % K->attn_lanes == 0)
                    assert_true(fn == K->attn); /* the level's own (avxvnni: avx2's) */
                int32_t bt[8];
                for (int i = 0; i < nb; i++) bt[nb - 1 - i] = kv_block_alloc(kv); /* blocks out of order */
                const size_t row = (size_t)nkv * hd, qrow = (size_t)n_head * hd;
                float *kx = malloc(row * 4), *vx = malloc(row * 4), *q = malloc(n_q * qrow * 4);
                float *out = malloc(n_q * qrow * 4), *want = malloc(n_q * qrow * 4);
                float *scratch = tk_malloc(kv_attn_scratch_floats(kv, len) * 4);
                /* own-block records (INT8 per head): the query at p takes its
                 * own right after p is written, by the kernel and the reference */
                const bool own = kv_attn_own_block(kv);
                const size_t rec = (size_t)n_head * KV_PART_REC(hd);
                float *own_k = own ? malloc(n_q * rec * 4) : NULL,
                      *own_r = own ? malloc(n_q * rec * 4) : NULL;
                const kv_attn_own_fn own_fn = kernels_get(want_level)->attn_own;
                kt_fill(&r, q, (int64_t)(n_q * qrow), 1.0f);
                const float scale = 1.0f / sqrtf((float)hd);
                double vmax = 0;
                for (int p = 0; p < len; p++) {
                    kt_fill(&r, kx, (int64_t)row, p % 9 ? 1.0f : 4.0f);
                    kt_fill(&r, vx, (int64_t)row, 1.0f);
                    for (size_t i = 0; i < row; i++) vmax = fmax(vmax, fabs(vx[i]));
                    kv_write(kv, 0, bt, p, kx, vx);
                    const int i = p - (len - n_q);
                    if (!own || i < 0) continue;
                    kv_set_attn(kv, fn, kernels_get(want_level)->attn_part, own_fn);
                    kv_attention_own(kv, 0, bt, p, q + i * qrow, n_head, 0, n_head, scale, own_k + i * rec,
                                     scratch, bt, p, 0);
                    kv_set_attn(kv, kv_attn_ref, kv_attn_part_ref, kv_attn_own_ref);
                    kv_attention_own(kv, 0, bt, p, q + i * qrow, n_head, 0, n_head, scale, own_r + i * rec,
                                     scratch, NULL, 0, 0);
                    double e = 0;
                    for (size_t j = 0; j < rec; j++) {
                        const size_t c = j % KV_PART_REC(hd);
                        /* acc and l relative to the record's l (acc ~ l * V), m as is */
                        const double d = fabs((double)own_k[i * rec + j] - own_r[i * rec + j]);
                        const double l = own_r[i * rec + j - c + hd + 1];
                        e = fmax(e, c == (size_t)hd ? d : c == (size_t)hd + 1 ? d / l : d / (l * vmax));
                    }
                    if (!(e <= 1e-5))
                        fail_msg("own-block record %s at %d: error %.3g", cpu_isa_name(K->isa), p, e);
                }
                kv_set_attn(kv, fn, kernels_get(want_level)->attn_part, own_fn);
                kv_attention(kv, 0, bt, len - n_q, n_q, q, n_head, 0, n_head, scale, own_k, out, scratch, bt,
                             nkv - 1); /* a prefetch hint: no bit changes */
                /* the last query alone (a decode tile: its GQA group's
                 * pairs only) gives the bits it gave inside the chunk's
                 * tiles */
                float *alone = malloc(qrow * 4);
                kv_attention(kv, 0, bt, len - 1, 1, q + (n_q - 1) * qrow, n_head, 0, n_head, scale,
                             own ? own_k + (n_q - 1) * rec : NULL, alone, scratch, NULL, 0);
                if (memcmp(alone, out + (n_q - 1) * qrow, qrow * 4))
                    fail_msg("attention %s kv type %d heads %d/%d hd %d block %d: a query alone differs from "
                             "the same query in a chunk",
                             cpu_isa_name(K->isa), (int)kinds[ki].t, n_head, nkv, hd, bs);
                free(alone);
                kv_set_attn(kv, kv_attn_ref, kv_attn_part_ref, kv_attn_own_ref);
                kv_attention(kv, 0, bt, len - n_q, n_q, q, n_head, 0, n_head, scale, own_r, want, scratch,
                             NULL, 0);
                double err = 0;
                for (size_t i = 0; i < n_q * qrow; i++)
                    err = fmax(err, fabs((double)out[i] - want[i]) / vmax);
                if (!(err <= 1e-5))
                    fail_msg("attention %s (kernel of %s) kv type %d heads %d/%d hd %d block %d: max error "
                             "%.3g of "
                             "max|V|",
                             cpu_isa_name(K->isa), cpu_isa_name(want_level), (int)kinds[ki].t, n_head, nkv,
                             hd, bs, err);
                free(own_k), free(own_r);
                free(kx), free(vx), free(q), free(out), free(want);
                tk_free(scratch);
                kv_free(kv);
            }
}

/* ---- the tables (no level argument) ------------------------------------------------ */

static void test_simd_tables_complete(void **state) {
    (void)state;
    for (int isa = 0; isa <= (int)kernels_top_isa(); isa++) {
        const tk_kernels *K = kernels_get((tk_isa)isa);
        assert_int_equal(K->isa, isa);
        for (int c = 0; c < N_TYPES; c++) {
            assert_non_null(kern_gemv(K, TYPES[c], TK_LAYOUT_ROWS));
            assert_non_null(K->dequant_row[TYPES[c]]);
        }
        assert_non_null(K->dequant_row[TK_DTYPE_Q8_K]);
        assert_non_null(kern_gemv(K, TK_DTYPE_Q8_0, TK_LAYOUT_X8));
        assert_non_null(kern_gemv(K, TK_DTYPE_Q8_0, TK_LAYOUT_X16));
        assert_non_null(kern_gemv(K, TK_DTYPE_Q4_0, TK_LAYOUT_X16));
        assert_non_null(kern_gemv(K, TK_DTYPE_Q4_K, TK_LAYOUT_X16));
        assert_non_null(kern_gemv(K, TK_DTYPE_Q6_K, TK_LAYOUT_X16));
        assert_non_null(kern_gemv(K, TK_DTYPE_BF16, TK_LAYOUT_X4));
        assert_true(K->quant_q8_0 && K->quant_q8_k && K->rmsnorm && K->add && K->silu_mul);
        assert_true(K->attn && K->kv_to_f16 && K->attn_lanes >= 1);
        /* every row has a gemv at every level of the build */
        for (int t = 0; t < TK_DTYPE_COUNT; t++)
            for (int l = 0; l < TK_LAYOUT_COUNT; l++)
                if (kern_weight((tk_dtype)t, (tk_layout)l))
                    assert_non_null(kern_gemv(K, (tk_dtype)t, (tk_layout)l));
    }
    /* a row's layouts share its type's activation format, but for opt-in
     * ones; other layouts are made from file order and read back by the row */
    for (int t = 0; t < TK_DTYPE_COUNT; t++)
        for (int l = 0; l < TK_LAYOUT_COUNT; l++) {
            const tk_weight_kernels *w = kern_weight((tk_dtype)t, (tk_layout)l);
            if (!w) continue;
            assert_non_null(kern_weight((tk_dtype)t, TK_LAYOUT_ROWS));
            assert_true(w->opt_in || w->act == kern_act_type((tk_dtype)t, TK_LAYOUT_ROWS));
            assert_int_equal(w->act, kern_act_type((tk_dtype)t, (tk_layout)l));
            assert_true(l == TK_LAYOUT_ROWS ? !w->pack && !w->dequant_row : w->pack && w->dequant_row);
            for (int isa = 0; isa <= (int)kernels_top_isa(); isa++)
                assert_non_null(kernels_get((tk_isa)isa)->dequant_row[t]);
        }
    /* misses are NULL, never out of bounds */
    assert_null(kern_weight(TK_DTYPE_Q8_K, TK_LAYOUT_ROWS));
    assert_null(kern_weight(TK_DTYPE_Q4_0, TK_LAYOUT_X8));
    assert_null(kern_weight(TK_DTYPE_COUNT, TK_LAYOUT_ROWS));
    assert_null(kern_weight((tk_dtype)-1, TK_LAYOUT_ROWS));
    assert_null(kern_weight(TK_DTYPE_Q8_0, TK_LAYOUT_COUNT));
    assert_null(kern_gemv(kernels_get(TK_ISA_SCALAR), TK_DTYPE_F32, TK_LAYOUT_X8));
}

/* kern_pack puts a type in its interleaved layout where the shape fits and
 * writes nothing otherwise; the layouts read back the file-order rows. */
static void test_simd_pack(void **state) {
    (void)state;
    kt_rng r = {808};
    const int64_t k = 160, rows = 24;
    char *wq, *w8, *w16, *wq16;
    kt_xr_matrix(TK_DTYPE_Q8_0, &r, TK_LAYOUT_X8, rows, k, &wq, &w8);
    kt_xr_matrix(TK_DTYPE_Q8_0, &r, TK_LAYOUT_X16, 32, k, &wq16, &w16);
    float a[160], b[160];
    for (int64_t i = 0; i < rows; i++) {
        kern_dequant_q8_0_ref(wq + i * (int64_t)(k / 32 * sizeof(tk_block_q8_0)), a, k);
        kern_dequant_q8_0_x8_row(w8, k, i, b);
        assert_memory_equal(a, b, sizeof a);
    }
    for (int64_t i = 0; i < 32; i++) {
        kern_dequant_q8_0_ref(wq16 + i * (int64_t)(k / 32 * sizeof(tk_block_q8_0)), a, k);
        kern_dequant_q8_0_x16_row(w16, k, i, b);
        assert_memory_equal(a, b, sizeof a);
    }
    assert_false(kern_pack_q8_0_x8(wq, w8, 12, k));   /* rows not a multiple of 8 */
    assert_false(kern_pack_q8_0_x8(wq, w8, 8, 40));   /* k not a multiple of 32 */
    assert_false(kern_pack_q8_0_x16(wq, w8, 24, k));  /* rows not a multiple of 16 */
    assert_false(kern_pack_q8_0_x16(wq, w8, 16, 40)); /* k not a multiple of 32 */
    size_t bytes = (size_t)rows * (k / 32) * sizeof(tk_block_q8_0);
    char *out = malloc(2 * bytes);
    /* 16-row groups where rows % 16 == 0, 8-row ones where only rows % 8 == 0 */
    assert_int_equal(kern_pack(TK_DTYPE_Q8_0, wq16, out, 32, k), TK_LAYOUT_X16);
    assert_memory_equal(out, w16, (size_t)32 * (k / 32) * sizeof(tk_block_q8_0));
    assert_int_equal(kern_pack(TK_DTYPE_Q8_0, wq, out, rows, k), TK_LAYOUT_X8);
    assert_memory_equal(out, w8, bytes);
    free(w16);
    free(wq16);
    memset(out, 0x5a, bytes);
    assert_int_equal(kern_pack(TK_DTYPE_Q8_0, wq, out, 12, k), TK_LAYOUT_ROWS);
    for (size_t i = 0; i < bytes; i++) assert_int_equal((unsigned char)out[i], 0x5a); /* nothing written */
    assert_int_equal(kern_pack(TK_DTYPE_Q4_0, wq, out, 8, 64), TK_LAYOUT_ROWS);       /* rows % 16 */
    assert_int_equal(kern_pack(TK_DTYPE_COUNT, wq, out, 8, 64), TK_LAYOUT_ROWS);
    free(out);
    free(wq);
    free(w8);

    const int64_t kb = 48, rb = 8;
    uint16_t w[8 * 48], w4[8 * 48], w4b[8 * 48];
    for (int i = 0; i < rb * kb; i++) w[i] = tk_f32_to_bf16(kt_gauss(&r));
    assert_true(kern_pack_bf16_x4(w, w4, rb, kb));
    for (int64_t i = 0; i < rb; i++) {
        kern_dequant_bf16_ref(w + i * kb, a, kb);
        kern_dequant_bf16_x4_row(w4, kb, i, b);
        assert_memory_equal(a, b, kb * sizeof *a);
    }
    assert_false(kern_pack_bf16_x4(w, w4, 6, kb)); /* rows not a multiple of 4 */
    assert_false(kern_pack_bf16_x4(w, w4, 4, 40)); /* k not a multiple of 16 */
    assert_int_equal(kern_pack(TK_DTYPE_BF16, w, w4b, rb, kb), TK_LAYOUT_X4);
    assert_memory_equal(w4, w4b, sizeof w4);
    assert_int_equal(kern_pack(TK_DTYPE_F16, w, w4b, rb, kb), TK_LAYOUT_ROWS);
    /* 16 rows x 32: P16 by default, P16R (rounding) only when asked; 8 rows: X4 either way */
    uint16_t wb16[16 * 32], wp[16 * 32], wpb[16 * 32];
    for (int i = 0; i < 16 * 32; i++) wb16[i] = tk_f32_to_bf16(kt_gauss(&r));
    assert_true(kern_pack_bf16_p16(wb16, wp, 16, 32));
    assert_int_equal(kern_pack(TK_DTYPE_BF16, wb16, wpb, 16, 32), TK_LAYOUT_P16);
    assert_memory_equal(wp, wpb, sizeof wp);
    assert_int_equal(kern_pack_opt_in(TK_DTYPE_BF16, wb16, wpb, 16, 32), TK_LAYOUT_P16R);
    assert_memory_equal(wp, wpb, sizeof wp);
    assert_int_equal(kern_pack_opt_in(TK_DTYPE_BF16, w, w4b, rb, kb), TK_LAYOUT_X4);
    for (int64_t i = 0; i < 16; i++) {
        kern_dequant_bf16_ref(wb16 + i * 32, a, 32);
        kern_dequant_bf16_p16_row(wp, 32, i, b);
        assert_memory_equal(a, b, 32 * sizeof *a);
    }
    assert_false(kern_pack_bf16_p16(wb16, wp, 8, 32));  /* rows not a multiple of 16 */
    assert_false(kern_pack_bf16_p16(wb16, wp, 16, 16)); /* k not a multiple of 32 */

    /* Q4_K by 16 rows: every row (scales, mins and nibbles) reads back; the
     * scales and mins cover all 6-bit values */
    const int64_t kk = 512, rk = 32, nbk = kk / 256;
    char *qk, *qk16;
    kt_xr_matrix(TK_DTYPE_Q4_K, &r, TK_LAYOUT_X16, rk, kk, &qk, &qk16);
    for (int64_t i = 0; i < rk; i++) {
        tk_block_q4_k *blk = (tk_block_q4_k *)(qk + i * nbk * (int64_t)sizeof(tk_block_q4_k));
        for (int64_t bk = 0; bk < nbk; bk++)
            for (int j = 0; j < 12; j++) blk[bk].scales[j] = (uint8_t)(i * 37 + bk * 11 + j * 23);
    }
    assert_true(kern_pack_q4_k_x16(qk, qk16, rk, kk));
    float ak[512], bk2[512];
    for (int64_t i = 0; i < rk; i++) {
        kern_dequant_q4_k_ref(qk + i * nbk * (int64_t)sizeof(tk_block_q4_k), ak, kk);
        kern_dequant_q4_k_x16_row(qk16, kk, i, bk2);
        assert_memory_equal(ak, bk2, sizeof ak);
    }
    assert_false(kern_pack_q4_k_x16(qk, qk16, 24, kk)); /* rows not a multiple of 16 */
    assert_false(kern_pack_q4_k_x16(qk, qk16, 16, 96)); /* k not a multiple of 256 */
    const size_t kbytes = (size_t)rk * (size_t)nbk * sizeof(tk_block_q4_k);
    char *ko = malloc(kbytes);
    assert_int_equal(kern_pack(TK_DTYPE_Q4_K, qk, ko, rk, kk), TK_LAYOUT_X16);
    assert_memory_equal(ko, qk16, kbytes);
    memset(ko, 0x5a, kbytes);
    assert_int_equal(kern_pack(TK_DTYPE_Q4_K, qk, ko, 24, kk), TK_LAYOUT_ROWS);
    for (size_t i = 0; i < kbytes; i++) assert_int_equal((unsigned char)ko[i], 0x5a);
    free(ko);
    free(qk);
    free(qk16);

    /* Q6_K by 16 rows: every row reads back, scales of every sign included */
    char *q6, *q616;
    kt_xr_matrix(TK_DTYPE_Q6_K, &r, TK_LAYOUT_X16, rk, kk, &q6, &q616);
    for (int64_t i = 0; i < rk; i++) {
        tk_block_q6_k *blk = (tk_block_q6_k *)(q6 + i * nbk * (int64_t)sizeof(tk_block_q6_k));
        for (int64_t bk = 0; bk < nbk; bk++) blk[bk].scales[(i + bk) % 16] = (int8_t)-128;
    }
    assert_true(kern_pack_q6_k_x16(q6, q616, rk, kk));
    for (int64_t i = 0; i < rk; i++) {
        kern_dequant_q6_k_ref(q6 + i * nbk * (int64_t)sizeof(tk_block_q6_k), ak, kk);
        kern_dequant_q6_k_x16_row(q616, kk, i, bk2);
        assert_memory_equal(ak, bk2, sizeof ak);
    }
    assert_false(kern_pack_q6_k_x16(q6, q616, 24, kk)); /* rows not a multiple of 16 */
    assert_false(kern_pack_q6_k_x16(q6, q616, 16, 96)); /* k not a multiple of 256 */
    const size_t k6 = (size_t)rk * (size_t)nbk * sizeof(tk_block_q6_k);
    char *o6 = malloc(k6);
    assert_int_equal(kern_pack(TK_DTYPE_Q6_K, q6, o6, rk, kk), TK_LAYOUT_X16);
    assert_memory_equal(o6, q616, k6);
    assert_int_equal(kern_pack(TK_DTYPE_Q6_K, q6, o6, 24, kk), TK_LAYOUT_ROWS);
    free(o6);
    free(q6);
    free(q616);
}

/* The head_dim fallback: a level's kernel takes head_dim % attn_lanes == 0,
 * otherwise the next level down; scalar takes any. A level that runs the one
 * below's kernel (avxvnni) reports that level. */
static void test_simd_attention_fallback(void **state) {
    (void)state;
    static const int hds[] = {1, 8, 16, 20, 40, 64, 72, 128, 0, -8};
    for (int isa = 0; isa <= (int)kernels_top_isa(); isa++)
        for (size_t i = 0; i < sizeof hds / sizeof hds[0]; i++) {
            tk_isa got;
            kv_attn_fn fn = kern_attn_for((tk_isa)isa, hds[i], &got);
            /* below AVX-512 the fallback is AVX2: an AVX-512 CPU may lack AVX-VNNI */
            int want = isa;
            while (want > 0) {
                const int below = want == TK_ISA_AVX512 ? TK_ISA_AVX2 : want - 1;
                if (hds[i] > 0 && hds[i] % kernels_get((tk_isa)want)->attn_lanes == 0 &&
                    kernels_get((tk_isa)want)->attn != kernels_get((tk_isa)below)->attn)
                    break;
                want = below;
            }
            assert_int_equal(got, want);
            assert_true(fn == kernels_get(got)->attn);
            assert_true(kern_attn_for((tk_isa)isa, hds[i], NULL) == fn);
        }
    assert_true(kern_attn_for(TK_ISA_SCALAR, 128, NULL) == kv_attn_ref);
#if defined(__x86_64__)
    assert_int_equal(kernels_top_isa(), TK_ISA_AVX512);
    tk_isa got;
    assert_true(kern_attn_for(TK_ISA_AVX512, 128, &got) == kv_attn_avx512 && got == TK_ISA_AVX512);
    assert_true(kern_attn_for(TK_ISA_AVX512, 40, &got) == kv_attn_avx2 && got == TK_ISA_AVX2);
    assert_true(kern_attn_for(TK_ISA_AVX512, 20, &got) == kv_attn_ref && got == TK_ISA_SCALAR);
    assert_true(kern_attn_for(TK_ISA_AVX2, 128, &got) == kv_attn_avx2 && got == TK_ISA_AVX2);
    assert_true(kern_attn_for(TK_ISA_AVXVNNI, 128, &got) == kv_attn_avxvnni && got == TK_ISA_AVXVNNI);
    assert_true(kern_attn_for(TK_ISA_AVXVNNI, 40, &got) == kv_attn_avxvnni && got == TK_ISA_AVXVNNI);
    assert_true(kern_attn_for(TK_ISA_AVXVNNI, 20, &got) == kv_attn_ref && got == TK_ISA_SCALAR);
    assert_true(kernels_get(TK_ISA_AVXVNNI)->attn_q8 && kernels_get(TK_ISA_AVX512)->attn_q8 &&
                !kernels_get(TK_ISA_AVX2)->attn_q8);
#endif
}

int main(int argc, char **argv) {
    if (argc < 2) {
        const struct CMUnitTest tests[] = {
            cmocka_unit_test(test_simd_tables_complete),
            cmocka_unit_test(test_simd_pack),
            cmocka_unit_test(test_simd_attention_fallback),
        };
        return cmocka_run_group_tests(tests, NULL, NULL);
    }
    int lv = -1;
    for (int i = 0; i < TK_ISA_COUNT; i++)
        if (!strcmp(argv[1], cpu_isa_name((tk_isa)i))) lv = i;
    if (lv < 0) {
        fprintf(stderr, "usage: %s [scalar|avx2|avxvnni|avx512]\n", argv[0]);
        return 2;
    }
    tk_isa level = (tk_isa)lv;
    tk_cpu c;
    cpu_detect(&c);
    if (level > kernels_top_isa() || !cpu_has_isa(&c, level)) {
        printf("SKIP: %s kernels: %s\n", argv[1],
               level > kernels_top_isa() ? "this build has none" : "this CPU does not have the level");
        return 77;
    }
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_prestate(test_simd_gemv, &level),
        cmocka_unit_test_prestate(test_simd_gemv_model_shapes, &level),
        cmocka_unit_test_prestate(test_simd_gemv_raw_blocks, &level),
        cmocka_unit_test_prestate(test_simd_gemv_invariance, &level),
        cmocka_unit_test_prestate(test_simd_quant_act_exact, &level),
        cmocka_unit_test_prestate(test_simd_elementwise, &level),
        cmocka_unit_test_prestate(test_simd_weight_rows, &level),
        cmocka_unit_test_prestate(test_simd_gemv_q8_0_x8, &level),
        cmocka_unit_test_prestate(test_simd_gemv_x16, &level),
        cmocka_unit_test_prestate(test_simd_gemv_qk_x16, &level),
        cmocka_unit_test_prestate(test_simd_gemv_x16s, &level),
        cmocka_unit_test_prestate(test_simd_gemv_bf16_x4, &level),
        cmocka_unit_test_prestate(test_simd_gemv_bf16_p16, &level),
        cmocka_unit_test_prestate(test_simd_attention, &level),
    };
    return cmocka_run_group_tests_name(argv[1], tests, NULL, NULL);
}
