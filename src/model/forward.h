/* One batched forward step over a ragged batch: decode tokens and prefill chunks
 * of many sequences in one pass, reading and writing the paged KV cache, with
 * logits only where they are wanted (the last token of a sequence, or its last
 * few for speculative verification). Reads like the paper: norm, QKV, RoPE,
 * attention, output, FFN; the stages are fused kernels named after what they
 * compute. Runs on the engine's pool; no allocation, locking or logging inside. */
#ifndef TK_MODEL_FORWARD_H
#define TK_MODEL_FORWARD_H

#include <stdbool.h>
#include <stdint.h>

#include "backend/backend.h"
#include "core/pool.h"
#include "kv/kv.h"
#include "tokamak.h"

typedef struct fwd_opts {
    int max_tokens;             /* most tokens in one step (the step budget) */
    int max_seqs;               /* most sequences in one step */
    int max_ctx;                /* longest context (sizes attention scratch) */
    bool unfused;               /* the unfused reference stages: one barrier per op (ablation) */
    bool even_rows;             /* the row-split projections in even shares (fwd_set_row_shares) */
    backend_observe_fn observe; /* NULL, or shown every matmul input (fused plan only) */
    void *observe_ctx;
} fwd_opts;

typedef struct fwd_ctx fwd_ctx;

/* Buffers are sized here once; fwd_step never allocates. model, kv and pool
 * must outlive the context. */
tk_status fwd_init(const tk_model *m, tk_kv *kv, tk_pool *pool, const fwd_opts *o, fwd_ctx **out);
void fwd_free(fwd_ctx *f);
/* One step (tk_batch: backend/backend.h). logits: backend_batch_logits(b) x
 * n_vocab floats, sequence after sequence, positions in order. Fails (TK_ERR_INVALID) without touching the KV
 * cache if the batch exceeds the sizes given at init or a token id is out of range. */
tk_status fwd_step(fwd_ctx *f, const tk_batch *b, float *logits);
/* Weight + KV bytes the last step had to read (for the roofline). */
uint64_t fwd_last_bytes(const fwd_ctx *f);
struct fwd_stage_cost;
/* What each stage of the last step read and computed (model/fwd_prof.h:
 * FWD_ST_COUNT of them, indexed by fwd_stage), for its floor; the bytes add
 * up to fwd_last_bytes. Before any step: all zero. */
void fwd_last_costs(const fwd_ctx *f, struct fwd_stage_cost *out);

/* The output, gate/up and down projections and the vocabulary rows are
 * split between the threads in shares that follow each thread's measured
 * speed in them (even at first; updated after every step). shares (one per
 * pool thread, in [0, 1], summing to 1) fixes them instead; NULL returns to
 * measuring from an even split. Which thread computes a row never changes
 * its value, so the logits do not depend on the shares. Not during a step. */
tk_status fwd_set_row_shares(fwd_ctx *f, const double *shares);
/* The shares the next step uses: one per pool thread into out. */
void fwd_row_shares(const fwd_ctx *f, double *out);

struct fwd_prof;
/* Attach stage timing (model/fwd_prof.h) to the following steps, or detach
 * it (NULL). p must hold one row per pool thread and outlive its use; the
 * fused plan only. Not during a step. */
tk_status fwd_set_profile(fwd_ctx *f, struct fwd_prof *p);

#endif
