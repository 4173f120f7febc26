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

bool spec_cost_price(const spec_cost *c, double *c0, double *c1) {
    if (spec_cost_fit(c, c0, c1)) return true;
    *c0 = *c1 = 0;
    if (!(c->w > 0) || !(c->st > 0)) return false;
    *c1 = c->sy / c->st;
    return true;
}

/* ---- the controller ------------------------------------------------------------------ */

/* Drafts best gain first (sequence i's next draft gains alpha^(k+1)), at most
 * m a sequence, while gain / cost > tokens / step time: each one raises
 * tokens per second. The step costs time0 for its n decodes, every draft
 * cost more. Returns the total; *rate the tokens per second reached. */
static int choose_greedy(const spec_ctl *c, int n, const double *alpha, const int *avail, int m, double time0,
                         double cost, int *k, double *rate) {
    for (int i = 0; i < n; i++) k[i] = 0;
    int total = 0;
    double gain = n, time = time0;
    while (total < c->max_total) {
        int best = -1;
        double g_best = SPEC_MIN_GAIN;
        for (int i = 0; i < n; i++) {
            int lim = avail[i] < m ? avail[i] : m;
            if (k[i] >= lim) continue;
            double g = pow(alpha[i], k[i] + 1);
            if (g >= g_best) {
                g_best = g;
                best = i;
            }
        }
        if (best < 0 || !(g_best * time > cost * gain)) break;
        k[best]++;
        total++;
        gain += g_best;
        time += cost;
    }
    *rate = time > 0 ? gain / time : 0;
    return total;
}

/* A draft model: m passes cost m e0 whatever they carry, every draft e1
 * more (and c1 to verify). Takes the number of passes that reaches the most
 * tokens per second, none included, for a step of c0 + c1 T. */
static int choose_draft(const spec_ctl *c, int n, const double *alpha, const int *avail, double c0, double c1,
                        int *k) {
    double e0, e1, rate;
    if (!spec_cost_price(&c->draft, &e0, &e1)) e0 = e1 = 0; /* not measured yet: the next passes will be */
    double best_rate = n / (c0 + c1 * n);
    int best_m = 0;
    for (int m = 1; m <= c->k_max; m++) {
        choose_greedy(c, n, alpha, avail, m, c0 + c1 * n + m * e0, c1 + e1, k, &rate);
        if (rate > best_rate) {
            best_rate = rate;
            best_m = m;
        }
    }
    if (best_m == 0) {
        for (int i = 0; i < n; i++) k[i] = 0;
        return 0;
    }
    return choose_greedy(c, n, alpha, avail, best_m, c0 + c1 * n + best_m * e0, c1 + e1, k, &rate);
}

int spec_choose(spec_ctl *c, int n, const double *alpha, const int *avail, int *k) {
    for (int i = 0; i < n; i++) k[i] = 0;
    if (n <= 0 || c->k_max <= 0) return 0;
    uint64_t call = c->calls++;
    int total = 0;
    double c0, c1, rate;
    if (!spec_cost_fit(&c->cost, &c0, &c1)) {
        /* Probe: some steps with drafts, so the fit sees steps of other sizes.
         * A draft model's probe adds SPEC_PROBE_TOKENS drafts: the fewest a
         * sequence (3 at batch 1, one each from 3 sequences from batch 3 up). */
        if (call % SPEC_PROBE_EVERY != SPEC_PROBE_EVERY - 1) return 0;
        int k_probe = c->k_max;
        if (c->draft_model) {
            /* A draft model's drafts cost passes: no probe when they would not
             * pay even if verifying were free (the steps seen so far, all
             * fixed cost), and the fewest that make the fit's spread of sizes
             * (SPEC_PROBE_TOKENS more tokens). */
            if (c->cost.st > 0 && choose_draft(c, n, alpha, avail, c->cost.sy / c->cost.st * n, 0, k) == 0)
                return 0;
            for (int i = 0; i < n; i++) k[i] = 0;
            k_probe = (SPEC_PROBE_TOKENS + n - 1) / n;
            if (k_probe > c->k_max) k_probe = c->k_max;
            /* Only as many sequences as that takes, in turn from probe to probe. */
            int first = (int)((call / SPEC_PROBE_EVERY) * SPEC_PROBE_TOKENS % (uint64_t)n);
            for (int j = 0; j < n && total < SPEC_PROBE_TOKENS && total < c->max_total; j++) {
                int i = (first + j) % n;
                if (alpha[i] < SPEC_PROBE_ALPHA) continue;
                int m = avail[i] < k_probe ? avail[i] : k_probe;
                if (m > c->max_total - total) m = c->max_total - total;
                k[i] = m;
                total += m;
            }
            return total;
        }
        for (int i = 0; i < n && total < c->max_total; i++) {
            if (alpha[i] < SPEC_PROBE_ALPHA) continue;
            int m = avail[i] < k_probe ? avail[i] : k_probe;
            if (m > c->max_total - total) m = c->max_total - total;
            k[i] = m;
            total += m;
        }
        return total;
    }
    if (!c->draft_model) return choose_greedy(c, n, alpha, avail, c->k_max, c0 + c1 * n, c1, k, &rate);
    return choose_draft(c, n, alpha, avail, c0, c1, k);
}

/* ---- speculative sampling ------------------------------------------------------------ */

int32_t spec_draw(const float *p, int n, double u) {
    double z = 0;
    int32_t last = -1;
    for (int i = 0; i < n; i++)
        if (p[i] > 0) {
            z += p[i];
            last = i;
        }
    if (last < 0) return -1;
    double r = u * z, cum = 0;
    for (int i = 0; i < last; i++) {
        if (!(p[i] > 0)) continue;
        cum += p[i];
        if (r < cum) return i;
    }
    return last;
}

int32_t spec_verify_token(const float *p, const float *q, int n, int32_t x, double u_accept, double u_resid,
                          bool *accepted) {
    *accepted = false;
    if (x >= 0 && x < n && q[x] > 0 && p[x] > 0 && u_accept * (double)q[x] < (double)p[x]) {
        *accepted = true;
        return x;
    }
    /* The residual: max(0, p - q), drawn by inverse CDF. */
    double z = 0;
    int32_t last = -1;
    for (int i = 0; i < n; i++) {
        double d = (double)p[i] - (double)q[i];
        if (d > 0) {
            z += d;
            last = i;
        }
    }
    if (last < 0 || !(z > 1e-12)) return spec_draw(p, n, u_resid);
    double r = u_resid * z, cum = 0;
    for (int i = 0; i < last; i++) {
        double d = (double)p[i] - (double)q[i];
        if (!(d > 0)) continue;
        cum += d;
        if (r < cum) return i;
    }
    return last;
}
