/* Internal: the plain-C reference kernels (the definitions) and the per-ISA
 * entry points dispatch.c puts in its tables. Not for callers outside
 * src/kernels/ and the kernel tests: they go through tk_kernels, the weight
 * table and kern_attn_for. */
#ifndef TK_KERNELS_REF_H
#define TK_KERNELS_REF_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "kernels/kernels.h"

/* ---- reference (quant_ref.c) ------------------------------------------------ */
void kern_dequant_f32_ref(const void *row, float *out, int64_t k);
void kern_dequant_f16_ref(const void *row, float *out, int64_t k);
void kern_dequant_bf16_ref(const void *row, float *out, int64_t k);
void kern_dequant_q8_0_ref(const void *row, float *out, int64_t k);
void kern_dequant_q4_0_ref(const void *row, float *out, int64_t k);
void kern_dequant_q4_k_ref(const void *row, float *out, int64_t k);
void kern_dequant_q6_k_ref(const void *row, float *out, int64_t k);
void kern_dequant_q8_k_ref(const void *row, float *out, int64_t k);

/* Activation quantizers: Q8_0 (d = absmax/127 stored as f16, q = round(x/d));
 * Q8_K (d = absmax/127 as float, q = round(x/d), bsums = sums of 16 q's). */
void kern_quant_q8_0_ref(const float *x, void *xq, int64_t k);
void kern_quant_q8_k_ref(const float *x, void *xq, int64_t k);

/* Q4_K sub-block j (0..7) scale and min, 6 bits each, from the packed 12 bytes. */
void kern_q4_k_scale_min(int j, const uint8_t *scales, uint8_t *sc, uint8_t *m);

/* ---- reference (gemv_ref.c) ------------------------------------------------- */
/* Row dot products the SIMD files use for tails (n elements, any n). */
float kern_dot_f32_ref(const float *w, const float *x, int64_t n);
float kern_dot_f16_ref(const tk_f16 *w, const float *x, int64_t n);
float kern_dot_bf16_ref(const tk_bf16 *w, const float *x, int64_t n);
/* One quantized row (nb blocks) against one activation row. */
float kern_dot_q8_0_ref(const void *w, const void *xq, int64_t nb);
float kern_dot_q4_0_ref(const void *w, const void *xq, int64_t nb);
float kern_dot_q4_k_ref(const void *w, const void *xq, int64_t nb);
float kern_dot_q6_k_ref(const void *w, const void *xq, int64_t nb);

void kern_gemv_f32_ref(int64_t k, const void *w, int64_t r0, int64_t r1, const void *xq, size_t xq_stride,
                       int n_tok, float *y, int64_t ldy);
void kern_gemv_f16_ref(int64_t k, const void *w, int64_t r0, int64_t r1, const void *xq, size_t xq_stride,
                       int n_tok, float *y, int64_t ldy);
void kern_gemv_bf16_ref(int64_t k, const void *w, int64_t r0, int64_t r1, const void *xq, size_t xq_stride,
                        int n_tok, float *y, int64_t ldy);
void kern_gemv_q8_0_ref(int64_t k, const void *w, int64_t r0, int64_t r1, const void *xq, size_t xq_stride,
                        int n_tok, float *y, int64_t ldy);
void kern_gemv_q8_0_x8_ref(int64_t k, const void *w, int64_t r0, int64_t r1, const void *xq, size_t xq_stride,
                           int n_tok, float *y, int64_t ldy);
void kern_gemv_q8_0_x16_ref(int64_t k, const void *w, int64_t r0, int64_t r1, const void *xq,
                            size_t xq_stride, int n_tok, float *y, int64_t ldy);
void kern_gemv_q4_0_x16_ref(int64_t k, const void *w, int64_t r0, int64_t r1, const void *xq,
                            size_t xq_stride, int n_tok, float *y, int64_t ldy);
void kern_gemv_bf16_x4_ref(int64_t k, const void *w, int64_t r0, int64_t r1, const void *xq, size_t xq_stride,
                           int n_tok, float *y, int64_t ldy);
void kern_gemv_q4_0_ref(int64_t k, const void *w, int64_t r0, int64_t r1, const void *xq, size_t xq_stride,
                        int n_tok, float *y, int64_t ldy);
void kern_gemv_q4_k_ref(int64_t k, const void *w, int64_t r0, int64_t r1, const void *xq, size_t xq_stride,
                        int n_tok, float *y, int64_t ldy);
void kern_gemv_q6_k_ref(int64_t k, const void *w, int64_t r0, int64_t r1, const void *xq, size_t xq_stride,
                        int n_tok, float *y, int64_t ldy);

void kern_rmsnorm_ref(float *out, const float *x, const float *w, int64_t n, float eps);
void kern_add_ref(float *x, const float *y, int64_t n);
void kern_silu_mul_ref(float *out, const float *gate, const float *up, int64_t n);

/* ---- interleaved layouts (quant_ref.c, gemv_ref.c) ------------------------------ */
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

/* Q8_0 interleaved by 16 rows (TK_LAYOUT_X16): X8's scheme for groups of 16
 * rows. For rows % 16 == 0, group g (rows 16g..16g+15) takes nb * 544 bytes,
 * one 544-byte block after another:
 *   32 bytes of scales: row i's f16 d of this block, i = 0..15
 *   512 bytes of quants: 4-byte chunk c (0..7), row i (0..15) at 32 + 64c + 4i
 *                        holds w[16g + i][32b + 4c .. 32b + 4c + 3]
 * One 64-byte load is the same four columns of sixteen rows: a 512-bit VNNI
 * dot against a broadcast activation chunk gives sixteen row sums; the two
 * 32-byte halves of each chunk are X8's chunks of rows 0..7 and 8..15, so
 * the AVX2 kernel is X8's run on each half. */
bool kern_pack_q8_0_x16(const void *rows_in, void *out, int64_t rows, int64_t k);
void kern_dequant_q8_0_x16_row(const void *w, int64_t k, int64_t row, float *out);

/* Q8_0 requantized to one f32 scale per 256 values, interleaved by 16 rows
 * (TK_LAYOUT_X16S), read with Q8_K activations. For rows % 16 == 0 and
 * k % 256 == 0, group g takes nb * 4160 bytes (nb = k / 256; fewer than its
 * rows' nb * 4352 in Q8_0), one 4160-byte super-block after another:
 *   64 bytes: row i's f32 scale d of these 256 values, i = 0..15
 *   4096 bytes at 64: 4-byte chunk c (0..63), row i at 64 + 64c + 4i holds
 *                     q[16g + i][256b + 4c .. 256b + 4c + 3]
 * The pack rounds: each row's 256 values d_b q (eight Q8_0 blocks) become
 * d = max |d_b q| / 127 and q' = round(d_b q / d) in -127..127, so the
 * block with the largest scale keeps its values and the others lose up to
 * half a step of d. X16's tiles read it with 64 chunks per block: one
 * scale step (convert, scale product, FMA) per 256 values instead of eight,
 * the integer chain corrected by -128 sum(x) from the Q8_K bsums. */
#define TK_X16S_BLOCK_BYTES (64 + 16 * TK_QK_K) /* one 16-row group's 256 values */
bool kern_pack_q8_0_x16s(const void *rows_in, void *out, int64_t rows, int64_t k);
void kern_dequant_q8_0_x16s_row(const void *w, int64_t k, int64_t row, float *out);
uint64_t kern_q8_0_x16s_bytes(int64_t rows, int64_t k); /* rows / 16 * k / 256 * 4160 */
/* q[e] (e 0..255, -127..127) of row i in a 4160-byte block. */
int kern_q8_0_x16s_q(const uint8_t *blk, int i, int e);
void kern_gemv_q8_0_x16s_ref(int64_t k, const void *w, int64_t r0, int64_t r1, const void *xq,
                             size_t xq_stride, int n_tok, float *y, int64_t ldy);

/* Q4_0 interleaved by 16 rows (TK_LAYOUT_X16), for rows % 16 == 0: group g
 * takes nb * 288 bytes, one 288-byte block after another:
 *   32 bytes of scales: row i's f16 d of this block, i = 0..15
 *   256 bytes of nibbles: chunk c (0..3), row i (0..15) at 32 + 64c + 4i,
 *                        byte j (0..3) holding q[8c + j] in its low nibble
 *                        and q[8c + 4 + j] in its high one
 * (q[e] is the row's unsigned 0..15 value of block element e, w = d (q - 8)).
 * One 64-byte load masked gives elements 8c..8c+3 of sixteen rows, shifted
 * 8c+4..8c+7: the same 512-bit dot as Q8_0's X16, with no sign fix-up (the
 * nibbles are the unsigned operand) and 8 sum(x) subtracted per block. */
bool kern_pack_q4_0_x16(const void *rows_in, void *out, int64_t rows, int64_t k);
void kern_dequant_q4_0_x16_row(const void *w, int64_t k, int64_t row, float *out);
/* q[e] of row i (0..15) in a 288-byte block. */
int kern_q4_0_x16_q(const uint8_t *blk, int i, int e);

/* Q4_K interleaved by 16 rows (TK_LAYOUT_X16), for rows % 16 == 0 and
 * k % 256 == 0: group g takes nb * 2304 bytes (its sixteen rows' bytes), one
 * 2304-byte super-block after another:
 *   32 bytes: row i's f16 d, i = 0..15
 *   32 bytes: row i's f16 dmin
 *   128 bytes at 64: sub-block j (0..7), row i at 64 + 16j + i: the low four
 *                    bits of its 6-bit scale (low nibble) and min (high one)
 *   64 bytes at 192: row i at 192 + 16 (j % 4) + i: the top two bits of
 *                    sub-block j's scale at bit 2 (j / 4), of its min at
 *                    bit 4 + 2 (j / 4)
 *   2048 bytes at 256: sub-block j's 32 elements at 256 + 256j as a Q4_0 X16
 *                    block's nibbles: chunk c (0..3), row i at + 64c + 4i,
 *                    byte e (0..3) holding q[32j + 8c + e] in its low nibble
 *                    and q[32j + 8c + 4 + e] in its high one
 * (w = d sc_j q - dmin m_j, q 0..15). A 64-byte load masked or shifted is
 * four elements of sixteen rows, the operand of one 512-bit vpdpbusd per
 * token; each sub-block's int32 dots are scaled by its scales (integer
 * multiply), and the mins term sum_j m_j sum(x_j) comes from the Q8_K
 * bsums. The scale bytes unpack with byte-wide shifts and masks for all
 * sixteen rows at once. */
bool kern_pack_q4_k_x16(const void *rows_in, void *out, int64_t rows, int64_t k);
void kern_dequant_q4_k_x16_row(const void *w, int64_t k, int64_t row, float *out);
/* q[e] (0..255) of row i in a 2304-byte super-block, and sub-block j's scale and min. */
int kern_q4_k_x16_q(const uint8_t *blk, int i, int e);
void kern_q4_k_x16_scale_min(const uint8_t *blk, int i, int j, uint8_t *sc, uint8_t *m);
void kern_gemv_q4_k_x16_ref(int64_t k, const void *w, int64_t r0, int64_t r1, const void *xq,
                            size_t xq_stride, int n_tok, float *y, int64_t ldy);

/* Q6_K interleaved by 16 rows (TK_LAYOUT_X16), for rows % 16 == 0 and
 * k % 256 == 0: group g takes nb * 3360 bytes (its sixteen rows' bytes), one
 * 3360-byte super-block after another:
 *   32 bytes: row i's f16 d, i = 0..15
 *   256 bytes at 32: the int8 scale of 16-element sub-block s (0..15) of row i
 *                    at 32 + 16s + i
 *   2048 bytes at 288: the low four bits of the 6-bit values q (w = d sc (q - 32))
 *                    as Q4_K X16's nibbles: 32-element sub-block j at
 *                    288 + 256j, chunk c (0..3), row i at + 64c + 4i, byte e
 *                    (0..3) holding q[32j + 8c + e] low, q[32j + 8c + 4 + e] high
 *   1024 bytes at 2336: their top two bits: sub-block j at 2336 + 128j, chunk
 *                    pair p (0..1) at + 64p, row i at + 4i, byte e: bits
 *                    4 (c % 2) + 2h of chunk c = 2p + c % 2, h = 0 for the
 *                    element in the low nibble, 1 for the high one
 * One 64-byte load of nibbles and one of top bits (for two chunks) give, by
 * byte-wide masks and shifts, four unsigned 6-bit elements of sixteen rows:
 * the vpdpbusd operand; -32 sum(x) per sub-block comes from the Q8_K bsums. */
bool kern_pack_q6_k_x16(const void *rows_in, void *out, int64_t rows, int64_t k);
void kern_dequant_q6_k_x16_row(const void *w, int64_t k, int64_t row, float *out);
/* q[e] (0..255, unsigned 0..63) of row i in a 3360-byte super-block. */
int kern_q6_k_x16_q(const uint8_t *blk, int i, int e);
void kern_gemv_q6_k_x16_ref(int64_t k, const void *w, int64_t r0, int64_t r1, const void *xq,
                            size_t xq_stride, int n_tok, float *y, int64_t ldy);

/* BF16 interleaved by 4 rows (TK_LAYOUT_X4), for rows % 4 == 0 and
 * k % 16 == 0: group g (rows 4g..4g+3) is k / 16 chunks of 128 bytes, chunk j
 * holding w[4g + i][16j .. 16j + 15] for i = 0..3 in turn. The kernel's
 * arithmetic is gemv_bf16's (same bits); only its four row streams become
 * one. */
bool kern_pack_bf16_x4(const void *rows_in, void *out, int64_t rows, int64_t k);
void kern_dequant_bf16_x4_row(const void *w, int64_t k, int64_t row, float *out);

/* BF16 pairs interleaved by 16 rows (TK_LAYOUT_P16 and TK_LAYOUT_P16R, the
 * same bytes), for rows % 16 == 0 and k % 32 == 0: group g (rows
 * 16g..16g+15) is k / 2 chunks of 64 bytes, chunk j holding w[16g + i][2j],
 * w[16g + i][2j + 1] for i = 0..15 in turn, so one 512-bit load is sixteen
 * rows' pair (the operand of vdpbf16ps, or two FMAs after a shift and a
 * mask) against a broadcast activation pair. Each (row, token) is one chain
 * over the pairs: s = fma(w[2j+1], x[2j+1], s), then s = fma(w[2j], x[2j], s).
 * P16 takes the f32 activations. P16R (opt-in, tk_weight_kernels.opt_in)
 * first rounds them to BF16 (kern_act_bf16_ref), which makes each product
 * exact in f32: vdpbf16ps's arithmetic (which also reads subnormal BF16 as
 * zero). */
bool kern_pack_bf16_p16(const void *rows_in, void *out, int64_t rows, int64_t k);
void kern_dequant_bf16_p16_row(const void *w, int64_t k, int64_t row, float *out);
/* f32 to BF16 as vcvtneps2bf16: round to nearest even, a subnormal to a zero
 * of its sign, NaN quiet. */
tk_bf16 kern_act_bf16_ref(float x);
void kern_gemv_bf16_p16_ref(int64_t k, const void *w, int64_t r0, int64_t r1, const void *xq,
                            size_t xq_stride, int n_tok, float *y, int64_t ldy);
void kern_gemv_bf16_p16r_ref(int64_t k, const void *w, int64_t r0, int64_t r1, const void *xq,
                             size_t xq_stride, int n_tok, float *y, int64_t ldy);
/* The P16 gemvs round a pass of tokens' activations onto the stack, at most
 * P16_PAIRS 32-bit entries (64 KB); a k beyond P16_PAIRS runs the reference. */
#define P16_PAIRS 16384

/* ---- attention over the paged KV cache (attn_ref.c) -------------------------------- */
void kv_attn_ref(const kv_geom *g, const int32_t *bt, int pos0, int n_q, const float *q, int n_head, int h0,
                 int h1, float scale, const float *own, float *out, float *scratch, int32_t next,
                 int next_kvh);
void kv_attn_part_ref(const kv_geom *g, const int32_t *bt, int end, int part, const float *q, int n_head,
                      int h0, int h1, float scale, float *part_out, float *scratch);
void kv_attn_own_ref(const kv_geom *g, const int32_t *bt, int pos, const float *q, int n_head, int h0, int h1,
                     float scale, float *rec, float *scratch, int32_t next, int next_kvh);
void kv_to_f16_ref(const float *x, tk_f16 *y, int n);
float kv_quant_token_ref(const float *x, int8_t *y, int n);
bool kv_quant_chan_ref(const float *x, float *s, int8_t *y, float *r, int n);
void kv_requant_chan_ref(int8_t *y, int n_rows, int n, const float *r);
void kv_requant_cols_ref(int8_t *k, int n_groups, int hd, const float *r);
/* Folds one part's (m, l, acc) into the running (M, L, A) (first: starts
 * them), and writes A / L; shared by every level (see kvattn.h). */
void kv_attn_fold(float *M, float *L, float *A, float m, float l, const float *acc, int hd, bool first);
void kv_attn_finish(const float *A, float L, int hd, float *out);

/* ---- AVX2 + FMA + F16C (x86/<name>_avx2.c) ---------------------------------------- */
void kern_gemv_f32_avx2(int64_t k, const void *w, int64_t r0, int64_t r1, const void *xq, size_t xq_stride,
                        int n_tok, float *y, int64_t ldy);
void kern_gemv_f16_avx2(int64_t k, const void *w, int64_t r0, int64_t r1, const void *xq, size_t xq_stride,
                        int n_tok, float *y, int64_t ldy);
void kern_gemv_bf16_avx2(int64_t k, const void *w, int64_t r0, int64_t r1, const void *xq, size_t xq_stride,
                         int n_tok, float *y, int64_t ldy);
void kern_gemv_q8_0_avx2(int64_t k, const void *w, int64_t r0, int64_t r1, const void *xq, size_t xq_stride,
                         int n_tok, float *y, int64_t ldy);
void kern_gemv_q8_0_x8_avx2(int64_t k, const void *w, int64_t r0, int64_t r1, const void *xq,
                            size_t xq_stride, int n_tok, float *y, int64_t ldy);
void kern_gemv_q8_0_x16_avx2(int64_t k, const void *w, int64_t r0, int64_t r1, const void *xq,
                             size_t xq_stride, int n_tok, float *y, int64_t ldy);
void kern_gemv_q8_0_x16s_avx2(int64_t k, const void *w, int64_t r0, int64_t r1, const void *xq,
                              size_t xq_stride, int n_tok, float *y, int64_t ldy);
void kern_gemv_q4_0_x16_avx2(int64_t k, const void *w, int64_t r0, int64_t r1, const void *xq,
                             size_t xq_stride, int n_tok, float *y, int64_t ldy);
void kern_gemv_bf16_x4_avx2(int64_t k, const void *w, int64_t r0, int64_t r1, const void *xq,
                            size_t xq_stride, int n_tok, float *y, int64_t ldy);
void kern_gemv_q4_0_avx2(int64_t k, const void *w, int64_t r0, int64_t r1, const void *xq, size_t xq_stride,
                         int n_tok, float *y, int64_t ldy);
void kern_gemv_q4_k_x16_avx2(int64_t k, const void *w, int64_t r0, int64_t r1, const void *xq,
                             size_t xq_stride, int n_tok, float *y, int64_t ldy);
void kern_gemv_q4_k_avx2(int64_t k, const void *w, int64_t r0, int64_t r1, const void *xq, size_t xq_stride,
                         int n_tok, float *y, int64_t ldy);
void kern_gemv_q6_k_x16_avx2(int64_t k, const void *w, int64_t r0, int64_t r1, const void *xq,
                             size_t xq_stride, int n_tok, float *y, int64_t ldy);
void kern_gemv_q6_k_avx2(int64_t k, const void *w, int64_t r0, int64_t r1, const void *xq, size_t xq_stride,
                         int n_tok, float *y, int64_t ldy);
void kern_gemv_bf16_p16_avx2(int64_t k, const void *w, int64_t r0, int64_t r1, const void *xq,
                             size_t xq_stride, int n_tok, float *y, int64_t ldy);
void kern_gemv_bf16_p16r_avx2(int64_t k, const void *w, int64_t r0, int64_t r1, const void *xq,
                              size_t xq_stride, int n_tok, float *y, int64_t ldy);
void kern_quant_q8_0_avx2(const float *x, void *xq, int64_t k);
void kern_quant_q8_k_avx2(const float *x, void *xq, int64_t k);
void kern_rmsnorm_avx2(float *out, const float *x, const float *w, int64_t n, float eps);
void kern_add_avx2(float *x, const float *y, int64_t n);
void kern_silu_mul_avx2(float *out, const float *gate, const float *up, int64_t n);
void kern_dequant_f16_avx2(const void *row, float *out, int64_t k);
void kern_dequant_bf16_avx2(const void *row, float *out, int64_t k);
/* x86/kvattn_avx2.c: head_dim % 8 == 0 */
void kv_attn_avx2(const kv_geom *g, const int32_t *bt, int pos0, int n_q, const float *q, int n_head, int h0,
                  int h1, float scale, const float *own, float *out, float *scratch, int32_t next,
                  int next_kvh);
void kv_attn_part_avx2(const kv_geom *g, const int32_t *bt, int end, int part, const float *q, int n_head,
                       int h0, int h1, float scale, float *part_out, float *scratch);
void kv_attn_own_avx2(const kv_geom *g, const int32_t *bt, int pos, const float *q, int n_head, int h0,
                      int h1, float scale, float *rec, float *scratch, int32_t next, int next_kvh);
void kv_to_f16_avx2(const float *x, tk_f16 *y, int n);
float kv_quant_token_avx2(const float *x, int8_t *y, int n);
bool kv_quant_chan_avx2(const float *x, float *s, int8_t *y, float *r, int n);
void kv_requant_chan_avx2(int8_t *y, int n_rows, int n, const float *r);
void kv_requant_cols_avx2(int8_t *k, int n_groups, int hd, const float *r);

/* ---- AVX2 + AVX-VNNI (x86/<name>_avxvnni.c): the AVX2 bodies with VEX vpdpbusd
 * (the gemvs and attention); the level's other kernels are the AVX2 ones ---- */
void kern_gemv_f32_avxvnni(int64_t k, const void *w, int64_t r0, int64_t r1, const void *xq, size_t xq_stride,
                           int n_tok, float *y, int64_t ldy);
void kern_gemv_f16_avxvnni(int64_t k, const void *w, int64_t r0, int64_t r1, const void *xq, size_t xq_stride,
                           int n_tok, float *y, int64_t ldy);
void kern_gemv_bf16_avxvnni(int64_t k, const void *w, int64_t r0, int64_t r1, const void *xq,
                            size_t xq_stride, int n_tok, float *y, int64_t ldy);
void kern_gemv_q8_0_avxvnni(int64_t k, const void *w, int64_t r0, int64_t r1, const void *xq,
                            size_t xq_stride, int n_tok, float *y, int64_t ldy);
void kern_gemv_q8_0_x8_avxvnni(int64_t k, const void *w, int64_t r0, int64_t r1, const void *xq,
                               size_t xq_stride, int n_tok, float *y, int64_t ldy);
void kern_gemv_q8_0_x16_avxvnni(int64_t k, const void *w, int64_t r0, int64_t r1, const void *xq,
                                size_t xq_stride, int n_tok, float *y, int64_t ldy);
void kern_gemv_q8_0_x16s_avxvnni(int64_t k, const void *w, int64_t r0, int64_t r1, const void *xq,
                                 size_t xq_stride, int n_tok, float *y, int64_t ldy);
void kern_gemv_q4_0_x16_avxvnni(int64_t k, const void *w, int64_t r0, int64_t r1, const void *xq,
                                size_t xq_stride, int n_tok, float *y, int64_t ldy);
void kern_gemv_bf16_x4_avxvnni(int64_t k, const void *w, int64_t r0, int64_t r1, const void *xq,
                               size_t xq_stride, int n_tok, float *y, int64_t ldy);
void kern_gemv_q4_0_avxvnni(int64_t k, const void *w, int64_t r0, int64_t r1, const void *xq,
                            size_t xq_stride, int n_tok, float *y, int64_t ldy);
void kern_gemv_q4_k_x16_avxvnni(int64_t k, const void *w, int64_t r0, int64_t r1, const void *xq,
                                size_t xq_stride, int n_tok, float *y, int64_t ldy);
void kern_gemv_q4_k_avxvnni(int64_t k, const void *w, int64_t r0, int64_t r1, const void *xq,
                            size_t xq_stride, int n_tok, float *y, int64_t ldy);
void kern_gemv_q6_k_x16_avxvnni(int64_t k, const void *w, int64_t r0, int64_t r1, const void *xq,
                                size_t xq_stride, int n_tok, float *y, int64_t ldy);
void kern_gemv_q6_k_avxvnni(int64_t k, const void *w, int64_t r0, int64_t r1, const void *xq,
                            size_t xq_stride, int n_tok, float *y, int64_t ldy);
/* x86/kvattn_avxvnni.c: the AVX2 attention with int8 K against int8 queries
 * (kv_geom.q8) by vpdpbusd; head_dim % 8 == 0 */
void kv_attn_avxvnni(const kv_geom *g, const int32_t *bt, int pos0, int n_q, const float *q, int n_head,
                     int h0, int h1, float scale, const float *own, float *out, float *scratch, int32_t next,
                     int next_kvh);
void kv_attn_part_avxvnni(const kv_geom *g, const int32_t *bt, int end, int part, const float *q, int n_head,
                          int h0, int h1, float scale, float *part_out, float *scratch);
void kv_attn_own_avxvnni(const kv_geom *g, const int32_t *bt, int pos, const float *q, int n_head, int h0,
                         int h1, float scale, float *rec, float *scratch, int32_t next, int next_kvh);

void kern_gemv_bf16_p16_avxvnni(int64_t k, const void *w, int64_t r0, int64_t r1, const void *xq,
                                size_t xq_stride, int n_tok, float *y, int64_t ldy);
void kern_gemv_bf16_p16r_avxvnni(int64_t k, const void *w, int64_t r0, int64_t r1, const void *xq,
                                 size_t xq_stride, int n_tok, float *y, int64_t ldy);

/* ---- AVX-512 F/BW/VL/VNNI (x86/<name>_avx512.c) ------------------------------------ */
void kern_gemv_f32_avx512(int64_t k, const void *w, int64_t r0, int64_t r1, const void *xq, size_t xq_stride,
                          int n_tok, float *y, int64_t ldy);
void kern_gemv_f16_avx512(int64_t k, const void *w, int64_t r0, int64_t r1, const void *xq, size_t xq_stride,
                          int n_tok, float *y, int64_t ldy);
void kern_gemv_bf16_avx512(int64_t k, const void *w, int64_t r0, int64_t r1, const void *xq, size_t xq_stride,
                           int n_tok, float *y, int64_t ldy);
void kern_gemv_q8_0_avx512(int64_t k, const void *w, int64_t r0, int64_t r1, const void *xq, size_t xq_stride,
                           int n_tok, float *y, int64_t ldy);
void kern_gemv_q8_0_x8_avx512(int64_t k, const void *w, int64_t r0, int64_t r1, const void *xq,
                              size_t xq_stride, int n_tok, float *y, int64_t ldy);
void kern_gemv_q8_0_x16_avx512(int64_t k, const void *w, int64_t r0, int64_t r1, const void *xq,
                               size_t xq_stride, int n_tok, float *y, int64_t ldy);
void kern_gemv_q8_0_x16s_avx512(int64_t k, const void *w, int64_t r0, int64_t r1, const void *xq,
                                size_t xq_stride, int n_tok, float *y, int64_t ldy);
void kern_gemv_q4_0_x16_avx512(int64_t k, const void *w, int64_t r0, int64_t r1, const void *xq,
                               size_t xq_stride, int n_tok, float *y, int64_t ldy);
void kern_gemv_bf16_x4_avx512(int64_t k, const void *w, int64_t r0, int64_t r1, const void *xq,
                              size_t xq_stride, int n_tok, float *y, int64_t ldy);
void kern_gemv_q4_0_avx512(int64_t k, const void *w, int64_t r0, int64_t r1, const void *xq, size_t xq_stride,
                           int n_tok, float *y, int64_t ldy);
void kern_gemv_q4_k_x16_avx512(int64_t k, const void *w, int64_t r0, int64_t r1, const void *xq,
                               size_t xq_stride, int n_tok, float *y, int64_t ldy);
void kern_gemv_q4_k_avx512(int64_t k, const void *w, int64_t r0, int64_t r1, const void *xq, size_t xq_stride,
                           int n_tok, float *y, int64_t ldy);
void kern_gemv_q6_k_x16_avx512(int64_t k, const void *w, int64_t r0, int64_t r1, const void *xq,
                               size_t xq_stride, int n_tok, float *y, int64_t ldy);
void kern_gemv_q6_k_avx512(int64_t k, const void *w, int64_t r0, int64_t r1, const void *xq, size_t xq_stride,
                           int n_tok, float *y, int64_t ldy);
void kern_gemv_bf16_p16_avx512(int64_t k, const void *w, int64_t r0, int64_t r1, const void *xq,
                               size_t xq_stride, int n_tok, float *y, int64_t ldy);
void kern_gemv_bf16_p16r_avx512(int64_t k, const void *w, int64_t r0, int64_t r1, const void *xq,
                                size_t xq_stride, int n_tok, float *y, int64_t ldy);
/* x86/bf16dot_avx512.c: P16R by vdpbf16ps, for CPUs with AVX512-BF16 (the
 * same bits). Tested, not dispatched: on the Sapphire Rapids class machine the
 * instruction runs at ~0.85x the two FMAs it replaces (docs/kernels.md). */
void kern_gemv_bf16_p16r_avx512bf16(int64_t k, const void *w, int64_t r0, int64_t r1, const void *xq,
                                    size_t xq_stride, int n_tok, float *y, int64_t ldy);
void kern_quant_q8_0_avx512(const float *x, void *xq, int64_t k);
void kern_quant_q8_k_avx512(const float *x, void *xq, int64_t k);
void kern_rmsnorm_avx512(float *out, const float *x, const float *w, int64_t n, float eps);
void kern_add_avx512(float *x, const float *y, int64_t n);
void kern_silu_mul_avx512(float *out, const float *gate, const float *up, int64_t n);
void kern_dequant_f16_avx512(const void *row, float *out, int64_t k);
void kern_dequant_bf16_avx512(const void *row, float *out, int64_t k);
/* x86/kvattn_avx512.c: head_dim % 16 == 0 */
void kv_attn_avx512(const kv_geom *g, const int32_t *bt, int pos0, int n_q, const float *q, int n_head,
                    int h0, int h1, float scale, const float *own, float *out, float *scratch, int32_t next,
                    int next_kvh);
void kv_attn_part_avx512(const kv_geom *g, const int32_t *bt, int end, int part, const float *q, int n_head,
                         int h0, int h1, float scale, float *part_out, float *scratch);
void kv_attn_own_avx512(const kv_geom *g, const int32_t *bt, int pos, const float *q, int n_head, int h0,
                        int h1, float scale, float *rec, float *scratch, int32_t next, int next_kvh);
void kv_to_f16_avx512(const float *x, tk_f16 *y, int n);
float kv_quant_token_avx512(const float *x, int8_t *y, int n);
bool kv_quant_chan_avx512(const float *x, float *s, int8_t *y, float *r, int n);
void kv_requant_chan_avx512(int8_t *y, int n_rows, int n, const float *r);
void kv_requant_cols_avx512(int8_t *k, int n_groups, int hd, const float *r);

#endif
