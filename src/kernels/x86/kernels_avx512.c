/* AVX-512 (F/BW/VL/VNNI) kernels: the shared bodies in simd_body.h with a
 * VNNI int8 dot (one vpdpbusd instead of maddubs + madd), compiled with the
 * AVX-512 flags so the compiler also gets 32 vector registers. */
#include "kernels/kernels_ref.h"

#include <immintrin.h>

/* A test build overrides these to run other tile shapes (tests/kernels). */
#ifndef KNT
#define KNT 4
#endif
#ifndef KNT_K
#define KNT_K 4
#endif
#ifndef KNT_X8
#define KNT_X8 8
#endif
/* X16 tiles of one group take one token (several tokens run in pairs of
 * groups, KNT_X16P; simd_body.h) or a group cut by a thread's rows */
#ifndef KNT_X16
#define KNT_X16 7
#endif
/* X16 and the element-wise SiLU·mul in 512-bit registers (simd_body.h) */
#define X16_ZMM 1
#define ELT_ZMM 1
#ifndef KFN
#define KFN(name) kern_##name##_avx512
#endif

static inline __attribute__((always_inline)) __m256i dot_s8(__m256i aw, __m256i w, __m256i x) {
    return _mm256_dpbusd_epi32(_mm256_setzero_si256(), aw, _mm256_sign_epi8(x, w));
}

static inline __attribute__((always_inline)) __m256i dot_s8_acc(__m256i a, __m256i aw, __m256i w, __m256i x) {
    return _mm256_dpbusd_epi32(a, aw, _mm256_sign_epi8(x, w));
}

static inline __attribute__((always_inline)) __m256i dot_u8s8(__m256i u, __m256i x) {
    return _mm256_dpbusd_epi32(_mm256_setzero_si256(), u, x);
}

#include "kernels/x86/simd_body.h"
#define P16_ZMM 1 /* bf16p_body.h: FMA steps in 512-bit registers */
#include "kernels/x86/bf16p_body.h"
