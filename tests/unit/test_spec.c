/* Speculative decoding: the n-gram drafter, the acceptance estimate, the step
 * cost fit and the controller as pure functions; the scheduler's rollback
 * (blocks, the INT8 per-head rewrite rule, no draft ever cached); the real
 * engine loop over a fake forward whose logits follow a short cycle (so drafts
 * are mostly right) except in contexts chosen by a hash of everything its
 * block table holds (so some are rejected, and any KV mix-up changes the
 * output): greedy and seeded outputs, with stop ids and length limits inside
 * accepted runs, equal the runs without speculation at batch 1 to 32, with
 * preemption and the prefix cache; and over the tiny synthetic model, the KV
 * after rejected drafts equals, bit for bit, that of a run that never drafted,
 * for every KV type. */
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include <cmocka.h>

#include "backend/backend.h"
#include "backend/runner.h"
#include "core/alloc.h"
#include "core/error.h"
#include "engine/engine.h"
#include "engine/sampler.h"
#include "engine/sched.h"
#include "engine/spec.h"
#include "engine_wait.h"
#include "model/model.h"
#include "tiny_model.h"
#include "tokamak.h"

/* ---- pure parts ------------------------------------------------------------------- */

static void test_spec_ngram_draft(void **state) {
    (void)state;
    int32_t out[8];
    /* The latest earlier occurrence of "1 2 3" is at 4: what followed it (9 1 2 3 ...). */
    int32_t a[] = {1, 2, 3, 7, 1, 2, 3, 9, 1, 2, 3};
    assert_int_equal(spec_ngram_draft(a, 11, 3, 3, out), 3);
    assert_int_equal(out[0], 9);
    assert_int_equal(out[1], 1);
    assert_int_equal(out[2], 2);
    /* Running past the known tokens continues from what it drafted: a cycle. */
    int32_t c[] = {5, 6, 5, 6};
    assert_int_equal(spec_ngram_draft(c, 4, 2, 5, out), 5);
    int32_t want[] = {5, 6, 5, 6, 5};
    assert_memory_equal(out, want, sizeof want);
    /* No 3-gram match: falls back to 2; no match at all: nothing. */
    int32_t d[] = {4, 8, 1, 9, 8, 1};
    assert_int_equal(spec_ngram_draft(d, 6, 3, 2, out), 2);
    assert_int_equal(out[0], 9);
    assert_int_equal(out[1], 8);
    int32_t e[] = {1, 2, 3, 4, 5};
    assert_int_equal(spec_ngram_draft(e, 5, 3, 4, out), 0);
    assert_int_equal(spec_ngram_draft(e, 5, 1, 4, out), 0);
    assert_int_equal(spec_ngram_draft(e, 2, 3, 4, out), 0);
    assert_int_equal(spec_ngram_draft(a, 11, 3, 0, out), 0);
    /* The drafts may be written right after the tokens they extend. */
    int32_t f[16] = {3, 4, 5, 3, 4};
    assert_int_equal(spec_ngram_draft(f, 5, 2, 4, f + 5), 4);
    int32_t fw[] = {3, 4, 5, 3, 4, 5, 3, 4, 5};
    assert_memory_equal(f, fw, sizeof fw);
}

static void test_spec_alpha_and_cost_fit(void **state) {
    (void)state;
    double a = SPEC_ALPHA_PRIOR;
    for (int i = 0; i < 100; i++) a = spec_alpha_update(a, 3, false);
    assert_true(a > 0.99);
    for (int i = 0; i < 100; i++) a = spec_alpha_update(a, 0, true);
    assert_true(a < 0.01);
    spec_cost c = {0};
    double c0 = -1, c1 = -1;
    assert_false(spec_cost_fit(&c, &c0, &c1));
    for (int i = 0; i < 20; i++) spec_cost_observe(&c, 4, 0.010 + 0.001 * 4);
    assert_false(spec_cost_fit(&c, &c0, &c1)); /* one size of step: the slope is unknown */
    assert_true(c0 == -1 && c1 == -1);
    for (int i = 0; i < 40; i++) {
        int t = 1 + i % 9;
        spec_cost_observe(&c, t, 0.010 + 0.001 * t);
    }
    assert_true(spec_cost_fit(&c, &c0, &c1));
    assert_true(c0 > 0.0099 && c0 < 0.0101);
    assert_true(c1 > 0.00099 && c1 < 0.00101);
    spec_cost_observe(&c, 0, 1.0); /* ignored */
    spec_cost_observe(&c, 3, -1.0);
    assert_true(spec_cost_fit(&c, &c0, &c1));
    assert_true(c1 > 0.00099 && c1 < 0.00101);
}

/* A fit of c0 + c1 T from steps of sizes 1..9. */
static void cost_of(spec_ctl *ctl, double c0, double c1) {
    memset(&ctl->cost, 0, sizeof ctl->cost);
    for (int i = 0; i < 60; i++) spec_cost_observe(&ctl->cost, 1 + i % 9, c0 + c1 * (1 + i % 9));
}

static void test_spec_controller(void **state) {
    (void)state;
    spec_ctl ctl = {.k_max = 8, .max_total = 64};
    int k[4];
    double hi[4] = {0.9, 0.9, 0.9, 0.9}, lo[4] = {0.04, 0.04, 0.04, 0.04}, mix[4] = {0.95, 0.1, 0.6, 0.0};
    int av[4] = {8, 8, 3, 8};
    /* Flat step cost (bandwidth-bound): likely drafts all go in, hopeless ones never. */
    cost_of(&ctl, 0.010, 0.0001);
    assert_int_equal(spec_choose(&ctl, 4, hi, av, k), 8 + 8 + 3 + 8);
    assert_int_equal(k[2], 3); /* never past what is on offer */
    assert_int_equal(spec_choose(&ctl, 4, lo, av, k), 0);
    spec_choose(&ctl, 4, mix, av, k);
    assert_true(k[0] >= 6 && k[1] <= 1 && k[2] >= 1 && k[2] <= 3 && k[3] == 0);
    /* Each token costs what the step's fixed part does (compute-bound): drafts
     * pay only when near certain, and fewer than when the step is flat. */
    cost_of(&ctl, 0.0001, 0.001);
    assert_int_equal(spec_choose(&ctl, 4, hi, av, k), 0);
    double sure[4] = {0.999, 0.999, 0.999, 0.999};
    assert_true(spec_choose(&ctl, 4, sure, av, k) > 0);
    /* Batch 1, marginal token a tenth of the step: acceptance 0.5 drafts about 2. */
    cost_of(&ctl, 0.010, 0.001);
    double half = 0.5;
    int one = 8, kk;
    spec_choose(&ctl, 1, &half, &one, &kk);
    assert_true(kk >= 1 && kk <= 4);
    /* The step's cap on drafts. */
    ctl.max_total = 5;
    cost_of(&ctl, 0.010, 0.0001);
    assert_int_equal(spec_choose(&ctl, 4, hi, av, k), 5);
    /* Without a fit: a probe step now and then, only for sequences that look likely. */
    spec_ctl p = {.k_max = 4, .max_total = 64};
    int probes = 0, drafted = 0;
    for (int i = 0; i < 4 * SPEC_PROBE_EVERY; i++) {
        int n = spec_choose(&p, 4, mix, av, k);
        probes += n > 0;
        drafted += n;
        if (n) assert_true(k[0] == 4 && k[1] == 0 && k[2] == 3 && k[3] == 0);
    }
    assert_int_equal(probes, 4);
    assert_int_equal(drafted, 4 * 7);
    assert_int_equal(spec_choose(&p, 0, mix, av, k), 0);
}

/* ---- the scheduler's rollback ------------------------------------------------------- */

typedef struct pool {
    int n, n_free;
    int refs[64];
} pool;
static int p_alloc(void *c) {
    pool *p = c;
    for (int i = 0; i < p->n; i++)
        if (!p->refs[i]) {
            p->refs[i] = 1;
            p->n_free--;
            return i;
        }
    return -1;
}
static void p_free(void *c, int b) {
    pool *p = c;
    assert_true(p->refs[b] > 0);
    if (--p->refs[b] == 0) p->n_free++;
}
static int p_n_free(void *c) { return ((pool *)c)->n_free; }
static void p_ref(void *c, int b) { ((pool *)c)->refs[b]++; }
static int p_refs(void *c, int b) { return ((pool *)c)->refs[b]; }
static tk_status p_cow(void *c, int32_t *bt, int j) {
    int b = p_alloc(c);
    if (b < 0) return TK_ERR_FULL;
    p_free(c, bt[j]);
    bt[j] = b;
    return TK_OK;
}

static int copies, copy_dst[8], copy_src[8];
static int copy_n[8];
static void p_copy(void *c, int dst, int src, int n_slots) {
    pool *p = c;
    assert_true(p->refs[dst] > 0 && p->refs[src] > 0);
    if (copies < 8) copy_dst[copies] = dst, copy_src[copies] = src, copy_n[copies] = n_slots;
    copies++;
}

/* With a KV type that rescales (rewrite_block) and a copy: a verification
 * that starts inside a block takes a copy of it (a free block, else an idle
 * cached one), a rejection in that block puts it back and feeds the step's
 * kept positions again; a rejection in a later block, a step that starts a
 * block, or no block to copy into fall back to the block's first slot; the
 * copy goes back to the pool at the settle, or when the sequence leaves. */
static void test_spec_sched_journal(void **state) {
    (void)state;
    pool pl = {.n = 8, .n_free = 8};
    sched_opts o = {.block_size = 16,
                    .ctx = 128,
                    .n_blocks = 8,
                    .max_batch = 4,
                    .step_tokens = 64,
                    .rewrite_block = true};
    sched_blocks sb = {.ctx = &pl, .alloc = p_alloc, .free = p_free, .n_free = p_n_free, .copy = p_copy};
    sched *s;
    assert_int_equal(sched_init(&o, &sb, &s), TK_OK);
    sched_seq q;
    memset(&q, 0, sizeof q);
    q.n_tokens = 20;
    assert_int_equal(sched_add(s, &q, 1), TK_OK);
    sched_advance(s, sched_plan_step(s)); /* the prompt: blocks 0, 1 */
    copies = 0;
    /* A decode at 20 with 5 drafts (20..25, block 1): a copy of block 1. */
    q.n_tokens++;
    q.n_draft = 5;
    const sched_plan *p = sched_plan_step(s);
    assert_int_equal(p->items[0].n_draft, 5);
    assert_int_equal(copies, 1);
    assert_int_equal(copy_src[0], q.bt[1]);
    assert_int_equal(copy_n[0], 4); /* positions 16..19 of block 1 */
    const int j = copy_dst[0];
    assert_int_equal(q.journal, j);
    assert_int_equal(pl.n_free, 8 - 3);
    sched_counts c;
    sched_counts_get(s, &c);
    assert_int_equal(c.blocks_used, 3);
    sched_advance(s, p);
    /* Two drafts kept and one token sampled: n_keep 23, in block 1: put back,
     * positions 20..22 fed again (with the new one, 4 tokens next step). */
    q.n_tokens += 3;
    sched_spec_settle(s, &q, 23);
    assert_int_equal(copies, 2);
    assert_int_equal(copy_dst[1], q.bt[1]);
    assert_int_equal(copy_src[1], j);
    assert_int_equal(copy_n[1], 4);
    assert_int_equal(q.n_computed, 20);
    assert_int_equal(q.journal, -1);
    assert_int_equal(pl.n_free, 8 - 2);
    sched_counts_get(s, &c);
    assert_int_equal(c.spec_restores, 1);
    assert_int_equal(c.spec_refed, 3);
    assert_int_equal(c.blocks_used, 2);
    p = sched_plan_step(s);
    assert_int_equal(p->items[0].pos0, 20);
    assert_int_equal(p->items[0].n, 4);
    assert_int_equal(p->items[0].n_draft, 0);
    sched_advance(s, p); /* 24 computed */
    /* Every draft kept: no copy back, the copy dropped. */
    q.n_tokens = 25;
    q.n_draft = 3;
    p = sched_plan_step(s);
    assert_int_equal(copies, 3);
    sched_advance(s, p);
    q.n_tokens += 4;
    sched_spec_settle(s, &q, 28);
    assert_int_equal(copies, 3);
    assert_int_equal(q.n_computed, 28);
    assert_int_equal(pl.n_free, 8 - 2);
    /* Rejected past the block (28..34 crosses into block 2; n_keep 33): block
     * 2 from its first slot, block 1 untouched by the dropped ones. */
    q.n_tokens = 29;
    q.n_draft = 6;
    p = sched_plan_step(s);
    assert_int_equal(copies, 4);
    sched_advance(s, p);
    q.n_tokens += 5;
    sched_spec_settle(s, &q, 33);
    assert_int_equal(copies, 4);
    assert_int_equal(q.n_computed, 32);
    sched_counts_get(s, &c);
    assert_int_equal(c.spec_restores, 1);
    assert_int_equal(c.spec_refed, 3 + 1);
    sched_advance(s, sched_plan_step(s)); /* 32, 33 fed again: 34 computed */
    /* A step that starts a block takes no copy: 48 is the first slot of block 3. */
    q.n_tokens = 48;
    sched_advance(s, sched_plan_step(s)); /* 34..47 */
    q.n_tokens = 49;
    q.n_draft = 2;
    p = sched_plan_step(s);
    assert_int_equal(p->items[0].pos0, 48);
    assert_int_equal(copies, 4);
    assert_int_equal(q.journal, -1);
    sched_advance(s, p);
    q.n_tokens += 1;
    sched_spec_settle(s, &q, 49);
    assert_int_equal(q.n_computed, 48);
    /* No block to copy into (q holds 4, another sequence the other 4): a
     * rejection goes back to the block's first slot. */
    sched_seq r;
    memset(&r, 0, sizeof r);
    r.n_tokens = 60;
    assert_int_equal(sched_add(s, &r, 2), TK_OK);
    sched_advance(s, sched_plan_step(s)); /* q's 48, 49 again; r's prompt */
    assert_int_equal(q.n_computed, 50);
    assert_int_equal(pl.n_free, 0);
    q.n_tokens = 51;
    q.n_draft = 2;
    p = sched_plan_step(s);
    assert_int_equal(p->items[0].n_draft, 2);
    assert_int_equal(q.journal, -1);
    assert_int_equal(copies, 4);
    sched_advance(s, p);
    q.n_tokens += 1;
    sched_spec_settle(s, &q, 51);
    assert_int_equal(q.n_computed, 48);
    sched_counts_get(s, &c);
    assert_int_equal(c.spec_refed, 3 + 1 + 1 + 3);
    /* A copy held when the sequence leaves goes back with its blocks. */
    sched_remove(s, &r);
    sched_advance(s, sched_plan_step(s)); /* 48..51 */
    q.n_tokens = 53;
    q.n_draft = 2;
    p = sched_plan_step(s);
    assert_int_equal(copies, 5);
    assert_true(q.journal >= 0);
    sched_remove(s, &q);
    assert_int_equal(pl.n_free, 8);
    sched_counts_get(s, &c);
    assert_int_equal(c.blocks_used, 0);
    sched_free(s);
}

static void test_spec_sched_settle(void **state) {
    (void)state;
    for (int rewrite = 0; rewrite < 2; rewrite++) {
        pool pl = {.n = 64, .n_free = 64};
        sched_opts o = {.block_size = 16,
                        .ctx = 128,
                        .n_blocks = 64,
                        .max_batch = 4,
                        .step_tokens = 64,
                        .prefix_cache = true,
                        .prefix_seed = 1,
                        .rewrite_block = rewrite};
        sched_blocks sb = {.ctx = &pl,
                           .alloc = p_alloc,
                           .free = p_free,
                           .n_free = p_n_free,
                           .ref = p_ref,
                           .refs = p_refs,
                           .cow = p_cow};
        sched *s;
        assert_int_equal(sched_init(&o, &sb, &s), TK_OK);
        int32_t toks[160];
        for (int i = 0; i < 160; i++) toks[i] = i % 7;
        sched_seq q;
        memset(&q, 0, sizeof q);
        q.tokens = toks;
        q.n_tokens = 30;
        assert_int_equal(sched_add(s, &q, 1), TK_OK);
        const sched_plan *p = sched_plan_step(s); /* the prompt */
        assert_int_equal(p->n_items, 1);
        sched_advance(s, p);
        q.n_tokens++; /* its first output: a decode at 30 */
        q.n_draft = 5;
        p = sched_plan_step(s);
        assert_int_equal(p->n_items, 1);
        assert_int_equal(p->items[0].n, 6);
        assert_int_equal(p->items[0].n_draft, 5);
        assert_int_equal(p->n_draft, 5);
        assert_true(p->items[0].want_logits);
        assert_int_equal(q.n_draft, 0);  /* consumed */
        assert_int_equal(q.n_blocks, 3); /* positions up to 35 */
        sched_advance(s, p);
        assert_int_equal(q.n_computed, 36);
        /* Block 1 (16..31) holds drafts past 30 (31): not cached yet. */
        sched_counts c;
        sched_counts_get(s, &c);
        assert_int_equal(c.prefix_blocks, 1);
        /* Two drafts accepted (31, 32) and one token sampled after them. */
        q.n_tokens += 3;
        sched_spec_settle(s, &q, 33);
        if (rewrite) {
            assert_int_equal(q.n_computed, 32); /* block 2 is written again from its first slot */
            assert_int_equal(
                q.n_computed,
                backend_rewrite_from(
                    &(backend){.kv_type = TK_KV_INT8, .kv_scale = TK_KV_SCALE_HEAD, .block_size = 16}, 33));
        } else {
            assert_int_equal(q.n_computed, 33);
        }
        assert_int_equal(q.n_blocks, 3);
        sched_counts_get(s, &c);
        assert_int_equal(c.prefix_blocks, 2); /* block 1 now holds known tokens only */
        /* Next plan: a rewrite is a prefill of the block's start, else a decode. */
        q.n_draft = 4;
        p = sched_plan_step(s);
        assert_int_equal(p->items[0].n, rewrite ? 2 : 5);
        assert_int_equal(p->items[0].n_draft, rewrite ? 0 : 4);
        sched_advance(s, p);
        /* Everything rejected, the drafts in a block of their own: it goes back. */
        if (!rewrite) {
            assert_int_equal(q.n_computed, 38);
            q.n_tokens++;
            sched_spec_settle(s, &q, 34);
            assert_int_equal(q.n_computed, 34);
            assert_int_equal(q.n_blocks, 3);
        }
        /* A draft past the context is cut. */
        sched_remove(s, &q);
        assert_int_equal(pl.n_free + c.prefix_blocks, 64);
        sched_free(s);
    }
}

/* ---- the engine over a fake forward ------------------------------------------------- */

#define FV    97
#define FBS   16
#define CTX   256
#define CYCLE 10

#include "fake_pool.h"

/* The fake KV rescales (f_step): each store rewrites the marks of its
 * block's earlier slots, as an INT8 per-head store that grows a channel's
 * scale requantizes them, so a rejected draft's store leaves a mark unless
 * its block is put back or computed again; the backend then says INT8 per
 * head, and the engine rolls back as it does for that type. */
static bool f_rescale;

/* Logits: a peak on the cycle's next token after the last one, except where a
 * hash of the whole history read through the block table (tokens and marks)
 * says otherwise. A row's hash is taken right after its own store, as an
 * INT8 per-head query's own-block record is. */
static tk_status f_step(void *c, const tk_batch *b, float *logits) {
    fake *f = c;
    long us = (long)f->step_us + (long)f->tok_us * b->n_tok;
    if (us > 0) sleep_us(us);
    int t = 0, k = 0;
    for (int s = 0; s < b->n_seq; s++) {
        const int32_t *bt = b->bt[s];
        const int end = b->pos0[s] + b->n[s];
        for (int j = 0; j < b->n[s]; j++, t++) {
            int pos = b->pos0[s] + j, blk = bt[pos / FBS];
            if (blk < 0 || blk >= f->n_blocks || f->refs[blk] <= 0) {
                fake_fail(f, 5);
                return tk_fail(TK_ERR_INVALID, "fake: bad block");
            }
            if (f->refs[blk] > 1) fake_fail(f, 6);
            f->store[(size_t)blk * FBS + pos % FBS] = b->tokens[t];
            if (f_rescale) {
                uint32_t *mk = f->mark + (size_t)blk * FBS;
                if (pos % FBS == 0) f->bmark[blk] = 0;
                f->bmark[blk] = f->bmark[blk] * 31u + (uint32_t)b->tokens[t] + 1u;
                for (int i = 0; i < pos % FBS; i++) mk[i] = mk[i] * 31u + f->bmark[blk];
                mk[pos % FBS] = 0;
            }
            if (pos < end - b->n_logits[s]) continue;
            uint64_t h = 1469598103934665603ULL;
            int32_t last = -1;
            for (int p = 0; p <= pos; p++) {
                size_t at = (size_t)bt[p / FBS] * FBS + p % FBS;
                int32_t v = f->store[at];
                if (v < 0) fake_fail(f, 7);
                h = (h ^ ((uint64_t)(v + 1) + ((uint64_t)f->mark[at] << 8))) * 1099511628211ULL;
                last = v;
            }
            float *l = logits + (size_t)k++ * FV;
            for (int v = 0; v < FV; v++) l[v] = (float)(sampler_uniform(h, (uint64_t)v) * 4.0);
            if (sampler_uniform(h, 999) >= 0.2) l[last % CYCLE + 1] += 6.0f;
        }
    }
    return TK_OK;
}

#define NREQ   32
#define MAXOUT 96

typedef struct rec {
    pthread_mutex_t mu;
    int32_t out[MAXOUT + 8];
    int n_out, n_finish, bad_order;
    tk_finish reason;
} rec;

static void on_tok(void *u, const tk_token_event *ev) {
    rec *r = u;
    pthread_mutex_lock(&r->mu);
    if (r->n_finish) r->bad_order++;
    if (r->n_out < MAXOUT + 8) r->out[r->n_out] = ev->token;
    r->n_out++;
    pthread_mutex_unlock(&r->mu);
}
static void on_fin(void *u, const tk_finish_event *ev) {
    rec *r = u;
    pthread_mutex_lock(&r->mu);
    r->n_finish++;
    r->reason = ev->reason;
    pthread_mutex_unlock(&r->mu);
}

typedef struct work {
    int32_t prompt[NREQ][80];
    int n_prompt[NREQ], max_tokens[NREQ];
    bool stop7[NREQ];
    rec ref[NREQ];
} work;

static void work_make(work *w, uint64_t seed) {
    for (int i = 0; i < NREQ; i++) {
        int n = 4 + (int)(sampler_uniform(seed, (uint64_t)i) * 70);
        for (int j = 0; j < n; j++) {
            double u = sampler_uniform(seed + 1 + (uint64_t)i, (uint64_t)j);
            /* Half the prompts hold a piece of the cycle, so drafts start early. */
            w->prompt[i][j] = (i % 2 && j > n / 2) ? (int32_t)(j % CYCLE + 1) : (int32_t)(u * FV);
        }
        w->n_prompt[i] = n;
        w->max_tokens[i] = 20 + (int)(sampler_uniform(seed, 1000 + (uint64_t)i) * (MAXOUT - 20));
        w->stop7[i] = i % 5 == 0;
    }
}

/* Run the workload (n at a time) and return the engine's final stats; outputs in r. */
static tk_engine_stats run_work(work *w, rec *r, int batch, int n_blocks, bool spec, const tk_sampling *s) {
    fake *f = fake_new(n_blocks);
    f->step_us = 300;
    f->tok_us = 5;
    backend be = fake_backend(f, FV, f_step);
    if (f_rescale) be.kv_type = TK_KV_INT8, be.kv_scale = TK_KV_SCALE_HEAD;
    tk_engine_opts o;
    tk_engine_opts_default(&o);
    o.ctx = CTX;
    o.block_size = FBS;
    o.max_batch = batch;
    o.step_tokens = batch + 64;
    o.spec = spec ? TK_SPEC_NGRAM : TK_SPEC_OFF;
    o.spec_k = 6;
    tk_engine *e = NULL;
    if (engine_create_backend(&be, &o, &e) != TK_OK) fail_msg("%s", tk_last_error());
    static const int32_t seven = 7;
    for (int i = 0; i < NREQ; i++) {
        memset(&r[i], 0, sizeof r[i]);
        pthread_mutex_init(&r[i].mu, NULL);
        tk_request q;
        tk_request_default(&q);
        q.prompt = w->prompt[i];
        q.n_prompt = w->n_prompt[i];
        q.max_tokens = w->max_tokens[i];
        if (s) {
            q.sampling = *s;
            q.sampling.seed = s->seed + (uint64_t)i;
        }
        if (w->stop7[i]) {
            q.stop_tokens = &seven;
            q.n_stop_tokens = 1;
        }
        q.on_token = on_tok;
        q.on_finish = on_fin;
        q.user = &r[i];
        uint64_t id;
        if (tk_engine_submit(e, &q, &id) != TK_OK) fail_msg("%s", tk_last_error());
    }
    wait_finished(e, NREQ);
    tk_engine_stats st;
    tk_engine_stats_get(e, &st);
    tk_engine_free(e);
    assert_int_equal(f->fail, 0);
    assert_int_equal(f->n_free, n_blocks); /* everything back: no block leaked by a rollback */
    if (!f_rescale) assert_int_equal(st.spec_refed_tokens, 0);
    fake_delete(f);
    return st;
}

static uint64_t g_restores, g_refed; /* check_same's spec runs: blocks put back, positions fed again */

static void check_same(work *w, const tk_sampling *s) {
    g_restores = g_refed = 0;
    run_work(w, w->ref, 1, 64, false, s);
    int n_stopped = 0;
    for (int i = 0; i < NREQ; i++) n_stopped += w->ref[i].reason == TK_FINISH_STOP;
    assert_true(n_stopped > 0); /* stop ids are reached, inside accepted runs too */
    static rec r[NREQ];
    int batches[] = {1, 4, 16, 32, 32};
    int pools[] = {64, 64, 128, 256, 24}; /* the last one preempts */
    uint64_t drafted = 0, accepted = 0, pre = 0;
    for (int b = 0; b < 5; b++) {
        tk_engine_stats st = run_work(w, r, batches[b], pools[b], true, s);
        for (int i = 0; i < NREQ; i++) {
            assert_int_equal(r[i].n_finish, 1);
            assert_int_equal(r[i].bad_order, 0);
            assert_int_equal(r[i].reason, w->ref[i].reason);
            assert_int_equal(r[i].n_out, w->ref[i].n_out);
            assert_memory_equal(r[i].out, w->ref[i].out, (size_t)w->ref[i].n_out * sizeof(int32_t));
        }
        print_message("batch %d, %d blocks: %llu drafted, %llu accepted, %llu preemptions\n", batches[b],
                      pools[b], (unsigned long long)st.spec_drafted, (unsigned long long)st.spec_accepted,
                      (unsigned long long)st.preemptions);
        drafted += st.spec_drafted;
        accepted += st.spec_accepted;
        pre += st.preemptions;
        g_restores += st.spec_kv_restores;
        g_refed += st.spec_refed_tokens;
        assert_int_equal(st.kv_blocks_used, 0);
    }
    assert_true(accepted > 0 && accepted < drafted); /* some drafts kept, some rejected */
    assert_true(pre > 0);
}

static void test_spec_engine_greedy_same_tokens(void **state) {
    (void)state;
    static work w;
    work_make(&w, 5);
    check_same(&w, NULL);
}

static void test_spec_engine_seeded_same_tokens(void **state) {
    (void)state;
    static work w;
    work_make(&w, 9);
    tk_sampling s;
    tk_sampling_default(&s);
    s.temperature = 0.9f;
    s.top_p = 0.95f;
    s.seed = 77;
    check_same(&w, &s);
}

/* A KV whose stores rewrite their block's earlier slots (f_rescale, as INT8
 * per-head scales do): every rejected draft has marked the block it was
 * stored in, so the outputs equal decoding without drafts only if each
 * rollback puts the block back (the copy taken before the step) or computes
 * it again from its first slot. Most rejections find their copy: the
 * positions fed again are about one per rejection plus the drafts kept, not
 * half a block. */
static void test_spec_engine_rescaling_kv(void **state) {
    (void)state;
    static work w;
    work_make(&w, 5);
    f_rescale = true;
    check_same(&w, NULL);
    f_rescale = false;
    print_message("%llu blocks put back, %llu positions fed again\n", (unsigned long long)g_restores,
                  (unsigned long long)g_refed);
    assert_true(g_restores > 20);
    assert_true(g_refed < 4 * g_restores);
}

static void test_spec_engine_options(void **state) {
    (void)state;
    fake *f = fake_new(32);
    backend be = {.ctx = f,
                  .n_vocab = FV,
                  .n_blocks = 32,
                  .block_size = FBS,
                  .weight_dtype = "fake",
                  .n_threads = 1,
                  .block_alloc = f_alloc,
                  .block_free = f_free,
                  .blocks_free = f_n_free,
                  .step = f_step};
    tk_engine_opts o;
    tk_engine_opts_default(&o);
    assert_int_equal(o.spec, TK_SPEC_OFF); /* off by default */
    o.ctx = 64;
    o.block_size = FBS;
    o.spec = TK_SPEC_NGRAM;
    o.spec_k = 33;
    tk_engine *e = NULL;
    assert_int_equal(engine_create_backend(&be, &o, &e), TK_ERR_INVALID);
    assert_non_null(strstr(tk_last_error(), "spec_k 33"));
    o.spec_k = 0;
    o.spec_ngram = 17;
    assert_int_equal(engine_create_backend(&be, &o, &e), TK_ERR_INVALID);
    assert_non_null(strstr(tk_last_error(), "spec_ngram 17"));
    o.spec_ngram = 0;
    o.spec = (tk_spec_mode)7;
    assert_int_equal(engine_create_backend(&be, &o, &e), TK_ERR_INVALID);
    o.spec = TK_SPEC_NGRAM;
    assert_int_equal(engine_create_backend(&be, &o, &e), TK_OK);
    tk_engine_stats st;
    tk_engine_stats_get(e, &st);
    assert_int_equal(st.spec, TK_SPEC_NGRAM);
    assert_int_equal(st.spec_k, ENGINE_SPEC_K);
    tk_engine_free(e);
    fake_delete(f);
}

/* ---- the KV after a rejection, on a real model ---------------------------------------------- */

/* Three runs of one sequence over the tiny model: A decodes token by token;
 * B decodes the same tokens verifying k drafts at every step (k + 1
 * positions in one step) of which only the first acc are right, and rolls
 * the rest back as the engine does (positions past n_keep dropped; with INT8
 * per-head scales the block of n_keep - 1 fed again from its first slot); C
 * feeds B's steps without the wrong drafts (the kept tokens as one step) and
 * never saw them. B's KV equals C's bit for bit at every position and layer:
 * a rejected draft leaves no mark, the INT8 per-head scales included. A
 * position's KV does not depend on how the tokens were split into steps
 * (with INT8 per-head scales, through the own-block records: kv.h), so B
 * also equals A. */
static void test_spec_kv_after_rejection(void **state) {
    (void)state;
    tk_model *m = open_tiny();
    if (!m) skip();
    const int V = model_hparams(m)->n_vocab, L = model_hparams(m)->n_layer;
    const int kvd = model_hparams(m)->n_head_kv * model_hparams(m)->head_dim;
    struct {
        tk_kv_type t;
        tk_kv_scale s;
    } kinds[] = {{TK_KV_F32, TK_KV_SCALE_HEAD},
                 {TK_KV_F16, TK_KV_SCALE_HEAD},
                 {TK_KV_BF16, TK_KV_SCALE_HEAD},
                 {TK_KV_INT8, TK_KV_SCALE_HEAD},
                 {TK_KV_INT8, TK_KV_SCALE_TOKEN}};
    enum { NTOK = 90, NP = 7 };
    int32_t toks[NTOK + 16];
    for (int i = 0; i < NTOK + 16; i++) toks[i] = (int32_t)(sampler_uniform(3, (uint64_t)i) * V);
    float *kv[6];
    for (int i = 0; i < 6; i++) kv[i] = tk_calloc((size_t)kvd, sizeof(float));
    for (size_t c = 0; c < sizeof kinds / sizeof kinds[0]; c++) {
        backend be[3];
        runner *r[3];
        for (int i = 0; i < 3; i++) {
            backend_cpu_opts bo = {.n_threads = 2,
                                   .block_size = 16,
                                   .kv_type = kinds[c].t,
                                   .kv_scale = kinds[c].s,
                                   .n_blocks = 16,
                                   .max_tokens = 32,
                                   .max_seqs = 1,
                                   .max_ctx = 128,
                                   .share_pool = i ? &be[0] : NULL};
            assert_int_equal(backend_cpu_create(m, &bo, &be[i]), TK_OK);
            assert_int_equal(runner_init(&be[i], &r[i]), TK_OK);
            assert_int_equal(runner_step(r[i], toks, NP, 0, NULL), TK_OK); /* no logits: no output layer */
        }
        for (int p = NP; p < NTOK; p++) assert_int_equal(runner_step(r[0], toks + p, 1, 0, NULL), TK_OK);
        int p = NP, round = 0, rejected = 0;
        while (p < NTOK) {
            /* toks[p] and k drafts: the first acc are right, the next is wrong. */
            int k = 1 + round % 6, acc = (round * 5) % (k + 1);
            if (acc > NTOK - p - 1) acc = NTOK - p - 1;
            int32_t feed[8];
            feed[0] = toks[p];
            for (int j = 1; j <= k; j++) feed[j] = j <= acc ? toks[p + j] : (toks[p + j] + 1 + j) % V;
            assert_int_equal(runner_step(r[1], feed, k + 1, 0, NULL), TK_OK);
            int n_keep = p + 1 + acc;
            assert_int_equal(runner_truncate(r[1], n_keep), TK_OK);
            assert_int_equal(runner_step(r[2], feed, acc + 1, 0, NULL), TK_OK);
            if (acc < k) {
                rejected++;
                assert_int_equal(runner_truncate(r[2], n_keep),
                                 TK_OK); /* the same rewrite, nothing dropped */
            }
            p = n_keep;
            round++;
        }
        assert_true(rejected > 5);
        int diff_c = 0, diff_a = 0;
        for (int l = 0; l < L; l++)
            for (int q = 0; q < NTOK; q++) {
                for (int i = 0; i < 3; i++)
                    assert_int_equal(runner_kv_read(r[i], l, q, kv[2 * i], kv[2 * i + 1]), TK_OK);
                size_t nb = (size_t)kvd * sizeof(float);
                diff_c += memcmp(kv[2], kv[4], nb) != 0 || memcmp(kv[3], kv[5], nb) != 0;
                diff_a += memcmp(kv[2], kv[0], nb) != 0 || memcmp(kv[3], kv[1], nb) != 0;
            }
        print_message("kv %d scale %d: %d of %d (layer, position) pairs differ from the run without drafts, "
                      "%d from token-by-token decoding\n",
                      (int)kinds[c].t, (int)kinds[c].s, diff_c, L * NTOK, diff_a);
        assert_int_equal(diff_c, 0);
        assert_int_equal(diff_a, 0);
        for (int i = 2; i >= 0; i--) {
            runner_free(r[i]);
            backend_free(&be[i]);
        }
    }
    for (int i = 0; i < 6; i++) tk_free(kv[i]);
    tk_model_free(m);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_spec_ngram_draft),
        cmocka_unit_test(test_spec_alpha_and_cost_fit),
        cmocka_unit_test(test_spec_controller),
        cmocka_unit_test(test_spec_sched_settle),
        cmocka_unit_test(test_spec_sched_journal),
        cmocka_unit_test(test_spec_engine_options),
        cmocka_unit_test(test_spec_engine_greedy_same_tokens),
        cmocka_unit_test(test_spec_engine_seeded_same_tokens),
        cmocka_unit_test(test_spec_engine_rescaling_kv),
        cmocka_unit_test(test_spec_kv_after_rejection),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
