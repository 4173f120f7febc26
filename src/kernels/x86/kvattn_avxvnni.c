/* AVX2 + AVX-VNNI attention over the paged KV cache: the AVX2 level's body
 * (kvattn_256.h, kvattn_body.h) with int8 K dotted against int8 queries by
 * the VEX-encoded vpdpbusd (kv_geom.q8), as the AVX-512 level does with
 * 16 lanes: K made unsigned by ^ 0x80 (one op per 32 bytes, shared by the
 * tile's queries), 128 * sum(q) taken off after. The integer dots are exact,
 * so the scores are the reference's int8-query bits; the other KV types run
 * the AVX2 level's arithmetic. */
#include <string.h>

#define KFN(name) name##_avxvnni
#include "kernels/x86/kvattn_256.h"

#define KV_Q8 1
typedef __m256i vq;
AI vq vq_zero(void) { return _mm256_setzero_si256(); }
AI vq vq_load_k4(const uint8_t *p) {
    return _mm256_xor_si256(_mm256_loadu_si256((const __m256i *)p), _mm256_set1_epi8((char)0x80));
}
AI vq vq_load_k(const uint8_t *row, int c, int hd) {
    if (hd - c >= 32) return vq_load_k4(row + c);
    /* the zeros past hd become 128: the query's bytes there are 0 */
    uint8_t t[32] = {0};
    memcpy(t, row + c, (size_t)(hd - c));
    return vq_load_k4(t);
}
AI vq vq_dot(vq acc, vq k, const int8_t *q8) {
    return _mm256_dpbusd_avx_epi32(acc, k, _mm256_loadu_si256((const __m256i *)q8));
}
AI vf vq_to_f(vq v) { return _mm256_cvtepi32_ps(v); }
AI vq vq_dot4(vq acc, vq k, const int8_t *q4) {
    int32_t x;
    memcpy(&x, q4, sizeof x);
    return _mm256_dpbusd_avx_epi32(acc, k, _mm256_set1_epi32(x));
}
/* 128 times the sum of n int8s (n % 32 == 0), what the unsigned K adds: byte
 * sums of q + 128 by vpsadbw, less 128 n. */
AI float vq_off(const int8_t *q, size_t n) {
    __m256i a = _mm256_setzero_si256();
    for (size_t c = 0; c < n; c += 32)
        a = _mm256_add_epi64(a, _mm256_sad_epu8(_mm256_xor_si256(_mm256_loadu_si256((const __m256i *)(q + c)),
                                                                 _mm256_set1_epi8((char)0x80)),
                                                _mm256_setzero_si256()));
    __m128i h = _mm_add_epi64(_mm256_castsi256_si128(a), _mm256_extracti128_si256(a, 1));
    h = _mm_add_epi64(h, _mm_unpackhi_epi64(h, h));
    return 128.0f * (float)(int32_t)(_mm_cvtsi128_si64(h) - 128 * (long long)n);
}

#include "kernels/x86/kvattn_body.h"
