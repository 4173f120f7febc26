/* The 16-row interleaved Q4_K and Q6_K gemvs (TK_LAYOUT_X16, kernels_ref.h), included
 * by simd_body.h (its AI, KFN, X16_ZMM, KNT_X8, dot_u8s8_acc, prefetch_ahead,
 * x16_tile_fetch and f16_to_f32). The nibbles are Q4_0 X16's byte columns, so one 64-byte
 * load masked (or shifted) is four elements of sixteen rows and one
 * vpdpbusd per token adds them to the sixteen rows' sub-block dots. Per
 * super-block and row the arithmetic is the reference's: exact int32
 * sub-block dots times the 6-bit scales (integer multiply), the mins term
 * sum_j m_j (bsum_2j + bsum_2j+1) by int16 pair dots, then
 * s += dx (d dots - dmin mins) as separate float steps, so every level gives
 * kern_gemv_q4_k_ref's bits. Q6_K (qk6_tile) is the same scheme with the
 * top two bits of its 6-bit values or-ed into the nibbles and the -32 offset
 * folded into the integer sum: kern_gemv_q6_k_ref's bits. */

/* The activations of a call are rewritten once into a table, as X16's:
 * per token tile of nt tokens and per super-block, the 64 four-byte chunks of
 * the nt tokens (chunk-major), then the 8 bsum pairs (int16 x 2) of each, then
 * the nt scales: QK_ENT words per (token, super-block). */
#ifndef QK_ACT_MAX
#define QK_ACT_MAX 960 /* (token, super-block) terms per pass: 280 KB of stack */
#endif
#define QK_ENT 73
#ifndef QK_PREFETCH
#define QK_PREFETCH 6144
#endif
#if defined(X16_ZMM)
#ifndef KNT_QK16
#define KNT_QK16 8
#endif
#define QK_NT KNT_QK16
#else
#define QK_NT KNT_X8
#endif

AI void qk_act(const void *x, size_t xs, int np, int64_t nb, int32_t *tab) {
    for (int t0 = 0; t0 < np; t0 += QK_NT) {
        const int nt = np - t0 < QK_NT ? np - t0 : QK_NT;
        int32_t *tt = tab + (size_t)t0 * (size_t)nb * QK_ENT;
        for (int j = 0; j < nt; j++) {
            const tk_block_q8_k *xt = (const tk_block_q8_k *)((const char *)x + (size_t)(t0 + j) * xs);
            for (int64_t b = 0; b < nb; b++) {
                int32_t *e = tt + (size_t)b * (size_t)(nt * QK_ENT);
                for (int c = 0; c < 64; c++) memcpy(&e[c * nt + j], xt[b].qs + 4 * c, 4);
                for (int p = 0; p < 8; p++) memcpy(&e[(64 + p) * nt + j], &xt[b].bsums[2 * p], 4);
                memcpy(&e[72 * nt + j], &xt[b].d, 4);
            }
        }
    }
}

/* Sub-block scales (sc) and mins (mn) of the sixteen rows of a super-block
 * as bytes, [j][i] (sub-block j, row i), from its 192 packed bytes. */
AI void qk_scales(const unsigned char *blk, uint8_t sc[8][16], uint8_t mn[8][16]) {
    const __m256i m4 = _mm256_set1_epi8(0x0f), m2 = _mm256_set1_epi8(3);
#pragma GCC unroll 2
    for (int h = 0; h < 2; h++) { /* sub-blocks 2h, 2h + 1 and 2h + 4, 2h + 5 */
        __m256i s0 = _mm256_loadu_si256((const __m256i *)(blk + 64 + 32 * h));
        __m256i s1 = _mm256_loadu_si256((const __m256i *)(blk + 128 + 32 * h));
        __m256i hb = _mm256_loadu_si256((const __m256i *)(blk + 192 + 32 * h));
        __m256i c0 =
            _mm256_or_si256(_mm256_and_si256(s0, m4), _mm256_slli_epi16(_mm256_and_si256(hb, m2), 4));
        __m256i c1 = _mm256_or_si256(_mm256_and_si256(s1, m4),
                                     _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(hb, 2), m2), 4));
        __m256i n0 = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(s0, 4), m4),
                                     _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(hb, 4), m2), 4));
        __m256i n1 = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(s1, 4), m4),
                                     _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(hb, 6), m2), 4));
        _mm256_storeu_si256((__m256i *)sc[2 * h], c0);
        _mm256_storeu_si256((__m256i *)sc[2 * h + 4], c1);
        _mm256_storeu_si256((__m256i *)mn[2 * h], n0);
        _mm256_storeu_si256((__m256i *)mn[2 * h + 4], n1);
    }
}

AI float qk_scale(const int32_t *e) {
    float d;
    memcpy(&d, e, 4);
    return d;
}

/* A Q6_K super-block's 256 bytes of sub-block scales (16 rows x 16
 * sub-blocks, from byte 32) copied to the stack once per block: the tiles
 * then read each sub-block's 16 (or 8) from there. Read from the block at
 * every sub-block instead, the tile of 1 to 5 tokens read DRAM at ~38 GB/s
 * whatever its tokens, 0.55-0.65x the Q4_K tile's rate at one token; with
 * the copy at 0.9-1.1x (avx512; 1.1-1.3x faster at avx2 and avxvnni). The
 * 512-bit tile of more than 5 tokens, bound by its arithmetic, reads the
 * block directly (the copy cost it 4-10% at 6 to 8 tokens, and gained 1.2x
 * at 5): QK6_COPY_NT. Kernel microbenchmark, docs/notes.md. */
#ifndef QK6_COPY_NT
#define QK6_COPY_NT 5
#endif
AI void qk6_scales(const unsigned char *blk, int8_t sc[256]) {
    for (int o = 0; o < 256; o += 32)
        _mm256_store_si256((__m256i *)(void *)(sc + o), _mm256_loadu_si256((const __m256i *)(blk + 32 + o)));
}

#if defined(X16_ZMM)
/* One group of 16 rows against nt tokens (table e, qk_act): acc[t] holds the
 * 16 row sums of token t, one chain per (row, token) whatever nt is. Inside
 * a super-block only the sub-block dots a[t] and their scaled sum is[t] stay
 * in registers (2 nt + 5 of 32: no spills); the mins term is summed after
 * the sub-blocks, and acc, touched once per super-block, lives in memory.
 * The tile that kept all four sets in registers spilled and, from DRAM, ran
 * at 60-65% of its rate over cached weights (one core, 32 tokens). 12
 * tokens fit too and gained ~5% in L2, but Q4_K and Q6_K share the table's
 * tile, and with the Q6_K tile at 12 (or its driver around a 12-token Q4_K
 * one) the compiler spilled its sums and the Q4_K_M file's tied Q6_K lm_head
 * ran ~35% slower in a batch-32 step. */
AI void qk4_tile(int64_t nb, const unsigned char *g, const int32_t *e, float *y, int64_t ldy, int nt,
                 const unsigned char *nx) {
    float acc[QK_NT][16] __attribute__((aligned(64)));
#pragma GCC unroll 16
    for (int t = 0; t < nt; t++) _mm512_store_ps(acc[t], _mm512_setzero_ps());
    const __m512i m4 = _mm512_set1_epi8(0x0f);
    for (int64_t b = 0; b < nb; b++, e += nt * QK_ENT) {
        const unsigned char *blk = g + (size_t)b * 2304;
        uint8_t sc[8][16], mn[8][16];
        qk_scales(blk, sc, mn);
        __m512i is[QK_NT];
#pragma GCC unroll 16
        for (int t = 0; t < nt; t++) is[t] = _mm512_setzero_si512();
#pragma GCC unroll 1
        for (int j = 0; j < 8; j++) {
            __m512i a[QK_NT];
#pragma GCC unroll 16
            for (int t = 0; t < nt; t++) a[t] = _mm512_setzero_si512();
            const unsigned char *qb = blk + 256 + 256 * j;
            const int32_t *ej = e + 8 * j * nt;
            if (nx == X16_AHEAD) {
                if (QK_PREFETCH > 0) /* the block's 2304 bytes, an eighth per sub-block */
#pragma GCC unroll 5
                    for (int o = 0; o < 320; o += 64) prefetch_ahead(blk + 288 * j + o, QK_PREFETCH);
            } else if (nx) { /* the next group's block, into L2 (x16_tile_fetch) */
#pragma GCC unroll 5
                for (int o = 0; o < 320; o += 64)
                    _mm_prefetch((const char *)(nx + (size_t)b * 2304 + 288 * j + o), _MM_HINT_T1);
            }
#pragma GCC unroll 4
            for (int c = 0; c < 4; c++) {
                __m512i v = _mm512_loadu_si512((const void *)(qb + 64 * c));
                __m512i lo = _mm512_and_si512(v, m4), hi = _mm512_and_si512(_mm512_srli_epi16(v, 4), m4);
#pragma GCC unroll 16
                for (int t = 0; t < nt; t++) a[t] = dpbusd_bcast(a[t], lo, &ej[2 * c * nt + t]);
#pragma GCC unroll 16
                for (int t = 0; t < nt; t++) a[t] = dpbusd_bcast(a[t], hi, &ej[(2 * c + 1) * nt + t]);
            }
            __m512i s = _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)sc[j]));
#pragma GCC unroll 16
            for (int t = 0; t < nt; t++) is[t] = _mm512_add_epi32(is[t], _mm512_mullo_epi32(a[t], s));
        }
        __m512i mp[8]; /* (m, m) as int16 per sub-block */
#pragma GCC unroll 8
        for (int j = 0; j < 8; j++) {
            __m512i m = _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)mn[j]));
            mp[j] = _mm512_or_si512(m, _mm512_slli_epi32(m, 16));
        }
        __m512 dw = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)blk));
        __m512 dm = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(blk + 32)));
#pragma GCC unroll 16
        for (int t = 0; t < nt; t++) {
            __m512i ms = _mm512_setzero_si512();
#pragma GCC unroll 8
            for (int j = 0; j < 8; j++)
                ms = _mm512_dpwssd_epi32(ms, mp[j], _mm512_set1_epi32(e[(64 + j) * nt + t]));
            __m512 f = _mm512_sub_ps(_mm512_mul_ps(dw, _mm512_cvtepi32_ps(is[t])),
                                     _mm512_mul_ps(dm, _mm512_cvtepi32_ps(ms)));
            _mm512_store_ps(acc[t],
                            _mm512_add_ps(_mm512_load_ps(acc[t]),
                                          _mm512_mul_ps(_mm512_set1_ps(qk_scale(&e[72 * nt + t])), f)));
        }
    }
#pragma GCC unroll 16
    for (int t = 0; t < nt; t++) _mm512_storeu_ps(y + (size_t)t * (size_t)ldy, _mm512_load_ps(acc[t]));
}

/* Q6_K: per 16-element sub-block s, the int32 dot of the unsigned 6-bit
 * values (low nibbles | top bits << 4) times its int8 scale, plus
 * -32 sc_s bsum_s (int16 pairs (-32 sc_2j, -32 sc_2j+1) against the bsum
 * pairs): the reference's integer block sum; then s += (dx d) acc. */
AI void qk6_tile(int64_t nb, const unsigned char *g, const int32_t *e, float *y, int64_t ldy, int nt,
                 const unsigned char *nx) {
    __m512 acc[QK_NT];
#pragma GCC unroll 16
    for (int t = 0; t < nt; t++) acc[t] = _mm512_setzero_ps();
    const __m512i m4 = _mm512_set1_epi8(0x0f), m30 = _mm512_set1_epi8(0x30), lo16 = _mm512_set1_epi32(0xffff);
    for (int64_t b = 0; b < nb; b++, e += nt * QK_ENT) {
        const unsigned char *blk = g + (size_t)b * 3360;
        int8_t scb[256] __attribute__((aligned(32)));
        if (nt <= QK6_COPY_NT) qk6_scales(blk, scb); /* nt is a constant in each instance */
        const int8_t *scs = nt <= QK6_COPY_NT ? scb : (const int8_t *)(blk + 32);
        __m512i is[QK_NT];
#pragma GCC unroll 16
        for (int t = 0; t < nt; t++) is[t] = _mm512_setzero_si512();
#pragma GCC unroll 1
        for (int j = 0; j < 8; j++) {
            const unsigned char *qb = blk + 288 + 256 * j, *hb = blk + 2336 + 128 * j;
            const int32_t *ej = e + 8 * j * nt;
            if (nx == X16_AHEAD) {
                if (QK_PREFETCH > 0) /* the block's 3360 bytes, an eighth per sub-block */
#pragma GCC unroll 7
                    for (int o = 0; o < 448; o += 64) prefetch_ahead(blk + 420 * j + o, QK_PREFETCH);
            } else if (nx) { /* the next group's block, into L2 (x16_tile_fetch) */
#pragma GCC unroll 7
                for (int o = 0; o < 448; o += 64)
                    _mm_prefetch((const char *)(nx + (size_t)b * 3360 + 420 * j + o), _MM_HINT_T1);
            }
            __m512i sc[2];
#pragma GCC unroll 2
            for (int p = 0; p < 2; p++) { /* 16-element sub-block 2j + p: chunks 2p, 2p + 1 */
                sc[p] = _mm512_cvtepi8_epi32(
                    _mm_loadu_si128((const __m128i *)(const void *)(scs + 16 * (2 * j + p))));
                __m512i a[QK_NT];
#pragma GCC unroll 16
                for (int t = 0; t < nt; t++) a[t] = _mm512_setzero_si512();
                const __m512i h = _mm512_loadu_si512((const void *)(hb + 64 * p));
#pragma GCC unroll 2
                for (int c = 2 * p; c < 2 * p + 2; c++) {
                    __m512i v = _mm512_loadu_si512((const void *)(qb + 64 * c));
                    __m512i hl = c % 2 ? h : _mm512_slli_epi16(h, 4);
                    __m512i hh = c % 2 ? _mm512_srli_epi16(h, 2) : _mm512_slli_epi16(h, 2);
                    __m512i lo = _mm512_or_si512(_mm512_and_si512(v, m4), _mm512_and_si512(hl, m30));
                    __m512i hi = _mm512_or_si512(_mm512_and_si512(_mm512_srli_epi16(v, 4), m4),
                                                 _mm512_and_si512(hh, m30));
#pragma GCC unroll 16
                    for (int t = 0; t < nt; t++) a[t] = dpbusd_bcast(a[t], lo, &ej[2 * c * nt + t]);
#pragma GCC unroll 16
                    for (int t = 0; t < nt; t++) a[t] = dpbusd_bcast(a[t], hi, &ej[(2 * c + 1) * nt + t]);
                }
#pragma GCC unroll 16
                for (int t = 0; t < nt; t++) is[t] = _mm512_add_epi32(is[t], _mm512_mullo_epi32(a[t], sc[p]));
            }
            /* (-32 sc_2j, -32 sc_2j+1) as int16 pairs */
            __m512i n0 = _mm512_sub_epi32(_mm512_setzero_si512(), _mm512_slli_epi32(sc[0], 5));
            __m512i n1 = _mm512_sub_epi32(_mm512_setzero_si512(), _mm512_slli_epi32(sc[1], 5));
            __m512i np = _mm512_or_si512(_mm512_and_si512(n0, lo16), _mm512_slli_epi32(n1, 16));
#pragma GCC unroll 16
            for (int t = 0; t < nt; t++)
                is[t] = _mm512_dpwssd_epi32(is[t], np, _mm512_set1_epi32(e[(64 + j) * nt + t]));
        }
        __m512 dw = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)blk));
#pragma GCC unroll 16
        for (int t = 0; t < nt; t++) {
            __m512 dd = _mm512_mul_ps(_mm512_set1_ps(qk_scale(&e[72 * nt + t])), dw);
            acc[t] = _mm512_add_ps(acc[t], _mm512_mul_ps(dd, _mm512_cvtepi32_ps(is[t])));
        }
    }
#pragma GCC unroll 16
    for (int t = 0; t < nt; t++) _mm512_storeu_ps(y + (size_t)t * (size_t)ldy, acc[t]);
}
#else
/* a + the int16 pair dots of b and c (vpdpwssd where the level has it). */
#if defined(__AVXVNNI__)
#define qk_dpwssd(a, b, c) _mm256_dpwssd_avx_epi32(a, b, c)
#else
#define qk_dpwssd(a, b, c) _mm256_add_epi32(a, _mm256_madd_epi16(b, c))
#endif
/* The sub-block dots. With VNNI (QK_I16 0): int32 dots by vpdpbusd, times
 * the int32 scales (vpmulld). Without (QK_I16 1): the vpmaddubsw pair sums
 * added as int16, then one vpmaddwd against the scales as int16 pairs
 * (qk_pairs) scales and widens them at once: the same integers, with 17 ops
 * per Q4_K sub-block and token instead of 26. A Q4_K lane holds a sub-block's
 * 16 products of a 4-bit value and an int8 of at most 127 in magnitude
 * (|sum| <= 16 * 15 * 127 = 30480); Q6_K's see qk6_tile. */
#if defined(__AVXVNNI__)
#define qk_dot(a, u, x) dot_u8s8_acc(a, u, x)
#define QK_I16          0
#else
#define qk_dot(a, u, x) dot_u8s8_acc16(a, u, x)
#define QK_I16          1
#endif
/* Halves of 8 rows one pass takes, and the chains a pass keeps per sum
 * (nh nt): both halves at one token, and at two with VNNI, whose tile of two
 * tokens read DRAM ~1.3x faster in one pass (4 chains; without VNNI no
 * faster, and slower from cache). */
#define QK_HALVES(nt) ((nt) == 1 || (!QK_I16 && (nt) == 2) ? 2 : 1)
#define QK_U          (QK_NT > 4 ? QK_NT : 4)
/* int32 lanes s as int16 pairs (s, s), the sign kept */
AI __m256i qk_pairs(__m256i s) { return _mm256_blend_epi16(s, _mm256_slli_epi32(s, 16), 0xaa); }

/* In 256-bit halves of 8 rows: the chains, integer sums and memory
 * accumulators of the 512-bit tile (2 nt + 5 of 16 registers live). One
 * token takes both halves in one pass (QK_HALVES), so its weights stream
 * once, front to back, and a block's scales and activations serve both. */
AI void qk4_tile(int64_t nb, const unsigned char *g, const int32_t *e0, float *y, int64_t ldy, int nt,
                 const unsigned char *nx) {
    (void)nx;
    const __m256i m4 = _mm256_set1_epi8(0x0f);
    const int nh = QK_HALVES(nt);
    for (int h0 = 0; h0 < 2; h0 += nh) {
        const int32_t *e = e0;
        float acc[QK_U][8] __attribute__((aligned(32)));
#pragma GCC unroll 8
        for (int u = 0; u < nh * nt; u++) _mm256_store_ps(acc[u], _mm256_setzero_ps());
        for (int64_t b = 0; b < nb; b++, e += nt * QK_ENT) {
            const unsigned char *blk = g + (size_t)b * 2304;
            uint8_t sc[8][16], mn[8][16];
            qk_scales(blk, sc, mn);
            __m256i is[QK_U];
#pragma GCC unroll 8
            for (int u = 0; u < nh * nt; u++) is[u] = _mm256_setzero_si256();
#pragma GCC unroll 1
            for (int j = 0; j < 8; j++) {
                __m256i a[QK_U];
#pragma GCC unroll 8
                for (int u = 0; u < nh * nt; u++) a[u] = _mm256_setzero_si256();
                const unsigned char *qb = blk + 256 + 256 * j + 32 * h0;
                const int32_t *ej = e + 8 * j * nt;
                if (QK_PREFETCH > 0 && h0 == 0)
#pragma GCC unroll 5
                    for (int o = 0; o < 320; o += 64) prefetch_ahead(blk + 288 * j + o, QK_PREFETCH);
#pragma GCC unroll 4
                for (int c = 0; c < 4; c++)
#pragma GCC unroll 2
                    for (int hh = 0; hh < nh; hh++) {
                        __m256i v = _mm256_loadu_si256((const __m256i *)(qb + 64 * c + 32 * hh));
                        __m256i lo = _mm256_and_si256(v, m4),
                                hi = _mm256_and_si256(_mm256_srli_epi16(v, 4), m4);
#pragma GCC unroll 8
                        for (int t = 0; t < nt; t++) {
                            a[hh * nt + t] =
                                qk_dot(a[hh * nt + t], lo, _mm256_set1_epi32(ej[2 * c * nt + t]));
                            keep_sum(&a[hh * nt + t]);
                        }
#pragma GCC unroll 8
                        for (int t = 0; t < nt; t++) {
                            a[hh * nt + t] =
                                qk_dot(a[hh * nt + t], hi, _mm256_set1_epi32(ej[(2 * c + 1) * nt + t]));
                            keep_sum(&a[hh * nt + t]);
                        }
                    }
#pragma GCC unroll 2
                for (int hh = 0; hh < nh; hh++) {
                    const __m256i s =
                        _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)(sc[j] + 8 * (h0 + hh))));
                    const __m256i s2 = qk_pairs(s);
#pragma GCC unroll 8
                    for (int t = 0; t < nt; t++)
                        is[hh * nt + t] =
                            _mm256_add_epi32(is[hh * nt + t], QK_I16 ? _mm256_madd_epi16(a[hh * nt + t], s2)
                                                                     : _mm256_mullo_epi32(a[hh * nt + t], s));
                }
            }
#pragma GCC unroll 2
            for (int hh = 0; hh < nh; hh++) {
                const int h = h0 + hh;
                __m256i mp[8]; /* (m, m) as int16 per sub-block */
#pragma GCC unroll 8
                for (int j = 0; j < 8; j++)
                    mp[j] = qk_pairs(_mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)(mn[j] + 8 * h))));
                __m256 dw = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(blk + 16 * h)));
                __m256 dm = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(blk + 32 + 16 * h)));
#pragma GCC unroll 8
                for (int t = 0; t < nt; t++) {
                    __m256i ms = _mm256_setzero_si256();
#pragma GCC unroll 8
                    for (int j = 0; j < 8; j++)
                        ms = qk_dpwssd(ms, mp[j], _mm256_set1_epi32(e[(64 + j) * nt + t]));
                    __m256 f = _mm256_sub_ps(_mm256_mul_ps(dw, _mm256_cvtepi32_ps(is[hh * nt + t])),
                                             _mm256_mul_ps(dm, _mm256_cvtepi32_ps(ms)));
                    _mm256_store_ps(
                        acc[hh * nt + t],
                        _mm256_add_ps(_mm256_load_ps(acc[hh * nt + t]),
                                      _mm256_mul_ps(_mm256_set1_ps(qk_scale(&e[72 * nt + t])), f)));
                }
            }
        }
#pragma GCC unroll 2
        for (int hh = 0; hh < nh; hh++)
#pragma GCC unroll 8
            for (int t = 0; t < nt; t++)
                _mm256_storeu_ps(y + (size_t)t * (size_t)ldy + 8 * (h0 + hh),
                                 _mm256_load_ps(acc[hh * nt + t]));
    }
}

/* Q6_K in 256-bit halves of 8 rows: the 512-bit tile's integer sums. With
 * VNNI a 16-element sub-block's int32 dots times its scale (vpmulld); without
 * (QK_I16), each chunk's two vpmaddubsw pair sums added as int16 (8 products of a 6-bit
 * value and an int8 of at most 127: |sum| <= 8 * 63 * 127 = 64008 would not
 * fit, 4 per lane do: 32004), then scaled and widened by one vpmaddwd
 * against the signed scales as int16 pairs: the same integers. */
AI void qk6_tile(int64_t nb, const unsigned char *g, const int32_t *e0, float *y, int64_t ldy, int nt,
                 const unsigned char *nx) {
    (void)nx;
    const __m256i m4 = _mm256_set1_epi8(0x0f), m30 = _mm256_set1_epi8(0x30), lo16 = _mm256_set1_epi32(0xffff);
    const int nh = QK_HALVES(nt);
    for (int h0 = 0; h0 < 2; h0 += nh) {
        const int32_t *e = e0;
        __m256 acc[QK_U];
#pragma GCC unroll 8
        for (int u = 0; u < nh * nt; u++) acc[u] = _mm256_setzero_ps();
        for (int64_t b = 0; b < nb; b++, e += nt * QK_ENT) {
            const unsigned char *blk = g + (size_t)b * 3360;
            int8_t scb[256] __attribute__((aligned(32)));
            qk6_scales(blk, scb);
            __m256i is[QK_U];
#pragma GCC unroll 8
            for (int u = 0; u < nh * nt; u++) is[u] = _mm256_setzero_si256();
#pragma GCC unroll 1
            for (int j = 0; j < 8; j++) {
                const unsigned char *qb = blk + 288 + 256 * j + 32 * h0, *hb = blk + 2336 + 128 * j + 32 * h0;
                const int32_t *ej = e + 8 * j * nt;
                if (QK_PREFETCH > 0 && h0 == 0)
#pragma GCC unroll 7
                    for (int o = 0; o < 448; o += 64) prefetch_ahead(blk + 420 * j + o, QK_PREFETCH);
#pragma GCC unroll 2
                for (int hh = 0; hh < nh; hh++) {
                    __m256i sc[2];
#pragma GCC unroll 2
                    for (int p = 0; p < 2; p++) {
                        sc[p] = _mm256_cvtepi8_epi32(_mm_loadl_epi64(
                            (const __m128i *)(void *)(scb + 16 * (2 * j + p) + 8 * (h0 + hh))));
                        const __m256i s2 = qk_pairs(sc[p]);
                        __m256i a[QK_NT];
                        const __m256i h = _mm256_loadu_si256((const __m256i *)(hb + 64 * p + 32 * hh));
#pragma GCC unroll 2
                        for (int c = 2 * p; c < 2 * p + 2; c++) {
                            if (QK_I16 || c == 2 * p)
#pragma GCC unroll 8
                                for (int t = 0; t < nt; t++) a[t] = _mm256_setzero_si256();
                            __m256i v = _mm256_loadu_si256((const __m256i *)(qb + 64 * c + 32 * hh));
                            __m256i hl = c % 2 ? h : _mm256_slli_epi16(h, 4);
                            __m256i hu = c % 2 ? _mm256_srli_epi16(h, 2) : _mm256_slli_epi16(h, 2);
                            __m256i lo = _mm256_or_si256(_mm256_and_si256(v, m4), _mm256_and_si256(hl, m30));
                            __m256i hi = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(v, 4), m4),
                                                         _mm256_and_si256(hu, m30));
#pragma GCC unroll 8
                            for (int t = 0; t < nt; t++) {
                                a[t] = qk_dot(a[t], lo, _mm256_set1_epi32(ej[2 * c * nt + t]));
                                keep_sum(&a[t]);
                            }
#pragma GCC unroll 8
                            for (int t = 0; t < nt; t++) {
                                a[t] = qk_dot(a[t], hi, _mm256_set1_epi32(ej[(2 * c + 1) * nt + t]));
                                keep_sum(&a[t]);
                            }
                            if (QK_I16)
#pragma GCC unroll 8
                                for (int t = 0; t < nt; t++) {
                                    is[hh * nt + t] =
                                        _mm256_add_epi32(is[hh * nt + t], _mm256_madd_epi16(a[t], s2));
                                    keep_sum(&is[hh * nt + t]);
                                }
                        }
                        if (!QK_I16)
#pragma GCC unroll 8
                            for (int t = 0; t < nt; t++)
                                is[hh * nt + t] =
                                    _mm256_add_epi32(is[hh * nt + t], _mm256_mullo_epi32(a[t], sc[p]));
                    }
                    __m256i n0 = _mm256_sub_epi32(_mm256_setzero_si256(), _mm256_slli_epi32(sc[0], 5));
                    __m256i n1 = _mm256_sub_epi32(_mm256_setzero_si256(), _mm256_slli_epi32(sc[1], 5));
                    __m256i np = _mm256_or_si256(_mm256_and_si256(n0, lo16), _mm256_slli_epi32(n1, 16));
#pragma GCC unroll 8
                    for (int t = 0; t < nt; t++)
                        is[hh * nt + t] =
                            qk_dpwssd(is[hh * nt + t], np, _mm256_set1_epi32(e[(64 + j) * nt + t]));
                }
            }
#pragma GCC unroll 2
            for (int hh = 0; hh < nh; hh++) {
                __m256 dw = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(blk + 16 * (h0 + hh))));
#pragma GCC unroll 8
                for (int t = 0; t < nt; t++) {
                    __m256 dd = _mm256_mul_ps(_mm256_set1_ps(qk_scale(&e[72 * nt + t])), dw);
                    acc[hh * nt + t] = _mm256_add_ps(acc[hh * nt + t],
                                                     _mm256_mul_ps(dd, _mm256_cvtepi32_ps(is[hh * nt + t])));
                }
            }
        }
#pragma GCC unroll 2
        for (int hh = 0; hh < nh; hh++)
#pragma GCC unroll 8
            for (int t = 0; t < nt; t++)
                _mm256_storeu_ps(y + (size_t)t * (size_t)ldy + 8 * (h0 + hh), acc[hh * nt + t]);
    }
}
#undef qk_dpwssd
#undef qk_dot
#undef QK_I16
#endif

/* Tokens in passes of at most QK_ACT_MAX / nb (their table on the stack),
 * each pass over the 16-row groups [r0, r1) touches; a group cut by r0 or r1
 * is computed whole into a scratch tile (cut_tile_store). */
AI void qk_gemv(int q6, int64_t k, const void *w, int64_t r0, int64_t r1, const void *xq, size_t xq_stride,
                int n_tok, float *y, int64_t ldy) {
    const int64_t nb = k / TK_QK_K;
    if (nb > QK_ACT_MAX) { /* k beyond 245760: no pass fits; the definition */
        (q6 ? kern_gemv_q6_k_x16_ref : kern_gemv_q4_k_x16_ref)(k, w, r0, r1, xq, xq_stride, n_tok, y, ldy);
        return;
    }
    const int pass = (int)(QK_ACT_MAX / nb);
    const size_t gb = (size_t)nb * (q6 ? 3360 : 2304);
    int32_t tab[QK_ACT_MAX * QK_ENT];
    for (int p0 = 0; p0 < n_tok; p0 += pass) {
        const int np = n_tok - p0 < pass ? n_tok - p0 : pass;
        qk_act((const char *)xq + (size_t)p0 * xq_stride, xq_stride, np, nb, tab);
        for (int64_t g0 = r0 / 16 * 16; g0 < r1; g0 += 16) {
            const unsigned char *g = (const unsigned char *)w + (size_t)(g0 / 16) * gb;
            bool whole = g0 >= r0 && g0 + 16 <= r1;
            for (int t = 0; t < np; t += QK_NT) {
                int nt = np - t < QK_NT ? np - t : QK_NT;
                const unsigned char *nx = x16_tile_fetch(t, QK_NT, g0, r1, g + gb);
                float tmp[QK_NT * 16];
                float *dst = whole ? y + (size_t)(p0 + t) * (size_t)ldy + g0 : tmp;
                int64_t ld = whole ? ldy : 16;
                const int32_t *et = tab + (size_t)t * (size_t)nb * QK_ENT;
                switch (nt) {
#define QK_CASE(n)                                                                                           \
    case n:                                                                                                  \
        if (q6)                                                                                              \
            qk6_tile(nb, g, et, dst, ld, n, nx);                                                             \
        else                                                                                                 \
            qk4_tile(nb, g, et, dst, ld, n, nx);                                                             \
        break;
                    QK_CASE(1)
                    QK_CASE(2)
                    QK_CASE(3)
                    QK_CASE(4)
#if QK_NT > 4
                    QK_CASE(5)
                    QK_CASE(6)
                    QK_CASE(7)
                    QK_CASE(8)
#endif
#if QK_NT > 8
                    QK_CASE(9)
                    QK_CASE(10)
                    QK_CASE(11)
                    QK_CASE(12)
#endif
#undef QK_CASE
                default:
                    break;
                }
                if (!whole) cut_tile_store(y + (size_t)(p0 + t) * (size_t)ldy, ldy, tmp, 16, nt, g0, r0, r1);
            }
        }
    }
}
void KFN(gemv_q4_k_x16)(int64_t k, const void *w, int64_t r0, int64_t r1, const void *xq, size_t xq_stride,
                        int n_tok, float *y, int64_t ldy) {
    qk_gemv(0, k, w, r0, r1, xq, xq_stride, n_tok, y, ldy);
}

void KFN(gemv_q6_k_x16)(int64_t k, const void *w, int64_t r0, int64_t r1, const void *xq, size_t xq_stride,
                        int n_tok, float *y, int64_t ldy) {
    qk_gemv(1, k, w, r0, r1, xq, xq_stride, n_tok, y, ldy);
}
#undef QK_NT
#undef QK_ENT
