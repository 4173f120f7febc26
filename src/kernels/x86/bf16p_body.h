/* The BF16 pair-layout gemvs (TK_LAYOUT_P16 and P16R, kernels_ref.h): one
 * chain per (row, token) of s = fma(w_odd, x_odd, s), then s = fma(w_even,
 * x_even, s) over the pairs, the activations as they are (P16) or rounded to
 * BF16 (P16R). Included once per variant with its target flags; the includer
 * defines KFN and one of
 *   P16_HW   vdpbf16ps on 512-bit registers (AVX512-BF16, P16R only): the
 *            pair step is one instruction for 16 rows against a broadcast
 *            activation pair
 *   P16_ZMM  the same steps as two 512-bit FMAs (AVX-512 without BF16)
 *   (none)   the same steps as FMAs on two 256-bit halves (AVX2)
 * A product of two BF16 values is exact in f32, so an FMA step equals the
 * vdpbf16ps step: every variant gives its reference's bits (for P16R,
 * subnormal weights, which vdpbf16ps reads as zero, and subnormal partial
 * sums, which it flushes, aside).
 *
 * Order of work: row blocks of about P16_BLOCK weight bytes (so a block stays
 * in L2), in each the tokens in passes of P16_PAIRS activation pairs rounded
 * onto the stack, and in each pass every 16-row group against token tiles;
 * a pass of one token takes P16_G1_ONE whole groups per tile, and a pass of
 * a few tokens P16_G1 / n, so the core has several independent chains
 * instead of a few latency-bound ones. A group
 * cut by r0 or r1 is computed whole into a scratch tile, so a row's value
 * does not depend on where the range is cut, nor on the tile or pass its
 * token falls in, nor on the groups computed beside it. */
#if !defined(KFN)
#error "define KFN before including bf16p_body.h"
#endif

#include <immintrin.h>
#include <stdbool.h>
#include <stdint.h>
#include <string.h>

#include "kernels/x86/cut_tile.h"

#define P16_AI static inline __attribute__((always_inline))

#ifndef P16_BLOCK
#define P16_BLOCK (256 * 1024)
#endif

#ifndef P16_PF
#define P16_PF 4096
#endif
/* Fetch P16_PF bytes ahead of a group's stream, every 64-byte line (every
 * other line at 2 KiB read ~0.6-0.9x the probe at one token; docs/notes.md).
 * Never faults: the address is formed as an integer, as simd_body.h's
 * prefetch_ahead. */
P16_AI void p16_prefetch(const void *p) { _mm_prefetch((const char *)((uintptr_t)p + P16_PF), _MM_HINT_T0); }

#if defined(P16_HW)
#define P16_NT 12 /* tokens per tile: one 512-bit accumulator each */
/* acc + vdpbf16ps(w, the pair at x in every lane), the pair broadcast from
 * memory ({1to16}): one fused instruction where the intrinsics compile to a
 * separate broadcast load before each. */
P16_AI __m512 p16_dot_bcast(__m512 acc, __m512i w, const uint32_t *x) {
    __asm__("vdpbf16ps %2%{1to16%}, %1, %0" : "+v"(acc) : "v"(w), "m"(*x));
    return acc;
}
/* x[0..31] as 16 BF16 pairs: vcvtne2ps2bf16 puts its second operand low. */
P16_AI void p16_round32(const float *x, uint32_t *out) {
    __m512bh v = _mm512_cvtne2ps_pbh(_mm512_loadu_ps(x + 16), _mm512_loadu_ps(x));
    _mm512_storeu_si512((void *)out, (__m512i)v);
}
#else
#if defined(P16_ZMM)
#define P16_NT 12
#else
#define P16_NT 4 /* two 256-bit accumulators each */
#endif
/* x[0..7] rounded to BF16 as f32 (the value the BF16 bits stand for):
 * kern_act_bf16_ref's arithmetic, in integer lanes. */
P16_AI void p16_round8(const float *x, float *out) {
    __m256i u = _mm256_castps_si256(_mm256_loadu_ps(x));
    __m256i r = _mm256_add_epi32(
        u, _mm256_add_epi32(_mm256_set1_epi32(0x7fff),
                            _mm256_and_si256(_mm256_srli_epi32(u, 16), _mm256_set1_epi32(1))));
    __m256i a = _mm256_and_si256(u, _mm256_set1_epi32(0x7fffffff));
    __m256i nan = _mm256_cmpgt_epi32(a, _mm256_set1_epi32(0x7f800000));
    r = _mm256_blendv_epi8(r, _mm256_or_si256(u, _mm256_set1_epi32(0x400000)), nan);
    __m256i sub =
        _mm256_cmpeq_epi32(_mm256_and_si256(u, _mm256_set1_epi32(0x7f800000)), _mm256_setzero_si256());
    r = _mm256_blendv_epi8(r, _mm256_and_si256(u, _mm256_set1_epi32((int)0x80000000u)), sub);
    r = _mm256_and_si256(r, _mm256_set1_epi32((int)0xffff0000u));
    _mm256_storeu_ps(out, _mm256_castsi256_ps(r));
}
#endif

/* Groups a tile takes: P16_G1_ONE at one token, P16_G1 / n at n tokens
 * when that is 2 or more; and the accumulators a tile holds. A (row, token)
 * chain takes two dependent steps per pair, so a tile of one group and 2-4
 * tokens had too few chains to cover their latency: with 2 groups at one
 * token and 1 at 2-4 tokens, 2 tokens read DRAM at ~0.7x one token's rate.
 * P16_G1 8 at 512 bits (4 groups at 2 tokens, 2 at 3 or 4) and 4 at 256 bits
 * (2 at 2 tokens; each group's two halves are chains already, and 8 would
 * spill): batch 2 1.3-1.4x, batch 3 1.3x, batch 4 1.15x. At one token 4
 * groups read a little faster than 2 and 8 (docs/notes.md). */
#ifndef P16_G1
#if defined(P16_HW) || defined(P16_ZMM)
#define P16_G1 8
#else
#define P16_G1 4
#endif
#endif
#ifndef P16_G1_ONE
#define P16_G1_ONE 4
#endif
#define P16_ACC (P16_NT > P16_G1 ? P16_NT : P16_G1)
_Static_assert(P16_G1_ONE <= P16_ACC, "a one-token tile's groups fit its accumulators");
/* A prefetch every (P16_PF_MASK + 1) 64-byte chunks of a group's stream. */
#ifndef P16_PF_MASK
#define P16_PF_MASK 0
#endif

/* The pass's activations: np tokens of k values. HW: k / 2 BF16 pairs a
 * token; otherwise k f32 values a token, rounded to BF16 values if round.
 * Returns the entries a token takes. */
P16_AI int64_t p16_act(int round, int64_t k, const void *xq, size_t xs, int np, uint32_t *buf) {
#if defined(P16_HW)
    (void)round;
    const int64_t per = k / 2;
#else
    const int64_t per = k;
#endif
    for (int t = 0; t < np; t++) {
        const float *x = (const float *)((const char *)xq + (size_t)t * xs);
        uint32_t *o = buf + (size_t)t * (size_t)per;
        for (int64_t j = 0; j < k; j += 32) {
#if defined(P16_HW)
            p16_round32(x + j, o + j / 2);
#else
            float *f = (float *)(void *)(o + j);
            if (round)
#pragma GCC unroll 4
                for (int e = 0; e < 32; e += 8) p16_round8(x + j + e, f + e);
            else
                memcpy(f, x + j, 32 * sizeof *f);
#endif
        }
    }
    return per;
}

/* ng consecutive 16-row groups from g (k / 2 chunks of 64 bytes each, 16 k
 * entries apart) against nt tokens of the pass buffer (per entries each):
 * y[t * ldy + 16 q + i] for group q's rows i = 0..15. Every (row, token)
 * keeps its one chain; more groups only give the core more independent
 * chains when there are few tokens (one token, one group: a chain of
 * dependent FMAs, bound by their latency). Needs ng * nt <= P16_ACC. */
P16_AI void p16_tile(int64_t k, const uint16_t *g, int ng, const uint32_t *xb, int64_t per, float *y,
                     int64_t ldy, int nt) {
    const int64_t np = k / 2;
    const size_t gs = (size_t)k * 16; /* entries between groups */
#if defined(P16_HW) || defined(P16_ZMM)
    __m512 acc[P16_ACC];
#pragma GCC unroll 16
    for (int a = 0; a < ng * nt; a++) acc[a] = _mm512_setzero_ps();
    for (int64_t j = 0; j < np; j++) {
#pragma GCC unroll 8
        for (int q = 0; q < ng; q++) {
            const uint16_t *c = g + (size_t)q * gs + (size_t)j * 32;
            __m512i w = _mm512_loadu_si512((const void *)c);
            if ((j & P16_PF_MASK) == 0) p16_prefetch(c);
#if defined(P16_HW)
#pragma GCC unroll 16
            for (int t = 0; t < nt; t++)
                acc[q * nt + t] = p16_dot_bcast(acc[q * nt + t], w, xb + (size_t)t * (size_t)per + (size_t)j);
#else
            __m512 we = _mm512_castsi512_ps(_mm512_slli_epi32(w, 16));
            __m512 wo = _mm512_castsi512_ps(_mm512_and_si512(w, _mm512_set1_epi32((int)0xffff0000u)));
#pragma GCC unroll 16
            for (int t = 0; t < nt; t++) {
                const float *xf = (const float *)(const void *)(xb + (size_t)t * (size_t)per) + 2 * j;
                acc[q * nt + t] = _mm512_fmadd_ps(wo, _mm512_set1_ps(xf[1]), acc[q * nt + t]);
                acc[q * nt + t] = _mm512_fmadd_ps(we, _mm512_set1_ps(xf[0]), acc[q * nt + t]);
            }
#endif
        }
    }
#pragma GCC unroll 8
    for (int q = 0; q < ng; q++)
#pragma GCC unroll 16
        for (int t = 0; t < nt; t++) _mm512_storeu_ps(y + (size_t)t * (size_t)ldy + 16 * q, acc[q * nt + t]);
#else
    __m256 acc[P16_ACC][2];
#pragma GCC unroll 8
    for (int a = 0; a < ng * nt; a++) acc[a][0] = acc[a][1] = _mm256_setzero_ps();
    const __m256i hi = _mm256_set1_epi32((int)0xffff0000u);
    for (int64_t j = 0; j < np; j++) {
#pragma GCC unroll 4
        for (int q = 0; q < ng; q++) {
            const uint16_t *c = g + (size_t)q * gs + (size_t)j * 32;
            if ((j & P16_PF_MASK) == 0) p16_prefetch(c);
            __m256i w0 = _mm256_loadu_si256((const __m256i *)c),
                    w1 = _mm256_loadu_si256((const __m256i *)(c + 16));
            __m256 we0 = _mm256_castsi256_ps(_mm256_slli_epi32(w0, 16)),
                   wo0 = _mm256_castsi256_ps(_mm256_and_si256(w0, hi));
            __m256 we1 = _mm256_castsi256_ps(_mm256_slli_epi32(w1, 16)),
                   wo1 = _mm256_castsi256_ps(_mm256_and_si256(w1, hi));
#pragma GCC unroll 8
            for (int t = 0; t < nt; t++) {
                const float *xf = (const float *)(const void *)(xb + (size_t)t * (size_t)per) + 2 * j;
                __m256 xe = _mm256_broadcast_ss(xf), xo = _mm256_broadcast_ss(xf + 1);
                __m256 *ac = acc[q * nt + t];
                ac[0] = _mm256_fmadd_ps(wo0, xo, ac[0]);
                ac[1] = _mm256_fmadd_ps(wo1, xo, ac[1]);
                ac[0] = _mm256_fmadd_ps(we0, xe, ac[0]);
                ac[1] = _mm256_fmadd_ps(we1, xe, ac[1]);
            }
        }
    }
#pragma GCC unroll 4
    for (int q = 0; q < ng; q++)
#pragma GCC unroll 8
        for (int t = 0; t < nt; t++) {
            _mm256_storeu_ps(y + (size_t)t * (size_t)ldy + 16 * q, acc[q * nt + t][0]);
            _mm256_storeu_ps(y + (size_t)t * (size_t)ldy + 16 * q + 8, acc[q * nt + t][1]);
        }
#endif
}

/* One group against a tile of nt <= P16_NT tokens. */
P16_AI void p16_one(int64_t k, const uint16_t *g, const uint32_t *xb, int64_t per, float *y, int64_t ldy,
                    int nt) {
    switch (nt) {
#define P16_CASE(n)                                                                                          \
    case n:                                                                                                  \
        p16_tile(k, g, 1, xb, per, y, ldy, n);                                                               \
        break;
        P16_CASE(1)
        P16_CASE(2)
        P16_CASE(3)
        P16_CASE(4)
#if P16_NT > 4
        P16_CASE(5)
        P16_CASE(6)
        P16_CASE(7)
        P16_CASE(8)
        P16_CASE(9)
        P16_CASE(10)
        P16_CASE(11)
        P16_CASE(12)
#endif
#undef P16_CASE
    default:
        break;
    }
}

/* ng > 1 whole groups against all nt tokens of a short pass (ng a power of
 * two: ng <= P16_G1_ONE at one token, ng * nt <= P16_G1 above). */
P16_AI void p16_set(int64_t k, const uint16_t *g, int ng, const uint32_t *xb, int64_t per, float *y,
                    int64_t ldy, int nt) {
    switch (ng * 16 + nt) {
#define P16_SET(a, n)                                                                                        \
    case a * 16 + n:                                                                                         \
        p16_tile(k, g, a, xb, per, y, ldy, n);                                                               \
        break;
        P16_SET(2, 1)
#if P16_G1_ONE >= 4
        P16_SET(4, 1)
#endif
#if P16_G1_ONE >= 8
        P16_SET(8, 1)
#endif
#if P16_G1 >= 4
        P16_SET(2, 2)
#endif
#if P16_G1 >= 8
        P16_SET(4, 2)
        P16_SET(2, 3)
        P16_SET(2, 4)
#endif
#undef P16_SET
    default:
        break;
    }
}

P16_AI void p16_gemv(int round, int64_t k, const void *w, int64_t r0, int64_t r1, const void *xq,
                     size_t xq_stride, int n_tok, float *y, int64_t ldy) {
#if defined(P16_HW)
    const int64_t per_tok = k / 2;
#else
    const int64_t per_tok = k;
#endif
    if (k <= 0 || k > P16_PAIRS) { /* no pass fits: the definition */
        (round ? kern_gemv_bf16_p16r_ref : kern_gemv_bf16_p16_ref)(k, w, r0, r1, xq, xq_stride, n_tok, y,
                                                                   ldy);
        return;
    }
    const int pass = (int)(P16_PAIRS / per_tok);
    const size_t gb = (size_t)k * 32; /* bytes of a 16-row group */
    const int64_t gpb = P16_BLOCK / (int64_t)gb > 0 ? P16_BLOCK / (int64_t)gb : 1;
    uint32_t buf[P16_PAIRS];
    const int64_t gend = (r1 + 15) / 16, wend = r1 / 16; /* groups before wend end inside the range */
    for (int64_t b0 = r0 / 16; b0 < gend; b0 += gpb) {
        const int64_t b1 = b0 + gpb < gend ? b0 + gpb : gend;
        for (int p0 = 0; p0 < n_tok; p0 += pass) {
            const int np = n_tok - p0 < pass ? n_tok - p0 : pass;
            const int64_t per =
                p16_act(round, k, (const char *)xq + (size_t)p0 * xq_stride, xq_stride, np, buf);
            const int gmax = np == 1 ? P16_G1_ONE : P16_G1 / np; /* groups a tile takes at once */
            for (int64_t gi = b0; gi < b1;) {
                const int64_t g0 = gi * 16;
                const uint16_t *g = (const uint16_t *)w + (size_t)gi * 16 * (size_t)k;
                const bool whole = g0 >= r0 && g0 + 16 <= r1;
                if (whole && gmax >= 2) {
                    const int64_t avail = (b1 < wend ? b1 : wend) - gi;
                    int ng = gmax;
                    while (ng > avail) ng /= 2;
                    if (ng >= 2) {
                        p16_set(k, g, ng, buf, per, y + (size_t)p0 * (size_t)ldy + g0, ldy, np);
                        gi += ng;
                        continue;
                    }
                }
                for (int t = 0; t < np; t += P16_NT) {
                    const int nt = np - t < P16_NT ? np - t : P16_NT;
                    float tmp[P16_NT * 16];
                    float *dst = whole ? y + (size_t)(p0 + t) * (size_t)ldy + g0 : tmp;
                    p16_one(k, g, buf + (size_t)t * (size_t)per, per, dst, whole ? ldy : 16, nt);
                    if (!whole)
                        cut_tile_store(y + (size_t)(p0 + t) * (size_t)ldy, ldy, tmp, 16, nt, g0, r0, r1);
                }
                gi++;
            }
        }
    }
}

/* TK_LAYOUT_P16R: activations rounded to BF16 */
void KFN(gemv_bf16_p16r)(int64_t k, const void *w, int64_t r0, int64_t r1, const void *xq, size_t xq_stride,
                         int n_tok, float *y, int64_t ldy) {
    p16_gemv(1, k, w, r0, r1, xq, xq_stride, n_tok, y, ldy);
}

#if !defined(P16_HW)
/* TK_LAYOUT_P16: f32 activations */
void KFN(gemv_bf16_p16)(int64_t k, const void *w, int64_t r0, int64_t r1, const void *xq, size_t xq_stride,
                        int n_tok, float *y, int64_t ldy) {
    p16_gemv(0, k, w, r0, r1, xq, xq_stride, n_tok, y, ldy);
}
#endif

#undef P16_NT
#undef P16_ACC
#undef P16_G1
#undef P16_PF_MASK
#undef P16_PF
#undef P16_AI
