/* Reference block formats: dequantization, activation quantizers and weight
 * quantizers, exactly as GGML lays the blocks out (src/core/dtype.h). These
 * are the definitions the SIMD files and the tests are measured against. */
#include <math.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/kernels_ref.h"

/* Round half to even, as the SIMD quantizers' cvtps/round instructions do, so
 * every ISA produces the same activation bytes. */
static inline int round_even(float v) { return (int)nearbyintf(v); }

static inline int clampi(int v, int lo, int hi) { return v < lo ? lo : v > hi ? hi : v; }

/* ---- dequantization ----------------------------------------------------------- */

void kern_dequant_f32_ref(const void *row, float *out, int64_t k) {
    memcpy(out, row, (size_t)k * sizeof(float));
}

void kern_dequant_f16_ref(const void *row, float *out, int64_t k) {
    const tk_f16 *h = row;
    for (int64_t i = 0; i < k; i++) out[i] = tk_f16_to_f32(h[i]);
}

void kern_dequant_bf16_ref(const void *row, float *out, int64_t k) {
    const tk_bf16 *b = row;
    for (int64_t i = 0; i < k; i++) out[i] = tk_bf16_to_f32(b[i]);
}

void kern_dequant_q8_0_ref(const void *row, float *out, int64_t k) {
    const tk_block_q8_0 *b = row;
    for (int64_t i = 0; i < k / TK_QK8_0; i++) {
        float d = tk_f16_to_f32(b[i].d);
        for (int j = 0; j < TK_QK8_0; j++) out[i * TK_QK8_0 + j] = d * (float)b[i].qs[j];
    }
}

/* qs[j] holds element j in its low nibble and element j + 16 in its high one. */
void kern_dequant_q4_0_ref(const void *row, float *out, int64_t k) {
    const tk_block_q4_0 *b = row;
    for (int64_t i = 0; i < k / TK_QK4_0; i++) {
        float d = tk_f16_to_f32(b[i].d);
        float *o = out + i * TK_QK4_0;
        for (int j = 0; j < TK_QK4_0 / 2; j++) {
            o[j] = d * (float)((b[i].qs[j] & 0x0f) - 8);
            o[j + 16] = d * (float)((b[i].qs[j] >> 4) - 8);
        }
    }
}

/* GGML's get_scale_min_k4: sub-blocks 0..3 keep scale and min in the low six
 * bits of bytes j and j+4; sub-blocks 4..7 split theirs into a nibble of bytes
 * 8..11 plus the top two bits of bytes 0..7. */
void kern_q4_k_scale_min(int j, const uint8_t *q, uint8_t *sc, uint8_t *m) {
    if (j < 4) {
        *sc = q[j] & 63;
        *m = q[j + 4] & 63;
    } else {
        *sc = (uint8_t)((q[j + 4] & 0x0f) | ((q[j - 4] >> 6) << 4));
        *m = (uint8_t)((q[j + 4] >> 4) | ((q[j] >> 6) << 4));
    }
}

/* Each 64 elements share 32 bytes of qs: the low nibbles are sub-block 2i, the
 * high nibbles sub-block 2i+1; x = d * sc * q - dmin * m. */
void kern_dequant_q4_k_ref(const void *row, float *out, int64_t k) {
    const tk_block_q4_k *b = row;
    for (int64_t i = 0; i < k / TK_QK_K; i++) {
        float d = tk_f16_to_f32(b[i].d), dmin = tk_f16_to_f32(b[i].dmin);
        const uint8_t *q = b[i].qs;
        float *o = out + i * TK_QK_K;
        for (int j = 0; j < 4; j++) {
            uint8_t sc0, m0, sc1, m1;
            kern_q4_k_scale_min(2 * j, b[i].scales, &sc0, &m0);
            kern_q4_k_scale_min(2 * j + 1, b[i].scales, &sc1, &m1);
            float d0 = d * sc0, d1 = d * sc1, mm0 = dmin * m0, mm1 = dmin * m1;
            for (int l = 0; l < 32; l++) {
                o[64 * j + l] = d0 * (float)(q[32 * j + l] & 0x0f) - mm0;
                o[64 * j + 32 + l] = d1 * (float)(q[32 * j + l] >> 4) - mm1;
            }
        }
    }
}

/* Each 128 elements use 64 bytes of ql and 32 of qh: element 32c + l (c = 0..3)
 * takes the low (c even) or high (c odd) nibble of ql[l + 32 (c & 1)] and bits
 * 2c..2c+1 of qh[l]; q - 32 is scaled by scales[element / 16]. */
void kern_dequant_q6_k_ref(const void *row, float *out, int64_t k) {
    const tk_block_q6_k *b = row;
    for (int64_t i = 0; i < k / TK_QK_K; i++) {
        float d = tk_f16_to_f32(b[i].d);
        const uint8_t *ql = b[i].ql, *qh = b[i].qh;
        const int8_t *sc = b[i].scales;
        float *o = out + i * TK_QK_K;
        for (int n = 0; n < TK_QK_K; n += 128) {
            for (int l = 0; l < 32; l++) {
                int is = l / 16;
                int q1 = ((ql[l] & 0x0f) | (((qh[l] >> 0) & 3) << 4)) - 32;
                int q2 = ((ql[l + 32] & 0x0f) | (((qh[l] >> 2) & 3) << 4)) - 32;
                int q3 = ((ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4)) - 32;
                int q4 = ((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4)) - 32;
                o[n + l] = d * (float)sc[is + 0] * (float)q1;
                o[n + l + 32] = d * (float)sc[is + 2] * (float)q2;
                o[n + l + 64] = d * (float)sc[is + 4] * (float)q3;
                o[n + l + 96] = d * (float)sc[is + 6] * (float)q4;
            }
            ql += 64;
            qh += 32;
            sc += 8;
        }
    }
}

void kern_dequant_q8_k_ref(const void *row, float *out, int64_t k) {
    const tk_block_q8_k *b = row;
    for (int64_t i = 0; i < k / TK_QK_K; i++)
        for (int j = 0; j < TK_QK_K; j++) out[i * TK_QK_K + j] = b[i].d * (float)b[i].qs[j];
}

/* ---- activation quantizers ------------------------------------------------------ */

void kern_quant_q8_0_ref(const float *x, void *xq, int64_t k) {
    tk_block_q8_0 *b = xq;
    for (int64_t i = 0; i < k / TK_QK8_0; i++) {
        const float *v = x + i * TK_QK8_0;
        float amax = 0.0f;
        for (int j = 0; j < TK_QK8_0; j++) amax = fmaxf(amax, fabsf(v[j]));
        float d = amax / 127.0f, id = d != 0.0f ? 1.0f / d : 0.0f;
        b[i].d = tk_f32_to_f16(d);
        for (int j = 0; j < TK_QK8_0; j++) b[i].qs[j] = (int8_t)clampi(round_even(v[j] * id), -127, 127);
    }
}

void kern_quant_q8_k_ref(const float *x, void *xq, int64_t k) {
    tk_block_q8_k *b = xq;
    for (int64_t i = 0; i < k / TK_QK_K; i++) {
        const float *v = x + i * TK_QK_K;
        float amax = 0.0f;
        for (int j = 0; j < TK_QK_K; j++) amax = fmaxf(amax, fabsf(v[j]));
        float d = amax / 127.0f, id = d != 0.0f ? 1.0f / d : 0.0f;
        b[i].d = d;
        for (int j = 0; j < TK_QK_K; j++) b[i].qs[j] = (int8_t)clampi(round_even(v[j] * id), -127, 127);
        for (int g = 0; g < TK_QK_K / 16; g++) {
            int s = 0;
            for (int j = 0; j < 16; j++) s += b[i].qs[16 * g + j];
            b[i].bsums[g] = (int16_t)s;
        }
    }
}

/* ---- weight quantizers ----------------------------------------------------------- */

/* GGML's q4_0: the signed value of largest magnitude maps to -8, so the full
 * 4-bit range is used on that side. */
static void quantize_q4_0(const float *x, tk_block_q4_0 *b, int64_t nb) {
    for (int64_t i = 0; i < nb; i++) {
        const float *v = x + i * TK_QK4_0;
        float amax = 0.0f, max = 0.0f;
        for (int j = 0; j < TK_QK4_0; j++)
            if (fabsf(v[j]) > amax) {
                amax = fabsf(v[j]);
                max = v[j];
            }
        float d = max / -8.0f, id = d != 0.0f ? 1.0f / d : 0.0f;
        b[i].d = tk_f32_to_f16(d);
        for (int j = 0; j < TK_QK4_0 / 2; j++) {
            int q0 = clampi((int)(v[j] * id + 8.5f), 0, 15);
            int q1 = clampi((int)(v[j + 16] * id + 8.5f), 0, 15);
            b[i].qs[j] = (uint8_t)(q0 | (q1 << 4));
        }
    }
}

/* A plain min/max quantizer: each 32-element sub-block gets scale (max-min)/15
 * and min -min(0, min); both are coded in 6 bits against the super-block's
 * largest. Quality is below llama.cpp's search but the blocks are valid. */
static void quantize_q4_k(const float *x, tk_block_q4_k *b, int64_t nb) {
    for (int64_t i = 0; i < nb; i++) {
        const float *v = x + i * TK_QK_K;
        float scale[8], mins[8], max_scale = 0.0f, max_min = 0.0f;
        for (int j = 0; j < 8; j++) {
            float mn = 0.0f, mx = -INFINITY;
            for (int l = 0; l < 32; l++) {
                mn = fminf(mn, v[32 * j + l]);
                mx = fmaxf(mx, v[32 * j + l]);
            }
            scale[j] = fmaxf(mx - mn, 0.0f) / 15.0f;
            mins[j] = -mn;
            max_scale = fmaxf(max_scale, scale[j]);
            max_min = fmaxf(max_min, mins[j]);
        }
        b[i].d = tk_f32_to_f16(max_scale / 63.0f);
        b[i].dmin = tk_f32_to_f16(max_min / 63.0f);
        float d = tk_f16_to_f32(b[i].d), dmin = tk_f16_to_f32(b[i].dmin);
        uint8_t ls[8], lm[8];
        for (int j = 0; j < 8; j++) {
            ls[j] = (uint8_t)(d > 0.0f ? clampi(round_even(scale[j] / d), 0, 63) : 0);
            lm[j] = (uint8_t)(dmin > 0.0f ? clampi(round_even(mins[j] / dmin), 0, 63) : 0);
        }
        memset(b[i].scales, 0, sizeof b[i].scales);
        for (int j = 0; j < 8; j++) {
            if (j < 4) {
                b[i].scales[j] = ls[j];
                b[i].scales[j + 4] = lm[j];
            } else {
                b[i].scales[j + 4] = (uint8_t)((ls[j] & 0x0f) | ((lm[j] & 0x0f) << 4));
                b[i].scales[j - 4] |= (uint8_t)((ls[j] >> 4) << 6);
                b[i].scales[j] |= (uint8_t)((lm[j] >> 4) << 6);
            }
        }
        uint8_t L[TK_QK_K];
        for (int j = 0; j < 8; j++) {
            float sc = d * ls[j], m = dmin * lm[j];
            for (int l = 0; l < 32; l++)
                L[32 * j + l] =
                    (uint8_t)(sc > 0.0f ? clampi(round_even((v[32 * j + l] + m) / sc), 0, 15) : 0);
        }
        for (int j = 0; j < 4; j++)
            for (int l = 0; l < 32; l++)
                b[i].qs[32 * j + l] = (uint8_t)(L[64 * j + l] | (L[64 * j + 32 + l] << 4));
    }
}

/* Symmetric per 16 elements: scale amax/31 coded in 8 signed bits against the
 * super-block's largest; q in [-32, 31] stored with +32. */
static void quantize_q6_k(const float *x, tk_block_q6_k *b, int64_t nb) {
    for (int64_t i = 0; i < nb; i++) {
        const float *v = x + i * TK_QK_K;
        float scale[16], max_scale = 0.0f;
        for (int j = 0; j < 16; j++) {
            float amax = 0.0f;
            for (int l = 0; l < 16; l++) amax = fmaxf(amax, fabsf(v[16 * j + l]));
            scale[j] = amax / 31.0f;
            max_scale = fmaxf(max_scale, scale[j]);
        }
        b[i].d = tk_f32_to_f16(max_scale / 127.0f);
        float d = tk_f16_to_f32(b[i].d);
        uint8_t L[TK_QK_K];
        for (int j = 0; j < 16; j++) {
            int ls = d > 0.0f ? clampi(round_even(scale[j] / d), 0, 127) : 0;
            b[i].scales[j] = (int8_t)ls;
            float sc = d * (float)ls;
            for (int l = 0; l < 16; l++)
                L[16 * j + l] =
                    (uint8_t)(sc > 0.0f ? clampi(round_even(v[16 * j + l] / sc), -32, 31) + 32 : 32);
        }
        uint8_t *ql = b[i].ql, *qh = b[i].qh;
        for (int n = 0; n < TK_QK_K; n += 128) {
            for (int l = 0; l < 32; l++) {
                const uint8_t *q = L + n + l;
                ql[l] = (uint8_t)((q[0] & 0x0f) | ((q[64] & 0x0f) << 4));
                ql[l + 32] = (uint8_t)((q[32] & 0x0f) | ((q[96] & 0x0f) << 4));
                qh[l] =
                    (uint8_t)((q[0] >> 4) | ((q[32] >> 4) << 2) | ((q[64] >> 4) << 4) | ((q[96] >> 4) << 6));
            }
            ql += 64;
            qh += 32;
        }
    }
}

bool kern_quantize_row(tk_dtype t, const float *x, void *out, int64_t k) {
    if (k < 0) return false;
    switch (t) {
    case TK_DTYPE_F32:
        memcpy(out, x, (size_t)k * sizeof(float));
        return true;
    case TK_DTYPE_F16:
        for (int64_t i = 0; i < k; i++) ((tk_f16 *)out)[i] = tk_f32_to_f16(x[i]);
        return true;
    case TK_DTYPE_BF16:
        for (int64_t i = 0; i < k; i++) ((tk_bf16 *)out)[i] = tk_f32_to_bf16(x[i]);
        return true;
    case TK_DTYPE_Q8_0:
        if (k % TK_QK8_0) return false;
        kern_quant_q8_0_ref(x, out, k);
        return true;
    case TK_DTYPE_Q4_0:
        if (k % TK_QK4_0) return false;
        quantize_q4_0(x, out, k / TK_QK4_0);
        return true;
    case TK_DTYPE_Q4_K:
        if (k % TK_QK_K) return false;
        quantize_q4_k(x, out, k / TK_QK_K);
        return true;
    case TK_DTYPE_Q6_K:
        if (k % TK_QK_K) return false;
        quantize_q6_k(x, out, k / TK_QK_K);
        return true;
    case TK_DTYPE_Q8_K:
        if (k % TK_QK_K) return false;
        kern_quant_q8_k_ref(x, out, k);
        return true;
    default:
        return false;
    }
}

/* ---- the 8- and 16-row interleaved Q8_0 layouts (kernels_ref.h) ------------------ */

/* Group of R rows, block b: R f16 scales, then chunk c (0..7) of R 4-byte
 * pieces, row i's at 2R + 4Rc + 4i; R * 34 bytes per block. */
static bool pack_q8_0_xr(int R, const void *rows_in, void *out, int64_t rows, int64_t k) {
    if (rows <= 0 || rows % R || k <= 0 || k % TK_QK8_0) return false;
    const int64_t nb = k / TK_QK8_0;
    const size_t rb = (size_t)nb * sizeof(tk_block_q8_0), bb = (size_t)R * sizeof(tk_block_q8_0);
    for (int64_t g = 0; g < rows / R; g++)
        for (int i = 0; i < R; i++) {
            const tk_block_q8_0 *src =
                (const tk_block_q8_0 *)((const char *)rows_in + (size_t)(R * g + i) * rb);
            for (int64_t b = 0; b < nb; b++) {
                uint8_t *blk = (uint8_t *)out + (size_t)g * (size_t)R * rb + (size_t)b * bb;
                memcpy(blk + 2 * i, &src[b].d, sizeof(tk_f16));
                for (int c = 0; c < 8; c++) memcpy(blk + 2 * R + 4 * R * c + 4 * i, src[b].qs + 4 * c, 4);
            }
        }
    return true;
}

static void dequant_q8_0_xr_row(int R, const void *w, int64_t k, int64_t row, float *out) {
    const int64_t nb = k / TK_QK8_0;
    const size_t bb = (size_t)R * sizeof(tk_block_q8_0);
    const uint8_t *g = (const uint8_t *)w + (size_t)(row / R) * (size_t)nb * bb;
    const int i = (int)(row % R);
    for (int64_t b = 0; b < nb; b++) {
        const uint8_t *blk = g + (size_t)b * bb;
        tk_f16 d;
        memcpy(&d, blk + 2 * i, sizeof d);
        float s = tk_f16_to_f32(d);
        for (int c = 0; c < 8; c++)
            for (int j = 0; j < 4; j++)
                out[b * 32 + 4 * c + j] = s * (float)(int8_t)blk[2 * R + 4 * R * c + 4 * i + j];
    }
}

bool kern_pack_q8_0_x8(const void *rows_in, void *out, int64_t rows, int64_t k) {
    return pack_q8_0_xr(8, rows_in, out, rows, k);
}

void kern_dequant_q8_0_x8_row(const void *w, int64_t k, int64_t row, float *out) {
    dequant_q8_0_xr_row(8, w, k, row, out);
}

bool kern_pack_q8_0_x16(const void *rows_in, void *out, int64_t rows, int64_t k) {
    return pack_q8_0_xr(16, rows_in, out, rows, k);
}

void kern_dequant_q8_0_x16_row(const void *w, int64_t k, int64_t row, float *out) {
    dequant_q8_0_xr_row(16, w, k, row, out);
}

/* ---- Q8_0 by one scale per 256 values, 16 rows (kernels_ref.h) -------------------- */

/* Byte offset, within a 4160-byte X16S block, of row i's element e (0..255). */
static size_t q8_0_x16s_at(int i, int e) {
    return 64 + 64 * (size_t)(e / 4) + 4 * (size_t)i + (size_t)(e % 4);
}

/* One row's 256 values as Q8_K's quantizer rounds them (kern_dequant_q8_0_ref
 * of its eight Q8_0 blocks, then kern_quant_q8_k_ref: d = max |x| / 127,
 * round to nearest even), its d and quants regrouped. The same bits without
 * a call per element: the largest |d_b q| is |d_b| max |q| of each block
 * (rounding is monotonic), and v / d rounds by the 1.5 * 2^23 sum (exact for
 * |v / d| <= 2^22; here <= 127; an f16 scale's amax is 0 or at least
 * 2^-24, so 1 / d is finite). Scales that are not finite take the
 * definition itself. */
static void pack_x16s_row(const tk_block_q8_0 *src, uint8_t *blk, int i) {
    float v[TK_QK_K], amax = 0.0f;
    bool finite = true;
    kern_dequant_q8_0_ref(src, v, TK_QK_K);
    for (int j = 0; j < TK_QK_K / TK_QK8_0; j++) {
        const float d = tk_f16_to_f32(src[j].d);
        int m = 0;
        for (int e = 0; e < TK_QK8_0; e++) m = abs(src[j].qs[e]) > m ? abs(src[j].qs[e]) : m;
        finite &= isfinite(d);
        const float a = fabsf(d) * (float)m;
        amax = a > amax ? a : amax;
    }
    const float d = amax / 127.0f, id = d != 0.0f ? 1.0f / d : 0.0f;
    int8_t qs[TK_QK_K];
    if (finite) {
        memcpy(blk + 4 * i, &d, sizeof d);
        for (int e = 0; e < TK_QK_K; e++) {
            const float x = v[e] * id; /* its own statement: never contracted into an FMA */
            const float r = (x + 12582912.0f) - 12582912.0f;
            qs[e] = (int8_t)clampi((int)r, -127, 127);
        }
    } else {
        tk_block_q8_k q;
        kern_quant_q8_k_ref(v, &q, TK_QK_K);
        memcpy(blk + 4 * i, &q.d, sizeof q.d);
        memcpy(qs, q.qs, sizeof qs);
    }
    for (int c = 0; c < TK_QK_K / 4; c++) memcpy(blk + q8_0_x16s_at(i, 4 * c), qs + 4 * c, 4);
}

bool kern_pack_q8_0_x16s(const void *rows_in, void *out, int64_t rows, int64_t k) {
    if (rows <= 0 || rows % 16 || k <= 0 || k % TK_QK_K) return false;
    const int64_t nb = k / TK_QK_K, per = TK_QK_K / TK_QK8_0;
    const size_t rb = (size_t)(nb * per) * sizeof(tk_block_q8_0);
    for (int64_t g = 0; g < rows / 16; g++)
        for (int i = 0; i < 16; i++) {
            const tk_block_q8_0 *src =
                (const tk_block_q8_0 *)((const char *)rows_in + (size_t)(16 * g + i) * rb);
            for (int64_t b = 0; b < nb; b++)
                pack_x16s_row(src + b * per,
                              (uint8_t *)out + ((size_t)g * (size_t)nb + (size_t)b) * TK_X16S_BLOCK_BYTES, i);
        }
    return true;
}

uint64_t kern_q8_0_x16s_bytes(int64_t rows, int64_t k) {
    return (uint64_t)(rows / 16) * (uint64_t)(k / TK_QK_K) * TK_X16S_BLOCK_BYTES;
}

int kern_q8_0_x16s_q(const uint8_t *blk, int i, int e) { return (int8_t)blk[q8_0_x16s_at(i, e)]; }

void kern_dequant_q8_0_x16s_row(const void *w, int64_t k, int64_t row, float *out) {
    const int64_t nb = k / TK_QK_K;
    const uint8_t *g = (const uint8_t *)w + (size_t)(row / 16) * (size_t)nb * TK_X16S_BLOCK_BYTES;
    const int i = (int)(row % 16);
    for (int64_t b = 0; b < nb; b++) {
        const uint8_t *blk = g + (size_t)b * TK_X16S_BLOCK_BYTES;
        float d;
        memcpy(&d, blk + 4 * i, sizeof d);
        for (int e = 0; e < TK_QK_K; e++) out[b * TK_QK_K + e] = d * (float)kern_q8_0_x16s_q(blk, i, e);
    }
}

/* ---- Q4_0 interleaved by 16 rows (kernels_ref.h) ---------------------------------- */

/* Byte offset, within a 288-byte X16 block, of row i's element e (0..31);
 * the element is that byte's high nibble when (e / 4) is odd. */
static size_t q4_0_x16_at(int i, int e) {
    return 32 + 64 * (size_t)(e / 8) + 4 * (size_t)i + (size_t)(e % 4);
}

bool kern_pack_q4_0_x16(const void *rows_in, void *out, int64_t rows, int64_t k) {
    if (rows <= 0 || rows % 16 || k <= 0 || k % TK_QK4_0) return false;
    const int64_t nb = k / TK_QK4_0;
    const size_t rb = (size_t)nb * sizeof(tk_block_q4_0);
    memset(out, 0, (size_t)rows * rb);
    for (int64_t g = 0; g < rows / 16; g++)
        for (int i = 0; i < 16; i++) {
            const tk_block_q4_0 *src =
                (const tk_block_q4_0 *)((const char *)rows_in + (size_t)(16 * g + i) * rb);
            for (int64_t b = 0; b < nb; b++) {
                uint8_t *blk = (uint8_t *)out + (size_t)g * 16 * rb + (size_t)b * 288;
                memcpy(blk + 2 * i, &src[b].d, sizeof(tk_f16));
                for (int e = 0; e < 32; e++) {
                    int q = e < 16 ? src[b].qs[e] & 0x0f : src[b].qs[e - 16] >> 4;
                    blk[q4_0_x16_at(i, e)] |= (uint8_t)(q << ((e / 4) % 2 * 4));
                }
            }
        }
    return true;
}

int kern_q4_0_x16_q(const uint8_t *blk, int i, int e) {
    return (blk[q4_0_x16_at(i, e)] >> ((e / 4) % 2 * 4)) & 0x0f;
}

void kern_dequant_q4_0_x16_row(const void *w, int64_t k, int64_t row, float *out) {
    const int64_t nb = k / TK_QK4_0;
    const uint8_t *g = (const uint8_t *)w + (size_t)(row / 16) * (size_t)nb * 288;
    const int i = (int)(row % 16);
    for (int64_t b = 0; b < nb; b++) {
        const uint8_t *blk = g + (size_t)b * 288;
        tk_f16 d;
        memcpy(&d, blk + 2 * i, sizeof d);
        float s = tk_f16_to_f32(d);
        for (int e = 0; e < 32; e++) out[b * 32 + e] = s * (float)(kern_q4_0_x16_q(blk, i, e) - 8);
    }
}

/* ---- BF16 interleaved by 4 rows (kernels_ref.h) ----------------------------------- */

bool kern_pack_bf16_x4(const void *rows_in, void *out, int64_t rows, int64_t k) {
    if (rows <= 0 || rows % 4 || k <= 0 || k % 16) return false;
    const uint16_t *in = rows_in;
    uint16_t *o = out;
    for (int64_t r = 0; r < rows; r++)
        for (int64_t j = 0; j < k / 16; j++)
            memcpy(o + (size_t)(r / 4) * 4 * (size_t)k + (size_t)j * 64 + (size_t)(r % 4) * 16,
                   in + (size_t)r * (size_t)k + (size_t)j * 16, 16 * sizeof *o);
    return true;
}

void kern_dequant_bf16_x4_row(const void *w, int64_t k, int64_t row, float *out) {
    const uint16_t *g = (const uint16_t *)w + (size_t)(row / 4) * 4 * (size_t)k + (size_t)(row % 4) * 16;
    for (int64_t j = 0; j < k / 16; j++) kern_dequant_bf16_ref(g + (size_t)j * 64, out + j * 16, 16);
}

/* ---- BF16 pairs interleaved by 16 rows (kernels_ref.h) ---------------------------- */

bool kern_pack_bf16_p16(const void *rows_in, void *out, int64_t rows, int64_t k) {
    if (rows <= 0 || rows % 16 || k <= 0 || k % 32) return false;
    const uint16_t *in = rows_in;
    uint16_t *o = out;
    for (int64_t r = 0; r < rows; r++)
        for (int64_t j = 0; j < k / 2; j++)
            memcpy(o + (size_t)(r / 16) * 16 * (size_t)k + (size_t)j * 32 + (size_t)(r % 16) * 2,
                   in + (size_t)r * (size_t)k + (size_t)j * 2, 2 * sizeof *o);
    return true;
}

void kern_dequant_bf16_p16_row(const void *w, int64_t k, int64_t row, float *out) {
    const uint16_t *g = (const uint16_t *)w + (size_t)(row / 16) * 16 * (size_t)k + (size_t)(row % 16) * 2;
    for (int64_t j = 0; j < k / 2; j++) kern_dequant_bf16_ref(g + (size_t)j * 32, out + 2 * j, 2);
}

tk_bf16 kern_act_bf16_ref(float x) {
    uint32_t u;
    memcpy(&u, &x, 4);
    if ((u & 0x7f800000u) == 0) return (tk_bf16)((u >> 16) & 0x8000u);
    return tk_f32_to_bf16(x);
}

/* ---- Q4_K interleaved by 16 rows (kernels_ref.h) ---------------------------------- */

/* Byte offset, within a 2304-byte X16 super-block, of row i's element e
 * (0..255); the element is that byte's high nibble when (e / 4) is odd. */
static size_t q4_k_x16_at(int i, int e) {
    return 256 + 256 * (size_t)(e / 32) + 64 * (size_t)(e % 32 / 8) + 4 * (size_t)i + (size_t)(e % 4);
}

bool kern_pack_q4_k_x16(const void *rows_in, void *out, int64_t rows, int64_t k) {
    if (rows <= 0 || rows % 16 || k <= 0 || k % TK_QK_K) return false;
    const int64_t nb = k / TK_QK_K;
    const size_t rb = (size_t)nb * sizeof(tk_block_q4_k);
    memset(out, 0, (size_t)rows * rb);
    for (int64_t g = 0; g < rows / 16; g++)
        for (int i = 0; i < 16; i++) {
            const tk_block_q4_k *src =
                (const tk_block_q4_k *)((const char *)rows_in + (size_t)(16 * g + i) * rb);
            for (int64_t b = 0; b < nb; b++) {
                uint8_t *blk = (uint8_t *)out + (size_t)g * 16 * rb + (size_t)b * 2304;
                memcpy(blk + 2 * i, &src[b].d, sizeof(tk_f16));
                memcpy(blk + 32 + 2 * i, &src[b].dmin, sizeof(tk_f16));
                for (int j = 0; j < 8; j++) {
                    uint8_t sc, m;
                    kern_q4_k_scale_min(j, src[b].scales, &sc, &m);
                    blk[64 + 16 * j + i] = (uint8_t)((sc & 15) | (m & 15) << 4);
                    blk[192 + 16 * (j % 4) + i] |= (uint8_t)((sc >> 4) << (2 * (j / 4)));
                    blk[192 + 16 * (j % 4) + i] |= (uint8_t)((m >> 4) << (4 + 2 * (j / 4)));
                }
                /* byte (j, c, e) of the row: q[32j + 8c + e] low, q[32j + 8c + 4 + e] high */
                for (int j = 0; j < 8; j++) {
                    const uint8_t *qs = src[b].qs + 32 * (j / 2);
                    const int sh = 4 * (j % 2);
                    uint8_t *d = blk + q4_k_x16_at(i, 32 * j);
                    for (int c = 0; c < 4; c++)
                        for (int e = 0; e < 4; e++)
                            d[64 * c + e] = (uint8_t)(((qs[8 * c + e] >> sh) & 0x0f) |
                                                      ((qs[8 * c + 4 + e] >> sh) & 0x0f) << 4);
                }
            }
        }
    return true;
}

int kern_q4_k_x16_q(const uint8_t *blk, int i, int e) {
    return (blk[q4_k_x16_at(i, e)] >> ((e / 4) % 2 * 4)) & 0x0f;
}

void kern_q4_k_x16_scale_min(const uint8_t *blk, int i, int j, uint8_t *sc, uint8_t *m) {
    const uint8_t s = blk[64 + 16 * j + i], h = blk[192 + 16 * (j % 4) + i];
    *sc = (uint8_t)((s & 15) | ((h >> (2 * (j / 4))) & 3) << 4);
    *m = (uint8_t)((s >> 4) | ((h >> (4 + 2 * (j / 4))) & 3) << 4);
}

void kern_dequant_q4_k_x16_row(const void *w, int64_t k, int64_t row, float *out) {
    const int64_t nb = k / TK_QK_K;
    const uint8_t *g = (const uint8_t *)w + (size_t)(row / 16) * (size_t)nb * 2304;
    const int i = (int)(row % 16);
    for (int64_t b = 0; b < nb; b++) {
        const uint8_t *blk = g + (size_t)b * 2304;
        tk_f16 hd, hm;
        memcpy(&hd, blk + 2 * i, sizeof hd);
        memcpy(&hm, blk + 32 + 2 * i, sizeof hm);
        float d = tk_f16_to_f32(hd), dmin = tk_f16_to_f32(hm);
        for (int j = 0; j < 8; j++) {
            uint8_t sc, m;
            kern_q4_k_x16_scale_min(blk, i, j, &sc, &m);
            float dj = d * sc, mj = dmin * m;
            for (int l = 0; l < 32; l++)
                out[b * TK_QK_K + 32 * j + l] = dj * (float)kern_q4_k_x16_q(blk, i, 32 * j + l) - mj;
        }
    }
}

/* ---- Q6_K interleaved by 16 rows (kernels_ref.h) ---------------------------------- */

/* Element e (0..255) of a Q6_K block as its unsigned 6-bit value (w = d sc (q - 32)). */
static inline int q6_k_q(const tk_block_q6_k *b, int e) {
    const int n = e / 128, c = e % 128 / 32, l = e % 32;
    const int lo = (b->ql[64 * n + l + 32 * (c & 1)] >> (4 * (c >> 1))) & 0x0f;
    return lo | ((b->qh[32 * n + l] >> (2 * c)) & 3) << 4;
}

/* Within a 3360-byte X16 super-block: the byte of row i's element e low four
 * bits (the high nibble when (e / 4) is odd), and the byte and bit of its top two. */
static size_t q6_k_x16_lo(int i, int e) {
    return 288 + 256 * (size_t)(e / 32) + 64 * (size_t)(e % 32 / 8) + 4 * (size_t)i + (size_t)(e % 4);
}
static size_t q6_k_x16_hi(int i, int e, int *bit) {
    *bit = 4 * (e % 32 / 8 % 2) + 2 * (e % 8 / 4);
    return 2336 + 128 * (size_t)(e / 32) + 64 * (size_t)(e % 32 / 16) + 4 * (size_t)i + (size_t)(e % 4);
}

bool kern_pack_q6_k_x16(const void *rows_in, void *out, int64_t rows, int64_t k) {
    if (rows <= 0 || rows % 16 || k <= 0 || k % TK_QK_K) return false;
    const int64_t nb = k / TK_QK_K;
    const size_t rb = (size_t)nb * sizeof(tk_block_q6_k);
    memset(out, 0, (size_t)rows * rb);
    for (int64_t g = 0; g < rows / 16; g++)
        for (int i = 0; i < 16; i++) {
            const tk_block_q6_k *src =
                (const tk_block_q6_k *)((const char *)rows_in + (size_t)(16 * g + i) * rb);
            for (int64_t b = 0; b < nb; b++) {
                uint8_t *blk = (uint8_t *)out + (size_t)g * 16 * rb + (size_t)b * 3360;
                memcpy(blk + 2 * i, &src[b].d, sizeof(tk_f16));
                for (int s = 0; s < 16; s++) blk[32 + 16 * s + i] = (uint8_t)src[b].scales[s];
                uint8_t q[TK_QK_K];
                for (int e = 0; e < TK_QK_K; e++) q[e] = (uint8_t)q6_k_q(&src[b], e);
                /* per 4-element pair of a chunk one nibble byte; per two chunks one byte of top bits */
                for (int j = 0; j < 8; j++) {
                    uint8_t *dl = blk + q6_k_x16_lo(i, 32 * j);
                    int hb;
                    uint8_t *dh = blk + q6_k_x16_hi(i, 32 * j, &hb);
                    for (int c = 0; c < 4; c++)
                        for (int e = 0; e < 4; e++) {
                            const uint8_t *qa = q + 32 * j + 8 * c + e;
                            dl[64 * c + e] = (uint8_t)((qa[0] & 15) | (qa[4] & 15) << 4);
                            dh[64 * (c / 2) + e] |=
                                (uint8_t)((qa[0] >> 4) << (4 * (c % 2)) | (qa[4] >> 4) << (4 * (c % 2) + 2));
                        }
                }
            }
        }
    return true;
}

int kern_q6_k_x16_q(const uint8_t *blk, int i, int e) {
    int bit;
    const int lo = (blk[q6_k_x16_lo(i, e)] >> ((e / 4) % 2 * 4)) & 0x0f;
    const int hi = blk[q6_k_x16_hi(i, e, &bit)]; /* sets bit */
    return lo | ((hi >> bit) & 3) << 4;
}

void kern_dequant_q6_k_x16_row(const void *w, int64_t k, int64_t row, float *out) {
    const int64_t nb = k / TK_QK_K;
    const uint8_t *g = (const uint8_t *)w + (size_t)(row / 16) * (size_t)nb * 3360;
    const int i = (int)(row % 16);
    for (int64_t b = 0; b < nb; b++) {
        const uint8_t *blk = g + (size_t)b * 3360;
        tk_f16 hd;
        memcpy(&hd, blk + 2 * i, sizeof hd);
        const float d = tk_f16_to_f32(hd);
        for (int e = 0; e < TK_QK_K; e++)
            out[b * TK_QK_K + e] =
                d * (float)(int8_t)blk[32 + 16 * (e / 16) + i] * (float)(kern_q6_k_x16_q(blk, i, e) - 32);
    }
}
