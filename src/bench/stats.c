#include "bench/stats.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "core/alloc.h"
#include "core/checked.h"
#include "core/error.h"

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

double stats_percentile_sorted(const double *sorted, size_t n, double p) {
    if (n == 0 || !sorted) return NAN;
    if (!(p > 0)) p = 0; /* also catches a NaN p */
    if (p > 100) p = 100;
    double r = p / 100.0 * (double)(n - 1);
    size_t lo = (size_t)floor(r);
    if (lo >= n - 1) return sorted[n - 1];
    double f = r - (double)lo;
    return sorted[lo] + f * (sorted[lo + 1] - sorted[lo]);
}

/* The non-NaN samples, sorted, in a new buffer (NULL with *m == 0 if none). */
static tk_status sorted_copy(const double *x, size_t n, double **out, size_t *m) {
    *out = NULL;
    *m = 0;
    if (n == 0) return TK_OK;
    if (!x) return tk_fail(TK_ERR_INVALID, "stats: NULL samples with n = %zu", n);
    size_t bytes;
    if (!tk_mul_size(n, sizeof(double), &bytes))
        return tk_fail(TK_ERR_RANGE, "stats: %zu samples overflow", n);
    double *s = tk_malloc(bytes);
    if (!s) return tk_fail(TK_ERR_NOMEM, "stats: cannot copy %zu samples", n);
    size_t k = 0;
    for (size_t i = 0; i < n; i++)
        if (!isnan(x[i])) s[k++] = x[i];
    qsort(s, k, sizeof *s, cmp_double);
    *out = s;
    *m = k;
    return TK_OK;
}

double stats_mean(const double *x, size_t n) {
    double sum = 0;
    size_t k = 0;
    for (size_t i = 0; x && i < n; i++)
        if (!isnan(x[i])) sum += x[i], k++;
    return k ? sum / (double)k : NAN;
}

tk_status stats_summarize(const double *x, size_t n, stats_summary *out) {
    double *s;
    size_t m;
    tk_status st = sorted_copy(x, n, &s, &m);
    if (st != TK_OK) return st;
    out->n = m;
    out->mean = stats_mean(s, m);
    out->min = m ? s[0] : NAN;
    out->max = m ? s[m - 1] : NAN;
    out->p50 = stats_percentile_sorted(s, m, 50);
    out->p90 = stats_percentile_sorted(s, m, 90);
    out->p95 = stats_percentile_sorted(s, m, 95);
    out->p99 = stats_percentile_sorted(s, m, 99);
    tk_free(s);
    return TK_OK;
}

tk_status stats_percentile(const double *x, size_t n, double p, double *out) {
    double *s;
    size_t m;
    tk_status st = sorted_copy(x, n, &s, &m);
    if (st != TK_OK) return st;
    *out = stats_percentile_sorted(s, m, p);
    tk_free(s);
    return TK_OK;
}
