/* Reference attention over the paged KV cache: the definition the SIMD kernels
 * are tested against. One query head at a time, K/V read straight from the
 * blocks (one row dequantized into scratch at a time, exactly as kv_read
 * does), softmax computed online one block at a time: scores of the block,
 * then the running max, sum and weighted V sum are rescaled by
 * exp(old max - new max). */
#include <math.h>

#include "kernels/kernels_ref.h"

void kv_to_f16_ref(const float *x, tk_f16 *y, int n) {
    for (int i = 0; i < n; i++) y[i] = tk_f32_to_f16(x[i]);
}

/* Row j of a block of the KV type as floats; int8 times its scales (one per
 * row with per-token scales, one per channel with per-head scales). */
static void row_to_f32(const kv_geom *g, const uint8_t *rows, const float *scales, int j, float *out) {
    const int hd = g->head_dim;
    const size_t off = (size_t)j * (size_t)hd;
    switch (g->type) {
    case TK_KV_F32:
        for (int c = 0; c < hd; c++) out[c] = ((const float *)rows)[off + c];
        break;
    case TK_KV_F16:
        for (int c = 0; c < hd; c++) out[c] = tk_f16_to_f32(((const tk_f16 *)rows)[off + c]);
        break;
    case TK_KV_BF16:
        for (int c = 0; c < hd; c++) out[c] = tk_bf16_to_f32(((const tk_bf16 *)rows)[off + c]);
        break;
    case TK_KV_INT8:
        for (int c = 0; c < hd; c++)
            out[c] = (float)((const int8_t *)rows)[off + c] *
                     (g->scale == TK_KV_SCALE_TOKEN ? scales[j] : scales[c]);
        break;
    }
}

/* Attention of one query vector q (head_dim) against positions [0, len) of kv
 * head kvh; writes head_dim floats to out. scratch: block_size + 2*head_dim. */
static void attn_one(const kv_geom *g, const int32_t *bt, int len, int kvh, const float *q, float scale,
                     float *out, float *scratch) {
    const int hd = g->head_dim, bs = g->block_size;
    float *s = scratch, *acc = s + bs, *row = acc + hd;
    float m = -INFINITY, l = 0.0f;
    for (int c = 0; c < hd; c++) acc[c] = 0.0f;
    for (int b = 0; b * bs < len; b++) {
        const int n = len - b * bs < bs ? len - b * bs : bs;
        const uint8_t *K = kv_geom_k(g, bt[b], kvh), *V = kv_geom_v(g, bt[b], kvh);
        const float *ks = kv_geom_ks(g, bt[b], kvh), *vs = kv_geom_vs(g, bt[b], kvh);
        float bmax = -INFINITY;
        for (int j = 0; j < n; j++) {
            row_to_f32(g, K, ks, j, row);
            float d = 0.0f;
            for (int c = 0; c < hd; c++) d += q[c] * row[c];
            s[j] = d * scale;
            bmax = fmaxf(bmax, s[j]);
        }
        const float m_new = fmaxf(m, bmax), corr = expf(m - m_new);
        l *= corr;
        for (int c = 0; c < hd; c++) acc[c] *= corr;
        for (int j = 0; j < n; j++) {
            const float p = expf(s[j] - m_new);
            l += p;
            row_to_f32(g, V, vs, j, row);
            for (int c = 0; c < hd; c++) acc[c] += p * row[c];
        }
        m = m_new;
    }
    const float inv = 1.0f / l;
    for (int c = 0; c < hd; c++) out[c] = acc[c] * inv;
}

void kv_attn_ref(const kv_geom *g, const int32_t *bt, int pos0, int n_q, const float *q, int n_head, int h0,
                 int h1, float scale, float *out, float *scratch) {
    const int ratio = n_head / g->n_head_kv;
    const size_t hd = (size_t)g->head_dim;
    for (int i = 0; i < n_q; i++)
        for (int h = h0; h < h1; h++) {
            const size_t off = ((size_t)i * (size_t)n_head + (size_t)h) * hd;
            attn_one(g, bt, pos0 + i + 1, h / ratio, q + off, scale, out + off, scratch);
        }
}
