/* The draft model drafter: a second, smaller model that shares the target's
 * tokenizer proposes each speculating sequence's next k tokens.
 *
 * It runs on its own backend (its own KV block pool, the target backend's
 * thread pool) from the engine loop thread, between the target's steps. Each
 * sequence's draft KV follows the target lazily: the first draft pass of a
 * step feeds the tokens the draft has not seen (the whole prompt the first
 * time, in chunks when it is long, else the tokens accepted since) and the
 * j-th pass feeds draft j - 1, so k drafts cost k passes, each batched across
 * the sequences that want that many. After verification the draft KV is cut
 * back to the tokens that stayed (drafter_settle), with the same rule for
 * INT8 per-head blocks as the target's rollback (backend_rewrite_from). */
#ifndef TK_ENGINE_DRAFT_H
#define TK_ENGINE_DRAFT_H

#include <stdbool.h>
#include <stdint.h>

#include "backend/backend.h"
#include "engine/sampler.h"
#include "engine/spec.h"
#include "tokamak.h"

/* One sequence's draft state, embedded in the engine's request. */
typedef struct draft_seq {
    int32_t *bt; /* (bt_cap) draft KV block table */
    int bt_cap, n_blocks;
    int n_done;          /* tokens of the sequence whose draft K/V are cached */
    tk_sampler *sampler; /* the request's sampling over the draft's logits (made at the first draft) */
    /* A KV type that rescales (INT8 per head): a copy of the block of
     * journal_pos (the first draft position) taken before this step's draft
     * passes fed drafts into it, put back by drafter_settle after a
     * rejection (has_journal: one is held). */
    bool has_journal;
    int journal, journal_pos;
} draft_seq;

/* One sequence's drafting this step. */
typedef struct draft_job {
    draft_seq *ds;
    int32_t *tokens;             /* the known tokens; drafts are written after them */
    int n_tokens;                /* known tokens (the last one is the target's next decode) */
    int n_prompt;                /* tokens[0, n_prompt) are prompt (for the penalties) */
    const tk_sampling *sampling; /* the request's */
    int k;    /* in: drafts wanted; out: drafts made (0 on a short pool or a long catch-up) */
    float *q; /* out (k rows of n_vocab): the draft's distribution at each draft
               * (temperature > 0); NULL: not kept */
} draft_job;

typedef struct drafter drafter;

/* Open the draft model at path and check it against the target backend: the
 * same vocabulary size, the same special tokens (BOS, EOS, end-of-generation)
 * and the same text of every token. Its backend runs on target's thread pool
 * with target's KV type, block size and limits, and n_blocks blocks. */
tk_status drafter_create(const char *path, const backend *target, int n_blocks, int max_tokens, int max_seqs,
                         int ctx, drafter **out);
/* Every draft_seq must be released first. */
void drafter_free(drafter *d);

/* A draft state for a context of ctx positions (allocates its table). */
tk_status drafter_seq_init(drafter *d, draft_seq *ds);
/* Drop the draft KV (preemption: it is rebuilt when the sequence drafts again). */
void drafter_seq_release(drafter *d, draft_seq *ds);
/* Release and free the table and sampler. */
void drafter_seq_free(drafter *d, draft_seq *ds);

/* Run the draft passes for jobs[0, n) (k == 0 ones are skipped). Every
 * pass's time (catch-up and sampling included) is folded into cost over the
 * sequences it drafts for. Returns the seconds spent; on a backend failure
 * every job's k is 0 and the draft KV of the jobs is dropped. */
double drafter_run(drafter *d, draft_job *jobs, int n, spec_cost *cost);

/* One sequence the draft follows: its known tokens, and where the feed ends. */
typedef struct draft_follow {
    draft_seq *ds;
    const int32_t *tokens;
    int end; /* feed the tokens [ds->n_done, end) */
} draft_follow;

/* Feed the draft the tokens the target prefilled this step, in one pass that
 * wants no logits, so that the draft KV follows each prompt as it goes in and
 * a sequence's first draft pass has a token or two to catch up on, not its
 * whole prompt (which would stall the turn, and leave the sequence without
 * drafts on steps that depend on what else started drafting with it). Each
 * feed starts where the sequence's draft KV stops; oldest first while the
 * pass has room (max_tokens), the rest, or a sequence the pool is short for,
 * left to drafter_run's catch-up. Returns the seconds spent, *n_fed the
 * tokens fed; on a backend failure the draft KV of the jobs is dropped (and
 * *n_fed is 0). */
double drafter_follow(drafter *d, const draft_follow *jobs, int n, int *n_fed);

/* After verification: the first n_keep tokens of the sequence are known and
 * equal what the draft was fed; the draft KV past them is dropped. */
void drafter_settle(drafter *d, draft_seq *ds, int n_keep);

/* The draft backend's vocabulary (the target's). */
int drafter_n_vocab(const drafter *d);
/* The draft backend (tests read its KV through kv_read). */
const backend *drafter_backend(const drafter *d);

#endif
