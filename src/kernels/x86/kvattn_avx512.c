/* AVX-512 attention over the paged KV cache: the shared body in kvattn_body.h
 * with 16-lane vectors, reductions by _mm512_reduce_*, and 2^n by scalef.
 * Compiled with the AVX-512 flags, so the compiler also gets 32 vector
 * registers. */
#include <immintrin.h>
#include <string.h>

#include "kernels/kernels_ref.h"
#include "kernels/x86/exp_core.h"

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

/* The sums of n <= 16 vectors' lanes by a transposing tree (lanes i + 8,
 * then + 4, + 2, + 1: the order of _mm512_reduce_add_ps), 3 operations per
 * vector and level-pair; absent vectors are zeros, which touch no other
 * vector's sum. Lane 4L + k of the result holds the sum of d[4k + L]. */
AI vf vf_hsum_tree(const vf *d, int n) {
    vf v[16], w[8], u[4], t[2];
#pragma GCC unroll 16
    for (int i = 0; i < 16; i++) v[i] = i < n ? d[i] : _mm512_setzero_ps();
#pragma GCC unroll 16
    for (int k = 0; k < 8; k++)
        w[k] = _mm512_add_ps(_mm512_shuffle_f32x4(v[2 * k], v[2 * k + 1], 0x44),
                             _mm512_shuffle_f32x4(v[2 * k], v[2 * k + 1], 0xEE));
#pragma GCC unroll 16
    for (int k = 0; k < 4; k++)
        u[k] = _mm512_add_ps(_mm512_shuffle_f32x4(w[2 * k], w[2 * k + 1], 0x88),
                             _mm512_shuffle_f32x4(w[2 * k], w[2 * k + 1], 0xDD));
#pragma GCC unroll 16
    for (int k = 0; k < 2; k++)
        t[k] = _mm512_add_ps(_mm512_shuffle_ps(u[2 * k], u[2 * k + 1], _MM_SHUFFLE(1, 0, 1, 0)),
                             _mm512_shuffle_ps(u[2 * k], u[2 * k + 1], _MM_SHUFFLE(3, 2, 3, 2)));
    return _mm512_add_ps(_mm512_shuffle_ps(t[0], t[1], _MM_SHUFFLE(2, 0, 2, 0)),
                         _mm512_shuffle_ps(t[0], t[1], _MM_SHUFFLE(3, 1, 3, 1)));
}
AI void vf_hsum_n(const vf *d, int n, float *out) {
    float x[16];
    _mm512_storeu_ps(x, vf_hsum_tree(d, n));
    for (int i = 0; i < n; i++) out[i] = x[4 * (i % 4) + i / 4];
}

/* Scores of a whole group (R * P == 16 dot products d[r*P + p], kvattn_body.h's
 * store_scores) in vectors: the same sums as vf_hsum_n and the same
 * operations per score in the same order, so the same bits, without going
 * through memory one score at a time. */
#define KV_SCORES_V 1
AI void store_scores_v(const vf *d, const float *off, const float *mul, const float *ks, float scale,
                       float *s, int bs, int j0, const int R, const int P) {
    /* lane m = p*R + r of the result takes the sum of d[r*P + p], which the
     * tree leaves in lane 4 (i % 4) + i / 4 */
    int perm[16], by_p[16], by_r[16];
    for (int m = 0; m < 16; m++) {
        const int r = m % R, p = m / R, i = r * P + p;
        perm[m] = 4 * (i % 4) + i / 4, by_p[m] = p, by_r[m] = r;
    }
    vf y = _mm512_permutexvar_ps(_mm512_loadu_si512(perm), vf_hsum_tree(d, 16));
    if (off) {
        const __mmask16 pm = (__mmask16)((1u << P) - 1);
        const __m512i ip = _mm512_loadu_si512(by_p);
        y = _mm512_mul_ps(_mm512_sub_ps(y, _mm512_permutexvar_ps(ip, _mm512_maskz_loadu_ps(pm, off))),
                          _mm512_permutexvar_ps(ip, _mm512_maskz_loadu_ps(pm, mul)));
    }
    if (ks)
        y = _mm512_mul_ps(y,
                          _mm512_permutexvar_ps(_mm512_loadu_si512(by_r),
                                                _mm512_maskz_loadu_ps((__mmask16)((1u << R) - 1), ks + j0)));
    y = _mm512_mul_ps(y, _mm512_set1_ps(scale));
    /* pair p's R scores are lanes [p*R, p*R + R): a masked store places them
     * at s + p*bs + j0 (bs >= R, so the base stays inside s) */
    for (int p = 0; p < P; p++)
        _mm512_mask_storeu_ps(s + p * bs + j0 - p * R, (__mmask16)(((1u << R) - 1) << (p * R)), y);
}

AI vf vf_exp_neg(vf x) {
    const vf lo = _mm512_set1_ps(-87.0f);
    const __mmask16 under = _mm512_cmp_ps_mask(x, lo, _CMP_LT_OQ);
    x = _mm512_max_ps(x, lo);
    vf n;
    const vf y = exp_core16(x, &n);
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

AI vf vf_abs(vf a) { return _mm512_abs_ps(a); }
AI vf vf_div(vf a, vf b) { return _mm512_div_ps(a, b); }
AI bool vf_any_gt(vf a, vf b) { return _mm512_cmp_ps_mask(a, b, _CMP_GT_OQ) != 0; }
/* t where a > b, else f */
AI vf vf_select_gt(vf a, vf b, vf t, vf f) {
    return _mm512_mask_mov_ps(f, _mm512_cmp_ps_mask(a, b, _CMP_GT_OQ), t);
}
/* p[0..3] repeated over the lanes */
AI vf vf_bcast4(const float *p) { return _mm512_broadcast_f32x4(_mm_loadu_ps(p)); }
AI vf vf_pos_or_zero(vf s, vf v) {
    return _mm512_maskz_mov_ps(_mm512_cmp_ps_mask(s, _mm512_setzero_ps(), _CMP_GT_OQ), v);
}
AI void vf_store_i8(int8_t *y, vf v) {
    v = _mm512_maskz_mov_ps(_mm512_cmp_ps_mask(v, v, _CMP_ORD_Q), v); /* NaN to 0 */
    v = _mm512_min_ps(_mm512_max_ps(v, _mm512_set1_ps(-127.0f)), _mm512_set1_ps(127.0f));
    _mm_storeu_si128((__m128i *)y, _mm512_cvtsepi32_epi8(_mm512_cvtps_epi32(v)));
}

/* int8 K against int8 queries by vpdpbusd: K made unsigned by ^ 0x80 (one op
 * per 64 bytes, shared by the tile's queries), 128 * sum(q) taken off after. */
#define KV_Q8 1
typedef __m512i vq;
AI vq vq_zero(void) { return _mm512_setzero_si512(); }
AI vq vq_load_k(const uint8_t *row, int c, int hd) {
    const __m512i k = hd - c >= 64 ? _mm512_loadu_si512(row + c)
                                   : _mm512_maskz_loadu_epi8((__mmask64)((1ull << (hd - c)) - 1), row + c);
    return _mm512_xor_si512(k, _mm512_set1_epi8((char)0x80));
}
AI vq vq_dot(vq acc, vq k, const int8_t *q8) { return _mm512_dpbusd_epi32(acc, k, _mm512_loadu_si512(q8)); }
AI vf vq_to_f(vq v) { return _mm512_cvtepi32_ps(v); }
AI vq vq_load_k4(const uint8_t *p) {
    return _mm512_xor_si512(_mm512_loadu_si512(p), _mm512_set1_epi8((char)0x80));
}
AI vq vq_dot4(vq acc, vq k, const int8_t *q4) {
    int32_t x;
    memcpy(&x, q4, sizeof x);
    return _mm512_dpbusd_epi32(acc, k, _mm512_set1_epi32(x));
}
/* 128 times the sum of n int8s (n % 64 == 0), what the unsigned K adds: byte
 * sums of q + 128 by vpsadbw, less 128 n. */
AI float vq_off(const int8_t *q, size_t n) {
    __m512i a = _mm512_setzero_si512();
    for (size_t c = 0; c < n; c += 64)
        a = _mm512_add_epi64(
            a, _mm512_sad_epu8(_mm512_xor_si512(_mm512_loadu_si512(q + c), _mm512_set1_epi8((char)0x80)),
                               _mm512_setzero_si512()));
    return 128.0f * (float)(int32_t)(_mm512_reduce_add_epi64(a) - 128 * (long long)n);
}

#include "kernels/x86/kvattn_body.h"
