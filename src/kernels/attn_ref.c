/* Reference attention over the paged KV cache: the definition the SIMD kernels
 * are tested against. One query head at a time, K/V read straight from the
 * blocks (one row dequantized into scratch at a time, exactly as kv_read
 * does), softmax computed online one block at a time: scores of the block,
 * then the running max, sum and weighted V sum are rescaled by
 * exp(old max - new max). A context is split into parts of KV_ATTN_PART
 * positions, each computed so, then folded in order (kv_attn_fold), so a
 * long context's parts can run on different threads. */
#include <math.h>
#include <stdbool.h>

#include "kernels/kernels_ref.h"

void kv_to_f16_ref(const float *x, tk_f16 *y, int n) {
    for (int i = 0; i < n; i++) y[i] = tk_f32_to_f16(x[i]);
}

/* t rounded to the nearest integer, ties to even, as an int8 after clamping
 * to [-127, 127]; NaN gives 0. Adding 1.5 * 2^23 leaves no fraction bits:
 * the same result as nearbyintf in the default rounding mode (and as the
 * SIMD converts), without a library call. */
static int8_t round_i8(float t) {
    const float magic = 12582912.0f; /* 1.5 * 2^23; IEEE arithmetic keeps the pair */
    if (t != t) return 0;
    t = t > 127.0f ? 127.0f : t < -127.0f ? -127.0f : t;
    return (int8_t)((t + magic) - magic);
}

float kv_quant_token_ref(const float *x, int8_t *y, int n) {
    float a = 0.0f;
    for (int i = 0; i < n; i++) {
        const float v = fabsf(x[i]);
        a = v > a ? v : a; /* a NaN compares false: skipped */
    }
    const float s = a / 127.0f;
    for (int i = 0; i < n; i++) y[i] = s > 0.0f ? round_i8(x[i] / s) : 0;
    return s;
}

bool kv_quant_chan_ref(const float *x, float *s, int8_t *y, float *r, int n) {
    bool rescale = false;
    for (int i = 0; i < n; i++) {
        const float a = fabsf(x[i]), s0 = s[i];
        r[i] = 1.0f;
        if (a > s0 * 127.0f) { /* NaN: no */
            s[i] = fmaxf(a / 127.0f, s0 * KV_INT8_MIN_GROWTH);
            if (s0 > 0.0f) { /* scale 0: the channel's values are 0 */
                r[i] = s0 / s[i];
                rescale = true;
            }
        }
        y[i] = s[i] > 0.0f ? round_i8(x[i] / s[i]) : 0;
    }
    return rescale;
}

void kv_requant_chan_ref(int8_t *y, int n_rows, int n, const float *r) {
    for (int j = 0; j < n_rows; j++)
        for (int c = 0; c < n; c++)
            y[(size_t)j * (size_t)n + c] = round_i8((float)y[(size_t)j * (size_t)n + c] * r[c]);
}

void kv_requant_cols_ref(int8_t *k, int n_groups, int hd, const float *r) {
    for (int j = 0; j < n_groups * KV_KT; j++)
        for (int c = 0; c < hd; c++) {
            int8_t *p = k + kv_k8_index(hd, j, c);
            *p = round_i8((float)*p * r[c]);
        }
}

/* Row j of a block of the KV type as floats; int8 times its scales (one per
 * row with per-token scales, one per channel with per-head scales). kt: the
 * block's K of a float type, stored by columns (kv_k_index). */
static void row_to_f32(const kv_geom *g, const uint8_t *rows, const float *scales, int j, float *out,
                       bool kt) {
    const int hd = g->head_dim;
    const size_t off = (size_t)j * (size_t)hd;
    if (kt) {
        for (int c = 0; c < hd; c++) out[c] = kv_float_at(g->type, rows, kv_k_index(hd, j, c));
        return;
    }
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

/* The int8 query of one block (kv_geom.q8): qk (q times the block's
 * per-channel K scales, or q) rounded to int8 at max|qk| / 127, which it
 * returns (0 for an all-zero query, whose int8 values are all 0). */
static float query_q8(const float *qk, int hd, int8_t *q8) {
    float a = 0.0f;
    for (int c = 0; c < hd; c++) {
        const float v = fabsf(qk[c]);
        a = v > a ? v : a;
    }
    const float inv = a > 0.0f ? 127.0f / a : 0.0f;
    for (int c = 0; c < hd; c++) q8[c] = round_i8(qk[c] * inv);
    return a / 127.0f;
}

/* Scores of a block's n rows of int8 K (by rows, or by columns: kv_k_cols)
 * against int8 queries (kv_geom.q8):
 * the dot product exact in integers, times the query's scale, the row's K
 * scale (per token) and the attention scale. qs: head_dim floats, q8:
 * head_dim bytes. */
static void scores_q8(const kv_geom *g, const int8_t *K, const float *ks, int n, const float *q, float scale,
                      float *s, float *qs, int8_t *q8) {
    const int hd = g->head_dim;
    const bool per_tok = g->scale == TK_KV_SCALE_TOKEN;
    const float *qk = q;
    if (!per_tok) {
        for (int c = 0; c < hd; c++) qs[c] = q[c] * ks[c];
        qk = qs;
    }
    const float qsc = query_q8(qk, hd, q8);
    const bool kt = kv_k_cols(g->type, g->q8, g->block_size);
    for (int j = 0; j < n; j++) {
        int32_t d = 0;
        for (int c = 0; c < hd; c++)
            d += (int32_t)K[kt ? kv_k8_index(hd, j, c) : (size_t)j * (size_t)hd + (size_t)c] * (int32_t)q8[c];
        float y = (float)d * qsc;
        if (per_tok) y *= ks[j];
        s[j] = y * scale;
    }
}

/* Attention of one query vector q (head_dim) against positions [p0, p1) of
 * kv head kvh (p0 a multiple of the block size): the unnormalized result, its
 * running max *m, sum *l and weighted V sum acc (head_dim floats). scratch:
 * block_size + head_dim floats, then head_dim bytes. */
static void attn_range(const kv_geom *g, const int32_t *bt, int p0, int p1, int kvh, const float *q,
                       float scale, float *m_out, float *l_out, float *acc, float *scratch) {
    const int hd = g->head_dim, bs = g->block_size;
    float *s = scratch, *row = s + bs;
    float m = -INFINITY, l = 0.0f;
    for (int c = 0; c < hd; c++) acc[c] = 0.0f;
    for (int b = p0 / bs; b * bs < p1; b++) {
        const int n = p1 - b * bs < bs ? p1 - b * bs : bs;
        const uint8_t *K = kv_geom_k(g, bt[b], kvh), *V = kv_geom_v(g, bt[b], kvh);
        const float *ks = kv_geom_ks(g, bt[b], kvh), *vs = kv_geom_vs(g, bt[b], kvh);
        float bmax = -INFINITY;
        if (g->q8 && g->type == TK_KV_INT8)
            scores_q8(g, (const int8_t *)K, ks, n, q, scale, s, row, (int8_t *)(row + hd));
        for (int j = 0; j < n; j++) {
            if (!(g->q8 && g->type == TK_KV_INT8)) {
                row_to_f32(g, K, ks, j, row, kv_k_cols(g->type, g->q8, g->block_size));
                float d = 0.0f;
                for (int c = 0; c < hd; c++) d += q[c] * row[c];
                s[j] = d * scale;
            }
            bmax = fmaxf(bmax, s[j]);
        }
        const float m_new = fmaxf(m, bmax), corr = expf(m - m_new);
        l *= corr;
        for (int c = 0; c < hd; c++) acc[c] *= corr;
        for (int j = 0; j < n; j++) {
            const float p = expf(s[j] - m_new);
            l += p;
            row_to_f32(g, V, vs, j, row, false);
            for (int c = 0; c < hd; c++) acc[c] += p * row[c];
        }
        m = m_new;
    }
    *m_out = m;
    *l_out = l;
}

/* Every level folds parts with these two (compiled here, without FMA
 * contraction), so the parts of one context give the same bits whether one
 * call or several threads computed them. */
void kv_attn_fold(float *M, float *L, float *A, float m, float l, const float *acc, int hd, bool first) {
    if (first) {
        *M = m;
        *L = l;
        for (int c = 0; c < hd; c++) A[c] = acc[c];
        return;
    }
    const float m_new = fmaxf(*M, m), a = expf(*M - m_new), b = expf(m - m_new);
    *L = *L * a + l * b;
    for (int c = 0; c < hd; c++) A[c] = A[c] * a + acc[c] * b;
    *M = m_new;
}

void kv_attn_finish(const float *A, float L, int hd, float *out) {
    const float inv = 1.0f / L;
    for (int c = 0; c < hd; c++) out[c] = A[c] * inv;
}

void kv_attn_merge(const float *parts, int n_parts, size_t part_stride, int n_heads, int hd, const float *own,
                   float *out) {
    for (int h = 0; h < n_heads; h++) {
        float M = 0.0f, L = 0.0f;
        float *A = out + (size_t)h * (size_t)hd;
        for (int k = 0; k < n_parts; k++) {
            const float *r = parts + (size_t)k * part_stride + (size_t)h * KV_PART_REC(hd);
            kv_attn_fold(&M, &L, A, r[hd], r[hd + 1], r, hd, k == 0);
        }
        if (own) {
            const float *r = own + (size_t)h * KV_PART_REC(hd);
            kv_attn_fold(&M, &L, A, r[hd], r[hd + 1], r, hd, n_parts == 0);
        }
        kv_attn_finish(A, L, hd, A);
    }
}

/* Attention of one query vector over positions [0, end), part by part, then
 * (own not NULL) its own-block record. scratch: block_size + 4 * head_dim
 * floats. */
static void attn_one(const kv_geom *g, const int32_t *bt, int end, int kvh, const float *q, float scale,
                     const float *own, float *out, float *scratch) {
    const int hd = g->head_dim;
    float *acc = scratch, *A = acc + hd, *rest = A + hd;
    float M = 0.0f, L = 0.0f;
    int k = 0;
    for (; k * KV_ATTN_PART < end; k++) {
        const int p1 = (k + 1) * KV_ATTN_PART < end ? (k + 1) * KV_ATTN_PART : end;
        float m, l;
        attn_range(g, bt, k * KV_ATTN_PART, p1, kvh, q, scale, &m, &l, acc, rest);
        kv_attn_fold(&M, &L, A, m, l, acc, hd, k == 0);
    }
    if (own) kv_attn_fold(&M, &L, A, own[hd], own[hd + 1], own, hd, k == 0);
    kv_attn_finish(A, L, hd, out);
}

void kv_attn_ref(const kv_geom *g, const int32_t *bt, int pos0, int n_q, const float *q, int n_head, int h0,
                 int h1, float scale, const float *own, float *out, float *scratch, int32_t next,
                 int next_kvh) {
    (void)next, (void)next_kvh; /* a hint: the reference asks for nothing */
    const int ratio = n_head / g->n_head_kv, bs = g->block_size;
    const size_t hd = (size_t)g->head_dim;
    for (int i = 0; i < n_q; i++) {
        const int pos = pos0 + i, end = own ? pos - pos % bs : pos + 1;
        for (int h = h0; h < h1; h++) {
            const size_t off = ((size_t)i * (size_t)n_head + (size_t)h) * hd;
            const float *r = own ? own + ((size_t)i * (size_t)n_head + (size_t)h) * KV_PART_REC(hd) : NULL;
            attn_one(g, bt, end, h / ratio, q + off, scale, r, out + off, scratch);
        }
    }
}

void kv_attn_part_ref(const kv_geom *g, const int32_t *bt, int end, int part, const float *q, int n_head,
                      int h0, int h1, float scale, float *part_out, float *scratch) {
    const int ratio = n_head / g->n_head_kv, hd = g->head_dim;
    const int p1 = (part + 1) * KV_ATTN_PART < end ? (part + 1) * KV_ATTN_PART : end;
    for (int h = h0; h < h1; h++) {
        float *r = part_out + (size_t)(h - h0) * KV_PART_REC(hd);
        attn_range(g, bt, part * KV_ATTN_PART, p1, h / ratio, q + (size_t)h * (size_t)hd, scale, &r[hd],
                   &r[hd + 1], r, scratch);
    }
}

void kv_attn_own_ref(const kv_geom *g, const int32_t *bt, int pos, const float *q, int n_head, int h0, int h1,
                     float scale, float *rec, float *scratch, int32_t next, int next_kvh) {
    (void)next, (void)next_kvh;
    const int ratio = n_head / g->n_head_kv, hd = g->head_dim;
    for (int h = h0; h < h1; h++) {
        float *r = rec + (size_t)(h - h0) * KV_PART_REC(hd);
        attn_range(g, bt, pos - pos % g->block_size, pos + 1, h / ratio, q + (size_t)h * (size_t)hd, scale,
                   &r[hd], &r[hd + 1], r, scratch);
    }
}
