/* Compute kernels. Three layers per kernel: *_ref.c is the plain-C definition,
 * x86/<name>_avx2.c and x86/<name>_avx512.c the fast versions with the same signatures,
 * and dispatch.c is the one place that picks them: the per-ISA tk_kernels
 * tables, the weight table keyed by (weight type, layout), and the attention
 * kernel for a head_dim, chosen from the CPU features once at start
 * (docs/kernels.md). Kernels never create threads: callers split rows by
 * (ith, nth).
 *
 * Activations: every (weight type, layout) has one activation format, the
 * same on every ISA, so quantizing activations does not depend on the ISA:
 *   F32, F16, BF16 weights  -> f32 activations
 *   Q8_0, Q4_0 weights      -> Q8_0 activations (tk_block_q8_0)
 *   Q4_K, Q6_K weights      -> Q8_K activations (tk_block_q8_k)
 *   Q8_0 in layout X16S     -> Q8_K activations (its scale per 256 values)
 */
#ifndef TK_KERNELS_H
#define TK_KERNELS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "core/cpu.h"
#include "core/dtype.h"
#include "core/tensor.h"
#include "kernels/kvattn.h"

/* y[t * ldy + r] = dot(W row r, x row t) for r in [r0, r1), t in [0, n_tok).
 * w: the weight matrix in the layout of the gemv's row in the weight table
 *    (file order: row stride = row bytes of the type, k elements per row);
 * xq: n_tok activation rows in the activation format, row stride xq_stride bytes.
 * Writes only those outputs; pure, so threads may run disjoint row ranges.
 * Invariance (tested): on one ISA level, each output is bitwise the same
 * whatever n_tok, the token's place among them, and where [r0, r1) is cut, so
 * results do not depend on the batch or the thread split. */
typedef void (*tk_gemv_fn)(int64_t k, const void *w, int64_t r0, int64_t r1, const void *xq, size_t xq_stride,
                           int n_tok, float *y, int64_t ldy);
/* Quantize one activation row of k floats to the activation format. */
typedef void (*tk_quant_act_fn)(const float *x, void *xq, int64_t k);

/* Kernels that do not depend on the weight layout, one immutable table per
 * ISA level (kernels_get). The matmuls are in the weight table below. */
typedef struct tk_kernels {
    tk_isa isa;
    tk_quant_act_fn quant_q8_0; /* k % 32 == 0 */
    tk_quant_act_fn quant_q8_k; /* k % 256 == 0 */
    /* out[i] = x[i] * w[i] / rms(x) ; out may alias x */
    void (*rmsnorm)(float *out, const float *x, const float *w, int64_t n, float eps);
    /* x += y */
    void (*add)(float *x, const float *y, int64_t n);
    /* out[i] = silu(gate[i]) * up[i] */
    void (*silu_mul)(float *out, const float *gate, const float *up, int64_t n);
    /* Dequantize a row of k elements of type t, in file order, to floats. */
    void (*dequant_row[TK_DTYPE_COUNT])(const void *row, float *out, int64_t k);
    /* Attention over the paged KV cache (kvattn.h) for head_dim % attn_lanes
     * == 0; kern_attn_for applies that rule. kv_to_f16 takes any n. */
    kv_attn_fn attn;
    kv_attn_part_fn attn_part; /* one part of a decode token's context, same rule */
    kv_attn_own_fn attn_own;   /* a query's own-block record, same rule */
    int attn_lanes;
    bool attn_q8; /* int8 KV: attn takes kv_geom.q8 (int8 queries against int8 K) */
    kv_to_f16_fn kv_to_f16;
    kv_quant_token_fn kv_quant_token; /* the int8 KV stores; any n */
    kv_quant_chan_fn kv_quant_chan;
    kv_requant_chan_fn kv_requant_chan;
    kv_requant_cols_fn kv_requant_cols;
} tk_kernels;

/* The table for an ISA level; levels above what the CPU has must not be asked
 * for (cpu_isa_from_env never returns one). Returned table is static, immutable. */
const tk_kernels *kernels_get(tk_isa isa);
/* kernels_get(cpu_isa_from_env(detected CPU)), computed once. */
const tk_kernels *kernels_default(void);
/* The highest level this build dispatches to (AVX-512 on x86-64, scalar
 * elsewhere); tests walk every level up to it. */
tk_isa kernels_top_isa(void);

/* ---- the weight table: one row per (weight type, layout) ----------------------
 * A row is everything a matmul weight in that layout needs: how to make it
 * from rows in file order, how to read one row back, the activation format,
 * and its gemv at every ISA level. A new layout (or a new weight type) is a
 * new row in dispatch.c; callers find rows by (type, layout) and never name a
 * layout. The layouts themselves are described in kernels_ref.h and
 * docs/kernels.md. */
typedef struct tk_weight_kernels {
    tk_dtype act; /* activation format: F32, Q8_0 or Q8_K */
    /* Rows in file order -> this layout, rows x k elements into out (the same
     * bytes as the input); false, writing nothing, when the shape does not fit.
     * NULL for TK_LAYOUT_ROWS. */
    bool (*pack)(const void *rows_in, void *out, int64_t rows, int64_t k);
    /* Row `row` of a matrix w of row length k in this layout, as floats; NULL
     * for TK_LAYOUT_ROWS (tk_kernels.dequant_row at row * row bytes). */
    void (*dequant_row)(const void *w, int64_t k, int64_t row, float *out);
    tk_gemv_fn gemv[TK_ISA_COUNT]; /* by tk_isa; every level of the build is filled */
    /* The packed matrix's bytes where fewer than the input's (X16S); NULL:
     * the same. */
    uint64_t (*packed_bytes)(int64_t rows, int64_t k);
    /* The layout changes the arithmetic, so it is the model's choice: P16R's
     * gemv rounds its f32 activations to BF16, X16S's pack rounds the
     * weights to a scale per 256 values and its activations are Q8_K.
     * kern_pack never picks it, only kern_pack_opt_in. */
    bool opt_in;
} tk_weight_kernels;

/* The row for (t, layout); NULL when no matmul reads t in that layout. */
const tk_weight_kernels *kern_weight(tk_dtype t, tk_layout layout);
/* Its gemv at K's level (NULL if there is no row). */
tk_gemv_fn kern_gemv(const tk_kernels *K, tk_dtype t, tk_layout layout);

/* The peak a weight kernel's multiply-adds are judged by (the profile's
 * floors): fp32 FMAs (f32 activations), int8 dots (quantized activations),
 * or BF16 dots (P16R's gemv as vdpbf16ps, kern_bf16_dot_hw). */
typedef enum tk_peak { TK_PEAK_F32 = 0, TK_PEAK_INT8 = 1, TK_PEAK_BF16 = 2 } tk_peak;
#define TK_PEAK_COUNT 3
tk_peak kern_peak(const tk_kernels *K, tk_dtype t, tk_layout layout);
/* "fp32", "int8", "bf16" */
const char *kern_peak_name(tk_peak p);

/* Whether P16R's gemv at the avx512 level runs as vdpbf16ps (the same bits
 * as its FMA form): on a CPU with AVX512-BF16 where the first call, which
 * times both, found the instruction faster. *ratio (may be NULL) gets the
 * FMA form's time over the instruction's, 0 where not measured. */
bool kern_bf16_dot_hw(double *ratio);

/* The gemv for a weight tensor's type and layout (NULL if none). */
static inline tk_gemv_fn kern_gemv_of(const tk_kernels *K, const tk_tensor *w) {
    return kern_gemv(K, w->type, w->layout);
}

/* Packs rows x k elements of type t from file order into the first layout
 * after TK_LAYOUT_ROWS whose row takes the shape, and returns it; returns
 * TK_LAYOUT_ROWS, writing nothing, when no layout takes it (the caller copies
 * the rows as they are). out holds as many bytes as the input; the layout
 * uses them all unless its row has packed_bytes. */
tk_layout kern_pack(tk_dtype t, const void *rows_in, void *out, int64_t rows, int64_t k);
/* As kern_pack, but an opt_in layout (BF16's vdpbf16ps one, Q8_0's X16S)
 * comes first when it takes the shape. */
tk_layout kern_pack_opt_in(tk_dtype t, const void *rows_in, void *out, int64_t rows, int64_t k);
/* Row `row` of weight tensor t (any layout) as floats; t->type has a dequant_row. */
void kern_dequant_tensor_row(const tk_kernels *K, const tk_tensor *t, int64_t row, float *out);

/* The attention kernel for head_dim at level isa: isa's own when head_dim is
 * a multiple of its attn_lanes, else the next level down that takes it
 * (scalar takes any head_dim, so a SIMD kernel carries no tail code). The
 * level whose kernel it is goes to *level (may be NULL): avx2 for avxvnni,
 * which runs AVX2's attention. */
kv_attn_fn kern_attn_for(tk_isa isa, int head_dim, tk_isa *level);

/* Activation format for weights of type wtype in layout, and its row size
 * for k elements (TK_DTYPE_COUNT and 0 where the weight table has no row; 0
 * too when k is not a multiple of the activation block). kern_quant_act does
 * nothing for those. */
tk_dtype kern_act_type(tk_dtype wtype, tk_layout layout);
size_t kern_act_row_bytes(tk_dtype wtype, tk_layout layout, int64_t k);
/* Quantize one row for that activation format (f32: memcpy). */
void kern_quant_act(const tk_kernels *K, tk_dtype wtype, tk_layout layout, const float *x, void *xq,
                    int64_t k);

/* Reference quantizers for weights (synth, repack at load). k % block == 0.
 * Return false for a type that cannot be written. */
bool kern_quantize_row(tk_dtype t, const float *x, void *out, int64_t k);
/* As kern_quantize_row, with a per-block clip-range search (quantize.c) that
 * minimises sum_j imp[j] (x[j] - dequant[j])^2; imp (k values, >= 0) is the
 * mean square activation of each input channel. imp NULL or a float type:
 * kern_quantize_row. */
bool kern_quantize_row_imp(tk_dtype t, const float *x, const float *imp, void *out, int64_t k);
/* sum_j imp[j] (x[j] - q[j])^2 in double (imp NULL: weight 1). */
double kern_weighted_error(const float *x, const float *q, const float *imp, int64_t k);

/* RoPE, in place on n_head vectors of head_dim at position pos.
 * neox: rotate pairs (i, i + head_dim/2) (HF layout, Qwen); otherwise pairs (2i, 2i+1)
 * (GGUF llama after the converter's permutation). freqs: head_dim/2 inverse frequencies. */
void kern_rope(float *x, int n_head, int head_dim, int pos, const float *freqs, int neox);
/* The cos and sin of the head_dim/2 angles pos * freqs[i], in cs[i] and cs[head_dim/2 + i]:
 * what kern_rope computes, so a step can compute them once per token for all
 * its layers; kern_rope_cs then gives kern_rope's bits from them. */
void kern_rope_angles(float *cs, int head_dim, int pos, const float *freqs);
void kern_rope_cs(float *x, int n_head, int head_dim, const float *cs, int neox);

#endif
