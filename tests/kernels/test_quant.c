/* The reference layer checked against itself is not enough: these tests build
 * blocks by hand from the GGML layout (written out independently here) and
 * check the reference dequantizers, quantizers, gemv, norms and RoPE against
 * known answers and float64 arithmetic. */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "kern_util.h"
#include "kernels/kernels_ref.h"

static void test_quant_f16_bf16_known(void **state) {
    (void)state;
    tk_f16 h[4] = {0x3c00, 0xc000, 0x3800, 0x0000};
    tk_bf16 b[4] = {0x3f80, 0xc000, 0x3f00, 0x8000};
    float o[4];
    kern_dequant_f16_ref(h, o, 4);
    assert_true(o[0] == 1.0f && o[1] == -2.0f && o[2] == 0.5f && o[3] == 0.0f);
    kern_dequant_bf16_ref(b, o, 4);
    assert_true(o[0] == 1.0f && o[1] == -2.0f && o[2] == 0.5f && o[3] == 0.0f && signbit(o[3]));
}

static void test_quant_q8_0_known(void **state) {
    (void)state;
    tk_block_q8_0 b[2];
    b[0].d = 0x3800; /* 0.5 */
    b[1].d = 0xc000; /* -2 */
    for (int j = 0; j < 32; j++) {
        b[0].qs[j] = (int8_t)(j - 16);
        b[1].qs[j] = (int8_t)(j == 0 ? -128 : 127 - j);
    }
    float o[64];
    kern_dequant_q8_0_ref(b, o, 64);
    for (int j = 0; j < 32; j++) {
        assert_true(o[j] == 0.5f * (float)(j - 16));
        assert_true(o[32 + j] == -2.0f * (float)(j == 0 ? -128 : 127 - j));
    }
}

static void test_quant_q4_0_known(void **state) {
    (void)state;
    tk_block_q4_0 b;
    b.d = 0x4000; /* 2 */
    for (int j = 0; j < 16; j++) b.qs[j] = (uint8_t)(j | ((15 - j) << 4));
    float o[32];
    kern_dequant_q4_0_ref(&b, o, 32);
    for (int j = 0; j < 16; j++) {
        assert_true(o[j] == 2.0f * (float)(j - 8));
        assert_true(o[j + 16] == 2.0f * (float)(15 - j - 8));
    }
    /* GGML's rule: the value of largest magnitude maps to -8 with d = max / -8. */
    float x[32] = {0};
    x[3] = -4.0f;
    x[20] = 3.5f;
    x[7] = 1.0f;
    assert_true(kern_quantize_row(TK_DTYPE_Q4_0, x, &b, 32));
    assert_true(tk_f16_to_f32(b.d) == 0.5f);
    assert_int_equal(b.qs[3] & 15, 0);  /* -4 / 0.5 = -8 -> 0 */
    assert_int_equal(b.qs[4] >> 4, 15); /* 3.5 / 0.5 = 7 -> 15 */
    assert_int_equal(b.qs[7] & 15, 10); /* 1 / 0.5 = 2 -> 10 */
    assert_int_equal(b.qs[0] & 15, 8);
}

/* Q4_K scale packing written out from the layout: bytes 0..3 scale j (6 bits)
 * with the top bits of scale j+4 above; bytes 4..7 min j with the top bits of
 * min j+4; bytes 8..11 the low nibbles of scale j+4 and min j+4. */
static void pack_q4_k_scales(const uint8_t sc[8], const uint8_t m[8], uint8_t out[12]) {
    for (int j = 0; j < 4; j++) {
        out[j] = (uint8_t)(sc[j] | ((sc[j + 4] >> 4) << 6));
        out[j + 4] = (uint8_t)(m[j] | ((m[j + 4] >> 4) << 6));
        out[j + 8] = (uint8_t)((sc[j + 4] & 15) | ((m[j + 4] & 15) << 4));
    }
}

static void test_quant_q4_k_known(void **state) {
    (void)state;
    tk_block_q4_k b;
    uint8_t sc[8], m[8], q[256];
    for (int j = 0; j < 8; j++) {
        sc[j] = (uint8_t)(j < 4 ? j + 1 : 40 + j); /* j >= 4 uses the top bits */
        m[j] = (uint8_t)(j < 4 ? 2 * j + 3 : 63 - j);
    }
    for (int e = 0; e < 256; e++) q[e] = (uint8_t)((e * 7 + 3) % 16);
    b.d = 0x3c00;    /* 1 */
    b.dmin = 0x3800; /* 0.5 */
    pack_q4_k_scales(sc, m, b.scales);
    /* element e: chunk c = e / 64; low nibble of qs[32c + e % 32] for the first
     * 32 of the chunk, high nibble for the second 32; sub-block e / 32 */
    memset(b.qs, 0, sizeof b.qs);
    for (int e = 0; e < 256; e++) {
        int c = e / 64, l = e % 32, hi = (e % 64) >= 32;
        b.qs[32 * c + l] |= (uint8_t)(q[e] << (4 * hi));
    }
    float o[256];
    kern_dequant_q4_k_ref(&b, o, 256);
    for (int e = 0; e < 256; e++) {
        float want = 1.0f * (float)sc[e / 32] * (float)q[e] - 0.5f * (float)m[e / 32];
        assert_true(o[e] == want);
    }
    for (int j = 0; j < 8; j++) {
        uint8_t s2, m2;
        kern_q4_k_scale_min(j, b.scales, &s2, &m2);
        assert_int_equal(s2, sc[j]);
        assert_int_equal(m2, m[j]);
    }
}

static void test_quant_q6_k_known(void **state) {
    (void)state;
    tk_block_q6_k b;
    uint8_t q[256];
    for (int e = 0; e < 256; e++) q[e] = (uint8_t)((e * 37 + 11) % 64);
    for (int j = 0; j < 16; j++) b.scales[j] = (int8_t)(j % 2 ? -(j + 1) : 3 * j + 1);
    b.d = 0x3400; /* 0.25 */
    memset(b.ql, 0, sizeof b.ql);
    memset(b.qh, 0, sizeof b.qh);
    /* element e: half n = e / 128, c = (e % 128) / 32, l = e % 32; low nibble in
     * ql[64n + l + 32 (c & 1)] at bit 4 (c >> 1), high two bits in qh[32n + l] at bit 2c */
    for (int e = 0; e < 256; e++) {
        int n = e / 128, c = (e % 128) / 32, l = e % 32;
        b.ql[64 * n + l + 32 * (c & 1)] |= (uint8_t)((q[e] & 15) << (4 * (c >> 1)));
        b.qh[32 * n + l] |= (uint8_t)((q[e] >> 4) << (2 * c));
    }
    float o[256];
    kern_dequant_q6_k_ref(&b, o, 256);
    for (int e = 0; e < 256; e++) assert_true(o[e] == 0.25f * (float)b.scales[e / 16] * (float)(q[e] - 32));
}

static void test_quant_act_known(void **state) {
    (void)state;
    float x[256];
    for (int j = 0; j < 256; j++) x[j] = (float)(j - 128) * 0.5f;
    tk_block_q8_k k8;
    kern_quant_q8_k_ref(x, &k8, 256);
    assert_true(k8.d == 64.0f / 127.0f);
    for (int j = 0; j < 256; j++) {
        int want = (int)nearbyint((double)(j - 128) * 0.5 / (64.0 / 127.0));
        assert_true(abs(k8.qs[j] - want) <= 1 && k8.qs[j] >= -127);
    }
    assert_int_equal(k8.qs[0], -127);
    for (int g = 0; g < 16; g++) {
        int s = 0;
        for (int j = 0; j < 16; j++) s += k8.qs[16 * g + j];
        assert_int_equal(k8.bsums[g], s);
    }
    /* Q8_0: d = absmax / 127 in f16, values rounded to nearest */
    tk_block_q8_0 q;
    for (int j = 0; j < 32; j++) x[j] = j == 5 ? -127.0f : (float)(j % 7) * 0.5f;
    kern_quant_q8_0_ref(x, &q, 32);
    assert_true(tk_f16_to_f32(q.d) == 1.0f);
    assert_int_equal(q.qs[5], -127);
    assert_int_equal(q.qs[1], 0); /* 0.5 rounds to even */
    assert_int_equal(q.qs[3], 2); /* 1.5 rounds to even */
    assert_int_equal(q.qs[6], 3);
    /* all zero: d = 0, q = 0 */
    memset(x, 0, sizeof x);
    kern_quant_q8_0_ref(x, &q, 32);
    assert_int_equal(q.d, 0);
    for (int j = 0; j < 32; j++) assert_int_equal(q.qs[j], 0);
}

/* Quantize -> dequantize error per format on Gaussian rows, stated as NMSE. */
static void test_quant_roundtrip_error(void **state) {
    (void)state;
    static const struct {
        tk_dtype t;
        double tol;
    } cases[] = {
        /* measured 4e-8, 3e-6, 2.5e-5, 6.4e-3, 5.6e-3, 3.3e-4, 7.4e-5; bounds about 2x that */
        {TK_DTYPE_F32, 0.0},     {TK_DTYPE_F16, 1e-7},    {TK_DTYPE_BF16, 1e-5}, {TK_DTYPE_Q8_0, 6e-5},
        {TK_DTYPE_Q4_0, 1.2e-2}, {TK_DTYPE_Q4_K, 1.2e-2}, {TK_DTYPE_Q6_K, 8e-4}, {TK_DTYPE_Q8_K, 2e-4},
    };
    kt_rng r = {42};
    const int64_t k = 4096;
    float *x = malloc(k * sizeof *x), *o = malloc(k * sizeof *o);
    void *q = malloc(k * 4);
    kt_fill(&r, x, k, 0.7f);
    for (int64_t i = 0; i < 64; i++) x[i] *= 8.0f; /* an outlier-heavy start */
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        memset(o, 0, k * sizeof *o);
        assert_true(kern_quantize_row(cases[c].t, x, q, k));
        switch (cases[c].t) {
        case TK_DTYPE_F32:
            kern_dequant_f32_ref(q, o, k);
            break;
        case TK_DTYPE_F16:
            kern_dequant_f16_ref(q, o, k);
            break;
        case TK_DTYPE_BF16:
            kern_dequant_bf16_ref(q, o, k);
            break;
        case TK_DTYPE_Q8_0:
            kern_dequant_q8_0_ref(q, o, k);
            break;
        case TK_DTYPE_Q4_0:
            kern_dequant_q4_0_ref(q, o, k);
            break;
        case TK_DTYPE_Q4_K:
            kern_dequant_q4_k_ref(q, o, k);
            break;
        case TK_DTYPE_Q6_K:
            kern_dequant_q6_k_ref(q, o, k);
            break;
        default:
            kern_dequant_q8_k_ref(q, o, k);
            break;
        }
        double e = kt_nmse(o, x, k);
        if (e > cases[c].tol)
            fail_msg("%s roundtrip nmse %.3g > %.3g", dtype_name(cases[c].t), e, cases[c].tol);
    }
    /* constant and all-negative blocks stay valid */
    for (int64_t i = 0; i < k; i++) x[i] = -1.0f - (float)(i % 3);
    assert_true(kern_quantize_row(TK_DTYPE_Q4_K, x, q, k));
    kern_dequant_q4_k_ref(q, o, k);
    assert_true(kt_nmse(o, x, k) < 1e-2);
    assert_true(kern_quantize_row(TK_DTYPE_Q6_K, x, q, k));
    kern_dequant_q6_k_ref(q, o, k);
    assert_true(kt_nmse(o, x, k) < 1e-3);
    memset(x, 0, k * sizeof *x);
    assert_true(kern_quantize_row(TK_DTYPE_Q4_K, x, q, k));
    kern_dequant_q4_k_ref(q, o, k);
    for (int64_t i = 0; i < k; i++) assert_true(o[i] == 0.0f);
    /* unsupported type or ragged k */
    assert_false(kern_quantize_row(TK_DTYPE_Q8_0, x, q, 33));
    assert_false(kern_quantize_row(TK_DTYPE_Q4_K, x, q, 128));
    assert_false(kern_quantize_row((tk_dtype)13, x, q, 256));
    free(x);
    free(o);
    free(q);
}

/* Reference gemv = float64 dot of the dequantized weight row and the
 * dequantized activation row, for every weight type. */
static void test_quant_gemv_ref_vs_dequant(void **state) {
    (void)state;
    static const tk_dtype types[] = {TK_DTYPE_F32,  TK_DTYPE_F16,  TK_DTYPE_BF16, TK_DTYPE_Q8_0,
                                     TK_DTYPE_Q4_0, TK_DTYPE_Q4_K, TK_DTYPE_Q6_K};
    const tk_kernels *K = kernels_get(TK_ISA_SCALAR);
    kt_rng r = {7};
    const int64_t k = 512, rows = 5;
    const int n_tok = 3;
    float *w = malloc(rows * k * sizeof *w), *x = malloc(n_tok * k * sizeof *x);
    float *wd = malloc(k * sizeof *wd), *xd = malloc(k * sizeof *xd);
    kt_fill(&r, w, rows * k, 1.0f);
    kt_fill(&r, x, n_tok * k, 1.0f);
    for (size_t c = 0; c < sizeof types / sizeof types[0]; c++) {
        tk_dtype t = types[c], at = kern_act_type(t, TK_LAYOUT_ROWS);
        uint64_t rb;
        assert_true(dtype_row_bytes(t, k, &rb));
        size_t xb = kern_act_row_bytes(t, TK_LAYOUT_ROWS, k);
        char *wq = malloc(rows * rb), *xq = malloc(n_tok * xb);
        for (int64_t i = 0; i < rows; i++) assert_true(kern_quantize_row(t, w + i * k, wq + i * rb, k));
        for (int i = 0; i < n_tok; i++) kern_quant_act(K, t, TK_LAYOUT_ROWS, x + i * k, xq + i * xb, k);
        float y[3 * 5], want[3 * 5];
        kern_gemv(K, t, TK_LAYOUT_ROWS)(k, wq, 0, rows, xq, xb, n_tok, y, rows);
        for (int64_t i = 0; i < rows; i++) {
            K->dequant_row[t](wq + i * rb, wd, k);
            for (int tt = 0; tt < n_tok; tt++) {
                K->dequant_row[at](xq + tt * xb, xd, k);
                double s = 0;
                for (int64_t j = 0; j < k; j++) s += (double)wd[j] * xd[j];
                want[tt * rows + i] = (float)s;
            }
        }
        double e = kt_nmse(y, want, rows * n_tok);
        if (e > 1e-10) fail_msg("%s gemv vs dequant nmse %.3g", dtype_name(t), e);
        free(wq);
        free(xq);
    }
    free(w);
    free(x);
    free(wd);
    free(xd);
}

static void test_quant_norm_act_known(void **state) {
    (void)state;
    float x[2] = {3.0f, 4.0f}, w[2] = {1.0f, 2.0f}, o[2];
    kern_rmsnorm_ref(o, x, w, 2, 0.0f);
    float s = 1.0f / sqrtf(12.5f);
    assert_true(fabsf(o[0] - 3.0f * s) < 1e-6f && fabsf(o[1] - 8.0f * s) < 1e-6f);
    float g[3] = {0.0f, 1.0f, -2.0f}, u[3] = {5.0f, 2.0f, 3.0f}, a[3];
    kern_silu_mul_ref(a, g, u, 3);
    assert_true(a[0] == 0.0f);
    assert_true(fabsf(a[1] - 2.0f / (1.0f + expf(-1.0f))) < 1e-6f);
    assert_true(fabsf(a[2] - 3.0f * -2.0f / (1.0f + expf(2.0f))) < 1e-6f);
    kern_add_ref(u, g, 3);
    assert_true(u[0] == 5.0f && u[1] == 3.0f && u[2] == 1.0f);
}

static void test_quant_rope_direct(void **state) {
    (void)state;
    const int n_head = 3, hd = 64;
    float freqs[32];
    for (int i = 0; i < hd / 2; i++) freqs[i] = (float)pow(1000000.0, -2.0 * i / hd);
    kt_rng r = {3};
    for (int neox = 0; neox < 2; neox++) {
        for (int pi = 0; pi < 3; pi++) {
            int pos = (int[]){0, 17, 40000}[pi];
            float x[3 * 64], orig[3 * 64];
            kt_fill(&r, x, n_head * hd, 1.0f);
            memcpy(orig, x, sizeof x);
            float y[3 * 64], cs[64];
            memcpy(y, x, sizeof x);
            kern_rope(x, n_head, hd, pos, freqs, neox);
            /* from the angles computed once: the same bits */
            kern_rope_angles(cs, hd, pos, freqs);
            kern_rope_cs(y, n_head, hd, cs, neox);
            assert_memory_equal(x, y, sizeof x);
            for (int h = 0; h < n_head; h++)
                for (int i = 0; i < hd / 2; i++) {
                    int a = neox ? i : 2 * i, b = neox ? i + hd / 2 : 2 * i + 1;
                    double th = (double)pos * freqs[i];
                    double x0 = orig[h * hd + a], x1 = orig[h * hd + b];
                    double w0 = x0 * cos(th) - x1 * sin(th), w1 = x0 * sin(th) + x1 * cos(th);
                    assert_true(fabs(x[h * hd + a] - w0) < 1e-5 && fabs(x[h * hd + b] - w1) < 1e-5);
                }
        }
    }
}

/* kern_rope_cs from kern_rope_angles gives kern_rope's bits, for head sizes
 * over several of kern_rope's 32-pair chunks and a ragged last one. */
static void test_quant_rope_cs(void **state) {
    (void)state;
    kt_rng r = {5};
    for (int hd = 2; hd <= 160; hd += 30) {
        float freqs[80], x[2 * 160], y[2 * 160], cs[160];
        for (int i = 0; i < hd / 2; i++) freqs[i] = (float)pow(10000.0, -2.0 * i / hd);
        for (int neox = 0; neox < 2; neox++)
            for (int pos = 0; pos < 70000; pos += 9973) {
                kt_fill(&r, x, 2 * hd, 1.0f);
                memcpy(y, x, sizeof(float) * 2 * (size_t)hd);
                kern_rope(x, 2, hd, pos, freqs, neox);
                kern_rope_angles(cs, hd, pos, freqs);
                kern_rope_cs(y, 2, hd, cs, neox);
                assert_memory_equal(x, y, sizeof(float) * 2 * (size_t)hd);
            }
    }
}

/* The X16S pack against its definition, written out here: each row's 256
 * values dequantized (kern_dequant_q8_0_ref) and quantized by
 * kern_quant_q8_k_ref, the scale at 4i of the 4160-byte block and value e
 * at 64 + 64 (e / 4) + 4i + e % 4 (kernels_ref.h). Bytes must match for
 * scales of every kind the shortcut must not change: zero blocks and zero
 * scales, negative, subnormal and largest f16 scales, -128 quants, and a
 * super-block of the smallest scale and quants. */
static void test_quant_x16s_pack_definition(void **state) {
    (void)state;
    enum { ROWS = 32, K = 768, NB = K / 256, PER = 8 };
    static tk_block_q8_0 w[ROWS][K / 32];
    static uint8_t got[ROWS / 16 * NB * TK_X16S_BLOCK_BYTES], want[sizeof got];
    static const tk_f16 special[] = {0x0000, 0x8000, 0x0001, 0x03ff, 0x7bff, 0xfbff, 0x0400, 0xbc00};
    uint32_t x = 12345;
    for (int r = 0; r < ROWS; r++)
        for (int b = 0; b < K / 32; b++) {
            x = x * 1664525u + 1013904223u;
            const unsigned kind = x >> 28;
            w[r][b].d =
                kind < 4 ? special[(x >> 8) % 8] : (tk_f16)(0x2000 + (x >> 8) % 0x3000 + (x & 1) * 0x8000);
            for (int j = 0; j < 32; j++) {
                x = x * 1664525u + 1013904223u;
                w[r][b].qs[j] = kind == 5 ? 0 : (int8_t)(x >> 24);
            }
        }
    for (int b = 0; b < PER; b++) { /* a super-block of the smallest scale and quants of 0 and 1 */
        w[3][PER + b].d = 0x0001;
        for (int j = 0; j < 32; j++) w[3][PER + b].qs[j] = (int8_t)(j % 2);
    }
    memset(got, 0xa5, sizeof got);
    memset(want, 0x5a, sizeof want);
    assert_true(kern_pack_q8_0_x16s(w, got, ROWS, K));
    for (int r = 0; r < ROWS; r++)
        for (int sb = 0; sb < NB; sb++) {
            float v[256];
            tk_block_q8_k q;
            kern_dequant_q8_0_ref(&w[r][sb * PER], v, 256);
            kern_quant_q8_k_ref(v, &q, 256);
            uint8_t *blk = want + ((size_t)(r / 16) * NB + (size_t)sb) * TK_X16S_BLOCK_BYTES;
            memcpy(blk + 4 * (r % 16), &q.d, sizeof q.d);
            for (int e = 0; e < 256; e++) blk[64 + 64 * (e / 4) + 4 * (r % 16) + e % 4] = (uint8_t)q.qs[e];
        }
    for (size_t i = 0; i < sizeof got; i++)
        if (got[i] != want[i])
            fail_msg("x16s pack: byte %zu (group %zu, super-block %zu, offset %zu) %u != %u", i,
                     i / (NB * TK_X16S_BLOCK_BYTES), i / TK_X16S_BLOCK_BYTES % NB, i % TK_X16S_BLOCK_BYTES,
                     got[i], want[i]);
    assert_false(kern_pack_q8_0_x16s(w, got, 24, K));        /* rows % 16 */
    assert_false(kern_pack_q8_0_x16s(w, got, 16, 512 + 32)); /* k % 256 */
}

static void test_quant_dispatch(void **state) {
    (void)state;
    assert_int_equal(kern_act_type(TK_DTYPE_BF16, TK_LAYOUT_ROWS), TK_DTYPE_F32);
    assert_int_equal(kern_act_type(TK_DTYPE_Q4_0, TK_LAYOUT_ROWS), TK_DTYPE_Q8_0);
    assert_int_equal(kern_act_type(TK_DTYPE_Q6_K, TK_LAYOUT_ROWS), TK_DTYPE_Q8_K);
    assert_int_equal(kern_act_type((tk_dtype)13, TK_LAYOUT_ROWS), TK_DTYPE_COUNT);
    assert_int_equal(kern_act_row_bytes(TK_DTYPE_F16, TK_LAYOUT_ROWS, 10), 40);
    assert_int_equal(kern_act_row_bytes(TK_DTYPE_Q8_0, TK_LAYOUT_ROWS, 64), 68);
    assert_int_equal(kern_act_row_bytes(TK_DTYPE_Q4_K, TK_LAYOUT_ROWS, 512), 584);
    assert_int_equal(kern_act_row_bytes(TK_DTYPE_Q4_K, TK_LAYOUT_ROWS, 100), 0);
    tk_cpu c;
    cpu_detect(&c);
    const tk_kernels *d = kernels_default();
    assert_non_null(d);
    assert_true(d == kernels_default());
    assert_true(d->isa <= cpu_best_isa(&c));
    for (int isa = 0; isa <= (int)TK_ISA_AVX512; isa++) {
        const tk_kernels *K = kernels_get((tk_isa)isa);
        assert_int_equal(K->isa, isa);
        assert_non_null(kern_gemv(K, TK_DTYPE_Q8_0, TK_LAYOUT_ROWS));
        assert_null(kern_gemv(K, TK_DTYPE_Q8_K, TK_LAYOUT_ROWS));
        assert_non_null(K->rmsnorm);
    }
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_quant_f16_bf16_known),
        cmocka_unit_test(test_quant_q8_0_known),
        cmocka_unit_test(test_quant_q4_0_known),
        cmocka_unit_test(test_quant_q4_k_known),
        cmocka_unit_test(test_quant_q6_k_known),
        cmocka_unit_test(test_quant_act_known),
        cmocka_unit_test(test_quant_roundtrip_error),
        cmocka_unit_test(test_quant_gemv_ref_vs_dequant),
        cmocka_unit_test(test_quant_norm_act_known),
        cmocka_unit_test(test_quant_rope_direct),
        cmocka_unit_test(test_quant_rope_cs),
        cmocka_unit_test(test_quant_dispatch),
        cmocka_unit_test(test_quant_x16s_pack_definition),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
