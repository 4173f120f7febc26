/* The backend layer on the tiny qwen3 model: logits of several positions of a
 * sequence in one step, rollback (truncate) for every KV type, blocks shared
 * between sequences (reference counts, copy-on-write, no leak), and bad calls. */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "backend/backend.h"
#include "backend/runner.h"
#include "core/error.h"
#include "test_model_fixture.h"

#define BS  16
#define CTX 64

static const int32_t TOKS[40] = {5,   17, 299, 42,  8,   100, 3,  77, 150, 201, 9,   64, 33, 250,
                                 12,  91, 7,   230, 45,  66,  81, 2,  199, 18,  260, 54, 31, 11,
                                 144, 73, 97,  6,   288, 120, 14, 39, 222, 58,  4,   170};

typedef struct kv_kind {
    const char *name;
    tk_kv_type type;
    tk_kv_scale scale;
} kv_kind;

static const kv_kind KINDS[] = {
    {"f32", TK_KV_F32, TK_KV_SCALE_HEAD},        {"f16", TK_KV_F16, TK_KV_SCALE_HEAD},
    {"bf16", TK_KV_BF16, TK_KV_SCALE_HEAD},      {"int8-token", TK_KV_INT8, TK_KV_SCALE_TOKEN},
    {"int8-head", TK_KV_INT8, TK_KV_SCALE_HEAD},
};
enum { N_KINDS = sizeof KINDS / sizeof KINDS[0] };

typedef struct fixture {
    fx_model fx;
    tk_model *m;
    int V;
} fixture;

static void fix_init_type(fixture *f, tk_dtype wtype) {
    fx_build(&f->fx, TK_ARCH_QWEN3, wtype, TK_NAMING_HF);
    assert_int_equal(fx_open(&f->fx, NULL, &f->m), TK_OK);
    f->V = f->m->hp.n_vocab;
}

static void fix_init(fixture *f) { fix_init_type(f, TK_DTYPE_F32); }

static void fix_free(fixture *f) {
    tk_model_free(f->m);
    fx_free(&f->fx);
}

static void be_make(const fixture *f, const kv_kind *k, int n_blocks, int nth, backend *be) {
    backend_cpu_opts o = {.n_threads = nth,
                          .block_size = BS,
                          .kv_type = k->type,
                          .kv_scale = k->scale,
                          .n_blocks = n_blocks,
                          .max_tokens = 32,
                          .max_seqs = 4,
                          .max_ctx = CTX};
    if (backend_cpu_create(f->m, &o, be) != TK_OK) fail_msg("%s", tk_last_error());
}

static runner *run_make(const backend *be) {
    runner *r;
    assert_int_equal(runner_init(be, &r), TK_OK);
    return r;
}

static void step(runner *r, const int32_t *t, int n, int n_logits, float *out) {
    if (runner_step(r, t, n, n_logits, out) != TK_OK) fail_msg("%s", tk_last_error());
}

/* Every layer's K and V of positions [0, n) of two sequences: the same bits. */
static void assert_kv_equal(const fixture *f, const runner *a, const runner *b, int n, const char *what) {
    const tk_hparams *hp = &f->m->hp;
    size_t w = (size_t)hp->n_head_kv * hp->head_dim;
    float *ka = malloc(4 * w * sizeof(float)), *va = ka + w, *kb = va + w, *vb = kb + w;
    for (int l = 0; l < hp->n_layer; l++)
        for (int p = 0; p < n; p++) {
            assert_int_equal(runner_kv_read(a, l, p, ka, va), TK_OK);
            assert_int_equal(runner_kv_read(b, l, p, kb, vb), TK_OK);
            if (memcmp(ka, kb, w * sizeof(float)) || memcmp(va, vb, w * sizeof(float)))
                fail_msg("%s: KV of layer %d position %d differs", what, l, p);
        }
    free(ka);
}

/* ---- several positions' logits ----------------------------------------------------------- */

/* Logits of the last k positions of a step are the logits each position gets
 * as the last token of its own step (a verification step scores a draft as
 * decoding it would), bit for bit; and one at a time within the chunked
 * prefill tolerance. */
static void test_backend_multi_position_logits(void **state) {
    (void)state;
    fixture f;
    fix_init(&f);
    const int V = f.V, np = 9, k = 6;
    float *multi = malloc((size_t)k * V * sizeof(float)), *one = malloc((size_t)V * sizeof(float));
    for (int kind = 0; kind < 2; kind++) { /* f32, f16 */
        backend be;
        be_make(&f, &KINDS[kind], 16, 2, &be);
        runner *r = run_make(&be);
        step(r, TOKS, np, k, multi);
        for (int i = 0; i < k; i++) {
            /* position np - k + i as the last of a prefill of np - k + i + 1 tokens */
            runner *q = run_make(&be);
            step(q, TOKS, np - k + i + 1, 1, one);
            assert_memory_equal(multi + (size_t)i * V, one, (size_t)V * sizeof(float));
            runner_free(q);
            /* the same position decoded after a prefill of the ones before it */
            q = run_make(&be);
            step(q, TOKS, np - k + i, 0, NULL);
            step(q, TOKS + np - k + i, 1, 1, one);
            double e = fx_rel_err(multi + (size_t)i * V, one, (size_t)V);
            if (e > 1e-5)
                fail_msg("%s: position %d decoded: relative error %g", KINDS[kind].name, np - k + i, e);
            runner_free(q);
        }
        /* n_logits = n: every position, which includes the prompt's first */
        runner *q = run_make(&be);
        float *all = malloc((size_t)np * V * sizeof(float));
        step(q, TOKS, np, np, all);
        assert_memory_equal(all + (size_t)(np - k) * V, multi, (size_t)k * V * sizeof(float));
        free(all);
        runner_free(q);
        runner_free(r);
        assert_int_equal(be.blocks_free(be.ctx), be.n_blocks);
        backend_free(&be);
    }
    free(multi);
    free(one);
    fix_free(&f);
}

/* Two sequences in one step, the first wanting 3 rows and the second 1: rows
 * sequence after sequence, each as the sequence alone gives it. */
static void test_backend_multi_position_batch(void **state) {
    (void)state;
    fixture f;
    fix_init(&f);
    const int V = f.V;
    backend be;
    be_make(&f, &KINDS[0], 16, 2, &be);
    int32_t bt0[CTX / BS], bt1[CTX / BS];
    for (int j = 0; j < CTX / BS; j++) bt0[j] = be.block_alloc(be.ctx), bt1[j] = be.block_alloc(be.ctx);
    const int32_t *bts[2] = {bt0, bt1};
    int32_t n[2] = {5, 4}, pos0[2] = {0, 0}, nl[2] = {3, 1};
    int32_t toks[9];
    memcpy(toks, TOKS, 5 * sizeof *toks);
    memcpy(toks + 5, TOKS + 20, 4 * sizeof *toks);
    tk_batch b = {.n_seq = 2, .n_tok = 9, .tokens = toks, .n = n, .pos0 = pos0, .bt = bts, .n_logits = nl};
    assert_int_equal(backend_batch_logits(&b), 4);
    float *got = malloc(4 * (size_t)V * sizeof(float)), *want = malloc(3 * (size_t)V * sizeof(float));
    assert_int_equal(be.step(be.ctx, &b, got), TK_OK);
    runner *r = run_make(&be);
    step(r, TOKS, 5, 3, want);
    assert_memory_equal(got, want, 3 * (size_t)V * sizeof(float));
    runner_free(r);
    r = run_make(&be);
    step(r, TOKS + 20, 4, 1, want);
    assert_memory_equal(got + 3 * (size_t)V, want, (size_t)V * sizeof(float));
    runner_free(r);
    /* more logits than tokens, or negative: refused before the cache is touched */
    nl[1] = 5;
    assert_int_equal(be.step(be.ctx, &b, got), TK_ERR_INVALID);
    nl[1] = -1;
    assert_int_equal(be.step(be.ctx, &b, got), TK_ERR_INVALID);
    for (int j = 0; j < CTX / BS; j++) be.block_free(be.ctx, bt0[j]), be.block_free(be.ctx, bt1[j]);
    assert_int_equal(be.blocks_free(be.ctx), be.n_blocks);
    backend_free(&be);
    free(got);
    free(want);
    fix_free(&f);
}

/* ---- truncate ---------------------------------------------------------------------------- */

/* A speculative round: prompt of np (one step), a draft of nd verified in one
 * step with every logit, rolled back to keep, then three decodes. The
 * reference feeds the same steps cut at w = backend_rewrite_from(keep), then
 * [w, keep) as one step, and never sees the dropped tokens: KV and the
 * decodes' logits must match bit for bit. */
static void check_truncate(const fixture *f, const kv_kind *k, int np, int nd, int keep) {
    const int V = f->V;
    backend be;
    be_make(f, k, 16, 2, &be);
    float *la = malloc((size_t)(nd + 1) * V * sizeof(float)), *lb = malloc((size_t)V * sizeof(float));
    runner *a = run_make(&be), *b = run_make(&be);
    step(a, TOKS, np, 1, la);
    step(a, TOKS + np, nd, nd, la);
    assert_int_equal(runner_truncate(a, keep), TK_OK);
    assert_int_equal(runner_len(a), keep);
    assert_int_equal(runner_blocks_held(a), (keep + BS - 1) / BS);
    assert_memory_equal(runner_tokens(a), TOKS, (size_t)keep * sizeof(int32_t));

    int w = backend_rewrite_from(&be, keep), cuts[2] = {np, np + nd}, at = 0;
    bool per_head = k->type == TK_KV_INT8 && k->scale == TK_KV_SCALE_HEAD;
    assert_int_equal(w, per_head ? keep - keep % BS : keep);
    for (int c = 0; c < 2 && at < w; c++) {
        int end = cuts[c] < w ? cuts[c] : w;
        step(b, TOKS + at, end - at, 0, NULL);
        at = end;
    }
    if (at < keep) step(b, TOKS + at, keep - at, 0, NULL);
    char what[96];
    snprintf(what, sizeof what, "%s, prompt %d, draft %d, keep %d", k->name, np, nd, keep);
    assert_kv_equal(f, a, b, keep, what);
    /* new tokens after the rollback (not the dropped draft's) */
    for (int i = 0; i < 3; i++) {
        int32_t t = TOKS[39 - i];
        step(a, &t, 1, 1, la);
        step(b, &t, 1, 1, lb);
        if (memcmp(la, lb, (size_t)V * sizeof(float)))
            fail_msg("%s: decode %d after the rollback differs", what, i);
    }
    assert_kv_equal(f, a, b, keep + 3, what);
    runner_free(a);
    runner_free(b);
    assert_int_equal(be.blocks_free(be.ctx), be.n_blocks);
    backend_free(&be);
    free(la);
    free(lb);
}

static void test_backend_truncate(void **state) {
    (void)state;
    fixture f;
    fix_init(&f);
    for (int k = 0; k < N_KINDS; k++) {
        check_truncate(&f, &KINDS[k], 14, 5, 15); /* the draft crosses a block edge; keep inside block 0 */
        check_truncate(&f, &KINDS[k], 14, 5, 16); /* keep ends exactly on the block edge */
        check_truncate(&f, &KINDS[k], 14, 5, 17); /* keep inside block 1 */
        check_truncate(&f, &KINDS[k], 14, 5, 14); /* the whole draft rejected */
        check_truncate(&f, &KINDS[k], 20, 9, 25); /* all inside block 1 */
        check_truncate(&f, &KINDS[k], 3, 2, 0);   /* back to nothing */
    }
    fix_free(&f);
}

/* Why INT8 per-head needs the rewrite: without it, the scales the dropped
 * tokens grew stay in the block. Writing the draft's tokens again in place
 * (what a plain truncate would do) leaves KV different from the reference. */
static void test_backend_truncate_int8_head_needs_rewrite(void **state) {
    (void)state;
    fixture f;
    fix_init(&f);
    const kv_kind *k = &KINDS[4];
    backend be;
    be_make(&f, k, 16, 1, &be);
    runner *a = run_make(&be), *b = run_make(&be);
    step(a, TOKS, 6, 0, NULL);
    int32_t loud[8];
    for (int i = 0; i < 8; i++) loud[i] = TOKS[30 + i];
    step(a, loud, 8, 0, NULL);
    step(b, TOKS, 6, 0, NULL);
    /* a's block 0 was written by 14 tokens, b's by 6: their scales differ */
    const tk_hparams *hp = &f.m->hp;
    size_t w = (size_t)hp->n_head_kv * hp->head_dim;
    float *ka = malloc(4 * w * sizeof(float)), *va = ka + w, *kb = va + w, *vb = kb + w;
    bool differs = false;
    for (int l = 0; l < hp->n_layer && !differs; l++)
        for (int p = 0; p < 6; p++) {
            assert_int_equal(runner_kv_read(a, l, p, ka, va), TK_OK);
            assert_int_equal(runner_kv_read(b, l, p, kb, vb), TK_OK);
            differs |= memcmp(ka, kb, w * sizeof(float)) || memcmp(va, vb, w * sizeof(float));
        }
    assert_true(differs);
    /* the rollback rewrites the block: equal again */
    assert_int_equal(runner_truncate(a, 6), TK_OK);
    assert_kv_equal(&f, a, b, 6, "int8-head rewrite");
    free(ka);
    runner_free(a);
    runner_free(b);
    backend_free(&be);
    fix_free(&f);
}

/* ---- shared blocks ----------------------------------------------------------------------- */

static void check_fork(const fixture *f, const kv_kind *k, int n_a, int at) {
    const int V = f->V, nb = 12;
    backend be;
    be_make(f, k, nb, 2, &be);
    float *l1 = malloc((size_t)V * sizeof(float)), *l2 = malloc((size_t)V * sizeof(float));
    runner *a = run_make(&be);
    step(a, TOKS, n_a, 0, NULL);
    int held = runner_blocks_held(a);
    assert_int_equal(be.blocks_free(be.ctx), nb - held);
    runner *c;
    assert_int_equal(runner_fork(a, at, &c), TK_OK);
    assert_int_equal(runner_len(c), at);
    /* a fork at a's end shares even a partial block (the first to write it
     * copies it); an earlier one rewrites what a wrote after it, as truncate */
    int w = at == n_a ? at : backend_rewrite_from(&be, at), shared = w / BS + (w % BS != 0);
    /* the shared prefix costs no blocks; a rewritten partial block costs one */
    assert_int_equal(be.blocks_free(be.ctx), nb - held - (runner_blocks_held(c) - shared));
    for (int j = 0; j < shared; j++) assert_int_equal(be.block_refs(be.ctx, j), 2);

    /* the reference: a fresh sequence fed like c (a's steps up to w, then [w, at)) */
    runner *ref = run_make(&be);
    if (w > 0) step(ref, TOKS, w < n_a ? w : n_a, 0, NULL);
    if (at > w) step(ref, TOKS + w, at - w, 0, NULL);
    char what[64];
    snprintf(what, sizeof what, "%s fork at %d of %d", k->name, at, n_a);
    assert_kv_equal(f, c, ref, at, what);
    /* c writes next: it copies the shared partial block; a is untouched */
    for (int i = 0; i < 3; i++) {
        int32_t t = TOKS[39 - i];
        step(c, &t, 1, 1, l1);
        step(ref, &t, 1, 1, l2);
        assert_memory_equal(l1, l2, (size_t)V * sizeof(float));
    }
    /* a goes on as if c never was: against a sequence fed the same alone */
    runner *a2 = run_make(&be);
    step(a2, TOKS, n_a, 0, NULL);
    for (int i = 0; i < 3; i++) {
        int32_t t = TOKS[20 + i];
        step(a, &t, 1, 1, l1);
        step(a2, &t, 1, 1, l2);
        assert_memory_equal(l1, l2, (size_t)V * sizeof(float));
    }
    runner_free(a2);
    runner_free(ref);
    /* a leaves first: the blocks c still holds stay, and c still reads them */
    runner_free(a);
    int c_held = runner_blocks_held(c);
    assert_int_equal(be.blocks_free(be.ctx), nb - c_held);
    for (int j = 0; j < shared; j++) assert_true(be.block_refs(be.ctx, j) <= 1);
    int32_t t = 3;
    step(c, &t, 1, 1, l1);
    runner_free(c);
    assert_int_equal(be.blocks_free(be.ctx), nb); /* no leak */
    backend_free(&be);
    free(l1);
    free(l2);
}

static void test_backend_fork(void **state) {
    (void)state;
    fixture f;
    fix_init(&f);
    for (int k = 0; k < N_KINDS; k++) {
        check_fork(&f, &KINDS[k], 20, 20); /* share everything, the partial block too */
        check_fork(&f, &KINDS[k], 20, 16); /* share the full block only */
        check_fork(&f, &KINDS[k], 20, 10); /* a's later tokens sit in the shared partial block */
        check_fork(&f, &KINDS[k], 32, 32); /* two full blocks */
    }
    fix_free(&f);
}

/* Copy-on-write at the table level, and a pool that runs dry. */
static void test_backend_block_cow(void **state) {
    (void)state;
    fixture f;
    fix_init(&f);
    backend be;
    be_make(&f, &KINDS[4], 2, 1, &be);
    int32_t bt[2] = {be.block_alloc(be.ctx), -1};
    assert_int_equal(backend_block_cow(&be, bt, 0), TK_OK); /* sole holder: nothing to do */
    assert_int_equal(bt[0], 0);
    be.block_ref(be.ctx, bt[0]);
    assert_int_equal(be.block_refs(be.ctx, 0), 2);
    be.block_free(be.ctx, 0); /* one holder less: still allocated */
    assert_int_equal(be.block_refs(be.ctx, 0), 1);
    assert_int_equal(be.blocks_free(be.ctx), 1);
    be.block_ref(be.ctx, 0);
    assert_int_equal(backend_block_cow(&be, bt, 0), TK_OK);
    assert_int_equal(bt[0], 1);
    assert_int_equal(be.block_refs(be.ctx, 0), 1);
    assert_int_equal(be.block_refs(be.ctx, 1), 1);
    assert_int_equal(be.blocks_free(be.ctx), 0);
    /* shared again with no free block: refused, table unchanged */
    be.block_ref(be.ctx, 1);
    assert_int_equal(backend_block_cow(&be, bt, 0), TK_ERR_FULL);
    assert_int_equal(bt[0], 1);
    be.block_free(be.ctx, 1);
    be.block_free(be.ctx, 1);
    be.block_free(be.ctx, 0);
    assert_int_equal(be.blocks_free(be.ctx), 2);
    /* a runner that runs out of blocks says so and keeps its state */
    runner *r = run_make(&be);
    step(r, TOKS, 32, 0, NULL);
    assert_int_equal(runner_step(r, TOKS, 1, 0, NULL), TK_ERR_FULL);
    assert_int_equal(runner_len(r), 32);
    runner *c;
    assert_int_equal(runner_fork(r, 20, &c), TK_ERR_FULL); /* int8-head rewrites [16, 20): no block for it */
    assert_null(c);
    runner_free(r);
    assert_int_equal(be.blocks_free(be.ctx), 2);
    backend_free(&be);
    fix_free(&f);
}

/* runner_feed: a prompt longer than a step goes in steps of max_tokens with
 * the last token's logits out, as the same steps by hand give them; nothing
 * to feed, or no tokens, is refused. */
/* The CPU backend's floor terms for the engine's step log: what a step's
 * stages read adds up to last_bytes, the first term only reads, and every
 * stage with multiply-adds has a term of its own (per-head INT8 KV: the
 * own-block records' kv_store too), judged by the peak its kernels run at. */
static void test_backend_floor_terms(void **state) {
    (void)state;
    fixture f;
    fix_init_type(&f, TK_DTYPE_Q8_0);
    const int kinds[2] = {1, 4}; /* f16; int8 per head */
    const int compute[2] = {6, 7};
    for (int k = 0; k < 2; k++) {
        backend be;
        be_make(&f, &KINDS[kinds[k]], 8, 2, &be);
        assert_non_null(be.last_floor_terms);
        runner *r = run_make(&be);
        float *lg = malloc((size_t)f.V * sizeof(float));
        step(r, TOKS, 20, 1, lg);
        tk_floor_term t[TK_STEP_TERMS];
        be.last_floor_terms(be.ctx, t);
        uint64_t bytes = 0;
        int n_ops = 0, n_int8 = 0;
        for (int i = 0; i < TK_STEP_TERMS; i++) {
            bytes += t[i].bytes;
            n_ops += t[i].ops > 0;
            n_int8 += t[i].ops > 0 && t[i].peak == TK_FLOOR_INT8;
        }
        assert_int_equal(bytes, be.last_bytes(be.ctx));
        assert_true(t[0].bytes > 0 && t[0].ops == 0);
        assert_int_equal(n_ops, compute[k]);
        assert_int_equal(n_int8, k == 1 ? 7 : 5); /* Q8_0 projections; INT8 KV's attention */
        const tk_floor_limits lim = {.read_gbs = 50, .peak_gops = {100, 1000, 0}};
        assert_true(tk_step_floor_s(t, &lim) >= (double)bytes / 50e9);
        free(lg);
        runner_free(r);
        backend_free(&be);
    }
    fix_free(&f);
}

static void test_backend_feed(void **state) {
    (void)state;
    fixture f;
    fix_init(&f);
    backend be;
    be_make(&f, &KINDS[0], 8, 1, &be);
    runner *a = run_make(&be), *b = run_make(&be);
    const size_t lb = (size_t)f.V * sizeof(float);
    float *la = malloc(lb), *lh = malloc(lb);
    assert_int_equal(runner_feed(a, TOKS, 40, la), TK_OK); /* 32 + 8 */
    step(b, TOKS, 32, 0, NULL);
    step(b, TOKS + 32, 8, 1, lh);
    assert_int_equal(runner_len(a), 40);
    assert_memory_equal(runner_tokens(a), TOKS, 40 * sizeof(int32_t));
    assert_memory_equal(la, lh, lb);
    assert_int_equal(runner_feed(a, TOKS, 0, la), TK_ERR_INVALID);
    assert_int_equal(runner_feed(a, NULL, 1, la), TK_ERR_INVALID);
    assert_int_equal(runner_feed(a, TOKS, 1, NULL), TK_OK);
    assert_int_equal(runner_len(a), 41);
    free(la);
    free(lh);
    runner_free(a);
    runner_free(b);
    backend_free(&be);
    fix_free(&f);
}

static void test_backend_bad_calls(void **state) {
    (void)state;
    fixture f;
    fix_init(&f);
    backend be;
    be_make(&f, &KINDS[0], 4, 1, &be);
    runner *r = run_make(&be);
    float *l = malloc((size_t)f.V * sizeof(float));
    assert_int_equal(runner_step(r, TOKS, 0, 0, NULL), TK_ERR_INVALID);
    assert_int_equal(runner_step(r, TOKS, 33, 0, NULL), TK_ERR_INVALID); /* past max_tokens */
    assert_int_equal(runner_step(r, TOKS, 2, 3, l), TK_ERR_INVALID);
    int32_t bad = 300;
    assert_int_equal(runner_step(r, &bad, 1, 1, l), TK_ERR_RANGE);
    assert_int_equal(runner_len(r), 0);
    step(r, TOKS, 30, 0, NULL);
    step(r, TOKS, 30, 0, NULL);
    assert_int_equal(runner_step(r, TOKS, 5, 0, NULL), TK_ERR_RANGE); /* past max_ctx */
    assert_int_equal(runner_truncate(r, 61), TK_ERR_RANGE);
    assert_int_equal(runner_truncate(r, -1), TK_ERR_RANGE);
    runner *c = NULL;
    assert_int_equal(runner_fork(r, 61, &c), TK_ERR_RANGE);
    assert_null(c);
    assert_int_equal(runner_kv_read(r, 0, 60, l, l + 64), TK_ERR_RANGE);
    runner_free(r);
    runner_free(NULL);
    backend_free(&be);
    backend_free(&be); /* zeroed: no-op */
    backend_cpu_opts o = {
        .block_size = BS, .kv_mem = 1, .min_blocks = 1, .max_tokens = 1, .max_seqs = 1, .max_ctx = 1};
    assert_int_equal(backend_cpu_create(f.m, &o, &be), TK_ERR_NOMEM);
    assert_non_null(strstr(tk_last_error(), "kv_mem"));
    assert_null(be.ctx);
    backend_cpu_opts bad_share = {.block_size = BS,
                                  .n_blocks = 1,
                                  .max_tokens = 1,
                                  .max_seqs = 1,
                                  .max_ctx = 1,
                                  .share_pool = &(backend){0}};
    assert_int_equal(backend_cpu_create(f.m, &bad_share, &be), TK_ERR_INVALID);
    free(l);
    fix_free(&f);
}

/* ---- run_each ---------------------------------------------------------------------------- */

#define EACH_MAX 37

typedef struct each_log {
    _Atomic int calls[EACH_MAX];
    _Atomic int bad;
} each_log;

static void each_fn(void *arg, int i) {
    each_log *g = arg;
    if (i < 0 || i >= EACH_MAX)
        atomic_fetch_add(&g->bad, 1);
    else
        atomic_fetch_add(&g->calls[i], 1);
}

/* backend_run_each calls fn once for every index, on the CPU backend's pool
 * (1, 2 and 4 threads, with a step between runs and a backend sharing the
 * pool) and in order without the hook. */
static void test_backend_run_each(void **state) {
    (void)state;
    fixture f;
    fix_init(&f);
    const int ns[] = {0, 1, 2, EACH_MAX}, nths[] = {1, 2, 4};
    float *l = malloc((size_t)f.V * sizeof(float));
    for (int t = 0; t < 3; t++) {
        backend be, shared;
        be_make(&f, &KINDS[0], 8, nths[t], &be);
        assert_int_equal(be.n_threads, nths[t]);
        assert_non_null(be.run_each);
        backend_cpu_opts so = {.block_size = BS,
                               .kv_type = TK_KV_F32,
                               .n_blocks = 4,
                               .max_tokens = 8,
                               .max_seqs = 1,
                               .max_ctx = CTX,
                               .share_pool = &be};
        if (backend_cpu_create(f.m, &so, &shared) != TK_OK) fail_msg("%s", tk_last_error());
        runner *r = run_make(&be);
        for (int rep = 0; rep < 2; rep++)
            for (int k = 0; k < 4; k++) {
                const backend *on = rep ? &shared : &be;
                each_log g = {0};
                backend_run_each(on, each_fn, &g, ns[k]);
                assert_int_equal(atomic_load(&g.bad), 0);
                for (int i = 0; i < EACH_MAX; i++)
                    if (atomic_load(&g.calls[i]) != (i < ns[k] ? 1 : 0))
                        fail_msg("%d threads, n %d: index %d called %d times", nths[t], ns[k], i,
                                 atomic_load(&g.calls[i]));
                step(r, TOKS + k, 1, 1, l); /* the pool runs steps between */
            }
        runner_free(r);
        backend_free(&shared);
        backend_free(&be);
    }
    backend none = {0};
    each_log g = {0};
    backend_run_each(&none, each_fn, &g, EACH_MAX);
    for (int i = 0; i < EACH_MAX; i++) assert_int_equal(atomic_load(&g.calls[i]), 1);
    free(l);
    fix_free(&f);
}

/* ---- the observer (calibration) ----------------------------------------------------------- */

typedef struct obs_log {
    const fixture *f;
    int calls[8][BACKEND_SITE_COUNT];
    int bad_n, last_layer, order_ok;
    float attn_in0[512]; /* layer 0's normed input of the step's first token */
} obs_log;

static void obs_fn(void *ctx, int layer, backend_site site, const float *x, int n_tok, int64_t k) {
    obs_log *o = ctx;
    const tk_hparams *hp = &o->f->m->hp;
    const int64_t want[BACKEND_SITE_COUNT] = {hp->n_embd, (int64_t)hp->n_head * hp->head_dim, hp->n_embd,
                                              hp->n_ff};
    if (layer < 0 || layer >= 8 || n_tok != 5 || k != want[site]) o->bad_n++;
    if (layer < o->last_layer) o->order_ok = 0;
    o->last_layer = layer;
    if (layer >= 0 && layer < 8) o->calls[layer][site]++;
    if (layer == 0 && site == BACKEND_SITE_ATTN_IN && k <= 512) memcpy(o->attn_in0, x, (size_t)k * sizeof *x);
}

/* An observed backend gives the same logits bit for bit, and shows each layer's
 * four matmul inputs once per step, in layer order, with the step's rows:
 * layer 0's q/k/v input is rmsnorm(embedding) x attn_norm. With Q8_0 weights
 * the plain backend quantizes silu(gate)*up without writing the floats back
 * (nothing reads them), the observed one writes them for the observer. */
static void observe_case(tk_dtype wtype) {
    fixture f;
    fix_init_type(&f, wtype);
    const tk_hparams *hp = &f.m->hp;
    assert_true(hp->n_layer <= 8 && hp->n_embd <= 512);
    float *a = malloc((size_t)f.V * sizeof(float)), *b = malloc((size_t)f.V * sizeof(float));
    backend plain, seen;
    be_make(&f, &KINDS[0], 8, 2, &plain);
    obs_log log = {.f = &f, .order_ok = 1};
    backend_cpu_opts o = {.n_threads = 2,
                          .block_size = BS,
                          .kv_type = TK_KV_F32,
                          .n_blocks = 8,
                          .max_tokens = 32,
                          .max_seqs = 4,
                          .max_ctx = CTX,
                          .observe = obs_fn,
                          .observe_ctx = &log};
    if (backend_cpu_create(f.m, &o, &seen) != TK_OK) fail_msg("%s", tk_last_error());
    runner *ra = run_make(&plain), *rb = run_make(&seen);
    step(ra, TOKS, 5, 1, a);
    step(rb, TOKS, 5, 1, b);
    assert_memory_equal(a, b, (size_t)f.V * sizeof(float));
    assert_int_equal(log.bad_n, 0);
    assert_true(log.order_ok);
    for (int l = 0; l < hp->n_layer; l++)
        for (int s = 0; s < BACKEND_SITE_COUNT; s++) assert_int_equal(log.calls[l][s], 1);
    const float *e = (const float *)f.m->tok_embd.data + (size_t)TOKS[0] * hp->n_embd;
    double ss = 0;
    for (int j = 0; j < hp->n_embd; j++) ss += (double)e[j] * e[j];
    double inv = 1.0 / sqrt(ss / hp->n_embd + hp->rms_eps);
    for (int j = 0; j < hp->n_embd; j++) {
        double want = e[j] * inv * f.m->layers[0].attn_norm[j];
        if (fabs(log.attn_in0[j] - want) > 1e-5 * (1 + fabs(want)))
            fail_msg("attn_in[%d] = %g, want %g", j, log.attn_in0[j], want);
    }
    runner_free(ra);
    runner_free(rb);
    backend_free(&plain);
    backend_free(&seen);
    /* the unfused plan refuses an observer */
    o.unfused = true;
    assert_int_equal(backend_cpu_create(f.m, &o, &seen), TK_ERR_INVALID);
    free(a);
    free(b);
    fix_free(&f);
}

static void test_backend_observe(void **state) {
    (void)state;
    observe_case(TK_DTYPE_F32);
    observe_case(TK_DTYPE_Q8_0);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_backend_multi_position_logits),
        cmocka_unit_test(test_backend_multi_position_batch),
        cmocka_unit_test(test_backend_truncate),
        cmocka_unit_test(test_backend_truncate_int8_head_needs_rewrite),
        cmocka_unit_test(test_backend_fork),
        cmocka_unit_test(test_backend_block_cow),
        cmocka_unit_test(test_backend_floor_terms),
        cmocka_unit_test(test_backend_feed),
        cmocka_unit_test(test_backend_bad_calls),
        cmocka_unit_test(test_backend_run_each),
        cmocka_unit_test(test_backend_observe),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
