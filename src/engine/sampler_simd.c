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
#endif

static const samp_simd SAMP_SCALAR = {max_clean_scalar, sum_exp_scalar};
#if SAMP_X86
static const samp_simd SAMP_AVX2 = {max_clean_avx2, sum_exp_avx2};
static const samp_simd SAMP_AVX512 = {max_clean_avx512, sum_exp_avx512};
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
