/* The x86 attention body over the paged KV cache (see src/kernels/attn_ref.c for
 * the definition), shared by kvattn_avx2.c and kvattn_avx512.c. Each of those
 * files defines, before including this one:
 *   KFN(name)            the exported name, e.g. name##_avx2
 *   vf, VL               the float vector type and its lanes (8 or 16)
 *   AI                   static inline, always inlined
 *   vf_load/vf_store     unaligned VL floats
 *   vf_set1, vf_zero, vf_add, vf_sub, vf_mul, vf_max, vf_fmadd (a * b + c)
 *   vf_hsum, vf_hmax     horizontal sum and max to a float
 *   vf_hsum_n(d, n, out) out[i] = the sum of d[i]'s lanes for i < n <= VL,
 *                        each in the same order whatever n and i (a
 *                        transposing tree: ~3 operations per vector, not ~10)
 *   vf_exp_neg(x)        exp(x) for x <= 0 (scores minus their max); 0 below
 *                        -87, where expf is subnormal or zero anyway, and for
 *                        -inf (padding)
 *   vf_load_kv(row, c, type)  VL elements at c of a row of the KV type as
 *                        floats (int8 unscaled)
 *   vf_store_f16(y, v)   VL halves, round-to-nearest-even
 *   vf_abs, vf_div       |a|, a / b
 *   vf_store_i8(y, v)    VL int8s: v rounded to nearest (ties to even),
 *                        clamped to [-127, 127], NaN to 0
 *   vf_any_gt(a, b)      whether some lane has a > b
 *   vf_pos_or_zero(s, v) v where s > 0, else 0
 * A level with int8 dot products by vpdpbusd (kv_geom.q8: the avx512 and
 * avxvnni levels) also defines KV_Q8 and
 *   vq, vq_zero          a vector of VL int32 sums
 *   vq_load_k(row, c, hd) 4 * VL int8s of a K row from c as unsigned (+128),
 *                        zeros past hd
 *   vq_dot(acc, k, q8)   acc + the sums of 4 adjacent products k * q8 (4 * VL
 *                        int8s of the query), lane by lane
 *   vq_to_f(v)           the sums as floats
 *   vq_off(q, n)         what the unsigned K adds to a whole dot product
 *                        with the n int8s of the query q (n % 64 == 0): 128
 *                        times their sum, as a float
 *   vq_load_k4(p)        the 4 * VL int8s at p as unsigned (+128)
 *   vq_dot4(acc, k, q4)  acc + the sums of 4 adjacent products k * the 4
 *                        int8s at q4 (the same 4 in every lane), lane by lane
 * A level may also define KV_SCORES_V and store_scores_v (store_scores for a
 * whole group, R * P == VL, from the dot products' vectors: the same bits).
 * and is compiled with its own target flags, so the same source becomes both
 * kernels. Differences from the reference, all for speed:
 *  - work goes in tiles of up to KV_ATTN_TILE (query, head) pairs that read
 *    the same KV head: the query heads of a GQA group, and for a prefill chunk
 *    several of its query tokens too. Each K and V row of a block is loaded
 *    (and dequantized) once per tile, not once per query head and token; a
 *    pair whose context ends inside (or before) a block sees its later rows
 *    as -inf scores, which is the causal mask;
 *  - K rows are dotted VL lanes at a time, R rows x P pairs as independent
 *    chains, reduced VL at a time by vf_hsum_n; V rows accumulated VL dims at
 *    a time with the accumulators in registers across a block's rows;
 *  - int8 scales are applied once per row (per token: to the score and to the
 *    softmax weight) or once per block (per head, one scale per channel: the
 *    K scales multiply the query, the V scales the block's weighted V sum);
 *  - exp is a polynomial (Cephes expf, ~2 ulp) over VL scores at a time.
 * Every pair's arithmetic is the same whatever tile it is in and whatever
 * else the tile holds (a masked row adds 0 * V and a block past a pair's
 * context rescales by exp(0) = 1, both exact), so results do not depend on
 * how callers split heads over threads, nor on whether a query is decoded
 * alone or inside a prefill chunk. head_dim % VL == 0. */
#if !defined(KFN) || !defined(VL)
#error "define KFN, VL, vf and the vf_ operations before including kvattn_body.h"
#endif

#include <math.h>
#include <stdbool.h>

#include "kernels/kernels_ref.h"

/* Rows (or dim chunks) processed at once for a tile of P pairs: VL
 * accumulators in all, enough independent FMA chains to hide the FMA latency
 * within the registers (16 for AVX2, 32 for AVX-512), and one vf_hsum_n. */
#define KV_ROWS(P) ((P) >= VL ? 1 : VL / (P))

/* One tile: P pairs, each with its query q[p], its output out[p] and its
 * context length len[p] (positions [0, len[p]) of the sequence). */
typedef struct tile_pairs {
    const float *q[KV_ATTN_TILE];
    float *out[KV_ATTN_TILE];
    int len[KV_ATTN_TILE];
    const float *own[KV_ATTN_TILE]; /* the pair's own-block record, folded last (NULL: none) */
    const uint8_t *kn, *vn; /* KV_PART_OWN: the K and V read next (V asked for only where K is by rows) */
    int32_t nblk;           /* else: the block and kv head read after this tile's context */
    int nkvh;               /* (nkvh past the last kv head: nothing), set by run_heads */
} tile_pairs;

/* tile_run's part for own-block records (kv_attn_own_fn). */
#define KV_PART_OWN (-2)

/* s[p*bs + j0 + r] from the dot products x[r*P + p]: (x - off[p]) * mul[p]
 * (off, mul NULL: x itself), times the row's per-token scale ks[j0 + r] (ks
 * NULL: none) and the attention scale. */
AI void store_scores(const float *x, const float *off, const float *mul, const float *ks, float scale,
                     float *s, int bs, int j0, const int R, const int P) {
#pragma GCC unroll 16
    for (int r = 0; r < R; r++)
#pragma GCC unroll 8
        for (int p = 0; p < P; p++) {
            float y = x[r * P + p];
            if (off) y = (y - off[p]) * mul[p];
            if (ks) y *= ks[j0 + r];
            s[p * bs + j0 + r] = y * scale;
        }
}

/* store_scores from the group's R*P dot products as vectors d (each one's
 * lanes sum to its dot): whole groups through the level's store_scores_v
 * where it has one, else reduced by vf_hsum_n first. The same bits either
 * way. */
AI void put_scores(const vf *d, const float *off, const float *mul, const float *ks, float scale, float *s,
                   int bs, int j0, const int R, const int P) {
#ifdef KV_SCORES_V
    if (R * P == VL) {
        store_scores_v(d, off, mul, ks, scale, s, bs, j0, R, P);
        return;
    }
#endif
    float x[VL];
    vf_hsum_n(d, R * P, x);
    store_scores(x, off, mul, ks, scale, s, bs, j0, R, P);
}

/* Scores of rows [j0, j0+R) of a block for P pairs: s[p*bs + j]. ks: the
 * per-token int8 scales, NULL otherwise (per-channel scales are already in q).
 * Each (row, pair) is its own chain in the same order whatever R and P are. */
AI void dot_rows(const uint8_t *K, size_t row_bytes, int j0, int hd, const float *const *q, const float *ks,
                 float scale, float *s, int bs, const int R, const int P, const tk_kv_type type) {
    vf d[VL];
#pragma GCC unroll 16
    for (int i = 0; i < R * P; i++) d[i] = vf_zero();
    for (int c = 0; c < hd; c += VL) {
#pragma GCC unroll 16
        for (int r = 0; r < R; r++) {
            const vf k = vf_load_kv(K + (size_t)(j0 + r) * row_bytes, c, type);
#pragma GCC unroll 8
            for (int p = 0; p < P; p++) d[r * P + p] = vf_fmadd(vf_load(q[p] + c), k, d[r * P + p]);
        }
    }
    put_scores(d, NULL, NULL, ks, scale, s, bs, j0, R, P);
}

/* Scores of positions [j0, j0 + U*VL) of a float type's K (stored by
 * columns: kv_k_index) for P pairs, s[p*bs + j]: per channel c, one load of
 * VL positions and P multiply-adds with the pairs' queries qt[c*P + p]
 * (transposed, so one pointer reads them all). Each score is one chain over
 * the channels in order, whatever U and P are, and nothing is reduced across
 * lanes. j0 % VL == 0; positions past the block's rows in use are computed
 * from whatever the slots hold and masked by the caller. pf, pf_bytes: a span
 * to ask the cache for, spread over the channels (NULL: none). */
AI void dot_cols(const uint8_t *K, int j0, int hd, const float *qt, float scale, float *s, int bs,
                 const uint8_t *pf, size_t pf_bytes, const int U, const int P, const tk_kv_type type) {
    const size_t es = kv_type_size(type);
    const uint8_t *col[VL];
#pragma GCC unroll 16
    for (int u = 0; u < U; u++) {
        const int j = j0 + u * VL;
        col[u] = K + kv_k_index(hd, j, 0) * es;
    }
    vf d[VL];
#pragma GCC unroll 16
    for (int i = 0; i < U * P; i++) d[i] = vf_zero();
    /* line li of the span is asked for by channel c once li * hd < lines * (c + 1) */
    const size_t lines = pf ? (pf_bytes + 63) / 64 : 0;
    size_t li = 0;
    for (int c = 0; c < hd; c++) {
        for (; li * (size_t)hd < lines * (size_t)(c + 1); li++) __builtin_prefetch(pf + 64 * li, 0, 3);
#pragma GCC unroll 16
        for (int u = 0; u < U; u++) {
            const vf k = vf_load_kv(col[u] + (size_t)c * KV_KT * es, 0, type);
#pragma GCC unroll 8
            for (int p = 0; p < P; p++) d[u * P + p] = vf_fmadd(vf_set1(qt[c * P + p]), k, d[u * P + p]);
        }
    }
    const vf sc = vf_set1(scale);
#pragma GCC unroll 16
    for (int u = 0; u < U; u++)
#pragma GCC unroll 8
        for (int p = 0; p < P; p++) vf_store(s + p * bs + j0 + u * VL, vf_mul(d[u * P + p], sc));
}

#ifdef KV_Q8
/* Scores of rows [j0, j0+R) of an int8 block against P int8 queries (q8: P
 * rows of KV_Q8_BYTES(hd), scales qmul[p], and vq_off of each, which the
 * unsigned K rows add): the integer dot products are exact, and
 * so are their float sums (below 2^24 for head_dim <= 512), so the scores
 * are the reference's bits (kv_attn_ref, kv_geom.q8). */
AI void dot_rows_q8(const uint8_t *K, size_t row_bytes, int j0, int hd, const int8_t *q8, const float *qmul,
                    const float *qoff, const float *ks, float scale, float *s, int bs, const int R,
                    const int P) {
    const size_t qb = KV_Q8_BYTES(hd);
    vq d[VL];
#pragma GCC unroll 16
    for (int i = 0; i < R * P; i++) d[i] = vq_zero();
    for (int c = 0; c < hd; c += 4 * VL) {
#pragma GCC unroll 16
        for (int r = 0; r < R; r++) {
            const vq k = vq_load_k(K + (size_t)(j0 + r) * row_bytes, c, hd);
#pragma GCC unroll 8
            for (int p = 0; p < P; p++) d[r * P + p] = vq_dot(d[r * P + p], k, q8 + (size_t)p * qb + c);
        }
    }
    vf f[VL];
#pragma GCC unroll 16
    for (int i = 0; i < R * P; i++) f[i] = vq_to_f(d[i]);
    put_scores(f, qoff, qmul, ks, scale, s, bs, j0, R, P);
}

/* dot_cols for int8 K stored by columns (kv_k8_index) against P int8
 * queries (as dot_rows_q8): per 4 channels, one load of VL positions' 4
 * bytes each and P vq_dot4 with the pairs' 4 query bytes. The integer dots
 * are exact, and each score then takes the same float operations as
 * store_scores', so the scores are dot_rows_q8's (the reference's) bits. j0
 * % VL == 0; positions past the block's rows in use are masked by the
 * caller. pf, pf_bytes: as dot_cols. */
AI void dot_cols_q8(const uint8_t *K, int j0, int hd, const int8_t *q8, const float *qmul, const float *qoff,
                    const float *ks, float scale, float *s, int bs, const uint8_t *pf, size_t pf_bytes,
                    const int U, const int P) {
    const size_t qb = KV_Q8_BYTES(hd);
    const uint8_t *col[VL];
#pragma GCC unroll 16
    for (int u = 0; u < U; u++) col[u] = K + kv_k8_index(hd, j0 + u * VL, 0);
    vq d[VL];
#pragma GCC unroll 16
    for (int i = 0; i < U * P; i++) d[i] = vq_zero();
    const size_t lines = pf ? (pf_bytes + 63) / 64 : 0;
    size_t li = 0;
    for (int c = 0; c < hd; c += 4) {
        for (; li * (size_t)hd < lines * (size_t)(c + 4); li++) __builtin_prefetch(pf + 64 * li, 0, 3);
#pragma GCC unroll 16
        for (int u = 0; u < U; u++) {
            const vq k = vq_load_k4(col[u] + (size_t)c * KV_KT);
#pragma GCC unroll 8
            for (int p = 0; p < P; p++) d[u * P + p] = vq_dot4(d[u * P + p], k, q8 + (size_t)p * qb + c);
        }
    }
    const vf sc = vf_set1(scale);
#pragma GCC unroll 16
    for (int u = 0; u < U; u++)
#pragma GCC unroll 8
        for (int p = 0; p < P; p++) {
            vf y = vf_mul(vf_sub(vq_to_f(d[u * P + p]), vf_set1(qoff[p])), vf_set1(qmul[p]));
            if (ks) y = vf_mul(y, vf_load(ks + j0 + u * VL));
            vf_store(s + p * bs + j0 + u * VL, vf_mul(y, sc));
        }
}

/* The int8 query of pair p for one block (attn_ref.c's query_q8): qk rounded
 * at max|qk| / 127 into q8 (zeros up to KV_Q8_BYTES), its scale and what the
 * unsigned K adds to its dot products (vq_off). */
AI void query_q8(const float *qk, int hd, int8_t *q8, float *qmul, float *qoff) {
    vf a = vf_zero();
    for (int c = 0; c < hd; c += VL) a = vf_max(vf_abs(vf_load(qk + c)), a);
    const float m = vf_hmax(a);
    const vf inv = vf_set1(m > 0.0f ? 127.0f / m : 0.0f);
    for (int c = 0; c < hd; c += VL) vf_store_i8(q8 + c, vf_mul(vf_load(qk + c), inv));
    for (size_t c = (size_t)hd; c < KV_Q8_BYTES(hd); c++) q8[c] = 0;
    *qmul = m / 127.0f;
    *qoff = vq_off(q8, KV_Q8_BYTES(hd));
}
#endif

/* Asks for bytes [0, n) from p into the cache, a line at a time. */
AI void prefetch_span(const uint8_t *p, size_t n) {
    for (size_t o = 0; o < n; o += 64) __builtin_prefetch(p + o, 0, 3);
}

/* acc[p*hd + c..] = acc * corr[p] + vs[c..] * sum_j w[p*bs + j] * V_j[c..] for
 * C chunks of VL dims from c (vs: the per-channel int8 scales; NULL means 1);
 * each (chunk, pair) is its own chain, rows in order. pf: NULL, or the K read
 * next, asked for in the order its tile will read it (kv_k_walk: row_bytes of
 * it per V row). */
AI void acc_rows(const uint8_t *V, size_t row_bytes, int n, int c, int hd, const float *corr, const float *w,
                 int bs, float *acc, const float *vs, const uint8_t *pf, kv_k_walk *kw, const int C,
                 const int P, const tk_kv_type type) {
    vf a[VL];
#pragma GCC unroll 16
    for (int u = 0; u < C; u++)
#pragma GCC unroll 8
        for (int p = 0; p < P; p++)
            a[u * P + p] = vs ? vf_zero() : vf_mul(vf_load(acc + p * hd + c + VL * u), vf_set1(corr[p]));
    for (int j = 0; j < n; j++) {
        const uint8_t *vr = V + (size_t)j * row_bytes;
        /* the lines of the next K that start in this row's share of it */
        if (pf)
            for (size_t o = ((size_t)j * row_bytes + 63) / 64 * 64; o < (size_t)(j + 1) * row_bytes; o += 64)
                __builtin_prefetch(pf + 64 * kv_k_walk_next(kw), 0, 3);
#pragma GCC unroll 16
        for (int u = 0; u < C; u++) {
            const vf v = vf_load_kv(vr, c + VL * u, type);
#pragma GCC unroll 8
            for (int p = 0; p < P; p++) a[u * P + p] = vf_fmadd(vf_set1(w[p * bs + j]), v, a[u * P + p]);
        }
    }
#pragma GCC unroll 16
    for (int u = 0; u < C; u++)
#pragma GCC unroll 8
        for (int p = 0; p < P; p++) {
            float *o = acc + p * hd + c + VL * u;
            vf r = a[u * P + p];
            if (vs) r = vf_fmadd(r, vf_load(vs + c + VL * u), vf_mul(vf_load(o), vf_set1(corr[p])));
            vf_store(o, r);
        }
}

/* Running softmax state of a tile: per pair p, scores/weights s[p*bs + j],
 * weighted V sum acc[p*hd + c], running max m[p] and sum l[p], and the query
 * times the block's per-channel K scales qs[p*hd + c] (int8 per head). */
typedef struct tile_state {
    float *s, *acc, *m, *l, *qs;
    int8_t *q8;         /* [P][KV_Q8_BYTES(hd)] int8 queries (kv_geom.q8) */
    float *qmul, *qoff; /* [P] their scales and 128 * their sums (vq_off) */
} tile_state;

/* Block b of the context (block id blk) for P pairs; n: the rows any pair
 * reads, n[p] = len[p] - b*bs clamped to [0, bs] each pair's own. */
AI void tile_block(const kv_geom *g, int32_t blk, const uint8_t *Kn, const uint8_t *Vn, const float *KSn,
                   int kvh, int b, int n, const tile_pairs *tp, float scale, const tile_state *st,
                   const int P, const tk_kv_type type) {
    const int hd = g->head_dim, bs = g->block_size;
    const size_t row_bytes = (size_t)hd * kv_type_size(type);
    const bool per_tok = type == TK_KV_INT8 && g->scale == TK_KV_SCALE_TOKEN;
    const bool per_chan = type == TK_KV_INT8 && g->scale != TK_KV_SCALE_TOKEN;
    const uint8_t *K = kv_geom_k(g, blk, kvh), *V = kv_geom_v(g, blk, kvh);
    const float *ks = kv_geom_ks(g, blk, kvh), *vs = kv_geom_vs(g, blk, kvh);
    /* the block's V scales are read after its K rows, the next block's K
     * scales first thing: ask for both now (int8 only) */
    const size_t sc_bytes = (size_t)kv_scales_per_head(g) * sizeof(float);
    if (vs) prefetch_span((const uint8_t *)vs, sc_bytes);
    if (KSn) prefetch_span((const uint8_t *)KSn, sc_bytes);

    /* Per-channel K scales: score = sum_c (q_c * ks_c) * k_c, so scale q once. */
    const float *qk[KV_ATTN_TILE];
    for (int p = 0; p < P; p++) {
        qk[p] = tp->q[p];
        if (per_chan) {
            float *qs = st->qs + (size_t)p * hd;
            for (int c = 0; c < hd; c += VL) vf_store(qs + c, vf_mul(vf_load(tp->q[p] + c), vf_load(ks + c)));
            qk[p] = qs;
        }
    }

    /* Rows in groups of R, so R*P dot products run as independent chains.
     * While a group's K rows are dotted, the same rows of this block's V
     * (read next) are asked for, and while V is summed, the next block's K:
     * blocks are scattered and a block's rows of one head span several
     * pages, which the hardware prefetcher does not cross, and asking in
     * both phases keeps reads in flight through the whole block. */
    const float *ks_tok = per_tok ? ks : NULL;
    const int R = KV_ROWS(P);
    int j0 = 0;
#define KV_PREFETCH(j, rows)                                                                                 \
    do {                                                                                                     \
        prefetch_span(V + (size_t)(j)*row_bytes, (size_t)(rows)*row_bytes);                                  \
        if (Vn) prefetch_span(Vn + (size_t)(j)*row_bytes, (size_t)(rows)*row_bytes);                         \
    } while (0)
/* Columns of U vectors of VL positions at a time (COLS(u): a loop over the
 * block's positions u * VL at a time), then a short block's rest in fewer. */
#define KV_COLS_FROM(U, COLS)                                                                                \
    do {                                                                                                     \
        COLS(U);                                                                                             \
        if ((U) > 8) COLS(8);                                                                                \
        if ((U) > 4) COLS(4);                                                                                \
        if ((U) > 2) COLS(2);                                                                                \
        if ((U) > 1) COLS(1);                                                                                \
    } while (0)
#ifdef KV_Q8
    if (type == TK_KV_INT8 && g->q8) {
        for (int p = 0; p < P; p++)
            query_q8(qk[p], hd, st->q8 + (size_t)p * KV_Q8_BYTES(hd), &st->qmul[p], &st->qoff[p]);
        if (kv_k_cols(type, true, bs)) {
            /* as the float types' columns below */
            const int U = KV_ROWS(P), nv = (n + VL - 1) / VL * VL;
#define KV_COLS8(u)                                                                                          \
    for (; j0 + (u)*VL <= nv; j0 += (u)*VL)                                                                  \
    dot_cols_q8(K, j0, hd, st->q8, st->qmul, st->qoff, ks_tok, scale, st->s, bs, V + (size_t)j0 * row_bytes, \
                (size_t)(u)*VL * row_bytes, u, P)
            KV_COLS_FROM(U, KV_COLS8);
#undef KV_COLS8
            j0 = n;
        }
        for (; j0 + R <= n; j0 += R) {
            KV_PREFETCH(j0, R);
            dot_rows_q8(K, row_bytes, j0, hd, st->q8, st->qmul, st->qoff, ks_tok, scale, st->s, bs, R, P);
        }
        for (; j0 < n; j0++)
            dot_rows_q8(K, row_bytes, j0, hd, st->q8, st->qmul, st->qoff, ks_tok, scale, st->s, bs, 1, P);
    }
#endif
    if (kv_k_cols(type, false, bs)) {
        /* U vectors of VL positions at a time, so U*P chains run at once; the
         * same positions of V asked for as they go */
        const int U = KV_ROWS(P), nv = (n + VL - 1) / VL * VL;
        const float *qt = st->qs; /* tile_run's transposed queries */
#define KV_COLS(u)                                                                                           \
    for (; j0 + (u)*VL <= nv; j0 += (u)*VL)                                                                  \
    dot_cols(K, j0, hd, qt, scale, st->s, bs, V + (size_t)j0 * row_bytes, (size_t)(u)*VL * row_bytes, u, P,  \
             type)
        KV_COLS_FROM(U, KV_COLS);
#undef KV_COLS
        j0 = n;
    }
    for (; j0 + R <= n; j0 += R) {
        KV_PREFETCH(j0, R);
        dot_rows(K, row_bytes, j0, hd, qk, ks_tok, scale, st->s, bs, R, P, type);
    }
#undef KV_PREFETCH
#undef KV_COLS_FROM
    for (; j0 < n; j0++) dot_rows(K, row_bytes, j0, hd, qk, ks_tok, scale, st->s, bs, 1, P, type);
    /* Mask each pair's rows past its context and pad to whole vectors with
     * -inf: exp gives 0 and max ignores them. */
    const int nv = (n + VL - 1) / VL * VL;
    for (int p = 0; p < P; p++) {
        const int np = tp->len[p] - b * bs;
        for (int j = np < 0 ? 0 : np < n ? np : n; j < nv; j++) st->s[p * bs + j] = -INFINITY;
    }

    float corr[KV_ATTN_TILE];
    for (int p = 0; p < P; p++) {
        float *s = st->s + p * bs;
        vf mx = vf_set1(-INFINITY);
        for (int j = 0; j < nv; j += VL) mx = vf_max(mx, vf_load(s + j));
        const float m_new = fmaxf(st->m[p], vf_hmax(mx));
        corr[p] = expf(st->m[p] - m_new);
        st->m[p] = m_new;
        const vf mv = vf_set1(m_new);
        vf sum = vf_zero();
        for (int j = 0; j < nv; j += VL) {
            const vf e = vf_exp_neg(vf_sub(vf_load(s + j), mv));
            sum = vf_add(sum, e);
            /* int8 per token: fold the V scale into the weight (the padding's
             * weights are never read) */
            vf_store(s + j, per_tok ? vf_mul(e, vf_load(vs + j)) : e);
        }
        st->l[p] = st->l[p] * corr[p] + vf_hsum(sum);
    }

    /* C chunks of VL dims at a time, so C*P accumulations run as independent chains. */
    const float *vs_chan = per_chan ? vs : NULL;
    const int C = KV_ROWS(P);
    /* the next block's K is asked for in the order its scores will read it:
     * by columns (dot_cols, dot_cols_q8) KV_ROWS(P) vectors of VL positions,
     * so KV_ROWS(P) VL / KV_KT groups of KV_KT at a time (at least one),
     * else front to back */
    const bool cols = kv_k_cols(type, g->q8, bs);
    const int set = KV_ROWS(P) * VL / KV_KT > 1 ? KV_ROWS(P) * VL / KV_KT : 1;
    kv_k_walk kw = cols ? kv_k_walk_start(set, (size_t)bs / KV_KT, kv_k_group_lines(type, hd))
                        : kv_k_walk_start(1, 1, ((size_t)bs * row_bytes + 63) / 64);
    int c = 0;
    for (; c + VL * C <= hd; c += VL * C)
        acc_rows(V, row_bytes, n, c, hd, corr, st->s, bs, st->acc, vs_chan, c == 0 ? Kn : NULL, &kw, C, P,
                 type);
    for (; c < hd; c += VL)
        acc_rows(V, row_bytes, n, c, hd, corr, st->s, bs, st->acc, vs_chan, c == 0 ? Kn : NULL, &kw, 1, P,
                 type);
}

/* st's m, l and acc start afresh for P pairs. */
AI void tile_reset(const tile_state *st, int hd, const int P) {
    for (int p = 0; p < P; p++) {
        st->m[p] = -INFINITY;
        st->l[p] = 0.0f;
        for (int c = 0; c < hd; c += VL) vf_store(st->acc + (size_t)p * hd + c, vf_zero());
    }
}

/* kv_attn_fold and kv_attn_finish (attn_ref.c) VL elements at a time: the
 * same operations on each element (a multiply, a multiply and an add, no
 * fused multiply-add), so the same bits. */
AI void fold_v(float *M, float *L, float *A, float m, float l, const float *acc, int hd, bool first) {
    if (first) {
        *M = m, *L = l;
        for (int c = 0; c < hd; c += VL) vf_store(A + c, vf_load(acc + c));
        return;
    }
    const float m_new = fmaxf(*M, m), a = expf(*M - m_new), b = expf(m - m_new);
    *L = *L * a + l * b;
    const vf av = vf_set1(a), bv = vf_set1(b);
    for (int c = 0; c < hd; c += VL)
        vf_store(A + c, vf_add(vf_mul(vf_load(A + c), av), vf_mul(vf_load(acc + c), bv)));
    *M = m_new;
}
AI void finish_v(const float *A, float L, int hd, float *out) {
    const vf inv = vf_set1(1.0f / L);
    for (int c = 0; c < hd; c += VL) vf_store(out + c, vf_mul(vf_load(A + c), inv));
}

/* P pairs that read kv head kvh. part < 0: the context of each pair up to
 * len[p], part by part, folded (kv_attn_fold) with its own-block record
 * last when it has one, and normalized into out[p]; part >= 0: only that
 * part, its record (KV_PART_REC: acc, m, l) into out[p]; KV_PART_OWN: the
 * record of the block holding position len[p] - 1 (the same for every pair),
 * its rows up to that position. scratch: kv_attn_scratch_need floats, laid
 * out as tile_state (s, acc, m, l, qs) then the folded M, L and A, then
 * qmul, qoff and q8. */
AI void tile_run(const kv_geom *g, const int32_t *bt, int kvh, const tile_pairs *tp, int part, float scale,
                 float *scratch, const int P, const tk_kv_type type) {
    const int bs = g->block_size, hd = g->head_dim;
    tile_state st = {.s = scratch, .acc = scratch + (size_t)KV_ATTN_TILE * bs};
    st.m = st.acc + (size_t)KV_ATTN_TILE * hd;
    st.l = st.m + KV_ATTN_TILE;
    st.qs = st.l + KV_ATTN_TILE;
    float *M = st.qs + (size_t)KV_ATTN_TILE * hd, *L = M + KV_ATTN_TILE, *A = L + KV_ATTN_TILE;
    st.qmul = A + (size_t)KV_ATTN_TILE * hd;
    st.qoff = st.qmul + KV_ATTN_TILE;
    st.q8 = (int8_t *)(st.qoff + KV_ATTN_TILE);
    /* a float type's scores read the queries transposed (dot_cols), once per
     * tile: qs is free for them (only int8 per head scales queries per block) */
    if (kv_k_cols(type, false, bs))
        for (int p = 0; p < P; p++)
            for (int c = 0; c < hd; c++) st.qs[c * P + p] = tp->q[p][c];
    int len = 0;
    for (int p = 0; p < P; p++)
        if (tp->len[p] > len) len = tp->len[p];
    /* the parts [k0, k1) to run: the one asked for, the own block as one
     * part, or all of them; tile_block is called from one place, so each
     * instance compiles it once */
    const bool own = part == KV_PART_OWN;
    const int k0 = part >= 0 ? part : 0;
    const int k1 = part >= 0 ? part + 1 : own ? 1 : (len + KV_ATTN_PART - 1) / KV_ATTN_PART;
    for (int k = k0; k < k1; k++) {
        /* blocks [b0, b1), positions up to end */
        const int end = own ? tp->len[0] : (k + 1) * KV_ATTN_PART < len ? (k + 1) * KV_ATTN_PART : len;
        const int b0 = own ? (end - 1) / bs : k * KV_ATTN_PART / bs, b1 = own ? b0 + 1 : (end + bs - 1) / bs;
        tile_reset(&st, hd, P);
        for (int b = b0; b < b1; b++) {
            const int n = end - b * bs < bs ? end - b * bs : bs;
            /* the K read next: the own block's caller's hint; else the next
             * block's (in the next part too), or after the context's last
             * block the one tp names */
            const uint8_t *Kn = tp->kn, *Vn = tp->vn;
            const float *KSn = NULL;
            if (!own) {
                const bool more = (b + 1) * bs < len;
                const int32_t nb = more ? bt[b + 1] : tp->nblk;
                const int nh = more ? kvh : tp->nkvh;
                Kn = nh < g->n_head_kv ? kv_geom_k(g, nb, nh) : NULL;
                Vn = NULL;
                KSn = nh < g->n_head_kv ? kv_geom_ks(g, nb, nh) : NULL;
            }
            tile_block(g, bt[b], Kn, Vn, KSn, kvh, b, n, tp, scale, &st, P, type);
        }
        if (part != -1) {
            /* one part's (or the own block's) record */
            for (int p = 0; p < P; p++) {
                for (int c = 0; c < hd; c += VL)
                    vf_store(tp->out[p] + c, vf_load(st.acc + (size_t)p * hd + c));
                tp->out[p][hd] = st.m[p];
                tp->out[p][hd + 1] = st.l[p];
            }
            return;
        }
        for (int p = 0; p < P; p++)
            if (tp->len[p] > k * KV_ATTN_PART)
                fold_v(&M[p], &L[p], A + (size_t)p * hd, st.m[p], st.l[p], st.acc + (size_t)p * hd, hd,
                       k == 0);
    }
    for (int p = 0; p < P; p++) {
        const float *r = tp->own[p];
        if (r) fold_v(&M[p], &L[p], A + (size_t)p * hd, r[hd], r[hd + 1], r, hd, tp->len[p] == 0);
        finish_v(A + (size_t)p * hd, L[p], hd, tp->out[p]);
    }
}

/* One instance per KV type (a compile-time constant in each), each with the
 * tile sizes unrolled. */
#define TILE_ARGS g, bt, kvh, tp, part, scale, scratch
AI void tile_sizes(const kv_geom *g, const int32_t *bt, int kvh, const tile_pairs *tp, int part, float scale,
                   float *scratch, int P, const tk_kv_type type) {
#define TILE_CASE(n)                                                                                         \
    case n:                                                                                                  \
        tile_run(TILE_ARGS, n, type);                                                                        \
        break;
    switch (P) {
        TILE_CASE(1)
        TILE_CASE(2)
        TILE_CASE(3)
        TILE_CASE(4)
        TILE_CASE(5)
        TILE_CASE(6)
        TILE_CASE(7)
    default:
        tile_run(TILE_ARGS, 8, type);
        break;
    }
#undef TILE_CASE
}

typedef void (*tile_fn)(const kv_geom *g, const int32_t *bt, int kvh, const tile_pairs *tp, int part,
                        float scale, float *scratch, int P);
#define TILE_TYPE(name, t)                                                                                   \
    static void name(const kv_geom *g, const int32_t *bt, int kvh, const tile_pairs *tp, int part,           \
                     float scale, float *scratch, int P) {                                                   \
        tile_sizes(TILE_ARGS, P, t);                                                                         \
    }
TILE_TYPE(tile_f32, TK_KV_F32)
TILE_TYPE(tile_f16, TK_KV_F16)
TILE_TYPE(tile_bf16, TK_KV_BF16)
TILE_TYPE(tile_int8, TK_KV_INT8)
#undef TILE_TYPE
#undef TILE_ARGS

/* Heads [h0, h1) of n_q query tokens at positions pos0.. in tiles: the heads
 * of a group (up to a tile), then as many query tokens as fill the tile.
 * Pair (i, h) writes to out + i * tok_stride + (h - h0) * head_stride. own
 * (part -1 only): NULL, or the own-block records [n_q][n_head], and then a
 * pair's context from the pool ends where its own block starts. next,
 * next_kvh: the caller's prefetch hint, what it reads after the call (the
 * next record's block with KV_PART_OWN; next -1: none). Between tiles of the
 * call, each asks for the next tile's first block: the same heads' for the
 * next query tokens, else the next kv head's; the last tile for the caller's
 * hint, or without one the same context's next kv head. */
static void run_heads(const kv_geom *g, const int32_t *bt, int pos0, int n_q, const float *q, int n_head,
                      int h0, int h1, int part, float scale, const float *own, float *out, size_t tok_stride,
                      size_t head_stride, float *scratch, int32_t next, int next_kvh) {
    const tile_fn fn = g->type == TK_KV_F32    ? tile_f32
                       : g->type == TK_KV_F16  ? tile_f16
                       : g->type == TK_KV_BF16 ? tile_bf16
                                               : tile_int8;
    const int ratio = n_head / g->n_head_kv, hd = g->head_dim, bs = g->block_size;
    for (int h = h0; h < h1;) {
        const int kvh = h / ratio;
        const int group_end = (kvh + 1) * ratio < h1 ? (kvh + 1) * ratio : h1;
        const int T = group_end - h < KV_ATTN_TILE ? group_end - h : KV_ATTN_TILE;
        const int Q = KV_ATTN_TILE / T;
        /* a record's next rows: the next kv head's own block, or after the
         * last the caller's next record's */
        const uint8_t *kn = NULL, *vn = NULL;
        if (part == KV_PART_OWN) {
            const int hn = h + T;
            if (hn < h1 && hn / ratio != kvh)
                kn = kv_geom_k(g, bt[pos0 / bs], hn / ratio), vn = kv_geom_v(g, bt[pos0 / bs], hn / ratio);
            else if (hn >= h1 && next >= 0)
                kn = kv_geom_k(g, next, next_kvh), vn = kv_geom_v(g, next, next_kvh);
        }
        for (int i0 = 0; i0 < n_q; i0 += Q) {
            const int nq = n_q - i0 < Q ? n_q - i0 : Q;
            tile_pairs tp;
            tp.kn = kn, tp.vn = vn;
            const bool more_q = i0 + Q < n_q, hint = !more_q && h + T >= h1 && next >= 0;
            tp.nblk = hint ? next : bt[0];
            tp.nkvh = more_q ? kvh : hint ? next_kvh : h + T < h1 ? (h + T) / ratio : kvh + 1;
            for (int i = 0; i < nq; i++)
                for (int t = 0; t < T; t++) {
                    const size_t qi = (size_t)(i0 + i), hi = (size_t)(h + t);
                    const int pos = pos0 + i0 + i;
                    tp.q[i * T + t] = q + (qi * (size_t)n_head + hi) * (size_t)hd;
                    tp.out[i * T + t] = out + qi * tok_stride + (hi - (size_t)h0) * head_stride;
                    tp.len[i * T + t] = own ? pos - pos % bs : pos + 1;
                    tp.own[i * T + t] = own ? own + (qi * (size_t)n_head + hi) * KV_PART_REC(hd) : NULL;
                }
            fn(g, bt, kvh, &tp, part, scale, scratch, nq * T);
        }
        h += T;
    }
}

void KFN(kv_attn)(const kv_geom *g, const int32_t *bt, int pos0, int n_q, const float *q, int n_head, int h0,
                  int h1, float scale, const float *own, float *out, float *scratch, int32_t next,
                  int next_kvh) {
    const size_t hd = (size_t)g->head_dim;
    run_heads(g, bt, pos0, n_q, q, n_head, h0, h1, -1, scale, own, out + (size_t)h0 * hd, (size_t)n_head * hd,
              hd, scratch, next, next_kvh);
}

void KFN(kv_attn_part)(const kv_geom *g, const int32_t *bt, int end, int part, const float *q, int n_head,
                       int h0, int h1, float scale, float *part_out, float *scratch) {
    run_heads(g, bt, end - 1, 1, q, n_head, h0, h1, part, scale, NULL, part_out, 0, KV_PART_REC(g->head_dim),
              scratch, -1, 0);
}

void KFN(kv_attn_own)(const kv_geom *g, const int32_t *bt, int pos, const float *q, int n_head, int h0,
                      int h1, float scale, float *rec, float *scratch, int32_t next, int next_kvh) {
    run_heads(g, bt, pos, 1, q, n_head, h0, h1, KV_PART_OWN, scale, NULL, rec, 0, KV_PART_REC(g->head_dim),
              scratch, next, next_kvh);
}

float KFN(kv_quant_token)(const float *x, int8_t *y, int n) {
    vf a = vf_zero();
    int i = 0;
    /* |x| first: a NaN lane keeps the running max (the second operand) */
    for (; i + VL <= n; i += VL) a = vf_max(vf_abs(vf_load(x + i)), a);
    float m = vf_hmax(a);
    for (int j = i; j < n; j++) m = fabsf(x[j]) > m ? fabsf(x[j]) : m;
    const float s = m / 127.0f;
    if (!(s > 0.0f)) {
        for (int j = 0; j < n; j++) y[j] = 0;
        return s;
    }
    const vf sv = vf_set1(s);
    for (i = 0; i + VL <= n; i += VL) vf_store_i8(y + i, vf_div(vf_load(x + i), sv));
    if (i < n) { /* the tail through a padded vector */
        float t[VL] = {0};
        int8_t q[VL];
        for (int j = i; j < n; j++) t[j - i] = x[j];
        vf_store_i8(q, vf_div(vf_load(t), sv));
        for (int j = i; j < n; j++) y[j] = q[j - i];
    }
    return s;
}

/* A chunk whose values all fit skips the growth arithmetic (most do: a
 * scale only grows at a channel's new maximum). */
bool KFN(kv_quant_chan)(const float *x, float *s, int8_t *y, float *r, int n) {
    const vf lim = vf_set1(127.0f), one = vf_set1(1.0f), zero = vf_zero();
    bool rescale = false;
    int i = 0;
    for (; i + VL <= n; i += VL) {
        const vf xv = vf_load(x + i), a = vf_abs(xv);
        vf sv = vf_load(s + i), rv = one;
        const vf top = vf_mul(sv, lim);
        if (vf_any_gt(a, top)) {
            const vf grown = vf_max(vf_div(a, lim), vf_mul(sv, vf_set1(KV_INT8_MIN_GROWTH)));
            const vf sn = vf_select_gt(a, top, grown, sv);
            /* lanes that do not grow divide sv by itself or 0 by 0: not selected */
            rv = vf_select_gt(sv, zero, vf_div(sv, sn), one);
            rescale |= vf_any_gt(one, rv);
            vf_store(s + i, sn);
            sv = sn;
        }
        vf_store(r + i, rv);
        vf_store_i8(y + i, vf_pos_or_zero(sv, vf_div(xv, sv)));
    }
    return kv_quant_chan_ref(x + i, s + i, y + i, r + i, n - i) || rescale;
}

/* Chunks of VL channels whose factors are all 1 are left as they are (the
 * reference's product is exact there). */
void KFN(kv_requant_chan)(int8_t *y, int n_rows, int n, const float *r) {
    const vf one = vf_set1(1.0f);
    int c = 0;
    for (; c + VL <= n; c += VL) {
        const vf rv = vf_load(r + c);
        if (!vf_any_gt(rv, one) && !vf_any_gt(one, rv)) continue;
        for (int j = 0; j < n_rows; j++) {
            int8_t *row = y + (size_t)j * (size_t)n;
            vf_store_i8(row + c, vf_mul(vf_load_kv((const uint8_t *)row, c, TK_KV_INT8), rv));
        }
    }
    if (c < n) /* the last n - c channels of every row */
        for (int j = 0; j < n_rows; j++) kv_requant_chan_ref(y + (size_t)j * (size_t)n + c, 1, n - c, r + c);
}

/* Each group's 64 bytes of a channel quad are 16 slots x those 4 channels, so
 * one vector of factors, the quad's 4 repeated, rescales all of them; quads
 * whose factors are all 1 are left as they are. */
void KFN(kv_requant_cols)(int8_t *k, int n_groups, int hd, const float *r) {
    for (int c = 0; c < hd; c += 4) {
        if (r[c] == 1.0f && r[c + 1] == 1.0f && r[c + 2] == 1.0f && r[c + 3] == 1.0f) continue;
        const vf rv = vf_bcast4(r + c);
        for (int g = 0; g < n_groups; g++) {
            int8_t *p = k + kv_k8_index(hd, g * KV_KT, c);
            for (int o = 0; o < 4 * KV_KT; o += VL)
                vf_store_i8(p + o, vf_mul(vf_load_kv((const uint8_t *)p, o, TK_KV_INT8), rv));
        }
    }
}

void KFN(kv_to_f16)(const float *x, tk_f16 *y, int n) {
    int i = 0;
    for (; i + VL <= n; i += VL) vf_store_f16(y + i, vf_load(x + i));
    kv_to_f16_ref(x + i, y + i, n - i);
}
