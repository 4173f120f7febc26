/* The exponential the x86 kernels share (Cephes expf coefficients, ~2 ulp):
 * for x in [-87, 88], n = round(x log2 e), r = x - n ln2 in [-ln2/2, ln2/2]
 * (ln2 split in two so r is exact enough) and exp(r) by a degree-6
 * polynomial, so exp(x) = exp(r) 2^n. Callers clamp x and apply 2^n as they
 * need (SiLU clamps both ends, attention's scores are <= 0 and go to 0 below
 * -87). One form per register width, the same operations, so the same bits
 * lane by lane at every level. Included by files compiled with AVX2 + FMA
 * (and AVX-512 F for the 16-lane form). */
#ifndef TK_KERNELS_X86_EXP_CORE_H
#define TK_KERNELS_X86_EXP_CORE_H

#include <immintrin.h>

/* exp(r) for x's r; n: round(x log2 e) */
static inline __attribute__((always_inline)) __m256 exp_core8(__m256 x, __m256 *n) {
    *n = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(1.44269504088896341f)),
                         _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m256 r = _mm256_fnmadd_ps(*n, _mm256_set1_ps(0.693359375f), x);
    r = _mm256_fnmadd_ps(*n, _mm256_set1_ps(-2.12194440e-4f), r);
    __m256 p = _mm256_set1_ps(1.9875691500e-4f);
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.3981999507e-3f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(8.3334519073e-3f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(4.1665795894e-2f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.6666665459e-1f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(5.0000001201e-1f));
    return _mm256_fmadd_ps(p, _mm256_mul_ps(r, r), _mm256_add_ps(r, _mm256_set1_ps(1.0f)));
}

/* 2^n for integral n in [-126, 127] (a normal exponent) */
static inline __attribute__((always_inline)) __m256 exp_pow2_8(__m256 n) {
    return _mm256_castsi256_ps(
        _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23));
}

#if defined(__AVX512F__)
static inline __attribute__((always_inline)) __m512 exp_core16(__m512 x, __m512 *n) {
    *n = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(1.44269504088896341f)),
                              _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m512 r = _mm512_fnmadd_ps(*n, _mm512_set1_ps(0.693359375f), x);
    r = _mm512_fnmadd_ps(*n, _mm512_set1_ps(-2.12194440e-4f), r);
    __m512 p = _mm512_set1_ps(1.9875691500e-4f);
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.3981999507e-3f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(8.3334519073e-3f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(4.1665795894e-2f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.6666665459e-1f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(5.0000001201e-1f));
    return _mm512_fmadd_ps(p, _mm512_mul_ps(r, r), _mm512_add_ps(r, _mm512_set1_ps(1.0f)));
}

static inline __attribute__((always_inline)) __m512 exp_pow2_16(__m512 n) {
    return _mm512_castsi512_ps(
        _mm512_slli_epi32(_mm512_add_epi32(_mm512_cvtps_epi32(n), _mm512_set1_epi32(127)), 23));
}
#endif

#endif
