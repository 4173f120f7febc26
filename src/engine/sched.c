#include "engine/sched.h"

#include <math.h>
#include <string.h>

#include "core/alloc.h"
#include "core/error.h"

typedef struct seq_list {
    sched_seq *head, *tail;
    int n;
} seq_list;

struct sched {
    sched_opts o;
    sched_blocks b;
    seq_list running; /* ascending arrival order */
    seq_list waiting; /* ascending arrival order: preempted ones are older than any new arrival */
    sched_plan plan;
    int blocks_used, blocks_peak; /* used: blocks some sequence holds, each once */
    prefix_cache *pc;             /* NULL: no prefix cache */
    uint64_t pc_query, pc_hit;    /* tokens looked up at admission, and found cached */
    uint64_t preemptions;
    uint64_t restores, refed; /* sched_spec_settle: journals put back, known positions fed again */
    int n_no_blocks, n_behind, n_preempted_waiting;
    sched_cost cost; /* the measured step model (sched_observe) */
};

/* ---- lists ------------------------------------------------------------------ */

static void list_unlink(seq_list *l, sched_seq *q) {
    if (q->prev)
        q->prev->next = q->next;
    else
        l->head = q->next;
    if (q->next)
        q->next->prev = q->prev;
    else
        l->tail = q->prev;
    q->prev = q->next = NULL;
    l->n--;
}

/* Insert keeping ascending order; new arrivals land at the tail in O(1). */
static void list_insert_sorted(seq_list *l, sched_seq *q) {
    sched_seq *after = l->tail;
    while (after && after->order > q->order) after = after->prev;
    q->prev = after;
    q->next = after ? after->next : l->head;
    if (q->next)
        q->next->prev = q;
    else
        l->tail = q;
    if (after)
        after->next = q;
    else
        l->head = q;
    l->n++;
}

/* ---- setup ------------------------------------------------------------------ */

int sched_max_step_tokens(const sched_opts *o) {
    return o->no_chunking ? o->step_tokens + o->ctx : o->step_tokens;
}

int sched_blocks_for(const sched *s, int n) { return (n + s->o.block_size - 1) / s->o.block_size; }

tk_status sched_init(const sched_opts *o, const sched_blocks *blocks, sched **out) {
    if (!out || !o || !blocks) return tk_fail(TK_ERR_INVALID, "sched_init: NULL argument");
    *out = NULL;
    int bs = o->block_size;
    if (bs != 16 && bs != 32 && bs != 64 && bs != 128 && bs != 256)
        return tk_fail(TK_ERR_INVALID, "sched: block size %d, expected 16, 32, 64, 128 or 256", bs);
    if (o->ctx <= 0 || o->ctx > (1 << 24))
        return tk_fail(TK_ERR_INVALID, "sched: context %d, expected 1..%d", o->ctx, 1 << 24);
    if (o->max_batch <= 0 || o->max_batch > 4096)
        return tk_fail(TK_ERR_INVALID, "sched: max_batch %d, expected 1..4096", o->max_batch);
    if (o->step_tokens < o->max_batch || o->step_tokens > (1 << 20))
        return tk_fail(
            TK_ERR_INVALID,
            "sched: step budget %d tokens must be >= max_batch %d (every running decode fits) and <= %d",
            o->step_tokens, o->max_batch, 1 << 20);
    const sched_budget_opts *bo = &o->budget;
    if (bo->adaptive) {
        if (!(bo->target_s >= 0) || bo->target_s > 3600)
            return tk_fail(TK_ERR_INVALID, "sched: step target %g s, expected 0 (automatic) or up to 3600",
                           bo->target_s);
        if (bo->target_s == 0 &&
            (!(bo->ratio >= 1) || bo->ratio > 1000 || !(bo->max_s > 0) || bo->max_s > 3600))
            return tk_fail(TK_ERR_INVALID,
                           "sched: automatic step target needs ratio in [1, 1000] (got %g) and max in "
                           "(0, 3600] s (got %g)",
                           bo->ratio, bo->max_s);
        if (bo->min_chunk < 1 || bo->min_chunk > o->step_tokens)
            return tk_fail(TK_ERR_INVALID, "sched: minimum prefill chunk %d, expected 1..step cap %d",
                           bo->min_chunk, o->step_tokens);
    }
    if (o->prefix_cache && (!blocks->ref || !blocks->refs || !blocks->cow))
        return tk_fail(TK_ERR_INVALID,
                       "sched: the prefix cache needs blocks that can be shared (ref, refs, cow)");
    int need = (o->ctx + bs - 1) / bs;
    if (o->n_blocks < need)
        return tk_fail(TK_ERR_NOMEM,
                       "sched: the KV pool holds %d blocks of %d tokens; one sequence of context %d needs %d",
                       o->n_blocks, bs, o->ctx, need);
    sched *s = tk_calloc(1, sizeof *s);
    if (!s) return tk_fail(TK_ERR_NOMEM, "sched: out of memory");
    s->o = *o;
    s->b = *blocks;
    s->plan.items = tk_calloc((size_t)o->max_batch, sizeof *s->plan.items);
    if (!s->plan.items) {
        tk_free(s);
        return tk_fail(TK_ERR_NOMEM, "sched: out of memory");
    }
    if (o->prefix_cache) {
        tk_status st = prefix_init(o->n_blocks, bs, o->prefix_seed, &s->pc);
        if (st != TK_OK) {
            tk_free(s->plan.items);
            tk_free(s);
            return st;
        }
    }
    *out = s;
    return TK_OK;
}

void sched_free(sched *s) {
    if (!s) return;
    /* Whatever is still queued gives its blocks back: the pool must end full. */
    while (s->running.head) sched_remove(s, s->running.head);
    while (s->waiting.head) sched_remove(s, s->waiting.head);
    if (s->pc) {
        /* No sequence is left, so every cached block is idle: the cache's holds go back. */
        for (int b; (b = prefix_evict(s->pc)) >= 0;) s->b.free(s->b.ctx, b);
        TK_ASSERT(prefix_n_cached(s->pc) == 0);
        prefix_free(s->pc);
    }
    tk_free(s->plan.items);
    tk_free(s);
}

void sched_set_prefix_hash(sched *s, prefix_hash_fn fn) {
    if (s->pc) prefix_set_hash(s->pc, fn);
}

tk_status sched_add(sched *s, sched_seq *seq, uint64_t order) {
    if (seq->n_tokens <= 0 || seq->n_tokens > s->o.ctx)
        return tk_fail(TK_ERR_RANGE, "sched: sequence of %d tokens, context is %d", seq->n_tokens, s->o.ctx);
    int cap = sched_blocks_for(s, s->o.ctx);
    seq->bt = tk_calloc((size_t)cap, sizeof *seq->bt);
    if (!seq->bt) return tk_fail(TK_ERR_NOMEM, "sched: out of memory for a block table of %d", cap);
    seq->bt_cap = cap;
    seq->order = order;
    seq->n_computed = 0;
    seq->n_blocks = 0;
    seq->state = SCHED_WAITING;
    seq->cause = SCHED_CAUSE_NONE;
    seq->preempted = false;
    seq->n_preempted = 0;
    seq->n_hit = 0;
    seq->n_draft = 0;
    seq->journal = -1;
    seq->journal_pos = 0;
    seq->pc_n = 0;
    seq->pc_off = false;
    seq->prev = seq->next = NULL;
    list_insert_sorted(&s->waiting, seq);
    return TK_OK;
}

/* Blocks free for the taking: the pool's, and the idle cached ones it may evict. */
static int blocks_avail(const sched *s) { return s->b.n_free(s->b.ctx) + (s->pc ? prefix_n_idle(s->pc) : 0); }

/* Evict the least recently used idle cached block into the pool; false when none is idle. */
static bool evict_one(sched *s) {
    int b = s->pc ? prefix_evict(s->pc) : -1;
    if (b < 0) return false;
    TK_ASSERT(s->b.refs(s->b.ctx, b) == 1); /* idle: the cache is its only holder */
    s->b.free(s->b.ctx, b);
    return true;
}

/* A block of the pool's with one holder, evicting an idle cached one when the
 * pool is empty; -1 when neither has one. */
static int take_block(sched *s) {
    int b = s->b.alloc(s->b.ctx);
    while (b < 0 && evict_one(s)) b = s->b.alloc(s->b.ctx);
    return b;
}

/* Drop one sequence hold on block b: it is free, still shared, or cached with
 * no sequence holding it (idle, the most recently used). */
static void drop_block(sched *s, int b) {
    s->b.free(s->b.ctx, b);
    if (!s->pc) {
        s->blocks_used--;
        return;
    }
    int refs = s->b.refs(s->b.ctx, b);
    if (refs == 0) {
        s->blocks_used--;
    } else if (refs == 1 && prefix_has(s->pc, b)) {
        prefix_idle(s->pc, b);
        s->blocks_used--;
    }
}

/* seq's journal (a block of its own, outside its table) back to the pool. */
static void journal_drop(sched *s, sched_seq *seq) {
    if (seq->journal < 0) return;
    s->b.free(s->b.ctx, seq->journal);
    s->blocks_used--;
    seq->journal = -1;
}

/* Before a verification from pos0 in a block that already holds positions:
 * a copy of that block, so that a rejection puts it back instead of
 * computing the block again from its first slot. The copy takes a free
 * block, or else the least recently used idle cached one (a pool that
 * serves a while fills with those; the copy is back in the pool at the
 * settle that follows, for the next step's copies); none when neither. */
static void journal_take(sched *s, sched_seq *seq, int pos0) {
    if (!s->o.rewrite_block || !s->b.copy || pos0 % s->o.block_size == 0) return;
    const int b = take_block(s);
    if (b < 0) return;
    s->b.copy(s->b.ctx, b, seq->bt[pos0 / s->o.block_size], pos0 % s->o.block_size);
    seq->journal = b;
    seq->journal_pos = pos0;
    if (++s->blocks_used > s->blocks_peak) s->blocks_peak = s->blocks_used;
}

/* Last block first, so the chain's tail is the older idle one (evicted first),
 * and the pool's free stack hands the blocks out again in their order: ids
 * that follow each other lie side by side in the KV pool (kv.c). */
static void release_blocks(sched *s, sched_seq *seq) {
    journal_drop(s, seq);
    for (int i = seq->n_blocks - 1; i >= 0; i--) drop_block(s, seq->bt[i]);
    seq->n_blocks = 0;
    seq->pc_n = 0;
    seq->pc_off = false;
}

void sched_remove(sched *s, sched_seq *seq) {
    if (!seq || seq->state == SCHED_FREE) return;
    release_blocks(s, seq);
    list_unlink(seq->state == SCHED_RUNNING ? &s->running : &s->waiting, seq);
    seq->state = SCHED_FREE;
    tk_free(seq->bt);
    seq->bt = NULL;
    seq->bt_cap = 0;
}

/* Grow seq's table to cover n positions; false (nothing taken) if the pool is short. */
static bool reserve(sched *s, sched_seq *seq, int n) {
    int need = sched_blocks_for(s, n) - seq->n_blocks;
    if (need <= 0) return true;
    if (need > blocks_avail(s)) return false;
    /* Evictions first, then every block from the pool's stack: the evicted
     * (a chain's tail first) come back in their order, as a freed
     * sequence's do, where evicting one per block would hand them out last
     * first. Ids that follow each other lie side by side in the KV pool. */
    while (s->b.n_free(s->b.ctx) < need && evict_one(s)) {
    }
    for (int i = 0; i < need; i++) {
        int blk = take_block(s);
        if (blk < 0) return false; /* n_free lied; the caller treats it as a shortage */
        seq->bt[seq->n_blocks++] = blk;
        s->blocks_used++;
    }
    if (s->blocks_used > s->blocks_peak) s->blocks_peak = s->blocks_used;
    return true;
}

/* Admit seq's blocks: the longest chain of cached full blocks that starts its
 * tokens is shared (a reference each) and blocks for the rest are reserved.
 * A sequence cached in full still computes its last token (for the logits):
 * into a copy of its last block, or, when the KV type rewrites a block from
 * its first slot, by recomputing that whole block. False (nothing taken) when
 * the pool, idle cached blocks included, cannot cover the rest. */
static bool admit_blocks(sched *s, sched_seq *seq) {
    seq->n_hit = 0;
    if (!s->pc || !seq->tokens) return reserve(s, seq, seq->n_tokens);
    const int bs = s->o.block_size, n = seq->n_tokens;
    prefix_link link = prefix_root(s->pc), before = link;
    int m = 0, idle = 0;
    /* Matched ids go straight into the table; n_blocks stays 0 until they are held. */
    while ((m + 1) * bs <= n) {
        prefix_link next;
        int b = prefix_find(s->pc, &link, seq->tokens + (size_t)m * bs, &next);
        if (b < 0) break;
        seq->bt[m++] = b;
        before = link;
        link = next;
    }
    bool cow = false;
    if (m > 0 && m * bs == n) {
        if (s->o.rewrite_block) {
            m--; /* the last block is computed afresh, from its first slot */
            link = before;
        } else {
            cow = true; /* the last token is written again, into a copy */
        }
    }
    for (int j = 0; j < m; j++) idle += prefix_is_idle(s->pc, seq->bt[j]);
    int need = sched_blocks_for(s, n) - m + (cow ? 1 : 0);
    if (need > blocks_avail(s) - idle) return false;
    s->pc_query += (uint64_t)n;
    for (int j = 0; j < m; j++) {
        int b = seq->bt[j];
        if (prefix_is_idle(s->pc, b)) {
            prefix_busy(s->pc, b);
            s->blocks_used++;
        }
        s->b.ref(s->b.ctx, b);
    }
    seq->n_blocks = m;
    seq->pc = link;
    seq->pc_n = m;
    seq->pc_off = false;
    if (!reserve(s, seq, n)) {
        release_blocks(s, seq); /* only if the allocator misreports */
        return false;
    }
    if (cow) {
        if (s->b.n_free(s->b.ctx) == 0 && !evict_one(s)) {
            release_blocks(s, seq);
            return false;
        }
        int old = seq->bt[m - 1];
        if (s->b.cow(s->b.ctx, seq->bt, m - 1) != TK_OK) {
            release_blocks(s, seq);
            return false;
        }
        /* The copy is this sequence's; the cached block may have no sequence holder left. */
        s->blocks_used++;
        if (s->b.refs(s->b.ctx, old) == 1 && prefix_has(s->pc, old)) {
            prefix_idle(s->pc, old);
            s->blocks_used--;
        }
        seq->n_computed = n - 1;
    } else {
        seq->n_computed = m * bs;
    }
    seq->n_hit = seq->n_computed;
    s->pc_hit += (uint64_t)seq->n_computed;
    if (s->blocks_used > s->blocks_peak) s->blocks_peak = s->blocks_used;
    return true;
}

/* Cache the blocks of seq that filled: a block equal to a cached one (same
 * tokens after the same chain) stays the sequence's own, and its chain goes on
 * from the cached one. */
static void cache_full_blocks(sched *s, sched_seq *seq, int n_known) {
    const int bs = s->o.block_size;
    while (!seq->pc_off && (seq->pc_n + 1) * bs <= n_known) {
        if (!prefix_link_valid(s->pc, &seq->pc)) {
            seq->pc_off = true; /* the chain's last entry was evicted: nothing after it can be found */
            break;
        }
        const int32_t *toks = seq->tokens + (size_t)seq->pc_n * bs;
        prefix_link next;
        if (prefix_find(s->pc, &seq->pc, toks, &next) < 0) {
            int b = seq->bt[seq->pc_n];
            prefix_insert(s->pc, &seq->pc, b, toks, &next);
            s->b.ref(s->b.ctx, b); /* the cache's own hold */
        }
        seq->pc = next;
        seq->pc_n++;
    }
}

static void preempt(sched *s, sched_seq *seq) {
    release_blocks(s, seq);
    list_unlink(&s->running, seq);
    seq->state = SCHED_WAITING;
    seq->n_computed = 0;
    seq->n_draft = 0;
    seq->preempted = true;
    seq->n_preempted++;
    s->preemptions++;
    s->plan.n_preempted++;
    list_insert_sorted(&s->waiting, seq);
    if (s->b.preempted) s->b.preempted(s->b.ctx, seq);
}

static void plan_add(sched *s, sched_seq *seq, int n, int n_draft) {
    sched_item *it = &s->plan.items[s->plan.n_items++];
    it->seq = seq;
    it->pos0 = seq->n_computed;
    it->n = n + n_draft;
    it->n_draft = n_draft;
    it->want_logits = seq->n_computed + n == seq->n_tokens;
    s->plan.n_tok += n + n_draft;
    s->plan.n_draft += n_draft;
    if (!sched_item_is_decode(it)) s->plan.prefill_kpos += sched_prefill_kpos(it->pos0, n);
}

/* ---- the time-based budget ---------------------------------------------------- */

#define NCOST 4 /* fixed, per decode, per prefill token, per 1,024 positions attended */

double sched_prefill_kpos(int pos0, int n) {
    if (n <= 0) return 0;
    return ((double)n * pos0 + (double)n * (n + 1) / 2) / 1024; /* token i attends to pos0 + i + 1 */
}

/* The step model's prediction. */
static double cost_predict(const sched_cost *c, int n_decode, int n_prefill, double kpos) {
    return c->fixed_s + c->dec_s * n_decode + c->pre_s * n_prefill + c->attn_s * kpos;
}

double sched_cost_decode_s(const sched_cost *c, int n_decode) {
    return c->w > 0 ? cost_predict(c, n_decode, 0, 0) : 0;
}

/* Solve the k x k system a x = y (row-major, k <= NCOST) by Gaussian
 * elimination with partial pivoting; false when it is singular. */
static bool solve_small(int k, double *a, double *y, double *x) {
    for (int i = 0; i < k; i++) {
        int piv = i;
        for (int r = i + 1; r < k; r++)
            if (fabs(a[r * k + i]) > fabs(a[piv * k + i])) piv = r;
        if (!(fabs(a[piv * k + i]) > 0)) return false;
        if (piv != i) {
            for (int j = 0; j < k; j++) {
                double t = a[i * k + j];
                a[i * k + j] = a[piv * k + j];
                a[piv * k + j] = t;
            }
            double t = y[i];
            y[i] = y[piv];
            y[piv] = t;
        }
        for (int r = i + 1; r < k; r++) {
            double f = a[r * k + i] / a[i * k + i];
            for (int j = i; j < k; j++) a[r * k + j] -= f * a[i * k + j];
            y[r] -= f * y[i];
        }
    }
    for (int i = k - 1; i >= 0; i--) {
        double v = y[i];
        for (int j = i + 1; j < k; j++) v -= a[i * k + j] * x[j];
        x[i] = v / a[i * k + i];
    }
    return true;
}

/* Minimise b' S b - 2 b' r over b >= 0 (S positive definite): the fit with
 * every cost >= 0. With four unknowns every set of free costs (the rest at
 * 0) is tried; the best feasible one is the constrained optimum. */
static void cost_fit(sched_cost *c) {
    const double *S = c->info, *r = c->rhs;
    double best[NCOST] = {0}, best_f = 0; /* all zero: f = 0 */
    for (int set = 1; set < 1 << NCOST; set++) {
        int idx[NCOST], k = 0;
        for (int i = 0; i < NCOST; i++)
            if (set >> i & 1) idx[k++] = i;
        double a[NCOST * NCOST], y[NCOST], x[NCOST];
        for (int i = 0; i < k; i++) {
            y[i] = r[idx[i]];
            for (int j = 0; j < k; j++) a[i * k + j] = S[idx[i] * NCOST + idx[j]];
        }
        if (!solve_small(k, a, y, x)) continue;
        bool ok = true;
        double v[NCOST] = {0};
        for (int i = 0; i < k; i++) {
            ok &= x[i] >= 0 && isfinite(x[i]);
            v[idx[i]] = x[i];
        }
        if (!ok) continue;
        double f = 0;
        for (int i = 0; i < NCOST; i++) {
            f -= 2 * v[i] * r[i];
            for (int j = 0; j < NCOST; j++) f += v[i] * S[i * NCOST + j] * v[j];
        }
        if (f < best_f) {
            best_f = f;
            memcpy(best, v, sizeof best);
        }
    }
    c->fixed_s = best[0];
    c->dec_s = best[1];
    c->pre_s = c->w_pre > 0 ? best[2] : 0;
    c->attn_s = c->w_pre > 0 ? best[3] : 0;
}

void sched_cost_observe(sched_cost *c, int n_decode, int n_prefill, double prefill_kpos, double seconds) {
    if (!(seconds > 0) || !isfinite(seconds) || n_decode < 0 || n_prefill < 0 || n_decode + n_prefill == 0 ||
        !(prefill_kpos >= 0) || !isfinite(prefill_kpos))
        return;
    if (!(c->w > 0)) { /* the prior: a little of a step's weight, centred on zero */
        static const double prior[NCOST] = {1, 100, 1, 1};
        memset(c->info, 0, sizeof c->info);
        memset(c->rhs, 0, sizeof c->rhs);
        for (int i = 0; i < NCOST; i++) c->info[i * NCOST + i] = SCHED_COST_PRIOR * prior[i];
    }
    /* A step whose kind was never seen (the first with prefill) has no
     * prediction to be long against. */
    bool seen = c->w > 0 && (n_prefill == 0 || c->w_pre > 0);
    double keep = seen && seconds > SCHED_COST_LONG * cost_predict(c, n_decode, n_prefill, prefill_kpos)
                      ? SCHED_COST_KEEP_LONG
                      : SCHED_COST_KEEP;
    /* Forget only along x (directional forgetting): of what the old steps
     * told, only the part the new step tells again is discounted, by keep.
     * With q = S x, d = x' q: S -= (1 - keep) q q' / d, and r moves so that
     * the unconstrained estimate S^-1 r is unchanged (r -= (1 - keep) q x'
     * S S^-1 r / d = (1 - keep) q (x' r) / d); then the step is added. */
    const double x[NCOST] = {1, n_decode, n_prefill, prefill_kpos};
    double q[NCOST] = {0}, d = 0, xr = 0;
    for (int i = 0; i < NCOST; i++) {
        for (int j = 0; j < NCOST; j++) q[i] += c->info[i * NCOST + j] * x[j];
        d += x[i] * q[i];
        xr += x[i] * c->rhs[i];
    }
    for (int i = 0; i < NCOST; i++) {
        for (int j = 0; j < NCOST; j++) c->info[i * NCOST + j] += x[i] * x[j] - (1 - keep) * q[i] * q[j] / d;
        c->rhs[i] += x[i] * seconds - (1 - keep) * q[i] * xr / d;
    }
    c->w = keep * c->w + 1;
    c->w_pre = keep * c->w_pre + (n_prefill > 0);
    if (n_prefill > 0) c->last_prefill = n_prefill;
    cost_fit(c);
}

double sched_budget_target(const sched_budget_opts *b, const sched_cost *c, int n_decode) {
    if (b->target_s > 0) return b->target_s;
    if (n_decode <= 0) return b->max_s; /* nobody waits for a token: the whole allowance */
    double t = b->ratio * sched_cost_decode_s(c, n_decode); /* 0 while nothing is measured: min_chunk */
    return t < b->max_s ? t : b->max_s;
}

int sched_budget_tokens(const sched_budget_opts *b, const sched_cost *c, int cap, int n_decode, int pos0) {
    if (!b->adaptive) return cap;
    int room = cap - n_decode;
    if (room <= 0) return cap;
    int lo = b->min_chunk < room ? b->min_chunk : room;
    if (lo < 1) lo = 1;
    if (!(c->w_pre > 0)) return n_decode + lo; /* first measure what a chunk costs */
    /* k tokens from pos0 cost pre k + attn (k pos0 + k (k + 1) / 2) / 1024:
     * the largest k within the spare time is the positive root of A k^2 + B k
     * = spare. */
    double spare = sched_budget_target(b, c, n_decode) - sched_cost_decode_s(c, n_decode);
    double A = c->attn_s / 2048, B = c->pre_s + c->attn_s * (pos0 + 0.5) / 1024, k;
    if (!(spare > 0))
        k = 0;
    else if (A > 0)
        k = 2 * spare / (B + sqrt(B * B + 4 * A * spare)); /* the root, without cancellation */
    else
        k = B > 0 ? spare / B : room;
    int n = k >= room ? room : k <= lo ? lo : (int)k;
    int grow = 2 * c->last_prefill > lo ? 2 * c->last_prefill : lo;
    if (n > grow) n = grow;
    return n_decode + n;
}

void sched_observe(sched *s, const sched_plan *p, double seconds) {
    /* A verified draft costs what a decode token does (one more logits row). */
    sched_cost_observe(&s->cost, p->n_decode + p->n_draft, p->n_tok - p->n_decode - p->n_draft,
                       p->prefill_kpos, seconds);
}

/* How much of seq's remaining prefill goes in this step (0: none). */
static int prefill_chunk(const sched *s, const sched_seq *seq, int budget, bool prefill_added) {
    int rem = seq->n_tokens - seq->n_computed;
    if (!s->o.no_chunking) return rem < budget ? rem : budget;
    /* Whole prompts only; one may exceed the budget so a long prompt still runs. */
    if (rem <= budget || !prefill_added) return rem;
    return 0;
}

const sched_plan *sched_plan_step(sched *s) {
    sched_plan *p = &s->plan;
    p->n_items = p->n_tok = p->n_decode = p->n_draft = p->n_preempted = 0;
    p->prefill_kpos = 0;
    /* a journal lives from its plan to the settle that follows the step */
    for (sched_seq *q = s->running.head; q; q = q->next) journal_drop(s, q);

    /* 1. Blocks for every running sequence's known tokens; preempt the newest
     * until they fit (it may be the one asking). */
    for (;;) {
        int need = 0;
        for (sched_seq *q = s->running.head; q; q = q->next) {
            int d = sched_blocks_for(s, q->n_tokens) - q->n_blocks;
            if (d > 0) need += d;
        }
        if (need <= blocks_avail(s) || !s->running.tail) break;
        preempt(s, s->running.tail);
    }
    for (sched_seq *q = s->running.head; q;) {
        sched_seq *next = q->next;
        if (!reserve(s, q, q->n_tokens)) preempt(s, q); /* only if the allocator misreports */
        q = next;
    }

    /* 2. Decodes, then 3. prefill chunks, oldest first. The budget is sized
     * for this step's decodes (every one fits: the cap is >= max_batch). */
    int n_decode = 0, pos0 = -1;
    for (sched_seq *q = s->running.head; q; q = q->next) {
        n_decode += q->n_tokens - q->n_computed == 1;
        if (pos0 < 0 && q->n_tokens - q->n_computed > 1) pos0 = q->n_computed; /* the first prefill */
    }
    if (pos0 < 0 && s->waiting.head)
        pos0 = s->waiting.head->n_computed; /* an admission's, before its cache hit */
    int budget = sched_budget_tokens(&s->o.budget, &s->cost, s->o.step_tokens, n_decode, pos0 < 0 ? 0 : pos0);
    p->budget = budget;
    p->target_s = s->o.budget.adaptive ? sched_budget_target(&s->o.budget, &s->cost, n_decode) : 0;
    bool prefill_added = false;
    /* Drafts ride on their decodes within the step cap (never preempting
     * anyone for their blocks); they do not eat the prefill budget. */
    int draft_room = s->o.step_tokens - n_decode;
    for (sched_seq *q = s->running.head; q && budget > 0; q = q->next) {
        int nd = q->n_draft;
        q->n_draft = 0;
        if (q->n_tokens - q->n_computed != 1) continue;
        if (nd > draft_room) nd = draft_room;
        if (nd > s->o.ctx - q->n_tokens) nd = s->o.ctx - q->n_tokens; /* positions stay below ctx */
        if (nd > 0 && !reserve(s, q, q->n_tokens + nd)) nd = 0;
        if (nd < 0) nd = 0;
        draft_room -= nd;
        plan_add(s, q, 1, nd);
        p->n_decode++;
        budget--;
    }
    if (budget > s->o.step_tokens - p->n_tok) budget = s->o.step_tokens - p->n_tok;
    if (budget < 0) budget = 0;
    for (sched_seq *q = s->running.head; q; q = q->next) {
        if (q->n_tokens - q->n_computed <= 1) continue;
        int c = prefill_chunk(s, q, budget, prefill_added);
        if (c <= 0) continue;
        plan_add(s, q, c, 0);
        budget -= c;
        if (budget < 0) budget = 0;
        prefill_added = true;
    }

    /* 4. Admission, first come first served: the head blocks everyone behind it. */
    int stop_cause = SCHED_CAUSE_BEHIND_PREFILL;
    bool may_admit = !s->o.static_batching || s->running.n == 0;
    while (s->waiting.head && may_admit) {
        sched_seq *q = s->waiting.head;
        if (s->running.n >= s->o.max_batch) break;
        int rem = q->n_tokens;
        if (!s->o.static_batching) {
            if (budget <= 0) break;
            if (s->o.no_chunking && rem > budget && prefill_added) break;
        }
        if (!admit_blocks(s, q)) {
            stop_cause = SCHED_CAUSE_NO_BLOCKS;
            break;
        }
        list_unlink(&s->waiting, q);
        q->state = SCHED_RUNNING;
        q->preempted = false;
        q->cause = SCHED_CAUSE_NONE;
        list_insert_sorted(&s->running, q);
        int c = budget > 0 ? prefill_chunk(s, q, budget, prefill_added) : 0;
        if (c > 0) {
            plan_add(s, q, c, 0);
            budget -= c;
            if (budget < 0) budget = 0;
            prefill_added = true;
        }
    }

    /* 5. Journals, from what the plan left free. */
    for (int i = 0; i < p->n_items; i++)
        if (p->items[i].n_draft > 0) journal_take(s, p->items[i].seq, p->items[i].pos0);

    s->n_no_blocks = s->n_behind = s->n_preempted_waiting = 0;
    for (sched_seq *q = s->waiting.head; q; q = q->next) {
        q->cause = q->preempted           ? SCHED_CAUSE_PREEMPTED
                   : q == s->waiting.head ? stop_cause
                                          : SCHED_CAUSE_BEHIND_PREFILL;
        if (q->cause == SCHED_CAUSE_NO_BLOCKS)
            s->n_no_blocks++;
        else if (q->cause == SCHED_CAUSE_PREEMPTED)
            s->n_preempted_waiting++;
        else
            s->n_behind++;
    }
    return p;
}

void sched_advance(sched *s, const sched_plan *p) {
    for (int i = 0; i < p->n_items; i++) {
        sched_seq *q = p->items[i].seq;
        q->n_computed += p->items[i].n;
        if (s->pc && q->tokens) cache_full_blocks(s, q, q->n_computed - p->items[i].n_draft);
    }
}

int sched_rollback_to(int n_keep, int block_size, bool rewrite, int copy_pos, bool *restore) {
    *restore = false;
    if (!rewrite || n_keep % block_size == 0) return n_keep;
    if (copy_pos >= 0 && copy_pos <= n_keep && copy_pos / block_size == n_keep / block_size) {
        *restore = true;
        return copy_pos;
    }
    return n_keep - n_keep % block_size;
}

void sched_spec_settle(sched *s, sched_seq *seq, int n_keep) {
    if (!seq || seq->state != SCHED_RUNNING) return;
    if (n_keep > seq->n_computed) n_keep = seq->n_computed;
    if (n_keep < 0) n_keep = 0;
    const int bs = s->o.block_size;
    /* A dropped position in the block of n_keep - 1 may have rescaled it: put
     * back as it was before the step (its journal) and the step's kept
     * positions fed again, or else fed again from its first slot. */
    if (n_keep < seq->n_computed) {
        bool restore;
        const int from = sched_rollback_to(n_keep, bs, s->o.rewrite_block,
                                           seq->journal >= 0 ? seq->journal_pos : -1, &restore);
        if (restore) {
            s->b.copy(s->b.ctx, seq->bt[from / bs], seq->journal, from % bs);
            s->restores++;
        }
        s->refed += (uint64_t)(n_keep - from);
        n_keep = from;
    }
    journal_drop(s, seq);
    seq->n_computed = n_keep;
    int keep = sched_blocks_for(s, seq->n_tokens > n_keep ? seq->n_tokens : n_keep);
    while (seq->n_blocks > keep) drop_block(s, seq->bt[--seq->n_blocks]);
    if (s->pc && seq->tokens) cache_full_blocks(s, seq, seq->n_computed);
}

sched_seq *sched_running(const sched *s) { return s->running.head; }

void sched_counts_get(const sched *s, sched_counts *out) {
    memset(out, 0, sizeof *out);
    out->running = s->running.n;
    out->waiting = s->waiting.n;
    out->waiting_no_blocks = s->n_no_blocks;
    out->waiting_behind_prefill = s->n_behind;
    out->waiting_preempted = s->n_preempted_waiting;
    out->blocks_total = s->o.n_blocks;
    out->blocks_used = s->blocks_used;
    out->blocks_peak = s->blocks_peak;
    out->preemptions = s->preemptions;
    out->spec_restores = s->restores;
    out->spec_refed = s->refed;
    if (s->pc) {
        out->prefix_cache = true;
        out->prefix_query_tokens = s->pc_query;
        out->prefix_hit_tokens = s->pc_hit;
        out->prefix_evictions = prefix_evictions(s->pc);
        out->prefix_collisions = prefix_collisions(s->pc);
        out->prefix_blocks = prefix_n_cached(s->pc);
        out->prefix_idle = prefix_n_idle(s->pc);
    }
    out->budget = s->plan.budget;
    out->target_s = s->plan.target_s;
    out->cost = s->cost;
}

bool sched_busy(const sched *s) { return s->running.n > 0 || s->waiting.n > 0; }
