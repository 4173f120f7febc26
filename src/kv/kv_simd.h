/* Internal interface between the KV pool (src/kv/kv.c) and its attention and
 * conversion kernels: the plain-C reference (src/kv/attn_ref.c) and the SIMD
 * versions (src/kernels/x86/kvattn_avx2.c, kvattn_avx512.c, which CMake compiles
 * with their ISA flags). The kernels see the pool only through kv_geom, so the
 * tk_kv struct stays private to kv.c. Not part of the public API. */
#ifndef TK_KV_SIMD_H
#define TK_KV_SIMD_H

#include <stddef.h>
#include <stdint.h>

#include "core/cpu.h"
#include "core/dtype.h"
#include "kv/kv.h"

/* Per-head int8 scales (one per block, kv head and channel) only grow, and
 * each time by at least this factor (see kv.c, write_int8_chan): a new scale
 * is max(|x| / 127, KV_INT8_MIN_GROWTH * old scale), so a slowly growing
 * channel is rescaled at most ~6 times per doubling of its absmax instead of
 * once per token, and the rounding error those rescales add to the block's
 * earlier values stays bounded. */
#define KV_INT8_MIN_GROWTH 1.125f

/* Query heads that share a KV head are processed together, up to this many,
 * so a block's K and V rows are read once for all of them. */
#define KV_ATTN_TILE 4

/* Where one layer's blocks live. A (layer, block) region is block_stride bytes
 * (a multiple of 64, so every region starts 64-byte aligned) laid out as
 *   K       [n_head_kv][block_size][head_dim]  elements of the KV type
 *   V       [n_head_kv][block_size][head_dim]
 *   k_scale [n_head_kv][block_size] floats (int8 per token) or
 *           [n_head_kv][head_dim] (int8 per head: one per channel)
 *   v_scale same as k_scale
 * at byte offsets 0, v_off, ks_off, vs_off (scale sections exist only for int8). */
typedef struct kv_geom {
    uint8_t *layer;      /* [n_blocks][block_stride] bytes of this layer */
    size_t block_stride; /* bytes per (layer, block) region */
    size_t v_off, ks_off, vs_off;
    int n_blocks, n_head_kv, head_dim, block_size;
    tk_kv_type type;
    tk_kv_scale scale;
} kv_geom;

/* Element size of a KV type in bytes (f32 4, f16/bf16 2, int8 1). */
static inline size_t kv_type_size(tk_kv_type t) { return t == TK_KV_F32 ? 4 : t == TK_KV_INT8 ? 1 : 2; }

/* Scale floats of one head in one block: block_size per token, head_dim per head. */
static inline int kv_scales_per_head(const kv_geom *g) {
    return g->type != TK_KV_INT8 ? 0 : g->scale == TK_KV_SCALE_TOKEN ? g->block_size : g->head_dim;
}

/* Head kvh's K rows [block_size][head_dim] (bytes) in block b. */
static inline const uint8_t *kv_geom_k(const kv_geom *g, int32_t b, int kvh) {
    return g->layer + (size_t)b * g->block_stride +
           (size_t)kvh * g->block_size * g->head_dim * kv_type_size(g->type);
}
static inline const uint8_t *kv_geom_v(const kv_geom *g, int32_t b, int kvh) {
    return kv_geom_k(g, b, kvh) + g->v_off;
}
/* Head kvh's scales in block b (NULL unless int8). */
static inline const float *kv_geom_ks(const kv_geom *g, int32_t b, int kvh) {
    if (g->type != TK_KV_INT8) return NULL;
    return (const float *)(g->layer + (size_t)b * g->block_stride + g->ks_off) +
           (size_t)kvh * kv_scales_per_head(g);
}
static inline const float *kv_geom_vs(const kv_geom *g, int32_t b, int kvh) {
    if (g->type != TK_KV_INT8) return NULL;
    return (const float *)(g->layer + (size_t)b * g->block_stride + g->vs_off) +
           (size_t)kvh * kv_scales_per_head(g);
}

/* One attention kernel: the contract of kv_attention with the layer resolved.
 * scratch holds kv_attn_scratch_floats floats. */
typedef void (*kv_attn_fn)(const kv_geom *g, const int32_t *bt, int pos0, int n_q, const float *q, int n_head,
                           int h0, int h1, float scale, float *out, float *scratch);
/* n floats to half, round-to-nearest-even (same bits as tk_f32_to_f16). */
typedef void (*kv_to_f16_fn)(const float *x, tk_f16 *y, int n);

/* Floats of scratch any kernel needs for head_dim (independent of the context:
 * softmax is computed online, one block at a time). */
size_t kv_attn_scratch_need(int head_dim, int block_size);

void kv_attn_ref(const kv_geom *g, const int32_t *bt, int pos0, int n_q, const float *q, int n_head, int h0,
                 int h1, float scale, float *out, float *scratch);
void kv_to_f16_ref(const float *x, tk_f16 *y, int n);

/* SIMD kernels need head_dim % 8 == 0 (AVX2) or % 16 == 0 (AVX-512); kv.c
 * falls back to a lower level otherwise. */
void kv_attn_avx2(const kv_geom *g, const int32_t *bt, int pos0, int n_q, const float *q, int n_head, int h0,
                  int h1, float scale, float *out, float *scratch);
void kv_to_f16_avx2(const float *x, tk_f16 *y, int n);
void kv_attn_avx512(const kv_geom *g, const int32_t *bt, int pos0, int n_q, const float *q, int n_head,
                    int h0, int h1, float scale, float *out, float *scratch);
void kv_to_f16_avx512(const float *x, tk_f16 *y, int n);

/* Like kv_init but with the ISA level given (tests and benches run every level
 * the CPU has). isa must not exceed cpu_best_isa: TK_ERR_UNSUPPORTED otherwise. */
tk_status kv_init_isa(const tk_kv_opts *o, tk_isa isa, tk_kv **out);
/* The level whose attention kernel the pool actually uses (after fallbacks). */
tk_isa kv_isa(const tk_kv *kv);
/* Tests only: run the pool's attention through fn from now on (a kernel built
 * outside the library, e.g. the shared x86 body at another vector width);
 * fn must handle the pool's head_dim. kv_isa is not changed. */
void kv_set_attn(tk_kv *kv, kv_attn_fn fn);

#endif
