/* AVX-512 attention over the paged KV cache: the shared body in kvattn_body.h
 * with 16-lane vectors, reductions by _mm512_reduce_*, and 2^n by scalef.
 * Compiled with the AVX-512 flags, so the compiler also gets 32 vector
 * registers. */
#include <immintrin.h>

#include "kernels/kernels_ref.h"

#define AI        static inline __attribute__((always_inline))
#define KFN(name) name##_avx512
#define VL        16
typedef __m512 vf;

AI vf vf_load(const float *p) { return _mm512_loadu_ps(p); }
AI void vf_store(float *p, vf v) { _mm512_storeu_ps(p, v); }
AI vf vf_set1(float x) { return _mm512_set1_ps(x); }
AI vf vf_zero(void) { return _mm512_setzero_ps(); }
AI vf vf_add(vf a, vf b) { return _mm512_add_ps(a, b); }
AI vf vf_sub(vf a, vf b) { return _mm512_sub_ps(a, b); }
AI vf vf_mul(vf a, vf b) { return _mm512_mul_ps(a, b); }
AI vf vf_max(vf a, vf b) { return _mm512_max_ps(a, b); }
AI vf vf_fmadd(vf a, vf b, vf c) { return _mm512_fmadd_ps(a, b, c); }
AI float vf_hsum(vf v) { return _mm512_reduce_add_ps(v); }
AI float vf_hmax(vf v) { return _mm512_reduce_max_ps(v); }

AI vf vf_exp_neg(vf x) {
    const vf lo = _mm512_set1_ps(-87.0f);
    const __mmask16 under = _mm512_cmp_ps_mask(x, lo, _CMP_LT_OQ);
    x = _mm512_max_ps(x, lo);
    const vf n = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(1.44269504088896341f)),
                                      _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    /* r = x - n ln2, with ln2 split in two so r is exact enough */
    vf r = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693359375f), x);
    r = _mm512_fnmadd_ps(n, _mm512_set1_ps(-2.12194440e-4f), r);
    vf p = _mm512_set1_ps(1.9875691500e-4f);
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.3981999507e-3f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(8.3334519073e-3f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(4.1665795894e-2f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.6666665459e-1f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(5.0000001201e-1f));
    const vf y = _mm512_fmadd_ps(p, _mm512_mul_ps(r, r), _mm512_add_ps(r, _mm512_set1_ps(1.0f)));
    return _mm512_maskz_mov_ps((__mmask16)~under, _mm512_scalef_ps(y, n));
}

AI vf vf_load_kv(const uint8_t *row, int c, const tk_kv_type type) {
    switch (type) {
    case TK_KV_F32:
        return _mm512_loadu_ps((const float *)row + c);
    case TK_KV_F16:
        return _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)((const uint16_t *)row + c)));
    case TK_KV_BF16: {
        __m512i w = _mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i *)((const uint16_t *)row + c)));
        return _mm512_castsi512_ps(_mm512_slli_epi32(w, 16));
    }
    case TK_KV_INT8:
    default:
        return _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)(row + c))));
    }
}

AI void vf_store_f16(tk_f16 *y, vf v) {
    _mm256_storeu_si256((__m256i *)y, _mm512_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
}

#include "kernels/x86/kvattn_body.h"
