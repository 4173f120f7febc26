/* AVX2 attention over the paged KV cache (see src/kv/attn_ref.c for the
 * definition). Differences from the reference, all for decode speed:
 *  - up to KV_ATTN_TILE query heads that share a KV head run together, so each
 *    K and V row of a block is loaded (and dequantized) once for all of them;
 *  - K rows are dotted 8 lanes at a time, V rows accumulated 8 dims at a time
 *    with the accumulators in registers across a block's rows;
 *  - exp is a polynomial (Cephes expf, ~2 ulp) over 8 scores at a time.
 * Every head's arithmetic is the same whatever the tile it is in, so results
 * do not depend on how callers split heads over threads. head_dim % 8 == 0. */
#include <immintrin.h>
#include <math.h>
#include <stdbool.h>

#include "kv/kv_simd.h"

#define INLINE static inline __attribute__((always_inline))

/* 8 elements at c of a row of the KV type, as floats (int8 unscaled). */
INLINE __m256 load8(const uint8_t *row, int c, const tk_kv_type type) {
    switch (type) {
    case TK_KV_F32:
        return _mm256_loadu_ps((const float *)row + c);
    case TK_KV_F16:
        return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)((const uint16_t *)row + c)));
    case TK_KV_BF16: {
        __m256i w = _mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)((const uint16_t *)row + c)));
        return _mm256_castsi256_ps(_mm256_slli_epi32(w, 16));
    }
    case TK_KV_INT8:
    default:
        return _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)(row + c))));
    }
}

INLINE float hsum8(__m256 v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

INLINE float hmax8(__m256 v) {
    __m128 s = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_max_ps(s, _mm_movehl_ps(s, s));
    s = _mm_max_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

/* exp(x) for x <= 0 (scores minus their max); 0 below -87, where expf is
 * subnormal or zero anyway, and for -inf (padding). */
INLINE __m256 exp8_neg(__m256 x) {
    const __m256 lo = _mm256_set1_ps(-87.0f);
    const __m256 under = _mm256_cmp_ps(x, lo, _CMP_LT_OQ);
    x = _mm256_max_ps(x, lo);
    const __m256 n = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(1.44269504088896341f)),
                                     _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    /* r = x - n ln2, with ln2 split in two so r is exact enough */
    __m256 r = _mm256_fnmadd_ps(n, _mm256_set1_ps(0.693359375f), x);
    r = _mm256_fnmadd_ps(n, _mm256_set1_ps(-2.12194440e-4f), r);
    __m256 p = _mm256_set1_ps(1.9875691500e-4f);
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.3981999507e-3f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(8.3334519073e-3f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(4.1665795894e-2f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.6666665459e-1f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(5.0000001201e-1f));
    const __m256 y = _mm256_fmadd_ps(p, _mm256_mul_ps(r, r), _mm256_add_ps(r, _mm256_set1_ps(1.0f)));
    /* 2^n: n in [-126, 0], a normal exponent */
    const __m256i e = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
    return _mm256_andnot_ps(under, _mm256_mul_ps(y, _mm256_castsi256_ps(e)));
}

/* Rows (or dim chunks) processed at once for a tile of T heads: enough
 * independent FMA chains to hide the FMA latency within 16 registers. */
#define KV_ROWS(T) ((T) == 1 ? 8 : (T) == 2 ? 4 : 2)

/* Scores of rows [j0, j0+R) of a block for T heads: s[t*bs + j]. Each (row,
 * head) is its own chain in the same order whatever R and T are. */
INLINE void dot_rows(const uint8_t *K, size_t row_bytes, int j0, int hd, const float *const *q,
                     const float *ks, int sstride, float scale, float *s, int bs, const int R, const int T,
                     const tk_kv_type type) {
    __m256 d[8][KV_ATTN_TILE];
#pragma GCC unroll 8
    for (int r = 0; r < R; r++)
#pragma GCC unroll 4
        for (int t = 0; t < T; t++) d[r][t] = _mm256_setzero_ps();
    for (int c = 0; c < hd; c += 8) {
        __m256 qv[KV_ATTN_TILE];
#pragma GCC unroll 4
        for (int t = 0; t < T; t++) qv[t] = _mm256_loadu_ps(q[t] + c);
#pragma GCC unroll 8
        for (int r = 0; r < R; r++) {
            const __m256 k = load8(K + (size_t)(j0 + r) * row_bytes, c, type);
#pragma GCC unroll 4
            for (int t = 0; t < T; t++) d[r][t] = _mm256_fmadd_ps(qv[t], k, d[r][t]);
        }
    }
#pragma GCC unroll 8
    for (int r = 0; r < R; r++)
#pragma GCC unroll 4
        for (int t = 0; t < T; t++) {
            float x = hsum8(d[r][t]);
            if (type == TK_KV_INT8) x *= ks[(j0 + r) * sstride];
            s[t * bs + j0 + r] = x * scale;
        }
}

/* acc[t*hd + c..] = acc * corr[t] + sum_j w[t*bs + j] * V_j[c..] for C chunks
 * of 8 dims from c; each (chunk, head) is its own chain, rows in order. */
INLINE void acc_rows(const uint8_t *V, size_t row_bytes, int n, int c, int hd, const float *corr,
                     const float *w, int bs, float *acc, const int C, const int T, const tk_kv_type type) {
    __m256 a[8][KV_ATTN_TILE];
#pragma GCC unroll 8
    for (int u = 0; u < C; u++)
#pragma GCC unroll 4
        for (int t = 0; t < T; t++)
            a[u][t] = _mm256_mul_ps(_mm256_loadu_ps(acc + t * hd + c + 8 * u), _mm256_set1_ps(corr[t]));
    for (int j = 0; j < n; j++) {
        __m256 wv[KV_ATTN_TILE];
#pragma GCC unroll 4
        for (int t = 0; t < T; t++) wv[t] = _mm256_broadcast_ss(w + t * bs + j);
        const uint8_t *vr = V + (size_t)j * row_bytes;
#pragma GCC unroll 8
        for (int u = 0; u < C; u++) {
            const __m256 v = load8(vr, c + 8 * u, type);
#pragma GCC unroll 4
            for (int t = 0; t < T; t++) a[u][t] = _mm256_fmadd_ps(wv[t], v, a[u][t]);
        }
    }
#pragma GCC unroll 8
    for (int u = 0; u < C; u++)
#pragma GCC unroll 4
        for (int t = 0; t < T; t++) _mm256_storeu_ps(acc + t * hd + c + 8 * u, a[u][t]);
}

/* Running softmax state of a tile: per head t, scores/weights s[t*bs + j],
 * weighted V sum acc[t*hd + c], running max m[t] and sum l[t]. */
typedef struct tile_state {
    float *s, *acc, *m, *l;
} tile_state;

/* One block (n valid rows) for T heads whose queries are q[t]. */
INLINE void tile_block(const kv_geom *g, int32_t blk, int kvh, int n, const float *const *q, float scale,
                       const tile_state *st, const int T, const tk_kv_type type) {
    const int hd = g->head_dim, bs = g->block_size;
    const size_t row_bytes = (size_t)hd * kv_type_size(type);
    const int sstride = g->scale == TK_KV_SCALE_TOKEN ? 1 : 0;
    const uint8_t *K = kv_geom_k(g, blk, kvh), *V = kv_geom_v(g, blk, kvh);
    const float *ks = kv_geom_ks(g, blk, kvh), *vs = kv_geom_vs(g, blk, kvh);

    /* Rows in groups of R, so R*T dot products run as independent chains. */
    const int R = KV_ROWS(T);
    int j0 = 0;
    for (; j0 + R <= n; j0 += R) dot_rows(K, row_bytes, j0, hd, q, ks, sstride, scale, st->s, bs, R, T, type);
    for (; j0 < n; j0++) dot_rows(K, row_bytes, j0, hd, q, ks, sstride, scale, st->s, bs, 1, T, type);
    /* Pad to whole vectors with -inf: exp gives 0 and max ignores them. */
    const int n8 = (n + 7) & ~7;
    for (int t = 0; t < T; t++)
        for (int j = n; j < n8; j++) st->s[t * bs + j] = -INFINITY;

    float corr[KV_ATTN_TILE];
    for (int t = 0; t < T; t++) {
        float *s = st->s + t * bs;
        __m256 mx = _mm256_set1_ps(-INFINITY);
        for (int j = 0; j < n8; j += 8) mx = _mm256_max_ps(mx, _mm256_loadu_ps(s + j));
        const float m_new = fmaxf(st->m[t], hmax8(mx));
        corr[t] = expf(st->m[t] - m_new);
        st->m[t] = m_new;
        const __m256 mv = _mm256_set1_ps(m_new);
        __m256 sum = _mm256_setzero_ps();
        for (int j = 0; j < n8; j += 8) {
            const __m256 p = exp8_neg(_mm256_sub_ps(_mm256_loadu_ps(s + j), mv));
            sum = _mm256_add_ps(sum, p);
            /* int8: fold the V scale into the weight */
            __m256 w = p;
            if (type == TK_KV_INT8)
                w = _mm256_mul_ps(p, sstride ? _mm256_loadu_ps(vs + j) : _mm256_set1_ps(vs[0]));
            _mm256_storeu_ps(s + j, w);
        }
        st->l[t] = st->l[t] * corr[t] + hsum8(sum);
    }

    /* C chunks of 8 dims at a time, so C*T accumulations run as independent chains. */
    const int C = KV_ROWS(T);
    int c = 0;
    for (; c + 8 * C <= hd; c += 8 * C)
        acc_rows(V, row_bytes, n, c, hd, corr, st->s, bs, st->acc, C, T, type);
    for (; c < hd; c += 8) acc_rows(V, row_bytes, n, c, hd, corr, st->s, bs, st->acc, 1, T, type);
}

/* T heads sharing kv head kvh, one query position, context length len. */
INLINE void tile_run(const kv_geom *g, const int32_t *bt, int len, int kvh, const float *q, int hd,
                     float scale, float *out, float *scratch, const int T, const tk_kv_type type) {
    const int bs = g->block_size;
    tile_state st = {.s = scratch, .acc = scratch + (size_t)KV_ATTN_TILE * bs};
    st.m = st.acc + (size_t)KV_ATTN_TILE * hd;
    st.l = st.m + KV_ATTN_TILE;
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
        const __m256 inv = _mm256_set1_ps(1.0f / st.l[t]);
        for (int c = 0; c < hd; c += 8)
            _mm256_storeu_ps(out + (size_t)t * hd + c,
                             _mm256_mul_ps(_mm256_loadu_ps(st.acc + t * hd + c), inv));
    }
}

/* One instance per KV type, each with the tile sizes unrolled. */
#define TILE_ARGS g, bt, len, kvh, q, hd, scale, out, scratch
typedef void (*tile_fn)(const kv_geom *g, const int32_t *bt, int len, int kvh, const float *q, int hd,
                        float scale, float *out, float *scratch, int T);

static void tile_f32(const kv_geom *g, const int32_t *bt, int len, int kvh, const float *q, int hd,
                     float scale, float *out, float *scratch, int T) {
    switch (T) {
    case 1:
        tile_run(TILE_ARGS, 1, TK_KV_F32);
        break;
    case 2:
        tile_run(TILE_ARGS, 2, TK_KV_F32);
        break;
    case 3:
        tile_run(TILE_ARGS, 3, TK_KV_F32);
        break;
    default:
        tile_run(TILE_ARGS, 4, TK_KV_F32);
        break;
    }
}
static void tile_f16(const kv_geom *g, const int32_t *bt, int len, int kvh, const float *q, int hd,
                     float scale, float *out, float *scratch, int T) {
    switch (T) {
    case 1:
        tile_run(TILE_ARGS, 1, TK_KV_F16);
        break;
    case 2:
        tile_run(TILE_ARGS, 2, TK_KV_F16);
        break;
    case 3:
        tile_run(TILE_ARGS, 3, TK_KV_F16);
        break;
    default:
        tile_run(TILE_ARGS, 4, TK_KV_F16);
        break;
    }
}
static void tile_bf16(const kv_geom *g, const int32_t *bt, int len, int kvh, const float *q, int hd,
                      float scale, float *out, float *scratch, int T) {
    switch (T) {
    case 1:
        tile_run(TILE_ARGS, 1, TK_KV_BF16);
        break;
    case 2:
        tile_run(TILE_ARGS, 2, TK_KV_BF16);
        break;
    case 3:
        tile_run(TILE_ARGS, 3, TK_KV_BF16);
        break;
    default:
        tile_run(TILE_ARGS, 4, TK_KV_BF16);
        break;
    }
}
static void tile_int8(const kv_geom *g, const int32_t *bt, int len, int kvh, const float *q, int hd,
                      float scale, float *out, float *scratch, int T) {
    switch (T) {
    case 1:
        tile_run(TILE_ARGS, 1, TK_KV_INT8);
        break;
    case 2:
        tile_run(TILE_ARGS, 2, TK_KV_INT8);
        break;
    case 3:
        tile_run(TILE_ARGS, 3, TK_KV_INT8);
        break;
    default:
        tile_run(TILE_ARGS, 4, TK_KV_INT8);
        break;
    }
}
#undef TILE_ARGS

void kv_attn_avx2(const kv_geom *g, const int32_t *bt, int pos0, int n_q, const float *q, int n_head, int h0,
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

void kv_to_f16_avx2(const float *x, tk_f16 *y, int n) {
    int i = 0;
    for (; i + 8 <= n; i += 8)
        _mm_storeu_si128((__m128i *)(y + i), _mm256_cvtps_ph(_mm256_loadu_ps(x + i),
                                                             _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
    kv_to_f16_ref(x + i, y + i, n - i);
}
