/* The x86 kernel bodies, shared by kernels_avx2.c and kernels_avx512.c. Each
 * of those files defines, before including this one:
 *   KFN(name)            the exported name, e.g. kern_name_avx2
 *   KNT                  the token tile for float and Q8_0/Q4_0 weights:
 *                        accumulators per row (2 fit AVX2's 16 registers,
 *                        4 AVX-512's 32)
 *   KNT_K                the same for Q4_K/Q6_K, whose per-row setup (scale
 *                        unpacking) pays to share across more tokens
 *   dot_s8(aw, w, x)     8 int32 lanes that sum to dot(w, x) over 32 int8
 *                        pairs, given aw = |w| (the sign trick)
 *   dot_u8s8(u, x)       8 int32 lanes that sum to dot(u, x), u unsigned
 *                        (at most 127 here, so maddubs cannot saturate)
 *   dot_s8_acc(a, aw, w, x)  a plus the 4-element dots of int32 lane pairs
 *                        (lane i += dot of bytes 4i..4i+3 of w and x)
 *   KNT_X8               the token tile of the 8-row interleaved Q8_0
 *                        kernel (two registers per token: 4 on AVX2, 8 on
 *                        AVX-512), and of the 16-row ones unless KNT_X16
 *                        says otherwise
 * and optionally dot_u8s8_acc(a, u, x) (a + dot_u8s8, one op with VNNI) and
 * X16_FLIP (dot_u8s8 takes u up to 255: Q8_0 X16 by unsigned weights, as the
 * 512-bit kernel; kernels_avxvnni.c; without it Q8_0 X16 uses dot_s8),
 * and is compiled with its own target flags, so the same source becomes two
 * binaries: the AVX2 one is what the tests run here, the AVX-512 one differs
 * only in those definitions (VNNI dots) and in the wider register file the
 * compiler gets. Tests build the AVX2 file with KNT=4 too, so the tiles the
 * AVX-512 build uses are exercised on machines without AVX-512.
 *
 * gemv layout: rows in groups of 4 (activation blocks are loaded once per
 * group), tokens in tiles of KNT inside a group, so a group's weights stay in L1
 * while every token tile reads them: each weight byte comes from memory once
 * per call. Accumulators stay in registers; horizontal sums happen once per
 * output. Not thread-aware: callers split [r0, r1) across threads. */
#if !defined(KFN) || !defined(KNT) || !defined(KNT_K) || !defined(KNT_X8)
#error "define KFN, KNT, KNT_K, KNT_X8, dot_s8, dot_s8_acc and dot_u8s8 before including simd_body.h"
#endif

#include <immintrin.h>
#include <math.h>
#include <stdbool.h>
#include <string.h>

#include "kernels/x86/cut_tile.h"
#include "kernels/x86/exp_core.h"

#define AI static inline __attribute__((always_inline))

/* ---- small helpers ---------------------------------------------------------------- */

/* Keeps an integer sum one chain in its register, step after step: integer
 * adds may be regrouped, and GCC otherwise builds a tile's chunk sums into
 * trees whose partial sums spill to the stack (the 256-bit Q8_0 tile stored
 * about ten a block at four tokens: batch-32 projections 1.25-1.5x slower
 * at avx2). The same integers either way. */
AI void keep_sum(__m256i *v) { __asm__("" : "+x"(*v)); }

/* Four horizontal sums at once: lane i of the result is the sum of a_i. */
AI __m128 hsum8x4(__m256 a0, __m256 a1, __m256 a2, __m256 a3) {
    __m256 s01 = _mm256_hadd_ps(a0, a1), s23 = _mm256_hadd_ps(a2, a3);
    __m256 s = _mm256_hadd_ps(s01, s23);
    return _mm_add_ps(_mm256_castps256_ps128(s), _mm256_extractf128_ps(s, 1));
}

/* One horizontal sum in exactly the order hsum8x4 uses, so a row's result is
 * the same whether it falls in a 4-row group or in the tail rows (row-split
 * invariance: threads may cut [r0, r1) anywhere). */
AI float hsum8(__m256 v) { return _mm_cvtss_f32(hsum8x4(v, v, v, v)); }

AI float f16_to_f32(tk_f16 h) { return _cvtsh_ss(h); }

/* The hardware prefetchers lose track of four short interleaved row streams
 * (a row is ~1 KB), so each tile fetches the same offset one row group ahead.
 * Prefetches never fault; the address is formed as an integer so running past
 * the matrix end is not pointer arithmetic out of bounds either. */
/* How far ahead the 8-row interleaved Q8_0 kernel fetches its one stream
 * (bytes; 0 turns the software prefetch off). */
#ifndef X8_PREFETCH
#define X8_PREFETCH 2048
#endif

AI void prefetch_ahead(const void *p, size_t dist) {
    _mm_prefetch((const char *)((uintptr_t)p + dist), _MM_HINT_T0);
}

/* Write the NR x NT tile of sums; rows are contiguous in y for one token. */
AI void store_tile(__m256 acc[4][4], int nr, int nt, float *y, int64_t ldy, int64_t r) {
#pragma GCC unroll 4
    for (int t = 0; t < nt; t++) {
        if (nr == 4) {
            _mm_storeu_ps(y + t * ldy + r, hsum8x4(acc[0][t], acc[1][t], acc[2][t], acc[3][t]));
        } else {
#pragma GCC unroll 4
            for (int i = 0; i < nr; i++) y[t * ldy + r + i] = hsum8(acc[i][t]);
        }
    }
}

/* Runs the NR x NT tiles over [r0, r1) x [0, n_tok): NR in {4, 1}, NT up to
 * NTMAX (how many token accumulators the registers hold), each a
 * compile-time constant after inlining. */
#define GEMV_DRIVE(TILE, NTMAX, ...)                                                                         \
    do {                                                                                                     \
        int64_t r_ = r0;                                                                                     \
        for (; r_ + 4 <= r1; r_ += 4) {                                                                      \
            int t_ = 0;                                                                                      \
            for (; t_ + NTMAX <= n_tok; t_ += NTMAX) TILE(__VA_ARGS__, r_, t_, 4, NTMAX);                    \
            switch (n_tok - t_) {                                                                            \
            case 3:                                                                                          \
                TILE(__VA_ARGS__, r_, t_, 4, 3);                                                             \
                break;                                                                                       \
            case 2:                                                                                          \
                TILE(__VA_ARGS__, r_, t_, 4, 2);                                                             \
                break;                                                                                       \
            case 1:                                                                                          \
                TILE(__VA_ARGS__, r_, t_, 4, 1);                                                             \
                break;                                                                                       \
            default:                                                                                         \
                break;                                                                                       \
            }                                                                                                \
        }                                                                                                    \
        for (; r_ < r1; r_++) {                                                                              \
            int t_ = 0;                                                                                      \
            for (; t_ + NTMAX <= n_tok; t_ += NTMAX) TILE(__VA_ARGS__, r_, t_, 1, NTMAX);                    \
            switch (n_tok - t_) {                                                                            \
            case 3:                                                                                          \
                TILE(__VA_ARGS__, r_, t_, 1, 3);                                                             \
                break;                                                                                       \
            case 2:                                                                                          \
                TILE(__VA_ARGS__, r_, t_, 1, 2);                                                             \
                break;                                                                                       \
            case 1:                                                                                          \
                TILE(__VA_ARGS__, r_, t_, 1, 1);                                                             \
                break;                                                                                       \
            default:                                                                                         \
                break;                                                                                       \
            }                                                                                                \
        }                                                                                                    \
    } while (0)

/* ---- float weights (f32, f16, bf16) x f32 activations --------------------------------- */

enum { WT_F32, WT_F16, WT_BF16 };

AI __m256 load8_w(const void *w, int64_t i, int wt) {
    if (wt == WT_F32) return _mm256_loadu_ps((const float *)w + i);
    __m128i h = _mm_loadu_si128((const __m128i *)((const uint16_t *)w + i));
    if (wt == WT_F16) return _mm256_cvtph_ps(h);
    /* bf16 is the top half of an f32: widen and shift into place */
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
}

AI float dot_tail(int wt, const void *w, const float *x, int64_t n) {
    if (wt == WT_F32) return kern_dot_f32_ref(w, x, n);
    if (wt == WT_F16) return kern_dot_f16_ref(w, x, n);
    return kern_dot_bf16_ref(w, x, n);
}

/* One FMA chain per (row, token) in every tile shape, so a token's result does
 * not depend on how many tokens share its tile (batch invariance); a lone
 * token's four row chains still cover most of the FMA latency. */
AI void float_tile(int wt, int64_t k, const void *w, const void *x, size_t xs, float *y, int64_t ldy,
                   int64_t r, int t0, int nr, int nt) {
    const size_t esz = wt == WT_F32 ? 4 : 2;
    const char *wr[4];
    const float *xt[4];
#pragma GCC unroll 4
    for (int i = 0; i < nr; i++) wr[i] = (const char *)w + (size_t)(r + i) * (size_t)k * esz;
#pragma GCC unroll 4
    for (int t = 0; t < nt; t++) xt[t] = (const float *)((const char *)x + (size_t)(t0 + t) * xs);
    __m256 acc[4][4];
#pragma GCC unroll 4
    for (int i = 0; i < nr; i++)
#pragma GCC unroll 4
        for (int t = 0; t < nt; t++) acc[i][t] = _mm256_setzero_ps();
    const int64_t kv = k / 8 * 8;
    for (int64_t j = 0; j < kv; j += 8) {
        __m256 xv[4];
#pragma GCC unroll 4
        for (int t = 0; t < nt; t++) xv[t] = _mm256_loadu_ps(xt[t] + j);
#pragma GCC unroll 4
        for (int i = 0; i < nr; i++) {
            __m256 wv = load8_w(wr[i], j, wt);
            prefetch_ahead(wr[i] + (size_t)j * esz, 4 * (size_t)k * esz);
#pragma GCC unroll 4
            for (int t = 0; t < nt; t++) acc[i][t] = _mm256_fmadd_ps(wv, xv[t], acc[i][t]);
        }
    }
    store_tile(acc, nr, nt, y, ldy, r);
    if (kv < k)
        for (int t = 0; t < nt; t++)
            for (int i = 0; i < nr; i++)
                y[t * ldy + r + i] += dot_tail(wt, wr[i] + (size_t)kv * esz, xt[t] + kv, k - kv);
}

/* BF16 without widening: a 32-bit lane holds elements (2i, 2i+1), so a shift
 * gives the even ones as f32 and a mask the odd ones, against activations
 * split into even and odd vectors once per step for the whole row group.
 * One load and two ALU ops per 16 weights instead of two widening loads.
 * Even then odd into one chain per (row, token), whatever the tile shape. */
AI void bf16_tile(int x4, int64_t k, const void *w, const void *x, size_t xs, float *y, int64_t ldy,
                  int64_t r, int t0, int nr, int nt) {
    /* x4: rows interleaved by 4 in 16-element chunks (TK_LAYOUT_X4): a row's
     * chunks are 64 elements apart and the tile reads one stream. */
    const size_t cs = x4 ? 64 : 16;
    const size_t pf = x4 ? 2048 : 8 * (size_t)k;
    const uint16_t *wr[4];
    const float *xt[4];
#pragma GCC unroll 4
    for (int i = 0; i < nr; i++)
        wr[i] = x4 ? (const uint16_t *)w + (size_t)((r + i) / 4) * 4 * (size_t)k + (size_t)((r + i) % 4) * 16
                   : (const uint16_t *)w + (size_t)(r + i) * (size_t)k;
#pragma GCC unroll 4
    for (int t = 0; t < nt; t++) xt[t] = (const float *)((const char *)x + (size_t)(t0 + t) * xs);
    __m256 acc[4][4];
#pragma GCC unroll 4
    for (int i = 0; i < nr; i++)
#pragma GCC unroll 4
        for (int t = 0; t < nt; t++) acc[i][t] = _mm256_setzero_ps();
    const __m256i hi = _mm256_set1_epi32((int)0xffff0000u);
    const int64_t kv = k / 16 * 16;
    for (int64_t j = 0; j < kv; j += 16) {
        __m256 xe[4], xo[4];
#pragma GCC unroll 4
        for (int t = 0; t < nt; t++) {
            __m256 a = _mm256_loadu_ps(xt[t] + j), b = _mm256_loadu_ps(xt[t] + j + 8);
            /* [x0 x2 x8 x10 | x4 x6 x12 x14], then the middle 64-bit pairs swapped */
            __m256 e = _mm256_shuffle_ps(a, b, 0x88), o = _mm256_shuffle_ps(a, b, 0xdd);
            xe[t] = _mm256_castpd_ps(_mm256_permute4x64_pd(_mm256_castps_pd(e), 0xd8));
            xo[t] = _mm256_castpd_ps(_mm256_permute4x64_pd(_mm256_castps_pd(o), 0xd8));
        }
#pragma GCC unroll 4
        for (int i = 0; i < nr; i++) {
            const uint16_t *c = wr[i] + (size_t)(j / 16) * cs;
            __m256i v = _mm256_loadu_si256((const __m256i *)c);
            prefetch_ahead(c, pf);
            __m256 we = _mm256_castsi256_ps(_mm256_slli_epi32(v, 16));
            __m256 wo = _mm256_castsi256_ps(_mm256_and_si256(v, hi));
#pragma GCC unroll 4
            for (int t = 0; t < nt; t++) {
                acc[i][t] = _mm256_fmadd_ps(we, xe[t], acc[i][t]);
                acc[i][t] = _mm256_fmadd_ps(wo, xo[t], acc[i][t]);
            }
        }
    }
    store_tile(acc, nr, nt, y, ldy, r);
    if (kv < k) /* row layout only: X4 needs k % 16 == 0 */
        for (int t = 0; t < nt; t++)
            for (int i = 0; i < nr; i++)
                y[t * ldy + r + i] += kern_dot_bf16_ref(wr[i] + kv, xt[t] + kv, k - kv);
}

#define BF16_TILE(x4, k, w, x, xs, y, ldy, r, t, nr, nt)                                                     \
    bf16_tile(x4, k, w, x, xs, y + (t) * (ldy), ldy, r, t, nr, nt)

#define FLOAT_TILE(wt, k, w, x, xs, y, ldy, r, t, nr, nt)                                                    \
    float_tile(wt, k, w, x, xs, y + (t) * (ldy), ldy, r, t, nr, nt)

void KFN(gemv_f32)(int64_t k, const void *w, int64_t r0, int64_t r1, const void *xq, size_t xq_stride,
                   int n_tok, float *y, int64_t ldy) {
    GEMV_DRIVE(FLOAT_TILE, KNT, WT_F32, k, w, xq, xq_stride, y, ldy);
}

void KFN(gemv_f16)(int64_t k, const void *w, int64_t r0, int64_t r1, const void *xq, size_t xq_stride,
                   int n_tok, float *y, int64_t ldy) {
    GEMV_DRIVE(FLOAT_TILE, KNT, WT_F16, k, w, xq, xq_stride, y, ldy);
}

void KFN(gemv_bf16)(int64_t k, const void *w, int64_t r0, int64_t r1, const void *xq, size_t xq_stride,
                    int n_tok, float *y, int64_t ldy) {
    GEMV_DRIVE(BF16_TILE, KNT, 0, k, w, xq, xq_stride, y, ldy);
}

/* BF16 interleaved by 4 rows (kernels.h): the same chains as gemv_bf16, so
 * the same bits, read as one stream. */
void KFN(gemv_bf16_x4)(int64_t k, const void *w, int64_t r0, int64_t r1, const void *xq, size_t xq_stride,
                       int n_tok, float *y, int64_t ldy) {
    GEMV_DRIVE(BF16_TILE, KNT, 1, k, w, xq, xq_stride, y, ldy);
}

/* ---- Q8_0 and Q4_0 weights x Q8_0 activations ------------------------------------------ */

/* 32 weights of a block: Q8_0 as stored (signed), Q4_0 as its unsigned
 * nibbles 0..15 (the -8 is applied to the activation sums instead). */
AI __m256i load_q8_0(const void *row, int64_t b) {
    return _mm256_loadu_si256((const __m256i *)((const tk_block_q8_0 *)row)[b].qs);
}

AI __m256i load_q4_0(const void *row, int64_t b) {
    __m128i q = _mm_loadu_si128((const __m128i *)((const tk_block_q4_0 *)row)[b].qs);
    /* low nibbles are elements 0..15, high nibbles 16..31 */
    __m256i v = _mm256_set_m128i(_mm_srli_epi16(q, 4), q);
    return _mm256_and_si256(v, _mm256_set1_epi8(0x0f));
}

AI tk_f16 block_d(int q4, const char *row, int64_t b) {
    return q4 ? ((const tk_block_q4_0 *)row)[b].d : ((const tk_block_q8_0 *)row)[b].d;
}

/* Weight scales of four rows' block b as [d0 d1 d2 d3 | d0 d1 d2 d3]: one
 * conversion for the group instead of one per row. */
AI __m256 scales4(int q4, const char *const wr[4], int64_t b) {
    __m128i h = _mm_setr_epi16((short)block_d(q4, wr[0], b), (short)block_d(q4, wr[1], b),
                               (short)block_d(q4, wr[2], b), (short)block_d(q4, wr[3], b), 0, 0, 0, 0);
    __m128 f = _mm_cvtph_ps(h);
    return _mm256_set_m128(f, f);
}

AI void q8_tile(int q4, int64_t nb, const void *w, const void *x, size_t xs, float *y, int64_t ldy, int64_t r,
                int t0, int nr, int nt) {
    const size_t bb = q4 ? sizeof(tk_block_q4_0) : sizeof(tk_block_q8_0), rb = (size_t)nb * bb;
    const char *wr[4];
    const tk_block_q8_0 *xt[4];
#pragma GCC unroll 4
    for (int i = 0; i < nr; i++) wr[i] = (const char *)w + (size_t)(r + i) * rb;
#pragma GCC unroll 4
    for (int t = 0; t < nt; t++) xt[t] = (const tk_block_q8_0 *)((const char *)x + (size_t)(t0 + t) * xs);
    __m256 acc[4][4];
#pragma GCC unroll 4
    for (int i = 0; i < nr; i++)
#pragma GCC unroll 4
        for (int t = 0; t < nt; t++) acc[i][t] = _mm256_setzero_ps();
    for (int64_t b = 0; b < nb; b++) {
        __m256i xv[4], xoff[4];
        __m256 dx[4], sc[4][4];
#pragma GCC unroll 4
        for (int t = 0; t < nt; t++) {
            xv[t] = _mm256_loadu_si256((const __m256i *)xt[t][b].qs);
            dx[t] = _mm256_set1_ps(f16_to_f32(xt[t][b].d));
            /* Q4_0: sum((q - 8) x) = sum(q x) - 8 sum(x), the second term once per token */
            if (q4) xoff[t] = dot_u8s8(_mm256_set1_epi8(8), xv[t]);
        }
        if (nr == 4) {
            __m256 d4 = scales4(q4, wr, b);
#pragma GCC unroll 4
            for (int t = 0; t < nt; t++) {
                __m256 s = _mm256_mul_ps(d4, dx[t]);
                sc[0][t] = _mm256_permute_ps(s, 0x00);
                sc[1][t] = _mm256_permute_ps(s, 0x55);
                sc[2][t] = _mm256_permute_ps(s, 0xaa);
                sc[3][t] = _mm256_permute_ps(s, 0xff);
            }
        } else {
#pragma GCC unroll 4
            for (int t = 0; t < nt; t++)
                sc[0][t] = _mm256_mul_ps(_mm256_set1_ps(f16_to_f32(block_d(q4, wr[0], b))), dx[t]);
        }
#pragma GCC unroll 4
        for (int i = 0; i < nr; i++) {
            if (((uintptr_t)(wr[i] + (size_t)b * bb) & 63) < bb)
                prefetch_ahead(wr[i] + (size_t)b * bb, 4 * rb);
            if (q4) {
                __m256i wv = load_q4_0(wr[i], b);
#pragma GCC unroll 4
                for (int t = 0; t < nt; t++) {
                    __m256i p = _mm256_sub_epi32(dot_u8s8(wv, xv[t]), xoff[t]);
                    acc[i][t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(p), sc[i][t], acc[i][t]);
                }
            } else {
                __m256i wv = load_q8_0(wr[i], b);
                __m256i aw = _mm256_sign_epi8(wv, wv);
#pragma GCC unroll 4
                for (int t = 0; t < nt; t++)
                    acc[i][t] =
                        _mm256_fmadd_ps(_mm256_cvtepi32_ps(dot_s8(aw, wv, xv[t])), sc[i][t], acc[i][t]);
            }
        }
    }
    store_tile(acc, nr, nt, y, ldy, r);
}

#define Q8_TILE(q4, nb, w, x, xs, y, ldy, r, t, nr, nt)                                                      \
    q8_tile(q4, nb, w, x, xs, y + (t) * (ldy), ldy, r, t, nr, nt)

void KFN(gemv_q8_0)(int64_t k, const void *w, int64_t r0, int64_t r1, const void *xq, size_t xq_stride,
                    int n_tok, float *y, int64_t ldy) {
    GEMV_DRIVE(Q8_TILE, KNT, 0, k / TK_QK8_0, w, xq, xq_stride, y, ldy);
}

void KFN(gemv_q4_0)(int64_t k, const void *w, int64_t r0, int64_t r1, const void *xq, size_t xq_stride,
                    int n_tok, float *y, int64_t ldy) {
    GEMV_DRIVE(Q8_TILE, KNT, 1, k / TK_QK4_0, w, xq, xq_stride, y, ldy);
}

/* ---- Q8_0 weights interleaved by 8 rows (TK_LAYOUT_X8) x Q8_0 activations ------------- */

/* One vector holds the same four k of eight rows (kernels.h describes the
 * layout), so a broadcast 4-byte activation chunk against it gives eight row
 * partial sums in the eight int32 lanes: no horizontal sums, one sequential
 * stream of weights, and a block's integer dot is exact before its one scale
 * multiply. A (row, token) result is one chain over the blocks whatever the
 * tile, so it does not depend on the batch. */
AI void x8_tile(int64_t nb, const unsigned char *g, const void *x, size_t xs, float *y, int64_t ldy, int nt) {
    const size_t bb = 8 * 34;
    const tk_block_q8_0 *xt[KNT_X8];
#pragma GCC unroll 8
    for (int t = 0; t < nt; t++) xt[t] = (const tk_block_q8_0 *)((const char *)x + (size_t)t * xs);
    __m256 acc[KNT_X8];
#pragma GCC unroll 8
    for (int t = 0; t < nt; t++) acc[t] = _mm256_setzero_ps();
    for (int64_t b = 0; b < nb; b++) {
        const unsigned char *blk = g + (size_t)b * bb, *qb = blk + 16;
        /* the weights are one stream per thread: fetch a few blocks ahead */
        if (X8_PREFETCH > 0)
#pragma GCC unroll 9
            for (int o = 0; o < (int)bb; o += 64) prefetch_ahead(blk + o, X8_PREFETCH);
        __m256i is[KNT_X8];
#pragma GCC unroll 8
        for (int t = 0; t < nt; t++) is[t] = _mm256_setzero_si256();
#pragma GCC unroll 8
        for (int c = 0; c < 8; c++) {
            __m256i wv = _mm256_loadu_si256((const __m256i *)(qb + 32 * c));
            __m256i aw = _mm256_sign_epi8(wv, wv);
#pragma GCC unroll 8
            for (int t = 0; t < nt; t++) {
                int32_t xi;
                memcpy(&xi, xt[t][b].qs + 4 * c, 4);
                is[t] = dot_s8_acc(is[t], aw, wv, _mm256_set1_epi32(xi));
                keep_sum(&is[t]);
            }
        }
        __m256 dw = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)blk));
#pragma GCC unroll 8
        for (int t = 0; t < nt; t++) {
            __m256 d = _mm256_mul_ps(dw, _mm256_set1_ps(f16_to_f32(xt[t][b].d)));
            acc[t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(is[t]), d, acc[t]);
        }
    }
#pragma GCC unroll 8
    for (int t = 0; t < nt; t++) _mm256_storeu_ps(y + (size_t)t * (size_t)ldy, acc[t]);
}

/* Runs the whole 8-row groups that [r0, r1) touches; a group cut by r0 or r1
 * is computed whole into a scratch tile and only its rows in range are
 * copied, so every row's value is the same wherever the range is cut. */
void KFN(gemv_q8_0_x8)(int64_t k, const void *w, int64_t r0, int64_t r1, const void *xq, size_t xq_stride,
                       int n_tok, float *y, int64_t ldy) {
    const int64_t nb = k / TK_QK8_0;
    const size_t gb = (size_t)nb * 8 * 34;
    for (int64_t g0 = r0 / 8 * 8; g0 < r1; g0 += 8) {
        const unsigned char *g = (const unsigned char *)w + (size_t)(g0 / 8) * gb;
        bool whole = g0 >= r0 && g0 + 8 <= r1;
        for (int t = 0; t < n_tok; t += KNT_X8) {
            int nt = n_tok - t < KNT_X8 ? n_tok - t : KNT_X8;
            float tmp[KNT_X8 * 8];
            float *dst = whole ? y + (size_t)t * (size_t)ldy + g0 : tmp;
            int64_t ld = whole ? ldy : 8;
            const void *xt = (const char *)xq + (size_t)t * xq_stride;
            switch (nt) {
#define X8_CASE(n)                                                                                           \
    case n:                                                                                                  \
        x8_tile(nb, g, xt, xq_stride, dst, ld, n);                                                           \
        break;
                X8_CASE(1)
                X8_CASE(2)
                X8_CASE(3)
                X8_CASE(4)
#if KNT_X8 > 4
                X8_CASE(5)
                X8_CASE(6)
                X8_CASE(7)
                X8_CASE(8)
#endif
#undef X8_CASE
            default:
                break;
            }
            if (!whole) cut_tile_store(y + (size_t)t * (size_t)ldy, ldy, tmp, 8, nt, g0, r0, r1);
        }
    }
}

/* ---- 16-row interleaved Q8_0 and Q4_0 (TK_LAYOUT_X16), Q8_0 by 256 (X16S) ---------------- */

/* The VNNI dot is u8 x s8. Q8_0 weights are made unsigned by w ^ 0x80
 * (= w + 128, one op per 64 weights, shared by the token tile), Q4_0 ones
 * are their 0..15 nibbles; the activations stay signed, so
 * sum(u x) - off * sum(x) (off 128 or 8) is the exact integer block dot.
 *
 * Three kinds of block share the tiles: X16's Q8_0 and Q4_0 blocks of 32
 * values (8 four-byte chunks, f16 scales, Q8_0 activations) and X16S's of
 * 256 (64 chunks, f32 scales, Q8_K activations): one integer chain and one
 * scale step per block either way.
 *
 * The activations of a call are rewritten once (x16_act) into a table read
 * by one pointer: per token tile of nt tokens and per block, the block's
 * four-byte chunks of the nt tokens (chunk-major), then the nt corrections
 * -off * sum(x) that start each block's integer chain, then the nt activation
 * scales as floats: x16_ent words per (token, block). A tile's loop then
 * addresses every activation operand at a constant offset from one pointer
 * (a broadcast memory operand of its instruction), instead of keeping one
 * pointer per token in registers. */
enum { X16_Q8, X16_Q4, X16_Q8S };
AI int x16_chunks(int kind) { return kind == X16_Q8S ? TK_QK_K / 4 : TK_QK8_0 / 4; }
AI int x16_ent(int kind) { return x16_chunks(kind) + 2; } /* chunks, correction, scale */
AI size_t x16_block_bytes(int kind) {
    return kind == X16_Q4 ? 288 : kind == X16_Q8S ? TK_X16S_BLOCK_BYTES : 544;
}
AI size_t x16_head_bytes(int kind) { return kind == X16_Q8S ? 64 : 32; } /* the 16 scales */
#ifndef X16_ACT_MAX
#define X16_ACT_MAX 7168 /* Q8_0 (token, block) terms per pass: 280 KB of stack */
#endif
#define X16_TAB_WORDS (X16_ACT_MAX * (TK_QK8_0 / 4 + 2)) /* x16_ent(X16_Q8) words each */
/* How far ahead the 512-bit X16 tile fetches its weight stream (bytes; 0
 * turns it off): 4 KB (~7 Q8_0 blocks of 16 rows) read a DRAM-resident
 * matrix faster than 2 KB at 1 and at 32 tokens, 8 KB no better. */
#ifndef X16_PREFETCH
#define X16_PREFETCH 4096
#endif
/* A tile's prefetch (x16_tile's nx): X16_AHEAD fetches its own weight
 * stream X16_PREFETCH ahead; another pointer, the next group's weights into
 * L2; NULL nothing. X16_NEXT 0 leaves every tile to its own stream. */
#define X16_AHEAD ((const unsigned char *)1)
#ifndef X16_NEXT
#define X16_NEXT 1
#endif

/* The prefetch (x16_tile_fetch's nx) of the Q4_K/Q6_K token tile starting at
 * token t of a group's tiles of nt_max: the first streams the group's
 * weights X16_PREFETCH ahead; the second, which reads them from cache,
 * fetches the next group's (next, when g0 + 16 < r1: still this call's) into
 * L2, so the next first tile does not wait on DRAM alone; later tiles fetch
 * nothing. */
AI const unsigned char *x16_tile_fetch(int t, int nt_max, int64_t g0, int64_t r1, const unsigned char *next) {
    if (t == 0) return X16_AHEAD;
    return t == nt_max && X16_NEXT && g0 + 16 < r1 ? next : NULL;
}
/* A Q8_0/Q4_0 X16 (and X16S) tile's prefetch. The tiles of a unit (the
 * groups one tile reads) run one after another over its weights: the first
 * (ahead) streams them X16_PREFETCH ahead, the later ones read them from
 * cache and share the next unit's blocks (next: ng groups gb bytes apart),
 * fetching into L2 those b with b % step == phase, so the next first tile
 * does not wait on DRAM alone and the reads stay spread over the unit's
 * time. A Q8_0 pass of one token (batch-1 decode) asks for nothing ahead
 * (ahead false): its tile is bound by the weight stream alone, which the
 * hardware prefetcher keeps full, and the asks cost it (docs/notes.md:
 * batch-1 projections ~1.1x faster without them on the AMD EPYC, X16 and
 * X16S alike; Q4_0's, with more work per byte, kept them). A level that
 * defines X16_AHEAD_ONE 1 asks for Q8_0's too: the AVX2 sign-trick tile,
 * with ~5 ops per 4-byte chunk and half-width loads, keeps too few reads in
 * flight on its own (batch-1 Q8_0 1.2x faster with the asks; AVX-VNNI's
 * tile 1.04x slower, so it does not). */
#ifndef X16_AHEAD_ONE
#define X16_AHEAD_ONE 0
#endif
typedef struct x16_pf {
    bool ahead;
    const unsigned char *next;
    int ng, phase, step;
} x16_pf;
/* Tile i of n of a unit whose next unit (ngn groups from next; 0: none in
 * this call) follows. */
AI x16_pf x16_unit_fetch(int i, int n, bool ahead, const unsigned char *next, int ngn) {
    x16_pf pf = {i == 0 && ahead, i > 0 && ngn > 0 && X16_NEXT ? next : NULL, ngn, i - 1, n > 1 ? n - 1 : 1};
    return pf;
}
/* Tile pf's prefetch for block b (bb bytes at blk in each of its ng groups,
 * gb bytes apart). */
AI void x16_fetch(x16_pf pf, const unsigned char *blk, size_t gb, int ng, int64_t b, size_t bb) {
    if (pf.ahead) {
        if (X16_PREFETCH > 0)
            for (int j = 0; j < ng; j++)
#pragma GCC unroll 9
                for (int o = 0; o < (int)bb; o += 64) prefetch_ahead(blk + (size_t)j * gb + o, X16_PREFETCH);
    } else if (pf.next && b % pf.step == pf.phase) {
        for (int j = 0; j < pf.ng; j++)
#pragma GCC unroll 9
            for (int o = 0; o < (int)bb; o += 64)
                _mm_prefetch((const char *)(pf.next + (size_t)j * gb + (size_t)b * bb + o), _MM_HINT_T1);
    }
}
/* Tile pf's prefetch for chunks c0..c0 + 7 of block b: each eight chunks
 * fetch their share of the block (an X16 block whole, an eighth of an X16S
 * one), so the asks stay spread over the block's work. */
AI void x16_fetch_chunks(x16_pf pf, int kind, const unsigned char *blk, size_t gb, int ng, int64_t b,
                         int c0) {
    const int parts = x16_chunks(kind) / 8;
    const size_t fu = x16_block_bytes(kind) / (size_t)parts;
    x16_fetch(pf, blk + fu * (size_t)(c0 / 8), gb, ng, b * parts + c0 / 8, fu);
}
/* The weight scales of rows 8h..8h + 7 of a block (f16 in X16, f32 in X16S). */
AI __m256 x16_scales8(int kind, const unsigned char *blk, int h) {
    return kind == X16_Q8S ? _mm256_loadu_ps((const float *)(blk + 32 * h))
                           : _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(blk + 16 * h)));
}
#if defined(KNT_X16)
#define X16_NT KNT_X16
#else
#define X16_NT KNT_X8
#endif
/* Groups one tile reads. In 512-bit registers, from two tokens on, two
 * whole groups at a time, in tiles of at most X16_NT2 tokens (the tile loads
 * each activation chunk once for both groups' dots); one token reads one
 * group. A DRAM-resident matrix is read faster in pairs at every count from
 * two: the projections of a decode step of 2, 4, 5, 8 and 12 sequences took
 * 10-22% less time than with one group per tile of up to 14 tokens (whose
 * ~1.3 loads per dot read the weight stream at 34-39 GB/s where the same
 * steps in pairs read 41-51). One token in pairs was 25% slower (two streams
 * with nothing ahead: x16_gemv's ahead). */
#if defined(X16_ZMM)
#define X16_PAIR 2
#ifndef KNT_X16P
#define KNT_X16P 7
#endif
#define X16_NT2 KNT_X16P
#else
#define X16_PAIR 1
#define X16_NT2  X16_NT
#endif
AI bool x16_pairs(int np) { return X16_PAIR == 2 && np > 1; }
/* The groups of the unit starting at row g0 of a pass of np tokens over rows
 * [r0, r1): 0 past r1, 2 when pairs run and two whole groups fit, else 1 (a
 * group cut by r0 or r1 runs alone, into a scratch tile). */
AI int x16_unit(int64_t g0, int64_t r0, int64_t r1, int np) {
    if (g0 >= r1) return 0;
    return x16_pairs(np) && g0 >= r0 && g0 + 32 <= r1 ? 2 : 1;
}
/* Q8_0 X16 weights made unsigned (w ^ 0x80) for vpdpbusd; 0: the sign trick */
#if defined(X16_ZMM) || defined(X16_FLIP)
#define X16_U8 1
#else
#define X16_U8 0
#endif

/* np tokens in the fewest tiles of at most X16_NT (X16_NT2 with pairs), as
 * even as they come (32 in tiles of 7: 7, 7, 6, 6, 6, not four of 7 and
 * one of 4): tile i of n starts at token i np / n. */
AI int x16_tiles(int np) {
    const int m = x16_pairs(np) ? X16_NT2 : X16_NT;
    return (np + m - 1) / m;
}
AI int x16_tile_start(int i, int n, int np) { return i * np / n; }

/* Fills the table for np tokens (tiles of x16_tile_start): Q8_0 activation
 * rows, or Q8_K ones for X16S (whose sums come from the bsums). */
AI void x16_act(int kind, int off, const void *x, size_t xs, int np, int64_t nb, int32_t *tab) {
    const __m256i flip = _mm256_set1_epi8((char)0x80);
    const int ntl = x16_tiles(np), nc = x16_chunks(kind), ent = x16_ent(kind);
    for (int i = 0; i < ntl; i++) {
        const int t0 = x16_tile_start(i, ntl, np), nt = x16_tile_start(i + 1, ntl, np) - t0;
        int32_t *tt = tab + (size_t)t0 * (size_t)nb * (size_t)ent;
        for (int j = 0; j < nt; j++) {
            const char *xr = (const char *)x + (size_t)(t0 + j) * xs;
            for (int64_t b = 0; b < nb; b++) {
                int32_t *e = tt + (size_t)b * (size_t)(nt * ent);
                const int8_t *qs;
                float d;
                int32_t sum = 0; /* no correction (off 0, the sign trick): no sum */
                if (kind == X16_Q8S) {
                    const tk_block_q8_k *xb = (const tk_block_q8_k *)xr + b;
                    qs = xb->qs;
                    d = xb->d;
                    for (int s = 0; s < TK_QK_K / 16 && off; s++) sum += xb->bsums[s];
                } else {
                    const tk_block_q8_0 *xb = (const tk_block_q8_0 *)xr + b;
                    qs = xb->qs;
                    d = f16_to_f32(xb->d);
                    if (off) {
                        /* sum(x + 128) by byte absolute differences from 0, in four 64-bit lanes */
                        __m256i v = _mm256_xor_si256(_mm256_loadu_si256((const __m256i *)qs), flip);
                        __m256i s4 = _mm256_sad_epu8(v, _mm256_setzero_si256());
                        __m128i s2 =
                            _mm_add_epi64(_mm256_castsi256_si128(s4), _mm256_extracti128_si256(s4, 1));
                        sum = _mm_cvtsi128_si32(s2) + _mm_extract_epi32(s2, 2) - 32 * 128;
                    }
                }
                for (int c = 0; c < nc; c++) memcpy(&e[c * nt + j], qs + 4 * c, 4);
                e[nc * nt + j] = -off * sum;
                memcpy(&e[(nc + 1) * nt + j], &d, 4);
            }
        }
    }
}

/* a + dot_u8s8(u, x); a level with an accumulating dot defines it as one op. */
#ifndef dot_u8s8_acc
#define dot_u8s8_acc(a, u, x) _mm256_add_epi32(a, dot_u8s8(u, x))
#endif
/* a + the vpmaddubsw pair sums of u and x, kept as int16 (the caller bounds
 * the sum: each pair is at most 2 * 255 * 128 in magnitude). */
#define dot_u8s8_acc16(a, u, x) _mm256_add_epi16(a, _mm256_maddubs_epi16(u, x))

AI float x16_scale(const int32_t *e) {
    float d;
    memcpy(&d, e, 4);
    return d;
}

#if defined(X16_ZMM)
/* vpdpbusd with its activation operand broadcast from memory ({1to16}): one
 * fused uop where the intrinsic pair compiles to a separate broadcast load. */
AI __m512i dpbusd_bcast(__m512i acc, __m512i w, const int32_t *x) {
    __asm__("vpdpbusd %2%{1to16%}, %1, %0" : "+v"(acc) : "v"(w), "m"(*x));
    return acc;
}

/* ng (1 or 2) groups of 16 rows, gb bytes apart, against nt tokens (table
 * e, x16_act): acc[j][t] holds the 16 row sums of group j and token t, one
 * chain per (row, token) over the blocks whatever nt and ng are, so a row's
 * result has the same bits in a pair as alone. One group takes each
 * activation chunk as a {1to16} operand of its vpdpbusd; two groups load
 * it once into a register for both dots. Each dot then costs 0.6 loads
 * instead of 1.3, and the tile runs at the rate its 3 float ops per 8 dots
 * allow: 322 against 295 GMAC/s over L2-resident weights (one core, 32
 * tokens; docs/notes.md). */
AI void x16_tile(int kind, int ng, int64_t nb, const unsigned char *g, size_t gb, const int32_t *e, float *y,
                 int64_t ldy, int nt, x16_pf pf) {
    const size_t bb = x16_block_bytes(kind);
    const int nc = x16_chunks(kind), ent = x16_ent(kind);
    __m512 acc[2][X16_NT];
#pragma GCC unroll 16
    for (int t = 0; t < nt; t++) acc[0][t] = acc[1][t] = _mm512_setzero_ps();
    const __m512i flip = _mm512_set1_epi8((char)0x80), m4 = _mm512_set1_epi8(0x0f);
    for (int64_t b = 0; b < nb; b++, e += nt * ent) {
        const unsigned char *blk = g + (size_t)b * bb;
        __m512i is[2][X16_NT];
#pragma GCC unroll 16
        for (int t = 0; t < nt; t++) is[0][t] = is[1][t] = _mm512_set1_epi32(e[nc * nt + t]);
        /* eight chunks at a time, each eight with its share of the prefetch */
        for (int c0 = 0; c0 < nc; c0 += 8) {
            x16_fetch_chunks(pf, kind, blk, gb, ng, b, c0);
#pragma GCC unroll 8
            for (int c = c0; c < c0 + 8; c++) {
                __m512i wv[2];
#pragma GCC unroll 2
                for (int j = 0; j < ng; j++) {
                    const unsigned char *qb = blk + (size_t)j * gb + x16_head_bytes(kind);
                    if (kind == X16_Q4) { /* chunk c: elements 4c..4c+3, nibbles of the 64 bytes at c / 2 */
                        __m512i v = _mm512_loadu_si512((const void *)(qb + 64 * (c / 2)));
                        wv[j] = _mm512_and_si512(c % 2 ? _mm512_srli_epi16(v, 4) : v, m4);
                    } else {
                        wv[j] = _mm512_xor_si512(_mm512_loadu_si512((const void *)(qb + 64 * c)), flip);
                    }
                }
#pragma GCC unroll 16
                for (int t = 0; t < nt; t++) {
                    if (ng == 1) {
                        is[0][t] = dpbusd_bcast(is[0][t], wv[0], &e[c * nt + t]);
                    } else {
                        const __m512i x = _mm512_set1_epi32(e[c * nt + t]);
                        is[0][t] = _mm512_dpbusd_epi32(is[0][t], wv[0], x);
                        is[1][t] = _mm512_dpbusd_epi32(is[1][t], wv[1], x);
                    }
                }
            }
        }
#pragma GCC unroll 2
        for (int j = 0; j < ng; j++) {
            const unsigned char *hd = blk + (size_t)j * gb;
            const __m512 dw = kind == X16_Q8S ? _mm512_loadu_ps((const void *)hd)
                                              : _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)hd));
#pragma GCC unroll 16
            for (int t = 0; t < nt; t++) {
                __m512 d = _mm512_mul_ps(dw, _mm512_set1_ps(x16_scale(&e[(nc + 1) * nt + t])));
                acc[j][t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(is[j][t]), d, acc[j][t]);
            }
        }
    }
#pragma GCC unroll 16
    for (int t = 0; t < nt; t++)
#pragma GCC unroll 2
        for (int j = 0; j < ng; j++) _mm512_storeu_ps(y + (size_t)t * (size_t)ldy + 16 * j, acc[j][t]);
}
#elif defined(X16_FLIP)
/* The 512-bit tile's chains in two 256-bit halves of 8 rows, both in one
 * pass: the VEX vpdpbusd takes no broadcast operand, so each (token, chunk)
 * is a vpbroadcastd load beside its dot, and shared by the two halves it
 * halves the loads that bound a tile taking the halves one after the other.
 * The same integer block dots and float steps as the halves one at a time. */
AI void x16_tile(int kind, int ng, int64_t nb, const unsigned char *g, size_t gb, const int32_t *e, float *y,
                 int64_t ldy, int nt, x16_pf pf) {
    (void)ng; /* one group (X16_PAIR) */
    const size_t bb = x16_block_bytes(kind);
    const int nc = x16_chunks(kind), ent = x16_ent(kind);
    const __m256i flip = _mm256_set1_epi8((char)0x80), m4 = _mm256_set1_epi8(0x0f);
    __m256 acc[2][X16_NT];
#pragma GCC unroll 8
    for (int t = 0; t < nt; t++) acc[0][t] = acc[1][t] = _mm256_setzero_ps();
    for (int64_t b = 0; b < nb; b++, e += nt * ent) {
        const unsigned char *blk = g + (size_t)b * bb, *qb = blk + x16_head_bytes(kind);
        __m256i is[2][X16_NT];
#pragma GCC unroll 8
        for (int t = 0; t < nt; t++) is[0][t] = is[1][t] = _mm256_set1_epi32(e[nc * nt + t]);
        for (int c0 = 0; c0 < nc; c0 += 8) {
            x16_fetch_chunks(pf, kind, blk, gb, 1, b, c0);
#pragma GCC unroll 8
            for (int c = c0; c < c0 + 8; c++) {
                __m256i w0, w1;
                if (kind == X16_Q4) { /* chunk c: nibbles of the 64 bytes at c / 2, halves 32 bytes apart */
                    const __m256i v0 = _mm256_loadu_si256((const __m256i *)(qb + 64 * (c / 2)));
                    const __m256i v1 = _mm256_loadu_si256((const __m256i *)(qb + 64 * (c / 2) + 32));
                    w0 = _mm256_and_si256(c % 2 ? _mm256_srli_epi16(v0, 4) : v0, m4);
                    w1 = _mm256_and_si256(c % 2 ? _mm256_srli_epi16(v1, 4) : v1, m4);
                } else {
                    w0 = _mm256_xor_si256(_mm256_loadu_si256((const __m256i *)(qb + 64 * c)), flip);
                    w1 = _mm256_xor_si256(_mm256_loadu_si256((const __m256i *)(qb + 64 * c + 32)), flip);
                }
#pragma GCC unroll 8
                for (int t = 0; t < nt; t++) {
                    const __m256i x = _mm256_set1_epi32(e[c * nt + t]);
                    is[0][t] = dot_u8s8_acc(is[0][t], w0, x);
                    is[1][t] = dot_u8s8_acc(is[1][t], w1, x);
                }
            }
        }
        const __m256 dw0 = x16_scales8(kind, blk, 0), dw1 = x16_scales8(kind, blk, 1);
#pragma GCC unroll 8
        for (int t = 0; t < nt; t++) {
            const __m256 s = _mm256_set1_ps(x16_scale(&e[(nc + 1) * nt + t]));
            acc[0][t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(is[0][t]), _mm256_mul_ps(dw0, s), acc[0][t]);
            acc[1][t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(is[1][t]), _mm256_mul_ps(dw1, s), acc[1][t]);
        }
    }
#pragma GCC unroll 8
    for (int t = 0; t < nt; t++) {
        _mm256_storeu_ps(y + (size_t)t * (size_t)ldy, acc[0][t]);
        _mm256_storeu_ps(y + (size_t)t * (size_t)ldy + 8, acc[1][t]);
    }
}
#else
/* In 256-bit halves of 8 rows: the chains of the 512-bit tile, the same
 * integer block dots. Q4_0 as there; Q8_0 by the sign trick (dot_s8: |w|
 * once per vector, x carrying w's sign per token), whose chains start at 0
 * (the table's corrections are 0: x16_act's off). One token takes both
 * halves in one pass (X16_HALVES): its weights stream once, front to back,
 * and each activation chunk serves both. So do two Q8_0 tokens (batch-2
 * projections ~4% faster: their pass still waits on memory), not two Q4_0
 * ones (no faster from DRAM, slower from cache: 4 chains and their table
 * entries crowd the 16 registers). */
#define X16_HALVES(kind, nt) ((nt) == 1 || ((nt) == 2 && (kind) == X16_Q8) ? 2 : 1)
#define X16_U                (X16_NT > 4 ? X16_NT : 4)
AI void x16_tile(int kind, int ng, int64_t nb, const unsigned char *g, size_t gb, const int32_t *e0, float *y,
                 int64_t ldy, int nt, x16_pf pf) {
    (void)ng; /* one group (X16_PAIR) */
    const size_t bb = x16_block_bytes(kind);
    const int nc = x16_chunks(kind), ent = x16_ent(kind), q4 = kind == X16_Q4, nh = X16_HALVES(kind, nt);
    const __m256i m4 = _mm256_set1_epi8(0x0f);
    for (int h0 = 0; h0 < 2; h0 += nh) {
        const int32_t *e = e0;
        __m256 acc[X16_U];
#pragma GCC unroll 8
        for (int u = 0; u < nh * nt; u++) acc[u] = _mm256_setzero_ps();
        for (int64_t b = 0; b < nb; b++, e += nt * ent) {
            const unsigned char *blk = g + (size_t)b * bb, *qb = blk + x16_head_bytes(kind) + 32 * h0;
            /* Q4_0: the vpmaddubsw pair sums of the block's 8 chunks added as
             * int16 (16 products of a nibble and an int8 of at most 127 per
             * lane: |sum| <= 30480), widened once by vpmaddwd: the same
             * integers as a widening per chunk, 17 ops per block and token
             * instead of 24. Q8_0's sign-trick pairs reach 32512 and add as int32. */
            __m256i is[X16_U];
#pragma GCC unroll 8
            for (int u = 0; u < nh * nt; u++) is[u] = _mm256_setzero_si256();
            for (int c0 = 0; c0 < nc; c0 += 8) {
                if (h0 == 0) x16_fetch_chunks(pf, kind, blk, gb, 1, b, c0);
#pragma GCC unroll 8
                for (int c = c0; c < c0 + 8; c++)
#pragma GCC unroll 2
                    for (int hh = 0; hh < nh; hh++) {
                        __m256i *ih = is + hh * nt;
                        __m256i wv;
                        if (q4) {
                            __m256i v = _mm256_loadu_si256((const __m256i *)(qb + 64 * (c / 2) + 32 * hh));
                            wv = _mm256_and_si256(c % 2 ? _mm256_srli_epi16(v, 4) : v, m4);
                        } else { /* the sign trick: wv signed, aw = |wv| */
                            wv = _mm256_loadu_si256((const __m256i *)(qb + 64 * c + 32 * hh));
                            const __m256i aw = _mm256_sign_epi8(wv, wv);
#pragma GCC unroll 8
                            for (int t = 0; t < nt; t++) {
                                ih[t] = dot_s8_acc(ih[t], aw, wv, _mm256_set1_epi32(e[c * nt + t]));
                                keep_sum(&ih[t]);
                            }
                            continue;
                        }
#pragma GCC unroll 8
                        for (int t = 0; t < nt; t++) {
                            ih[t] = dot_u8s8_acc16(ih[t], wv, _mm256_set1_epi32(e[c * nt + t]));
                            keep_sum(&ih[t]);
                        }
                    }
            }
            if (q4)
#pragma GCC unroll 8
                for (int u = 0; u < nh * nt; u++)
                    is[u] = _mm256_add_epi32(_mm256_set1_epi32(e[nc * nt + u % nt]),
                                             _mm256_madd_epi16(is[u], _mm256_set1_epi16(1)));
#pragma GCC unroll 2
            for (int hh = 0; hh < nh; hh++) {
                const __m256 dw = x16_scales8(kind, blk, h0 + hh);
#pragma GCC unroll 8
                for (int t = 0; t < nt; t++) {
                    __m256 d = _mm256_mul_ps(dw, _mm256_set1_ps(x16_scale(&e[(nc + 1) * nt + t])));
                    acc[hh * nt + t] =
                        _mm256_fmadd_ps(_mm256_cvtepi32_ps(is[hh * nt + t]), d, acc[hh * nt + t]);
                }
            }
        }
#pragma GCC unroll 2
        for (int hh = 0; hh < nh; hh++)
#pragma GCC unroll 8
            for (int t = 0; t < nt; t++)
                _mm256_storeu_ps(y + (size_t)t * (size_t)ldy + 8 * (h0 + hh), acc[hh * nt + t]);
    }
}
#endif

/* Tokens in passes whose table fits X16_TAB_WORDS (on the stack), each
 * pass over the 16-row groups [r0, r1) touches; a group cut by r0 or r1
 * is computed whole into a scratch tile, as in gemv_q8_0_x8. */
AI void x16_gemv(int kind, int64_t k, const void *w, int64_t r0, int64_t r1, const void *xq, size_t xq_stride,
                 int n_tok, float *y, int64_t ldy) {
    const int64_t nb = k / (kind == X16_Q8S ? TK_QK_K : TK_QK8_0);
    const int ent = x16_ent(kind);
    if (nb * ent > X16_TAB_WORDS) { /* k beyond 229376 (X16S: 278528): no pass fits; the definition */
        (kind == X16_Q4    ? kern_gemv_q4_0_x16_ref
         : kind == X16_Q8S ? kern_gemv_q8_0_x16s_ref
                           : kern_gemv_q8_0_x16_ref)(k, w, r0, r1, xq, xq_stride, n_tok, y, ldy);
        return;
    }
    const int pass = (int)(X16_TAB_WORDS / (nb * ent));
    const size_t gb = (size_t)nb * x16_block_bytes(kind);
    int32_t tab[X16_TAB_WORDS];
    for (int p0 = 0; p0 < n_tok; p0 += pass) {
        const int np = n_tok - p0 < pass ? n_tok - p0 : pass;
        x16_act(kind,
                kind == X16_Q4 ? 8
                : X16_U8       ? 128
                               : 0,
                (const char *)xq + (size_t)p0 * xq_stride, xq_stride, np, nb, tab);
        const int ntl = x16_tiles(np);
        const bool ahead = np > 1 || kind == X16_Q4 || (X16_AHEAD_ONE && kind == X16_Q8);
        for (int64_t g0 = r0 / 16 * 16; g0 < r1;) {
            const unsigned char *g = (const unsigned char *)w + (size_t)(g0 / 16) * gb;
            const int ng = x16_unit(g0, r0, r1, np), ngn = x16_unit(g0 + 16 * ng, r0, r1, np);
            const bool whole = g0 >= r0 && g0 + 16 <= r1;
            for (int i = 0; i < ntl; i++) {
                const int t = x16_tile_start(i, ntl, np), nt = x16_tile_start(i + 1, ntl, np) - t;
                const x16_pf pf = x16_unit_fetch(i, ntl, ahead, g + (size_t)ng * gb, ngn);
                float tmp[X16_NT * 16];
                float *dst = whole ? y + (size_t)(p0 + t) * (size_t)ldy + g0 : tmp;
                int64_t ld = whole ? ldy : 16;
                const int32_t *et = tab + (size_t)t * (size_t)nb * (size_t)ent;
                switch (nt) {
#define X16_CASE(n)                                                                                          \
    case n:                                                                                                  \
        if (n > X16_NT) break;                                                                               \
        if (X16_PAIR == 2 && n <= X16_NT2 && ng == 2) /* no pair tile past its registers */                  \
            x16_tile(kind, 2, nb, g, gb, et, dst, ld, n, pf);                                                \
        else                                                                                                 \
            x16_tile(kind, 1, nb, g, gb, et, dst, ld, n, pf);                                                \
        break;
                    X16_CASE(1)
                    X16_CASE(2)
                    X16_CASE(3)
                    X16_CASE(4)
                    X16_CASE(5)
                    X16_CASE(6)
                    X16_CASE(7)
                    X16_CASE(8)
                    X16_CASE(9)
                    X16_CASE(10)
                    X16_CASE(11)
                    X16_CASE(12)
                    X16_CASE(13)
                    X16_CASE(14)
#undef X16_CASE
                default:
                    break;
                }
                if (!whole) cut_tile_store(y + (size_t)(p0 + t) * (size_t)ldy, ldy, tmp, 16, nt, g0, r0, r1);
            }
            g0 += 16 * ng;
        }
    }
}

void KFN(gemv_q4_0_x16)(int64_t k, const void *w, int64_t r0, int64_t r1, const void *xq, size_t xq_stride,
                        int n_tok, float *y, int64_t ldy) {
    x16_gemv(X16_Q4, k, w, r0, r1, xq, xq_stride, n_tok, y, ldy);
}

void KFN(gemv_q8_0_x16)(int64_t k, const void *w, int64_t r0, int64_t r1, const void *xq, size_t xq_stride,
                        int n_tok, float *y, int64_t ldy) {
    x16_gemv(X16_Q8, k, w, r0, r1, xq, xq_stride, n_tok, y, ldy);
}

void KFN(gemv_q8_0_x16s)(int64_t k, const void *w, int64_t r0, int64_t r1, const void *xq, size_t xq_stride,
                         int n_tok, float *y, int64_t ldy) {
    x16_gemv(X16_Q8S, k, w, r0, r1, xq, xq_stride, n_tok, y, ldy);
}
#undef X16_NT
#undef X16_TAB_WORDS
#undef X16_U8
#undef X16_PAIR
#undef X16_NT2

/* ---- Q4_K and Q6_K weights x Q8_K activations ------------------------------------------- */

/* Shuffle masks that spread 16-bit lane s of a 128-bit vector over all eight lanes. */
AI __m256i spread_i16(__m256i v, int s) {
    const __m256i m = _mm256_set1_epi16((short)((2 * s) | ((2 * s + 1) << 8)));
    return _mm256_shuffle_epi8(v, m);
}

/* Sub-block scales (bytes 0..7) and mins (bytes 8..15) of a Q4_K block: GGML's
 * 32-bit word unpacking, done in one vector register instead of four GPRs. */
AI __m128i q4_k_scales_mins(const uint8_t *scales) {
    /* 32-bit words u0 u1 u2 = bytes 0..3, 4..7, 8..11 (the load's fourth word
     * is the block's first qs bytes, unused). Scales 0-3 = u0 & 0x3f..,
     * mins 0-3 = u1 & 0x3f.., scales 4-7 = (u2 & 0x0f..) | ((u0 >> 6) & 3..) << 4,
     * mins 4-7 = ((u2 >> 4) & 0x0f..) | ((u1 >> 6) & 3..) << 4. */
    __m128i v = _mm_loadu_si128((const __m128i *)scales);
    __m128i lo = _mm_and_si128(v, _mm_set1_epi32(0x3f3f3f3f)); /* [sc0-3, m0-3, ., .] */
    __m128i p = _mm_shuffle_epi32(v, _MM_SHUFFLE(3, 3, 2, 2)); /* [u2, u2, ., .] */
    __m128i q = _mm_shuffle_epi32(v, _MM_SHUFFLE(3, 3, 1, 0)); /* [u0, u1, ., .] */
    p = _mm_and_si128(_mm_srlv_epi32(p, _mm_setr_epi32(0, 4, 0, 0)), _mm_set1_epi32(0x0f0f0f0f));
    q = _mm_slli_epi32(_mm_and_si128(_mm_srli_epi32(q, 6), _mm_set1_epi32(0x03030303)), 4);
    __m128i hi = _mm_or_si128(p, q);   /* [sc4-7, m4-7, ., .] */
    return _mm_unpacklo_epi32(lo, hi); /* [sc0-3, sc4-7, m0-3, m4-7] */
}

/* Pairwise sums of a Q8_K block's 16 bsums: the activation sum of each
 * 32-element sub-block, as 8 int16. */
AI __m128i q8_k_sums32(const tk_block_q8_k *xb) {
    __m128i lo = _mm_loadu_si128((const __m128i *)xb->bsums),
            hi = _mm_loadu_si128((const __m128i *)xb->bsums + 1);
    return _mm_hadd_epi16(lo, hi);
}

AI void q4_k_tile(int64_t nb, const void *w, const void *x, size_t xs, float *y, int64_t ldy, int64_t r,
                  int t0, int nr, int nt) {
    const size_t rb = (size_t)nb * sizeof(tk_block_q4_k);
    const tk_block_q4_k *wr[4];
    const tk_block_q8_k *xt[4];
#pragma GCC unroll 4
    for (int i = 0; i < nr; i++) wr[i] = (const tk_block_q4_k *)((const char *)w + (size_t)(r + i) * rb);
#pragma GCC unroll 4
    for (int t = 0; t < nt; t++) xt[t] = (const tk_block_q8_k *)((const char *)x + (size_t)(t0 + t) * xs);
    __m256 acc[4][4];
#pragma GCC unroll 4
    for (int i = 0; i < nr; i++)
#pragma GCC unroll 4
        for (int t = 0; t < nt; t++) acc[i][t] = _mm256_setzero_ps();
    const __m256i m4 = _mm256_set1_epi8(0x0f);
    for (int64_t b = 0; b < nb; b++) {
        __m128i xsum[4];
#pragma GCC unroll 4
        for (int t = 0; t < nt; t++) xsum[t] = q8_k_sums32(&xt[t][b]);
#pragma GCC unroll 4
        for (int i = 0; i < nr; i++) {
            const tk_block_q4_k *wb = &wr[i][b];
            for (int o = 0; o < (int)sizeof *wb; o += 64) prefetch_ahead((const char *)wb + o, 4 * rb);
            __m128i sm8 = q4_k_scales_mins(wb->scales);
            __m256i sm = _mm256_cvtepu8_epi16(sm8); /* 8 scales, then 8 mins, int16 */
            __m256i sc = _mm256_permute2x128_si256(sm, sm, 0x00);
            __m128i mins = _mm256_extracti128_si256(sm, 1);
            __m256i isum[4];
#pragma GCC unroll 4
            for (int t = 0; t < nt; t++) isum[t] = _mm256_setzero_si256();
#pragma GCC unroll 4
            for (int j = 0; j < 4; j++) {
                __m256i q = _mm256_loadu_si256((const __m256i *)(wb->qs + 32 * j));
                __m256i lo = _mm256_and_si256(q, m4), hi = _mm256_and_si256(_mm256_srli_epi16(q, 4), m4);
                __m256i sl = spread_i16(sc, 2 * j), sh = spread_i16(sc, 2 * j + 1);
#pragma GCC unroll 4
                for (int t = 0; t < nt; t++) {
                    const int8_t *xqs = xt[t][b].qs + 64 * j;
                    __m256i pl = _mm256_maddubs_epi16(lo, _mm256_loadu_si256((const __m256i *)xqs));
                    __m256i ph = _mm256_maddubs_epi16(hi, _mm256_loadu_si256((const __m256i *)(xqs + 32)));
                    pl = _mm256_madd_epi16(pl, sl);
                    ph = _mm256_madd_epi16(ph, sh);
                    isum[t] = _mm256_add_epi32(isum[t], _mm256_add_epi32(pl, ph));
                    keep_sum(&isum[t]);
                }
            }
            float d = f16_to_f32(wb->d), dmin = f16_to_f32(wb->dmin);
#pragma GCC unroll 4
            for (int t = 0; t < nt; t++) {
                float dx = xt[t][b].d;
                acc[i][t] = _mm256_fmadd_ps(_mm256_set1_ps(d * dx), _mm256_cvtepi32_ps(isum[t]), acc[i][t]);
                /* the mins term, in the low four lanes (the upper ones add 0) */
                __m128 mf = _mm_cvtepi32_ps(_mm_madd_epi16(mins, xsum[t]));
                acc[i][t] =
                    _mm256_fnmadd_ps(_mm256_set1_ps(dmin * dx), _mm256_zextps128_ps256(mf), acc[i][t]);
            }
        }
    }
    store_tile(acc, nr, nt, y, ldy, r);
}

#define Q4_K_TILE(nb, w, x, xs, y, ldy, r, t, nr, nt)                                                        \
    q4_k_tile(nb, w, x, xs, y + (t) * (ldy), ldy, r, t, nr, nt)

void KFN(gemv_q4_k)(int64_t k, const void *w, int64_t r0, int64_t r1, const void *xq, size_t xq_stride,
                    int n_tok, float *y, int64_t ldy) {
    GEMV_DRIVE(Q4_K_TILE, KNT_K, k / TK_QK_K, w, xq, xq_stride, y, ldy);
}

/* Shuffle mask putting int16 lane 2c of each 128-bit half in the low half's
 * eight lanes and lane 2c + 1 in the high half's: one vpshufb per 32 elements
 * builds the pair of Q6_K sub-block scales a maddubs result needs. */
AI __m256i q6_k_pair_mask(int c) {
    const char a = (char)(4 * c), b = (char)(4 * c + 1), e = (char)(4 * c + 2), f = (char)(4 * c + 3);
    return _mm256_setr_epi8(a, b, a, b, a, b, a, b, a, b, a, b, a, b, a, b, e, f, e, f, e, f, e, f, e, f, e,
                            f, e, f, e, f);
}

/* Q6_K: q - 32 is split as q * x - 32 * x; the second part is sum over
 * sub-blocks of scale * bsum, one madd per block instead of four maddubs. */
AI void q6_k_tile(int64_t nb, const void *w, const void *x, size_t xs, float *y, int64_t ldy, int64_t r,
                  int t0, int nr, int nt) {
    const size_t rb = (size_t)nb * sizeof(tk_block_q6_k);
    const tk_block_q6_k *wr[4];
    const tk_block_q8_k *xt[4];
#pragma GCC unroll 4
    for (int i = 0; i < nr; i++) wr[i] = (const tk_block_q6_k *)((const char *)w + (size_t)(r + i) * rb);
#pragma GCC unroll 4
    for (int t = 0; t < nt; t++) xt[t] = (const tk_block_q8_k *)((const char *)x + (size_t)(t0 + t) * xs);
    __m256 acc[4][4];
#pragma GCC unroll 4
    for (int i = 0; i < nr; i++)
#pragma GCC unroll 4
        for (int t = 0; t < nt; t++) acc[i][t] = _mm256_setzero_ps();
    const __m256i m4 = _mm256_set1_epi8(0x0f), m2 = _mm256_set1_epi8(0x03);
    for (int64_t b = 0; b < nb; b++) {
#pragma GCC unroll 4
        for (int i = 0; i < nr; i++) {
            const tk_block_q6_k *wb = &wr[i][b];
            for (int o = 0; o < (int)sizeof *wb; o += 64) prefetch_ahead((const char *)wb + o, 4 * rb);
            __m128i sc8 = _mm_loadu_si128((const __m128i *)wb->scales);
            __m256i sc16 = _mm256_cvtepi8_epi16(sc8);
            __m256i isum[4];
#pragma GCC unroll 4
            for (int t = 0; t < nt; t++) {
                __m256i bs = _mm256_loadu_si256((const __m256i *)xt[t][b].bsums);
                isum[t] = _mm256_sub_epi32(_mm256_setzero_si256(),
                                           _mm256_slli_epi32(_mm256_madd_epi16(sc16, bs), 5));
            }
#pragma GCC unroll 4
            for (int h = 0; h < 2; h++) {
                __m256i l1 = _mm256_loadu_si256((const __m256i *)(wb->ql + 64 * h));
                __m256i l2 = _mm256_loadu_si256((const __m256i *)(wb->ql + 64 * h + 32));
                __m256i qh = _mm256_loadu_si256((const __m256i *)(wb->qh + 32 * h));
                __m256i q[4];
                q[0] =
                    _mm256_or_si256(_mm256_and_si256(l1, m4), _mm256_slli_epi16(_mm256_and_si256(qh, m2), 4));
                q[1] = _mm256_or_si256(_mm256_and_si256(l2, m4),
                                       _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(qh, 2), m2), 4));
                q[2] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(l1, 4), m4),
                                       _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(qh, 4), m2), 4));
                q[3] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(l2, 4), m4),
                                       _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(qh, 6), m2), 4));
                /* this half's eight int16 scales in both 128-bit lanes */
                __m256i sh = h == 0 ? _mm256_permute2x128_si256(sc16, sc16, 0x00)
                                    : _mm256_permute2x128_si256(sc16, sc16, 0x11);
#pragma GCC unroll 4
                for (int c = 0; c < 4; c++) {
                    /* scales 8h + 2c (first 16 elements) and 8h + 2c + 1 (next 16) */
                    __m256i scv = _mm256_shuffle_epi8(sh, q6_k_pair_mask(c));
#pragma GCC unroll 4
                    for (int t = 0; t < nt; t++) {
                        __m256i xv = _mm256_loadu_si256((const __m256i *)(xt[t][b].qs + 128 * h + 32 * c));
                        __m256i p = _mm256_madd_epi16(_mm256_maddubs_epi16(q[c], xv), scv);
                        isum[t] = _mm256_add_epi32(isum[t], p);
                        keep_sum(&isum[t]);
                    }
                }
            }
            float d = f16_to_f32(wb->d);
#pragma GCC unroll 4
            for (int t = 0; t < nt; t++)
                acc[i][t] =
                    _mm256_fmadd_ps(_mm256_set1_ps(d * xt[t][b].d), _mm256_cvtepi32_ps(isum[t]), acc[i][t]);
        }
    }
    store_tile(acc, nr, nt, y, ldy, r);
}

#define Q6_K_TILE(nb, w, x, xs, y, ldy, r, t, nr, nt)                                                        \
    q6_k_tile(nb, w, x, xs, y + (t) * (ldy), ldy, r, t, nr, nt)

void KFN(gemv_q6_k)(int64_t k, const void *w, int64_t r0, int64_t r1, const void *xq, size_t xq_stride,
                    int n_tok, float *y, int64_t ldy) {
    GEMV_DRIVE(Q6_K_TILE, KNT_K, k / TK_QK_K, w, xq, xq_stride, y, ldy);
}

/* ---- activation quantizers ------------------------------------------------------------- */

/* Same arithmetic as the reference (absmax, d = amax / 127, id = 1 / d, round
 * half to even), so the bytes match it exactly. */
AI float absmax_n(const float *x, int n) {
    const __m256 sign = _mm256_set1_ps(-0.0f);
    __m256 m = _mm256_setzero_ps();
    for (int j = 0; j < n; j += 8) m = _mm256_max_ps(m, _mm256_andnot_ps(sign, _mm256_loadu_ps(x + j)));
    __m128 s = _mm_max_ps(_mm256_castps256_ps128(m), _mm256_extractf128_ps(m, 1));
    s = _mm_max_ps(s, _mm_movehl_ps(s, s));
    s = _mm_max_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

/* 32 floats times id, rounded, packed to 32 int8 in order. */
AI __m256i quant32(const float *x, float id) {
    const __m256 v = _mm256_set1_ps(id);
    __m256i i0 = _mm256_cvtps_epi32(_mm256_mul_ps(_mm256_loadu_ps(x), v));
    __m256i i1 = _mm256_cvtps_epi32(_mm256_mul_ps(_mm256_loadu_ps(x + 8), v));
    __m256i i2 = _mm256_cvtps_epi32(_mm256_mul_ps(_mm256_loadu_ps(x + 16), v));
    __m256i i3 = _mm256_cvtps_epi32(_mm256_mul_ps(_mm256_loadu_ps(x + 24), v));
    i0 = _mm256_packs_epi32(i0, i1);
    i2 = _mm256_packs_epi32(i2, i3);
    i0 = _mm256_packs_epi16(i0, i2);
    /* the packs work per 128-bit lane; this puts the 4-byte groups back in order */
    i0 = _mm256_permutevar8x32_epi32(i0, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
    return _mm256_max_epi8(i0, _mm256_set1_epi8(-127));
}

void KFN(quant_q8_0)(const float *x, void *xq, int64_t k) {
    tk_block_q8_0 *b = xq;
    for (int64_t i = 0; i < k / TK_QK8_0; i++) {
        const float *v = x + i * TK_QK8_0;
        float d = absmax_n(v, TK_QK8_0) / 127.0f, id = d != 0.0f ? 1.0f / d : 0.0f;
        b[i].d = (tk_f16)_cvtss_sh(d, _MM_FROUND_TO_NEAREST_INT);
        _mm256_storeu_si256((__m256i *)b[i].qs, quant32(v, id));
    }
}

void KFN(quant_q8_k)(const float *x, void *xq, int64_t k) {
    tk_block_q8_k *b = xq;
    for (int64_t i = 0; i < k / TK_QK_K; i++) {
        const float *v = x + i * TK_QK_K;
        float d = absmax_n(v, TK_QK_K) / 127.0f, id = d != 0.0f ? 1.0f / d : 0.0f;
        b[i].d = d;
        for (int j = 0; j < TK_QK_K; j += 32) {
            __m256i q = quant32(v + j, id);
            _mm256_storeu_si256((__m256i *)(b[i].qs + j), q);
            /* two bsums per 32: widen to int16 and sum each 16 by madd + hadd */
            __m256i s =
                _mm256_madd_epi16(_mm256_cvtepi8_epi16(_mm256_castsi256_si128(q)), _mm256_set1_epi16(1));
            __m256i s2 =
                _mm256_madd_epi16(_mm256_cvtepi8_epi16(_mm256_extracti128_si256(q, 1)), _mm256_set1_epi16(1));
            __m256i h = _mm256_hadd_epi32(s, s2); /* [s01 s23 t01 t23 | s45 s67 t45 t67] */
            h = _mm256_hadd_epi32(h, h);          /* [s0-3 t0-3 .. | s4-7 t4-7 ..] */
            __m128i tot = _mm_add_epi32(_mm256_castsi256_si128(h), _mm256_extracti128_si256(h, 1));
            b[i].bsums[j / 16] = (int16_t)_mm_cvtsi128_si32(tot);
            b[i].bsums[j / 16 + 1] = (int16_t)_mm_extract_epi32(tot, 1);
        }
    }
}

/* ---- norms, activations, dequantization --------------------------------------------------- */

void KFN(rmsnorm)(float *out, const float *x, const float *w, int64_t n, float eps) {
    __m256 a0 = _mm256_setzero_ps(), a1 = _mm256_setzero_ps();
    int64_t i = 0;
    for (; i + 16 <= n; i += 16) {
        __m256 v0 = _mm256_loadu_ps(x + i), v1 = _mm256_loadu_ps(x + i + 8);
        a0 = _mm256_fmadd_ps(v0, v0, a0);
        a1 = _mm256_fmadd_ps(v1, v1, a1);
    }
    double ss = hsum8(_mm256_add_ps(a0, a1));
    for (; i < n; i++) ss += (double)x[i] * x[i];
    float scale = (float)(1.0 / sqrt(ss / (double)(n > 0 ? n : 1) + eps));
    const __m256 s = _mm256_set1_ps(scale);
    i = 0;
    for (; i + 8 <= n; i += 8)
        _mm256_storeu_ps(out + i,
                         _mm256_mul_ps(_mm256_mul_ps(_mm256_loadu_ps(x + i), s), _mm256_loadu_ps(w + i)));
    for (; i < n; i++) out[i] = x[i] * scale * w[i];
}

void KFN(add)(float *x, const float *y, int64_t n) {
    int64_t i = 0;
    for (; i + 8 <= n; i += 8)
        _mm256_storeu_ps(x + i, _mm256_add_ps(_mm256_loadu_ps(x + i), _mm256_loadu_ps(y + i)));
    if (i < n) kern_add_ref(x + i, y + i, n - i);
}

/* exp(x), x clamped to [-87, 88] (exp_core.h) */
AI __m256 exp8(__m256 x) {
    x = _mm256_min_ps(_mm256_max_ps(x, _mm256_set1_ps(-87.0f)), _mm256_set1_ps(88.0f));
    __m256 n;
    const __m256 y = exp_core8(x, &n);
    return _mm256_mul_ps(y, exp_pow2_8(n));
}

#if defined(ELT_ZMM)
/* exp8 in 16 lanes: the same operations, so the same bits lane by lane. */
AI __m512 exp16(__m512 x) {
    x = _mm512_min_ps(_mm512_max_ps(x, _mm512_set1_ps(-87.0f)), _mm512_set1_ps(88.0f));
    __m512 n;
    const __m512 y = exp_core16(x, &n);
    return _mm512_mul_ps(y, exp_pow2_16(n));
}
#endif

void KFN(silu_mul)(float *out, const float *gate, const float *up, int64_t n) {
    const __m256 one = _mm256_set1_ps(1.0f), neg = _mm256_set1_ps(-0.0f);
    int64_t i = 0;
#if defined(ELT_ZMM)
    for (; i + 16 <= n; i += 16) {
        __m512 g = _mm512_loadu_ps(gate + i);
        __m512 e = exp16(
            _mm512_castsi512_ps(_mm512_xor_si512(_mm512_castps_si512(g), _mm512_set1_epi32(INT32_MIN))));
        __m512 s = _mm512_div_ps(g, _mm512_add_ps(_mm512_set1_ps(1.0f), e));
        _mm512_storeu_ps(out + i, _mm512_mul_ps(s, _mm512_loadu_ps(up + i)));
    }
#endif
    for (; i + 8 <= n; i += 8) {
        __m256 g = _mm256_loadu_ps(gate + i);
        __m256 e = exp8(_mm256_xor_ps(g, neg));
        __m256 s = _mm256_div_ps(g, _mm256_add_ps(one, e));
        _mm256_storeu_ps(out + i, _mm256_mul_ps(s, _mm256_loadu_ps(up + i)));
    }
    if (i < n) kern_silu_mul_ref(out + i, gate + i, up + i, n - i);
}

void KFN(dequant_f16)(const void *row, float *out, int64_t k) {
    const tk_f16 *h = row;
    int64_t i = 0;
    for (; i + 8 <= k; i += 8) _mm256_storeu_ps(out + i, load8_w(h, i, WT_F16));
    if (i < k) kern_dequant_f16_ref(h + i, out + i, k - i);
}

void KFN(dequant_bf16)(const void *row, float *out, int64_t k) {
    const tk_bf16 *h = row;
    int64_t i = 0;
    for (; i + 8 <= k; i += 8) _mm256_storeu_ps(out + i, load8_w(h, i, WT_BF16));
    if (i < k) kern_dequant_bf16_ref(h + i, out + i, k - i);
}

#include "kernels/x86/qk_x16_body.h"

#undef AI
