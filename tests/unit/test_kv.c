/* The paged KV cache: pool accounting, options, conversions per KV type, and
 * attention (every kernel the CPU can run) against a float64 computation over
 * a contiguous copy of the cache. */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

/* cmocka needs the headers above first */
#include <cmocka.h>

#include "core/alloc.h"
#include "core/cpu.h"
#include "core/dtype.h"
#include "core/error.h"
#include "kernels/kernels.h"
#include "kernels/kernels_ref.h"
#include "kv/kv.h"
#include "kv/kv_simd.h"

/* The shared x86 attention body (kvattn_body.h) built with 16-lane vectors
 * made of two AVX2 halves, so that the body the AVX-512 kernel uses (its
 * 16-wide loops, padding and tails) is checked on any machine with AVX2, not
 * only on AVX-512 ones. exp goes through expf lane by lane: the polynomial is
 * each ISA's own code, tested in its own kernel. Tests call it as one more
 * level after the CPU's ISAs (level_open). */
#if defined(__x86_64__)
#if defined(__clang__)
#pragma clang attribute push(__attribute__((target("avx2,fma,f16c"))), apply_to = function)
#else
#pragma GCC push_options
#pragma GCC target("avx2,fma,f16c")
#endif
#include <immintrin.h>
#define AI        static inline __attribute__((always_inline))
#define KFN(name) name##_vl16
#define VL        16
typedef struct {
    __m256 lo, hi;
} vf;
AI vf vf_load(const float *p) { return (vf){_mm256_loadu_ps(p), _mm256_loadu_ps(p + 8)}; }
AI void vf_store(float *p, vf v) { _mm256_storeu_ps(p, v.lo), _mm256_storeu_ps(p + 8, v.hi); }
AI vf vf_set1(float x) { return (vf){_mm256_set1_ps(x), _mm256_set1_ps(x)}; }
AI vf vf_zero(void) { return (vf){_mm256_setzero_ps(), _mm256_setzero_ps()}; }
AI vf vf_add(vf a, vf b) { return (vf){_mm256_add_ps(a.lo, b.lo), _mm256_add_ps(a.hi, b.hi)}; }
AI vf vf_sub(vf a, vf b) { return (vf){_mm256_sub_ps(a.lo, b.lo), _mm256_sub_ps(a.hi, b.hi)}; }
AI vf vf_mul(vf a, vf b) { return (vf){_mm256_mul_ps(a.lo, b.lo), _mm256_mul_ps(a.hi, b.hi)}; }
AI vf vf_max(vf a, vf b) { return (vf){_mm256_max_ps(a.lo, b.lo), _mm256_max_ps(a.hi, b.hi)}; }
AI vf vf_fmadd(vf a, vf b, vf c) {
    return (vf){_mm256_fmadd_ps(a.lo, b.lo, c.lo), _mm256_fmadd_ps(a.hi, b.hi, c.hi)};
}
AI float vf_hsum(vf v) {
    float x[16], s = 0.0f;
    vf_store(x, v);
    for (int i = 0; i < 16; i++) s += x[i];
    return s;
}
AI void vf_hsum_n(const vf *d, int n, float *out) {
    for (int i = 0; i < n; i++) out[i] = vf_hsum(d[i]);
}
AI float vf_hmax(vf v) {
    float x[16], m = -INFINITY;
    vf_store(x, v);
    for (int i = 0; i < 16; i++) m = fmaxf(m, x[i]);
    return m;
}
AI vf vf_exp_neg(vf v) {
    float x[16];
    vf_store(x, v);
    for (int i = 0; i < 16; i++) x[i] = expf(x[i]);
    return vf_load(x);
}
AI __m256 load8_kv(const uint8_t *row, int c, tk_kv_type type) {
    switch (type) {
    case TK_KV_F32:
        return _mm256_loadu_ps((const float *)row + c);
    case TK_KV_F16:
        return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)((const uint16_t *)row + c)));
    case TK_KV_BF16:
        return _mm256_castsi256_ps(_mm256_slli_epi32(
            _mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)((const uint16_t *)row + c))), 16));
    case TK_KV_INT8:
    default:
        return _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)(row + c))));
    }
}
AI vf vf_load_kv(const uint8_t *row, int c, tk_kv_type type) {
    return (vf){load8_kv(row, c, type), load8_kv(row, c + 8, type)};
}
AI void vf_store_f16(tk_f16 *y, vf v) {
    _mm_storeu_si128((__m128i *)y, _mm256_cvtps_ph(v.lo, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
    _mm_storeu_si128((__m128i *)(y + 8),
                     _mm256_cvtps_ph(v.hi, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
}
AI vf vf_abs(vf a) {
    const __m256 m = _mm256_set1_ps(-0.0f);
    return (vf){_mm256_andnot_ps(m, a.lo), _mm256_andnot_ps(m, a.hi)};
}
AI vf vf_div(vf a, vf b) { return (vf){_mm256_div_ps(a.lo, b.lo), _mm256_div_ps(a.hi, b.hi)}; }
AI bool vf_any_gt(vf a, vf b) {
    return _mm256_movemask_ps(_mm256_cmp_ps(a.lo, b.lo, _CMP_GT_OQ)) != 0 ||
           _mm256_movemask_ps(_mm256_cmp_ps(a.hi, b.hi, _CMP_GT_OQ)) != 0;
}
AI vf vf_select_gt(vf a, vf b, vf t, vf f) {
    return (vf){_mm256_blendv_ps(f.lo, t.lo, _mm256_cmp_ps(a.lo, b.lo, _CMP_GT_OQ)),
                _mm256_blendv_ps(f.hi, t.hi, _mm256_cmp_ps(a.hi, b.hi, _CMP_GT_OQ))};
}
AI vf vf_bcast4(const float *p) {
    const __m256 q = _mm256_broadcast_ps((const __m128 *)p);
    return (vf){q, q};
}
AI vf vf_pos_or_zero(vf s, vf v) {
    const __m256 z = _mm256_setzero_ps();
    return (vf){_mm256_and_ps(v.lo, _mm256_cmp_ps(s.lo, z, _CMP_GT_OQ)),
                _mm256_and_ps(v.hi, _mm256_cmp_ps(s.hi, z, _CMP_GT_OQ))};
}
AI void vf_store_i8(int8_t *y, vf v) {
    float x[16];
    vf_store(x, v);
    for (int i = 0; i < 16; i++) {
        float t = x[i] != x[i] ? 0.0f : x[i] > 127.0f ? 127.0f : x[i] < -127.0f ? -127.0f : x[i];
        y[i] = (int8_t)nearbyintf(t);
    }
}
#include "kernels/x86/kvattn_body.h"
#if defined(__clang__)
#pragma clang attribute pop
#else
#pragma GCC pop_options
#endif
#define HAVE_VL16 1
#endif

/* ---- helpers ------------------------------------------------------------------ */

static uint64_t rng_next(uint64_t *s) { /* splitmix64 */
    uint64_t z = (*s += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}
static float rng_unit(uint64_t *s) { return (float)((rng_next(s) >> 40) * (1.0 / 16777216.0)) * 2.0f - 1.0f; }

static tk_isa best_isa(void) {
    tk_cpu c;
    cpu_detect(&c);
    return cpu_best_isa(&c);
}

/* Whether the CPU runs level isa (an AVX-512 CPU may lack AVX-VNNI). */
static bool cpu_runs(int isa) {
    tk_cpu c;
    cpu_detect(&c);
    return cpu_has_isa(&c, (tk_isa)isa);
}

/* Attention levels the tests walk: the CPU's ISA levels 0..best_isa, then the
 * 16-lane body on AVX2 (see the top of the file) where it can run. */
static int n_levels(void) {
#ifdef HAVE_VL16
    if (best_isa() >= TK_ISA_AVX2) return (int)best_isa() + 2;
#endif
    return (int)best_isa() + 1;
}

/* Opens a pool whose attention runs at level lv; false (nothing opened) when
 * that level cannot take head_dim (the 16-lane body needs a multiple of 16). */
static bool level_open(const tk_kv_opts *o, int lv, tk_kv **kv) {
    if (lv <= (int)best_isa()) {
        if (!cpu_runs(lv)) return false;
        assert_int_equal(kv_init_isa(o, (tk_isa)lv, kv), TK_OK);
        return true;
    }
#ifdef HAVE_VL16
    if (o->head_dim % 16) return false;
    assert_int_equal(kv_init_isa(o, TK_ISA_SCALAR, kv), TK_OK);
    kv_set_attn(*kv, kv_attn_vl16, kv_attn_part_vl16, kv_attn_own_vl16);
    return true;
#else
    return false;
#endif
}

static tk_kv_opts opts_make(int n_layer, int n_head_kv, int head_dim, int bs, int n_blocks, tk_kv_type t,
                            tk_kv_scale sc) {
    return (tk_kv_opts){.n_layer = n_layer,
                        .n_head_kv = n_head_kv,
                        .head_dim = head_dim,
                        .block_size = bs,
                        .n_blocks = n_blocks,
                        .type = t,
                        .scale = sc};
}

/* kv_attention over what the pool holds now: with own-block records (INT8
 * per head) each query's record is taken first from the block as it stands,
 * which is what a query written last in its block sees. */
static void attend(const tk_kv *kv, int l, const int32_t *bt, int pos0, int n_q, const float *q, int n_head,
                   int h0, int h1, float scale, float *out, float *scratch) {
    float *own = NULL;
    if (kv_attn_own_block(kv)) {
        const int hd = kv_opts(kv)->head_dim;
        const size_t rec = (size_t)n_head * KV_PART_REC(hd);
        own = tk_malloc((size_t)(n_q > 0 ? n_q : 1) * rec * sizeof(float));
        assert_non_null(own);
        for (int i = 0; i < n_q; i++)
            kv_attention_own(kv, l, bt, pos0 + i, q + (size_t)i * n_head * hd, n_head, h0, h1, scale,
                             own + i * rec + (size_t)h0 * KV_PART_REC(hd), scratch, NULL, 0, 0);
    }
    kv_attention(kv, l, bt, pos0, n_q, q, n_head, h0, h1, scale, own, out, scratch, NULL, 0);
    tk_free(own);
}

/* The KV configurations every per-type test walks. */
typedef struct {
    tk_kv_type t;
    tk_kv_scale sc;
    const char *name;
} kv_kind;
static const kv_kind KINDS[] = {
    {TK_KV_F32, TK_KV_SCALE_HEAD, "f32"},        {TK_KV_F16, TK_KV_SCALE_HEAD, "f16"},
    {TK_KV_BF16, TK_KV_SCALE_HEAD, "bf16"},      {TK_KV_INT8, TK_KV_SCALE_TOKEN, "int8/token"},
    {TK_KV_INT8, TK_KV_SCALE_HEAD, "int8/head"},
};
#define N_KINDS ((int)(sizeof KINDS / sizeof KINDS[0]))
static const int BLOCK_SIZES[] = {16, 32, 64, 128, 256};

/* A block table of n_tab blocks allocated from the pool in a shuffled order,
 * so positions never sit in consecutive blocks. */
static void table_make(tk_kv *kv, int32_t *bt, int n_tab, uint64_t *rng) {
    int total = kv_blocks_total(kv);
    int32_t ids[1024];
    assert_true(total <= 1024 && n_tab <= total);
    for (int i = 0; i < total; i++) ids[i] = kv_block_alloc(kv);
    for (int i = total - 1; i > 0; i--) {
        int j = (int)(rng_next(rng) % (uint64_t)(i + 1));
        int32_t t = ids[i];
        ids[i] = ids[j];
        ids[j] = t;
    }
    for (int i = 0; i < n_tab; i++) bt[i] = ids[i];
    for (int i = n_tab; i < total; i++) kv_block_free(kv, ids[i]);
}

/* ---- pool ----------------------------------------------------------------------- */

static void test_kv_pool_accounting(void **state) {
    (void)state;
    uint64_t before = tk_alloc_live_bytes();
    tk_kv_opts o = opts_make(2, 2, 64, 16, 12, TK_KV_F16, TK_KV_SCALE_HEAD);
    tk_kv *kv;
    assert_int_equal(kv_init(&o, &kv), TK_OK);
    assert_true(tk_alloc_live_bytes() - before >= (uint64_t)o.n_blocks * kv_block_bytes(&o));
    assert_int_equal(kv_blocks_total(kv), 12);
    assert_int_equal(kv_blocks_free(kv), 12);
    assert_int_equal(kv_opts(kv)->head_dim, 64);
    int seen[12] = {0}, ids[12];
    for (int round = 0; round < 3; round++) { /* alloc all, free all, reuse */
        for (int i = 0; i < 12; i++) {
            ids[i] = kv_block_alloc(kv);
            assert_true(ids[i] >= 0 && ids[i] < 12);
            assert_false(seen[ids[i]]);
            seen[ids[i]] = 1;
            assert_int_equal(kv_blocks_free(kv), 11 - i);
        }
        assert_int_equal(kv_block_alloc(kv), -1);
        assert_int_equal(kv_blocks_free(kv), 0);
        /* free in a scrambled order */
        for (int i = 0; i < 12; i++) {
            int b = ids[(i * 5) % 12];
            kv_block_free(kv, b);
            seen[b] = 0;
        }
        assert_int_equal(kv_blocks_free(kv), 12);
    }
    /* partial reuse: a freed block comes back */
    int a = kv_block_alloc(kv), b = kv_block_alloc(kv);
    kv_block_free(kv, a);
    assert_int_equal(kv_block_alloc(kv), a);
    kv_block_free(kv, a);
    kv_block_free(kv, b);
    kv_free(kv);
    kv_free(NULL);
    assert_int_equal(tk_alloc_live_bytes(), before);
}

/* The pool's layout: a (layer, kv head)'s blocks side by side, one unit
 * (kv_run_bytes) each, with the unit's K, V and scales inside it, and no two
 * units overlapping. */
static void test_kv_layout_units(void **state) {
    (void)state;
    for (int k = 0; k < N_KINDS; k++)
        for (int bi = 0; bi < 2; bi++) {
            const int n_layer = 3, n_kvh = 2, n_blocks = 5, hd = 32, bs = bi ? 128 : 16;
            tk_kv_opts o = opts_make(n_layer, n_kvh, hd, bs, n_blocks, KINDS[k].t, KINDS[k].sc);
            tk_kv *kv;
            assert_int_equal(kv_init(&o, &kv), TK_OK);
            const size_t unit = kv_run_bytes(&o), es = kv_type_size(KINDS[k].t);
            assert_true(unit % 64 == 0 && unit >= 2 * (size_t)bs * (size_t)hd * es);
            const uint8_t *first = NULL, *prev = NULL;
            for (int l = 0; l < n_layer; l++) {
                kv_geom g = kv_layer_geom(kv, l);
                for (int h = 0; h < n_kvh; h++)
                    for (int b = 0; b < n_blocks; b++) {
                        const uint8_t *u = kv_geom_k(&g, b, h);
                        if (!first) first = u;
                        /* layer-major, then kv head, then block: each unit right after the last */
                        assert_ptr_equal(u, first + (size_t)((l * n_kvh + h) * n_blocks + b) * unit);
                        assert_true(prev == NULL || u == prev + unit);
                        prev = u;
                        assert_true((uintptr_t)u % 64 == 0);
                        const uint8_t *v = kv_geom_v(&g, b, h);
                        assert_ptr_equal(v, u + (size_t)bs * (size_t)hd * es);
                        const float *ks = kv_geom_ks(&g, b, h), *vs = kv_geom_vs(&g, b, h);
                        if (KINDS[k].t != TK_KV_INT8) {
                            assert_null(ks);
                            continue;
                        }
                        const size_t ns = KINDS[k].sc == TK_KV_SCALE_TOKEN ? (size_t)bs : (size_t)hd;
                        assert_ptr_equal((const uint8_t *)ks, v + (size_t)bs * (size_t)hd);
                        assert_ptr_equal(vs, ks + ns);
                        assert_true((const uint8_t *)(vs + ns) <= u + unit);
                    }
            }
            /* a fresh pool hands out consecutive ids, and blocks freed last
             * first come back in their order: a sequence's units side by side */
            int32_t ids[4];
            for (int i = 0; i < 4; i++) assert_int_equal(ids[i] = kv_block_alloc(kv), i);
            for (int i = 3; i >= 0; i--) kv_block_free(kv, ids[i]);
            for (int i = 0; i < 4; i++) assert_int_equal(kv_block_alloc(kv), i);
            kv_free(kv);
        }
}

/* Shared blocks: a block with several holders goes back to the pool only when
 * the last lets go, and a copy carries every layer's K, V and scales. */
/* kv_block_copy of a block's first n slots, every kind, blocks of 16 and 128
 * (int8 K by columns at 128 where the level dots int8 queries): the copied
 * positions read back as the source's; the destination's positions past the
 * copied K group read back as they were (types whose scales are not every
 * slot's); the source is unchanged. */
static void test_kv_block_copy_slots(void **state) {
    (void)state;
    const int bss[] = {16, 128};
    for (int k = 0; k < N_KINDS; k++)
        for (int ib = 0; ib < 2; ib++) {
            const int bs = bss[ib], n = bs == 16 ? 7 : 37, hd = 64, nh = 2, L = 2;
            tk_kv_opts o = opts_make(L, nh, hd, bs, 3, KINDS[k].t, KINDS[k].sc);
            tk_kv *kv;
            assert_int_equal(kv_init(&o, &kv), TK_OK);
            int32_t a[1] = {kv_block_alloc(kv)}, b[1] = {kv_block_alloc(kv)};
            float kx[128], vx[128];
            uint64_t rng = 11 + (uint64_t)k;
            for (int l = 0; l < L; l++)
                for (int p = 0; p < bs; p++) {
                    for (int i = 0; i < nh * hd; i++) kx[i] = (float)(rng_next(&rng) % 2001) / 1000.0f - 1.0f;
                    for (int i = 0; i < nh * hd; i++) vx[i] = (float)(rng_next(&rng) % 2001) / 100.0f - 10.0f;
                    if (p < n + 5) kv_write(kv, l, a, p, kx, vx);
                    for (int i = 0; i < nh * hd; i++) kx[i] *= 0.5f, vx[i] += 1.0f;
                    kv_write(kv, l, b, p, kx, vx);
                }
            float ka[128], va[128], kb[128], vb[128];
            float *before = tk_calloc((size_t)L * bs * 2 * nh * hd, sizeof(float));
            float *asrc = tk_calloc((size_t)L * bs * 2 * nh * hd, sizeof(float));
            for (int l = 0; l < L; l++)
                for (int p = 0; p < bs; p++) {
                    float *bb = before + ((size_t)l * bs + p) * 2 * nh * hd;
                    kv_read(kv, l, b, p, bb, bb + nh * hd);
                    if (p < n + 5) {
                        float *aa = asrc + ((size_t)l * bs + p) * 2 * nh * hd;
                        kv_read(kv, l, a, p, aa, aa + nh * hd);
                    }
                }
            kv_block_copy(kv, b[0], a[0], n);
            const bool per_head = KINDS[k].t == TK_KV_INT8 && KINDS[k].sc == TK_KV_SCALE_HEAD;
            const int kgroup = (n + KV_KT - 1) / KV_KT * KV_KT;
            for (int l = 0; l < L; l++)
                for (int p = 0; p < bs; p++) {
                    kv_read(kv, l, b, p, kb, vb);
                    const float *bb = before + ((size_t)l * bs + p) * 2 * nh * hd;
                    if (p < n) {
                        kv_read(kv, l, a, p, ka, va);
                        assert_memory_equal(ka, kb, sizeof(float) * (size_t)(nh * hd));
                        assert_memory_equal(va, vb, sizeof(float) * (size_t)(nh * hd));
                    } else if (!per_head && p >= kgroup) {
                        assert_memory_equal(kb, bb, sizeof(float) * (size_t)(nh * hd));
                        assert_memory_equal(vb, bb + nh * hd, sizeof(float) * (size_t)(nh * hd));
                    }
                    if (p < n + 5) { /* the source as it was */
                        kv_read(kv, l, a, p, ka, va);
                        const float *aa = asrc + ((size_t)l * bs + p) * 2 * nh * hd;
                        assert_memory_equal(ka, aa, sizeof(float) * (size_t)(nh * hd));
                        assert_memory_equal(va, aa + nh * hd, sizeof(float) * (size_t)(nh * hd));
                    }
                }
            tk_free(before);
            tk_free(asrc);
            kv_block_free(kv, a[0]);
            kv_block_free(kv, b[0]);
            kv_free(kv);
        }
}

static void test_kv_block_refs_and_copy(void **state) {
    (void)state;
    for (int k = 0; k < N_KINDS; k++) {
        tk_kv_opts o = opts_make(3, 2, 32, 16, 3, KINDS[k].t, KINDS[k].sc);
        tk_kv *kv;
        assert_int_equal(kv_init(&o, &kv), TK_OK);
        int32_t a[1] = {kv_block_alloc(kv)}, b[1] = {kv_block_alloc(kv)};
        assert_int_equal(kv_block_refs(kv, a[0]), 1);
        assert_int_equal(kv_block_refs(kv, 2), 0);
        kv_block_ref(kv, a[0]);
        kv_block_ref(kv, a[0]);
        assert_int_equal(kv_block_refs(kv, a[0]), 3);
        kv_block_free(kv, a[0]);
        kv_block_free(kv, a[0]);
        assert_int_equal(kv_blocks_free(kv), 1); /* still held once */
        assert_int_equal(kv_block_refs(kv, a[0]), 1);
        /* write 11 positions into a, copy to b: every layer reads back the same */
        float kx[64], vx[64], ka[64], va[64], kb[64], vb[64];
        uint64_t rng = 7 + (uint64_t)k;
        for (int l = 0; l < 3; l++)
            for (int p = 0; p < 11; p++) {
                for (int i = 0; i < 64; i++) kx[i] = (float)(rng_next(&rng) % 2001) / 1000.0f - 1.0f;
                for (int i = 0; i < 64; i++) vx[i] = (float)(rng_next(&rng) % 2001) / 100.0f - 10.0f;
                kv_write(kv, l, a, p, kx, vx);
            }
        kv_block_copy(kv, b[0], a[0], 16);
        for (int l = 0; l < 3; l++)
            for (int p = 0; p < 11; p++) {
                kv_read(kv, l, a, p, ka, va);
                kv_read(kv, l, b, p, kb, vb);
                assert_memory_equal(ka, kb, sizeof ka);
                assert_memory_equal(va, vb, sizeof va);
                assert_true(kv_read_scale(kv, l, a, p, 1, 5, true) == kv_read_scale(kv, l, b, p, 1, 5, true));
            }
        /* the copy is its own: writing b leaves a as it was */
        for (int i = 0; i < 64; i++) kx[i] = vx[i] = 50.0f;
        kv_write(kv, 0, b, 11, kx, vx);
        kv_read(kv, 0, a, 3, ka, va);
        kv_read(kv, 0, b, 3, kb, vb);
        if (KINDS[k].t == TK_KV_INT8 && KINDS[k].sc == TK_KV_SCALE_HEAD)
            assert_memory_not_equal(va, vb, sizeof va); /* b's scales grew */
        else
            assert_memory_equal(va, vb, sizeof va);
        kv_block_free(kv, a[0]);
        kv_block_free(kv, b[0]);
        assert_int_equal(kv_blocks_free(kv), 3);
        kv_free(kv);
    }
}

static void expect_fail(const tk_kv_opts *o, tk_status want, const char *needle) {
    tk_kv *kv = (tk_kv *)&kv; /* must be reset to NULL on failure */
    tk_status st = kv_init(o, &kv);
    if (st != want || !strstr(tk_last_error(), needle))
        fail_msg("want %s containing '%s', got %s '%s'", tk_status_str(want), needle, tk_status_str(st),
                 tk_last_error());
    assert_null(kv);
}

static void test_kv_opts_validation(void **state) {
    (void)state;
    const tk_kv_opts good = opts_make(2, 2, 64, 32, 8, TK_KV_INT8, TK_KV_SCALE_TOKEN);
    tk_kv_opts o;
    o = good, o.n_layer = 0;
    expect_fail(&o, TK_ERR_INVALID, "n_layer");
    o = good, o.n_head_kv = -1;
    expect_fail(&o, TK_ERR_INVALID, "n_head_kv");
    o = good, o.head_dim = 0;
    expect_fail(&o, TK_ERR_INVALID, "head_dim");
    o = good, o.head_dim = KV_MAX_HEAD_DIM + 1;
    expect_fail(&o, TK_ERR_INVALID, "head_dim");
    o = good, o.n_blocks = 0;
    expect_fail(&o, TK_ERR_INVALID, "n_blocks");
    int bad_bs[] = {0, 8, 48, 100, 512, -16};
    for (size_t i = 0; i < sizeof bad_bs / sizeof bad_bs[0]; i++) {
        o = good, o.block_size = bad_bs[i];
        expect_fail(&o, TK_ERR_INVALID, "block_size");
    }
    o = good, o.type = (tk_kv_type)7;
    expect_fail(&o, TK_ERR_INVALID, "type");
    o = good, o.scale = (tk_kv_scale)-1;
    expect_fail(&o, TK_ERR_INVALID, "scale");
    /* More than the machine has: refused with the byte count, before any allocation. */
    o = opts_make(64, 64, 256, 256, 1 << 20, TK_KV_F32, TK_KV_SCALE_HEAD);
    expect_fail(&o, TK_ERR_NOMEM, "bytes");
    /* Products that overflow size_t. */
    o = opts_make(1 << 30, 1 << 30, KV_MAX_HEAD_DIM, 256, 1 << 30, TK_KV_F32, TK_KV_SCALE_HEAD);
    expect_fail(&o, TK_ERR_NOMEM, "overflows");
    assert_int_equal(kv_block_bytes(&o), 0);
    assert_int_equal(kv_bytes_per_token(&o), 0);
    o = good, o.block_size = 24;
    assert_int_equal(kv_block_bytes(&o), 0);
    /* Sizes depend on the block shape only: the engine asks before it knows
     * how many blocks a kv_mem budget buys. */
    o = good, o.n_blocks = 0;
    assert_int_equal(kv_block_bytes(&o), kv_block_bytes(&good));
    assert_true(kv_block_bytes(&o) > 0 && kv_bytes_per_token(&o) > 0);
    assert_int_equal(kv_bytes_per_token(NULL), 0);
    tk_kv *kv;
    assert_int_equal(kv_init(NULL, &kv), TK_ERR_INVALID);
    assert_int_equal(kv_init(&good, NULL), TK_ERR_INVALID);
    /* every level the CPU runs, and none other (an AVX-512 CPU may lack AVX-VNNI) */
    for (int isa = 0; isa < TK_ISA_COUNT; isa++) {
        assert_int_equal(kv_init_isa(&good, (tk_isa)isa, &kv), cpu_runs(isa) ? TK_OK : TK_ERR_UNSUPPORTED);
        if (!cpu_runs(isa)) assert_null(kv);
        kv_free(kv);
    }
    assert_int_equal(kv_init_isa(&good, (tk_isa)TK_ISA_COUNT, &kv), TK_ERR_UNSUPPORTED);
    assert_null(kv);
    /* Every valid block size works, and a pool frees cleanly. */
    for (int i = 0; i < 5; i++) {
        o = good, o.block_size = BLOCK_SIZES[i];
        assert_int_equal(kv_init(&o, &kv), TK_OK);
        kv_free(kv);
    }
}

static void test_kv_bytes_per_token(void **state) {
    (void)state;
    /* Qwen3-0.6B: 28 layers, 8 KV heads of 128. */
    tk_kv_opts f16 = opts_make(28, 8, 128, 16, 1, TK_KV_F16, TK_KV_SCALE_HEAD);
    tk_kv_opts tok = opts_make(28, 8, 128, 16, 1, TK_KV_INT8, TK_KV_SCALE_TOKEN);
    tk_kv_opts head = opts_make(28, 8, 128, 16, 1, TK_KV_INT8, TK_KV_SCALE_HEAD);
    tk_kv_opts f32 = opts_make(28, 8, 128, 16, 1, TK_KV_F32, TK_KV_SCALE_HEAD);
    assert_int_equal(kv_bytes_per_token(&f32), 28 * 2 * 8 * 128 * 4);
    assert_int_equal(kv_bytes_per_token(&f16), 28 * 2 * 8 * 128 * 2);               /* 114688 */
    assert_int_equal(kv_bytes_per_token(&tok), 28 * 2 * 8 * (128 + 4));             /* 59136 */
    assert_int_equal(kv_bytes_per_token(&head), 28 * 2 * 8 * (128 + 128 * 4 / 16)); /* 71680 at 16 slots */
    print_message("KV bytes/token, Qwen3-0.6B shapes (28 layers, 8 kv heads x 128):\n");
    print_message("  f32 %zu  f16 %zu  int8/token %zu\n", kv_bytes_per_token(&f32), kv_bytes_per_token(&f16),
                  kv_bytes_per_token(&tok));
    for (int i = 0; i < 5; i++) {
        head.block_size = BLOCK_SIZES[i];
        f16.block_size = BLOCK_SIZES[i];
        size_t bpt = kv_bytes_per_token(&head);
        print_message("  int8/head, block %3d: %zu (%.3fx of f16)\n", BLOCK_SIZES[i], bpt,
                      (double)bpt / (double)kv_bytes_per_token(&f16));
        /* A block's bytes cover its tokens; the padding to 64 is at most 63 per (layer, kv head). */
        assert_true(kv_block_bytes(&head) >= bpt * (size_t)head.block_size - (size_t)head.block_size);
        assert_true(kv_block_bytes(&head) <= bpt * (size_t)head.block_size + 64u * 28u * 8u);
        assert_int_equal(kv_block_bytes(&f16), kv_bytes_per_token(&f16) * (size_t)f16.block_size);
        /* one (layer, kv head, block) unit: its K and V, and int8's scales */
        assert_int_equal(kv_run_bytes(&head), 2u * ((size_t)head.block_size * 128u + 128u * 4u));
        assert_int_equal(kv_run_bytes(&f16), 2u * (size_t)f16.block_size * 128u * 2u);
        assert_int_equal(kv_block_bytes(&f16), 28u * 8u * kv_run_bytes(&f16));
    }
    f32.block_size = 128;
    assert_int_equal(kv_run_bytes(&f32), 2u * 128u * 128u * 4u);
    f32.block_size = 100; /* a block size kv_init refuses */
    assert_int_equal(kv_run_bytes(&f32), 0);
    assert_int_equal(kv_run_bytes(NULL), 0);
}

/* ---- conversions ------------------------------------------------------------------ */

/* Float values that exercise rounding: ties, subnormals, overflow to inf. */
static float special_value(int i, uint64_t *rng) {
    static const float sp[] = {0.0f,
                               -0.0f,
                               1.0f,
                               -1.0f,
                               65504.0f,
                               65520.0f,
                               -7.0e4f,
                               1.0f + 1.0f / 2048,
                               1.0f + 3.0f / 2048,
                               6.0e-8f,
                               3.0e-8f,
                               1.0e-5f,
                               1e30f,
                               -INFINITY,
                               INFINITY,
                               3.140625f,
                               1.00390625f,
                               1.01171875f};
    int n = (int)(sizeof sp / sizeof sp[0]);
    if (i < n) return sp[i];
    float x = rng_unit(rng);
    return x * ldexpf(1.0f, (int)(rng_next(rng) % 40) - 24);
}

static void test_kv_roundtrip_float(void **state) {
    (void)state;
    uint64_t rng = 1;
    const int hd = 72, nkv = 3, n_pos = 40; /* 72: an AVX2 tail of 0 but not an AVX-512 multiple */
    float k[3 * 72], v[3 * 72], rk[3 * 72], rv[3 * 72];
    for (int isa = 0; isa <= (int)best_isa(); isa++) {
        if (!cpu_runs(isa)) continue;
        for (int kind = 0; kind < 3; kind++) {
            tk_kv_opts o = opts_make(2, nkv, hd, 16, 4, KINDS[kind].t, TK_KV_SCALE_HEAD);
            tk_kv *kv;
            assert_int_equal(kv_init_isa(&o, (tk_isa)isa, &kv), TK_OK);
            int32_t bt[3];
            table_make(kv, bt, 3, &rng);
            for (int pos = 0; pos < n_pos; pos++) {
                for (int i = 0; i < nkv * hd; i++) {
                    k[i] = special_value((pos * 7 + i) % 200, &rng);
                    v[i] = special_value((pos * 3 + i * 5) % 200, &rng);
                }
                kv_write(kv, 1, bt, pos, k, v);
                kv_read(kv, 1, bt, pos, rk, rv);
                for (int i = 0; i < nkv * hd; i++) {
                    float ek = k[i], ev = v[i];
                    if (o.type == TK_KV_F16) {
                        ek = tk_f16_to_f32(tk_f32_to_f16(ek));
                        ev = tk_f16_to_f32(tk_f32_to_f16(ev));
                    } else if (o.type == TK_KV_BF16) {
                        ek = tk_bf16_to_f32(tk_f32_to_bf16(ek));
                        ev = tk_bf16_to_f32(tk_f32_to_bf16(ev));
                    }
                    if (memcmp(&ek, &rk[i], 4) || memcmp(&ev, &rv[i], 4))
                        fail_msg("%s isa %d pos %d i %d: k %g -> %g (want %g), v %g -> %g (want %g)",
                                 KINDS[kind].name, isa, pos, i, k[i], rk[i], ek, v[i], rv[i], ev);
                }
            }
            kv_free(kv);
        }
    }
}

static void test_kv_roundtrip_int8_token(void **state) {
    (void)state;
    uint64_t rng = 2;
    const int hd = 64, nkv = 2;
    float k[128], v[128], rk[128], rv[128];
    tk_kv_opts o = opts_make(1, nkv, hd, 32, 3, TK_KV_INT8, TK_KV_SCALE_TOKEN);
    tk_kv *kv;
    assert_int_equal(kv_init(&o, &kv), TK_OK);
    int32_t bt[3];
    table_make(kv, bt, 3, &rng);
    for (int pos = 0; pos < 96; pos++) {
        float mag = ldexpf(1.0f, (int)(rng_next(&rng) % 20) - 10);
        for (int i = 0; i < nkv * hd; i++) {
            k[i] = rng_unit(&rng) * mag;
            v[i] = pos % 17 == 5 ? 0.0f : rng_unit(&rng) * mag * 3.0f; /* some all-zero vectors */
        }
        kv_write(kv, 0, bt, pos, k, v);
        kv_read(kv, 0, bt, pos, rk, rv);
        for (int h = 0; h < nkv; h++) {
            float ak = 0, av = 0;
            for (int i = 0; i < hd; i++) {
                ak = fmaxf(ak, fabsf(k[h * hd + i]));
                av = fmaxf(av, fabsf(v[h * hd + i]));
            }
            float sk = kv_read_scale(kv, 0, bt, pos, h, 0, false),
                  sv = kv_read_scale(kv, 0, bt, pos, h, 5, true);
            assert_float_equal(sk, ak / 127.0f, ak * 1e-6f);
            assert_float_equal(sv, av / 127.0f, av * 1e-6f);
            for (int i = 0; i < hd; i++) {
                assert_true(fabsf(rk[h * hd + i] - k[h * hd + i]) <= sk * 0.5f * (1 + 1e-5f));
                assert_true(fabsf(rv[h * hd + i] - v[h * hd + i]) <= sv * 0.5f * (1 + 1e-5f));
            }
        }
    }
    kv_free(kv);
}

/* Per-head scales (one per block, head and channel), the rescale path:
 * magnitudes drift up within each block, differently per channel, so channels
 * rescale several times. Checks, per element (position, channel):
 *  - a new value is within its channel scale / 2;
 *  - a channel's scale only grows, by at least KV_INT8_MIN_GROWTH, and then
 *    moves its old values by at most new scale / 2 (round-to-nearest) while
 *    every other channel's values stay as they were;
 *  - the total error stays within the sum of the scales it went through / 2,
 *    which the minimum growth bounds by 4.5 * final scale. */
static void test_kv_int8_head_rescale(void **state) {
    (void)state;
    uint64_t rng = 3;
    enum { HD = 32, BS = 64, NPOS = 160 };
    static float k[NPOS][HD], prev[NPOS][HD], cur[NPOS][HD], bound[NPOS][HD];
    float rk[HD], rv[HD], v[HD] = {0}, s_old[HD], s[HD];
    tk_kv_opts o = opts_make(1, 1, HD, BS, 4, TK_KV_INT8, TK_KV_SCALE_HEAD);
    tk_kv *kv;
    assert_int_equal(kv_init(&o, &kv), TK_OK);
    int32_t bt[3];
    table_make(kv, bt, 3, &rng);
    int rescales = 0;
    for (int pos = 0; pos < NPOS; pos++) {
        int slot = pos % BS, start = pos - slot;
        for (int i = 0; i < HD; i++) {
            float mag = 1.0f + (float)slot * 0.01f * (float)(i % 5); /* channels grow 1x..3.5x over a block */
            if (i == 7) mag = 1.0f + (float)slot * 0.002f;           /* slow drift: many small excesses */
            if ((slot + i) % 9 == 4) mag *= 1.6f;                    /* occasional jumps */
            k[pos][i] = (i == 7 ? 0.9f + 0.1f * rng_unit(&rng) : rng_unit(&rng)) * mag;
        }
        for (int i = 0; i < HD; i++) s_old[i] = slot ? kv_read_scale(kv, 0, bt, start, 0, i, false) : 0.0f;
        kv_write(kv, 0, bt, pos, k[pos], v);
        for (int i = 0; i < HD; i++) s[i] = kv_read_scale(kv, 0, bt, pos, 0, i, false);
        for (int p = start; p <= pos; p++) {
            kv_read(kv, 0, bt, p, rk, rv);
            memcpy(cur[p], rk, sizeof rk);
        }
        for (int i = 0; i < HD; i++) {
            if (s[i] != s_old[i] && slot > 0 && s_old[i] > 0) {
                rescales++;
                assert_true(s[i] >= s_old[i] * KV_INT8_MIN_GROWTH * (1 - 1e-6f));
                for (int p = start; p < pos; p++) {
                    bound[p][i] += s[i] * 0.5f;
                    assert_true(fabsf(cur[p][i] - prev[p][i]) <= s[i] * 0.5f * (1 + 1e-5f));
                }
            } else {
                if (slot > 0) assert_true(s[i] == s_old[i] || s_old[i] == 0);
                for (int p = start; p < pos; p++)
                    assert_true(memcmp(&cur[p][i], &prev[p][i], sizeof(float)) == 0 || s_old[i] == 0);
            }
            bound[pos][i] = s[i] * 0.5f;
            for (int p = start; p <= pos; p++) {
                float err = fabsf(cur[p][i] - k[p][i]);
                assert_true(err <= bound[p][i] * (1 + 1e-5f) + 1e-7f);
                assert_true(err <= 4.5f * s[i] * (1 + 1e-5f));
                if (p == pos) assert_true(err <= s[i] * 0.5f * (1 + 1e-5f));
            }
        }
        for (int p = start; p <= pos; p++) memcpy(prev[p], cur[p], sizeof cur[p]);
    }
    assert_true(rescales >= 50); /* the path ran: 3 blocks of growing channels */
    /* A reused block starts afresh at slot 0: small values get small scales. */
    kv_block_free(kv, bt[0]);
    int32_t b2[1] = {kv_block_alloc(kv)};
    assert_int_equal(b2[0], bt[0]);
    for (int i = 0; i < HD; i++) k[0][i] = 0.001f * rng_unit(&rng);
    kv_write(kv, 0, b2, 0, k[0], v);
    for (int i = 0; i < HD; i++)
        assert_float_equal(kv_read_scale(kv, 0, b2, 0, 0, i, false), fabsf(k[0][i]) / 127.0f, 1e-12);
    kv_free(kv);
}

/* Why per-channel scales: with channels of different magnitudes (two 6x
 * outliers, as in real models' K) they quantize much better than per-token
 * scales, and on plain gaussian data they are no worse at short blocks.
 * Relative RMS error over 512 positions, blocks of 16 and 128. */
static double int8_rel_rms(tk_kv_scale sc, int bs, bool outliers) {
    enum { HD = 64, NPOS = 512 };
    uint64_t rng = 11;
    tk_kv_opts o = opts_make(1, 1, HD, bs, NPOS / bs, TK_KV_INT8, sc);
    tk_kv *kv;
    assert_int_equal(kv_init(&o, &kv), TK_OK);
    int32_t bt[32];
    for (int i = 0; i < NPOS / bs; i++) bt[i] = kv_block_alloc(kv);
    static float x[NPOS][HD];
    float gain[HD], rk[HD], rv[HD];
    for (int i = 0; i < HD; i++) gain[i] = 0.5f + (float)(rng_next(&rng) % 1000) * 1e-3f;
    if (outliers) gain[3] *= 6.0f, gain[40] *= 6.0f;
    for (int p = 0; p < NPOS; p++) {
        for (int i = 0; i < HD; i++) x[p][i] = rng_unit(&rng) * gain[i];
        kv_write(kv, 0, bt, p, x[p], x[p]);
    }
    double e2 = 0, x2 = 0;
    for (int p = 0; p < NPOS; p++) {
        kv_read(kv, 0, bt, p, rk, rv);
        for (int i = 0; i < HD; i++) e2 += (rk[i] - x[p][i]) * (rk[i] - x[p][i]), x2 += x[p][i] * x[p][i];
    }
    kv_free(kv);
    return sqrt(e2 / x2);
}

static void test_kv_int8_head_vs_token_error(void **state) {
    (void)state;
    for (int bs = 16; bs <= 128; bs *= 8) {
        double ho = int8_rel_rms(TK_KV_SCALE_HEAD, bs, true), to = int8_rel_rms(TK_KV_SCALE_TOKEN, bs, true);
        double hp = int8_rel_rms(TK_KV_SCALE_HEAD, bs, false),
               tp = int8_rel_rms(TK_KV_SCALE_TOKEN, bs, false);
        print_message("int8 relative RMS error, %d slots: outlier channels: per head %.2e per token %.2e; "
                      "plain: per head %.2e per token %.2e\n",
                      bs, ho, to, hp, tp);
        assert_true(ho < 0.7 * to);
        if (bs == 16) assert_true(hp < to);
    }
}

/* ---- attention ------------------------------------------------------------------ */

/* float64 attention of query vector q against a contiguous copy of positions
 * [0, len): K/V [len][n_head_kv][hd] (already dequantized from the pool). */
static void attn_f64(const float *K, const float *V, int len, int nkv, int hd, int kvh, const float *q,
                     float scale, double *out) {
    double mx = -INFINITY, sum = 0;
    double s[1200];
    assert_true(len <= 1200);
    for (int p = 0; p < len; p++) {
        double d = 0;
        for (int c = 0; c < hd; c++) d += (double)q[c] * K[((size_t)p * nkv + kvh) * hd + c];
        s[p] = d * scale;
        if (s[p] > mx) mx = s[p];
    }
    for (int c = 0; c < hd; c++) out[c] = 0;
    for (int p = 0; p < len; p++) {
        double e = exp(s[p] - mx);
        sum += e;
        for (int c = 0; c < hd; c++) out[c] += e * V[((size_t)p * nkv + kvh) * hd + c];
    }
    for (int c = 0; c < hd; c++) out[c] /= sum;
}

typedef struct attn_case {
    int isa, kind, bs, len, n_q, n_head, nkv, hd;
    bool q8; /* int8 queries (kv_geom.q8) at a level that has no such kernel: the reference's */
} attn_case;

/* Output error bound of int8 queries against the float64 attention, as a
 * fraction of max|V|. The query of each block is rounded at max|q*ks| / 127,
 * so a score moves by at most scale * max|q*ks| / 254 * sum|k| (about 0.4% of
 * a typical score's spread); on these tests' data (uniform q in [-2, 2],
 * peaked K rows) the outputs' error measures <= 0.6% of max|V|, with INT8 K
 * and V's own rounding included. */
#define Q8_BOUND 3e-2

/* Fills a pool with len random positions, runs kv_attention (at level c->isa,
 * see level_open) for the last n_q queries, and compares with attn_f64.
 * Returns the max error relative to max|V|, or 0 when the level cannot take
 * the head_dim. */
static double attn_check(const attn_case *c, uint64_t *rng) {
    const int n_tab = (c->len + c->bs - 1) / c->bs;
    tk_kv_opts o = opts_make(2, c->nkv, c->hd, c->bs, n_tab + 3, KINDS[c->kind].t, KINDS[c->kind].sc);
    tk_kv *kv;
    if (!level_open(&o, c->isa, &kv)) return 0;
    if (c->q8) kv_set_query_int8(kv, true);
    int32_t bt[128];
    table_make(kv, bt, n_tab, rng);
    const size_t row = (size_t)c->nkv * c->hd, qrow = (size_t)c->n_head * c->hd;
    float *K = tk_malloc((size_t)c->len * row * 4), *V = tk_malloc((size_t)c->len * row * 4);
    float *kx = tk_malloc(row * 4), *vx = tk_malloc(row * 4);
    float *q = tk_malloc((size_t)c->n_q * qrow * 4), *out = tk_malloc((size_t)c->n_q * qrow * 4);
    /* Exactly the advertised scratch, so ASan catches an overrun. */
    float *scratch = tk_malloc(kv_attn_scratch_floats(kv, c->len) * 4);
    double *ref = tk_malloc((size_t)c->hd * 8);
    assert_non_null(scratch);
    for (int p = 0; p < c->len; p++) {
        /* Peaked scores now and then, so softmax is not near-uniform. */
        float kmag = (rng_next(rng) % 11 == 0) ? 4.0f : 1.0f;
        for (size_t i = 0; i < row; i++) {
            kx[i] = rng_unit(rng) * kmag;
            vx[i] = rng_unit(rng);
        }
        kv_write(kv, 1, bt, p, kx, vx);
    }
    /* The reference reads what the pool holds (after each write's rescales). */
    double vmax = 0;
    for (int p = 0; p < c->len; p++) {
        kv_read(kv, 1, bt, p, K + p * row, V + p * row);
        for (size_t i = 0; i < row; i++) vmax = fmax(vmax, fabs(V[p * row + i]));
    }
    for (size_t i = 0; i < (size_t)c->n_q * qrow; i++) q[i] = rng_unit(rng) * 2.0f;
    const int pos0 = c->len - c->n_q;
    const float scale = 1.0f / sqrtf((float)c->hd);
    attend(kv, 1, bt, pos0, c->n_q, q, c->n_head, 0, c->n_head, scale, out, scratch);
    double err = 0;
    const int ratio = c->n_head / c->nkv;
    if (kv_query_int8(kv)) {
        /* int8 queries: the kernel gives the reference's scores bit for bit,
         * so against it the bound is float rounding; against float64 it is
         * Q8_BOUND (the caller's). */
        float *want = tk_malloc((size_t)c->n_q * qrow * 4);
        kv_set_attn(kv, kv_attn_ref, kv_attn_part_ref, kv_attn_own_ref);
        attend(kv, 1, bt, pos0, c->n_q, q, c->n_head, 0, c->n_head, scale, want, scratch);
        double e = 0;
        for (size_t i = 0; i < (size_t)c->n_q * qrow; i++) e = fmax(e, fabs(out[i] - want[i]) / vmax);
        tk_free(want);
        if (!(e <= 1e-5))
            fail_msg(
                "attention int8 queries %s isa %d bs %d len %d n_q %d: %.3g of max|V| from the reference",
                KINDS[c->kind].name, c->isa, c->bs, c->len, c->n_q, e);
    }
    for (int i = 0; i < c->n_q; i++)
        for (int h = 0; h < c->n_head; h++) {
            attn_f64(K, V, pos0 + i + 1, c->nkv, c->hd, h / ratio, q + i * qrow + (size_t)h * c->hd, scale,
                     ref);
            for (int d = 0; d < c->hd; d++)
                err = fmax(err, fabs(out[i * qrow + (size_t)h * c->hd + d] - ref[d]) / vmax);
        }
    tk_free(K), tk_free(V), tk_free(kx), tk_free(vx), tk_free(q), tk_free(out), tk_free(scratch),
        tk_free(ref);
    kv_free(kv);
    return err;
}

/* Largest error of int8-query attention against float64 seen by attn_expect. */
static double q8_err_max;

/* Whether case c runs with int8 queries (so is bounded by Q8_BOUND). */
static bool case_q8(const attn_case *c) {
    if (KINDS[c->kind].t != TK_KV_INT8) return false;
    if (c->q8) return true;
    if (c->isa > (int)best_isa()) return false;
    tk_isa lv; /* the level the pool's attention runs at (a head_dim its lanes do not divide falls back) */
    (void)kern_attn_for((tk_isa)c->isa, c->hd, &lv);
    return kernels_get(lv)->attn_q8;
}

static void attn_expect(const attn_case *c, uint64_t *rng) {
    double err = attn_check(c, rng);
    if (case_q8(c)) {
        q8_err_max = fmax(q8_err_max, err);
        if (!(err <= Q8_BOUND))
            fail_msg("attention int8 queries %s isa %d bs %d len %d n_q %d heads %d/%d hd %d: max error %.3g "
                     "of max|V|",
                     KINDS[c->kind].name, c->isa, c->bs, c->len, c->n_q, c->n_head, c->nkv, c->hd, err);
        return;
    }
    if (!(err <= 1e-5))
        fail_msg("attention %s isa %d bs %d len %d n_q %d heads %d/%d hd %d: max error %.3g of max|V|",
                 KINDS[c->kind].name, c->isa, c->bs, c->len, c->n_q, c->n_head, c->nkv, c->hd, err);
}

/* Every ISA level, KV type and block size; ragged lengths; decode and prefill. */
static void test_kv_attention_vs_f64(void **state) {
    (void)state;
    uint64_t rng = 4;
    int cases = 0;
    for (int isa = 0; isa < n_levels(); isa++)
        for (int kind = 0; kind < N_KINDS; kind++)
            for (int bi = 0; bi < 5; bi++) {
                int bs = BLOCK_SIZES[bi];
                int lens[] = {1, bs - 1, bs, bs + 1, 3 * bs + 5};
                for (int li = 0; li < 5; li++) {
                    int len = lens[li];
                    if (len > 300 && (kind % 2 || li < 4)) continue; /* keep the long cases few */
                    int n_qs[] = {1, len < 7 ? len : 7};
                    for (int qi = 0; qi < 2; qi++) {
                        attn_case c = {isa, kind, bs, len, n_qs[qi], 8, 2, 64, false};
                        attn_expect(&c, &rng);
                        cases++;
                        /* the reference's int8-query path, on any machine */
                        if (isa == 0 && KINDS[kind].t == TK_KV_INT8) {
                            c.q8 = true;
                            attn_expect(&c, &rng);
                            cases++;
                        }
                    }
                }
            }
    print_message("attention: %d cases, levels 0..%d (ISA levels 0..%d, then the 16-lane body on AVX2); "
                  "int8 queries: max error %.3g of max|V| (bound %.3g)\n",
                  cases, n_levels() - 1, (int)best_isa(), q8_err_max, Q8_BOUND);
}

/* GQA ratios 1..5 (tiles of 1..4 heads and a remainder), head_dims that take
 * each kernel's fallback path (20: reference only; 40: AVX2 but not AVX-512). */
static void test_kv_attention_gqa(void **state) {
    (void)state;
    uint64_t rng = 5;
    const int shapes[][3] = {{4, 4, 64},  {6, 3, 32}, {6, 2, 48}, {8, 2, 64},  {10, 2, 32},
                             {5, 1, 128}, {4, 2, 20}, {6, 2, 40}, {16, 8, 128}};
    for (int isa = 0; isa < n_levels(); isa++)
        for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++)
            for (int kind = 0; kind < N_KINDS; kind++) {
                attn_case c = {isa, kind, 32, 70, 3, shapes[s][0], shapes[s][1], shapes[s][2], false};
                attn_expect(&c, &rng);
            }
    /* Which kernel each head_dim gets. */
    tk_kv *kv;
    tk_kv_opts o = opts_make(1, 1, 20, 16, 1, TK_KV_F16, TK_KV_SCALE_HEAD);
    assert_int_equal(kv_init_isa(&o, best_isa(), &kv), TK_OK);
    assert_int_equal(kv_isa(kv), TK_ISA_SCALAR);
    kv_free(kv);
    o.head_dim = 40;
    assert_int_equal(kv_init_isa(&o, best_isa(), &kv), TK_OK);
    /* AVX-512 falls back to AVX2, which every AVX-512 CPU has (not always AVX-VNNI) */
    assert_int_equal(kv_isa(kv), best_isa() == TK_ISA_AVXVNNI ? TK_ISA_AVXVNNI
                                 : best_isa() >= TK_ISA_AVX2  ? TK_ISA_AVX2
                                                              : TK_ISA_SCALAR);
    kv_free(kv);
    o.head_dim = 128;
    assert_int_equal(kv_init_isa(&o, best_isa(), &kv), TK_OK);
    assert_int_equal(kv_isa(kv), best_isa());
    kv_free(kv);
}

/* Batch invariance: a head's output is bit-identical whatever [h0, h1) split the
 * caller uses, and a query in a prefill chunk equals the same query decoded alone. */
static void test_kv_attention_invariance(void **state) {
    (void)state;
    uint64_t rng = 6;
    enum { NH = 12, NKV = 2, HD = 64, LEN = 150, NQ = 5 };
    const size_t qrow = (size_t)NH * HD;
    for (int isa = 0; isa < n_levels(); isa++)
        for (int kind = 0; kind < N_KINDS; kind++) {
            tk_kv_opts o = opts_make(1, NKV, HD, 32, 8, KINDS[kind].t, KINDS[kind].sc);
            tk_kv *kv;
            assert_true(level_open(&o, isa, &kv));
            int32_t bt[5];
            table_make(kv, bt, 5, &rng);
            float kx[NKV * HD], vx[NKV * HD];
            for (int p = 0; p < LEN; p++) {
                for (int i = 0; i < NKV * HD; i++) kx[i] = rng_unit(&rng), vx[i] = rng_unit(&rng);
                kv_write(kv, 0, bt, p, kx, vx);
            }
            float *q = tk_malloc(NQ * qrow * 4), *full = tk_malloc(NQ * qrow * 4),
                  *part = tk_malloc(NQ * qrow * 4);
            float *scratch = tk_malloc(kv_attn_scratch_floats(kv, LEN) * 4);
            for (size_t i = 0; i < NQ * qrow; i++) q[i] = rng_unit(&rng);
            attend(kv, 0, bt, LEN - NQ, NQ, q, NH, 0, NH, 0.125f, full, scratch);
            const int splits[][4] = {{0, 1, 2, 12}, {0, 3, 7, 12}, {0, 5, 6, 12}, {0, 11, 12, 12}};
            for (int s = 0; s < 4; s++) {
                memset(part, 0xff, NQ * qrow * 4);
                for (int r = 0; r < 3; r++)
                    attend(kv, 0, bt, LEN - NQ, NQ, q, NH, splits[s][r], splits[s][r + 1], 0.125f, part,
                           scratch);
                assert_memory_equal(full, part, NQ * qrow * 4);
            }
            for (int h = 0; h < NH; h++) /* one head at a time */
                attend(kv, 0, bt, LEN - NQ, NQ, q, NH, h, h + 1, 0.125f, part, scratch);
            assert_memory_equal(full, part, NQ * qrow * 4);
            for (int i = 0; i < NQ; i++) /* token by token, as decode would */
                attend(kv, 0, bt, LEN - NQ + i, 1, q + i * qrow, NH, 0, NH, 0.125f, part + i * qrow, scratch);
            assert_memory_equal(full, part, NQ * qrow * 4);
            tk_free(q), tk_free(full), tk_free(part), tk_free(scratch);
            kv_free(kv);
        }
}

/* Splitting tokens into steps changes no output: a sequence fed one token
 * per step (write, then attend) equals the same tokens fed in random chunks
 * (all of a chunk written, then its queries attended together), bit for bit,
 * for every KV type and level. With INT8 per-head scales a chunk's later
 * tokens rescale its block, so this holds through the own-block records
 * taken after each write; records taken from the block as the chunk left it
 * (the final view) differ, which shows the test can fail. */
static void test_kv_attention_steps(void **state) {
    (void)state;
    enum { NH = 4, NKV = 2, HD = 32, LEN = 300 };
    /* blocks of K rows, and of K columns (kv_k_cols: the float types, and int8
     * at a level with int8 queries) */
    static const int cfg[][2] = {{16, 75}, {KV_KT_BLOCK, LEN}}; /* block size, context */
    const size_t row = (size_t)NKV * HD, qrow = (size_t)NH * HD, rec = (size_t)NH * KV_PART_REC(HD);
    float *kx = tk_malloc(LEN * row * 4), *vx = tk_malloc(LEN * row * 4), *q = tk_malloc(LEN * qrow * 4);
    float *one = tk_malloc(LEN * qrow * 4), *chunk = tk_malloc(LEN * qrow * 4),
          *fin = tk_malloc(LEN * qrow * 4);
    float *own = tk_malloc(LEN * rec * 4);
    uint64_t rng = 21;
    for (size_t ci = 0; ci < sizeof cfg / sizeof cfg[0]; ci++) {
        const int BS = cfg[ci][0], len = cfg[ci][1], nb = len / BS + 1;
        /* magnitudes that grow now and then, so per-head scales rescale */
        for (int p = 0; p < len; p++)
            for (size_t i = 0; i < row; i++) {
                const float g = 1.0f + (float)(p % BS) * (rng_next(&rng) % 5 == 0 ? 0.3f : 0.02f);
                kx[p * row + i] = rng_unit(&rng) * g;
                vx[p * row + i] = rng_unit(&rng) * g;
            }
        for (size_t i = 0; i < (size_t)len * qrow; i++) q[i] = rng_unit(&rng) * 2.0f;
        for (int isa = 0; isa < n_levels(); isa++)
            for (int kind = 0; kind < N_KINDS; kind++) {
                tk_kv *a, *b;
                tk_kv_opts o = opts_make(1, NKV, HD, BS, nb, KINDS[kind].t, KINDS[kind].sc);
                assert_true(level_open(&o, isa, &a));
                assert_true(level_open(&o, isa, &b));
                const bool ob = kv_attn_own_block(a);
                int32_t bt[LEN / 16 + 1];
                for (int i = 0; i < nb; i++) assert_int_equal(kv_block_alloc(a), i);
                for (int i = 0; i < nb; i++) assert_int_equal(kv_block_alloc(b), i), bt[i] = i;
                float *scratch = tk_malloc(kv_attn_scratch_floats(a, len) * 4);
                for (int p = 0; p < len; p++) { /* one token per step */
                    kv_write(a, 0, bt, p, kx + p * row, vx + p * row);
                    if (ob)
                        kv_attention_own(a, 0, bt, p, q + p * qrow, NH, 0, NH, 0.2f, own, scratch, NULL, 0,
                                         0);
                    kv_attention(a, 0, bt, p, 1, q + p * qrow, NH, 0, NH, 0.2f, ob ? own : NULL,
                                 one + p * qrow, scratch, NULL, 0);
                }
                bool final_differs = false;
                for (int p0 = 0; p0 < len;) { /* random chunks */
                    int n = 1 + (int)(rng_next(&rng) % 23);
                    if (n > len - p0) n = len - p0;
                    for (int i = 0; i < n; i++) {
                        const int p = p0 + i;
                        kv_write(b, 0, bt, p, kx + p * row, vx + p * row);
                        if (ob)
                            kv_attention_own(b, 0, bt, p, q + p * qrow, NH, 0, NH, 0.2f, own + i * rec,
                                             scratch, i + 1 < n ? bt : NULL, p + 1,
                                             0); /* the prefetch hint changes no bit */
                    }
                    kv_attention(b, 0, bt, p0, n, q + p0 * qrow, NH, 0, NH, 0.2f, ob ? own : NULL,
                                 chunk + p0 * qrow, scratch, bt, 0); /* a hint: no bit changes */
                    attend(b, 0, bt, p0, n, q + p0 * qrow, NH, 0, NH, 0.2f, fin + p0 * qrow, scratch);
                    final_differs |= memcmp(fin + p0 * qrow, chunk + p0 * qrow, (size_t)n * qrow * 4) != 0;
                    p0 += n;
                }
                if (memcmp(one, chunk, (size_t)len * qrow * 4))
                    fail_msg("steps %s level %d block %d: chunked attention differs from token by token",
                             KINDS[kind].name, isa, BS);
                if (ob) assert_true(final_differs);
                tk_free(scratch);
                kv_free(a), kv_free(b);
            }
    }
    tk_free(kx), tk_free(vx), tk_free(q), tk_free(one), tk_free(chunk), tk_free(fin), tk_free(own);
}

/* Flash-decoding: a long context attended part by part (each part's records
 * written separately, heads split across calls, parts in any order) and
 * folded by kv_attention_merge gives kv_attention's bits; and the long
 * context still matches float64. Every level and KV type, lengths around the
 * part boundaries. */
static void test_kv_attention_parts(void **state) {
    (void)state;
    uint64_t rng = 9;
    enum { NH = 6, NKV = 2, HD = 32, MAXLEN = 2 * KV_ATTN_PART + 40 };
    const int lens[] = {KV_ATTN_PART - 1, KV_ATTN_PART, KV_ATTN_PART + 1, 2 * KV_ATTN_PART + 37};
    const size_t rec = KV_PART_REC(HD), stride = NH * rec;
    for (int isa = 0; isa < n_levels(); isa++)
        for (int kind = 0; kind < N_KINDS; kind++) {
            tk_kv_opts o = opts_make(1, NKV, HD, 64, MAXLEN / 64 + 1, KINDS[kind].t, KINDS[kind].sc);
            tk_kv *kv;
            assert_true(level_open(&o, isa, &kv));
            int32_t bt[MAXLEN / 64 + 1];
            table_make(kv, bt, MAXLEN / 64 + 1, &rng);
            float kx[NKV * HD], vx[NKV * HD], q[NH * HD], whole[NH * HD], merged[NH * HD];
            for (int p = 0; p < MAXLEN; p++) {
                for (int i = 0; i < NKV * HD; i++) kx[i] = rng_unit(&rng) * 3.0f, vx[i] = rng_unit(&rng);
                kv_write(kv, 0, bt, p, kx, vx);
            }
            float *scratch = tk_malloc(kv_attn_scratch_floats(kv, MAXLEN) * 4);
            float *recs = tk_malloc(3 * stride * 4);
            for (size_t li = 0; li < sizeof lens / sizeof lens[0]; li++) {
                const int pos = lens[li] - 1, end = kv_attn_end(kv, pos), parts = kv_attn_parts(end);
                if (!kv_attn_own_block(kv)) assert_int_equal(parts, (pos + KV_ATTN_PART) / KV_ATTN_PART);
                for (int i = 0; i < NH * HD; i++) q[i] = rng_unit(&rng);
                attend(kv, 0, bt, pos, 1, q, NH, 0, NH, 0.17f, whole, scratch);
                for (int k = parts - 1; k >= 0; k--) { /* last part first, heads in two calls */
                    kv_attention_part(kv, 0, bt, end, k, q, NH, 0, 3, 0.17f, recs + k * stride, scratch);
                    kv_attention_part(kv, 0, bt, end, k, q, NH, 3, NH, 0.17f, recs + k * stride + 3 * rec,
                                      scratch);
                }
                float own[NH * KV_PART_REC(HD)];
                if (kv_attn_own_block(kv))
                    kv_attention_own(kv, 0, bt, pos, q, NH, 0, NH, 0.17f, own, scratch, NULL, 0, 0);
                kv_attention_merge(kv, recs, parts, stride, NH, kv_attn_own_block(kv) ? own : NULL, merged);
                if (memcmp(whole, merged, sizeof whole))
                    fail_msg("parts %s level %d len %d: merged parts differ from the whole", KINDS[kind].name,
                             isa, pos + 1);
            }
            tk_free(scratch), tk_free(recs);
            kv_free(kv);
            /* the long contexts against float64 too */
            attn_case c = {isa, kind, 64,   2 * KV_ATTN_PART + 37 < 1200 ? 2 * KV_ATTN_PART + 37 : 1200, 3, 4,
                           2,   32,   false};
            attn_expect(&c, &rng);
        }
}

/* Writes split by kv head, heads in any order, give the same pool bytes as
 * whole-token writes (what lets threads split int8 per-head writes by head). */
static void test_kv_write_heads(void **state) {
    (void)state;
    enum { NKV = 3, HD = 32, LEN = 70 };
    for (int kind = 0; kind < N_KINDS; kind++) {
        tk_kv_opts o = opts_make(1, NKV, HD, 32, 3, KINDS[kind].t, KINDS[kind].sc);
        tk_kv *a, *b;
        assert_int_equal(kv_init(&o, &a), TK_OK);
        assert_int_equal(kv_init(&o, &b), TK_OK);
        int32_t bt[3];
        for (int i = 0; i < 3; i++) bt[i] = kv_block_alloc(a), assert_int_equal(kv_block_alloc(b), bt[i]);
        static float k[LEN][NKV * HD], v[LEN][NKV * HD];
        uint64_t rng = 8;
        for (int p = 0; p < LEN; p++)
            for (int i = 0; i < NKV * HD; i++)
                k[p][i] = rng_unit(&rng) * (1 + p * 0.1f), v[p][i] = rng_unit(&rng) * (1 + p * 0.1f);
        for (int p = 0; p < LEN; p++) kv_write(a, 0, bt, p, k[p], v[p]);
        for (int h = NKV - 1; h >= 0; h--) /* head by head, last head first */
            for (int p = 0; p < LEN; p++) kv_write_heads(b, 0, bt, p, k[p], v[p], h, h + 1);
        float ka[NKV * HD], va[NKV * HD], kb[NKV * HD], vb[NKV * HD];
        for (int p = 0; p < LEN; p++) {
            kv_read(a, 0, bt, p, ka, va);
            kv_read(b, 0, bt, p, kb, vb);
            assert_memory_equal(ka, kb, sizeof ka);
            assert_memory_equal(va, vb, sizeof va);
        }
        kv_free(a);
        kv_free(b);
    }
}

/* The int8 store kernels of one level, or of the 16-lane body. */
typedef struct {
    kv_quant_token_fn tok;
    kv_quant_chan_fn chan;
    kv_requant_chan_fn requant;
    kv_requant_cols_fn cols;
} qk;

/* One rescale of the bytes of y0 (n bytes: rows x n_c int8 rows, or with cols
 * n_groups = rows groups of K by columns, head_dim n_c) at every level
 * against the reference's. */
static void requant_check(const qk *levels, int n_lv, bool cols, const int8_t *y0, int8_t *want, int8_t *got,
                          size_t n, int rows, int n_c, const float *r) {
    memcpy(want, y0, n);
    if (cols)
        kv_requant_cols_ref(want, rows, n_c, r);
    else
        kv_requant_chan_ref(want, rows, n_c, r);
    for (int lv = 0; lv < n_lv; lv++) {
        memcpy(got, y0, n);
        if (cols)
            levels[lv].cols(got, rows, n_c, r);
        else
            levels[lv].requant(got, rows, n_c, r);
        if (memcmp(got, want, n) != 0)
            fail_msg("requant_%s level %d: %d x %d differs", cols ? "cols" : "chan", lv, rows, n_c);
    }
}

/* The int8 stores of every level (and the 16-lane body) give the reference's
 * bits: ragged lengths, NaN, values far outside a scale, zero scales (the
 * grown scales and their factors too); and so do the per-channel rescales of
 * rows and of K by columns, with some chunks of factors all 1. */
static void test_kv_quant_kernels(void **state) {
    (void)state;
    qk levels[TK_ISA_AVX512 + 2];
    int n_lv = 0;
    for (int isa = 0; isa <= (int)best_isa(); isa++)
        levels[n_lv++] =
            (qk){kernels_get((tk_isa)isa)->kv_quant_token, kernels_get((tk_isa)isa)->kv_quant_chan,
                 kernels_get((tk_isa)isa)->kv_requant_chan, kernels_get((tk_isa)isa)->kv_requant_cols};
#ifdef HAVE_VL16
    if (best_isa() >= TK_ISA_AVX2)
        levels[n_lv++] =
            (qk){kv_quant_token_vl16, kv_quant_chan_vl16, kv_requant_chan_vl16, kv_requant_cols_vl16};
#endif
    uint64_t rng = 11;
    float x[300], sc[300], s_want[300], s_got[300], r_want[300], r_got[300];
    int8_t want[300], got[300];
    int grew = 0, rescaled = 0;
    for (int it = 0; it < 400; it++) {
        const int n = 1 + (int)(rng_next(&rng) % 300);
        const float mag = (it % 3 == 0) ? 1e-3f : (it % 3 == 1) ? 1.0f : 300.0f;
        for (int i = 0; i < n; i++) {
            x[i] = rng_unit(&rng) * mag;
            sc[i] = (rng_next(&rng) % 7 == 0) ? 0.0f : fabsf(rng_unit(&rng)) / 100.0f;
            if (rng_next(&rng) % 53 == 0) x[i] = NAN;
            if (it % 17 == 0) x[i] = 0.0f;
        }
        const float ws = kv_quant_token_ref(x, want, n);
        for (int lv = 0; lv < n_lv; lv++) {
            memset(got, 0x55, sizeof got);
            const float gs = levels[lv].tok(x, got, n);
            assert_true(memcmp(&gs, &ws, sizeof ws) == 0);
            if (memcmp(got, want, (size_t)n) != 0) fail_msg("quant_token level %d n %d differs", lv, n);
        }
        memcpy(s_want, sc, sizeof sc);
        const bool wf = kv_quant_chan_ref(x, s_want, want, r_want, n);
        rescaled += wf;
        for (int i = 0; i < n; i++) {
            grew += s_want[i] != sc[i];
            /* a scale grows where x does not fit, by KV_INT8_MIN_GROWTH at least */
            if (fabsf(x[i]) > sc[i] * 127.0f)
                assert_true(s_want[i] >= sc[i] * KV_INT8_MIN_GROWTH &&
                            fabsf(x[i]) <= s_want[i] * 127.0f * (1 + 1e-6f));
            else
                assert_true(s_want[i] == sc[i] && r_want[i] == 1.0f);
        }
        for (int lv = 0; lv < n_lv; lv++) {
            memset(got, 0x55, sizeof got);
            memcpy(s_got, sc, sizeof sc);
            memset(r_got, 0x55, sizeof r_got);
            assert_int_equal(levels[lv].chan(x, s_got, got, r_got, n), wf);
            if (memcmp(got, want, (size_t)n) != 0) fail_msg("quant_chan level %d n %d differs", lv, n);
            if (memcmp(s_got, s_want, (size_t)n * sizeof(float)) != 0)
                fail_msg("quant_chan level %d n %d: scales differ", lv, n);
            if (memcmp(r_got, r_want, (size_t)n * sizeof(float)) != 0)
                fail_msg("quant_chan level %d n %d: factors differ", lv, n);
        }
    }
    assert_true(grew > 1000 && rescaled > 100); /* the growth path ran, with factors */
    enum { RQ_ROWS = 70, RQ_N = 150 };
    static int8_t rq0[RQ_ROWS * RQ_N], rq_want[RQ_ROWS * RQ_N], rq_got[RQ_ROWS * RQ_N];
    float r[RQ_N];
    for (int it = 0; it < 200; it++) {
        const int rows = (int)(rng_next(&rng) % (RQ_ROWS + 1)), n = 1 + (int)(rng_next(&rng) % RQ_N);
        for (int i = 0; i < rows * n; i++) rq0[i] = (int8_t)((int)(rng_next(&rng) % 255) - 127);
        const int keep = (int)(rng_next(&rng) % 4); /* 0: every factor random .. 3: mostly 1 */
        for (int c = 0; c < n; c++)
            r[c] = (int)(rng_next(&rng) % 4) < keep ? 1.0f : 0.05f + 0.95f * fabsf(rng_unit(&rng));
        if (it % 5 == 0) r[n - 1] = 1.0f / KV_INT8_MIN_GROWTH;
        requant_check(levels, n_lv, false, rq0, rq_want, rq_got, (size_t)(rows * n), rows, n, r);
        /* the same factors over K by columns: n_groups groups of KV_KT slots */
        const int hd = 4 * (1 + (int)(rng_next(&rng) % (RQ_N / 4))), ng = (rows * n) / (hd * KV_KT);
        if (ng == 0) continue;
        for (int c = n; c < hd; c++) r[c] = 0.05f + 0.95f * fabsf(rng_unit(&rng));
        if (rng_next(&rng) % 2) /* whole quads of 1 */
            for (int c = 0; c < hd; c++) r[c] = (c / 4) % 3 == 1 ? 1.0f : r[c];
        requant_check(levels, n_lv, true, rq0, rq_want, rq_got, (size_t)(rows * n), ng, hd, r);
    }
    /* ties go to even, as nearbyintf does */
    const float ties[4] = {0.5f, 1.5f, -2.5f, 126.5f};
    float ones[4], rr[4];
    int8_t y[4];
    for (int lv = 0; lv < n_lv; lv++) {
        for (int i = 0; i < 4; i++) ones[i] = 1.0f;
        assert_false(levels[lv].chan(ties, ones, y, rr, 4));
        assert_true(ones[3] == 1.0f && rr[3] == 1.0f);
        assert_int_equal(y[0], 0), assert_int_equal(y[1], 2), assert_int_equal(y[2], -2);
        assert_int_equal(y[3], 126);
    }
}

/* The kernels of every level agree with each other closely (not bitwise). */
static void test_kv_attention_isa_agree(void **state) {
    (void)state;
    if (best_isa() == TK_ISA_SCALAR) skip();
    enum { NH = 8, NKV = 4, HD = 128, LEN = 200 };
    for (int kind = 0; kind < N_KINDS; kind++) {
        float outs[TK_ISA_AVX512 + 2][NH * HD];
        for (int isa = 0; isa < n_levels(); isa++) {
            uint64_t rng = 7; /* same data at every level */
            tk_kv_opts o = opts_make(1, NKV, HD, 64, 4, KINDS[kind].t, KINDS[kind].sc);
            tk_kv *kv;
            assert_true(level_open(&o, isa, &kv));
            int32_t bt[4] = {3, 1, 0, 2};
            for (int i = 0; i < 4; i++) assert_true(kv_block_alloc(kv) >= 0);
            float kx[NKV * HD], vx[NKV * HD], q[NH * HD];
            for (int p = 0; p < LEN; p++) {
                for (int i = 0; i < NKV * HD; i++) kx[i] = rng_unit(&rng), vx[i] = rng_unit(&rng);
                kv_write(kv, 0, bt, p, kx, vx);
            }
            for (int i = 0; i < NH * HD; i++) q[i] = rng_unit(&rng);
            float *scratch = tk_malloc(kv_attn_scratch_floats(kv, LEN) * 4);
            attend(kv, 0, bt, LEN - 1, 1, q, NH, 0, NH, 0.0884f, outs[isa], scratch);
            tk_free(scratch);
            /* int8 queries: within their bound of the float ones */
            const double tol = kv_query_int8(kv) ? Q8_BOUND : 2e-5;
            kv_free(kv);
            for (int i = 0; i < NH * HD && isa > 0; i++) assert_float_equal(outs[isa][i], outs[0][i], tol);
        }
    }
}

/* The order attention asks for the next block's K in (kv_k_walk) is the
 * order dot_cols / dot_cols_q8 first touch its lines, called as
 * kvattn_body.h's KV_COLS_FROM calls them (sets of U groups of KV_KT
 * positions while U fit, then 8, 4, 2, 1 below U), for every type,
 * head_dim, block size and U = KV_ROWS(P) of 1 to 16 pairs; it visits every
 * line of the block's K once. */
static void test_kv_k_walk(void **state) {
    (void)state;
    const tk_kv_type types[] = {TK_KV_F32, TK_KV_F16, TK_KV_BF16, TK_KV_INT8};
    const int hds[] = {64, 128, 256}, bss[] = {128, 256};
    for (size_t ti = 0; ti < sizeof types / sizeof types[0]; ti++)
        for (size_t hi = 0; hi < sizeof hds / sizeof hds[0]; hi++)
            for (size_t bi = 0; bi < sizeof bss / sizeof bss[0]; bi++)
                for (int pairs = 1; pairs <= 16; pairs++) {
                    const tk_kv_type t = types[ti];
                    const int hd = hds[hi], bs = bss[bi], groups = bs / KV_KT,
                              u = 16 / pairs > 1 ? 16 / pairs : 1;
                    const size_t es = kv_type_size(t), lines = (size_t)bs * (size_t)hd * es / 64;
                    assert_int_equal(kv_k_group_lines(t, hd) * (size_t)groups, lines);
                    /* the lines in the order the scores first read them */
                    size_t *order = tk_calloc(lines, sizeof *order);
                    unsigned char *seen = tk_calloc(lines, 1);
                    assert_non_null(order);
                    assert_non_null(seen);
                    size_t n = 0;
                    int g0 = 0;
                    const int sizes[] = {u, 8, 4, 2, 1};
                    for (int si = 0; si < 5; si++) {
                        const int set = sizes[si];
                        if (si > 0 && !(u > set)) continue;
                        for (; g0 + set <= groups; g0 += set)
                            for (int c = 0; c < hd; c += t == TK_KV_INT8 ? 4 : 1)
                                for (int k = 0; k < set; k++) {
                                    const int j = (g0 + k) * KV_KT;
                                    const size_t byte =
                                        t == TK_KV_INT8 ? kv_k8_index(hd, j, c) : kv_k_index(hd, j, c) * es;
                                    if (!seen[byte / 64]) seen[byte / 64] = 1, order[n++] = byte / 64;
                                }
                    }
                    assert_int_equal(n, lines);
                    kv_k_walk w = kv_k_walk_start(u, (size_t)groups, kv_k_group_lines(t, hd));
                    for (size_t i = 0; i < lines; i++) assert_int_equal(kv_k_walk_next(&w), order[i]);
                    /* past the block: front to back */
                    assert_int_equal(kv_k_walk_next(&w), lines);
                    tk_free(order);
                    tk_free(seen);
                }
    /* front to back: one group of all lines */
    kv_k_walk w = kv_k_walk_start(1, 1, 7);
    for (size_t i = 0; i < 20; i++) assert_int_equal(kv_k_walk_next(&w), i);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_kv_pool_accounting),
        cmocka_unit_test(test_kv_layout_units),
        cmocka_unit_test(test_kv_block_refs_and_copy),
        cmocka_unit_test(test_kv_block_copy_slots),
        cmocka_unit_test(test_kv_opts_validation),
        cmocka_unit_test(test_kv_bytes_per_token),
        cmocka_unit_test(test_kv_roundtrip_float),
        cmocka_unit_test(test_kv_roundtrip_int8_token),
        cmocka_unit_test(test_kv_int8_head_rescale),
        cmocka_unit_test(test_kv_int8_head_vs_token_error),
        cmocka_unit_test(test_kv_attention_vs_f64),
        cmocka_unit_test(test_kv_attention_gqa),
        cmocka_unit_test(test_kv_attention_invariance),
        cmocka_unit_test(test_kv_write_heads),
        cmocka_unit_test(test_kv_attention_isa_agree),
        cmocka_unit_test(test_kv_attention_parts),
        cmocka_unit_test(test_kv_quant_kernels),
        cmocka_unit_test(test_kv_attention_steps),
        cmocka_unit_test(test_kv_k_walk),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
