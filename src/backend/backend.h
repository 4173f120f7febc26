/* The backend layer: what runs a model. A backend owns everything a step
 * needs on its device (threads, the paged KV block pool, the forward pass
 * and its buffers) and runs one ragged batch per step. The engine and the
 * runner (runner.h, for tools) see a backend only through this table, so a
 * second backend (CUDA) is a sibling of cpu.c that fills the same table.
 *
 * KV blocks are reference counted: sequences may share blocks read-only (a
 * cached prompt prefix), a block returns to the pool when its last holder
 * frees it, and a shared block is copied before it is written
 * (backend_block_cow). Blocks are handed out and returned by one thread at a
 * time (the engine loop, or a runner's caller). */
#ifndef TK_BACKEND_BACKEND_H
#define TK_BACKEND_BACKEND_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "tokamak.h"

struct tk_tokenizer;

/* One step: decode tokens and prefill chunks of many sequences.
 * Logits come back as rows of n_vocab floats, sequence after sequence, and
 * inside a sequence in position order: sum(n_logits) rows in all. A decode
 * wants 1, a prefill chunk that does not end the prompt 0, a speculative
 * verification of k draft tokens k + 1. */
typedef struct tk_batch {
    int n_seq;
    int n_tok;                /* sum of n[] */
    const int32_t *tokens;    /* (n_tok) ids, sequence after sequence */
    const int32_t *n;         /* (n_seq) tokens of each sequence in this step */
    const int32_t *pos0;      /* (n_seq) position of each sequence's first token here */
    const int32_t *const *bt; /* (n_seq) block tables covering positions [0, pos0+n) */
    const int32_t *n_logits;  /* (n_seq) 0..n[s]: logits of the sequence's last n_logits[s] tokens */
} tk_batch;

/* Total logits rows a batch asks for. */
int backend_batch_logits(const tk_batch *b);

typedef struct backend {
    void *ctx;
    /* what it runs */
    int n_vocab;
    const struct tk_tokenizer *tok; /* NULL: no text, no EOS detection */
    const char *weight_dtype;
    int n_threads;
    uint64_t model_id; /* names the weights the KV is made from (the prefix cache hashes it) */
    /* its KV pool */
    int n_blocks; /* blocks the backend stores */
    int block_size;
    tk_kv_type kv_type;
    tk_kv_scale kv_scale;
    size_t kv_bytes_per_token;
    /* the most one step may hold (fails with TK_ERR_INVALID beyond) */
    int max_tokens, max_seqs, max_ctx;

    int (*block_alloc)(void *ctx);            /* one holder; -1 when none is free */
    void (*block_free)(void *ctx, int block); /* drops one holder */
    int (*blocks_free)(void *ctx);
    /* Sharing; a backend whose blocks are never shared (test doubles of the
     * engine) may leave these NULL. */
    void (*block_ref)(void *ctx, int block); /* one more holder */
    int (*block_refs)(void *ctx, int block); /* holders (0: free) */
    /* positions [0, n_slots) of every layer (block_size: the whole block), scales included */
    void (*block_copy)(void *ctx, int dst, int src, int n_slots);
    /* One step; logits: backend_batch_logits(b) x n_vocab floats (NULL when 0).
     * Fails without touching the KV cache on a batch past the limits above or
     * a token id outside the vocabulary. */
    tk_status (*step)(void *ctx, const tk_batch *b, float *logits);
    uint64_t (*last_bytes)(void *ctx); /* weight + KV bytes the last step read; may be NULL */
    /* What the last step's stages read and computed, TK_STEP_TERMS terms
     * (tk_step_record.floor_terms); may be NULL */
    void (*last_floor_terms)(void *ctx, tk_floor_term *out);
    /* Read back (dequantized) the K and V vectors ([n_head_kv][head_dim] floats
     * each) of position pos in layer l of block table bt. For tests and
     * debugging; may be NULL. */
    void (*kv_read)(void *ctx, int l, const int32_t *bt, int pos, float *k, float *v);
    /* Call fn(arg, i) once for each i in [0, n) on the backend's threads (the
     * caller among them; items are handed out one at a time, so their costs
     * may differ) and return when all are done. Not during a step. May be
     * NULL (backend_run_each then loops on the caller). */
    void (*run_each)(void *ctx, void (*fn)(void *arg, int i), void *arg, int n);
    void (*destroy)(void *ctx); /* may be NULL */
} backend;

/* Make block table entry bt[j] writable: when the block has other holders,
 * copy it into a fresh block, drop this table's hold on the shared one and
 * point bt[j] at the copy. TK_ERR_FULL (bt unchanged) when no block is free. */
tk_status backend_block_cow(const backend *be, int32_t *bt, int j);

/* Whether the KV is INT8 with per-head scales, whose blocks a later token
 * may rescale: then queries read their own block through own-block records
 * (kv_attn_own_block) and a rollback rewrites the block (backend_rewrite_from). */
bool backend_kv_rescales(const backend *be);

/* Rolling a sequence back to n_pos tokens (positions >= n_pos dropped): the
 * first position its caller must write again for the KV of [0, n_pos) to be
 * the KV of a run that never wrote the dropped tokens. n_pos for every KV
 * type but INT8 with per-head scales: there a block's channel scales only
 * grow and its earlier values are requantized to them, so the dropped tokens
 * may have changed the block holding n_pos - 1; that block is written afresh
 * from its first slot (the start of the block). See runner_truncate. */
int backend_rewrite_from(const backend *be, int n_pos);

/* fn(arg, i) for each i in [0, n): on the backend's threads (be->run_each)
 * when it has them and n > 1, else in order on the caller. */
void backend_run_each(const backend *be, void (*fn)(void *arg, int i), void *arg, int n);

/* ---- the CPU backend (cpu.c) ----------------------------------------------------- */

/* Where the forward pass shows a matmul's input to an observer: the normed
 * input of q/k/v, the attention output (input of o), the normed input of
 * gate/up, silu(gate)*up (input of down). */
typedef enum backend_site {
    BACKEND_SITE_ATTN_IN = 0,
    BACKEND_SITE_ATTN_OUT,
    BACKEND_SITE_FFN_IN,
    BACKEND_SITE_FFN_MID,
    BACKEND_SITE_COUNT
} backend_site;

/* x: (n_tok, k) the step's rows at that site of layer `layer`, read-only and
 * valid during the call. Called from one pool thread, in layer order. */
typedef void (*backend_observe_fn)(void *ctx, int layer, backend_site site, const float *x, int n_tok,
                                   int64_t k);

typedef struct backend_cpu_opts {
    int n_threads; /* 0: one per core (one per listed CPU with cpus) */
    bool pin_threads;
    const char *cpus; /* CPU list (pool_parse_cpus): thread i on the i-th, cycling; NULL: none */
    bool numa;        /* interleave weights, KV and buffers over the threads' nodes (core/numa.h) */
    int block_size;
    tk_kv_type kv_type;
    tk_kv_scale kv_scale;
    int n_blocks; /* KV blocks; 0: as many as kv_mem bytes hold */
    size_t kv_mem;
    int min_blocks; /* refuse a kv_mem that holds fewer (one sequence's context) */
    int max_tokens, max_seqs, max_ctx;
    bool unfused;   /* the unfused forward plan (ablation) */
    bool even_rows; /* row-split projections in even shares, not measured ones (fwd_opts) */
    /* NULL: nothing observed (the step costs one untaken branch per stage).
     * Else every step shows each matmul input to observe (calibration tools;
     * not with unfused). */
    backend_observe_fn observe;
    void *observe_ctx;
    /* NULL: a thread pool of its own. Else a CPU backend whose pool this one
     * runs on (it must outlive this one; steps of the two must not overlap):
     * several KV caches over one model without idle threads spinning. */
    const backend *share_pool;
} backend_cpu_opts;

/* Fill *out with a CPU backend over m (which must outlive it). On failure
 * *out is zeroed and nothing is held. Freed by backend_free. */
tk_status backend_cpu_create(const tk_model *m, const backend_cpu_opts *o, backend *out);

struct fwd_prof;
/* Stage timing (model/fwd_prof.h) of the following steps of a CPU backend,
 * or none (NULL); prof holds one row per thread (be->n_threads). Not during a
 * step. TK_ERR_INVALID when be is not a CPU backend. */
tk_status backend_cpu_profile(const backend *be, struct fwd_prof *prof);
/* The shares of the row-split projections the next step gives each thread
 * (fwd_row_shares): be->n_threads values into out. TK_ERR_INVALID when be
 * is not a CPU backend. */
tk_status backend_cpu_row_shares(const backend *be, double *out);

/* Destroy the backend (be->destroy) and zero it; NULL or zeroed: no-op. */
void backend_free(backend *be);

#endif
