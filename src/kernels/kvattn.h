/* The interface of the attention kernels over the paged KV cache: where one
 * layer's blocks live (kv_geom) and the kernel signatures. The KV pool
 * (src/kv/kv.c) fills a kv_geom and calls the kernel the dispatcher picked
 * (kern_attn_for in kernels.h); the kernels see the pool only through it, so
 * the tk_kv struct stays private to kv.c. */
#ifndef TK_KERNELS_KVATTN_H
#define TK_KERNELS_KVATTN_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "core/dtype.h"
#include "tokamak.h"

/* (query, head) pairs that read the same KV head are processed together, up
 * to this many: the query heads of a GQA group and, in a prefill chunk,
 * several query tokens; a block's K and V rows are read once for all. */
#define KV_ATTN_TILE 8

/* A context is attended in parts of this many positions (a multiple of every
 * block size), each with its own online softmax, folded in order at the end:
 * the split depends on the context length only, so a long context's parts can
 * run on different threads with the same result as one call. */
#define KV_ATTN_PART 512

/* Floats of one part's record for one head: acc[head_dim] (the unnormalized
 * weighted V sum), then its max m and sum l. */
#define KV_PART_REC(hd) ((size_t)(hd) + 2)

/* Per-head int8 scales (one per block, kv head and channel) only grow, and
 * each time by at least this factor (see kv.c, write_int8_chan): a new scale
 * is max(|x| / 127, KV_INT8_MIN_GROWTH * old scale), so a slowly growing
 * channel is rescaled at most ~6 times per doubling of its absmax instead of
 * once per token, and the rounding error those rescales add to the block's
 * earlier values stays bounded. */
#define KV_INT8_MIN_GROWTH 1.125f

/* Where one layer's blocks live. Each (kv head, block) has a unit of
 * block_stride bytes (a multiple of 64, so every unit starts 64-byte
 * aligned) at byte kvh * head_stride + b * block_stride of the layer (kv.c
 * lays a kv head's blocks side by side: block_stride is one unit, so a
 * sequence whose blocks have consecutive ids is one run per kv head):
 *   K       [block_size][head_dim]  elements of the KV type, or
 *           [block_size / KV_KT][head_dim][KV_KT] (kv_k_cols, a float type)
 *           or [block_size / KV_KT][head_dim / 4][KV_KT][4] (kv_k_cols, int8)
 *   V       [block_size][head_dim], v_off bytes after its K
 * and then, int8 only,
 *   k_scale [block_size] floats (int8 per token) or [head_dim] (int8 per
 *           head: one per channel), ks_off bytes after its K
 *   v_scale the same, at vs_off. */
typedef struct kv_geom {
    uint8_t *layer;      /* this layer's units */
    size_t block_stride; /* bytes from a kv head's block b to b + 1 */
    size_t head_stride;  /* bytes from one kv head's units to the next one's */
    size_t v_off;        /* bytes from a unit's K to its V */
    size_t ks_off, vs_off;
    int n_blocks, n_head_kv, head_dim, block_size;
    tk_kv_type type;
    tk_kv_scale scale;
    /* int8 only: K is dotted against int8-quantised queries (kv_attn_ref
     * defines it: per query, head and block, q times the block's per-channel
     * K scales is rounded to int8 at max|.| / 127; the dot is exact in
     * integers). Set only for levels whose table says attn_q8, fixed for
     * the pool's life (it decides int8 K's layout: kv_k_cols). */
    bool q8;
} kv_geom;

/* Bytes of one (query, head)'s int8 query in a tile: head_dim rounded up to
 * 64 (the tail zero), so whole 64-byte dot products read it. */
#define KV_Q8_BYTES(hd) (((size_t)(hd) + 63) / 64 * 64)

/* Element size of a KV type in bytes (f32 4, f16/bf16 2, int8 1). */
static inline size_t kv_type_size(tk_kv_type t) { return t == TK_KV_F32 ? 4 : t == TK_KV_INT8 ? 1 : 2; }

/* K in blocks of KV_KT_BLOCK positions or more is stored transposed in
 * groups of KV_KT positions, so scores come out VL positions at a time (each
 * one a chain over the channels in order) with no reduction across lanes:
 *  - a float type: one channel of KV_KT consecutive positions is contiguous
 *    (kv_k_index), a vector load reads a channel of VL positions;
 *  - int8 with int8 queries (kv_geom.q8): 4 channels of one position are
 *    contiguous, then the next position's (kv_k8_index), so 64 bytes hold 4
 *    channels of 16 positions and one vpdpbusd against 4 bytes of the query
 *    adds them into 16 positions' integer dots (exact in any order).
 * A decode tile has few pairs (a GQA group), so it needs many positions of a
 * block at once to keep enough chains going: smaller blocks keep rows, and
 * so does int8 K dotted in floats. */
#define KV_KT       16
#define KV_KT_BLOCK 128
static inline bool kv_k_cols(tk_kv_type t, bool q8, int block_size) {
    return block_size >= KV_KT_BLOCK && (t != TK_KV_INT8 || q8);
}
/* Element index of (slot j, channel c) in one head's K of a block stored by
 * columns, a float type. */
static inline size_t kv_k_index(int hd, int j, int c) {
    return ((size_t)(j / KV_KT) * (size_t)hd + (size_t)c) * KV_KT + (size_t)(j % KV_KT);
}
/* The same for int8 (head_dim % 4 == 0). */
static inline size_t kv_k8_index(int hd, int j, int c) {
    return (size_t)(j / KV_KT) * KV_KT * (size_t)hd + (size_t)(c / 4) * (4 * KV_KT) +
           (size_t)(j % KV_KT) * 4 + (size_t)(c % 4);
}

/* 64-byte lines of one group of KV_KT positions of a head's K by columns. */
static inline size_t kv_k_group_lines(tk_kv_type t, int hd) {
    return ((size_t)hd * KV_KT * kv_type_size(t) + 63) / 64;
}

/* The order in which a tile's scores read a block's K by columns (dot_cols,
 * dot_cols_q8; u: the groups a tile's vectors span): sets of u groups of
 * KV_KT positions, line i of each group of a set in turn, then line i + 1;
 * when fewer than u groups are left, sets of the largest of 8, 4, 2, 1
 * below u that fit (kvattn_body.h's KV_COLS_FROM). u = 1 with one group
 * of all the block's lines is front to back. Attention asks for the next
 * block's K in this order while it sums the current block's V: the same
 * lines asked for front to back (one stream) read ~10% slower at batch 32
 * on an AMD EPYC VM, where u streams 2 KiB apart go out in parallel
 * (docs/notes.md). Past the block's groups the walk goes on front to back. */
typedef struct kv_k_walk {
    size_t u, groups, g; /* set size, the block's groups, lines per group */
    size_t b0, sz, i, k; /* next: line (b0 + k) * g + i, in the set [b0, b0 + sz) */
} kv_k_walk;
/* The size of the set that starts with rem groups left. */
static inline size_t kv_k_walk_set(size_t u, size_t rem) {
    if (rem >= u) return u;
    for (size_t s = 8; s > 1; s /= 2)
        if (s < u && s <= rem) return s;
    return 1;
}
static inline kv_k_walk kv_k_walk_start(int u, size_t groups, size_t g) {
    return (kv_k_walk){.u = (size_t)u, .groups = groups, .g = g, .sz = kv_k_walk_set((size_t)u, groups)};
}
/* The walk's next line (from the block's K start), and the walk one on. */
static inline size_t kv_k_walk_next(kv_k_walk *w) {
    const size_t line = (w->b0 + w->k) * w->g + w->i;
    if (++w->k == w->sz) {
        w->k = 0;
        if (++w->i == w->g) {
            w->i = 0;
            w->b0 += w->sz;
            w->sz = w->b0 < w->groups ? kv_k_walk_set(w->u, w->groups - w->b0) : 1;
        }
    }
    return line;
}

/* Element i of a float KV type's data as a float. */
static inline float kv_float_at(tk_kv_type t, const uint8_t *p, size_t i) {
    return t == TK_KV_F16    ? tk_f16_to_f32(((const tk_f16 *)p)[i])
           : t == TK_KV_BF16 ? tk_bf16_to_f32(((const tk_bf16 *)p)[i])
                             : ((const float *)p)[i];
}

/* Scale floats of one head in one block: block_size per token, head_dim per head. */
static inline int kv_scales_per_head(const kv_geom *g) {
    return g->type != TK_KV_INT8 ? 0 : g->scale == TK_KV_SCALE_TOKEN ? g->block_size : g->head_dim;
}

/* Head kvh's K (block_size x head_dim elements, laid out as above) in block b. */
static inline const uint8_t *kv_geom_k(const kv_geom *g, int32_t b, int kvh) {
    return g->layer + (size_t)b * g->block_stride + (size_t)kvh * g->head_stride;
}
static inline const uint8_t *kv_geom_v(const kv_geom *g, int32_t b, int kvh) {
    return kv_geom_k(g, b, kvh) + g->v_off;
}
/* Head kvh's scales in block b (NULL unless int8). */
static inline const float *kv_geom_ks(const kv_geom *g, int32_t b, int kvh) {
    if (g->type != TK_KV_INT8) return NULL;
    return (const float *)(kv_geom_k(g, b, kvh) + g->ks_off);
}
static inline const float *kv_geom_vs(const kv_geom *g, int32_t b, int kvh) {
    if (g->type != TK_KV_INT8) return NULL;
    return (const float *)(kv_geom_k(g, b, kvh) + g->vs_off);
}

/* One attention kernel: the contract of kv_attention (src/kv/kv.h) with the
 * layer resolved. scratch holds kv_attn_scratch_need floats. own: NULL, or
 * own-block records ([n_q][n_head] of KV_PART_REC(hd) floats, kv_attn_own_fn):
 * query i then reads its context up to the start of its own block from the
 * pool and folds its record last. next, next_kvh: the pool block and kv head
 * the caller reads after this call (next -1: not known, and a kernel may
 * guess the same context's next kv head), a prefetch hint only. */
typedef void (*kv_attn_fn)(const kv_geom *g, const int32_t *bt, int pos0, int n_q, const float *q, int n_head,
                           int h0, int h1, float scale, const float *own, float *out, float *scratch,
                           int32_t next, int next_kvh);
/* Part `part` of a context that ends at `end` (positions [part*KV_ATTN_PART,
 * min((part+1)*KV_ATTN_PART, end))) for heads [h0, h1) of one token's q
 * ([n_head][head_dim]): one record (KV_PART_REC) per head at part_out +
 * (h - h0) * KV_PART_REC(head_dim). */
typedef void (*kv_attn_part_fn)(const kv_geom *g, const int32_t *bt, int end, int part, const float *q,
                                int n_head, int h0, int h1, float scale, float *part_out, float *scratch);
/* The own-block record of one query at position pos: its attention over the
 * slots [pos - pos % block_size, pos] of its own block as the pool holds them
 * now, for heads [h0, h1) of q ([n_head][head_dim]), one record per head at
 * rec + (h - h0) * KV_PART_REC(head_dim). INT8 per-head KV takes it right
 * after writing pos (kv_attention_own), so a query sees its block at the
 * scales its own prefix gave it, whatever was written after it in the same
 * step: how tokens are split into steps then changes no output. next,
 * next_kvh: the pool block and kv head of the caller's next record (next -1:
 * none), whose K and V rows the last kv head's record asks the cache for as
 * it goes (a hint: no effect on the result). */
typedef void (*kv_attn_own_fn)(const kv_geom *g, const int32_t *bt, int pos, const float *q, int n_head,
                               int h0, int h1, float scale, float *rec, float *scratch, int32_t next,
                               int next_kvh);
/* Folds n_parts records per head (part k of head h at parts + k*part_stride +
 * h*KV_PART_REC(hd)) in part order, then (own not NULL) head h's own-block
 * record at own + h*KV_PART_REC(hd), into the normalized output of n_heads
 * heads ([n_heads][hd] at out): the same bits as the whole attention in one
 * call. n_parts may be 0 when own is given. */
void kv_attn_merge(const float *parts, int n_parts, size_t part_stride, int n_heads, int hd, const float *own,
                   float *out);
/* n floats to half, round-to-nearest-even (same bits as tk_f32_to_f16); any n. */
typedef void (*kv_to_f16_fn)(const float *x, tk_f16 *y, int n);
/* The int8 stores (definitions: kv_quant_token_ref, kv_quant_chan_ref); any n.
 * quant_token: one scale s = max|x| / 127 (NaN elements skipped) and
 *   y = x / s rounded to nearest, ties to even, clamped to [-127, 127], NaN
 *   to 0; all zeros when s == 0. Returns s.
 * quant_chan: one scale per element, grown where x does not fit: where
 *   |x[c]| > 127 * s[c], s[c] becomes max(|x[c]| / 127, KV_INT8_MIN_GROWTH *
 *   s[c]) and r[c] old / new s[c] if the old one was > 0; every other r[c] is
 *   1. Then y[c] = s[c] > 0 ? x[c] / s[c] rounded as above : 0. Returns
 *   whether some r[c] is not 1 (values stored at the old scales must be
 *   rescaled by r: kv_requant_chan, kv_requant_cols). */
typedef float (*kv_quant_token_fn)(const float *x, int8_t *y, int n);
typedef bool (*kv_quant_chan_fn)(const float *x, float *s, int8_t *y, float *r, int n);
/* A per-channel rescale of n_rows int8 rows of n channels (definition:
 * kv_requant_chan_ref): y[j][c] = y[j][c] * r[c] rounded as above; a channel
 * whose r[c] is 1 keeps its values (the product is exact), so callers pass 1
 * for the channels they do not rescale. r: finite. */
typedef void (*kv_requant_chan_fn)(int8_t *y, int n_rows, int n, const float *r);
/* The same rescale of int8 K stored by columns (kv_k8_index, head_dim hd, a
 * multiple of 4): every value of channel c in slots [0, KV_KT * n_groups)
 * times r[c], rounded as above (definition: kv_requant_cols_ref). */
typedef void (*kv_requant_cols_fn)(int8_t *k, int n_groups, int hd, const float *r);

#endif
