/* Reference attention over the paged KV cache: the definition the SIMD kernels
 * are tested against. One query head at a time, K/V read straight from the
 * blocks (one row dequantized into scratch at a time), softmax computed online
 * one block at a time: scores of the block, then the running max, sum and
 * weighted V sum are rescaled by exp(old max - new max). */
#include <math.h>

#include "kv_simd.h"

void kv_to_f16_ref(const float *x, tk_f16 *y, int n) {
    for (int i = 0; i < n; i++) y[i] = tk_f32_to_f16(x[i]);
}

/* One row of hd elements of the KV type, as floats (int8 unscaled). */
static void row_to_f32(const uint8_t *row, tk_kv_type type, int hd, float *out) {
    switch (type) {
    case TK_KV_F32:
        for (int c = 0; c < hd; c++) out[c] = ((const float *)row)[c];
        break;
    case TK_KV_F16:
        for (int c = 0; c < hd; c++) out[c] = tk_f16_to_f32(((const tk_f16 *)row)[c]);
        break;
    case TK_KV_BF16:
        for (int c = 0; c < hd; c++) out[c] = tk_bf16_to_f32(((const tk_bf16 *)row)[c]);
        break;
    case TK_KV_INT8:
        for (int c = 0; c < hd; c++) out[c] = (float)((const int8_t *)row)[c];
        break;
    }
}

/* Attention of one query vector q (head_dim) against positions [0, len) of kv
 * head kvh; writes head_dim floats to out. scratch: block_size + 2*head_dim. */
static void attn_one(const kv_geom *g, const int32_t *bt, int len, int kvh, const float *q, float scale,
                     float *out, float *scratch) {
    const int hd = g->head_dim, bs = g->block_size;
    const size_t row_bytes = (size_t)hd * kv_type_size(g->type);
    /* int8 scales: one per slot (per token) or one per block (per head). */
    const int sstride = g->scale == TK_KV_SCALE_TOKEN ? 1 : 0;
    float *s = scratch, *acc = s + bs, *row = acc + hd;
    float m = -INFINITY, l = 0.0f;
    for (int c = 0; c < hd; c++) acc[c] = 0.0f;
    for (int b = 0; b * bs < len; b++) {
        const int n = len - b * bs < bs ? len - b * bs : bs;
        const uint8_t *K = kv_geom_k(g, bt[b], kvh), *V = kv_geom_v(g, bt[b], kvh);
        const float *ks = kv_geom_ks(g, bt[b], kvh), *vs = kv_geom_vs(g, bt[b], kvh);
        float bmax = -INFINITY;
        for (int j = 0; j < n; j++) {
            row_to_f32(K + (size_t)j * row_bytes, g->type, hd, row);
            float d = 0.0f;
            for (int c = 0; c < hd; c++) d += q[c] * row[c];
            if (ks) d *= ks[j * sstride];
            s[j] = d * scale;
            bmax = fmaxf(bmax, s[j]);
        }
        const float m_new = fmaxf(m, bmax), corr = expf(m - m_new);
        l *= corr;
        for (int c = 0; c < hd; c++) acc[c] *= corr;
        for (int j = 0; j < n; j++) {
            const float p = expf(s[j] - m_new);
            l += p;
            const float w = vs ? p * vs[j * sstride] : p;
            row_to_f32(V + (size_t)j * row_bytes, g->type, hd, row);
            for (int c = 0; c < hd; c++) acc[c] += w * row[c];
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
