/* The prefix cache: the table itself (chain hashes, the full token comparison
 * under forced collisions, LRU order of idle blocks), the scheduler's use of
 * it (sharing, copy-on-write of a block cached in full, the INT8 per-head
 * rule, eviction before preemption), and the real engine loop over a fake
 * forward whose logits hash everything its block table holds: 1,000 random
 * requests with shared prefixes, follow-up turns, preemption and
 * cancellation give the same tokens with the cache as without, greedy and
 * seeded, also when every hash collides; no block is written while shared,
 * freed while held, or left behind. */
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
#include "core/alloc.h"
#include "core/error.h"
#include "engine/engine.h"
#include "engine/prefix.h"
#include "engine/sampler.h"
#include "engine/sched.h"
#include "engine_wait.h"
#include "tiny_model.h"
#include "tokamak.h"

static uint64_t hash_const(uint64_t parent, const int32_t *tokens, int n) {
    (void)parent;
    (void)tokens;
    (void)n;
    return 42; /* every block collides with every other */
}

static void fill(int32_t *t, int n, uint64_t seed, int vocab) {
    for (int i = 0; i < n; i++) t[i] = (int32_t)(sampler_uniform(seed, (uint64_t)i) * vocab);
}

/* ---- the table ------------------------------------------------------------------- */

static void test_prefix_cache_table_chain_and_lru(void **state) {
    (void)state;
    enum { BS = 4 };
    prefix_cache *pc;
    assert_int_equal(prefix_init(0, BS, 1, &pc), TK_ERR_INVALID);
    assert_non_null(strstr(tk_last_error(), "0 blocks"));
    assert_int_equal(prefix_init(8, BS, prefix_seed(7, TK_KV_F16, TK_KV_SCALE_HEAD, BS), &pc), TK_OK);
    /* The seed names what changes the KV. */
    assert_true(prefix_seed(7, TK_KV_F16, TK_KV_SCALE_HEAD, BS) !=
                prefix_seed(8, TK_KV_F16, TK_KV_SCALE_HEAD, BS));
    assert_true(prefix_seed(7, TK_KV_F16, TK_KV_SCALE_HEAD, BS) !=
                prefix_seed(7, TK_KV_INT8, TK_KV_SCALE_HEAD, BS));
    assert_true(prefix_seed(7, TK_KV_INT8, TK_KV_SCALE_HEAD, BS) !=
                prefix_seed(7, TK_KV_INT8, TK_KV_SCALE_TOKEN, BS));
    int32_t a[3][BS] = {{1, 2, 3, 4}, {5, 6, 7, 8}, {9, 10, 11, 12}};
    prefix_link root = prefix_root(pc), l[3], got;
    assert_int_equal(prefix_find(pc, &root, a[0], &got), -1);
    prefix_insert(pc, &root, 5, a[0], &l[0]);
    prefix_insert(pc, &l[0], 2, a[1], &l[1]);
    prefix_insert(pc, &l[1], 7, a[2], &l[2]);
    assert_int_equal(prefix_n_cached(pc), 3);
    assert_int_equal(prefix_find(pc, &root, a[0], &got), 5);
    assert_int_equal(prefix_find(pc, &got, a[1], &got), 2);
    assert_int_equal(prefix_find(pc, &got, a[2], &got), 7);
    assert_true(got.hash == l[2].hash && got.gen == l[2].gen);
    /* The same tokens after another parent are another block. */
    assert_int_equal(prefix_find(pc, &root, a[1], &got), -1);
    assert_int_equal(prefix_find(pc, &l[1], a[1], &got), -1);
    /* Idle in release order (last block first): the tail is evicted first. */
    assert_int_equal(prefix_n_idle(pc), 0);
    assert_int_equal(prefix_evict(pc), -1);
    prefix_idle(pc, 7);
    prefix_idle(pc, 2);
    prefix_idle(pc, 5);
    assert_int_equal(prefix_n_idle(pc), 3);
    prefix_busy(pc, 2); /* taken again: not evictable */
    assert_false(prefix_is_idle(pc, 2));
    assert_int_equal(prefix_evict(pc), 7);
    assert_int_equal(prefix_evict(pc), 5);
    assert_int_equal(prefix_evict(pc), -1);
    assert_int_equal(prefix_evictions(pc), 2);
    /* Block 5 (the head) is gone: its old link is stale, and a re-cached block 5 is another entry. */
    assert_false(prefix_link_valid(pc, &l[0]));
    assert_true(prefix_link_valid(pc, &l[1]));
    prefix_link again;
    prefix_insert(pc, &root, 5, a[0], &again);
    assert_true(again.gen != l[0].gen);
    assert_false(prefix_link_valid(pc, &l[0]));
    /* Block 2's parent was the old entry of block 5: no chain reaches it now. */
    assert_int_equal(prefix_find(pc, &again, a[1], &got), -1);
    prefix_free(pc);
}

static void test_prefix_cache_table_collisions_caught(void **state) {
    (void)state;
    enum { BS = 16, N = 64 };
    prefix_cache *pc;
    assert_int_equal(prefix_init(N, BS, 3, &pc), TK_OK);
    prefix_set_hash(pc, hash_const);
    /* Chains that differ only in their first block, and blocks that differ in one token. */
    int32_t t[N][BS];
    for (int i = 0; i < N; i++) fill(t[i], BS, 100 + (uint64_t)i, 1000);
    prefix_link root = prefix_root(pc), la, lb, got;
    prefix_insert(pc, &root, 0, t[0], &la);
    prefix_insert(pc, &root, 1, t[1], &lb);
    prefix_link la2, lb2;
    prefix_insert(pc, &la, 2, t[2], &la2); /* t0 -> t2 */
    prefix_insert(pc, &lb, 3, t[3], &lb2); /* t1 -> t3 */
    assert_int_equal(prefix_find(pc, &root, t[1], &got), 1);
    assert_int_equal(prefix_find(pc, &got, t[2], &got), -1); /* t2 follows t0, not t1 */
    assert_int_equal(prefix_find(pc, &lb, t[3], &got), 3);
    assert_int_equal(prefix_find(pc, &la, t[3], &got), -1);
    int32_t near[BS];
    memcpy(near, t[0], sizeof near);
    near[BS - 1] ^= 1; /* one token off */
    assert_int_equal(prefix_find(pc, &root, near, &got), -1);
    assert_true(prefix_collisions(pc) > 0);
    /* Many entries in one bucket: eviction unlinks from the middle of it. */
    prefix_link l = lb2;
    for (int i = 4; i < N; i++) prefix_insert(pc, &l, i, t[i], &l);
    for (int b = N - 1; b >= 0; b--) prefix_idle(pc, b);
    for (int i = 0; i < N; i++) assert_true(prefix_evict(pc) >= 0);
    assert_int_equal(prefix_n_cached(pc), 0);
    prefix_free(pc);
}

/* ---- the scheduler over a reference-counted fake pool ------------------------------ */

#define MAXB 512
typedef struct rc_pool {
    int n, n_free;
    int free_ids[MAXB];
    int refs[MAXB];
    int copies;
} rc_pool;

static int rp_alloc(void *c) {
    rc_pool *p = c;
    if (p->n_free == 0) return -1;
    int b = p->free_ids[--p->n_free];
    assert_int_equal(p->refs[b], 0);
    p->refs[b] = 1;
    return b;
}
static void rp_free(void *c, int b) {
    rc_pool *p = c;
    assert_true(b >= 0 && b < p->n && p->refs[b] > 0);
    if (--p->refs[b] == 0) p->free_ids[p->n_free++] = b;
}
static int rp_n_free(void *c) { return ((rc_pool *)c)->n_free; }
static void rp_ref(void *c, int b) {
    rc_pool *p = c;
    assert_true(b >= 0 && b < p->n && p->refs[b] > 0);
    p->refs[b]++;
}
static int rp_refs(void *c, int b) { return ((rc_pool *)c)->refs[b]; }
static tk_status rp_cow(void *c, int32_t *bt, int j) {
    rc_pool *p = c;
    if (p->refs[bt[j]] <= 1) return TK_OK;
    int b = rp_alloc(p);
    if (b < 0) return tk_fail(TK_ERR_FULL, "no block");
    rp_free(p, bt[j]);
    bt[j] = b;
    p->copies++;
    return TK_OK;
}

static sched *mk_sched(rc_pool *p, int n_blocks, int bs, int ctx, bool rewrite_block) {
    memset(p, 0, sizeof *p);
    p->n = p->n_free = n_blocks;
    for (int i = 0; i < n_blocks; i++) p->free_ids[i] = n_blocks - 1 - i;
    sched_opts o = {.block_size = bs,
                    .ctx = ctx,
                    .n_blocks = n_blocks,
                    .max_batch = 4,
                    .step_tokens = 512,
                    .prefix_cache = true,
                    .prefix_seed = 9,
                    .rewrite_block = rewrite_block};
    sched_blocks b = {.ctx = p,
                      .alloc = rp_alloc,
                      .free = rp_free,
                      .n_free = rp_n_free,
                      .ref = rp_ref,
                      .refs = rp_refs,
                      .cow = rp_cow};
    sched *s = NULL;
    assert_int_equal(sched_init(&o, &b, &s), TK_OK);
    return s;
}

/* Run seq until its known tokens are computed; returns the first plan's item for it. */
static sched_item run_seq(sched *s, sched_seq *q) {
    sched_item first = {0};
    for (int k = 0; k < 100 && q->n_computed < q->n_tokens; k++) {
        const sched_plan *p = sched_plan_step(s);
        for (int i = 0; i < p->n_items; i++)
            if (p->items[i].seq == q && first.seq == NULL) first = p->items[i];
        sched_advance(s, p);
    }
    assert_int_equal(q->n_computed, q->n_tokens);
    return first;
}

static void test_prefix_cache_sched_share_and_copy(void **state) {
    (void)state;
    enum { BS = 16 };
    for (int rewrite = 0; rewrite < 2; rewrite++) {
        rc_pool p;
        sched *s = mk_sched(&p, 32, BS, 128, rewrite);
        int32_t t[100];
        fill(t, 100, 1, 500);
        sched_seq a = {.tokens = t, .n_tokens = 40}, b = {.tokens = t, .n_tokens = 32},
                  c = {.tokens = t, .n_tokens = 70};
        assert_int_equal(sched_add(s, &a, 1), TK_OK);
        sched_item ia = run_seq(s, &a);
        assert_int_equal(ia.pos0, 0);
        sched_counts k;
        sched_counts_get(s, &k);
        assert_int_equal(k.prefix_blocks, 2); /* blocks 0 and 1 filled; block 2 holds 8 of 16 */
        assert_int_equal(k.prefix_idle, 0);   /* a still holds them */
        int a0 = a.bt[0], a1 = a.bt[1];
        sched_remove(s, &a);
        sched_counts_get(s, &k);
        assert_int_equal(k.prefix_idle, 2);
        assert_int_equal(k.blocks_used, 0);
        assert_int_equal(p.n_free, 30); /* the two cached blocks stay out of the pool */
        /* b is cached in full (32 = 2 blocks): its last token is computed again. */
        assert_int_equal(sched_add(s, &b, 2), TK_OK);
        sched_item ib = run_seq(s, &b);
        assert_int_equal(b.bt[0], a0); /* shared */
        if (rewrite) {
            /* INT8 per head: the last block is written afresh from its first slot. */
            assert_int_equal(ib.pos0, 16);
            assert_int_equal(ib.n, 16);
            assert_true(b.bt[1] != a1);
            assert_int_equal(p.copies, 0);
            assert_int_equal(b.n_hit, 16);
        } else {
            assert_int_equal(ib.pos0, 31);
            assert_int_equal(ib.n, 1);
            assert_true(b.bt[1] != a1); /* a copy: the cached block is never written */
            assert_int_equal(p.copies, 1);
            assert_int_equal(b.n_hit, 31);
            assert_int_equal(p.refs[a1], 1); /* the cache's hold only: idle again */
        }
        assert_true(ib.want_logits);
        assert_int_equal(p.refs[a0], 2); /* the cache and b */
        /* c shares both of a's blocks (b's own block 1 equals the cached one and stays b's). */
        assert_int_equal(sched_add(s, &c, 3), TK_OK);
        sched_item ic = run_seq(s, &c);
        assert_int_equal(ic.pos0, 32);
        assert_int_equal(c.bt[0], a0);
        assert_int_equal(c.bt[1], a1);
        assert_int_equal(p.refs[a0], 3);
        sched_counts_get(s, &k);
        assert_int_equal(k.prefix_query_tokens, 40 + 32 + 70);
        assert_int_equal(k.prefix_hit_tokens, (uint64_t)(rewrite ? 16 : 31) + 32);
        assert_int_equal(k.prefix_blocks, 4); /* a's two, and c's blocks 2 and 3 */
        sched_remove(s, &b);
        sched_remove(s, &c);
        sched_counts_get(s, &k);
        assert_int_equal(k.blocks_used, 0);
        assert_int_equal(p.n_free + k.prefix_idle, 32);
        sched_free(s);
        assert_int_equal(p.n_free, 32); /* the cache's holds returned too */
    }
}

/* Idle cached blocks make room before anyone is preempted, least recently used first. */
static void test_prefix_cache_sched_evicts_before_preempting(void **state) {
    (void)state;
    enum { BS = 16, NB = 12 };
    rc_pool p;
    sched *s = mk_sched(&p, NB, BS, 128, false);
    int32_t t1[128], t2[128], t3[128];
    fill(t1, 128, 11, 500);
    fill(t2, 128, 12, 500);
    fill(t3, 128, 13, 500);
    sched_seq a = {.tokens = t1, .n_tokens = 64}, b = {.tokens = t2, .n_tokens = 64};
    assert_int_equal(sched_add(s, &a, 1), TK_OK);
    run_seq(s, &a);
    sched_remove(s, &a); /* 4 idle blocks */
    assert_int_equal(sched_add(s, &b, 2), TK_OK);
    run_seq(s, &b);
    sched_remove(s, &b); /* 8 idle, a's older */
    sched_counts k;
    sched_counts_get(s, &k);
    assert_int_equal(k.prefix_idle, 8);
    assert_int_equal(p.n_free, 4);
    /* 128 tokens: 8 blocks, 4 free, so 4 evicted: all of a's, none of b's. */
    sched_seq c = {.tokens = t3, .n_tokens = 128};
    assert_int_equal(sched_add(s, &c, 3), TK_OK);
    run_seq(s, &c);
    sched_counts_get(s, &k);
    assert_int_equal(k.preemptions, 0);
    assert_int_equal(k.prefix_evictions, 4);
    /* the evicted blocks come to c in their order (a's chain, evicted tail
     * first), as the free ones do: c's ids run on but for one break */
    int runs_on = 0;
    for (int j = 0; j + 1 < 8; j++) runs_on += c.bt[j + 1] == c.bt[j] + 1;
    assert_int_equal(runs_on, 6);
    sched_seq b2 = {.tokens = t2, .n_tokens = 64}, a2 = {.tokens = t1, .n_tokens = 64};
    sched_remove(s, &c);
    assert_int_equal(sched_add(s, &b2, 4), TK_OK);
    assert_int_equal(sched_add(s, &a2, 5), TK_OK);
    sched_plan_step(s);
    assert_int_equal(b2.n_hit, 63); /* b's blocks survived */
    assert_int_equal(a2.n_hit, 0);  /* a's were evicted */
    sched_free(s);
    assert_int_equal(p.n_free, NB);
}

/* With every hash equal, only the token comparison tells blocks apart. */
static void test_prefix_cache_sched_forced_collision(void **state) {
    (void)state;
    enum { BS = 16 };
    rc_pool p;
    sched *s = mk_sched(&p, 40, BS, 128, false);
    sched_set_prefix_hash(s, hash_const);
    int32_t x[64], y[64];
    fill(x, 64, 21, 500);
    memcpy(y, x, sizeof y);
    y[3] ^= 1; /* same second block, other first block */
    sched_seq a = {.tokens = x, .n_tokens = 64}, b = {.tokens = y, .n_tokens = 64};
    assert_int_equal(sched_add(s, &a, 1), TK_OK);
    run_seq(s, &a);
    sched_remove(s, &a);
    assert_int_equal(sched_add(s, &b, 2), TK_OK);
    sched_item ib = run_seq(s, &b);
    assert_int_equal(ib.pos0, 0); /* nothing of a's is b's */
    assert_int_equal(b.n_hit, 0);
    sched_counts k;
    sched_counts_get(s, &k);
    assert_true(k.prefix_collisions > 0);
    sched_remove(s, &b);
    sched_seq c = {.tokens = x, .n_tokens = 50};
    assert_int_equal(sched_add(s, &c, 3), TK_OK);
    sched_item ic = run_seq(s, &c);
    assert_int_equal(ic.pos0, 48); /* a's three full blocks */
    sched_free(s);
    assert_int_equal(p.n_free, 40);
}

/* ---- the engine over a fake forward that shares blocks ------------------------------ */

#define FV  97
#define FBS 16
#define CTX 256

#include "fake_pool.h"

static tk_status f_step(void *c, const tk_batch *b, float *logits) {
    fake *f = c;
    int t = 0, k = 0;
    for (int s = 0; s < b->n_seq; s++) {
        const int32_t *bt = b->bt[s];
        for (int j = 0; j < b->n[s]; j++, t++) {
            int pos = b->pos0[s] + j, blk = bt[pos / FBS];
            if (blk < 0 || blk >= f->n_blocks || f->refs[blk] <= 0) {
                fake_fail(f, 5);
                return tk_fail(TK_ERR_INVALID, "fake: bad block");
            }
            if (f->refs[blk] > 1) fake_fail(f, 6); /* a shared block is read-only */
            f->store[(size_t)blk * FBS + pos % FBS] = b->tokens[t];
        }
        if (!b->n_logits[s]) continue;
        uint64_t h = 1469598103934665603ULL;
        for (int p = 0; p < b->pos0[s] + b->n[s]; p++) {
            int blk = bt[p / FBS];
            int32_t v = f->refs[blk] > 0 ? f->store[(size_t)blk * FBS + p % FBS] : -1;
            if (v < 0) fake_fail(f, 7);
            h = (h ^ (uint64_t)(v + 1)) * 1099511628211ULL;
        }
        float *l = logits + (size_t)k++ * FV;
        for (int v = 0; v < FV; v++) l[v] = (float)(sampler_uniform(h, (uint64_t)v) * 8.0);
    }
    return TK_OK;
}

static tk_engine *mk_engine(fake *f, bool cache, prefix_hash_fn hash) {
    backend be = fake_backend(f, FV, f_step);
    tk_engine_opts o;
    tk_engine_opts_default(&o);
    o.ctx = CTX;
    o.block_size = FBS;
    o.max_batch = 8;
    o.step_tokens = 48; /* chunked prefills */
    o.no_prefix_cache = !cache;
    tk_engine *e = NULL;
    tk_status st = engine_create_backend(&be, &o, &e);
    if (st != TK_OK) print_error("%s\n", tk_last_error());
    assert_int_equal(st, TK_OK);
    if (hash) engine_set_prefix_hash(e, hash);
    return e;
}

#define NREQ   1000
#define NWAVE  4
#define MAXOUT 24

typedef struct rec {
    pthread_mutex_t mu;
    int32_t out[MAXOUT];
    int n_out, n_finish, bad_order, n_cached;
    tk_finish reason;
} rec;

static void on_tok(void *u, const tk_token_event *ev) {
    rec *r = u;
    pthread_mutex_lock(&r->mu);
    if (r->n_finish) r->bad_order++;
    if (r->n_out < MAXOUT) r->out[r->n_out] = ev->token;
    r->n_out++;
    pthread_mutex_unlock(&r->mu);
}

static void on_fin(void *u, const tk_finish_event *ev) {
    rec *r = u;
    pthread_mutex_lock(&r->mu);
    r->n_finish++;
    r->reason = ev->reason;
    r->n_cached = ev->times.n_cached;
    pthread_mutex_unlock(&r->mu);
}

typedef struct workload {
    int32_t prompt[NREQ][CTX];
    int n_prompt[NREQ], max_out[NREQ];
    int32_t ref[NREQ][MAXOUT]; /* the tokens without the cache */
    int n_ref[NREQ];
    bool cancel[NREQ];
} workload;

/* Prompts of wave w: a shared root (a system prompt, some of whole blocks) and a
 * suffix (none: a repeat, cached in full), or a follow-up turn: an earlier
 * request's prompt, its reply (from the run without the cache) and new tokens. */
static void make_wave(workload *w, int wave, uint64_t seed) {
    static const int root_len[8] = {16, 32, 40, 64, 100, 128, 7, 150};
    int per = NREQ / NWAVE;
    for (int i = wave * per; i < (wave + 1) * per; i++) {
        double u = sampler_uniform(seed, (uint64_t)i * 8);
        int max_out = 1 + (int)(sampler_uniform(seed, (uint64_t)i * 8 + 1) * MAXOUT);
        int n = 0;
        if (wave > 0 && u < 0.3) {
            int j = (int)(sampler_uniform(seed, (uint64_t)i * 8 + 2) * wave * per); /* an earlier one */
            n = w->n_prompt[j];
            memcpy(w->prompt[i], w->prompt[j], (size_t)n * sizeof(int32_t));
            for (int k = 0; k < w->n_ref[j] && n < CTX; k++) w->prompt[i][n++] = w->ref[j][k];
            int add = (int)(sampler_uniform(seed, (uint64_t)i * 8 + 3) * 20);
            for (int k = 0; k < add && n < CTX; k++)
                w->prompt[i][n++] = (int32_t)(sampler_uniform(seed + 1, (uint64_t)i * 64 + k) * FV);
        } else {
            int r = (int)(sampler_uniform(seed, (uint64_t)i * 8 + 4) * 8);
            n = root_len[r];
            if (u > 0.85) n = 1 + (int)(sampler_uniform(seed, (uint64_t)i * 8 + 5) * n); /* a cut root */
            fill(w->prompt[i], n, 1000 + (uint64_t)r, FV);
            int add = sampler_uniform(seed, (uint64_t)i * 8 + 6) < 0.2
                          ? 0
                          : (int)(sampler_uniform(seed, (uint64_t)i * 8 + 7) * 60);
            for (int k = 0; k < add; k++)
                w->prompt[i][n++] = (int32_t)(sampler_uniform(seed + 2, (uint64_t)i * 64 + k) * FV);
        }
        if (n > CTX - MAXOUT) n = CTX - MAXOUT;
        w->n_prompt[i] = n;
        w->max_out[i] = max_out;
        w->cancel[i] = sampler_uniform(seed + 3, (uint64_t)i) < 0.1;
    }
}

typedef struct run_result {
    tk_engine_stats st;
    int n_cancelled;   /* requests that finished cancelled */
    uint64_t n_cached; /* the requests' n_cached, summed */
} run_result;

/* One run of the whole workload, wave by wave (a wave starts when the last
 * ended, so its follow-ups find the earlier turns cached). Without the cache
 * and without cancels, it records the reference tokens and makes the next
 * wave's prompts from them. */
static run_result run_workload(workload *w, const tk_sampling *base, int n_blocks, bool cache,
                               prefix_hash_fn hash, bool record, uint64_t seed) {
    fake *f = fake_new(n_blocks);
    tk_engine *e = mk_engine(f, cache, hash);
    static rec r[NREQ];
    static uint64_t ids[NREQ];
    run_result res = {0};
    int per = NREQ / NWAVE;
    for (int wave = 0; wave < NWAVE; wave++) {
        if (record) make_wave(w, wave, seed);
        for (int i = wave * per; i < (wave + 1) * per; i++) {
            memset(&r[i], 0, sizeof r[i]);
            pthread_mutex_init(&r[i].mu, NULL);
            tk_request q;
            tk_request_default(&q);
            q.prompt = w->prompt[i];
            q.n_prompt = w->n_prompt[i];
            q.max_tokens = w->max_out[i];
            if (base) {
                q.sampling = *base;
                q.sampling.seed = base->seed + (uint64_t)i;
            }
            q.on_token = on_tok;
            q.on_finish = on_fin;
            q.user = &r[i];
            tk_status st = tk_engine_submit(e, &q, &ids[i]);
            if (st != TK_OK) fail_msg("submit %d: %s", i, tk_last_error());
            /* Cancel a few: some still waiting, some running (a few submissions later). */
            if (!record && i >= 3 && w->cancel[i - 3]) tk_engine_cancel(e, ids[i - 3]);
            if (i % 16 == 15) sleep_us(300);
        }
        wait_finished(e, (uint64_t)(wave + 1) * per);
        for (int i = wave * per; i < (wave + 1) * per; i++) {
            assert_int_equal(r[i].n_finish, 1);
            assert_int_equal(r[i].bad_order, 0);
            res.n_cached += (uint64_t)r[i].n_cached;
            if (record) {
                assert_int_equal(r[i].reason, TK_FINISH_LENGTH);
                assert_int_equal(r[i].n_out, w->max_out[i]);
                memcpy(w->ref[i], r[i].out, sizeof r[i].out);
                w->n_ref[i] = r[i].n_out;
                continue;
            }
            if (r[i].reason == TK_FINISH_CANCELLED) {
                /* Cut short: what it had is the start of the reference. */
                res.n_cancelled++;
                assert_true(r[i].n_out <= w->n_ref[i]);
            } else {
                assert_int_equal(r[i].reason, TK_FINISH_LENGTH);
                if (r[i].n_out != w->n_ref[i])
                    fail_msg("request %d: %d tokens, expected %d", i, r[i].n_out, w->n_ref[i]);
            }
            if (memcmp(r[i].out, w->ref[i], (size_t)r[i].n_out * sizeof(int32_t)) != 0)
                fail_msg("request %d (prompt %d) differs from its run without the cache", i, w->n_prompt[i]);
        }
    }
    /* The last finish is counted before its step's stats are published: wait for them. */
    for (int i = 0; i < 20000; i++) {
        tk_engine_stats_get(e, &res.st);
        if (res.st.running == 0 && res.st.waiting == 0 && res.st.kv_blocks_used == 0) break;
        sleep_us(100);
    }
    /* Idle: no block is held by a request, and every block that is not free is cached. */
    assert_int_equal(res.st.kv_blocks_used, 0);
    assert_int_equal(f->n_free + res.st.prefix_cache_blocks, n_blocks);
    tk_engine_free(e);
    if (f->fail) fail_msg("the fake saw a bad block use (kind %d)", (int)f->fail);
    /* Nothing leaked: the pool is whole again, and no block has a holder. */
    assert_int_equal(f->n_free, n_blocks);
    for (int b = 0; b < n_blocks; b++) assert_int_equal(f->refs[b], 0);
    fake_delete(f);
    return res;
}

static void check_workload(const tk_sampling *s, uint64_t seed) {
    static workload w;
    memset(&w, 0, sizeof w);
    run_result ref = run_workload(&w, s, 512, false, NULL, true, seed);
    assert_false(ref.st.prefix_cache);
    assert_int_equal(ref.st.prefix_cache_query_tokens, 0);
    struct {
        const char *what;
        int n_blocks;
        prefix_hash_fn hash;
    } runs[] = {
        {"large pool", 512, NULL},
        {"small pool (preemption, eviction)", 24, NULL},
        {"small pool, every hash colliding", 24, hash_const},
    };
    for (int k = 0; k < 3; k++) {
        run_result res = run_workload(&w, s, runs[k].n_blocks, true, runs[k].hash, false, seed);
        const tk_engine_stats *st = &res.st;
        print_message("%s: prefix cache hits %llu of %llu tokens, %d blocks cached, %llu evictions, %llu "
                      "preemptions, %d cancelled, %llu prompt tokens prefilled (%llu without the cache)\n",
                      runs[k].what, (unsigned long long)st->prefix_cache_hit_tokens,
                      (unsigned long long)st->prefix_cache_query_tokens, st->prefix_cache_blocks,
                      (unsigned long long)st->prefix_cache_evictions, (unsigned long long)st->preemptions,
                      res.n_cancelled, (unsigned long long)st->prompt_tokens,
                      (unsigned long long)ref.st.prompt_tokens);
        assert_true(st->prefix_cache);
        assert_true(st->prefix_cache_hit_tokens > 0);
        if (k == 0) {
            /* Without preemption's recomputation, every hit is a prefill token saved. */
            assert_true(st->prefix_cache_hit_tokens > st->prefix_cache_query_tokens / 4);
            assert_true(st->prompt_tokens < ref.st.prompt_tokens);
            /* Each request admitted once: its n_cached is its share of the hits. */
            assert_int_equal(st->preemptions, 0);
            assert_int_equal(res.n_cached, st->prefix_cache_hit_tokens);
        } else {
            assert_true(st->preemptions > 0);
            assert_true(st->prefix_cache_evictions > 0);
        }
    }
}

static void test_prefix_cache_engine_greedy_same_tokens(void **state) {
    (void)state;
    check_workload(NULL, 5);
}

static void test_prefix_cache_engine_seeded_same_tokens(void **state) {
    (void)state;
    tk_sampling s;
    tk_sampling_default(&s);
    s.temperature = 0.8f;
    s.top_p = 0.9f;
    s.seed = 1234;
    check_workload(&s, 6);
}

/* A backend that cannot share blocks runs without the cache; --no-prefix-cache turns it off. */
static void test_prefix_cache_engine_off(void **state) {
    (void)state;
    fake *f = fake_new(64);
    tk_engine *e = mk_engine(f, false, NULL);
    tk_engine_stats st;
    tk_engine_stats_get(e, &st);
    assert_false(st.prefix_cache);
    tk_engine_free(e);
    fake_delete(f);
    f = fake_new(64);
    e = mk_engine(f, true, NULL);
    tk_engine_stats_get(e, &st);
    assert_true(st.prefix_cache);
    tk_engine_free(e);
    fake_delete(f);
    tk_engine_opts o;
    tk_engine_opts_default(&o);
    assert_false(o.no_prefix_cache); /* on by default */
}

/* ---- the engine over a real model ------------------------------------------------------ */

#define MREQ 12
#define MOUT 4

/* Two waves of requests sharing prefixes (the second: repeats, whole-block
 * prompts cached in full, and follow-ups of the first) on one engine; the
 * tokens land in out. Returns the engine's stats at the end. */
static tk_engine_stats model_waves(const tk_model *m, tk_kv_type kv, tk_kv_scale scale, bool cache,
                                   int32_t prompts[2 * MREQ][160], const int *n_prompt,
                                   int32_t out[2 * MREQ][MOUT]) {
    tk_engine_opts o;
    tk_engine_opts_default(&o);
    o.ctx = 192;
    o.block_size = 16;
    o.max_batch = 8;
    o.max_seqs = 8;
    o.step_tokens = 64;
    o.kv_type = kv;
    o.kv_scale = scale;
    o.n_threads = 2;
    o.no_prefix_cache = !cache;
    tk_engine *e = NULL;
    if (tk_engine_create(m, &o, &e) != TK_OK) fail_msg("%s", tk_last_error());
    static rec r[2 * MREQ];
    for (int wave = 0; wave < 2; wave++) {
        for (int i = wave * MREQ; i < (wave + 1) * MREQ; i++) {
            memset(&r[i], 0, sizeof r[i]);
            pthread_mutex_init(&r[i].mu, NULL);
            tk_request q;
            tk_request_default(&q);
            q.prompt = prompts[i];
            q.n_prompt = n_prompt[i];
            q.max_tokens = MOUT;
            q.ignore_eos = true;
            q.on_token = on_tok;
            q.on_finish = on_fin;
            q.user = &r[i];
            uint64_t id;
            if (tk_engine_submit(e, &q, &id) != TK_OK) fail_msg("%s", tk_last_error());
        }
        wait_finished(e, (uint64_t)(wave + 1) * MREQ);
    }
    for (int i = 0; i < 2 * MREQ; i++) {
        assert_int_equal(r[i].n_out, MOUT);
        memcpy(out[i], r[i].out, sizeof out[i]);
    }
    tk_engine_stats st;
    for (int i = 0; i < 20000; i++) {
        tk_engine_stats_get(e, &st);
        if (st.running == 0 && st.kv_blocks_used == 0) break;
        sleep_us(100);
    }
    assert_int_equal(st.kv_blocks_used, 0);
    tk_engine_free(e);
    return st;
}

static void test_prefix_cache_model_same_tokens(void **state) {
    (void)state;
    tk_model *m = open_tiny();
    if (!m) skip();
    static int32_t prompts[2 * MREQ][160];
    int n_prompt[2 * MREQ];
    static const int root_len[3] = {48, 64, 37};
    for (int i = 0; i < MREQ; i++) {
        int rt = i % 3, add = i < 3 ? 0 : 3 + 5 * i;
        fill(prompts[i], root_len[rt], 500 + (uint64_t)rt, 151000);
        fill(prompts[i] + root_len[rt], add, 600 + (uint64_t)i, 151000);
        n_prompt[i] = root_len[rt] + add;
        /* The second wave: the same prompts, then each with 16 more tokens (one more block, or across one).
         */
        memcpy(prompts[MREQ + i], prompts[i], sizeof prompts[i]);
        n_prompt[MREQ + i] = n_prompt[i];
        if (i % 2) {
            fill(prompts[MREQ + i] + n_prompt[i], 16, 700 + (uint64_t)i, 151000);
            n_prompt[MREQ + i] += 16;
        }
    }
    /* Outputs do not depend on how prefills are chunked for any KV type (INT8
     * per head through the own-block records), so they match with and
     * without the cache. */
    struct {
        tk_kv_type kv;
        tk_kv_scale scale;
    } kinds[] = {
        {TK_KV_F32, TK_KV_SCALE_HEAD},
        {TK_KV_F16, TK_KV_SCALE_HEAD},
        {TK_KV_INT8, TK_KV_SCALE_TOKEN},
        {TK_KV_INT8, TK_KV_SCALE_HEAD},
    };
    for (int k = 0; k < 4; k++) {
        static int32_t off[2 * MREQ][MOUT], on[2 * MREQ][MOUT];
        tk_engine_stats s0 = model_waves(m, kinds[k].kv, kinds[k].scale, false, prompts, n_prompt, off);
        tk_engine_stats s1 = model_waves(m, kinds[k].kv, kinds[k].scale, true, prompts, n_prompt, on);
        print_message("kv %d scale %d: prefix cache hits %llu of %llu tokens; prefilled %llu tokens, %llu "
                      "without the cache\n",
                      (int)kinds[k].kv, (int)kinds[k].scale, (unsigned long long)s1.prefix_cache_hit_tokens,
                      (unsigned long long)s1.prefix_cache_query_tokens, (unsigned long long)s1.prompt_tokens,
                      (unsigned long long)s0.prompt_tokens);
        assert_true(s1.prefix_cache_hit_tokens >= 3 * 32);
        assert_true(s1.prompt_tokens < s0.prompt_tokens);
        for (int i = 0; i < 2 * MREQ; i++)
            if (memcmp(off[i], on[i], sizeof off[i]) != 0)
                fail_msg("kv %d: request %d (prompt %d) differs with the prefix cache", (int)kinds[k].kv, i,
                         n_prompt[i]);
    }
    tk_model_free(m);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_prefix_cache_table_chain_and_lru),
        cmocka_unit_test(test_prefix_cache_table_collisions_caught),
        cmocka_unit_test(test_prefix_cache_sched_share_and_copy),
        cmocka_unit_test(test_prefix_cache_sched_evicts_before_preempting),
        cmocka_unit_test(test_prefix_cache_sched_forced_collision),
        cmocka_unit_test(test_prefix_cache_engine_off),
        cmocka_unit_test(test_prefix_cache_engine_greedy_same_tokens),
        cmocka_unit_test(test_prefix_cache_engine_seeded_same_tokens),
        cmocka_unit_test(test_prefix_cache_model_same_tokens),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
