#include "engine/spec.h"

#include <math.h>
#include <string.h>

/* ---- the n-gram drafter ------------------------------------------------------------ */

int spec_ngram_draft(const int32_t *toks, int n_toks, int ngram, int k_max, int32_t *out) {
    if (!toks || !out || k_max <= 0 || ngram <= 0) return 0;
    int n_min = ngram < 2 ? ngram : 2;
    for (int n = ngram; n >= n_min; n--) {
        if (n_toks <= n) continue;
        const int32_t *tail = toks + n_toks - n;
        /* The latest earlier occurrence: starts before the tail's own start. */
        for (int i = n_toks - n - 1; i >= 0; i--) {
            if (toks[i] != tail[0] || memcmp(toks + i, tail, (size_t)n * sizeof *toks) != 0) continue;
            int m = 0;
            /* toks[i + n + m] lies below n_toks + m: known, or a draft already written. */
            while (m < k_max) {
                int j = i + n + m;
                out[m] = j < n_toks ? toks[j] : out[j - n_toks];
                m++;
            }
            return m;
        }
    }
    return 0;
}

double spec_alpha_update(double alpha, int n_accepted, bool rejected) {
    for (int i = 0; i < n_accepted; i++) alpha += SPEC_ALPHA_WEIGHT * (1.0 - alpha);
    if (rejected) alpha -= SPEC_ALPHA_WEIGHT * alpha;
    return alpha;
}

/* ---- the step cost ------------------------------------------------------------------- */

void spec_cost_observe(spec_cost *c, int n_tok, double seconds) {
    if (n_tok <= 0 || !(seconds > 0) || !isfinite(seconds)) return;
    const double d = SPEC_COST_DECAY, t = n_tok;
    c->w = d * c->w + 1;
    c->st = d * c->st + t;
    c->stt = d * c->stt + t * t;
    c->sy = d * c->sy + seconds;
    c->sty = d * c->sty + t * seconds;
}

bool spec_cost_fit(const spec_cost *c, double *c0, double *c1) {
    if (!(c->w >= 3)) return false;
    double mt = c->st / c->w, my = c->sy / c->w;
    double var = c->stt / c->w - mt * mt;
    if (!(var >= SPEC_COST_MIN_VAR)) return false;
    double slope = (c->sty / c->w - mt * my) / var;
    if (!(slope > 0)) slope = 0;
    double icpt = my - slope * mt;
    /* A fit whose intercept is not positive says the step has no fixed part:
     * price every token at the mean. */
    if (!(icpt > 0)) {
        icpt = 0;
        slope = my / mt;
    }
    *c0 = icpt;
    *c1 = slope;
    return true;
}

/* ---- the controller ------------------------------------------------------------------ */

int spec_choose(spec_ctl *c, int n, const double *alpha, const int *avail, int *k) {
    for (int i = 0; i < n; i++) k[i] = 0;
    if (n <= 0 || c->k_max <= 0) return 0;
    uint64_t call = c->calls++;
    int total = 0;
    double c0, c1;
    if (!spec_cost_fit(&c->cost, &c0, &c1)) {
        /* Probe: some steps with drafts, so the fit sees steps of other sizes. */
        if (call % SPEC_PROBE_EVERY != SPEC_PROBE_EVERY - 1) return 0;
        for (int i = 0; i < n && total < c->max_total; i++) {
            if (alpha[i] < SPEC_PROBE_ALPHA) continue;
            int m = avail[i] < c->k_max ? avail[i] : c->k_max;
            if (m > c->max_total - total) m = c->max_total - total;
            k[i] = m;
            total += m;
        }
        return total;
    }
    /* Drafts best gain first (sequence i's next draft gains alpha^(k+1)) while
     * gain / c1 > tokens / step time: each one raises tokens per second. */
    double gain = n, time = c0 + c1 * n;
    while (total < c->max_total) {
        int best = -1;
        double g_best = SPEC_MIN_GAIN;
        for (int i = 0; i < n; i++) {
            int lim = avail[i] < c->k_max ? avail[i] : c->k_max;
            if (k[i] >= lim) continue;
            double g = pow(alpha[i], k[i] + 1);
            if (g >= g_best) {
                g_best = g;
                best = i;
            }
        }
        if (best < 0 || !(g_best * time > c1 * gain)) break;
        k[best]++;
        total++;
        gain += g_best;
        time += c1;
    }
    return total;
}
