/* The 256-bit vector operations of the x86 attention body (kvattn_body.h)
 * for AVX2 + FMA + F16C, shared by the AVX2 and AVX-VNNI attention files:
 * each defines KFN (and, with int8 dot products, KV_Q8 and the vq_
 * operations), includes this header, then kvattn_body.h. */
#ifndef TK_KVATTN_256_H
#define TK_KVATTN_256_H

#include <immintrin.h>

#include "kernels/kernels_ref.h"
#include "kernels/x86/exp_core.h"

#define AI static inline __attribute__((always_inline))
#define VL 8
typedef __m256 vf;

AI vf vf_load(const float *p) { return _mm256_loadu_ps(p); }
AI void vf_store(float *p, vf v) { _mm256_storeu_ps(p, v); }
AI vf vf_set1(float x) { return _mm256_set1_ps(x); }
AI vf vf_zero(void) { return _mm256_setzero_ps(); }
AI vf vf_add(vf a, vf b) { return _mm256_add_ps(a, b); }
AI vf vf_sub(vf a, vf b) { return _mm256_sub_ps(a, b); }
AI vf vf_mul(vf a, vf b) { return _mm256_mul_ps(a, b); }
AI vf vf_max(vf a, vf b) { return _mm256_max_ps(a, b); }
AI vf vf_fmadd(vf a, vf b, vf c) { return _mm256_fmadd_ps(a, b, c); }

AI float vf_hsum(vf v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

AI float vf_hmax(vf v) {
    __m128 s = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_max_ps(s, _mm_movehl_ps(s, s));
    s = _mm_max_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

/* The sums of n <= 8 vectors' lanes by a transposing tree (lanes i + 4, then
 * + 2, + 1: the order of vf_hsum); absent vectors are zeros, which touch no
 * other vector's sum. Lane 4H + k of the result holds the sum of d[2k + H]. */
AI void vf_hsum_n(const vf *d, int n, float *out) {
    vf v[8], w[4], t[2];
#pragma GCC unroll 16
    for (int i = 0; i < 8; i++) v[i] = i < n ? d[i] : _mm256_setzero_ps();
#pragma GCC unroll 16
    for (int k = 0; k < 4; k++)
        w[k] = _mm256_add_ps(_mm256_permute2f128_ps(v[2 * k], v[2 * k + 1], 0x20),
                             _mm256_permute2f128_ps(v[2 * k], v[2 * k + 1], 0x31));
#pragma GCC unroll 16
    for (int k = 0; k < 2; k++)
        t[k] = _mm256_add_ps(_mm256_shuffle_ps(w[2 * k], w[2 * k + 1], _MM_SHUFFLE(1, 0, 1, 0)),
                             _mm256_shuffle_ps(w[2 * k], w[2 * k + 1], _MM_SHUFFLE(3, 2, 3, 2)));
    const vf r = _mm256_add_ps(_mm256_shuffle_ps(t[0], t[1], _MM_SHUFFLE(2, 0, 2, 0)),
                               _mm256_shuffle_ps(t[0], t[1], _MM_SHUFFLE(3, 1, 3, 1)));
    float x[8];
    _mm256_storeu_ps(x, r);
    for (int i = 0; i < n; i++) out[i] = x[4 * (i % 2) + i / 2];
}

AI vf vf_exp_neg(vf x) {
    const vf lo = _mm256_set1_ps(-87.0f);
    const vf under = _mm256_cmp_ps(x, lo, _CMP_LT_OQ);
    x = _mm256_max_ps(x, lo);
    vf n; /* in [-126, 0]: a normal exponent */
    const vf y = exp_core8(x, &n);
    return _mm256_andnot_ps(under, _mm256_mul_ps(y, exp_pow2_8(n)));
}

AI vf vf_load_kv(const uint8_t *row, int c, const tk_kv_type type) {
    switch (type) {
    case TK_KV_F32:
        return _mm256_loadu_ps((const float *)row + c);
    case TK_KV_F16:
        return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)((const uint16_t *)row + c)));
    case TK_KV_BF16: {
        __m256i w = _mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)((const uint16_t *)row + c)));
        return _mm256_castsi256_ps(_mm256_slli_epi32(w, 16));
    }
    case TK_KV_INT8:
    default:
        return _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)(row + c))));
    }
}

AI void vf_store_f16(tk_f16 *y, vf v) {
    _mm_storeu_si128((__m128i *)y, _mm256_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
}

AI vf vf_abs(vf a) { return _mm256_andnot_ps(_mm256_set1_ps(-0.0f), a); }
AI vf vf_div(vf a, vf b) { return _mm256_div_ps(a, b); }
AI bool vf_any_gt(vf a, vf b) { return _mm256_movemask_ps(_mm256_cmp_ps(a, b, _CMP_GT_OQ)) != 0; }
/* t where a > b, else f */
AI vf vf_select_gt(vf a, vf b, vf t, vf f) { return _mm256_blendv_ps(f, t, _mm256_cmp_ps(a, b, _CMP_GT_OQ)); }
/* p[0..3] repeated over the lanes */
AI vf vf_bcast4(const float *p) { return _mm256_broadcast_ps((const __m128 *)p); }
AI vf vf_pos_or_zero(vf s, vf v) {
    return _mm256_and_ps(v, _mm256_cmp_ps(s, _mm256_setzero_ps(), _CMP_GT_OQ));
}
AI void vf_store_i8(int8_t *y, vf v) {
    v = _mm256_and_ps(v, _mm256_cmp_ps(v, v, _CMP_ORD_Q)); /* NaN to 0 */
    v = _mm256_min_ps(_mm256_max_ps(v, _mm256_set1_ps(-127.0f)), _mm256_set1_ps(127.0f));
    const __m256i i = _mm256_cvtps_epi32(v);
    const __m128i w = _mm_packs_epi32(_mm256_castsi256_si128(i), _mm256_extracti128_si256(i, 1));
    _mm_storel_epi64((__m128i *)y, _mm_packs_epi16(w, w));
}

#endif
