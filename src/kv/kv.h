/* The paged KV cache: one pool of fixed-size blocks per model, allocated once.
 * A sequence owns a block table (block ids in position order); position p lives
 * in block table[p / block_size], slot p % block_size.
 *
 * The pool holds one unit per (layer, kv head, block), in that order, so a
 * kv head's blocks of one layer are adjacent and a sequence whose blocks have
 * consecutive ids is one run per (layer, kv head) (kvattn.h kv_geom). A unit
 * (dtype = the pool's KV type) is K [block_size][head_dim], then V
 * [block_size][head_dim], then, int8 only, the K and V scales
 *   (K of f32, f16 and bf16 in blocks of 128 or more: by columns of 16
 *   positions, [block_size / 16][head_dim][16]; int8 K dotted against int8
 *   queries in such blocks: [block_size / 16][head_dim / 4][16][4];
 *   kvattn.h kv_k_cols)
 * INT8 scales (float):
 *   per token: k_scale/v_scale [block_size] (absmax/127 of each vector)
 *   per head:  k_scale/v_scale [head_dim] per unit: one scale per
 *              channel of a head's vectors in the block; a larger new value
 *              rescales the block's existing int8 values of that channel (so
 *              order of writes, not batching, decides the values: batch
 *              invariant).
 * Attention reads K/V straight from the blocks, dequantising int8 on the fly. */
#ifndef TK_KV_H
#define TK_KV_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "tokamak.h"

/* The largest head_dim a pool takes (no less than the models' TK_MAX_HEAD_DIM:
 * forward.c asserts it). */
#define KV_MAX_HEAD_DIM 1024

typedef struct tk_kv_opts {
    int n_layer, n_head_kv, head_dim; /* head_dim <= KV_MAX_HEAD_DIM */
    int block_size;                   /* 16/32/64/128/256 */
    int n_blocks;                     /* per layer */
    tk_kv_type type;
    tk_kv_scale scale;
} tk_kv_opts;

typedef struct tk_kv tk_kv;

tk_status kv_init(const tk_kv_opts *o, tk_kv **out);
void kv_free(tk_kv *kv);
const tk_kv_opts *kv_opts(const tk_kv *kv);

/* Bytes per token of context over all layers (K+V, scales included). */
size_t kv_bytes_per_token(const tk_kv_opts *o);
/* Bytes of one block over all layers. */
size_t kv_block_bytes(const tk_kv_opts *o);
/* Bytes of one (layer, kv head, block) unit: its K, V and scales, rounded
 * up to 64; block b + 1's unit follows block b's. 0 for options kv_init
 * refuses. */
size_t kv_run_bytes(const tk_kv_opts *o);

/* Block allocation (one thread at a time: the engine loop or a runner).
 * Blocks are reference counted so sequences can share a prefix read-only:
 * alloc returns a block with one holder (-1 when none is free); ref adds a
 * holder to an allocated block; free drops one, and the block returns to the
 * free list only when its last holder lets go. A block with more than one
 * holder must not be written: copy it to a block of its own first
 * (backend_block_cow). */
int kv_block_alloc(tk_kv *kv);
void kv_block_ref(tk_kv *kv, int block);
void kv_block_free(tk_kv *kv, int block);
int kv_block_refs(const tk_kv *kv, int block); /* 0: free */
int kv_blocks_free(const tk_kv *kv);
int kv_blocks_total(const tk_kv *kv);
/* Copy positions [0, n_slots) of every layer and kv head of block src over
 * block dst (K, V and their int8 scales; per-head scales are every slot's,
 * so they are copied whole); both allocated, 0 <= n_slots <= block_size
 * (block_size: the whole block). K stored by columns is copied in whole
 * groups of KV_KT slots. src is unchanged. */
void kv_block_copy(tk_kv *kv, int dst, int src, int n_slots);

/* Where layer l's units are, for the kernels (kv_geom_k and the others give
 * a (block, kv head)'s K, V and scales). */
struct kv_geom kv_layer_geom(const tk_kv *kv, int l);

/* Write the K and V vectors ([n_head_kv][head_dim] floats each) of one token at
 * position pos of a sequence with block table bt, in layer l.
 * Threads: writes of different positions may run at once, except with int8
 * per-head scales, where a (block, kv head) must be written by one thread in
 * position order (a new vector may rescale the earlier ones, and slot 0 starts
 * the block afresh): split such writes by sequence or by kv head. */
void kv_write(tk_kv *kv, int l, const int32_t *bt, int pos, const float *k, const float *v);
/* kv_write for kv heads [kvh0, kvh1) only (k and v are still the whole
 * [n_head_kv][head_dim] rows), so threads can split a token's writes by head. */
void kv_write_heads(tk_kv *kv, int l, const int32_t *bt, int pos, const float *k, const float *v, int kvh0,
                    int kvh1);

/* Read back (dequantize) the K and V vectors of position pos, as kv_write's
 * layout ([n_head_kv][head_dim] floats each). For tests and debugging. */
void kv_read(const tk_kv *kv, int l, const int32_t *bt, int pos, float *k, float *v);
/* The int8 scale that applies to element (pos, head, chan) of K (v false) or
 * V: the token's scale (per token) or the block's channel scale (per head); 0
 * for float types. */
float kv_read_scale(const tk_kv *kv, int l, const int32_t *bt, int pos, int head, int chan, bool v);

/* Attention for n_q query tokens of one sequence in layer l, rows of heads
 * [h0, h1) only (callers split heads over threads):
 *   q:   [n_q][n_head][head_dim]  (RoPE applied)
 *   out: [n_q][n_head][head_dim]
 * query i sits at position pos0 + i and attends causally to positions [0, pos0+i].
 * GQA: head h reads kv head h / (n_head / n_head_kv). scratch: kv_attn_scratch_floats floats.
 * own: NULL, except where kv_attn_own_block says a query reads its own block
 * through a record: then [n_q][n_head] records of KV_PART_REC(head_dim)
 * floats, query i's taken by kv_attention_own right after position pos0 + i
 * was written (heads [h0, h1) are read).
 * next_bt, next_kvh: what the caller reads next (next_bt NULL: not known),
 * the sequence and kv head whose first block this call asks the cache for
 * as it ends (a hint only; without it the kernel asks for the same
 * context's next kv head, what a caller taking the heads in order reads).
 * Threads: read-only on the pool; many may run at once (own scratch each).
 * The kernel (reference, AVX2, AVX-512; see kv_simd.h) is picked at kv_init
 * from cpu_isa_from_env (TOKAMAK_ISA caps it). */
void kv_attention(const tk_kv *kv, int l, const int32_t *bt, int pos0, int n_q, const float *q, int n_head,
                  int h0, int h1, float scale, const float *own, float *out, float *scratch,
                  const int32_t *next_bt, int next_kvh);
/* Whether queries read their own block through own-block records: INT8 with
 * per-head scales, where writing a token may rescale its block's earlier
 * values. A query's record is its attention over its own block as the block
 * stood right after the query's position was written, so a query sees the
 * block at the scales its own prefix gave it, not those of tokens written
 * after it in the same step: outputs do not depend on how tokens are split
 * into steps (prefill chunks, speculative verification, rewrites). */
bool kv_attn_own_block(const tk_kv *kv);
/* The end (exclusive) of what a query at position pos reads from the pool
 * before its record: pos + 1, or its own block's start with own-block records. */
int kv_attn_end(const tk_kv *kv, int pos);
/* The own-block record of the query at position pos (q: [n_head][head_dim]),
 * heads [h0, h1), to rec + (h - h0) * KV_PART_REC(head_dim); call it after
 * writing pos and before writing pos + 1 in that block for those heads' kv
 * heads. Threads: like kv_attention. next_bt, next_pos, next_kvh: what the
 * caller reads next (next_bt NULL: nothing), the block of that position and
 * kv head, which this record asks the cache for as it goes, so a run of
 * writes and records streams its scattered blocks (a hint only). */
void kv_attention_own(const tk_kv *kv, int l, const int32_t *bt, int pos, const float *q, int n_head, int h0,
                      int h1, float scale, float *rec, float *scratch, const int32_t *next_bt, int next_pos,
                      int next_kvh);
/* Asks the cache for what writing position pos (kv_write_heads) touches for
 * kv heads [kvh0, kvh1): the slot's K and V rows and the block's scales. A
 * hint: callers issue it for the next token while they work on this one (its
 * block is another sequence's, and cold). */
void kv_prefetch_write(const tk_kv *kv, int l, const int32_t *bt, int pos, int kvh0, int kvh1);
/* Flash-decoding: the context a token at position pos reads from the pool,
 * [0, end) with end = kv_attn_end(kv, pos), is attended in kv_attn_parts(end)
 * parts of a fixed number of positions (the split depends on the length
 * only), which threads may compute separately. kv_attention does the same
 * parts in one call and folds them, so it gives the same bits as
 * kv_attention_part over every part then kv_attention_merge.
 * kv_attention_part writes, for heads [h0, h1) of one token's q
 * ([n_head][head_dim]), one record of head_dim + 2 floats per head at part_out
 * + (h - h0) * (head_dim + 2). kv_attention_merge folds n_parts such record
 * sets (set k at parts + k * part_stride) in order, then the own-block
 * records of those heads (own: NULL, or one per head, head_dim + 2 floats
 * apart), into out ([n_heads][head_dim]).
 * Threads: like kv_attention. */
int kv_attn_parts(int len);
void kv_attention_part(const tk_kv *kv, int l, const int32_t *bt, int end, int part, const float *q,
                       int n_head, int h0, int h1, float scale, float *part_out, float *scratch);
void kv_attention_merge(const tk_kv *kv, const float *parts, int n_parts, size_t part_stride, int n_heads,
                        const float *own, float *out);
/* Softmax is computed online a block at a time, so the scratch size depends on
 * head_dim and block_size only; max_ctx is accepted for callers' sake. */
size_t kv_attn_scratch_floats(const tk_kv *kv, int max_ctx);

#endif
