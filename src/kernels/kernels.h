/* Compute kernels. Three layers per kernel: *_ref.c is the plain-C definition,
 * x86/<name>_avx2.c and x86/<name>_avx512.c the fast versions with the same signatures,
 * and dispatch.c fills one tk_kernels table from the CPU features once at start.
 * Kernels never create threads: callers split rows by (ith, nth).
 *
 * Activations: every weight type has one activation format, the same on every
 * ISA, so quantizing activations does not depend on the ISA:
 *   F32, F16, BF16 weights  -> f32 activations
 *   Q8_0, Q4_0 weights      -> Q8_0 activations (tk_block_q8_0)
 *   Q4_K, Q6_K weights      -> Q8_K activations (tk_block_q8_k)
 */
#ifndef TK_KERNELS_H
#define TK_KERNELS_H

#include <stddef.h>
#include <stdint.h>

#include "core/cpu.h"
#include "core/dtype.h"
#include "core/tensor.h"

/* y[t * ldy + r] = dot(W row r, x row t) for r in [r0, r1), t in [0, n_tok).
 * w: the weight rows (row stride = row bytes of wtype, k elements per row);
 * xq: n_tok activation rows in the activation format, row stride xq_stride bytes.
 * Writes only those outputs; pure, so threads may run disjoint row ranges.
 * Invariance (tested): on one ISA level, each output is bitwise the same
 * whatever n_tok, the token's place among them, and where [r0, r1) is cut, so
 * results do not depend on the batch or the thread split. */
typedef void (*tk_gemv_fn)(int64_t k, const void *w, int64_t r0, int64_t r1, const void *xq, size_t xq_stride,
                           int n_tok, float *y, int64_t ldy);
/* Quantize one activation row of k floats to the activation format. */
typedef void (*tk_quant_act_fn)(const float *x, void *xq, int64_t k);

typedef struct tk_kernels {
    tk_isa isa;
    tk_gemv_fn gemv[TK_DTYPE_COUNT]; /* NULL for unsupported weight types */
    tk_gemv_fn gemv_q8_0_x8;         /* Q8_0 in TK_LAYOUT_X8 (below) */
    tk_gemv_fn gemv_bf16_x4;         /* BF16 in TK_LAYOUT_X4 (below) */
    tk_quant_act_fn quant_q8_0;      /* k % 32 == 0 */
    tk_quant_act_fn quant_q8_k;      /* k % 256 == 0 */
    /* out[i] = x[i] * w[i] / rms(x) ; out may alias x */
    void (*rmsnorm)(float *out, const float *x, const float *w, int64_t n, float eps);
    /* x += y */
    void (*add)(float *x, const float *y, int64_t n);
    /* out[i] = silu(gate[i]) * up[i] */
    void (*silu_mul)(float *out, const float *gate, const float *up, int64_t n);
    /* Dequantize a row of k elements of type t to floats (for embeddings, tests). */
    void (*dequant_row[TK_DTYPE_COUNT])(const void *row, float *out, int64_t k);
} tk_kernels;

/* Q8_0 interleaved by 8 rows (TK_LAYOUT_X8). For rows % 8 == 0 and
 * nb = k / 32 blocks per row, group g (rows 8g..8g+7) takes nb * 272 bytes,
 * the same as its eight rows in file order, one 272-byte block after another:
 *   16 bytes of scales: row i's f16 d of this block, i = 0..7
 *   256 bytes of quants: 4-byte chunk c (0..7), row i (0..7) holds
 *                        w[8g + i][32b + 4c .. 32b + 4c + 3]
 * One 32-byte load is then the same four columns of eight rows, so the
 * kernel keeps eight row sums in the lanes of one register; and each thread
 * reads one strictly sequential stream (scales inline: a separate scale
 * array measured ~20% slower from DRAM, the prefetchers tracking two
 * streams). The gemv contract is the usual one (any [r0, r1) cut, invariance). */
bool kern_pack_q8_0_x8(const void *rows_in, void *out, int64_t rows, int64_t k);
/* Row `row` of an X8 matrix of row length k, dequantized (embedding lookup). */
void kern_dequant_q8_0_x8_row(const void *w, int64_t k, int64_t row, float *out);

/* BF16 interleaved by 4 rows (TK_LAYOUT_X4), for rows % 4 == 0 and
 * k % 16 == 0: group g (rows 4g..4g+3) is k / 16 chunks of 128 bytes, chunk j
 * holding w[4g + i][16j .. 16j + 15] for i = 0..3 in turn. The kernel's
 * arithmetic is gemv_bf16's (same bits); only its four row streams become
 * one. */
bool kern_pack_bf16_x4(const void *rows_in, void *out, int64_t rows, int64_t k);
void kern_dequant_bf16_x4_row(const void *w, int64_t k, int64_t row, float *out);
/* Row `row` of weight tensor t (any layout) as floats; t->type has a dequant_row. */
void kern_dequant_tensor_row(const tk_kernels *K, const tk_tensor *t, int64_t row, float *out);

/* The table for an ISA level; levels above what the CPU has must not be asked
 * for (cpu_isa_from_env never returns one). Returned table is static, immutable. */
const tk_kernels *kernels_get(tk_isa isa);
/* kernels_get(cpu_isa_from_env(detected CPU)), computed once. */
const tk_kernels *kernels_default(void);

/* Activation format for a weight type, and its row size for k elements
 * (TK_DTYPE_COUNT and 0 for a weight type without a gemv; 0 too when k is not
 * a multiple of the activation block). kern_quant_act does nothing for those. */
tk_dtype kern_act_type(tk_dtype wtype);
size_t kern_act_row_bytes(tk_dtype wtype, int64_t k);
/* Quantize one row for wtype's activation format (f32: memcpy). */
void kern_quant_act(const tk_kernels *K, tk_dtype wtype, const float *x, void *xq, int64_t k);

/* Reference quantizers for weights (synth, repack at load). k % block == 0.
 * Return false for a type that cannot be written. */
bool kern_quantize_row(tk_dtype t, const float *x, void *out, int64_t k);

/* The gemv for a weight tensor's type and layout (NULL if none). */
static inline tk_gemv_fn kern_gemv_of(const tk_kernels *K, const tk_tensor *w) {
    if (w->layout == TK_LAYOUT_X8) return w->type == TK_DTYPE_Q8_0 ? K->gemv_q8_0_x8 : NULL;
    if (w->layout == TK_LAYOUT_X4) return w->type == TK_DTYPE_BF16 ? K->gemv_bf16_x4 : NULL;
    return K->gemv[w->type];
}

/* RoPE, in place on n_head vectors of head_dim at position pos.
 * neox: rotate pairs (i, i + head_dim/2) (HF layout, Qwen); otherwise pairs (2i, 2i+1)
 * (GGUF llama after the converter's permutation). freqs: head_dim/2 inverse frequencies. */
void kern_rope(float *x, int n_head, int head_dim, int pos, const float *freqs, int neox);

#endif
