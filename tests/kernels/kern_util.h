/* Shared helpers for the kernel tests: a seeded generator, Gaussian fills and
 * the normalised mean squared error the tolerances are stated in. */
#ifndef TK_TESTS_KERN_UTIL_H
#define TK_TESTS_KERN_UTIL_H

#include <math.h>
#include <stdint.h>

typedef struct {
    uint64_t s;
} kt_rng;

static inline uint32_t kt_u32(kt_rng *r) {
    /* splitmix64: tiny, seedable, good enough for test data */
    uint64_t z = (r->s += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return (uint32_t)((z ^ (z >> 31)) >> 32);
}

static inline int kt_int(kt_rng *r, int lo, int hi) {
    return lo + (int)(kt_u32(r) % (uint32_t)(hi - lo + 1));
}

static inline float kt_unif(kt_rng *r) { return ((float)kt_u32(r) + 0.5f) / 4294967296.0f; }

static inline float kt_gauss(kt_rng *r) {
    float u = kt_unif(r), v = kt_unif(r);
    return sqrtf(-2.0f * logf(u)) * cosf(6.2831853f * v);
}

static inline void kt_fill(kt_rng *r, float *x, int64_t n, float scale) {
    for (int64_t i = 0; i < n; i++) x[i] = scale * kt_gauss(r);
}

/* sum (a-b)^2 / sum b^2 over n values, b the reference; 0 when both are 0. */
static inline double kt_nmse(const float *a, const float *b, int64_t n) {
    double num = 0, den = 0;
    for (int64_t i = 0; i < n; i++) {
        double d = (double)a[i] - (double)b[i];
        num += d * d;
        den += (double)b[i] * b[i];
    }
    if (den == 0) return num == 0 ? 0 : INFINITY;
    return num / den;
}

#endif
