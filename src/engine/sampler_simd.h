/* The sampler's passes over a whole vocabulary of logits, vectorised: NaN to
 * -inf, the maximum and its first index, the sum of exp(l - max) for the
 * log-sum-exp, and temperature sampling's weights and buckets. One function table per ISA level (scalar
 * reference, AVX2, AVX-512), chosen at run time by cpu_isa_from_env; every level computes the same maximum
 * and index, and sums within a few float ulps of each other. */
#ifndef TK_ENGINE_SAMPLER_SIMD_H
#define TK_ENGINE_SAMPLER_SIMD_H

#include <math.h>
#include <stdint.h>

#include "core/cpu.h"

/* Temperature sampling buckets a token by how far its scaled logit v = l / T
 * lies below the largest, d = vmax - v: bucket floor(d * SAMP_PER_UNIT) for d
 * < SAMP_SPAN, SAMP_TAIL beyond, SAMP_NONE for a banned (-inf) token. The
 * bucket is a monotone function of v (larger v, same or lower bucket), so the
 * buckets in order hold the vocabulary best first. Width 1/32: the weights in
 * one bucket differ by at most 3%. */
enum {
    SAMP_PER_UNIT = 32,
    SAMP_SPAN = 64, /* exp(-64) ~ 1.6e-28: everything below is the tail */
    SAMP_TAIL = SAMP_SPAN * SAMP_PER_UNIT,
    SAMP_NONE = SAMP_TAIL + 1,
    SAMP_N_BUCKETS = SAMP_NONE + 1
};

typedef struct samp_simd {
    /* NaN -> -inf in place; the largest value (-inf when all are) and the
     * lowest index holding it (-1 when n is 0 or every value is -inf). */
    float (*max_clean)(float *x, int n, int32_t *arg);
    /* sum over i of exp(x[i] - m) (m finite, m >= every x[i]); -inf terms add 0 */
    double (*sum_exp)(const float *x, int n, float m);
    /* For i in [0, n): v = l[i] * inv_t (inv_t > 0, vmax >= every v and
     * finite, no NaN in l), w[i] = exp(v - vmax) by samp_expf's method (0 for
     * l[i] = -inf) and b[i] the bucket of vmax - v (above). v and d are
     * single IEEE operations, so every level gives the same buckets; the
     * weights agree within float rounding of the polynomial. */
    void (*scale_exp)(const float *l, int n, float inv_t, float vmax, float *w, uint16_t *b);
    /* The indices i in [0, n) with b[i] == v, ascending, into out; returns
     * how many (out has room for all n). */
    int (*find_u16)(const uint16_t *b, int n, uint16_t v, int32_t *out);
} samp_simd;

/* The bucket of one token (the scalar form of scale_exp's). */
static inline int samp_bucket(float l, float inv_t, float vmax) {
    if (l == -INFINITY) return SAMP_NONE;
    const float v = l * inv_t;
    const float d = vmax - v;
    return d < (float)SAMP_SPAN ? (int)(d * (float)SAMP_PER_UNIT) : SAMP_TAIL;
}

/* The table for isa (a level the CPU has), and the one the sampler uses. */
const samp_simd *samp_simd_for(tk_isa isa);
const samp_simd *samp_simd_default(void);

/* exp(x) in float by the vector loops' own method (range reduction and a
 * polynomial), for the tests: within 3e-7 relative of exp() for x in
 * [-80, 0]; below that under 2e-35 absolute, and 0 below -87.3. */
float samp_expf(float x);

#endif
