/* Reference matrix-vector products, norms, activations and RoPE in plain C.
 * Quantized dots sum integer products per block and scale once per block,
 * which is what every SIMD version does too (only the float summation order
 * differs). */
#include <math.h>
#include <string.h>

#include "kernels/kernels_ref.h"

/* ---- row dots ------------------------------------------------------------------ */

float kern_dot_f32_ref(const float *w, const float *x, int64_t n) {
    float s = 0.0f;
    for (int64_t i = 0; i < n; i++) s += w[i] * x[i];
    return s;
}

float kern_dot_f16_ref(const tk_f16 *w, const float *x, int64_t n) {
    float s = 0.0f;
    for (int64_t i = 0; i < n; i++) s += tk_f16_to_f32(w[i]) * x[i];
    return s;
}

float kern_dot_bf16_ref(const tk_bf16 *w, const float *x, int64_t n) {
    float s = 0.0f;
    for (int64_t i = 0; i < n; i++) s += tk_bf16_to_f32(w[i]) * x[i];
    return s;
}

float kern_dot_q8_0_ref(const void *w, const void *xq, int64_t nb) {
    const tk_block_q8_0 *a = w, *b = xq;
    float s = 0.0f;
    for (int64_t i = 0; i < nb; i++) {
        int32_t acc = 0;
        for (int j = 0; j < TK_QK8_0; j++) acc += (int32_t)a[i].qs[j] * b[i].qs[j];
        s += tk_f16_to_f32(a[i].d) * tk_f16_to_f32(b[i].d) * (float)acc;
    }
    return s;
}

float kern_dot_q4_0_ref(const void *w, const void *xq, int64_t nb) {
    const tk_block_q4_0 *a = w;
    const tk_block_q8_0 *b = xq;
    float s = 0.0f;
    for (int64_t i = 0; i < nb; i++) {
        int32_t acc = 0;
        for (int j = 0; j < TK_QK4_0 / 2; j++) {
            acc += ((a[i].qs[j] & 0x0f) - 8) * b[i].qs[j];
            acc += ((a[i].qs[j] >> 4) - 8) * b[i].qs[j + 16];
        }
        s += tk_f16_to_f32(a[i].d) * tk_f16_to_f32(b[i].d) * (float)acc;
    }
    return s;
}

/* sum_j d*sc_j*dot(q_j, x_j) - dmin*m_j*sum(x_j), with sum(x_j) from bsums. */
float kern_dot_q4_k_ref(const void *w, const void *xq, int64_t nb) {
    const tk_block_q4_k *a = w;
    const tk_block_q8_k *b = xq;
    float s = 0.0f;
    for (int64_t i = 0; i < nb; i++) {
        int32_t dots = 0, mins = 0;
        for (int j = 0; j < 8; j++) {
            uint8_t sc, m;
            kern_q4_k_scale_min(j, a[i].scales, &sc, &m);
            const uint8_t *q = a[i].qs + 32 * (j / 2);
            const int8_t *x = b[i].qs + 32 * j;
            int shift = (j & 1) * 4;
            int32_t dot = 0;
            for (int l = 0; l < 32; l++) dot += ((q[l] >> shift) & 0x0f) * x[l];
            dots += sc * dot;
            mins += m * (b[i].bsums[2 * j] + b[i].bsums[2 * j + 1]);
        }
        s += b[i].d * (tk_f16_to_f32(a[i].d) * (float)dots - tk_f16_to_f32(a[i].dmin) * (float)mins);
    }
    return s;
}

float kern_dot_q6_k_ref(const void *w, const void *xq, int64_t nb) {
    const tk_block_q6_k *a = w;
    const tk_block_q8_k *b = xq;
    float s = 0.0f;
    for (int64_t i = 0; i < nb; i++) {
        int32_t acc = 0;
        for (int n = 0; n < 2; n++) {
            const uint8_t *ql = a[i].ql + 64 * n, *qh = a[i].qh + 32 * n;
            const int8_t *sc = a[i].scales + 8 * n, *x = b[i].qs + 128 * n;
            for (int c = 0; c < 4; c++) {
                for (int h = 0; h < 2; h++) {
                    int32_t dot = 0;
                    for (int l = 16 * h; l < 16 * h + 16; l++) {
                        int lo = (ql[l + 32 * (c & 1)] >> (4 * (c >> 1))) & 0x0f;
                        int q = (lo | (((qh[l] >> (2 * c)) & 3) << 4)) - 32;
                        dot += q * x[32 * c + l];
                    }
                    acc += sc[2 * c + h] * dot;
                }
            }
        }
        s += b[i].d * tk_f16_to_f32(a[i].d) * (float)acc;
    }
    return s;
}

/* ---- gemv ------------------------------------------------------------------------ */

void kern_gemv_f32_ref(int64_t k, const void *w, int64_t r0, int64_t r1, const void *xq, size_t xq_stride,
                       int n_tok, float *y, int64_t ldy) {
    for (int64_t r = r0; r < r1; r++)
        for (int t = 0; t < n_tok; t++)
            y[t * ldy + r] = kern_dot_f32_ref((const float *)w + r * k,
                                              (const float *)((const char *)xq + (size_t)t * xq_stride), k);
}

void kern_gemv_f16_ref(int64_t k, const void *w, int64_t r0, int64_t r1, const void *xq, size_t xq_stride,
                       int n_tok, float *y, int64_t ldy) {
    for (int64_t r = r0; r < r1; r++)
        for (int t = 0; t < n_tok; t++)
            y[t * ldy + r] = kern_dot_f16_ref((const tk_f16 *)w + r * k,
                                              (const float *)((const char *)xq + (size_t)t * xq_stride), k);
}

void kern_gemv_bf16_ref(int64_t k, const void *w, int64_t r0, int64_t r1, const void *xq, size_t xq_stride,
                        int n_tok, float *y, int64_t ldy) {
    for (int64_t r = r0; r < r1; r++)
        for (int t = 0; t < n_tok; t++)
            y[t * ldy + r] = kern_dot_bf16_ref((const tk_bf16 *)w + r * k,
                                               (const float *)((const char *)xq + (size_t)t * xq_stride), k);
}

typedef float (*dot_q_fn)(const void *w, const void *xq, int64_t nb);

static void gemv_quant(dot_q_fn dot, size_t block_bytes, int64_t nb, const void *w, int64_t r0, int64_t r1,
                       const void *xq, size_t xq_stride, int n_tok, float *y, int64_t ldy) {
    size_t row_bytes = (size_t)nb * block_bytes;
    for (int64_t r = r0; r < r1; r++)
        for (int t = 0; t < n_tok; t++)
            y[t * ldy + r] =
                dot((const char *)w + (size_t)r * row_bytes, (const char *)xq + (size_t)t * xq_stride, nb);
}

void kern_gemv_q8_0_ref(int64_t k, const void *w, int64_t r0, int64_t r1, const void *xq, size_t xq_stride,
                        int n_tok, float *y, int64_t ldy) {
    gemv_quant(kern_dot_q8_0_ref, sizeof(tk_block_q8_0), k / TK_QK8_0, w, r0, r1, xq, xq_stride, n_tok, y,
               ldy);
}

/* Element e (0..31) of row i in a block of an interleaved layout
 * (kernels_ref.h): Q8_0 by R rows, or Q4_0 by 16 (q4) as q - 8. */
static int xr_weight(int q4, int R, const uint8_t *blk, int i, int e) {
    if (q4) return kern_q4_0_x16_q(blk, i, e) - 8;
    return (int8_t)blk[2 * R + 4 * R * (e / 4) + 4 * i + e % 4];
}

/* Reads an interleaved layout directly: the same integer block dots and
 * float sums as kern_dot_q8_0_ref / kern_dot_q4_0_ref, so equal to the
 * row-order reference bit for bit. */
static void gemv_xr(int q4, int R, int64_t k, const void *w, int64_t r0, int64_t r1, const void *xq,
                    size_t xq_stride, int n_tok, float *y, int64_t ldy) {
    const int64_t nb = k / TK_QK8_0;
    const size_t bb = (size_t)R * (q4 ? sizeof(tk_block_q4_0) : sizeof(tk_block_q8_0));
    for (int64_t r = r0; r < r1; r++) {
        const uint8_t *g = (const uint8_t *)w + (size_t)(r / R) * (size_t)nb * bb;
        const int i = (int)(r % R);
        for (int t = 0; t < n_tok; t++) {
            const tk_block_q8_0 *x = (const tk_block_q8_0 *)((const char *)xq + (size_t)t * xq_stride);
            float s = 0.0f;
            for (int64_t b = 0; b < nb; b++) {
                const uint8_t *blk = g + (size_t)b * bb;
                int32_t acc = 0;
                for (int e = 0; e < 32; e++) acc += xr_weight(q4, R, blk, i, e) * x[b].qs[e];
                tk_f16 d;
                memcpy(&d, blk + 2 * i, sizeof d);
                s += tk_f16_to_f32(d) * tk_f16_to_f32(x[b].d) * (float)acc;
            }
            y[t * ldy + r] = s;
        }
    }
}

void kern_gemv_q8_0_x8_ref(int64_t k, const void *w, int64_t r0, int64_t r1, const void *xq, size_t xq_stride,
                           int n_tok, float *y, int64_t ldy) {
    gemv_xr(0, 8, k, w, r0, r1, xq, xq_stride, n_tok, y, ldy);
}

void kern_gemv_q8_0_x16_ref(int64_t k, const void *w, int64_t r0, int64_t r1, const void *xq,
                            size_t xq_stride, int n_tok, float *y, int64_t ldy) {
    gemv_xr(0, 16, k, w, r0, r1, xq, xq_stride, n_tok, y, ldy);
}

void kern_gemv_q4_0_x16_ref(int64_t k, const void *w, int64_t r0, int64_t r1, const void *xq,
                            size_t xq_stride, int n_tok, float *y, int64_t ldy) {
    gemv_xr(1, 16, k, w, r0, r1, xq, xq_stride, n_tok, y, ldy);
}

/* Reads the per-256-scale layout directly: per super-block the integer dot
 * of the 256 values, then one float step, as its tiles do. */
void kern_gemv_q8_0_x16s_ref(int64_t k, const void *w, int64_t r0, int64_t r1, const void *xq,
                             size_t xq_stride, int n_tok, float *y, int64_t ldy) {
    const int64_t nb = k / TK_QK_K;
    const size_t bb = TK_X16S_BLOCK_BYTES;
    for (int64_t r = r0; r < r1; r++) {
        const uint8_t *g = (const uint8_t *)w + (size_t)(r / 16) * (size_t)nb * bb;
        const int i = (int)(r % 16);
        for (int t = 0; t < n_tok; t++) {
            const tk_block_q8_k *x = (const tk_block_q8_k *)((const char *)xq + (size_t)t * xq_stride);
            float s = 0.0f;
            for (int64_t b = 0; b < nb; b++) {
                const uint8_t *blk = g + (size_t)b * bb;
                int32_t acc = 0;
                for (int e = 0; e < TK_QK_K; e++) acc += kern_q8_0_x16s_q(blk, i, e) * x[b].qs[e];
                float d;
                memcpy(&d, blk + 4 * i, sizeof d);
                s = fmaf((float)acc, d * x[b].d, s);
            }
            y[t * ldy + r] = s;
        }
    }
}

/* Reads the 4-row interleaved BF16 layout directly; the same sums in the same
 * order as kern_dot_bf16_ref over the row. */
void kern_gemv_bf16_x4_ref(int64_t k, const void *w, int64_t r0, int64_t r1, const void *xq, size_t xq_stride,
                           int n_tok, float *y, int64_t ldy) {
    for (int64_t r = r0; r < r1; r++) {
        const uint16_t *g = (const uint16_t *)w + (size_t)(r / 4) * 4 * (size_t)k + (size_t)(r % 4) * 16;
        for (int t = 0; t < n_tok; t++) {
            const float *x = (const float *)((const char *)xq + (size_t)t * xq_stride);
            float s = 0.0f;
            for (int64_t i = 0; i < k; i++)
                s += tk_bf16_to_f32(g[(size_t)(i / 16) * 64 + (size_t)(i % 16)]) * x[i];
            y[t * ldy + r] = s;
        }
    }
}

void kern_gemv_q4_0_ref(int64_t k, const void *w, int64_t r0, int64_t r1, const void *xq, size_t xq_stride,
                        int n_tok, float *y, int64_t ldy) {
    gemv_quant(kern_dot_q4_0_ref, sizeof(tk_block_q4_0), k / TK_QK4_0, w, r0, r1, xq, xq_stride, n_tok, y,
               ldy);
}

void kern_gemv_q4_k_ref(int64_t k, const void *w, int64_t r0, int64_t r1, const void *xq, size_t xq_stride,
                        int n_tok, float *y, int64_t ldy) {
    gemv_quant(kern_dot_q4_k_ref, sizeof(tk_block_q4_k), k / TK_QK_K, w, r0, r1, xq, xq_stride, n_tok, y,
               ldy);
}

void kern_gemv_q6_k_ref(int64_t k, const void *w, int64_t r0, int64_t r1, const void *xq, size_t xq_stride,
                        int n_tok, float *y, int64_t ldy) {
    gemv_quant(kern_dot_q6_k_ref, sizeof(tk_block_q6_k), k / TK_QK_K, w, r0, r1, xq, xq_stride, n_tok, y,
               ldy);
}

/* ---- norms, activations ------------------------------------------------------------ */

void kern_rmsnorm_ref(float *out, const float *x, const float *w, int64_t n, float eps) {
    double ss = 0.0;
    for (int64_t i = 0; i < n; i++) ss += (double)x[i] * x[i];
    float scale = (float)(1.0 / sqrt(ss / (double)(n > 0 ? n : 1) + eps));
    for (int64_t i = 0; i < n; i++) out[i] = x[i] * scale * w[i];
}

void kern_add_ref(float *x, const float *y, int64_t n) {
    for (int64_t i = 0; i < n; i++) x[i] += y[i];
}

void kern_silu_mul_ref(float *out, const float *gate, const float *up, int64_t n) {
    for (int64_t i = 0; i < n; i++) out[i] = gate[i] / (1.0f + expf(-gate[i])) * up[i];
}

/* ---- RoPE ---------------------------------------------------------------------------- */

void kern_rope_angles(float *cs, int head_dim, int pos, const float *freqs) {
    int half = head_dim / 2;
    for (int i = 0; i < half; i++) {
        /* The angle in double: pos * freq reaches 1e5 at long contexts, where a
         * float angle has lost the digits sin/cos need. */
        double theta = (double)pos * (double)freqs[i];
        cs[i] = (float)cos(theta);
        cs[half + i] = (float)sin(theta);
    }
}

/* Pairs [i0, i0 + n) of every head: pair i0 + j rotates by c[j], s[j]. Head by
 * head, so the neox pairs are two contiguous runs, a loop GCC vectorises when
 * its cost model may add a scalar tail (-O2's does not). */
#if defined(__GNUC__) && !defined(__clang__)
#define ROPE_VEC __attribute__((optimize("vect-cost-model=dynamic")))
#else
#define ROPE_VEC
#endif
ROPE_VEC static void rope_pairs(float *x, int n_head, int head_dim, int i0, int n, const float *restrict c,
                                const float *restrict s, int neox) {
    int half = head_dim / 2;
    for (int h = 0; h < n_head; h++) {
        float *v = x + (size_t)h * (size_t)head_dim;
        if (neox) {
            float *restrict lo = v + i0, *restrict hi = v + half + i0;
            for (int j = 0; j < n; j++) {
                float x0 = lo[j], x1 = hi[j];
                lo[j] = x0 * c[j] - x1 * s[j];
                hi[j] = x0 * s[j] + x1 * c[j];
            }
        } else {
            for (int j = 0; j < n; j++) {
                float x0 = v[2 * (i0 + j)], x1 = v[2 * (i0 + j) + 1];
                v[2 * (i0 + j)] = x0 * c[j] - x1 * s[j];
                v[2 * (i0 + j) + 1] = x0 * s[j] + x1 * c[j];
            }
        }
    }
}

void kern_rope_cs(float *x, int n_head, int head_dim, const float *cs, int neox) {
    rope_pairs(x, n_head, head_dim, 0, head_dim / 2, cs, cs + head_dim / 2, neox);
}

void kern_rope(float *x, int n_head, int head_dim, int pos, const float *freqs, int neox) {
    enum { CHUNK = 32 };
    float cs[2 * CHUNK];
    for (int i0 = 0; i0 < head_dim / 2; i0 += CHUNK) {
        int n = head_dim / 2 - i0 < CHUNK ? head_dim / 2 - i0 : CHUNK;
        kern_rope_angles(cs, 2 * n, pos, freqs + i0);
        rope_pairs(x, n_head, head_dim, i0, n, cs, cs + n, neox);
    }
}

/* BF16 as a product operand of vdpbf16ps: a subnormal reads as zero. */
static float bf16_daz(tk_bf16 b) { return (b & 0x7f80u) ? tk_bf16_to_f32(b) : 0.0f; }

/* The pair layouts' arithmetic (kernels_ref.h): one chain per (row, token),
 * odd then even element of each pair, each step an FMA. round (P16R): the
 * activations rounded to BF16 and subnormal weights read as zero, as
 * vdpbf16ps does; the products are then exact, so the FMA is s + a * b. */
static void gemv_bf16_pairs(bool round, int64_t k, const void *w, int64_t r0, int64_t r1, const void *xq,
                            size_t xq_stride, int n_tok, float *y, int64_t ldy) {
    for (int64_t r = r0; r < r1; r++) {
        const uint16_t *g = (const uint16_t *)w + (size_t)(r / 16) * 16 * (size_t)k + (size_t)(r % 16) * 2;
        for (int t = 0; t < n_tok; t++) {
            const float *x = (const float *)((const char *)xq + (size_t)t * xq_stride);
            float s = 0.0f;
            for (int64_t j = 0; j < k / 2; j++) {
                const uint16_t *c = g + (size_t)j * 32;
                float xe = x[2 * j], xo = x[2 * j + 1], we = tk_bf16_to_f32(c[0]), wo = tk_bf16_to_f32(c[1]);
                if (round) {
                    xe = tk_bf16_to_f32(kern_act_bf16_ref(xe));
                    xo = tk_bf16_to_f32(kern_act_bf16_ref(xo));
                    we = bf16_daz(c[0]);
                    wo = bf16_daz(c[1]);
                }
                s = fmaf(wo, xo, s);
                s = fmaf(we, xe, s);
            }
            y[t * ldy + r] = s;
        }
    }
}

void kern_gemv_bf16_p16_ref(int64_t k, const void *w, int64_t r0, int64_t r1, const void *xq,
                            size_t xq_stride, int n_tok, float *y, int64_t ldy) {
    gemv_bf16_pairs(false, k, w, r0, r1, xq, xq_stride, n_tok, y, ldy);
}

void kern_gemv_bf16_p16r_ref(int64_t k, const void *w, int64_t r0, int64_t r1, const void *xq,
                             size_t xq_stride, int n_tok, float *y, int64_t ldy) {
    gemv_bf16_pairs(true, k, w, r0, r1, xq, xq_stride, n_tok, y, ldy);
}

/* Reads the 16-row interleaved Q4_K layout directly: the integer sums and
 * float steps of kern_dot_q4_k_ref, so equal to the row-order reference bit
 * for bit. */
void kern_gemv_q4_k_x16_ref(int64_t k, const void *w, int64_t r0, int64_t r1, const void *xq,
                            size_t xq_stride, int n_tok, float *y, int64_t ldy) {
    const int64_t nb = k / TK_QK_K;
    for (int64_t r = r0; r < r1; r++) {
        const uint8_t *g = (const uint8_t *)w + (size_t)(r / 16) * (size_t)nb * 2304;
        const int i = (int)(r % 16);
        for (int t = 0; t < n_tok; t++) {
            const tk_block_q8_k *x = (const tk_block_q8_k *)((const char *)xq + (size_t)t * xq_stride);
            float s = 0.0f;
            for (int64_t b = 0; b < nb; b++) {
                const uint8_t *blk = g + (size_t)b * 2304;
                int32_t dots = 0, mins = 0;
                for (int j = 0; j < 8; j++) {
                    uint8_t sc, m;
                    kern_q4_k_x16_scale_min(blk, i, j, &sc, &m);
                    int32_t dot = 0;
                    for (int l = 0; l < 32; l++)
                        dot += kern_q4_k_x16_q(blk, i, 32 * j + l) * x[b].qs[32 * j + l];
                    dots += sc * dot;
                    mins += m * (x[b].bsums[2 * j] + x[b].bsums[2 * j + 1]);
                }
                tk_f16 hd, hm;
                memcpy(&hd, blk + 2 * i, sizeof hd);
                memcpy(&hm, blk + 32 + 2 * i, sizeof hm);
                s += x[b].d * (tk_f16_to_f32(hd) * (float)dots - tk_f16_to_f32(hm) * (float)mins);
            }
            y[t * ldy + r] = s;
        }
    }
}

/* Reads the 16-row interleaved Q6_K layout directly: the integer sums and
 * float steps of kern_dot_q6_k_ref, so equal to the row-order reference bit
 * for bit. */
void kern_gemv_q6_k_x16_ref(int64_t k, const void *w, int64_t r0, int64_t r1, const void *xq,
                            size_t xq_stride, int n_tok, float *y, int64_t ldy) {
    const int64_t nb = k / TK_QK_K;
    for (int64_t r = r0; r < r1; r++) {
        const uint8_t *g = (const uint8_t *)w + (size_t)(r / 16) * (size_t)nb * 3360;
        const int i = (int)(r % 16);
        for (int t = 0; t < n_tok; t++) {
            const tk_block_q8_k *x = (const tk_block_q8_k *)((const char *)xq + (size_t)t * xq_stride);
            float s = 0.0f;
            for (int64_t b = 0; b < nb; b++) {
                const uint8_t *blk = g + (size_t)b * 3360;
                int32_t acc = 0;
                for (int sb = 0; sb < 16; sb++) {
                    int32_t dot = 0;
                    for (int l = 16 * sb; l < 16 * sb + 16; l++)
                        dot += (kern_q6_k_x16_q(blk, i, l) - 32) * x[b].qs[l];
                    acc += (int8_t)blk[32 + 16 * sb + i] * dot;
                }
                tk_f16 hd;
                memcpy(&hd, blk + 2 * i, sizeof hd);
                s += x[b].d * tk_f16_to_f32(hd) * (float)acc;
            }
            y[t * ldy + r] = s;
        }
    }
}
