#include "engine/sampler.h"
#include "engine/sampler_simd.h"

#include <math.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#include "core/alloc.h"
#include "core/error.h"

struct tk_sampler {
    tk_sampling p; /* parameters; p.logit_bias points at bias below */
    int n_vocab;
    int n_prompt;        /* history[0, n_prompt) is prompt: no presence/frequency */
    uint64_t draws;      /* counter of the random stream */
    tk_logit_bias *bias; /* (n_logit_bias) owned copy */
    /* Temperature sampling's scratch (NULL when greedy): each token's weight
     * exp(v - vmax) and bucket (sampler_simd.h), per bucket the tokens and
     * their weights' sum (in id order), and the sorted keys of one bucket. */
    float *w;         /* (n_vocab) */
    uint16_t *bkt;    /* (n_vocab) */
    uint32_t *cnt;    /* (4 SAMP_N_BUCKETS) [0, SAMP_N_BUCKETS) after the histogram */
    double *mass;     /* (4 SAMP_N_BUCKETS) likewise */
    uint64_t *keys;   /* (2 n_vocab) the sorted bucket's keys, then a radix sort's scratch */
    int keys_bucket;  /* the bucket keys holds, sorted; -1: none */
    uint32_t *counts; /* (n_vocab) zero between calls, NULL without penalties */
    uint8_t *seen;    /* (n_vocab) zero between calls, NULL without repetition penalty */
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
        r->w = tk_calloc((size_t)n_vocab, sizeof *r->w);
        r->bkt = tk_calloc((size_t)n_vocab, sizeof *r->bkt);
        r->cnt = tk_calloc(4 * SAMP_N_BUCKETS, sizeof *r->cnt);
        r->mass = tk_calloc(4 * SAMP_N_BUCKETS, sizeof *r->mass);
        r->keys = tk_calloc(2 * (size_t)n_vocab, sizeof *r->keys);
        ok = ok && r->w && r->bkt && r->cnt && r->mass && r->keys;
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
    tk_free(s->w);
    tk_free(s->bkt);
    tk_free(s->cnt);
    tk_free(s->mass);
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

/* A 64-bit key whose ascending order is the sampler's order of tokens:
 * larger scaled logit first, then lower id (a total order, so every choice
 * below is deterministic). The value's bits are mapped to an unsigned order
 * and complemented; -0 is keyed as +0, as the comparison has them equal. */
static inline uint64_t tok_key(float v, int32_t id) {
    v += 0.0f;
    uint32_t u;
    memcpy(&u, &v, sizeof u);
    u = (u & 0x80000000u) ? ~u : (u | 0x80000000u);
    return ((uint64_t)~u << 32) | (uint32_t)id;
}

static inline int32_t key_id(uint64_t k) { return (int32_t)(uint32_t)k; }

static int key_cmp(const void *pa, const void *pb) {
    const uint64_t a = *(const uint64_t *)pa, b = *(const uint64_t *)pb;
    return (a > b) - (a < b);
}

/* a[0, n) ascending, with tmp[0, n) as scratch. Large arrays by an LSD radix
 * sort, 11 bits a pass, skipping passes where every key has the same digit. */
static void keys_sort(uint64_t *a, uint64_t *tmp, int n) {
    enum { RADIX_MIN = 1024, BITS = 11, DIGITS = 1 << BITS };
    if (n < RADIX_MIN) {
        qsort(a, (size_t)n, sizeof *a, key_cmp);
        return;
    }
    uint64_t *src = a, *dst = tmp;
    for (int sh = 0; sh < 64; sh += BITS) {
        size_t cnt[DIGITS] = {0};
        for (int i = 0; i < n; i++) cnt[(src[i] >> sh) & (DIGITS - 1)]++;
        if (cnt[(src[0] >> sh) & (DIGITS - 1)] == (size_t)n) continue; /* one digit: nothing moves */
        size_t at = 0;
        for (int d = 0; d < DIGITS; d++) {
            const size_t k = cnt[d];
            cnt[d] = at;
            at += k;
        }
        for (int i = 0; i < n; i++) dst[cnt[(src[i] >> sh) & (DIGITS - 1)]++] = src[i];
        uint64_t *t = src;
        src = dst, dst = t;
    }
    if (src != a) memcpy(a, src, (size_t)n * sizeof *a);
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

/* ---- temperature sampling ---------------------------------------------------
 *
 * Tokens are taken best first (scaled logit v = l / T, then id). Their
 * weights w = exp(v - vmax) and buckets (sampler_simd.h) come from one vector
 * pass; a histogram gives each bucket's count and weight (summed in id order).
 * Since the buckets in order hold the tokens best first, every truncation is a
 * prefix of that order: the kept set is buckets [0, bl) whole and the best nl
 * tokens of bucket bl. Only the bucket a cut or a draw falls in is sorted, so
 * a nucleus of most of a flat 150k vocabulary costs a few passes, not a sort
 * of it. Every sum is in double, in one order: whole buckets by their
 * histogram sums, a cut bucket token by token in sorted order. */

typedef struct kept {
    int bl;      /* buckets [0, bl) kept whole */
    int nl;      /* and the first nl tokens of bucket bl in order */
    double part; /* their weight; mass[bl] when nl is the whole bucket */
    double z;    /* the kept weight */
} kept;

/* Bucket b's tokens, best first, in s->keys[0, cnt[b]). */
static const uint64_t *bucket_sorted(tk_sampler *s, const float *logits, float inv_t, int b) {
    if (s->keys_bucket == b) return s->keys;
    const int V = s->n_vocab;
    uint64_t *k = s->keys;
    /* the ids first, in the scratch half */
    int32_t *ids = (int32_t *)(k + V);
    const int n = samp_simd_default()->find_u16(s->bkt, V, (uint16_t)b, ids);
    for (int i = 0; i < n; i++) k[i] = tok_key(logits[ids[i]] * inv_t, ids[i]);
    keys_sort(k, k + V, n);
    s->keys_bucket = b;
    return k;
}

/* Bucket b's kept tokens and their weight (b <= k->bl). */
static int bucket_count(const kept *k, const uint32_t *cnt, int b) { return b < k->bl ? (int)cnt[b] : k->nl; }

static double bucket_weight(const kept *k, const double *mass, int b) {
    return b < k->bl ? mass[b] : k->part;
}

/* Cut the kept set to its first `want` weight (walk in order until the sum
 * reaches it); unchanged when rounding keeps the sum below it throughout. */
static void cut_weight(tk_sampler *s, const float *logits, float inv_t, kept *k, double want) {
    double cum = 0;
    for (int b = 0; b <= k->bl; b++) {
        const double m = bucket_weight(k, s->mass, b);
        if (cum + m < want) {
            cum += m;
            continue;
        }
        const uint64_t *key = bucket_sorted(s, logits, inv_t, b);
        const int n = bucket_count(k, s->cnt, b);
        double part = 0;
        for (int i = 0; i < n; i++) {
            part += s->w[key_id(key[i])];
            if (cum + part >= want || i == n - 1) {
                k->bl = b;
                k->nl = i + 1;
                k->part = part;
                k->z = cum + part;
                return;
            }
        }
    }
}

/* Cut the kept set to its first `want` tokens (1 <= want <= its size). */
static void cut_count(tk_sampler *s, const float *logits, float inv_t, kept *k, long want) {
    long cum = 0;
    double z = 0;
    for (int b = 0; b <= k->bl; b++) {
        const long n = bucket_count(k, s->cnt, b);
        const double m = bucket_weight(k, s->mass, b);
        if (cum + n < want) {
            cum += n;
            z += m;
            continue;
        }
        if (cum + n == want) { /* ends with this bucket's kept tokens: no sort */
            if (b < k->bl) k->nl = (int)n, k->part = m;
        } else {
            const uint64_t *key = bucket_sorted(s, logits, inv_t, b);
            double part = 0;
            for (long i = 0; i < want - cum; i++) part += s->w[key_id(key[i])];
            k->nl = (int)(want - cum);
            k->part = part;
        }
        k->bl = b;
        k->z = z + k->part;
        return;
    }
}

/* The tokens temperature sampling keeps (top-k, top-p, min-p, in that
 * order): fills *k and returns false when none is left. best is the argmax
 * of the (finite) logits. */
static bool kept_set(tk_sampler *s, const float *logits, int32_t best, kept *k) {
    const int V = s->n_vocab;
    const float inv_t = 1.0f / s->p.temperature;
    const float vmax = logits[best] * inv_t; /* rounding is monotone: the largest v */
    if (!isfinite(vmax)) return false;
    samp_simd_default()->scale_exp(logits, V, inv_t, vmax, s->w, s->bkt);
    /* Four histograms, token t in the (t % 4)-th: repeats of one bucket do
     * not wait on each other's read-add-write. Then summed in one order. */
    uint32_t *restrict cnt = s->cnt;
    double *restrict mass = s->mass;
    const float *restrict w = s->w;
    const uint16_t *restrict bkt = s->bkt;
    memset(cnt, 0, 4 * SAMP_N_BUCKETS * sizeof *cnt);
    memset(mass, 0, 4 * SAMP_N_BUCKETS * sizeof *mass);
    int t = 0;
    for (; t + 4 <= V; t += 4)
        for (int j = 0; j < 4; j++) {
            cnt[j * SAMP_N_BUCKETS + bkt[t + j]]++;
            mass[j * SAMP_N_BUCKETS + bkt[t + j]] += w[t + j];
        }
    for (; t < V; t++) {
        cnt[bkt[t]]++;
        mass[bkt[t]] += w[t];
    }
    for (int b = 0; b < SAMP_N_BUCKETS; b++) {
        cnt[b] += cnt[SAMP_N_BUCKETS + b] + cnt[2 * SAMP_N_BUCKETS + b] + cnt[3 * SAMP_N_BUCKETS + b];
        mass[b] = (mass[b] + mass[SAMP_N_BUCKETS + b]) +
                  (mass[2 * SAMP_N_BUCKETS + b] + mass[3 * SAMP_N_BUCKETS + b]);
    }
    s->keys_bucket = -1;
    long n = 0;
    int last = -1;
    double z = 0;
    for (int b = 0; b < SAMP_NONE; b++) {
        n += cnt[b];
        z += mass[b];
        if (cnt[b]) last = b;
    }
    if (last < 0) return false;
    *k = (kept){.bl = last, .nl = (int)cnt[last], .part = mass[last], .z = z};
    if (s->p.top_k > 0 && s->p.top_k < n) cut_count(s, logits, inv_t, k, s->p.top_k);
    if (s->p.top_p < 1) cut_weight(s, logits, inv_t, k, (double)s->p.top_p * k->z);
    if (s->p.min_p > 0) {
        /* p / p_max = exp(v - vmax) >= min_p: d = vmax - v <= -log(min_p),
         * a prefix of the order since d grows as v falls. */
        const double dmax = -log((double)s->p.min_p);
        long keep = 0;
        for (int b = 0; b <= k->bl; b++) {
            if ((double)(b + 1) / SAMP_PER_UNIT <= dmax && b < SAMP_TAIL) { /* the whole bucket is near */
                keep += bucket_count(k, s->cnt, b);
                continue;
            }
            const uint64_t *key = bucket_sorted(s, logits, inv_t, b);
            const int m = bucket_count(k, s->cnt, b);
            for (int i = 0; i < m; i++) {
                const float v = logits[key_id(key[i])] * inv_t;
                const float d = vmax - v;
                if ((double)d > dmax) break;
                keep++;
            }
            break;
        }
        if (keep < 1) keep = 1; /* the max itself always survives */
        cut_count(s, logits, inv_t, k, keep);
    }
    return true;
}

static int32_t sample_temperature(tk_sampler *s, const float *logits, int32_t best, double u) {
    kept k;
    if (!kept_set(s, logits, best, &k)) return best;
    const float inv_t = 1.0f / s->p.temperature;
    const double r = u * k.z;
    double cum = 0;
    for (int b = 0; b <= k.bl; b++) {
        const double m = bucket_weight(&k, s->mass, b);
        if (!(r < cum + m) && b < k.bl) {
            cum += m;
            continue;
        }
        const uint64_t *key = bucket_sorted(s, logits, inv_t, b);
        const int n = bucket_count(&k, s->cnt, b);
        for (int i = 0; i < n; i++) {
            cum += s->w[key_id(key[i])];
            if (r < cum) return key_id(key[i]);
        }
        return key_id(key[n - 1]); /* rounding: the bucket's last */
    }
    return best;
}

/* Steps 1-3 in place; the argmax (ties: the lowest id, -1: no finite logit)
 * and the largest logit in *vmax (+inf: the argmax is certain). */
static int32_t process(tk_sampler *s, float *logits, const int32_t *history, int n_history, float *vmax) {
    const int V = s->n_vocab;
    const samp_simd *sv = samp_simd_default();
    /* NaN logits become -inf in the maximum's pass below: a NaN stays NaN
     * through the bias and the penalties, so the result is the same as
     * cleaning first. */
    for (int i = 0; i < s->p.n_logit_bias; i++) logits[s->bias[i].token] += s->bias[i].bias;
    if (history && n_history > 0) apply_penalties(s, logits, history, n_history);
    int32_t best = -1;
    *vmax = sv->max_clean(logits, V, &best);
    return best;
}

/* The log-sum-exp of processed logits whose largest is vmax (+inf when it is
 * +inf), where the sampling asks for logprobs; else NAN, with no pass over the
 * logits. */
static float event_lse(const tk_sampler *s, const float *logits, float vmax) {
    if (!s->p.logprobs && s->p.n_logprobs <= 0) return NAN;
    if (vmax == INFINITY) return INFINITY;
    return vmax + (float)log(samp_simd_default()->sum_exp(logits, s->n_vocab, vmax));
}

void sampler_event(const tk_sampler *s, const float *logits, float lse, int32_t tok, tk_token_event *ev) {
    ev->token = tok;
    ev->n_top = 0;
    if (isnan(lse)) { /* not asked for */
        ev->logprob = NAN;
        return;
    }
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
    float vmax;
    int32_t tok = process(s, logits, history, n_history, &vmax);
    if (tok < 0) return -1;
    if (s->p.temperature > 0 && vmax != INFINITY)
        tok = sample_temperature(s, logits, tok, sampler_uniform(s->p.seed, draw));
    sampler_event(s, logits, event_lse(s, logits, vmax), tok, ev);
    return tok;
}

int32_t sampler_dist(tk_sampler *s, float *logits, const int32_t *history, int n_history, float *prob,
                     float *lse_out) {
    float vmax;
    int32_t best = process(s, logits, history, n_history, &vmax);
    if (lse_out) *lse_out = best < 0 ? NAN : event_lse(s, logits, vmax);
    if (best < 0 || !prob) return best;
    memset(prob, 0, (size_t)s->n_vocab * sizeof *prob);
    if (!(s->p.temperature > 0) || vmax == INFINITY) {
        prob[best] = 1;
        return best;
    }
    kept k;
    if (!kept_set(s, logits, best, &k)) {
        prob[best] = 1;
        return best;
    }
    const int whole = k.nl == (int)s->cnt[k.bl] ? k.bl + 1 : k.bl; /* buckets kept whole */
    for (int t = 0; t < s->n_vocab; t++)
        if (s->bkt[t] < whole) prob[t] = (float)(s->w[t] / k.z);
    if (whole > k.bl) return best;
    const uint64_t *key = bucket_sorted(s, logits, 1.0f / s->p.temperature, k.bl);
    for (int i = 0; i < k.nl; i++) prob[key_id(key[i])] = (float)(s->w[key_id(key[i])] / k.z);
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
