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

static void test_sched_budget_cost_estimates(void **state) {
    (void)state;
    sched_cost c = {0};
    /* Nothing counts without tokens or a positive, finite time. */
    sched_cost_observe(&c, 0, 0, 1.0);
    sched_cost_observe(&c, 4, 0, 0.0);
    sched_cost_observe(&c, 4, 0, -1.0);
    sched_cost_observe(&c, 4, 0, NAN);
    sched_cost_observe(&c, 4, 0, INFINITY);
    assert_true(c.dec_s == 0 && c.pre_s == 0 && c.last_prefill == 0);
    /* The first decode-only step sets the decode cost; later ones move it,
     * up faster than down. */
    sched_cost_observe(&c, 10, 0, 0.2);
    assert_float_equal(c.dec_s, 0.02, 1e-12);
    sched_cost_observe(&c, 10, 0, 0.3);
    assert_float_equal(c.dec_s, 0.02 + SCHED_COST_ALPHA_UP * 0.01, 1e-12);
    c.dec_s = 0.02;
    sched_cost_observe(&c, 10, 0, 0.1);
    assert_float_equal(c.dec_s, 0.02 - SCHED_COST_ALPHA_DOWN * 0.01, 1e-12);
    assert_true(c.pre_s == 0);
    /* A mixed step: the prefill gets the step minus the predicted decodes. */
    c.dec_s = 0.02;
    sched_cost_observe(&c, 10, 20, 0.2 + 20 * 0.01);
    assert_float_equal(c.pre_s, 0.01, 1e-12);
    assert_int_equal(c.last_prefill, 20);
    sched_cost_observe(&c, 10, 20, 0.2 + 20 * 0.02);
    assert_float_equal(c.pre_s, 0.01 + SCHED_COST_ALPHA_UP * 0.01, 1e-12);
    /* A stale decode estimate that explains the whole step still leaves a
     * quarter of the mean token to the prefill, never zero or less, and the
     * decode estimate moves towards the rest. */
    c = (sched_cost){.dec_s = 0.1};
    sched_cost_observe(&c, 10, 10, 0.5);
    assert_float_equal(c.pre_s, 0.25 * 0.5 / 20, 1e-12);
    assert_float_equal(c.dec_s, 0.1 + SCHED_COST_ALPHA_DOWN * ((0.5 - 10 * c.pre_s) / 10 - 0.1), 1e-12);
    /* Without a decode estimate every token of a mixed step costs the mean. */
    c = (sched_cost){0};
    sched_cost_observe(&c, 4, 12, 0.32);
    assert_float_equal(c.pre_s, 0.02, 1e-12);
    assert_true(c.dec_s == 0);
    /* A prefill-only step. */
    c = (sched_cost){0};
    sched_cost_observe(&c, 0, 64, 0.64);
    assert_float_equal(c.pre_s, 0.01, 1e-12);
    assert_int_equal(c.last_prefill, 64);
}

static void test_sched_budget_tokens(void **state) {
    (void)state;
    const sched_budget_opts a = k_auto;
    sched_budget_opts fixed = a;
    fixed.adaptive = false;
    sched_cost c = {.dec_s = 0.025, .pre_s = 0.012, .last_prefill = 1000};
    /* A fixed budget is the cap, whatever was measured. */
    assert_int_equal(sched_budget_tokens(&fixed, &c, 256, 16), 256);
    assert_int_equal(sched_budget_tokens(&fixed, &(sched_cost){0}, 48, 0), 48);

    /* Target: 2 x the decodes (16 x 25 ms = 0.4 s) = 0.8 s: 0.4 s of prefill at 12 ms = 33 tokens. */
    assert_float_equal(sched_budget_target(&a, &c, 16), 0.8, 1e-12);
    assert_int_equal(sched_budget_tokens(&a, &c, 1024, 16), 16 + 33);
    /* Nothing decodes: the whole allowance, 1 s = 83 tokens. */
    assert_float_equal(sched_budget_target(&a, &c, 0), 1.0, 1e-12);
    assert_int_equal(sched_budget_tokens(&a, &c, 1024, 0), 83);
    /* Decodes alone past the 1 s ceiling (64 x 25 ms): the minimum chunk, never nothing. */
    assert_float_equal(sched_budget_target(&a, &c, 64), 1.0, 1e-12);
    assert_int_equal(sched_budget_tokens(&a, &c, 1024, 64), 64 + 4);
    /* An explicit target wins over the automatic one, with or without decodes. */
    sched_budget_opts t = a;
    t.target_s = 0.25;
    assert_float_equal(sched_budget_target(&t, &c, 0), 0.25, 1e-12);
    assert_float_equal(sched_budget_target(&t, &c, 16), 0.25, 1e-12);
    assert_int_equal(sched_budget_tokens(&t, &c, 1024, 0), 20);
    assert_int_equal(sched_budget_tokens(&t, &c, 1024, 4), 4 + 12);  /* (0.25 - 0.1) / 0.012 */
    assert_int_equal(sched_budget_tokens(&t, &c, 1024, 16), 16 + 4); /* decodes past the target: min chunk */

    /* The cap clamps (decodes always fit: the cap is >= max_batch). */
    sched_cost fast = {.dec_s = 1e-5, .pre_s = 1e-8, .last_prefill = 1 << 20};
    assert_int_equal(sched_budget_tokens(&a, &fast, 512, 30), 512);
    assert_int_equal(sched_budget_tokens(&a, &fast, 32, 32), 32);
    assert_int_equal(sched_budget_tokens(&a, &c, 18, 16), 18); /* room for 2 < min chunk */
    /* Growth: at most twice the last prefill (the estimate came from smaller chunks). */
    c.last_prefill = 5;
    assert_int_equal(sched_budget_tokens(&a, &c, 1024, 0), 10);
    c.last_prefill = 1;
    assert_int_equal(sched_budget_tokens(&a, &c, 1024, 0), 4); /* never below the minimum chunk */
    /* Nothing measured yet: the minimum chunk (measure first). */
    assert_int_equal(sched_budget_tokens(&a, &(sched_cost){0}, 1024, 0), 4);
    assert_int_equal(sched_budget_tokens(&a, &(sched_cost){0}, 1024, 8), 12);
    /* Only decodes measured: the prefill share waits for a measured chunk. */
    assert_int_equal(sched_budget_tokens(&a, &(sched_cost){.dec_s = 0.025}, 1024, 8), 12);
    /* Only prefill measured: a decode token is assumed to cost a prefill token. */
    sched_cost p = {.pre_s = 0.011, .last_prefill = 1000};
    assert_float_equal(sched_budget_target(&a, &p, 10), 0.22, 1e-12);
    assert_int_equal(sched_budget_tokens(&t, &p, 1024, 10), 10 + 12); /* (0.25 - 10 x 0.011) / 0.011 */
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
        if (added && big.state == SCHED_RUNNING && big.n_computed < 900) {
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
    /* The decodes cost 8 x 25 ms: the target is 2 x, i.e. 200 ms of prefill (~16 tokens) a step. */
    sched_counts c;
    sched_counts_get(s, &c);
    assert_float_equal(c.cost.dec_s, 0.025 + 0.005 / 8, 1e-4);
    assert_true(c.cost.pre_s > 0.010 && c.cost.pre_s < 0.015);
    assert_true(mixed >= 900 / 20 && mixed <= 900 / 12);
    sched_free(s);
    assert_int_equal(fp.n_free, 256);
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
        cmocka_unit_test(test_sched_budget_fixed_ignores_time),
        cmocka_unit_test(test_sched_property_random_ops),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
