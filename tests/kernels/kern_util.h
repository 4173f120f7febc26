/* Shared helpers for the kernel tests: a seeded generator, Gaussian fills and
 * the normalised mean squared error the tolerances are stated in. */
#ifndef TK_TESTS_KERN_UTIL_H
#define TK_TESTS_KERN_UTIL_H

#include <math.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/kernels_ref.h"

typedef struct {
    uint64_t s;
} kt_rng;

static inline uint32_t kt_u32(kt_rng *r) {
    /* splitmix64: tiny, seedable, good enough for test data */
    uint64_t z = (r->s += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return (uint32_t)((z ^ (z >> 31)) >> 32);
}

static inline int kt_int(kt_rng *r, int lo, int hi) {
    return lo + (int)(kt_u32(r) % (uint32_t)(hi - lo + 1));
}

static inline float kt_unif(kt_rng *r) { return ((float)kt_u32(r) + 0.5f) / 4294967296.0f; }

static inline float kt_gauss(kt_rng *r) {
    float u = kt_unif(r), v = kt_unif(r);
    return sqrtf(-2.0f * logf(u)) * cosf(6.2831853f * v);
}

static inline void kt_fill(kt_rng *r, float *x, int64_t n, float scale) {
    for (int64_t i = 0; i < n; i++) x[i] = scale * kt_gauss(r);
}

/* sum (a-b)^2 / sum b^2 over n values, b the reference; 0 when both are 0. */
static inline double kt_nmse(const float *a, const float *b, int64_t n) {
    double num = 0, den = 0;
    for (int64_t i = 0; i < n; i++) {
        double d = (double)a[i] - (double)b[i];
        num += d * d;
        den += (double)b[i] * b[i];
    }
    if (den == 0) return num == 0 ? 0 : INFINITY;
    return num / den;
}

/* Batch and split invariance of one gemv: a (row, token) result must be
 * bitwise the same computed with all tokens and rows at once, one token at a
 * time, for a middle subset of tokens, or with the rows cut at odd places
 * (the forward pass relies on it: a sequence's logits do not depend on the
 * batch or on the thread split). Needs cmocka.h before this header. */
static inline void kt_check_invariance(tk_gemv_fn fn, tk_dtype t, kt_rng *r, const char *what) {
    const tk_kernels *R = kernels_get(TK_ISA_SCALAR);
    int be = dtype_block_elems(t);
    int64_t k = be == 1 ? 200 + kt_int(r, 0, 40) : be * 3, rows = 13;
    const int n_tok = 7;
    uint64_t rb;
    assert_true(dtype_row_bytes(t, (uint64_t)k, &rb));
    size_t xb = kern_act_row_bytes(t, TK_LAYOUT_ROWS, k);
    float *f = malloc((size_t)k * sizeof *f), all[7 * 13], part[7 * 13];
    char *wq = malloc(rows * rb), *xq = malloc(xb * n_tok);
    for (int64_t i = 0; i < rows; i++) {
        kt_fill(r, f, k, 0.5f);
        assert_true(kern_quantize_row(t, f, wq + i * rb, k));
    }
    for (int i = 0; i < n_tok; i++) {
        kt_fill(r, f, k, 1.0f);
        kern_quant_act(R, t, TK_LAYOUT_ROWS, f, xq + i * xb, k);
    }
    fn(k, wq, 0, rows, xq, xb, n_tok, all, rows);
    for (int i = 0; i < n_tok; i++) fn(k, wq, 0, rows, xq + i * xb, xb, 1, part + i * rows, rows);
    if (memcmp(all, part, sizeof all)) fail_msg("%s %s: one token at a time differs", what, dtype_name(t));
    fn(k, wq, 0, rows, xq + 2 * xb, xb, 3, part + 2 * rows, rows);
    if (memcmp(all, part, sizeof all)) fail_msg("%s %s: tokens 2..4 alone differ", what, dtype_name(t));
    static const int64_t cuts[] = {0, 3, 5, 6, 11, 13};
    for (int c = 0; c + 1 < 6; c++) fn(k, wq, cuts[c], cuts[c + 1], xq, xb, n_tok, part, rows);
    if (memcmp(all, part, sizeof all)) fail_msg("%s %s: rows cut at 3, 5, 6, 11 differ", what, dtype_name(t));
    free(f);
    free(wq);
    free(xq);
}

/* Random rows of type t (Q8_0, Q4_0, Q4_K or Q6_K; rows a multiple of the
 * layout's 8 or 16) and their copy in layout lay (Q8_0: X8, X16 or X16S; the
 * others X16). */
static inline void kt_xr_matrix(tk_dtype t, kt_rng *r, tk_layout lay, int64_t rows, int64_t k, char **wq,
                                char **w8) {
    uint64_t rb;
    assert_true(dtype_row_bytes(t, (uint64_t)k, &rb));
    float *f = malloc((size_t)k * sizeof *f);
    *wq = malloc((size_t)(rows * (int64_t)rb));
    *w8 = malloc((size_t)(rows * (int64_t)rb));
    for (int64_t i = 0; i < rows; i++) {
        kt_fill(r, f, k, 0.5f);
        assert_true(kern_quantize_row(t, f, *wq + i * (int64_t)rb, k));
    }
    /* GGML's Q6_K quantizer gives a sub-block whose largest value is negative
     * a negative scale, ours never does: negate some (and one -128), as real
     * files have them */
    if (t == TK_DTYPE_Q6_K)
        for (int64_t i = 0; i < rows * k / TK_QK_K; i++) {
            tk_block_q6_k *b = (tk_block_q6_k *)*wq + i;
            for (int j = 0; j < TK_QK_K / 16; j++)
                if (kt_int(r, 0, 1)) b->scales[j] = (int8_t)(j == 7 && i % 5 == 0 ? -128 : -b->scales[j]);
        }
    const tk_weight_kernels *w = kern_weight(t, lay);
    assert_true(w && w->pack && w->pack(*wq, *w8, rows, k));
    free(f);
}

/* Rows per group of an interleaved layout. */
static inline int kt_xr_rows(tk_layout lay) { return lay == TK_LAYOUT_X8 ? 8 : 16; }

/* The reference of an interleaved layout of tw, and whether it reads the
 * packed copy: the row-order gemv, or the layout's own scalar gemv where the
 * pack rounds the weights (its activations differ from the row order's:
 * X16S). */
static inline tk_gemv_fn kt_xr_ref(tk_dtype tw, tk_layout lay, bool *packed) {
    *packed = kern_act_type(tw, lay) != kern_act_type(tw, TK_LAYOUT_ROWS);
    return kern_gemv(kernels_get(TK_ISA_SCALAR), tw, *packed ? lay : TK_LAYOUT_ROWS);
}

/* One case of an interleaved gemv of type tw in layout lay against its
 * reference (kt_xr_ref): ragged [r0, r1) (groups cut anywhere), padded
 * activation stride, NaN-filled y to catch stray writes. exact: the result
 * must equal the reference bit for bit (the scalar one). */
static inline void kt_xr_shape(tk_dtype tw, tk_gemv_fn fn, tk_layout lay, kt_rng *r, int64_t rows, int64_t k,
                               int n_tok, bool exact, const char *what) {
    const tk_kernels *R0 = kernels_get(TK_ISA_SCALAR);
    const int R = kt_xr_rows(lay);
    bool packed;
    const tk_gemv_fn ref = kt_xr_ref(tw, lay, &packed);
    int64_t r0 = kt_int(r, 0, (int)rows - 1), r1 = kt_int(r, (int)r0 + 1, (int)rows),
            ldy = rows + kt_int(r, 0, 3);
    /* padding keeps the activation block's alignment (2 bytes Q8_0, 4 Q8_K) */
    const size_t pad = kern_act_type(tw, lay) == TK_DTYPE_Q8_K ? 4 : 2;
    size_t xb = kern_act_row_bytes(tw, lay, k) + (size_t)kt_int(r, 0, 3) * pad;
    char *wq, *w8, *xq = malloc(xb * (size_t)n_tok);
    kt_xr_matrix(tw, r, lay, rows, k, &wq, &w8);
    float *xf = malloc((size_t)k * sizeof *xf), *y = malloc((size_t)(ldy * n_tok) * sizeof *y),
          *want = malloc((size_t)(ldy * n_tok) * sizeof *want);
    for (int i = 0; i < n_tok; i++) {
        kt_fill(r, xf, k, 2.0f);
        kern_quant_act(R0, tw, lay, xf, xq + (size_t)i * xb, k);
    }
    for (int64_t i = 0; i < ldy * n_tok; i++) y[i] = want[i] = NAN;
    ref(k, packed ? w8 : wq, r0, r1, xq, xb, n_tok, want, ldy);
    fn(k, w8, r0, r1, xq, xb, n_tok, y, ldy);
    double num = 0, den = 0;
    for (int t = 0; t < n_tok; t++)
        for (int64_t i = 0; i < ldy; i++) {
            float a = y[t * ldy + i], b = want[t * ldy + i];
            if (i < r0 || i >= r1) {
                if (!isnan(a)) fail_msg("%s: wrote outside rows: t %d row %lld", what, t, (long long)i);
                continue;
            }
            if (exact && memcmp(&a, &b, sizeof a))
                fail_msg("%s: t %d row %lld: %.9g != reference %.9g", what, t, (long long)i, a, b);
            num += ((double)a - b) * ((double)a - b);
            den += (double)b * b;
        }
    if (!(num <= 1e-9 * den))
        fail_msg("%s: %s x%d k %lld rows [%lld,%lld) n_tok %d: nmse %.3g", what, dtype_name(tw), R,
                 (long long)k, (long long)r0, (long long)r1, n_tok, num / den);
    free(wq);
    free(w8);
    free(xq);
    free(xf);
    free(y);
    free(want);
}

/* kt_xr_shape at a random shape: k with odd and even block counts (of the
 * layout's activation blocks), 1..4 groups. */
static inline void kt_xr_case(tk_dtype tw, tk_gemv_fn fn, tk_layout lay, kt_rng *r, int n_tok, bool exact,
                              const char *what) {
    int64_t k = dtype_block_elems(kern_act_type(tw, lay)) * kt_int(r, 1, 12),
            rows = kt_xr_rows(lay) * kt_int(r, 1, 4);
    kt_xr_shape(tw, fn, lay, r, rows, k, n_tok, exact, what);
}

/* kt_check_invariance for an R-row interleaved Q8_0 layout: n_tok tokens
 * (at most 32) against 3 groups, rows cut inside groups too. */
static inline void kt_check_invariance_xr(tk_dtype tw, tk_gemv_fn fn, tk_layout lay, kt_rng *r, int64_t k,
                                          int n_tok, const char *what) {
    const tk_kernels *R0 = kernels_get(TK_ISA_SCALAR);
    const int R = kt_xr_rows(lay);
    const int64_t rows = 3 * R;
    size_t xb = kern_act_row_bytes(tw, lay, k);
    char *wq, *w8, *xq = malloc(xb * (size_t)n_tok);
    kt_xr_matrix(tw, r, lay, rows, k, &wq, &w8);
    float *f = malloc((size_t)k * sizeof *f), all[32 * 48], part[32 * 48];
    const size_t sz = (size_t)(n_tok * rows) * sizeof(float);
    assert_true(n_tok <= 32 && rows <= 48);
    for (int i = 0; i < n_tok; i++) {
        kt_fill(r, f, k, 1.0f);
        kern_quant_act(R0, tw, lay, f, xq + (size_t)i * xb, k);
    }
    fn(k, w8, 0, rows, xq, xb, n_tok, all, rows);
    for (int i = 0; i < n_tok; i++) fn(k, w8, 0, rows, xq + (size_t)i * xb, xb, 1, part + i * rows, rows);
    if (memcmp(all, part, sz)) fail_msg("%s %s x%d: one token at a time differs", what, dtype_name(tw), R);
    fn(k, w8, 0, rows, xq + 2 * xb, xb, n_tok - 4, part + 2 * rows, rows);
    if (memcmp(all, part, sz))
        fail_msg("%s %s x%d: tokens 2..%d alone differ", what, dtype_name(tw), R, n_tok - 3);
    const int64_t cuts[] = {0, 3, 5, R, R + 5, 2 * R, 3 * R - 1, 3 * R};
    for (int c = 0; c + 1 < 8; c++) fn(k, w8, cuts[c], cuts[c + 1], xq, xb, n_tok, part, rows);
    if (memcmp(all, part, sz)) fail_msg("%s %s x%d: rows cut inside groups differ", what, dtype_name(tw), R);
    free(f);
    free(wq);
    free(w8);
    free(xq);
}

/* A BF16 gemv case: rows x k Gaussian BF16 weights (0.5) in file order and a
 * buffer of the same size for a packed copy, n_tok Gaussian activation rows
 * (1.0) with a ragged stride, a ragged [r0, r1) and ldy, and two outputs. */
typedef struct {
    int64_t r0, r1, ldy;
    size_t xs;
    uint16_t *w, *wp;
    float *x, *y, *want;
} kt_bf16_case;

static inline void kt_bf16_case_make(kt_rng *r, int64_t rows, int64_t k, int n_tok, kt_bf16_case *c) {
    c->r0 = kt_int(r, 0, (int)rows - 1);
    c->r1 = kt_int(r, (int)c->r0 + 1, (int)rows);
    c->ldy = rows + kt_int(r, 0, 3);
    c->xs = (size_t)k * sizeof(float) + (size_t)kt_int(r, 0, 3) * 4;
    float *f = malloc((size_t)k * sizeof *f);
    c->x = malloc(c->xs * (size_t)n_tok);
    c->w = malloc((size_t)(rows * k) * 2);
    c->wp = malloc((size_t)(rows * k) * 2);
    c->y = malloc((size_t)(c->ldy * n_tok) * sizeof *c->y);
    c->want = malloc((size_t)(c->ldy * n_tok) * sizeof *c->want);
    for (int64_t i = 0; i < rows; i++) {
        kt_fill(r, f, k, 0.5f);
        for (int64_t j = 0; j < k; j++) c->w[i * k + j] = tk_f32_to_bf16(f[j]);
    }
    for (int t = 0; t < n_tok; t++) kt_fill(r, (float *)((char *)c->x + (size_t)t * c->xs), k, 1.0f);
    free(f);
}

static inline void kt_bf16_case_free(kt_bf16_case *c) {
    free(c->x);
    free(c->w);
    free(c->wp);
    free(c->y);
    free(c->want);
}

/* An interleaved BF16 gemv (4-row layout) against a row-order one: random
 * rows (a multiple of 4), k a multiple of 16, ragged [r0, r1), NaN-filled y;
 * the results must be the same bits (the layouts differ only in addresses). */
static inline void kt_bf16_x4_case(tk_gemv_fn x4, tk_gemv_fn rows_fn, kt_rng *r, int n_tok,
                                   const char *what) {
    int64_t k = 16 * kt_int(r, 1, 40), rows = 4 * kt_int(r, 1, 6);
    kt_bf16_case c;
    kt_bf16_case_make(r, rows, k, n_tok, &c);
    assert_true(kern_pack_bf16_x4(c.w, c.wp, rows, k));
    for (int64_t i = 0; i < c.ldy * n_tok; i++) c.y[i] = c.want[i] = NAN;
    rows_fn(k, c.w, c.r0, c.r1, c.x, c.xs, n_tok, c.want, c.ldy);
    x4(k, c.wp, c.r0, c.r1, c.x, c.xs, n_tok, c.y, c.ldy);
    for (int64_t i = 0; i < c.ldy * n_tok; i++)
        if (memcmp(&c.y[i], &c.want[i], sizeof *c.y) && !(isnan(c.y[i]) && isnan(c.want[i])))
            fail_msg("%s bf16 x4: k %lld rows [%lld,%lld) n_tok %d: output %lld %.9g != row layout %.9g",
                     what, (long long)k, (long long)c.r0, (long long)c.r1, n_tok, (long long)i, c.y[i],
                     c.want[i]);
    kt_bf16_case_free(&c);
}

#endif
