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
/* A draft whose expected gain is below this is never verified. */
#define SPEC_MIN_GAIN 0.05

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

typedef struct spec_ctl {
    int k_max;     /* most drafts per sequence */
    int max_total; /* most drafts per step */
    spec_cost cost;
    uint64_t calls; /* decisions made (for the probe cadence) */
} spec_ctl;

/* Choose k[i] in [0, avail[i]] for n decoding sequences with acceptance
 * estimates alpha[i] (avail[i]: drafts on offer, at most k_max). Returns the
 * total drafts chosen. */
int spec_choose(spec_ctl *c, int n, const double *alpha, const int *avail, int *k);

#endif
