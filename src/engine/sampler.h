/* The per-request token sampler: logit bias, penalties, greedy or temperature
 * sampling with top-k / top-p / min-p, and top-n logprobs.
 *
 * Order of operations (documented in docs/engine.md):
 *   1. logit bias            logits[t] += bias (a bias of -inf bans t)
 *   2. repetition penalty    HF: l > 0 ? l / r : l * r, over every token of history
 *   3. presence/frequency    OpenAI: l -= presence * (count > 0) + frequency * count,
 *                            over the history after the first n_prompt tokens
 *   4. logprobs              log_softmax of the logits after 1-3 (temperature 1)
 *   5. temperature 0: argmax (ties: lowest id); else logits / T, then top-k,
 *      top-p, min-p, and one draw from the kept mass.
 *
 * The random stream is counter based: draw i of a request is a hash of (seed, i),
 * so the same seed gives the same tokens whatever else runs in the batch and
 * however the engine interleaves requests. Buffers are sized at init; a call
 * never allocates (a temperature sampler holds ~22 bytes of scratch per
 * vocabulary entry). One sampler per request, used by one thread at a time;
 * different samplers may run on different threads at once (they share only
 * the read-only dispatch table). */
#ifndef TK_ENGINE_SAMPLER_H
#define TK_ENGINE_SAMPLER_H

#include <stdint.h>

#include "tokamak.h"

typedef struct tk_sampler tk_sampler;

/* Check sampling parameters against a vocabulary without allocating (submit
 * uses it so a bad request is refused before it is queued). TK_ERR_INVALID or
 * TK_ERR_RANGE with a message naming the field, its value and the allowed range. */
tk_status sampler_check(const tk_sampling *s, int n_vocab);

/* Validate (as sampler_check) and create a sampler; s->logit_bias is copied.
 * Free with sampler_free. */
tk_status sampler_init(const tk_sampling *s, int n_vocab, tk_sampler **out);
void sampler_free(tk_sampler *s);

/* Presence and frequency penalties count only history[n_prompt..] (OpenAI's
 * "tokens generated so far"); the repetition penalty counts all of history
 * (HF). Default 0: everything in history counts for both. */
void sampler_set_n_prompt(tk_sampler *s, int n_prompt);

/* Sample one token from logits (n_vocab floats; modified in place). history
 * (n_history ids, may be NULL when 0) feeds the penalties; ids outside the
 * vocabulary in history are ignored. Fills ev->token, ev->logprob (NAN unless
 * the sampling asks for logprobs: then greedy reads the logits once), ev->n_top
 * and the top arrays (when n_logprobs > 0); leaves the other fields of ev alone.
 * Returns the token, or -1 when no token has a finite logit (NaN logits count
 * as -inf), in which case ev is untouched. Advances the random counter by one
 * on every call, greedy included, so draws stay aligned with positions. */
int32_t sampler_sample(tk_sampler *s, float *logits, const int32_t *history, int n_history,
                       tk_token_event *ev);

/* The distribution sampler_sample would draw from at this position (steps
 * 1-3 and 5: logit bias, penalties, temperature, top-k/top-p/min-p) into prob
 * (n_vocab floats, 0 outside the kept tokens; a point mass on the argmax at
 * temperature 0); prob may be NULL (only the argmax). logits are processed in
 * place as by sampler_sample; *lse (may be NULL) is for sampler_event (NAN
 * where the sampling asks for no logprobs: none is computed). Draws
 * nothing. Returns the argmax, or -1 when no token has a finite logit. */
int32_t sampler_dist(tk_sampler *s, float *logits, const int32_t *history, int n_history, float *prob,
                     float *lse);
/* Fill ev (token, logprob, top-n) for tok from logits and lse as sampler_dist left them. */
void sampler_event(const tk_sampler *s, const float *logits, float lse, int32_t tok, tk_token_event *ev);
/* Take the next draw of the stream without sampling: its index (the counter
 * advances as a sampler_sample call advances it). */
uint64_t sampler_next_draw(tk_sampler *s);
const tk_sampling *sampler_params(const tk_sampler *s);

/* Number of draws made so far (the counter of the random stream). */
uint64_t sampler_draws(const tk_sampler *s);

/* The uniform in [0, 1) of draw i of stream seed (exposed for tests). */
double sampler_uniform(uint64_t seed, uint64_t i);

#endif
