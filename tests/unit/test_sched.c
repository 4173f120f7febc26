/* The scheduler without a model: budgets, FCFS admission, chunking, block
 * reservation, preemption of the newest, static batching, the time-based
 * budget (pure functions fed made-up step times: no clock), and a 10,000-op
 * random property test (every block back, exactly one finish per request). */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include <cmocka.h>

#include "core/alloc.h"
#include "core/error.h"
#include "engine/sampler.h"
#include "engine/sched.h"

/* ---- a fake pool that catches double allocation and double free ------------ */
#define MAXB 4096
typedef struct fake_pool {
    int n, n_free;
    int free_ids[MAXB];
    uint8_t used[MAXB];
} fake_pool;

static int fp_alloc(void *c) {
    fake_pool *p = c;
    if (p->n_free == 0) return -1;
    int b = p->free_ids[--p->n_free];
    assert_false(p->used[b]);
    p->used[b] = 1;
    return b;
}
static void fp_free(void *c, int b) {
    fake_pool *p = c;
    assert_true(b >= 0 && b < p->n);
    assert_true(p->used[b]);
    p->used[b] = 0;
    p->free_ids[p->n_free++] = b;
}
static int fp_n_free(void *c) { return ((fake_pool *)c)->n_free; }

static void fp_init(fake_pool *p, int n) {
    memset(p, 0, sizeof *p);
    p->n = p->n_free = n;
    for (int i = 0; i < n; i++) p->free_ids[i] = n - 1 - i;
}

/* A time-based budget: automatic target (2 x decode, at most 1 s), chunks of >= 4. */
static const sched_budget_opts k_auto = {.adaptive = true, .ratio = 2.0, .max_s = 1.0, .min_chunk = 4};

static sched *mk_budget(fake_pool *fp, int n_blocks, int bs, int ctx, int max_batch, int step, bool nochunk,
                        bool stat, const sched_budget_opts *budget) {
    fp_init(fp, n_blocks);
    sched_opts o = {.block_size = bs,
                    .ctx = ctx,
                    .n_blocks = n_blocks,
                    .max_batch = max_batch,
                    .step_tokens = step,
                    .no_chunking = nochunk,
                    .static_batching = stat};
    if (budget) o.budget = *budget;
    sched_blocks b = {.ctx = fp, .alloc = fp_alloc, .free = fp_free, .n_free = fp_n_free};
    sched *s = NULL;
    assert_int_equal(sched_init(&o, &b, &s), TK_OK);
    return s;
}

static sched *mk(fake_pool *fp, int n_blocks, int bs, int ctx, int max_batch, int step, bool nochunk,
                 bool stat) {
    fp_init(fp, n_blocks);
    sched_opts o = {.block_size = bs,
                    .ctx = ctx,
                    .n_blocks = n_blocks,
                    .max_batch = max_batch,
                    .step_tokens = step,
                    .no_chunking = nochunk,
                    .static_batching = stat};
    sched_blocks b = {.ctx = fp, .alloc = fp_alloc, .free = fp_free, .n_free = fp_n_free};
    sched *s = NULL;
    assert_int_equal(sched_init(&o, &b, &s), TK_OK);
    return s;
}

/* Every item is covered by its blocks, no block is shared, decodes come first. */
static void check_plan(const sched *s, const sched_plan *p, int bs, int budget_max, fake_pool *fp) {
    static uint8_t owner[MAXB];
    memset(owner, 0, sizeof owner);
    int tok = 0;
    bool seen_prefill = false;
    for (int i = 0; i < p->n_items; i++) {
        const sched_item *it = &p->items[i];
        assert_int_equal(it->pos0, it->seq->n_computed);
        assert_true(it->n > 0);
        assert_true(it->pos0 + it->n <= it->seq->n_tokens);
        assert_true(it->seq->n_blocks * bs >= it->pos0 + it->n);
        assert_int_equal(it->want_logits, it->pos0 + it->n == it->seq->n_tokens);
        assert_int_equal(it->seq->state, SCHED_RUNNING);
        bool dec = i < p->n_decode;
        if (dec) assert_int_equal(it->n, 1);
        if (!dec) seen_prefill = true;
        (void)seen_prefill;
        for (int j = 0; j < it->seq->n_blocks; j++) {
            int b = it->seq->bt[j];
            assert_true(fp->used[b]);
            assert_int_equal(owner[b], 0);
            owner[b] = 1;
        }
        tok += it->n;
    }
    assert_int_equal(tok, p->n_tok);
    assert_true(p->n_tok <= budget_max);
    (void)s;
}

static void test_sched_rejects_bad_options(void **state) {
    (void)state;
    fake_pool fp;
    fp_init(&fp, 10);
    sched_blocks b = {.ctx = &fp, .alloc = fp_alloc, .free = fp_free, .n_free = fp_n_free};
    sched *s = NULL;
    sched_opts o = {.block_size = 100, .ctx = 64, .n_blocks = 10, .max_batch = 4, .step_tokens = 16};
    assert_int_equal(sched_init(&o, &b, &s), TK_ERR_INVALID);
    o.block_size = 16;
    o.step_tokens = 2;
    assert_int_equal(sched_init(&o, &b, &s), TK_ERR_INVALID);
    o.step_tokens = 16;
    o.ctx = 1000; /* needs 63 blocks */
    assert_int_equal(sched_init(&o, &b, &s), TK_ERR_NOMEM);
    assert_null(s);
    sched_free(NULL);
}

static void test_sched_budget_and_chunks(void **state) {
    (void)state;
    fake_pool fp;
    sched *s = mk(&fp, 64, 16, 256, 4, 32, false, false);
    sched_seq a = {.n_tokens = 50}, b = {.n_tokens = 10};
    assert_int_equal(sched_add(s, &a, 1), TK_OK);
    assert_int_equal(sched_add(s, &b, 2), TK_OK);
    const sched_plan *p = sched_plan_step(s);
    /* a: chunk of 32 (the budget); b admitted but no budget left. */
    assert_int_equal(p->n_items, 1);
    assert_int_equal(p->items[0].n, 32);
    assert_false(p->items[0].want_logits);
    assert_int_equal(a.n_blocks, 4); /* the whole prompt's blocks are reserved at admission */
    sched_counts c;
    sched_counts_get(s, &c);
    assert_int_equal(c.waiting, 1);
    assert_int_equal(c.waiting_behind_prefill, 1);
    sched_advance(s, p);
    p = sched_plan_step(s);
    /* a's last 18, then b's 10 (admitted now, 4 tokens of budget left... 32-18 = 14 >= 10). */
    assert_int_equal(p->n_items, 2);
    assert_int_equal(p->items[0].n, 18);
    assert_true(p->items[0].want_logits);
    assert_int_equal(p->items[1].seq, &b);
    assert_int_equal(p->items[1].n, 10);
    sched_advance(s, p);
    a.n_tokens++;
    b.n_tokens++;
    p = sched_plan_step(s);
    assert_int_equal(p->n_decode, 2);
    assert_int_equal(p->items[0].pos0, 50);
    assert_int_equal(p->items[1].pos0, 10);
    sched_remove(s, &a);
    sched_remove(s, &b);
    assert_int_equal(fp.n_free, 64);
    sched_free(s);
}

static void test_sched_preempts_newest(void **state) {
    (void)state;
    fake_pool fp;
    /* 4 blocks of 16; two sequences of 32 tokens fill the pool. */
    sched *s = mk(&fp, 4, 16, 64, 4, 128, false, false);
    sched_seq a = {.n_tokens = 32}, b = {.n_tokens = 32}, c = {.n_tokens = 5};
    sched_add(s, &a, 1);
    sched_add(s, &b, 2);
    sched_add(s, &c, 3);
    const sched_plan *p = sched_plan_step(s);
    assert_int_equal(p->n_items, 2);
    sched_counts n;
    sched_counts_get(s, &n);
    assert_int_equal(n.waiting_no_blocks, 1);
    sched_advance(s, p);
    a.n_tokens++;
    b.n_tokens++; /* both need a fifth block: b (newest) is preempted */
    p = sched_plan_step(s);
    assert_int_equal(p->n_preempted, 1);
    assert_int_equal(b.state, SCHED_WAITING);
    assert_true(b.preempted);
    assert_int_equal(b.n_computed, 0);
    assert_int_equal(p->n_items, 1);
    assert_int_equal(p->items[0].seq, &a);
    sched_counts_get(s, &n);
    assert_int_equal(n.preemptions, 1);
    assert_int_equal(n.waiting_preempted, 1);
    /* b is ahead of c (older) in the FIFO. */
    sched_remove(s, &a);
    p = sched_plan_step(s);
    assert_int_equal(p->items[0].seq, &b);
    assert_int_equal(p->items[0].n, 33); /* recompute prompt + output */
    assert_int_equal(p->items[1].seq, &c);
    sched_free(s); /* frees what is queued */
    assert_int_equal(fp.n_free, 4);
}

static void test_sched_no_chunking_and_static(void **state) {
    (void)state;
    fake_pool fp;
    sched *s = mk(&fp, 64, 16, 256, 4, 16, true, false);
    sched_seq a = {.n_tokens = 100}, b = {.n_tokens = 8};
    sched_add(s, &a, 1);
    sched_add(s, &b, 2);
    const sched_plan *p = sched_plan_step(s);
    assert_int_equal(p->n_items, 1);
    assert_int_equal(p->items[0].n, 100); /* whole, past the budget */
    assert_true(p->n_tok <=
                sched_max_step_tokens(&(sched_opts){.step_tokens = 16, .ctx = 256, .no_chunking = true}));
    sched_free(s);

    s = mk(&fp, 64, 16, 256, 2, 16, false, true);
    sched_seq x = {.n_tokens = 4}, y = {.n_tokens = 4}, z = {.n_tokens = 4};
    sched_add(s, &x, 1);
    sched_add(s, &y, 2);
    sched_add(s, &z, 3);
    p = sched_plan_step(s);
    assert_int_equal(p->n_items, 2);
    sched_advance(s, p);
    x.n_tokens++;
    y.n_tokens++;
    sched_remove(s, &x); /* x finished: z must still wait for y (the slowest) */
    p = sched_plan_step(s);
    assert_int_equal(p->n_items, 1);
    assert_int_equal(z.state, SCHED_WAITING);
    sched_remove(s, &y);
    p = sched_plan_step(s);
    assert_int_equal(p->items[0].seq, &z);
    sched_free(s);
    assert_int_equal(fp.n_free, 64);
}

/* ---- the time-based budget ------------------------------------------------- */

/* A made-up machine: 5 ms per step, 25 ms per decode token, 12 ms per prefill token. */
static double fake_step_s(int n_decode, int n_prefill) {
    return 0.005 + 0.025 * n_decode + 0.012 * n_prefill;
}

static void test_sched_budget_rejects_bad_options(void **state) {
    (void)state;
    fake_pool fp;
    fp_init(&fp, 64);
    sched_blocks b = {.ctx = &fp, .alloc = fp_alloc, .free = fp_free, .n_free = fp_n_free};
    sched *s = NULL;
    sched_opts o = {
        .block_size = 16, .ctx = 64, .n_blocks = 64, .max_batch = 4, .step_tokens = 64, .budget = k_auto};
    o.budget.ratio = 0.5; /* a step with prefill shorter than its decodes alone */
    assert_int_equal(sched_init(&o, &b, &s), TK_ERR_INVALID);
    assert_non_null(strstr(tk_last_error(), "ratio"));
    o.budget = k_auto;
    o.budget.max_s = 0;
    assert_int_equal(sched_init(&o, &b, &s), TK_ERR_INVALID);
    o.budget.target_s = 0.25; /* an explicit target needs neither */
    assert_int_equal(sched_init(&o, &b, &s), TK_OK);
    sched_free(s);
    o.budget = k_auto;
    o.budget.target_s = NAN;
    assert_int_equal(sched_init(&o, &b, &s), TK_ERR_INVALID);
    o.budget = k_auto;
    o.budget.min_chunk = 0;
    assert_int_equal(sched_init(&o, &b, &s), TK_ERR_INVALID);
    o.budget.min_chunk = 65; /* past the cap */
    assert_int_equal(sched_init(&o, &b, &s), TK_ERR_INVALID);
    assert_non_null(strstr(tk_last_error(), "64"));
    o.budget.adaptive = false; /* a fixed budget ignores the rest */
    assert_int_equal(sched_init(&o, &b, &s), TK_OK);
    sched_free(s);
}

/* A fitted model as the budget functions read it (no sums behind it). */
static sched_cost mk_cost(double fixed, double dec, double pre, int last_prefill, bool any_prefill) {
    return (sched_cost){.fixed_s = fixed,
                        .dec_s = dec,
                        .pre_s = pre,
                        .last_prefill = last_prefill,
                        .w = 1,
                        .w_pre = any_prefill ? 1 : 0};
}

static void test_sched_budget_cost_estimates(void **state) {
    (void)state;
    sched_cost c = {0};
    /* Nothing counts without tokens or a positive, finite time. */
    sched_cost_observe(&c, 0, 0, 0, 1.0);
    sched_cost_observe(&c, 4, 0, 0, 0.0);
    sched_cost_observe(&c, 4, 0, 0, -1.0);
    sched_cost_observe(&c, 4, 0, 0, NAN);
    sched_cost_observe(&c, 4, 0, 0, INFINITY);
    assert_true(c.w == 0 && c.fixed_s == 0 && c.dec_s == 0 && c.pre_s == 0 && c.last_prefill == 0);
    assert_true(sched_cost_decode_s(&c, 8) == 0);

    /* Steps of every mix from one machine (no attention cost): the fit finds
     * its costs (the prior moves them by about a percent). */
    for (int i = 0; i < 60; i++) {
        int nd = 1 + i * 7 % 32, np = i % 3 ? (i * 13) % 200 : 0;
        sched_cost_observe(&c, nd, np, 0, 0.010 + 0.002 * nd + 0.003 * np);
    }
    assert_float_equal(c.fixed_s, 0.010, 3e-4);
    assert_float_equal(c.dec_s, 0.002, 3e-5);
    assert_float_equal(c.pre_s, 0.003, 3e-5);
    assert_true(c.attn_s == 0); /* its column is all zero: the prior holds it at 0 */
    assert_float_equal(sched_cost_decode_s(&c, 32), 0.074, 0.074 * 0.02);
    assert_true(c.last_prefill > 0);

    /* With prompts' attention: tokens further in cost more, and the fit
     * tells that from the decodes beside them. */
    c = (sched_cost){0};
    for (int i = 0; i < 80; i++) {
        int nd = 1 + i * 7 % 32, np = i % 3 ? 1 + (i * 13) % 200 : 0, pos = (i * 397) % 3000;
        double kp = sched_prefill_kpos(pos, np);
        sched_cost_observe(&c, nd, np, kp, 0.010 + 0.002 * nd + 0.001 * np + 0.0005 * kp);
    }
    assert_float_equal(c.fixed_s, 0.010, 3e-4);
    assert_float_equal(c.dec_s, 0.002, 3e-5);
    assert_float_equal(c.pre_s, 0.001, 3e-5);
    assert_float_equal(c.attn_s, 0.0005, 2e-5);
    assert_float_equal(sched_prefill_kpos(0, 1), 1.0 / 1024, 1e-15);
    assert_float_equal(sched_prefill_kpos(1000, 3), (1001 + 1002 + 1003) / 1024.0, 1e-12);
    assert_true(sched_prefill_kpos(5, 0) == 0);
    sched_cost before = c;
    sched_cost_observe(&c, 4, 4, -1, 0.1); /* a negative or non-finite count of positions: ignored */
    sched_cost_observe(&c, 4, 4, NAN, 0.1);
    sched_cost_observe(&c, 4, 4, INFINITY, 0.1);
    assert_true(c.w == before.w && c.attn_s == before.attn_s && c.last_prefill == before.last_prefill);
    assert_memory_equal(c.info, before.info, sizeof c.info);
    assert_memory_equal(c.rhs, before.rhs, sizeof c.rhs);

    /* One decode step alone: its time is fixed cost (a step with more decodes
     * is not predicted from it as if every decode cost as much). */
    c = (sched_cost){0};
    sched_cost_observe(&c, 1, 0, 0, 0.0126);
    assert_float_equal(sched_cost_decode_s(&c, 1), 0.0126, 0.0126 * 0.02);
    assert_true(c.fixed_s > 0.95 * 0.0126);
    assert_true(sched_cost_decode_s(&c, 32) < 2 * 0.0126);
    assert_true(c.pre_s == 0 && c.w_pre == 0);

    /* Prefill chunks of one size: their time is per token. */
    c = (sched_cost){0};
    for (int i = 0; i < 5; i++) sched_cost_observe(&c, 0, 64, 0, 0.64);
    assert_float_equal(c.pre_s, 0.01, 0.01 * 0.02);
    assert_true(c.fixed_s < 0.01 * 0.64);
    assert_int_equal(c.last_prefill, 64);

    /* A long run of equal mixed steps (one decode, a minimum chunk) does not
     * tell the decode from the chunk: what decode-only steps said stays. */
    c = (sched_cost){0};
    for (int i = 0; i < 100; i++) sched_cost_observe(&c, 1, 0, 0, 0.0126);
    for (int i = 0; i < 500; i++) sched_cost_observe(&c, 1, 5, 0, 0.0126 + 5 * 0.0025);
    assert_float_equal(sched_cost_decode_s(&c, 1), 0.0126, 0.0126 * 0.02);
    assert_float_equal(c.pre_s, 0.0025, 0.0025 * 0.02);

    /* A machine whose steps get shorter with more decodes (noise): no cost
     * is ever negative. */
    c = (sched_cost){0};
    for (int i = 0; i < 20; i++) sched_cost_observe(&c, 1 + i % 8, 0, 0, 0.05 - 0.004 * (i % 8));
    assert_true(c.fixed_s >= 0 && c.dec_s == 0 && c.pre_s == 0);

    /* A step that ran long moves the estimate further than one that ran short. */
    sched_cost up = {0}, down = {0};
    for (int i = 0; i < 50; i++) {
        sched_cost_observe(&up, 4 + i % 2, 0, 0, 0.1);
        sched_cost_observe(&down, 4 + i % 2, 0, 0, 0.1);
    }
    sched_cost_observe(&up, 5, 0, 0, 0.2);
    sched_cost_observe(&down, 5, 0, 0, 0.05);
    double rise = sched_cost_decode_s(&up, 5) - 0.1, fall = 0.1 - sched_cost_decode_s(&down, 5);
    assert_true(rise > 0 && fall > 0);
    assert_true(rise / 0.1 > 1.5 * (fall / 0.05));
}

static void test_sched_budget_tokens(void **state) {
    (void)state;
    const sched_budget_opts a = k_auto;
    sched_budget_opts fixed = a;
    fixed.adaptive = false;
    sched_cost c = mk_cost(0, 0.025, 0.012, 1000, true);
    /* A fixed budget is the cap, whatever was measured. */
    assert_int_equal(sched_budget_tokens(&fixed, &c, 256, 16, 0), 256);
    assert_int_equal(sched_budget_tokens(&fixed, &(sched_cost){0}, 48, 0, 0), 48);

    /* Target: 2 x the decodes (16 x 25 ms = 0.4 s) = 0.8 s: 0.4 s of prefill at 12 ms = 33 tokens. */
    assert_float_equal(sched_budget_target(&a, &c, 16), 0.8, 1e-12);
    assert_int_equal(sched_budget_tokens(&a, &c, 1024, 16, 0), 16 + 33);
    /* Nothing decodes: the whole allowance, 1 s = 83 tokens. */
    assert_float_equal(sched_budget_target(&a, &c, 0), 1.0, 1e-12);
    assert_int_equal(sched_budget_tokens(&a, &c, 1024, 0, 0), 83);
    /* Decodes alone past the 1 s ceiling (64 x 25 ms): the minimum chunk, never nothing. */
    assert_float_equal(sched_budget_target(&a, &c, 64), 1.0, 1e-12);
    assert_int_equal(sched_budget_tokens(&a, &c, 1024, 64, 0), 64 + 4);
    /* An explicit target wins over the automatic one, with or without decodes. */
    sched_budget_opts t = a;
    t.target_s = 0.25;
    assert_float_equal(sched_budget_target(&t, &c, 0), 0.25, 1e-12);
    assert_float_equal(sched_budget_target(&t, &c, 16), 0.25, 1e-12);
    assert_int_equal(sched_budget_tokens(&t, &c, 1024, 0, 0), 20);
    assert_int_equal(sched_budget_tokens(&t, &c, 1024, 4, 0), 4 + 12); /* (0.25 - 0.1) / 0.012 */
    assert_int_equal(sched_budget_tokens(&t, &c, 1024, 16, 0),
                     16 + 4); /* decodes past the target: min chunk */

    /* The cap clamps (decodes always fit: the cap is >= max_batch). */
    sched_cost fast = mk_cost(0, 1e-5, 1e-8, 1 << 20, true);
    assert_int_equal(sched_budget_tokens(&a, &fast, 512, 30, 0), 512);
    assert_int_equal(sched_budget_tokens(&a, &fast, 32, 32, 0), 32);
    assert_int_equal(sched_budget_tokens(&a, &c, 18, 16, 0), 18); /* room for 2 < min chunk */
    /* Growth: at most twice the last prefill (the estimate came from smaller chunks). */
    c.last_prefill = 5;
    assert_int_equal(sched_budget_tokens(&a, &c, 1024, 0, 0), 10);
    c.last_prefill = 1;
    assert_int_equal(sched_budget_tokens(&a, &c, 1024, 0, 0), 4); /* never below the minimum chunk */
    /* Nothing measured yet: the minimum chunk (measure first). */
    assert_int_equal(sched_budget_tokens(&a, &(sched_cost){0}, 1024, 0, 0), 4);
    assert_int_equal(sched_budget_tokens(&a, &(sched_cost){0}, 1024, 8, 0), 12);
    assert_float_equal(sched_budget_target(&a, &(sched_cost){0}, 8), 0, 1e-12);
    /* Only decodes measured: the prefill share waits for a measured chunk. */
    sched_cost d = mk_cost(0.01, 0.025, 0, 0, false);
    assert_int_equal(sched_budget_tokens(&a, &d, 1024, 8, 0), 12);
    /* The fixed part counts once: 10 ms + 8 x 25 ms = 0.21 s, target 0.42 s. */
    sched_cost f = mk_cost(0.01, 0.025, 0.012, 1000, true);
    assert_float_equal(sched_budget_target(&a, &f, 8), 0.42, 1e-12);
    assert_int_equal(sched_budget_tokens(&a, &f, 1024, 8, 0), 8 + 17); /* 0.21 / 0.012 */
    /* Nothing decoding: the allowance minus the fixed part. */
    assert_int_equal(sched_budget_tokens(&a, &f, 1024, 0, 0), 82); /* 0.99 / 0.012 */
    /* Only prefill measured: a decode step is predicted as the fit's fixed part. */
    sched_cost p = mk_cost(0.05, 0, 0.011, 1000, true);
    assert_float_equal(sched_budget_target(&a, &p, 10), 0.1, 1e-12);
    assert_int_equal(sched_budget_tokens(&t, &p, 1024, 10, 0), 10 + 18); /* (0.25 - 0.05) / 0.011 */
    /* Attention: a chunk from position 2,048 holds fewer tokens than one from
     * 0 (k tokens cost 1 ms each + 1 ms per 1,024 positions they attend to:
     * the positive root of k (k + 1) / 2048 + 3.0005 k = 400 ms from 2,048). */
    sched_cost at = mk_cost(0, 0.025, 0.001, 1000, true);
    at.attn_s = 0.001;
    assert_int_equal(sched_budget_tokens(&a, &at, 1024, 16, 2048), 16 + 130);
    assert_int_equal(sched_budget_tokens(&a, &at, 1024, 16, 0), 16 + 342);
    /* A prefill the fit prices at nothing: as much as the cap and growth allow. */
    sched_cost z = mk_cost(0.05, 0.001, 0, 100, true);
    assert_int_equal(sched_budget_tokens(&a, &z, 1024, 10, 0), 10 + 200);
}

/* The planner over a made-up machine: one long prompt arrives while 8
 * sequences decode. Every step keeps all decodes, gives the prompt at least
 * the minimum chunk, stays within the cap, and once the costs are measured
 * lands within 10% of its target. */
static void test_sched_budget_plans_to_target(void **state) {
    (void)state;
    fake_pool fp;
    sched *s = mk_budget(&fp, 256, 16, 1024, 16, 256, false, false, &k_auto);
    sched_seq d[8], big = {.n_tokens = 900};
    for (int i = 0; i < 8; i++) {
        d[i] = (sched_seq){.n_tokens = 3};
        assert_int_equal(sched_add(s, &d[i], (uint64_t)i + 1), TK_OK);
    }
    const sched_plan *p = sched_plan_step(s);
    assert_int_equal(p->n_tok, 4); /* nothing measured: one minimum chunk */
    int steps = 0, mixed = 0;
    bool added = false;
    while (sched_busy(s) && steps < 2000) {
        if (steps == 20) {
            assert_int_equal(sched_add(s, &big, 100), TK_OK);
            added = true;
        }
        p = sched_plan_step(s);
        check_plan(s, p, 16, 256, &fp);
        int n_pre = p->n_tok - p->n_decode;
        double t = fake_step_s(p->n_decode, n_pre);
        sched_counts c;
        sched_counts_get(s, &c);
        assert_int_equal(c.budget, p->budget);
        assert_true(p->n_tok <= p->budget && p->budget <= 256);
        /* (The prompt's last token alone is planned as a decode.) */
        if (added && big.state == SCHED_RUNNING && big.n_computed < 899) {
            int left = 900 - big.n_computed;
            assert_true(n_pre >= (left < 4 ? left : 4)); /* progress every step */
            assert_int_equal(p->n_decode, 8);            /* every decode, every step */
            if (++mixed > 6) {                           /* the estimates have settled */
                assert_true(t <= p->target_s * 1.1);
                assert_true(t >= p->target_s * 0.8 || n_pre == big.n_tokens - big.n_computed);
            }
        }
        sched_observe(s, p, t);
        sched_advance(s, p);
        for (int i = 0; i < p->n_items; i++)
            if (p->items[i].want_logits) p->items[i].seq->n_tokens++;
        steps++;
        if (big.n_computed >= 900) break;
    }
    assert_true(mixed > 6);
    /* The decodes cost 5 + 8 x 25 ms: the target is 2 x, i.e. 205 ms of prefill (~17 tokens) a step. */
    sched_counts c;
    sched_counts_get(s, &c);
    assert_float_equal(sched_cost_decode_s(&c.cost, 8), 0.205, 0.205 * 0.03);
    assert_true(c.cost.pre_s > 0.010 && c.cost.pre_s < 0.015);
    assert_true(mixed >= 900 / 20 && mixed <= 900 / 12);
    sched_free(s);
    assert_int_equal(fp.n_free, 256);
}

/* A made-up machine like a CPU decoding a small model: a step is mostly the
 * fixed cost of reading the weights (10.8 ms), each decode adds 1.85 ms
 * (its attention and sampling), each prefill token 2.5 ms. */
static double cpu_step_s(int n_decode, int n_prefill) {
    return 0.0108 + 0.00185 * n_decode + 0.0025 * n_prefill;
}

/* One stream decodes alone for a while (a quiet spell), then a burst of 31
 * prompts arrives. The decode cost learnt from one stream must not be
 * multiplied by 32: every step stays near its target, 2x what its decodes
 * alone take, while the burst is admitted, and the queue still drains. */
static void test_sched_budget_burst_after_quiet(void **state) {
    (void)state;
    enum { N = 32, PROMPT = 512 };
    fake_pool fp;
    sched *s = mk_budget(&fp, 4096, 16, 2048, N, 1024, false, false, &k_auto);
    static sched_seq q[N];
    memset(q, 0, sizeof q);
    q[0].n_tokens = 8;
    assert_int_equal(sched_add(s, &q[0], 1), TK_OK);
    int steps = 0, burst_steps = 0;
    double burst_s = 0, worst = 0;
    for (; steps < 5000; steps++) {
        if (steps == 300)
            for (int i = 1; i < N; i++) {
                q[i].n_tokens = PROMPT;
                assert_int_equal(sched_add(s, &q[i], (uint64_t)i + 1), TK_OK);
            }
        const sched_plan *p = sched_plan_step(s);
        int n_pre = p->n_tok - p->n_decode;
        double t = cpu_step_s(p->n_decode, n_pre);
        if (steps >= 300) {
            burst_steps++;
            burst_s += t;
            /* Against what the step's decodes alone take, plus one minimum chunk. */
            double bound = k_auto.ratio * cpu_step_s(p->n_decode, 0) + cpu_step_s(0, k_auto.min_chunk);
            if (p->n_decode > 0 && t / bound > worst) worst = t / bound;
            assert_true(p->n_decode == 0 || t <= 1.25 * bound);
        }
        sched_observe(s, p, t);
        sched_advance(s, p);
        for (int i = 0; i < p->n_items; i++)
            if (p->items[i].want_logits) {
                assert_true(p->items[i].seq->n_tokens < 2048); /* the burst took far too long */
                p->items[i].seq->n_tokens++;
            }
        sched_counts c;
        sched_counts_get(s, &c);
        if (steps > 300 && c.running == N && c.waiting == 0) {
            bool prefilled = true;
            for (int i = 0; i < N; i++) prefilled &= q[i].n_computed >= q[i].n_tokens - 1;
            if (prefilled) break;
        }
    }
    print_message("burst: %d steps, %.1f s, worst step %.2f x its bound\n", burst_steps, burst_s, worst);
    /* The burst's prefill (31 x 512 x 2.5 ms = 39.7 s of prefill work) shares
     * each step about evenly with the decodes: it drains in well under 3x
     * that, not at the minimum chunk. */
    assert_true(burst_steps < 5000 - 300);
    assert_true(burst_s < 3 * 31 * PROMPT * 0.0025);
    sched_counts c;
    sched_counts_get(s, &c);
    assert_float_equal(sched_cost_decode_s(&c.cost, N), cpu_step_s(N, 0), cpu_step_s(N, 0) * 0.15);
    for (int i = 0; i < N; i++) sched_remove(s, &q[i]);
    sched_free(s);
    assert_int_equal(fp.n_free, 4096);
}

/* A made-up machine whose prompt tokens cost more the further in they are
 * (0.8 ms each + 0.8 ms per 1,024 positions attended: ~3x at 2,048), like a
 * CPU's prefill attention. */
static double attn_step_s(int n_decode, int n_prefill, double kpos) {
    return 0.008 + 0.002 * n_decode + 0.0008 * n_prefill + 0.0008 * kpos;
}

/* 16 sequences decode while a 2,048-token prompt arrives: its chunks get
 * dearer as it goes in, and that must not be read as dearer decodes (nor
 * cheaper ones at its start): the decode prediction stays on the decode
 * steps' time and every settled step lands near its target. */
static void test_sched_budget_prompt_attention(void **state) {
    (void)state;
    enum { N = 16, PROMPT = 2048 };
    fake_pool fp;
    sched *s = mk_budget(&fp, 4096, 16, 4096, N + 1, 1024, false, false, &k_auto);
    static sched_seq d[N];
    sched_seq big = {.n_tokens = PROMPT};
    memset(d, 0, sizeof d);
    for (int i = 0; i < N; i++) {
        d[i].n_tokens = 8;
        assert_int_equal(sched_add(s, &d[i], (uint64_t)i + 1), TK_OK);
    }
    int mixed = 0;
    double worst_dec = 0, worst_target = 0;
    for (int step = 0; step < 3000 && big.n_computed < PROMPT - 1; step++) {
        if (step == 100) assert_int_equal(sched_add(s, &big, 100), TK_OK);
        int rem = big.n_tokens - big.n_computed;
        const sched_plan *p = sched_plan_step(s);
        int n_pre = p->n_tok - p->n_decode;
        double t = attn_step_s(p->n_decode, n_pre, p->prefill_kpos);
        if (big.state == SCHED_RUNNING && n_pre > 0) {
            assert_int_equal(p->n_decode, N);
            sched_counts c;
            sched_counts_get(s, &c);
            double err = fabs(sched_cost_decode_s(&c.cost, N) / attn_step_s(N, 0, 0) - 1);
            if (++mixed > 10 && n_pre < rem - 1) { /* settled, and not the prompt's last chunk */
                if (err > worst_dec) worst_dec = err;
                double off = fabs(t / p->target_s - 1);
                if (off > worst_target) worst_target = off;
            }
        }
        sched_observe(s, p, t);
        sched_advance(s, p);
        for (int i = 0; i < p->n_items; i++)
            if (p->items[i].want_logits) p->items[i].seq->n_tokens++;
    }
    print_message(
        "prompt attention: %d mixed steps, decode prediction off by %.1f%%, steps off target by %.1f%%\n",
        mixed, 100 * worst_dec, 100 * worst_target);
    assert_true(big.n_computed >= PROMPT - 1);
    assert_true(mixed > 20);
    assert_true(worst_dec < 0.05);
    assert_true(worst_target < 0.15);
    sched_free(s);
}

/* --step-tokens alone: the same plan whatever the measured times. */
static void test_sched_budget_fixed_ignores_time(void **state) {
    (void)state;
    fake_pool fp;
    sched_budget_opts fixed = k_auto;
    fixed.adaptive = false;
    sched *s = mk_budget(&fp, 64, 16, 512, 4, 40, false, false, &fixed);
    sched_seq a = {.n_tokens = 400};
    sched_add(s, &a, 1);
    for (int i = 0; i < 5; i++) {
        const sched_plan *p = sched_plan_step(s);
        assert_int_equal(p->n_tok, 40);
        assert_int_equal(p->budget, 40);
        assert_true(p->target_s == 0);
        sched_observe(s, p, i % 2 ? 100.0 : 1e-6); /* wildly different times change nothing */
        sched_advance(s, p);
    }
    sched_counts c;
    sched_counts_get(s, &c);
    assert_true(c.cost.pre_s > 0); /* still measured, for the stats */
    sched_free(s);
}

/* ---- the property test ------------------------------------------------------- */
#define SLOTS 48
typedef struct sim_req {
    sched_seq seq;
    bool live;
    int n_prompt, max_out, n_out, finishes;
} sim_req;

static void run_property(uint64_t seed, int bs, int n_blocks, bool nochunk, bool stat, bool must_preempt,
                         bool adaptive) {
    fake_pool fp;
    const int ctx = 128, max_batch = 8, step = 24;
    sched *s = mk_budget(&fp, n_blocks, bs, ctx, max_batch, step, nochunk, stat, adaptive ? &k_auto : NULL);
    static sim_req r[SLOTS];
    memset(r, 0, sizeof r);
    uint64_t draw = 0, order = 0;
    int accepted = 0, finished = 0;
    uint64_t preempts = 0;
    for (int op = 0; op < 10000; op++) {
        double u = sampler_uniform(seed, draw++);
        int k = (int)(sampler_uniform(seed, draw++) * SLOTS);
        if (u < 0.3) { /* submit */
            if (r[k].live) continue;
            memset(&r[k], 0, sizeof r[k]);
            r[k].n_prompt = 1 + (int)(sampler_uniform(seed, draw++) * ctx);
            r[k].max_out = 1 + (int)(sampler_uniform(seed, draw++) * 40);
            r[k].seq.n_tokens = r[k].n_prompt;
            assert_int_equal(sched_add(s, &r[k].seq, ++order), TK_OK);
            r[k].live = true;
            accepted++;
        } else if (u < 0.4) { /* cancel */
            if (!r[k].live) continue;
            sched_remove(s, &r[k].seq);
            r[k].live = false;
            r[k].finishes++;
            finished++;
        } else { /* step */
            const sched_plan *p = sched_plan_step(s);
            preempts += (uint64_t)p->n_preempted;
            check_plan(
                s, p, bs,
                sched_max_step_tokens(&(sched_opts){.step_tokens = step, .ctx = ctx, .no_chunking = nochunk}),
                &fp);
            if (sched_busy(s)) {
                sched_counts c;
                sched_counts_get(s, &c);
                assert_true(p->n_items > 0 || c.running == 0 || stat);
                assert_int_equal(c.blocks_used + fp.n_free, n_blocks);
                assert_true(c.running <= max_batch);
            }
            /* Made-up step times with noise (0.5x..2x): the budget moves, the invariants hold. */
            double noise = 0.5 + 1.5 * sampler_uniform(seed ^ 0x5eed, draw++);
            sched_observe(s, p, noise * fake_step_s(p->n_decode, p->n_tok - p->n_decode));
            sched_advance(s, p);
            for (int i = 0; i < p->n_items; i++) {
                if (!p->items[i].want_logits) continue;
                sim_req *q = (sim_req *)p->items[i].seq;
                q->n_out++;
                q->seq.n_tokens++;
                if (q->n_out >= q->max_out || q->n_prompt + q->n_out - 1 >= ctx) {
                    sched_remove(s, &q->seq);
                    q->live = false;
                    q->finishes++;
                    finished++;
                }
            }
        }
    }
    for (int k = 0; k < SLOTS; k++)
        if (r[k].live) {
            sched_remove(s, &r[k].seq);
            r[k].live = false;
            r[k].finishes++;
            finished++;
        }
    assert_int_equal(accepted, finished);
    for (int k = 0; k < SLOTS; k++) assert_true(r[k].finishes <= 1 || !r[k].live);
    assert_int_equal(fp.n_free, n_blocks);
    for (int b = 0; b < n_blocks; b++) assert_false(fp.used[b]);
    sched_counts c;
    sched_counts_get(s, &c);
    assert_int_equal(c.blocks_used, 0);
    assert_int_equal(c.running + c.waiting, 0);
    print_message("seed %llu: %llu preemptions\n", (unsigned long long)seed, (unsigned long long)preempts);
    if (must_preempt) assert_true(preempts > 0); /* the small pool must have preempted */
    sched_free(s);
}

static void test_sched_property_random_ops(void **state) {
    (void)state;
    run_property(1, 16, 12, false, false, true, false); /* tiny pool: preemption */
    run_property(2, 16, 200, false, false, false, false);
    run_property(3, 32, 6, true, false, true, false);
    run_property(4, 16, 64, false, true, false, false);
    run_property(5, 128, 2, false, false, false, false);
    run_property(6, 16, 12, false, false, true, true); /* the time-based budget */
    run_property(7, 16, 200, false, false, false, true);
    run_property(8, 32, 6, true, false, true, true);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_sched_rejects_bad_options),
        cmocka_unit_test(test_sched_budget_and_chunks),
        cmocka_unit_test(test_sched_preempts_newest),
        cmocka_unit_test(test_sched_no_chunking_and_static),
        cmocka_unit_test(test_sched_budget_rejects_bad_options),
        cmocka_unit_test(test_sched_budget_cost_estimates),
        cmocka_unit_test(test_sched_budget_tokens),
        cmocka_unit_test(test_sched_budget_plans_to_target),
        cmocka_unit_test(test_sched_budget_burst_after_quiet),
        cmocka_unit_test(test_sched_budget_prompt_attention),
        cmocka_unit_test(test_sched_budget_fixed_ignores_time),
        cmocka_unit_test(test_sched_property_random_ops),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
