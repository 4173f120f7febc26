#include "engine/sampler.h"
#include "engine/sampler_simd.h"

#include <math.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#include "core/alloc.h"
#include "core/error.h"

typedef struct cand {
    float v;    /* logit (after bias, penalties, temperature) */
    int32_t id; /* token id */
} cand;

struct tk_sampler {
    tk_sampling p; /* parameters; p.logit_bias points at bias below */
    int n_vocab;
    int n_prompt;        /* history[0, n_prompt) is prompt: no presence/frequency */
    uint64_t draws;      /* counter of the random stream */
    tk_logit_bias *bias; /* (n_logit_bias) owned copy */
    cand *cands;         /* (n_vocab) scratch for temperature sampling, NULL if greedy */
    uint64_t *keys;      /* (2 n_vocab) cand_sort's scratch, made at its first large sort */
    uint32_t *counts;    /* (n_vocab) zero between calls, NULL without penalties */
    uint8_t *seen;       /* (n_vocab) zero between calls, NULL without repetition penalty */
};

/* ---- the random stream --------------------------------------------------- */

static uint64_t mix64(uint64_t z) {
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
}

/* A pure function of (seed, i): no state to drift when requests are batched,
 * preempted or recomputed. */
double sampler_uniform(uint64_t seed, uint64_t i) {
    uint64_t z = mix64(seed ^ mix64(i * 0x9e3779b97f4a7c15ULL + 0x632be59bd9b4e019ULL));
    return (double)(z >> 11) * (1.0 / 9007199254740992.0);
}

/* ---- parameters ---------------------------------------------------------- */

static bool finite_f(float x) { return isfinite(x) != 0; }

tk_status sampler_check(const tk_sampling *s, int n_vocab) {
    if (!s) return tk_fail(TK_ERR_INVALID, "sampling: parameters are NULL");
    if (n_vocab <= 0) return tk_fail(TK_ERR_INVALID, "sampling: n_vocab %d must be > 0", n_vocab);
    if (!finite_f(s->temperature) || s->temperature < 0)
        return tk_fail(TK_ERR_INVALID, "sampling: temperature %g must be finite and >= 0",
                       (double)s->temperature);
    if (s->top_k < 0) return tk_fail(TK_ERR_INVALID, "sampling: top_k %d must be >= 0 (0: off)", s->top_k);
    if (!(s->top_p > 0 && s->top_p <= 1))
        return tk_fail(TK_ERR_INVALID, "sampling: top_p %g must be in (0, 1]", (double)s->top_p);
    if (!(s->min_p >= 0 && s->min_p <= 1))
        return tk_fail(TK_ERR_INVALID, "sampling: min_p %g must be in [0, 1]", (double)s->min_p);
    if (!finite_f(s->repetition_penalty) || s->repetition_penalty <= 0)
        return tk_fail(TK_ERR_INVALID, "sampling: repetition_penalty %g must be finite and > 0 (1: off)",
                       (double)s->repetition_penalty);
    if (!(s->presence_penalty >= -2 && s->presence_penalty <= 2))
        return tk_fail(TK_ERR_INVALID, "sampling: presence_penalty %g must be in [-2, 2]",
                       (double)s->presence_penalty);
    if (!(s->frequency_penalty >= -2 && s->frequency_penalty <= 2))
        return tk_fail(TK_ERR_INVALID, "sampling: frequency_penalty %g must be in [-2, 2]",
                       (double)s->frequency_penalty);
    if (s->n_logprobs < 0 || s->n_logprobs > TK_MAX_LOGPROBS)
        return tk_fail(TK_ERR_INVALID, "sampling: n_logprobs %d must be in [0, %d]", s->n_logprobs,
                       TK_MAX_LOGPROBS);
    if (s->n_logit_bias < 0)
        return tk_fail(TK_ERR_INVALID, "sampling: n_logit_bias %d must be >= 0", s->n_logit_bias);
    if (s->n_logit_bias > 0 && !s->logit_bias)
        return tk_fail(TK_ERR_INVALID, "sampling: n_logit_bias %d but logit_bias is NULL", s->n_logit_bias);
    for (int i = 0; i < s->n_logit_bias; i++) {
        const tk_logit_bias *b = &s->logit_bias[i];
        if (b->token < 0 || b->token >= n_vocab)
            return tk_fail(TK_ERR_RANGE, "sampling: logit_bias[%d] token %d outside the vocabulary [0, %d)",
                           i, (int)b->token, n_vocab);
        /* -inf bans a token; +inf or NaN would make the distribution meaningless. */
        if (isnan(b->bias) || b->bias == INFINITY)
            return tk_fail(TK_ERR_INVALID, "sampling: logit_bias[%d] bias %g must be finite or -inf", i,
                           (double)b->bias);
    }
    return TK_OK;
}

tk_status sampler_init(const tk_sampling *s, int n_vocab, tk_sampler **out) {
    if (!out) return tk_fail(TK_ERR_INVALID, "sampler_init: out is NULL");
    *out = NULL;
    tk_status st = sampler_check(s, n_vocab);
    if (st != TK_OK) return st;
    tk_sampler *r = tk_calloc(1, sizeof *r);
    if (!r) return tk_fail(TK_ERR_NOMEM, "sampler_init: out of memory");
    r->p = *s;
    r->n_vocab = n_vocab;
    bool ok = true;
    if (s->n_logit_bias > 0) {
        r->bias = tk_calloc((size_t)s->n_logit_bias, sizeof *r->bias);
        ok = ok && r->bias;
        if (r->bias) memcpy(r->bias, s->logit_bias, (size_t)s->n_logit_bias * sizeof *r->bias);
    }
    r->p.logit_bias = r->bias;
    if (s->temperature > 0) {
        r->cands = tk_calloc((size_t)n_vocab, sizeof *r->cands);
        ok = ok && r->cands;
    }
    if (s->presence_penalty != 0 || s->frequency_penalty != 0) {
        r->counts = tk_calloc((size_t)n_vocab, sizeof *r->counts);
        ok = ok && r->counts;
    }
    if (s->repetition_penalty != 1) {
        r->seen = tk_calloc((size_t)n_vocab, sizeof *r->seen);
        ok = ok && r->seen;
    }
    if (!ok) {
        sampler_free(r);
        return tk_fail(TK_ERR_NOMEM, "sampler_init: out of memory for a vocabulary of %d", n_vocab);
    }
    *out = r;
    return TK_OK;
}

void sampler_free(tk_sampler *s) {
    if (!s) return;
    tk_free(s->bias);
    tk_free(s->cands);
    tk_free(s->keys);
    tk_free(s->counts);
    tk_free(s->seen);
    tk_free(s);
}

void sampler_set_n_prompt(tk_sampler *s, int n_prompt) {
    if (s) s->n_prompt = n_prompt < 0 ? 0 : n_prompt;
}

uint64_t sampler_draws(const tk_sampler *s) { return s ? s->draws : 0; }

/* ---- logit processing ------------------------------------------------------ */

static void apply_penalties(tk_sampler *s, float *logits, const int32_t *hist, int n_hist) {
    const int V = s->n_vocab;
    if (s->seen) {
        const float r = s->p.repetition_penalty;
        for (int i = 0; i < n_hist; i++) {
            int32_t t = hist[i];
            if (t < 0 || t >= V || s->seen[t]) continue;
            s->seen[t] = 1;
            logits[t] = logits[t] > 0 ? logits[t] / r : logits[t] * r;
        }
        for (int i = 0; i < n_hist; i++)
            if (hist[i] >= 0 && hist[i] < V) s->seen[hist[i]] = 0;
    }
    if (s->counts) {
        int i0 = s->n_prompt < n_hist ? s->n_prompt : n_hist;
        for (int i = i0; i < n_hist; i++)
            if (hist[i] >= 0 && hist[i] < V) s->counts[hist[i]]++;
        for (int i = i0; i < n_hist; i++) {
            int32_t t = hist[i];
            if (t < 0 || t >= V || s->counts[t] == 0) continue;
            logits[t] -= s->p.presence_penalty + s->p.frequency_penalty * (float)s->counts[t];
            s->counts[t] = 0; /* applied once per distinct token; leaves the array zeroed */
        }
    }
}

/* a ranks before b: larger logit, then lower id (a total order, so every
 * selection below is deterministic). */
static inline bool cand_before(const cand *a, const cand *b) {
    return a->v > b->v || (a->v == b->v && a->id < b->id);
}

static int cand_cmp(const void *pa, const void *pb) {
    const cand *a = pa, *b = pb;
    return cand_before(a, b) ? -1 : cand_before(b, a) ? 1 : 0;
}

static inline void cand_swap(cand *a, cand *b) {
    cand t = *a;
    *a = *b;
    *b = t;
}

/* A 64-bit key whose ascending order is cand_before's order: the value's
 * bits mapped to an unsigned order and complemented (larger first), then the
 * id. -0 is keyed as +0, as the comparison has them equal; the value read
 * back is then +0, which no later use tells apart. */
static inline uint64_t cand_key(cand x) {
    const float v = x.v + 0.0f;
    uint32_t u;
    memcpy(&u, &v, sizeof u);
    u = (u & 0x80000000u) ? ~u : (u | 0x80000000u);
    return ((uint64_t)~u << 32) | (uint32_t)x.id;
}

static inline cand cand_of_key(uint64_t k) {
    uint32_t u = ~(uint32_t)(k >> 32);
    u = (u & 0x80000000u) ? (u & 0x7fffffffu) : ~u;
    cand c;
    memcpy(&c.v, &u, sizeof u);
    c.id = (int32_t)(uint32_t)k;
    return c;
}

/* c[0, n) in cand_before's order: the order qsort with cand_cmp gives (a
 * total order has one sorted arrangement). Large arrays by an LSD radix sort
 * of cand_key, 11 bits a pass, skipping passes where every key has the same
 * digit: a nucleus of most of a 150k vocabulary sorts in a few ms instead of
 * qsort's ~15. Falls back to qsort if its scratch cannot be had. */
static void cand_sort(tk_sampler *s, cand *c, int n) {
    enum { RADIX_MIN = 1024, BITS = 11, DIGITS = 1 << BITS };
    if (n >= RADIX_MIN && !s->keys) s->keys = tk_malloc(2 * (size_t)s->n_vocab * sizeof *s->keys);
    if (n < RADIX_MIN || !s->keys) {
        qsort(c, (size_t)n, sizeof *c, cand_cmp);
        return;
    }
    uint64_t *a = s->keys, *b = s->keys + s->n_vocab;
    for (int i = 0; i < n; i++) a[i] = cand_key(c[i]);
    for (int sh = 0; sh < 64; sh += BITS) {
        size_t cnt[DIGITS] = {0};
        for (int i = 0; i < n; i++) cnt[(a[i] >> sh) & (DIGITS - 1)]++;
        if (cnt[(a[0] >> sh) & (DIGITS - 1)] == (size_t)n) continue; /* one digit: nothing moves */
        size_t at = 0;
        for (int d = 0; d < DIGITS; d++) {
            const size_t k = cnt[d];
            cnt[d] = at;
            at += k;
        }
        for (int i = 0; i < n; i++) b[cnt[(a[i] >> sh) & (DIGITS - 1)]++] = a[i];
        uint64_t *t = a;
        a = b, b = t;
    }
    for (int i = 0; i < n; i++) c[i] = cand_of_key(a[i]);
}

/* Rearrange c[0, n) so that c[0, k) holds the k best (in any order). Hoare-style
 * quickselect with a median-of-three pivot: O(n) expected. */
static void cand_select(cand *c, int n, int k) {
    int lo = 0, hi = n - 1;
    if (k <= 0 || k >= n) return;
    while (lo < hi) {
        int mid = lo + (hi - lo) / 2;
        if (cand_before(&c[mid], &c[lo])) cand_swap(&c[mid], &c[lo]);
        if (cand_before(&c[hi], &c[lo])) cand_swap(&c[hi], &c[lo]);
        if (cand_before(&c[hi], &c[mid])) cand_swap(&c[hi], &c[mid]);
        cand pivot = c[mid];
        int i = lo, j = hi;
        while (i <= j) {
            while (cand_before(&c[i], &pivot)) i++;
            while (cand_before(&pivot, &c[j])) j--;
            if (i <= j) {
                cand_swap(&c[i], &c[j]);
                i++;
                j--;
            }
        }
        /* [lo, j] before-or-equal pivot, [i, hi] after-or-equal. */
        if (k - 1 <= j)
            hi = j;
        else if (k - 1 >= i)
            lo = i;
        else
            return;
    }
}

/* The top n (<= TK_MAX_LOGPROBS) logits by the same total order, best first. */
static int top_n(const float *logits, int V, int n, int32_t *ids) {
    int m = 0;
    for (int t = 0; t < V; t++) {
        float v = logits[t];
        if (v == -INFINITY) continue;
        if (m == n && !(v > logits[ids[m - 1]])) continue; /* ties keep the lower id */
        int j = m < n ? m++ : n - 1;
        while (j > 0 && v > logits[ids[j - 1]]) {
            ids[j] = ids[j - 1];
            j--;
        }
        ids[j] = t;
    }
    return m;
}

/* The tokens temperature sampling keeps (top-k, top-p, min-p) in
 * s->cands[0, n); returns n (0: none) and their largest scaled logit. With
 * sort, the order is a function of the logits alone: best first after a
 * top-k or top-p selection (which leaves the array in the selection's
 * order), else id order, as the vocabulary was scanned (sorting a 150k
 * vocabulary would cost more than the step's sampling otherwise does). */
static int kept_cands(tk_sampler *s, const float *logits, bool sort, float *vmax_out) {
    const int V = s->n_vocab;
    const float inv_t = 1.0f / s->p.temperature;
    cand *c = s->cands;
    int n = 0;
    for (int t = 0; t < V; t++)
        if (logits[t] != -INFINITY) c[n++] = (cand){logits[t] * inv_t, t};
    if (n == 0) return 0;
    bool selected = false; /* the array is no longer in id order */
    if (s->p.top_k > 0 && s->p.top_k < n) {
        cand_select(c, n, s->p.top_k);
        n = s->p.top_k;
        selected = true;
    }
    float vmax = c[0].v;
    for (int i = 1; i < n; i++)
        if (c[i].v > vmax) vmax = c[i].v;
    bool sorted = false;
    if (s->p.top_p < 1) {
        double z = 0;
        for (int i = 0; i < n; i++) z += exp((double)(c[i].v - vmax));
        const double target = (double)s->p.top_p * z;
        /* Sort only a growing head: the nucleus is usually a few dozen tokens,
         * and sorting a 150k vocabulary every step would dominate decode. */
        for (int m = n < 64 ? n : 64;; m = (m > n / 8) ? n : m * 8) {
            cand_select(c, n, m);
            cand_sort(s, c, m);
            double cum = 0;
            int keep = -1;
            for (int i = 0; i < m; i++) {
                cum += exp((double)(c[i].v - vmax));
                if (cum >= target) {
                    keep = i + 1;
                    break;
                }
            }
            if (keep > 0) {
                n = keep;
                break;
            }
            if (m == n) break; /* rounding: keep everything */
        }
        sorted = true;
    }
    if (s->p.min_p > 0) {
        /* p_i / p_max = exp(v_i - v_max) */
        const double floor_rel = (double)s->p.min_p;
        int k = 0;
        for (int i = 0; i < n; i++)
            if (exp((double)(c[i].v - vmax)) >= floor_rel) c[k++] = c[i];
        n = k; /* the max itself always survives */
    }
    if (!sorted && sort && selected) {
        /* The walk order must not depend on how selection left the array. */
        cand_sort(s, c, n);
    }
    *vmax_out = vmax;
    return n;
}

static int32_t sample_temperature(tk_sampler *s, const float *logits, double u) {
    float vmax;
    int n = kept_cands(s, logits, true, &vmax);
    if (n == 0) return -1;
    const cand *c = s->cands;
    double z = 0;
    for (int i = 0; i < n; i++) z += exp((double)(c[i].v - vmax));
    double r = u * z, cum = 0;
    for (int i = 0; i < n; i++) {
        cum += exp((double)(c[i].v - vmax));
        if (r < cum) return c[i].id;
    }
    return c[n - 1].id;
}

/* Steps 1-3 in place; the argmax (ties: the lowest id, -1: no finite logit)
 * and the log-sum-exp (+inf when a logit is +inf: the argmax is certain). */
static int32_t process(tk_sampler *s, float *logits, const int32_t *history, int n_history, float *lse) {
    const int V = s->n_vocab;
    const samp_simd *sv = samp_simd_default();
    /* NaN logits become -inf in the maximum's pass below: a NaN stays NaN
     * through the bias and the penalties, so the result is the same as
     * cleaning first. */
    for (int i = 0; i < s->p.n_logit_bias; i++) logits[s->bias[i].token] += s->bias[i].bias;
    if (history && n_history > 0) apply_penalties(s, logits, history, n_history);
    int32_t best = -1;
    float vmax = sv->max_clean(logits, V, &best);
    *lse = best < 0 || vmax == INFINITY ? INFINITY : vmax + (float)log(sv->sum_exp(logits, V, vmax));
    return best;
}

void sampler_event(const tk_sampler *s, const float *logits, float lse, int32_t tok, tk_token_event *ev) {
    ev->token = tok;
    ev->n_top = 0;
    if (lse == INFINITY) { /* +inf logits: the first is certain */
        ev->logprob = 0;
        return;
    }
    ev->logprob = logits[tok] - lse;
    if (s->p.n_logprobs > 0) {
        ev->n_top = top_n(logits, s->n_vocab, s->p.n_logprobs, ev->top_tokens);
        for (int i = 0; i < ev->n_top; i++) ev->top_logprobs[i] = logits[ev->top_tokens[i]] - lse;
    }
}

int32_t sampler_sample(tk_sampler *s, float *logits, const int32_t *history, int n_history,
                       tk_token_event *ev) {
    const uint64_t draw = s->draws++;
    float lse;
    int32_t tok = process(s, logits, history, n_history, &lse);
    if (tok < 0) return -1;
    if (s->p.temperature > 0 && lse != INFINITY)
        tok = sample_temperature(s, logits, sampler_uniform(s->p.seed, draw));
    if (tok < 0) return -1;
    sampler_event(s, logits, lse, tok, ev);
    return tok;
}

int32_t sampler_dist(tk_sampler *s, float *logits, const int32_t *history, int n_history, float *prob,
                     float *lse_out) {
    float lse;
    int32_t best = process(s, logits, history, n_history, &lse);
    if (lse_out) *lse_out = lse;
    if (best < 0 || !prob) return best;
    memset(prob, 0, (size_t)s->n_vocab * sizeof *prob);
    if (!(s->p.temperature > 0) || lse == INFINITY) {
        prob[best] = 1;
        return best;
    }
    float vmax;
    int n =
        kept_cands(s, logits, false, &vmax); /* a distribution needs no order: no sort of the vocabulary */
    const cand *c = s->cands;
    double z = 0;
    for (int i = 0; i < n; i++) z += exp((double)(c[i].v - vmax));
    for (int i = 0; i < n; i++) prob[c[i].id] = (float)(exp((double)(c[i].v - vmax)) / z);
    return best;
}

uint64_t sampler_next_draw(tk_sampler *s) { return s->draws++; }

const tk_sampling *sampler_params(const tk_sampler *s) { return &s->p; }

void tk_sampling_default(tk_sampling *s) {
    if (!s) return;
    memset(s, 0, sizeof *s);
    s->temperature = 0;
    s->top_k = 0;
    s->top_p = 1;
    s->min_p = 0;
    s->repetition_penalty = 1;
    s->presence_penalty = 0;
    s->frequency_penalty = 0;
    s->seed = 0;
    s->n_logprobs = 0;
}
