/* The forward pass on tiny qwen3 / qwen2 / llama models: agreement with a
 * float64 reference, batch invariance bit for bit, fused vs unfused, chunked
 * prefill, thread-count invariance, GGUF-permuted vs HF llama, and batch checks. */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include "core/error.h"
#include "core/pool.h"
#include "isa_level.h"
#include "model/forward.h"
#include "model/fwd_prof.h"
#include "test_model_fixture.h"

#define BS      16
#define MAX_POS 256

/* A harness: one model, one KV pool, one thread pool, one forward context. */
typedef struct harness {
    tk_model *m;
    tk_kv *kv;
    tk_pool *pool;
    fwd_ctx *f;
    int32_t bt[8][MAX_POS / BS]; /* block tables of up to 8 sequences */
    int len[8];                  /* tokens in the cache per sequence */
} harness;

static void h_init(harness *h, tk_model *m, int nth, bool unfused, tk_kv_type kvt) {
    memset(h, 0, sizeof *h);
    h->m = m;
    tk_kv_opts ko = {.n_layer = m->hp.n_layer,
                     .n_head_kv = m->hp.n_head_kv,
                     .head_dim = m->hp.head_dim,
                     .block_size = BS,
                     .n_blocks = 8 * MAX_POS / BS,
                     .type = kvt,
                     .scale = TK_KV_SCALE_HEAD};
    assert_int_equal(kv_init(&ko, &h->kv), TK_OK);
    assert_int_equal(pool_init(nth, false, &h->pool), TK_OK);
    fwd_opts fo = {.max_tokens = 160, .max_seqs = 8, .max_ctx = MAX_POS, .unfused = unfused};
    assert_int_equal(fwd_init(m, h->kv, h->pool, &fo, &h->f), TK_OK);
    for (int s = 0; s < 8; s++)
        for (int b = 0; b < MAX_POS / BS; b++) h->bt[s][b] = kv_block_alloc(h->kv);
}

static void h_free(harness *h) {
    fwd_free(h->f);
    pool_free(h->pool);
    kv_free(h->kv);
}

/* One step: sequence ids seqs[i] get n[i] tokens from toks (in order); logits
 * of every sequence's last token land in out (n_seq x n_vocab). */
static void h_step(harness *h, int n_seq, const int *seqs, const int32_t *n, const int32_t *toks,
                   float *out) {
    int32_t pos0[8];
    const int32_t *bts[8];
    int32_t want[8];
    int n_tok = 0;
    for (int i = 0; i < n_seq; i++) {
        pos0[i] = h->len[seqs[i]];
        bts[i] = h->bt[seqs[i]];
        want[i] = 1;
        n_tok += n[i];
    }
    tk_batch b = {
        .n_seq = n_seq, .n_tok = n_tok, .tokens = toks, .n = n, .pos0 = pos0, .bt = bts, .n_logits = want};
    assert_int_equal(fwd_step(h->f, &b, out), TK_OK);
    for (int i = 0; i < n_seq; i++) h->len[seqs[i]] += n[i];
}

static const int32_t PROMPT[14] = {5, 17, 299, 42, 8, 100, 3, 77, 150, 201, 9, 64, 33, 250};

/* The logits of PROMPT's first n positions, one token a step (every
 * position's), against the float64 reference: the relative error. */
static double ref_error(tk_model *m, int n) {
    const int V = m->hp.n_vocab;
    float *ref = malloc((size_t)n * V * sizeof(float)), *got = malloc((size_t)n * V * sizeof(float));
    fx_reference(m, PROMPT, n, ref);
    harness h;
    h_init(&h, m, 2, false, TK_KV_F32);
    for (int p = 0; p < n; p++) {
        int s = 0;
        int32_t t1 = 1;
        h_step(&h, 1, &s, &t1, &PROMPT[p], got + (size_t)p * V);
    }
    const double err = fx_rel_err(got, ref, (size_t)n * V);
    h_free(&h);
    free(ref);
    free(got);
    return err;
}

static void check_reference(tk_arch arch, tk_dtype wt, double tol) {
    fx_model fx;
    fx_build(&fx, arch, wt, TK_NAMING_HF);
    tk_model *m;
    assert_int_equal(fx_open(&fx, NULL, &m), TK_OK);
    const double err = ref_error(m, 14);
    if (err > tol) fail_msg("%s/%s: relative error %g > %g", arch_name(arch), dtype_name(wt), err, tol);
    tk_model_free(m);
    fx_free(&fx);
}

static void test_forward_matches_reference(void **state) {
    (void)state;
    check_reference(TK_ARCH_QWEN3, TK_DTYPE_F32, 1e-5);
    check_reference(TK_ARCH_QWEN2, TK_DTYPE_F32, 1e-5);
    check_reference(TK_ARCH_LLAMA, TK_DTYPE_F32, 1e-5);
    /* quantized activations: the reference uses the same (dequantized) weights, f32 activations */
    check_reference(TK_ARCH_QWEN3, TK_DTYPE_Q8_0, 3e-2);
    check_reference(TK_ARCH_LLAMA, TK_DTYPE_F16, 1e-3);
}

/* Sequence 0 alone, then inside a batch with two others: identical bits. */
static void check_batch_invariance(tk_arch arch, tk_dtype wt, int nth) {
    fx_model fx;
    fx_build(&fx, arch, wt, TK_NAMING_HF);
    tk_model *m;
    assert_int_equal(fx_open(&fx, NULL, &m), TK_OK);
    int V = m->hp.n_vocab;
    float *alone = malloc(4 * (size_t)V * sizeof(float)), *batch = malloc(3 * (size_t)V * sizeof(float));
    harness a, b;
    h_init(&a, m, nth, false, TK_KV_F16);
    h_init(&b, m, nth, false, TK_KV_F16);
    int s0 = 0;
    int32_t n5 = 5;
    h_step(&a, 1, &s0, &n5, PROMPT, alone);
    int32_t dec[3] = {11, 22, 33};
    for (int i = 0; i < 3; i++) {
        int32_t one = 1;
        h_step(&a, 1, &s0, &one, &dec[i], alone + (size_t)(i + 1) * V);
    }
    /* batch: seq 0 with the same tokens, next to seq 1 (prefill of 7) and seq 2
     * (prefill of 3 then decodes), in varying order */
    int seqs[3] = {1, 0, 2};
    int32_t n[3] = {7, 5, 3};
    int32_t toks[15];
    memcpy(toks, PROMPT + 5, 7 * sizeof(int32_t));
    memcpy(toks + 7, PROMPT, 5 * sizeof(int32_t));
    memcpy(toks + 12, PROMPT + 2, 3 * sizeof(int32_t));
    h_step(&b, 3, seqs, n, toks, batch);
    assert_memory_equal(batch + V, alone, (size_t)V * sizeof(float));
    for (int i = 0; i < 3; i++) {
        int order[3] = {i % 2 ? 2 : 0, i % 2 ? 0 : 1, i % 2 ? 1 : 2};
        int32_t nn[3] = {1, 1, 1}, tt[3];
        int at = 0;
        for (int j = 0; j < 3; j++) {
            tt[j] = order[j] == 0 ? dec[i] : (int32_t)(40 + 3 * i + j);
            if (order[j] == 0) at = j;
        }
        h_step(&b, 3, order, nn, tt, batch);
        assert_memory_equal(batch + (size_t)at * V, alone + (size_t)(i + 1) * V, (size_t)V * sizeof(float));
    }
    h_free(&a);
    h_free(&b);
    tk_model_free(m);
    fx_free(&fx);
    free(alone);
    free(batch);
}

static void test_forward_batch_invariance(void **state) {
    (void)state;
    check_batch_invariance(TK_ARCH_QWEN3, TK_DTYPE_F32, 1);
    check_batch_invariance(TK_ARCH_QWEN3, TK_DTYPE_F32, 3);
    check_batch_invariance(TK_ARCH_QWEN2, TK_DTYPE_Q8_0, 2);
    check_batch_invariance(TK_ARCH_LLAMA, TK_DTYPE_BF16, 2);
}

/* The same prompt on 1, 2 and 3 threads: the split must not change a bit. */
static void test_forward_thread_invariance(void **state) {
    (void)state;
    fx_model fx;
    fx_build(&fx, TK_ARCH_QWEN3, TK_DTYPE_Q8_0, TK_NAMING_HF);
    tk_model *m;
    assert_int_equal(fx_open(&fx, NULL, &m), TK_OK);
    int V = m->hp.n_vocab;
    float *out[3];
    for (int t = 0; t < 3; t++) {
        out[t] = malloc((size_t)V * sizeof(float));
        harness h;
        h_init(&h, m, t + 1, false, TK_KV_F16);
        int s = 0;
        int32_t n = 14;
        h_step(&h, 1, &s, &n, PROMPT, out[t]);
        h_free(&h);
    }
    assert_memory_equal(out[0], out[1], (size_t)V * sizeof(float));
    assert_memory_equal(out[0], out[2], (size_t)V * sizeof(float));
    for (int t = 0; t < 3; t++) free(out[t]);
    tk_model_free(m);
    fx_free(&fx);
}

/* Decode over contexts longer than a part (KV_ATTN_PART positions): on 2 and
 * 4 threads a lone long sequence's context is split into parts on several
 * threads and folded, on 1 thread it is attended whole; a short sequence
 * beside it changes nothing either. Every KV type; logits bit-identical. */
enum { LONG_CTX = 1100, LONG_BS = 16 };
static void long_decode(tk_model *m, int nth, tk_kv_type kvt, float *out) {
    const int V = m->hp.n_vocab, nb = LONG_CTX / LONG_BS + 1;
    tk_kv_opts ko = {.n_layer = m->hp.n_layer,
                     .n_head_kv = m->hp.n_head_kv,
                     .head_dim = m->hp.head_dim,
                     .block_size = LONG_BS,
                     .n_blocks = 2 * nb,
                     .type = kvt,
                     .scale = TK_KV_SCALE_HEAD};
    harness h = {.m = m};
    assert_int_equal(kv_init(&ko, &h.kv), TK_OK);
    assert_int_equal(pool_init(nth, false, &h.pool), TK_OK);
    fwd_opts fo = {.max_tokens = 256, .max_seqs = 2, .max_ctx = LONG_CTX};
    assert_int_equal(fwd_init(m, h.kv, h.pool, &fo, &h.f), TK_OK);
    static int32_t bt[2][LONG_CTX / LONG_BS + 1], toks[256];
    for (int s = 0; s < 2; s++)
        for (int b = 0; b < nb; b++) bt[s][b] = kv_block_alloc(h.kv);
    int32_t pos0[2] = {0, 0}, want[2] = {1, 1};
    const int32_t *bts[2] = {bt[0], bt[1]};
    for (int step = 0; pos0[0] < LONG_CTX - 4; step++) { /* prefill sequence 0 */
        int32_t n = LONG_CTX - 4 - pos0[0] < 256 ? LONG_CTX - 4 - pos0[0] : 256, none = 0;
        for (int i = 0; i < n; i++) toks[i] = (int32_t)((pos0[0] + i) * 7 % V);
        tk_batch b = {
            .n_seq = 1, .n_tok = n, .tokens = toks, .n = &n, .pos0 = pos0, .bt = bts, .n_logits = &none};
        assert_int_equal(fwd_step(h.f, &b, NULL), TK_OK);
        pos0[0] += n;
    }
    int32_t n1 = 1, n2[2] = {1, 5};
    toks[0] = 11;
    tk_batch b1 = {
        .n_seq = 1, .n_tok = 1, .tokens = toks, .n = &n1, .pos0 = pos0, .bt = bts, .n_logits = want};
    assert_int_equal(fwd_step(h.f, &b1, out), TK_OK); /* alone */
    pos0[0]++;
    for (int i = 0; i < 6; i++) toks[i] = (int32_t)(i * 13 % V);
    tk_batch b2 = {
        .n_seq = 2, .n_tok = 6, .tokens = toks, .n = n2, .pos0 = pos0, .bt = bts, .n_logits = want};
    assert_int_equal(fwd_step(h.f, &b2, out + V), TK_OK); /* beside a short prefill */
    fwd_free(h.f);
    pool_free(h.pool);
    kv_free(h.kv);
}

static void test_forward_split_decode_threads(void **state) {
    (void)state;
    fx_model fx;
    fx_build(&fx, TK_ARCH_QWEN3, TK_DTYPE_F32, TK_NAMING_HF); /* f32: no int8 rounding hides a bit */
    tk_model *m;
    assert_int_equal(fx_open(&fx, NULL, &m), TK_OK);
    const size_t V = (size_t)m->hp.n_vocab;
    const tk_kv_type types[] = {TK_KV_F32, TK_KV_F16, TK_KV_BF16, TK_KV_INT8};
    float *out[3];
    for (int t = 0; t < 3; t++) out[t] = malloc(3 * V * sizeof(float));
    for (size_t k = 0; k < sizeof types / sizeof types[0]; k++) {
        const int threads[3] = {1, 2, 4};
        for (int t = 0; t < 3; t++) long_decode(m, threads[t], types[k], out[t]);
        for (int t = 1; t < 3; t++)
            if (memcmp(out[0], out[t], 3 * V * sizeof(float)))
                fail_msg("kv type %d: %d threads differ from 1", (int)types[k], threads[t]);
    }
    for (int t = 0; t < 3; t++) free(out[t]);
    tk_model_free(m);
    fx_free(&fx);
}

/* The row-split projections in fixed, uneven shares (a thread with every
 * row, one with none, three unequal ones): the prompt and three decode steps
 * give the logits of one thread, bit for bit. Shares that are not a split
 * are refused; measured shares stay a split within [1/2, 3/2] of even. */
static void row_shares_run(tk_model *m, int nth, const double *shares, float *out) {
    const int V = m->hp.n_vocab;
    harness h;
    h_init(&h, m, nth, false, TK_KV_INT8);
    if (shares) assert_int_equal(fwd_set_row_shares(h.f, shares), TK_OK);
    int s = 0;
    int32_t n = 14, one = 1;
    h_step(&h, 1, &s, &n, PROMPT, out);
    for (int i = 0; i < 3; i++) h_step(&h, 1, &s, &one, &PROMPT[i + 3], out + (size_t)(i + 1) * V);
    if (!shares) {
        double got[4], sum = 0;
        fwd_row_shares(h.f, got);
        for (int t = 0; t < nth; t++) {
            assert_true(got[t] >= 0.5 / nth - 1e-9 && got[t] <= 1.5 / nth + 1e-9);
            sum += got[t];
        }
        assert_true(fabs(sum - 1) < 1e-9);
    }
    h_free(&h);
}

static void test_forward_row_shares(void **state) {
    (void)state;
    fx_model fx;
    fx_build(&fx, TK_ARCH_QWEN3, TK_DTYPE_Q8_0, TK_NAMING_HF);
    tk_model *m;
    assert_int_equal(fx_open(&fx, NULL, &m), TK_OK);
    const size_t V = (size_t)m->hp.n_vocab, bytes = 4 * V * sizeof(float);
    float *ref = malloc(bytes), *got = malloc(bytes);
    row_shares_run(m, 1, NULL, ref);
    const double two[][2] = {{0.8, 0.2}, {0.25, 0.75}, {1, 0}, {0, 1}};
    for (int k = 0; k < 4; k++) {
        row_shares_run(m, 2, two[k], got);
        if (memcmp(ref, got, bytes))
            fail_msg("2 threads, shares %g / %g: logits differ", two[k][0], two[k][1]);
    }
    const double three[3] = {0.6, 0.1, 0.3};
    row_shares_run(m, 3, three, got);
    assert_memory_equal(ref, got, bytes);
    row_shares_run(m, 2, NULL, got);
    assert_memory_equal(ref, got, bytes);
    row_shares_run(m, 4, NULL, got);
    assert_memory_equal(ref, got, bytes);

    harness h;
    h_init(&h, m, 2, false, TK_KV_F16);
    const double bad[][2] = {{0.5, 0.6}, {-0.1, 1.1}, {NAN, 0.5}, {0.4, 0.4}};
    for (int k = 0; k < 4; k++) assert_int_equal(fwd_set_row_shares(h.f, bad[k]), TK_ERR_INVALID);
    double cur[2];
    fwd_row_shares(h.f, cur);
    assert_true(cur[0] == 0.5 && cur[1] == 0.5); /* a refused split leaves them */
    assert_int_equal(fwd_set_row_shares(h.f, two[0]), TK_OK);
    fwd_row_shares(h.f, cur);
    assert_true(cur[0] == 0.8 && cur[1] == 0.2);
    assert_int_equal(fwd_set_row_shares(h.f, NULL), TK_OK); /* measuring again, from even */
    fwd_row_shares(h.f, cur);
    assert_true(cur[0] == 0.5 && cur[1] == 0.5);
    assert_int_equal(fwd_set_row_shares(NULL, NULL), TK_ERR_INVALID);
    h_free(&h);
    free(ref);
    free(got);
    tk_model_free(m);
    fx_free(&fx);
}

static void check_fused_unfused(tk_arch arch, tk_dtype wt) {
    fx_model fx;
    fx_build(&fx, arch, wt, TK_NAMING_HF);
    tk_model *m;
    assert_int_equal(fx_open(&fx, NULL, &m), TK_OK);
    int V = m->hp.n_vocab;
    float *a = malloc(2 * (size_t)V * sizeof(float)), *b = malloc(2 * (size_t)V * sizeof(float));
    harness hf, hu;
    h_init(&hf, m, 2, false, TK_KV_F16);
    h_init(&hu, m, 2, true, TK_KV_F16);
    int seqs[2] = {0, 1};
    int32_t n[2] = {9, 5};
    h_step(&hf, 2, seqs, n, PROMPT, a);
    h_step(&hu, 2, seqs, n, PROMPT, b);
    assert_true(fx_rel_err(a, b, 2 * (size_t)V) <= 1e-5);
    int32_t one[2] = {1, 1}, dec[2] = {7, 8};
    h_step(&hf, 2, seqs, one, dec, a);
    h_step(&hu, 2, seqs, one, dec, b);
    assert_true(fx_rel_err(a, b, 2 * (size_t)V) <= 1e-5);
    h_free(&hf);
    h_free(&hu);
    tk_model_free(m);
    fx_free(&fx);
    free(a);
    free(b);
}

static void test_forward_fused_matches_unfused(void **state) {
    (void)state;
    check_fused_unfused(TK_ARCH_QWEN3, TK_DTYPE_F32);
    check_fused_unfused(TK_ARCH_QWEN2, TK_DTYPE_Q8_0);
    check_fused_unfused(TK_ARCH_LLAMA, TK_DTYPE_F16);
}

/* The prompt in chunks of 1, 3 and 7 tokens gives the whole-prefill logits. */
static void test_forward_chunked_prefill(void **state) {
    (void)state;
    fx_model fx;
    fx_build(&fx, TK_ARCH_QWEN3, TK_DTYPE_F32, TK_NAMING_HF);
    tk_model *m;
    assert_int_equal(fx_open(&fx, NULL, &m), TK_OK);
    int V = m->hp.n_vocab, n = 14;
    float *whole = malloc(2 * (size_t)V * sizeof(float)), *got = malloc(2 * (size_t)V * sizeof(float));
    harness h;
    h_init(&h, m, 2, false, TK_KV_F32);
    int s = 0;
    int32_t nn = n, one = 1, next = 123;
    h_step(&h, 1, &s, &nn, PROMPT, whole);
    h_step(&h, 1, &s, &one, &next, whole + V);
    h_free(&h);
    int chunks[3] = {1, 3, 7};
    for (int c = 0; c < 3; c++) {
        h_init(&h, m, 2, false, TK_KV_F32);
        for (int p = 0; p < n; p += chunks[c]) {
            int32_t k = n - p < chunks[c] ? n - p : chunks[c];
            h_step(&h, 1, &s, &k, PROMPT + p, got);
        }
        h_step(&h, 1, &s, &one, &next, got + V);
        double e = fx_rel_err(got, whole, 2 * (size_t)V);
        if (e > 1e-5) fail_msg("chunk %d: relative error %g", chunks[c], e);
        h_free(&h);
    }
    tk_model_free(m);
    fx_free(&fx);
    free(whole);
    free(got);
}

/* Splitting a prompt into chunks changes no bit of the logits, for every
 * KV type: INT8 per-head scales included, whose blocks a chunk's later
 * tokens rescale (the own-block records, kv.h). The whole prompt in one step
 * is longer than an attention slice (forward.c's ATTN_SLICE), so its
 * attention runs as several units taken by either thread. */
static void check_chunked_prefill_bits(tk_dtype wt) {
    fx_model fx;
    fx_build(&fx, TK_ARCH_QWEN3, wt, TK_NAMING_HF);
    tk_model *m;
    assert_int_equal(fx_open(&fx, NULL, &m), TK_OK);
    const int V = m->hp.n_vocab, n = 150;
    int32_t toks[150];
    for (int i = 0; i < n; i++) toks[i] = PROMPT[i % 14] * 7 % V;
    float *whole = malloc(2 * (size_t)V * sizeof(float)), *got = malloc(2 * (size_t)V * sizeof(float));
    const tk_kv_type types[] = {TK_KV_F32, TK_KV_F16, TK_KV_BF16, TK_KV_INT8};
    for (int ti = 0; ti < 4; ti++) {
        harness h;
        int s = 0;
        int32_t one = 1, next = 123;
        h_init(&h, m, 2, false, types[ti]);
        for (int p = 0; p < n; p++) h_step(&h, 1, &s, &one, toks + p, whole); /* token by token */
        h_step(&h, 1, &s, &one, &next, whole + V);
        h_free(&h);
        const int chunks[3] = {5, 17, 150};
        for (int c = 0; c < 3; c++) {
            h_init(&h, m, 2, false, types[ti]);
            for (int p = 0; p < n; p += chunks[c]) {
                int32_t k = n - p < chunks[c] ? n - p : chunks[c];
                h_step(&h, 1, &s, &k, toks + p, got);
            }
            h_step(&h, 1, &s, &one, &next, got + V);
            if (memcmp(got, whole, 2 * (size_t)V * sizeof(float)))
                fail_msg("weights %d kv type %d, chunks of %d: logits differ from token by token (relative "
                         "error %g)",
                         (int)wt, (int)types[ti], chunks[c], fx_rel_err(got, whole, 2 * (size_t)V));
            h_free(&h);
        }
    }
    tk_model_free(m);
    fx_free(&fx);
    free(whole);
    free(got);
}

static void test_forward_chunked_prefill_bits(void **state) {
    (void)state;
    check_chunked_prefill_bits(TK_DTYPE_F32);
    check_chunked_prefill_bits(TK_DTYPE_Q8_0);
}

/* GGUF llama (Q/K rows permuted by the converter, llama3 factors as a tensor)
 * and the HF layout (factors from config) give bit-identical logits. */
static void test_forward_llama_unpermute(void **state) {
    (void)state;
    tk_dtype types[2] = {TK_DTYPE_F32, TK_DTYPE_Q8_0};
    for (int ti = 0; ti < 2; ti++) {
        fx_model hf, gg;
        fx_build(&hf, TK_ARCH_LLAMA, types[ti], TK_NAMING_HF);
        fx_build(&gg, TK_ARCH_LLAMA, types[ti], TK_NAMING_GGUF);
        /* the permuted file really differs from the HF layout */
        assert_memory_not_equal(fx_get(&gg, "blk.0.attn_q.weight")->data,
                                fx_get(&hf, "model.layers.0.self_attn.q_proj.weight")->data,
                                fx_get(&gg, "blk.0.attn_q.weight")->nbytes);
        tk_model *mh, *mg;
        assert_int_equal(fx_open(&hf, NULL, &mh), TK_OK);
        assert_int_equal(fx_open(&gg, NULL, &mg), TK_OK);
        assert_memory_equal(mh->rope_freqs, mg->rope_freqs, (size_t)mh->hp.head_dim / 2 * sizeof(float));
        int V = mh->hp.n_vocab;
        float *a = malloc((size_t)V * sizeof(float)), *b = malloc((size_t)V * sizeof(float));
        harness h1, h2;
        h_init(&h1, mh, 2, false, TK_KV_F16);
        h_init(&h2, mg, 2, false, TK_KV_F16);
        int s = 0;
        int32_t n = 14;
        h_step(&h1, 1, &s, &n, PROMPT, a);
        h_step(&h2, 1, &s, &n, PROMPT, b);
        assert_memory_equal(a, b, (size_t)V * sizeof(float));
        h_free(&h1);
        h_free(&h2);
        tk_model_free(mh);
        tk_model_free(mg);
        fx_free(&hf);
        fx_free(&gg);
        free(a);
        free(b);
    }
}

/* Repacking F32 weights to Q8_0 at load gives the model built as Q8_0. */
static void test_forward_repack(void **state) {
    (void)state;
    fx_model f32, q8;
    fx_build(&f32, TK_ARCH_QWEN2, TK_DTYPE_F32, TK_NAMING_HF);
    fx_build(&q8, TK_ARCH_QWEN2, TK_DTYPE_Q8_0, TK_NAMING_HF);
    tk_model_opts o;
    tk_model_opts_default(&o);
    o.repack = TK_WEIGHTS_Q8_0;
    tk_model *mr, *mq;
    assert_int_equal(fx_open(&f32, &o, &mr), TK_OK);
    assert_int_equal(fx_open(&q8, NULL, &mq), TK_OK);
    assert_string_equal(model_weight_dtype(mr), "q8_0");
    assert_int_equal(model_decode_bytes(mr) - mr->tok_embd.nbytes / 300,
                     model_decode_bytes(mq) - mq->tok_embd.nbytes / 300);
    int V = mr->hp.n_vocab;
    float *a = malloc((size_t)V * sizeof(float)), *b = malloc((size_t)V * sizeof(float));
    harness h1, h2;
    h_init(&h1, mr, 2, false, TK_KV_F16);
    h_init(&h2, mq, 2, false, TK_KV_F16);
    int s = 0;
    int32_t n = 6;
    h_step(&h1, 1, &s, &n, PROMPT, a);
    h_step(&h2, 1, &s, &n, PROMPT, b);
    /* embeddings stay f32 in the repacked model, q8_0 in the other */
    assert_true(fx_rel_err(a, b, (size_t)V) < 5e-2);
    h_free(&h1);
    h_free(&h2);
    tk_model_free(mr);
    tk_model_free(mq);
    /* W4A8 with an 8-bit output layer; an output type alone leaves the layers be */
    o.repack = TK_WEIGHTS_Q4_0;
    o.repack_output = TK_WEIGHTS_Q8_0;
    assert_int_equal(fx_open(&f32, &o, &mr), TK_OK);
    assert_int_equal(mr->layers[0].wq.type, TK_DTYPE_Q4_0);
    assert_int_equal(mr->layers[0].w_down.type, TK_DTYPE_Q4_0);
    assert_int_equal(mr->output.type, TK_DTYPE_Q8_0);
    assert_string_equal(model_weight_dtype(mr), "q4_0");
    tk_model_free(mr);
    o.repack = TK_WEIGHTS_KEEP;
    assert_int_equal(fx_open(&f32, &o, &mr), TK_OK);
    assert_int_equal(mr->layers[0].wq.type, TK_DTYPE_F32);
    assert_int_equal(mr->output.type, TK_DTYPE_Q8_0);
    tk_model_free(mr);
    o.repack_output = (tk_weight_type)42;
    assert_int_equal(fx_open(&f32, &o, &mr), TK_ERR_INVALID);
    assert_non_null(strstr(tk_last_error(), "42"));
    fx_free(&f32);
    fx_free(&q8);
    free(a);
    free(b);
}

/* The opt-in layout tests' model of weight type t, in a shape whose every
 * matrix but the 300-row output takes the layouts of 16 rows and 256
 * values: opened with o (its option set) into *with, with the defaults into
 * *without. */
static void opt_in_open(tk_dtype t, const tk_model_opts *o, fx_model *fx, tk_model **with,
                        tk_model **without) {
    tk_hparams hp;
    fx_hparams(&hp, TK_ARCH_QWEN3);
    hp.n_layer = 2;
    hp.n_embd = 256;
    hp.n_ff = 512;
    hp.head_dim = 64;
    fx_build_hp(fx, &hp, t, TK_NAMING_HF);
    assert_int_equal(fx_open(fx, o, with), TK_OK);
    assert_int_equal(fx_open(fx, NULL, without), TK_OK);
}

/* A 14-token prompt's last logits have the same bits on 1, 2 and 3 threads,
 * and beside two other sequences in one step. */
static void check_same_bits(tk_model *m) {
    const int V = m->hp.n_vocab;
    float *one = malloc(3 * (size_t)V * sizeof(float)), *batch = malloc(3 * (size_t)V * sizeof(float));
    for (int t = 0; t < 3; t++) {
        harness h;
        h_init(&h, m, t + 1, false, TK_KV_F16);
        int s = 0;
        int32_t n14 = 14;
        h_step(&h, 1, &s, &n14, PROMPT, one + (size_t)t * V);
        h_free(&h);
    }
    assert_memory_equal(one, one + V, (size_t)V * sizeof(float));
    assert_memory_equal(one, one + 2 * (size_t)V, (size_t)V * sizeof(float));
    harness h;
    h_init(&h, m, 2, false, TK_KV_F16);
    int seqs[3] = {1, 0, 2};
    int32_t nn[3] = {5, 14, 9}, toks[28];
    memcpy(toks, PROMPT + 3, 5 * sizeof(int32_t));
    memcpy(toks + 5, PROMPT, 14 * sizeof(int32_t));
    memcpy(toks + 19, PROMPT + 1, 9 * sizeof(int32_t));
    h_step(&h, 3, seqs, nn, toks, batch);
    assert_memory_equal(batch + V, one, (size_t)V * sizeof(float));
    h_free(&h);
    free(batch);
    free(one);
}

/* An opt-in option chooses a layout of the resident copy: none with
 * row_layout or use_mmap. */
static void check_opt_in_needs_copy(fx_model *fx, tk_model_opts o) {
    tk_model *m;
    o.row_layout = true;
    assert_int_equal(fx_open(fx, &o, &m), TK_OK);
    assert_int_equal(m->layers[0].wq.layout, TK_LAYOUT_ROWS);
    tk_model_free(m);
    o.row_layout = false;
    o.use_mmap = true;
    assert_int_equal(fx_open(fx, &o, &m), TK_OK);
    assert_int_equal(m->layers[0].wq.layout, TK_LAYOUT_ROWS);
    tk_model_free(m);
}

/* q8_coarse: the Q8_0 matmuls whose shapes take it are requantized to a
 * scale per 256 values (X16S) and read with Q8_K activations, beside the
 * output matrix, whose 300 rows do not (so one slot feeds both formats); the
 * model counts the fewer bytes; the logits stay near the float64 reference
 * (within 2.5x the file layout's error), do not depend on the thread count
 * or the batch; use_mmap and row_layout leave the option be. */
static void test_forward_q8_coarse(void **state) {
    (void)state;
    tk_model_opts o;
    tk_model_opts_default(&o);
    o.q8_coarse = true;
    fx_model fx;
    tk_model *mc, *mq;
    opt_in_open(TK_DTYPE_Q8_0, &o, &fx, &mc, &mq);
    const tk_tensor *w[5] = {&mc->layers[1].wq, &mc->layers[1].wk, &mc->layers[0].wo, &mc->layers[0].w_up,
                             &mc->layers[1].w_down};
    for (int i = 0; i < 5; i++) {
        assert_int_equal(w[i]->layout, TK_LAYOUT_X16S);
        assert_int_equal(w[i]->nbytes, (uint64_t)(w[i]->ne[0] / 256 * w[i]->ne[1]) * 260);
    }
    assert_int_equal(mq->layers[1].wq.layout, TK_LAYOUT_X16);
    assert_int_not_equal(mc->output.layout, TK_LAYOUT_X16S);
    assert_true(model_decode_bytes(mc) < model_decode_bytes(mq));
    const double err[2] = {ref_error(mq, 14), ref_error(mc, 14)};
    print_message("relative error against the float64 reference: q8_0 %.3g, q8_coarse %.3g\n", err[0],
                  err[1]);
    assert_true(err[1] > 0 && err[1] < 2.5 * err[0]);
    check_same_bits(mc);
    tk_model_free(mc);
    tk_model_free(mq);
    check_opt_in_needs_copy(&fx, o);
    fx_free(&fx);
}

/* bf16_dot: the BF16 matmuls (the output's 300 rows too: P16 takes any
 * multiple of 16 rows) are P16R, whose gemv rounds activations to BF16 and
 * runs as vdpbf16ps where the CPU has it and it is faster (the same bits as
 * its FMA form): the logits move off the float64 reference by the rounding
 * (each activation by up to 2^-8 of itself: more than P16's f32 error, less
 * than 2^-8 of the largest logit), do not depend on the thread count or the
 * batch; the model reads the same bytes; use_mmap and row_layout leave the
 * option be. */
static void test_forward_bf16_dot(void **state) {
    (void)state;
    tk_model_opts o;
    tk_model_opts_default(&o);
    o.bf16_dot = true;
    fx_model fx;
    tk_model *mr, *mp;
    opt_in_open(TK_DTYPE_BF16, &o, &fx, &mr, &mp);
    const tk_tensor *w[4] = {&mr->layers[1].wq, &mr->layers[0].wo, &mr->layers[0].w_up,
                             &mr->layers[1].w_down};
    for (int i = 0; i < 4; i++) assert_int_equal(w[i]->layout, TK_LAYOUT_P16R);
    assert_int_equal(mp->layers[1].wq.layout, TK_LAYOUT_P16);
    assert_int_equal(model_decode_bytes(mr), model_decode_bytes(mp));
    const double err[2] = {ref_error(mp, 14), ref_error(mr, 14)};
    print_message("relative error against the float64 reference: bf16 %.3g, bf16_dot %.3g\n", err[0], err[1]);
    assert_true(err[1] > err[0] && err[1] < 0x1p-8);
    check_same_bits(mr);
    tk_model_free(mr);
    tk_model_free(mp);
    check_opt_in_needs_copy(&fx, o);
    fx_free(&fx);
}

/* The (query, position) pairs of tokens [from, from + n) of a sequence, each
 * with its context up to itself, or (block > 0) from its own block's start. */
static double pairs_of(int from, int n, int block) {
    double s = 0;
    for (int p = from; p < from + n; p++) s += block > 0 ? p % block + 1 : p + 1;
    return s;
}

/* fwd_last_costs, what the bench's floors are taken from: zero before a
 * step; after a mixed step of prompts of two lengths, the stages' bytes add
 * up to fwd_last_bytes and attention's operations (with own-block records,
 * kv_store's too) to 4 x heads x head_dim per pair, counted here pair by
 * pair (the last layer for the wanted tokens alone); a step of equal
 * decodes costs what tokamak profile's shape of it does. */
static void test_forward_last_costs(void **state) {
    (void)state;
    fx_model fx;
    fx_build(&fx, TK_ARCH_QWEN3, TK_DTYPE_Q8_0, TK_NAMING_HF);
    tk_model *m;
    assert_int_equal(fx_open(&fx, NULL, &m), TK_OK);
    const tk_hparams *hp = &m->hp;
    const double per_pair = 4.0 * hp->n_head * hp->head_dim;
    const tk_kv_type kvt[2] = {TK_KV_F16, TK_KV_INT8};
    for (int k = 0; k < 2; k++) {
        harness h;
        h_init(&h, m, 2, false, kvt[k]);
        const int block = kvt[k] == TK_KV_INT8 ? BS : 0; /* per-head INT8 keeps own-block records */
        const size_t kv_tok = kv_bytes_per_token(kv_opts(h.kv));
        fwd_stage_cost c[FWD_ST_COUNT], want[FWD_ST_COUNT];
        fwd_last_costs(h.f, c);
        for (int s = 0; s < FWD_ST_COUNT; s++) assert_true(c[s].bytes == 0 && c[s].ops == 0);
        float *lg = malloc(4 * (size_t)hp->n_vocab * sizeof(float));
        int32_t toks[19]; /* the two prompts' tokens, PROMPT's over again */
        for (int i = 0; i < 19; i++) toks[i] = PROMPT[i % 14];
        int seqs[2] = {0, 1};
        int32_t n[2] = {14, 5};
        h_step(&h, 2, seqs, n, toks, lg);
        fwd_last_costs(h.f, c);
        uint64_t bytes = 0;
        for (int s = 0; s < FWD_ST_COUNT; s++) bytes += c[s].bytes;
        assert_int_equal(bytes, fwd_last_bytes(h.f));
        const double all = pairs_of(0, 14, 0) + pairs_of(0, 5, 0), out = 14 + 5;
        const double own = pairs_of(0, 14, block) + pairs_of(0, 5, block);
        const double own_out = block ? 13 % block + 1 + 4 % block + 1 : 0;
        const double attn = (hp->n_layer - 1) * all + out,
                     rec = block ? (hp->n_layer - 1) * own + own_out : 0;
        assert_true(fabs(c[FWD_ST_ATTN].ops + c[FWD_ST_KV_STORE].ops - per_pair * attn) <
                    1e-6 * per_pair * attn);
        assert_true(fabs(c[FWD_ST_KV_STORE].ops - per_pair * rec) < 1e-6 * per_pair * (rec + 1));
        /* seqs 2 and 3 to the same length, then one decode each */
        int two[2] = {2, 3};
        int32_t n3[2] = {3, 3}, n1[2] = {1, 1};
        h_step(&h, 2, two, n3, PROMPT, lg);
        h_step(&h, 2, two, n1, PROMPT, lg);
        fwd_last_costs(h.f, c);
        fwd_step_shape sh = {0}; /* as tokamak profile builds it: one sequence at a time */
        for (int q = 0; q < 2; q++) fwd_step_shape_add(&sh, 1, 3, 1, block);
        fwd_prof_costs(m, kv_tok, kvt[k] == TK_KV_INT8, &sh, want);
        for (int s = 0; s < FWD_ST_COUNT; s++) {
            assert_int_equal(c[s].bytes, want[s].bytes);
            assert_true(c[s].ops == want[s].ops && c[s].peak == want[s].peak);
        }
        free(lg);
        h_free(&h);
    }
    tk_model_free(m);
    fx_free(&fx);
}

/* Bad batches are refused before the KV cache is touched. */
static void test_forward_batch_checks(void **state) {
    (void)state;
    fx_model fx;
    fx_build(&fx, TK_ARCH_QWEN3, TK_DTYPE_F32, TK_NAMING_HF);
    tk_model *m;
    assert_int_equal(fx_open(&fx, NULL, &m), TK_OK);
    harness h;
    h_init(&h, m, 1, false, TK_KV_F16);
    float *lg = malloc(300 * sizeof(float));
    int32_t tok = 300, n = 1, pos0 = 0;
    const int32_t *bt[1] = {h.bt[0]};
    int32_t want = 1;
    tk_batch b = {
        .n_seq = 1, .n_tok = 1, .tokens = &tok, .n = &n, .pos0 = &pos0, .bt = bt, .n_logits = &want};
    assert_int_equal(fwd_step(h.f, &b, lg), TK_ERR_RANGE);
    assert_non_null(strstr(tk_last_error(), "token id 300"));
    tok = 5;
    b.n_tok = 2;
    assert_int_equal(fwd_step(h.f, &b, lg), TK_ERR_INVALID);
    b.n_tok = 1;
    pos0 = MAX_POS;
    assert_int_equal(fwd_step(h.f, &b, lg), TK_ERR_INVALID);
    assert_non_null(strstr(tk_last_error(), "max_ctx"));
    pos0 = 0;
    b.n_seq = 9;
    assert_int_equal(fwd_step(h.f, &b, lg), TK_ERR_INVALID);
    b.n_seq = 1;
    assert_int_equal(fwd_step(h.f, &b, lg), TK_OK);
    assert_true(fwd_last_bytes(h.f) > model_decode_bytes(m) - 1000);
    /* a KV pool of another shape is refused at init */
    tk_kv_opts ko = {
        .n_layer = 3, .n_head_kv = 2, .head_dim = 32, .block_size = 16, .n_blocks = 4, .type = TK_KV_F16};
    tk_kv *kv;
    fwd_ctx *f;
    assert_int_equal(kv_init(&ko, &kv), TK_OK);
    fwd_opts fo = {.max_tokens = 8, .max_seqs = 2, .max_ctx = 64};
    assert_int_equal(fwd_init(m, kv, h.pool, &fo, &f), TK_ERR_INVALID);
    kv_free(kv);
    free(lg);
    h_free(&h);
    tk_model_free(m);
    fx_free(&fx);
}

int main(void) {
    if (isa_level_skip()) return 77;
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_forward_matches_reference),
        cmocka_unit_test(test_forward_batch_invariance),
        cmocka_unit_test(test_forward_thread_invariance),
        cmocka_unit_test(test_forward_split_decode_threads),
        cmocka_unit_test(test_forward_row_shares),
        cmocka_unit_test(test_forward_fused_matches_unfused),
        cmocka_unit_test(test_forward_chunked_prefill),
        cmocka_unit_test(test_forward_chunked_prefill_bits),
        cmocka_unit_test(test_forward_llama_unpermute),
        cmocka_unit_test(test_forward_repack),
        cmocka_unit_test(test_forward_q8_coarse),
        cmocka_unit_test(test_forward_bf16_dot),
        cmocka_unit_test(test_forward_last_costs),
        cmocka_unit_test(test_forward_batch_checks),
    };
    return cmocka_run_group_tests_name(isa_level_name(), tests, NULL, NULL);
}
