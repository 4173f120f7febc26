/* AVX2 + FMA + F16C kernels: the shared bodies in simd_body.h with the
 * maddubs/madd sign-trick int8 dot. */
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
#ifndef KFN
#define KFN(name) kern_##name##_avx2
#endif
/* one-token Q8_0 X16 passes fetch their weights ahead (simd_body.h, x16_pf) */
#define X16_AHEAD_ONE 1

/* maddubs needs an unsigned operand: |w| times x carrying w's sign. A pair
 * reaches at most 2 * 128 * 127 = 32512 < 32767, so it never saturates. */
static inline __attribute__((always_inline)) __m256i dot_s8(__m256i aw, __m256i w, __m256i x) {
    __m256i p = _mm256_maddubs_epi16(aw, _mm256_sign_epi8(x, w));
    return _mm256_madd_epi16(p, _mm256_set1_epi16(1));
}

static inline __attribute__((always_inline)) __m256i dot_s8_acc(__m256i a, __m256i aw, __m256i w, __m256i x) {
    return _mm256_add_epi32(a, dot_s8(aw, w, x));
}

static inline __attribute__((always_inline)) __m256i dot_u8s8(__m256i u, __m256i x) {
    return _mm256_madd_epi16(_mm256_maddubs_epi16(u, x), _mm256_set1_epi16(1));
}

#include "kernels/x86/bf16p_body.h"
#include "kernels/x86/simd_body.h"
