/* Statistics for benchmark samples. Percentiles interpolate linearly between
 * the closest ranks, as numpy.percentile does by default: for the sorted
 * samples x[0..n-1] and p in [0, 100], r = p/100 * (n-1) and
 * P(p) = x[floor r] + (r - floor r) * (x[floor r + 1] - x[floor r]).
 * NaN samples are ignored (a request with one output token has no TPOT).
 * Everything here is pure and thread-safe. */
#ifndef TK_BENCH_STATS_H
#define TK_BENCH_STATS_H

#include <stddef.h>

#include "tokamak.h"

typedef struct stats_summary {
    size_t n;                  /* samples that were not NaN */
    double mean, min, max;     /* NaN when n == 0 */
    double p50, p90, p95, p99; /* NaN when n == 0 */
} stats_summary;

/* P(p) of n ascending samples (no NaN); NaN when n == 0. p is clamped to [0, 100]. */
double stats_percentile_sorted(const double *sorted, size_t n, double p);

/* Summary of x[0..n); x is not modified. TK_ERR_NOMEM if the sort copy fails;
 * TK_ERR_INVALID if x is NULL while n > 0. n == 0 gives n = 0 and NaNs. */
tk_status stats_summarize(const double *x, size_t n, stats_summary *out);

/* Percentile p of x[0..n) (unsorted, NaN ignored) into *out; NaN if empty. */
tk_status stats_percentile(const double *x, size_t n, double p, double *out);

/* Mean of the non-NaN samples; NaN if there are none. */
double stats_mean(const double *x, size_t n);

#endif
