/* The sampler's passes over a whole vocabulary of logits, vectorised: NaN to
 * -inf, the maximum and its first index, and the sum of exp(l - max) for the
 * log-sum-exp. One function table per ISA level (scalar reference, AVX2,
 * AVX-512), chosen at run time by cpu_isa_from_env; every level computes the
 * same maximum and index, and sums within a few float ulps of each other. */
#ifndef TK_ENGINE_SAMPLER_SIMD_H
#define TK_ENGINE_SAMPLER_SIMD_H

#include <stdint.h>

#include "core/cpu.h"

typedef struct samp_simd {
    /* NaN -> -inf in place; the largest value (-inf when all are) and the
     * lowest index holding it (-1 when n is 0 or every value is -inf). */
    float (*max_clean)(float *x, int n, int32_t *arg);
    /* sum over i of exp(x[i] - m) (m finite, m >= every x[i]); -inf terms add 0 */
    double (*sum_exp)(const float *x, int n, float m);
} samp_simd;

/* The table for isa (a level the CPU has), and the one the sampler uses. */
const samp_simd *samp_simd_for(tk_isa isa);
const samp_simd *samp_simd_default(void);

/* exp(x) in float by the vector loops' own method (range reduction and a
 * polynomial), for the tests: within 3e-7 relative of exp() for x in
 * [-80, 0]; below that under 2e-35 absolute, and 0 below -87.3. */
float samp_expf(float x);

#endif
