/* The runner: one sequence straight on a backend, for the tools that need
 * what the engine's API does not carry (every logit of a step for
 * run --dump-logits, teacher-forced tokens for kvcheck, several positions'
 * logits for speculative verification). It holds the sequence's block table
 * and token history, allocates blocks as the sequence grows, copies a shared
 * block before writing it, and rolls back. Not thread-safe: one caller at a
 * time, and not at the same time as another user of the same backend. */
#ifndef TK_BACKEND_RUNNER_H
#define TK_BACKEND_RUNNER_H

#include <stdint.h>

#include "backend/backend.h"

typedef struct runner runner;

/* A sequence of up to be->max_ctx tokens on be (which must outlive it). */
tk_status runner_init(const backend *be, runner **out);
/* Returns the sequence's blocks (a shared one stays with its other holders). */
void runner_free(runner *r);

int runner_len(const runner *r);               /* tokens in the KV cache */
const int32_t *runner_tokens(const runner *r); /* (runner_len) what was fed */
int runner_blocks_held(const runner *r);

/* Feed n tokens after the last one (1 <= n <= be->max_tokens, the sequence
 * stays within be->max_ctx) in one step; logits of the last n_logits of them
 * (0..n) land in logits (n_logits x n_vocab, positions in order). On failure
 * the sequence is as before (blocks it took for the step stay held). */
tk_status runner_step(runner *r, const int32_t *toks, int n, int n_logits, float *logits);

/* Feed n >= 1 tokens after the last one in steps of at most be->max_tokens
 * (a prompt longer than a step); the logits of the last of them land in
 * logits (n_vocab; NULL: none). On failure the steps that ran stay fed. */
tk_status runner_feed(runner *r, const int32_t *toks, int n, float *logits);

/* Roll the sequence back to its first n_pos tokens (0 <= n_pos <= len).
 * Guarantee: the KV of positions [0, n_pos) afterwards is bit for bit the KV
 * of a run that fed the same steps up to position w = backend_rewrite_from(n_pos),
 * then tokens [w, n_pos) as one step, and never fed the dropped tokens. For
 * f32/f16/bf16 and INT8 per-token KV, w = n_pos: nothing is recomputed (each
 * position's K and V depend only on positions before it), so the KV equals
 * that of the run as it was fed. For INT8 per-head KV the dropped tokens may
 * have grown the channel scales of the block holding n_pos - 1 and
 * requantized its earlier values, so that block is written afresh: tokens
 * [w, n_pos) (w its first position) are fed again from the history, which
 * costs one step of up to block_size - 1 tokens. Blocks wholly past the kept
 * positions go back to the backend. */
tk_status runner_truncate(runner *r, int n_pos);

/* A new sequence on the same backend holding r's first n_pos tokens, sharing
 * r's blocks read-only (reference counted; the first of the two to write a
 * shared block copies it): a cached prefix costs no recomputation and no
 * memory until the two diverge. As runner_truncate(n_pos) of a copy of r. */
tk_status runner_fork(const runner *r, int n_pos, runner **out);

/* K and V of position pos < len in layer l (backend kv_read; for tests). */
tk_status runner_kv_read(const runner *r, int l, int pos, float *k, float *v);

#endif
