/* The scheduler without a model: budgets, FCFS admission, chunking, block
 * reservation, preemption of the newest, static batching, and a 10,000-op
 * random property test (every block back, exactly one finish per request). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>
#include <cmocka.h>

#include "core/alloc.h"
#include "engine/sched.h"
#include "engine/sampler.h"

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

static sched *mk(fake_pool *fp, int n_blocks, int bs, int ctx, int max_batch, int step, bool nochunk, bool stat) {
    fp_init(fp, n_blocks);
    sched_opts o = {.block_size = bs, .ctx = ctx, .n_blocks = n_blocks, .max_batch = max_batch,
                    .step_tokens = step, .no_chunking = nochunk, .static_batching = stat};
    sched_blocks b = {fp, fp_alloc, fp_free, fp_n_free};
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
    sched_blocks b = {&fp, fp_alloc, fp_free, fp_n_free};
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
    assert_true(p->n_tok <= sched_max_step_tokens(&(sched_opts){.step_tokens = 16, .ctx = 256, .no_chunking = true}));
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

/* ---- the property test ------------------------------------------------------- */
#define SLOTS 48
typedef struct sim_req {
    sched_seq seq;
    bool live;
    int n_prompt, max_out, n_out, finishes;
} sim_req;

static void run_property(uint64_t seed, int bs, int n_blocks, bool nochunk, bool stat, bool must_preempt) {
    fake_pool fp;
    const int ctx = 128, max_batch = 8, step = 24;
    sched *s = mk(&fp, n_blocks, bs, ctx, max_batch, step, nochunk, stat);
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
            check_plan(s, p, bs, sched_max_step_tokens(&(sched_opts){.step_tokens = step, .ctx = ctx, .no_chunking = nochunk}), &fp);
            if (sched_busy(s)) {
                sched_counts c;
                sched_counts_get(s, &c);
                assert_true(p->n_items > 0 || c.running == 0 || stat);
                assert_int_equal(c.blocks_used + fp.n_free, n_blocks);
                assert_true(c.running <= max_batch);
            }
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
    run_property(1, 16, 12, false, false, true); /* tiny pool: preemption */
    run_property(2, 16, 200, false, false, false);
    run_property(3, 32, 6, true, false, true);
    run_property(4, 16, 64, false, true, false);
    run_property(5, 128, 2, false, false, false);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_sched_rejects_bad_options),
        cmocka_unit_test(test_sched_budget_and_chunks),
        cmocka_unit_test(test_sched_preempts_newest),
        cmocka_unit_test(test_sched_no_chunking_and_static),
        cmocka_unit_test(test_sched_property_random_ops),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
