/* The x86 attention body over the paged KV cache (see src/kernels/attn_ref.c for
 * the definition), shared by kvattn_avx2.c and kvattn_avx512.c. Each of those
 * files defines, before including this one:
 *   KFN(name)            the exported name, e.g. name##_avx2
 *   vf, VL               the float vector type and its lanes (8 or 16)
 *   AI                   static inline, always inlined
 *   vf_load/vf_store     unaligned VL floats
 *   vf_set1, vf_zero, vf_add, vf_sub, vf_mul, vf_max, vf_fmadd (a * b + c)
 *   vf_hsum, vf_hmax     horizontal sum and max to a float
 *   vf_exp_neg(x)        exp(x) for x <= 0 (scores minus their max); 0 below
 *                        -87, where expf is subnormal or zero anyway, and for
 *                        -inf (padding)
 *   vf_load_kv(row, c, type)  VL elements at c of a row of the KV type as
 *                        floats (int8 unscaled)
 *   vf_store_f16(y, v)   VL halves, round-to-nearest-even
 * and is compiled with its own target flags, so the same source becomes both
 * kernels. Differences from the reference, all for decode speed:
 *  - up to KV_ATTN_TILE query heads that share a KV head run together, so each
 *    K and V row of a block is loaded (and dequantized) once for all of them;
 *  - K rows are dotted VL lanes at a time, V rows accumulated VL dims at a
 *    time with the accumulators in registers across a block's rows;
 *  - int8 scales are applied once per row (per token: to the score and to the
 *    softmax weight) or once per block (per head, one scale per channel: the
 *    K scales multiply the query, the V scales the block's weighted V sum);
 *  - exp is a polynomial (Cephes expf, ~2 ulp) over VL scores at a time.
 * Every head's arithmetic is the same whatever the tile it is in, so results
 * do not depend on how callers split heads over threads. head_dim % VL == 0. */
#if !defined(KFN) || !defined(VL)
#error "define KFN, VL, vf and the vf_ operations before including kvattn_body.h"
#endif

#include <math.h>
#include <stdbool.h>

#include "kernels/kernels_ref.h"

/* Rows (or dim chunks) processed at once for a tile of T heads: enough
 * independent FMA chains to hide the FMA latency within AVX2's 16 registers. */
#define KV_ROWS(T) ((T) == 1 ? 8 : (T) == 2 ? 4 : 2)

/* Scores of rows [j0, j0+R) of a block for T heads: s[t*bs + j]. ks: the
 * per-token int8 scales, NULL otherwise (per-channel scales are already in q).
 * Each (row, head) is its own chain in the same order whatever R and T are. */
AI void dot_rows(const uint8_t *K, size_t row_bytes, int j0, int hd, const float *const *q, const float *ks,
                 float scale, float *s, int bs, const int R, const int T, const tk_kv_type type) {
    vf d[8][KV_ATTN_TILE];
#pragma GCC unroll 8
    for (int r = 0; r < R; r++)
#pragma GCC unroll 4
        for (int t = 0; t < T; t++) d[r][t] = vf_zero();
    for (int c = 0; c < hd; c += VL) {
        vf qv[KV_ATTN_TILE];
#pragma GCC unroll 4
        for (int t = 0; t < T; t++) qv[t] = vf_load(q[t] + c);
#pragma GCC unroll 8
        for (int r = 0; r < R; r++) {
            const vf k = vf_load_kv(K + (size_t)(j0 + r) * row_bytes, c, type);
#pragma GCC unroll 4
            for (int t = 0; t < T; t++) d[r][t] = vf_fmadd(qv[t], k, d[r][t]);
        }
    }
#pragma GCC unroll 8
    for (int r = 0; r < R; r++)
#pragma GCC unroll 4
        for (int t = 0; t < T; t++) {
            float x = vf_hsum(d[r][t]);
            if (ks) x *= ks[j0 + r];
            s[t * bs + j0 + r] = x * scale;
        }
}

/* acc[t*hd + c..] = acc * corr[t] + vs[c..] * sum_j w[t*bs + j] * V_j[c..] for
 * C chunks of VL dims from c (vs: the per-channel int8 scales; NULL means 1);
 * each (chunk, head) is its own chain, rows in order. */
AI void acc_rows(const uint8_t *V, size_t row_bytes, int n, int c, int hd, const float *corr, const float *w,
                 int bs, float *acc, const float *vs, const int C, const int T, const tk_kv_type type) {
    vf a[8][KV_ATTN_TILE];
#pragma GCC unroll 8
    for (int u = 0; u < C; u++)
#pragma GCC unroll 4
        for (int t = 0; t < T; t++)
            a[u][t] = vs ? vf_zero() : vf_mul(vf_load(acc + t * hd + c + VL * u), vf_set1(corr[t]));
    for (int j = 0; j < n; j++) {
        vf wv[KV_ATTN_TILE];
#pragma GCC unroll 4
        for (int t = 0; t < T; t++) wv[t] = vf_set1(w[t * bs + j]);
        const uint8_t *vr = V + (size_t)j * row_bytes;
#pragma GCC unroll 8
        for (int u = 0; u < C; u++) {
            const vf v = vf_load_kv(vr, c + VL * u, type);
#pragma GCC unroll 4
            for (int t = 0; t < T; t++) a[u][t] = vf_fmadd(wv[t], v, a[u][t]);
        }
    }
#pragma GCC unroll 8
    for (int u = 0; u < C; u++)
#pragma GCC unroll 4
        for (int t = 0; t < T; t++) {
            float *p = acc + t * hd + c + VL * u;
            vf r = a[u][t];
            if (vs) r = vf_fmadd(r, vf_load(vs + c + VL * u), vf_mul(vf_load(p), vf_set1(corr[t])));
            vf_store(p, r);
        }
}

/* Running softmax state of a tile: per head t, scores/weights s[t*bs + j],
 * weighted V sum acc[t*hd + c], running max m[t] and sum l[t], and the query
 * times the block's per-channel K scales qs[t*hd + c] (int8 per head). */
typedef struct tile_state {
    float *s, *acc, *m, *l, *qs;
} tile_state;

/* One block (n valid rows) for T heads whose queries are q[t]. */
AI void tile_block(const kv_geom *g, int32_t blk, int kvh, int n, const float *const *q, float scale,
                   const tile_state *st, const int T, const tk_kv_type type) {
    const int hd = g->head_dim, bs = g->block_size;
    const size_t row_bytes = (size_t)hd * kv_type_size(type);
    const bool per_tok = type == TK_KV_INT8 && g->scale == TK_KV_SCALE_TOKEN;
    const bool per_chan = type == TK_KV_INT8 && g->scale != TK_KV_SCALE_TOKEN;
    const uint8_t *K = kv_geom_k(g, blk, kvh), *V = kv_geom_v(g, blk, kvh);
    const float *ks = kv_geom_ks(g, blk, kvh), *vs = kv_geom_vs(g, blk, kvh);

    /* Per-channel K scales: score = sum_c (q_c * ks_c) * k_c, so scale q once. */
    const float *qk[KV_ATTN_TILE];
    for (int t = 0; t < T; t++) {
        qk[t] = q[t];
        if (per_chan) {
            float *qs = st->qs + (size_t)t * hd;
            for (int c = 0; c < hd; c += VL) vf_store(qs + c, vf_mul(vf_load(q[t] + c), vf_load(ks + c)));
            qk[t] = qs;
        }
    }

    /* Rows in groups of R, so R*T dot products run as independent chains. */
    const float *ks_tok = per_tok ? ks : NULL;
    const int R = KV_ROWS(T);
    int j0 = 0;
    for (; j0 + R <= n; j0 += R) dot_rows(K, row_bytes, j0, hd, qk, ks_tok, scale, st->s, bs, R, T, type);
    for (; j0 < n; j0++) dot_rows(K, row_bytes, j0, hd, qk, ks_tok, scale, st->s, bs, 1, T, type);
    /* Pad to whole vectors with -inf: exp gives 0 and max ignores them. */
    const int nv = (n + VL - 1) / VL * VL;
    for (int t = 0; t < T; t++)
        for (int j = n; j < nv; j++) st->s[t * bs + j] = -INFINITY;

    float corr[KV_ATTN_TILE];
    for (int t = 0; t < T; t++) {
        float *s = st->s + t * bs;
        vf mx = vf_set1(-INFINITY);
        for (int j = 0; j < nv; j += VL) mx = vf_max(mx, vf_load(s + j));
        const float m_new = fmaxf(st->m[t], vf_hmax(mx));
        corr[t] = expf(st->m[t] - m_new);
        st->m[t] = m_new;
        const vf mv = vf_set1(m_new);
        vf sum = vf_zero();
        for (int j = 0; j < nv; j += VL) {
            const vf p = vf_exp_neg(vf_sub(vf_load(s + j), mv));
            sum = vf_add(sum, p);
            /* int8 per token: fold the V scale into the weight (the padding's
             * weights are never read) */
            vf_store(s + j, per_tok ? vf_mul(p, vf_load(vs + j)) : p);
        }
        st->l[t] = st->l[t] * corr[t] + vf_hsum(sum);
    }

    /* C chunks of VL dims at a time, so C*T accumulations run as independent chains. */
    const float *vs_chan = per_chan ? vs : NULL;
    const int C = KV_ROWS(T);
    int c = 0;
    for (; c + VL * C <= hd; c += VL * C)
        acc_rows(V, row_bytes, n, c, hd, corr, st->s, bs, st->acc, vs_chan, C, T, type);
    for (; c < hd; c += VL) acc_rows(V, row_bytes, n, c, hd, corr, st->s, bs, st->acc, vs_chan, 1, T, type);
}

/* T heads sharing kv head kvh, one query position, context length len.
 * scratch: kv_attn_scratch_need floats, laid out as tile_state. */
AI void tile_run(const kv_geom *g, const int32_t *bt, int len, int kvh, const float *q, int hd, float scale,
                 float *out, float *scratch, const int T, const tk_kv_type type) {
    const int bs = g->block_size;
    tile_state st = {.s = scratch, .acc = scratch + (size_t)KV_ATTN_TILE * bs};
    st.m = st.acc + (size_t)KV_ATTN_TILE * hd;
    st.l = st.m + KV_ATTN_TILE;
    st.qs = st.l + KV_ATTN_TILE;
    const float *qt[KV_ATTN_TILE];
    for (int t = 0; t < T; t++) {
        qt[t] = q + (size_t)t * hd;
        st.m[t] = -INFINITY;
        st.l[t] = 0.0f;
        for (int c = 0; c < hd; c++) st.acc[t * hd + c] = 0.0f;
    }
    for (int b = 0; b * bs < len; b++) {
        const int n = len - b * bs < bs ? len - b * bs : bs;
        tile_block(g, bt[b], kvh, n, qt, scale, &st, T, type);
    }
    for (int t = 0; t < T; t++) {
        const vf inv = vf_set1(1.0f / st.l[t]);
        for (int c = 0; c < hd; c += VL)
            vf_store(out + (size_t)t * hd + c, vf_mul(vf_load(st.acc + t * hd + c), inv));
    }
}

/* One instance per KV type (a compile-time constant in each), each with the
 * tile sizes unrolled. */
#define TILE_ARGS g, bt, len, kvh, q, hd, scale, out, scratch
AI void tile_sizes(const kv_geom *g, const int32_t *bt, int len, int kvh, const float *q, int hd, float scale,
                   float *out, float *scratch, int T, const tk_kv_type type) {
    switch (T) {
    case 1:
        tile_run(TILE_ARGS, 1, type);
        break;
    case 2:
        tile_run(TILE_ARGS, 2, type);
        break;
    case 3:
        tile_run(TILE_ARGS, 3, type);
        break;
    default:
        tile_run(TILE_ARGS, 4, type);
        break;
    }
}

typedef void (*tile_fn)(const kv_geom *g, const int32_t *bt, int len, int kvh, const float *q, int hd,
                        float scale, float *out, float *scratch, int T);
static void tile_f32(const kv_geom *g, const int32_t *bt, int len, int kvh, const float *q, int hd,
                     float scale, float *out, float *scratch, int T) {
    tile_sizes(TILE_ARGS, T, TK_KV_F32);
}
static void tile_f16(const kv_geom *g, const int32_t *bt, int len, int kvh, const float *q, int hd,
                     float scale, float *out, float *scratch, int T) {
    tile_sizes(TILE_ARGS, T, TK_KV_F16);
}
static void tile_bf16(const kv_geom *g, const int32_t *bt, int len, int kvh, const float *q, int hd,
                      float scale, float *out, float *scratch, int T) {
    tile_sizes(TILE_ARGS, T, TK_KV_BF16);
}
static void tile_int8(const kv_geom *g, const int32_t *bt, int len, int kvh, const float *q, int hd,
                      float scale, float *out, float *scratch, int T) {
    tile_sizes(TILE_ARGS, T, TK_KV_INT8);
}
#undef TILE_ARGS

void KFN(kv_attn)(const kv_geom *g, const int32_t *bt, int pos0, int n_q, const float *q, int n_head, int h0,
                  int h1, float scale, float *out, float *scratch) {
    const tile_fn fn = g->type == TK_KV_F32    ? tile_f32
                       : g->type == TK_KV_F16  ? tile_f16
                       : g->type == TK_KV_BF16 ? tile_bf16
                                               : tile_int8;
    const int ratio = n_head / g->n_head_kv, hd = g->head_dim;
    for (int i = 0; i < n_q; i++) {
        for (int h = h0; h < h1;) {
            const int kvh = h / ratio;
            const int group_end = (kvh + 1) * ratio < h1 ? (kvh + 1) * ratio : h1;
            const int T = group_end - h < KV_ATTN_TILE ? group_end - h : KV_ATTN_TILE;
            const size_t off = ((size_t)i * (size_t)n_head + (size_t)h) * (size_t)hd;
            fn(g, bt, pos0 + i + 1, kvh, q + off, hd, scale, out + off, scratch, T);
            h += T;
        }
    }
}

void KFN(kv_to_f16)(const float *x, tk_f16 *y, int n) {
    int i = 0;
    for (; i + VL <= n; i += VL) vf_store_f16(y + i, vf_load(x + i));
    kv_to_f16_ref(x + i, y + i, n - i);
}
