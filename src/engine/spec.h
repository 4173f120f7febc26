/* Speculative decoding: the n-gram drafter and the controller that decides,
 * each step, how many draft tokens each decoding sequence verifies (0 to k_max).
 *
 * The target verifies a sequence's k drafts in the step that decodes its last
 * token (k + 1 positions, k + 1 logits rows); the engine samples each row in
 * order with the request's sampler and keeps drafts while they equal what was
 * sampled. With a deterministic drafter that is exact speculative sampling (the
 * draft distribution is a point mass, the residual on rejection is the target's
 * distribution without the draft token), and since every row is sampled as the
 * plain decode of that position would be, the output is the same token for
 * token, greedy or seeded.
 *
 * The controller (docs/engine.md, "Speculative decoding") picks the ks that
 * maximise expected tokens per second of step time: a sequence whose drafts
 * are accepted with probability a gains a^j from its j-th draft; a step of T
 * tokens costs c0 + c1 T seconds, fitted online from decode steps. It adds
 * drafts best gain first while gain / c1 beats the step's tokens per second so
 * far, so with a flat step cost (bandwidth-bound, small batch) even modest
 * acceptance pays and with a steep one (compute-bound, large batch) only a
 * near-certain draft does. Pure bookkeeping: no clock, no allocation. */
#ifndef TK_ENGINE_SPEC_H
#define TK_ENGINE_SPEC_H

#include <stdbool.h>
#include <stdint.h>

/* Acceptance: an exponentially weighted per-request estimate of the
 * probability that a draft token is accepted given that those before it were. */
#define SPEC_ALPHA_PRIOR  0.3
#define SPEC_ALPHA_WEIGHT 0.1
/* The step cost fit forgets at this rate per observed step, and is trusted
 * once the steps it holds vary in size (variance of T at least this). */
#define SPEC_COST_DECAY   0.97
#define SPEC_COST_MIN_VAR 0.25
/* Until the cost fit is trusted, one decode step in this many verifies the
 * drafts of sequences whose acceptance is at least SPEC_PROBE_ALPHA. */
#define SPEC_PROBE_EVERY 16
#define SPEC_PROBE_ALPHA 0.3
/* A draft model's probe adds at least this many tokens to the step (one in
 * SPEC_PROBE_EVERY steps that much larger gives the fit its SPEC_COST_MIN_VAR). */
#define SPEC_PROBE_TOKENS 3
/* A draft whose expected gain is below this is never verified. */
#define SPEC_MIN_GAIN 0.05
/* A draft model's first estimate: a model that shares the target's training
 * agrees far more often than a lookup finds a match. */
#define SPEC_ALPHA_PRIOR_DRAFT 0.6
/* Salts of the random streams of speculative sampling: the accept test and the
 * draft model's own draws (the residual and the bonus token use the request's
 * stream, as a plain decode does). */
#define SPEC_SALT_ACCEPT 0x5bd1e9955bd1e995ULL
#define SPEC_SALT_DRAFT  0x2545f4914f6cdd1dULL

/* Draft up to k_max tokens by prompt lookup: find the latest earlier
 * occurrence of the last n tokens of toks (n = ngram, then shorter down to 2,
 * or 1 when ngram is 1) and copy what followed it into out. Reads toks[0,
 * n_toks + k_max) only below n_toks + what it wrote, so out may be toks +
 * n_toks. Returns the number of tokens drafted (0: no match). */
int spec_ngram_draft(const int32_t *toks, int n_toks, int ngram, int k_max, int32_t *out);

/* Fold one verification into an acceptance estimate: n_accepted of the drafts
 * were accepted, and (rejected) the one after them was not. */
double spec_alpha_update(double alpha, int n_accepted, bool rejected);

/* The step cost model: exponentially weighted least squares of seconds over
 * tokens for steps that only decode (drafts included). */
typedef struct spec_cost {
    double w, st, stt, sy, sty;
} spec_cost;

void spec_cost_observe(spec_cost *c, int n_tok, double seconds);
/* c0 + c1 T; false (c0, c1 untouched) while the steps seen do not vary enough
 * in size to tell c1. */
bool spec_cost_fit(const spec_cost *c, double *c0, double *c1);
/* As spec_cost_fit, and while the fit is not trusted the mean seconds per
 * token (c0 = 0); false (0, 0) before any step was seen. */
bool spec_cost_price(const spec_cost *c, double *c0, double *c1);

typedef struct spec_ctl {
    int k_max;     /* most drafts per sequence */
    int max_total; /* most drafts per step */
    spec_cost cost;
    /* A draft model: drafts are made by sequential draft passes (the j-th
     * pass makes the j-th draft of every sequence that wants one), each
     * costing e0 + e1 x its sequences, fitted in `draft`. */
    bool draft_model;
    spec_cost draft;
    uint64_t calls; /* decisions made (for the probe cadence) */
} spec_ctl;

/* Choose k[i] in [0, avail[i]] for n decoding sequences with acceptance
 * estimates alpha[i] (avail[i]: drafts on offer, at most k_max). Returns the
 * total drafts chosen. With a draft model every draft also costs its share
 * of the draft passes; its probes add SPEC_PROBE_TOKENS drafts, and none
 * while drafts could not pay even if verifying them were free. */
int spec_choose(spec_ctl *c, int n, const double *alpha, const int *avail, int *k);

/* ---- speculative sampling ------------------------------------------------------------ */

/* Inverse CDF: the token whose cumulative probability (in id order) first
 * exceeds u * sum(p) (u in [0, 1)); -1 when p has no mass. */
int32_t spec_draw(const float *p, int n, double u);

/* One position of speculative sampling. p: the target's distribution, q: the
 * draft's (n floats each, as sampler_dist makes them), x: the draft token,
 * drawn from q. x is kept with probability min(1, p[x] / q[x]) (u_accept <
 * p[x] / q[x]); otherwise the token is drawn with u_resid from the residual
 * norm(max(0, p - q)) (from p when the residual has no mass, which happens
 * only when p equals q). The result is distributed as p. *accepted says which;
 * returns the token (-1 when p has no mass). */
int32_t spec_verify_token(const float *p, const float *q, int n, int32_t x, double u_accept, double u_resid,
                          bool *accepted);

#endif
