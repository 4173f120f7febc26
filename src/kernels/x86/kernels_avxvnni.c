/* AVX2 + AVX-VNNI kernels: the AVX2 build of the shared bodies in simd_body.h
 * (16 ymm registers, the same tiles) with the VEX-encoded vpdpbusd for the
 * int8 dots in place of maddubs + madd, for CPUs with AVX-VNNI and no (or
 * hidden) AVX-512. The 16-row Q8_0 layout takes the unsigned-weight form of
 * the 512-bit kernel (X16_FLIP): one vpdpbusd per token and chunk, no sign
 * trick. The integer block dots are exact and the float steps those of the
 * AVX2 build, so every output is bitwise the AVX2 level's. */
#include "kernels/kernels_ref.h"

#include <immintrin.h>

/* A test build overrides these to run other tile shapes (tests/kernels). */
#ifndef KNT
#define KNT 2
#endif
#ifndef KNT_K
#define KNT_K 4
#endif
#ifndef KNT_X8
#define KNT_X8 4
#endif
/* The 16-row Q8_0/Q4_0 tile takes both 8-row halves in one pass (simd_body.h):
 * 3 tokens of 4 accumulators each, beside two weight vectors and the
 * broadcast chunk, fill the 16 registers */
#ifndef KNT_X16
#define KNT_X16 3
#endif
/* Q8_0 X16 by w ^ 0x80 and activation sums (simd_body.h) */
#define X16_FLIP 1
#ifndef KFN
#define KFN(name) kern_##name##_avxvnni
#endif

static inline __attribute__((always_inline)) __m256i dot_s8(__m256i aw, __m256i w, __m256i x) {
    return _mm256_dpbusd_avx_epi32(_mm256_setzero_si256(), aw, _mm256_sign_epi8(x, w));
}

static inline __attribute__((always_inline)) __m256i dot_s8_acc(__m256i a, __m256i aw, __m256i w, __m256i x) {
    return _mm256_dpbusd_avx_epi32(a, aw, _mm256_sign_epi8(x, w));
}

static inline __attribute__((always_inline)) __m256i dot_u8s8(__m256i u, __m256i x) {
    return _mm256_dpbusd_avx_epi32(_mm256_setzero_si256(), u, x);
}

#define dot_u8s8_acc(a, u, x) _mm256_dpbusd_avx_epi32(a, u, x)

#include "kernels/x86/bf16p_body.h"
#include "kernels/x86/simd_body.h"
