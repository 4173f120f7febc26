/* Vectorised vocabulary passes of the sampler (see sampler_simd.h). The SIMD
 * loops use per-function target attributes, so this file builds with the
 * library's plain flags and a loop runs only on a CPU that has its ISA. */
#include "engine/sampler_simd.h"

#include <math.h>
#include <stdatomic.h>
#include <string.h>

#if defined(__x86_64__)
#include <immintrin.h>
#define SAMP_X86 1
#else
#define SAMP_X86 0
#endif

/* exp(x) = 2^k * exp(r), k = round(x / ln 2), r = x - k ln 2 in two parts
 * (Cody-Waite), exp(r) on [-ln2/2, ln2/2] by a degree-6 polynomial. */
#define EXP_LO (-87.3f) /* below: 0 (float exp is denormal there) */
#define LOG2E  1.44269504088896341f
#define LN2_HI 0.693359375f
#define LN2_LO (-2.12194440e-4f)
#define P0     1.9875691500e-4f
#define P1     1.3981999507e-3f
#define P2     8.3334519073e-3f
#define P3     4.1665795894e-2f
#define P4     1.6666665459e-1f
#define P5     5.0000001201e-1f

float samp_expf(float x) {
    if (!(x >= EXP_LO)) return 0.0f; /* -inf, NaN and the deep tail */
    if (x > 88.0f) x = 88.0f;
    float k = nearbyintf(x * LOG2E);
    float r = x - k * LN2_HI;
    r = r - k * LN2_LO;
    float r2 = r * r;
    float p = ((((P0 * r + P1) * r + P2) * r + P3) * r + P4) * r + P5;
    float e = p * r2 + r + 1.0f;
    uint32_t bits; /* 2^k into the exponent field: unsigned, so a negative k is no UB shift */
    memcpy(&bits, &e, sizeof bits);
    bits += (uint32_t)(int32_t)k << 23;
    memcpy(&e, &bits, sizeof e);
    return e;
}

/* ---- scalar reference -------------------------------------------------------- */

static float max_clean_scalar(float *x, int n, int32_t *arg) {
    float m = -INFINITY;
    int32_t a = -1;
    for (int i = 0; i < n; i++) {
        if (isnan(x[i])) x[i] = -INFINITY;
        if (x[i] > m) m = x[i], a = i;
    }
    *arg = a;
    return m;
}

/* Sums in double: a float accumulator over 150k terms would lose ~1e-5. */
static double sum_exp_scalar(const float *x, int n, float m) {
    double s = 0;
    for (int i = 0; i < n; i++) s += samp_expf(x[i] - m);
    return s;
}

static void scale_exp_scalar(const float *l, int n, float inv_t, float vmax, float *w, uint16_t *b) {
    for (int i = 0; i < n; i++) {
        const float v = l[i] * inv_t;
        w[i] = l[i] == -INFINITY ? 0.0f : samp_expf(v - vmax);
        b[i] = (uint16_t)samp_bucket(l[i], inv_t, vmax);
    }
}

static int find_u16_scalar(const uint16_t *b, int n, uint16_t v, int32_t *out) {
    int m = 0;
    for (int i = 0; i < n; i++)
        if (b[i] == v) out[m++] = i;
    return m;
}

/* First index of m in x (it is there). */
static int32_t first_of(const float *x, int n, float m) {
    for (int i = 0; i < n; i++)
        if (x[i] == m) return i;
    return -1;
}

#if SAMP_X86
/* ---- AVX2 --------------------------------------------------------------------- */

__attribute__((target("avx2,fma"))) static inline __m256 exp_avx2(__m256 x) {
    __m256 keep = _mm256_cmp_ps(x, _mm256_set1_ps(EXP_LO), _CMP_GE_OQ);
    x = _mm256_min_ps(_mm256_max_ps(x, _mm256_set1_ps(EXP_LO)), _mm256_set1_ps(88.0f));
    __m256 k = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(LOG2E)),
                               _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m256 r = _mm256_fnmadd_ps(k, _mm256_set1_ps(LN2_HI), x);
    r = _mm256_fnmadd_ps(k, _mm256_set1_ps(LN2_LO), r);
    __m256 r2 = _mm256_mul_ps(r, r);
    __m256 p = _mm256_fmadd_ps(_mm256_set1_ps(P0), r, _mm256_set1_ps(P1));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(P2));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(P3));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(P4));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(P5));
    __m256 e = _mm256_add_ps(_mm256_fmadd_ps(p, r2, r), _mm256_set1_ps(1.0f));
    __m256i bits = _mm256_add_epi32(_mm256_castps_si256(e), _mm256_slli_epi32(_mm256_cvtps_epi32(k), 23));
    return _mm256_and_ps(_mm256_castsi256_ps(bits), keep);
}

__attribute__((target("avx2,fma"))) static float max_clean_avx2(float *x, int n, int32_t *arg) {
    __m256 m = _mm256_set1_ps(-INFINITY), ninf = m;
    int i = 0;
    for (; i + 8 <= n; i += 8) {
        __m256 v = _mm256_loadu_ps(x + i);
        __m256 nan = _mm256_cmp_ps(v, v, _CMP_UNORD_Q);
        if (!_mm256_testz_ps(nan, nan)) {
            v = _mm256_blendv_ps(v, ninf, nan);
            _mm256_storeu_ps(x + i, v);
        }
        m = _mm256_max_ps(m, v);
    }
    float lanes[8], mx = -INFINITY;
    _mm256_storeu_ps(lanes, m);
    for (int j = 0; j < 8; j++)
        if (lanes[j] > mx) mx = lanes[j];
    for (; i < n; i++) {
        if (isnan(x[i])) x[i] = -INFINITY;
        if (x[i] > mx) mx = x[i];
    }
    *arg = mx == -INFINITY ? -1 : first_of(x, n, mx);
    return mx;
}

__attribute__((target("avx2,fma"))) static double sum_exp_avx2(const float *x, int n, float m) {
    __m256d lo = _mm256_setzero_pd(), hi = lo;
    __m256 mv = _mm256_set1_ps(m);
    int i = 0;
    for (; i + 8 <= n; i += 8) {
        __m256 e = exp_avx2(_mm256_sub_ps(_mm256_loadu_ps(x + i), mv));
        lo = _mm256_add_pd(lo, _mm256_cvtps_pd(_mm256_castps256_ps128(e)));
        hi = _mm256_add_pd(hi, _mm256_cvtps_pd(_mm256_extractf128_ps(e, 1)));
    }
    double lanes[4], s = 0;
    _mm256_storeu_pd(lanes, _mm256_add_pd(lo, hi));
    for (int j = 0; j < 4; j++) s += lanes[j];
    for (; i < n; i++) s += samp_expf(x[i] - m);
    return s;
}

__attribute__((target("avx2,fma"))) static void scale_exp_avx2(const float *l, int n, float inv_t, float vmax,
                                                               float *w, uint16_t *b) {
    const __m256 it = _mm256_set1_ps(inv_t), mx = _mm256_set1_ps(vmax), ninf = _mm256_set1_ps(-INFINITY);
    const __m256 span = _mm256_set1_ps((float)SAMP_SPAN), per = _mm256_set1_ps((float)SAMP_PER_UNIT);
    const __m256i tail = _mm256_set1_epi32(SAMP_TAIL), none = _mm256_set1_epi32(SAMP_NONE);
    int i = 0;
    for (; i + 8 <= n; i += 8) {
        const __m256 x = _mm256_loadu_ps(l + i);
        const __m256 v = _mm256_mul_ps(x, it);
        const __m256 d = _mm256_sub_ps(mx, v);
        const __m256 banned = _mm256_cmp_ps(x, ninf, _CMP_EQ_OQ);
        _mm256_storeu_ps(w + i, _mm256_andnot_ps(banned, exp_avx2(_mm256_sub_ps(v, mx))));
        /* d < SPAN: floor(d * PER) (d >= 0 and the product exact); else the tail */
        const __m256 near = _mm256_cmp_ps(d, span, _CMP_LT_OQ);
        __m256i k = _mm256_cvttps_epi32(_mm256_mul_ps(_mm256_and_ps(d, near), per));
        k = _mm256_blendv_epi8(tail, k, _mm256_castps_si256(near));
        k = _mm256_blendv_epi8(k, none, _mm256_castps_si256(banned));
        const __m128i p = _mm_packus_epi32(_mm256_castsi256_si128(k), _mm256_extracti128_si256(k, 1));
        _mm_storeu_si128((__m128i *)(b + i), p);
    }
    scale_exp_scalar(l + i, n - i, inv_t, vmax, w + i, b + i);
}

__attribute__((target("avx2"))) static int find_u16_avx2(const uint16_t *b, int n, uint16_t v, int32_t *out) {
    const __m256i vv = _mm256_set1_epi16((short)v);
    int m = 0, i = 0;
    for (; i + 16 <= n; i += 16) {
        const __m256i eq = _mm256_cmpeq_epi16(_mm256_loadu_si256((const __m256i *)(b + i)), vv);
        uint32_t bits = (uint32_t)_mm256_movemask_epi8(eq) & 0x55555555u; /* one bit per lane */
        while (bits) {
            out[m++] = i + (__builtin_ctz(bits) >> 1);
            bits &= bits - 1;
        }
    }
    for (; i < n; i++)
        if (b[i] == v) out[m++] = i;
    return m;
}

/* ---- AVX-512 ------------------------------------------------------------------------- */

__attribute__((target("avx512f"))) static inline __m512 exp_avx512(__m512 x) {
    __mmask16 keep = _mm512_cmp_ps_mask(x, _mm512_set1_ps(EXP_LO), _CMP_GE_OQ);
    x = _mm512_min_ps(_mm512_max_ps(x, _mm512_set1_ps(EXP_LO)), _mm512_set1_ps(88.0f));
    __m512 k = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(LOG2E)),
                                    _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m512 r = _mm512_fnmadd_ps(k, _mm512_set1_ps(LN2_HI), x);
    r = _mm512_fnmadd_ps(k, _mm512_set1_ps(LN2_LO), r);
    __m512 r2 = _mm512_mul_ps(r, r);
    __m512 p = _mm512_fmadd_ps(_mm512_set1_ps(P0), r, _mm512_set1_ps(P1));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(P2));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(P3));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(P4));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(P5));
    __m512 e = _mm512_add_ps(_mm512_fmadd_ps(p, r2, r), _mm512_set1_ps(1.0f));
    __m512i bits = _mm512_add_epi32(_mm512_castps_si512(e), _mm512_slli_epi32(_mm512_cvtps_epi32(k), 23));
    return _mm512_maskz_mov_ps(keep, _mm512_castsi512_ps(bits));
}

__attribute__((target("avx512f"))) static float max_clean_avx512(float *x, int n, int32_t *arg) {
    __m512 m = _mm512_set1_ps(-INFINITY), ninf = m;
    int i = 0;
    for (; i + 16 <= n; i += 16) {
        __m512 v = _mm512_loadu_ps(x + i);
        __mmask16 nan = _mm512_cmp_ps_mask(v, v, _CMP_UNORD_Q);
        if (nan) {
            v = _mm512_mask_mov_ps(v, nan, ninf);
            _mm512_storeu_ps(x + i, v);
        }
        m = _mm512_max_ps(m, v);
    }
    float mx = _mm512_reduce_max_ps(m);
    for (; i < n; i++) {
        if (isnan(x[i])) x[i] = -INFINITY;
        if (x[i] > mx) mx = x[i];
    }
    *arg = mx == -INFINITY ? -1 : first_of(x, n, mx);
    return mx;
}

__attribute__((target("avx512f"))) static double sum_exp_avx512(const float *x, int n, float m) {
    __m512d lo = _mm512_setzero_pd(), hi = lo;
    __m512 mv = _mm512_set1_ps(m);
    int i = 0;
    for (; i + 16 <= n; i += 16) {
        __m512 e = exp_avx512(_mm512_sub_ps(_mm512_loadu_ps(x + i), mv));
        lo = _mm512_add_pd(lo, _mm512_cvtps_pd(_mm512_castps512_ps256(e)));
        hi = _mm512_add_pd(hi,
                           _mm512_cvtps_pd(_mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(e), 1))));
    }
    double s = _mm512_reduce_add_pd(_mm512_add_pd(lo, hi));
    for (; i < n; i++) s += samp_expf(x[i] - m);
    return s;
}

__attribute__((target("avx512f"))) static void scale_exp_avx512(const float *l, int n, float inv_t,
                                                                float vmax, float *w, uint16_t *b) {
    const __m512 it = _mm512_set1_ps(inv_t), mx = _mm512_set1_ps(vmax), ninf = _mm512_set1_ps(-INFINITY);
    const __m512 span = _mm512_set1_ps((float)SAMP_SPAN), per = _mm512_set1_ps((float)SAMP_PER_UNIT);
    const __m512i tail = _mm512_set1_epi32(SAMP_TAIL), none = _mm512_set1_epi32(SAMP_NONE);
    int i = 0;
    for (; i + 16 <= n; i += 16) {
        const __m512 x = _mm512_loadu_ps(l + i);
        const __m512 v = _mm512_mul_ps(x, it);
        const __m512 d = _mm512_sub_ps(mx, v);
        const __mmask16 banned = _mm512_cmp_ps_mask(x, ninf, _CMP_EQ_OQ);
        _mm512_storeu_ps(w + i, _mm512_maskz_mov_ps((__mmask16)~banned, exp_avx512(_mm512_sub_ps(v, mx))));
        const __mmask16 near = _mm512_cmp_ps_mask(d, span, _CMP_LT_OQ);
        __m512i k = _mm512_mask_cvttps_epi32(tail, near, _mm512_mul_ps(d, per));
        k = _mm512_mask_mov_epi32(k, banned, none);
        _mm256_storeu_si256((__m256i *)(b + i), _mm512_cvtepi32_epi16(k));
    }
    scale_exp_scalar(l + i, n - i, inv_t, vmax, w + i, b + i);
}
__attribute__((target("avx512f,avx512bw"))) static int find_u16_avx512(const uint16_t *b, int n, uint16_t v,
                                                                       int32_t *out) {
    const __m512i vv = _mm512_set1_epi16((short)v);
    int m = 0, i = 0;
    for (; i + 32 <= n; i += 32) {
        uint32_t bits = _mm512_cmpeq_epi16_mask(_mm512_loadu_si512(b + i), vv);
        while (bits) {
            out[m++] = i + __builtin_ctz(bits);
            bits &= bits - 1;
        }
    }
    for (; i < n; i++)
        if (b[i] == v) out[m++] = i;
    return m;
}
#endif

static const samp_simd SAMP_SCALAR = {max_clean_scalar, sum_exp_scalar, scale_exp_scalar, find_u16_scalar};
#if SAMP_X86
static const samp_simd SAMP_AVX2 = {max_clean_avx2, sum_exp_avx2, scale_exp_avx2, find_u16_avx2};
static const samp_simd SAMP_AVX512 = {max_clean_avx512, sum_exp_avx512, scale_exp_avx512, find_u16_avx512};
#endif

const samp_simd *samp_simd_for(tk_isa isa) {
#if SAMP_X86
    if (isa == TK_ISA_AVX512) return &SAMP_AVX512;
    if (isa >= TK_ISA_AVX2) return &SAMP_AVX2; /* avxvnni too */
#endif
    (void)isa;
    return &SAMP_SCALAR;
}

const samp_simd *samp_simd_default(void) {
    static _Atomic(const samp_simd *) cached = NULL;
    const samp_simd *t = atomic_load_explicit(&cached, memory_order_acquire);
    if (!t) {
        tk_cpu c;
        cpu_detect(&c);
        t = samp_simd_for(cpu_isa_from_env(&c));
        atomic_store_explicit(&cached, t, memory_order_release);
    }
    return t;
}
