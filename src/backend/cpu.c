/* The CPU backend: a thread pool, the paged KV pool (kv.h) and the batched
 * forward pass (forward.h) over one model, behind the backend table. */
#include <stdatomic.h>
#include <string.h>

#include "backend/backend.h"
#include "core/alloc.h"
#include "core/checked.h"
#include "core/error.h"
#include "core/log.h"
#include "core/numa.h"
#include "core/pool.h"
#include "kv/kv.h"
#include "model/forward.h"
#include "model/fwd_prof.h"
#include "model/model.h"

typedef struct cpu_be {
    tk_pool *pool;
    bool own_pool;
    tk_kv *kv;
    fwd_ctx *fwd;
} cpu_be;

static int cb_alloc(void *c) { return kv_block_alloc(((cpu_be *)c)->kv); }
static void cb_free(void *c, int b) { kv_block_free(((cpu_be *)c)->kv, b); }
static int cb_n_free(void *c) { return kv_blocks_free(((cpu_be *)c)->kv); }
static void cb_ref(void *c, int b) { kv_block_ref(((cpu_be *)c)->kv, b); }
static int cb_refs(void *c, int b) { return kv_block_refs(((cpu_be *)c)->kv, b); }
static void cb_copy(void *c, int dst, int src, int n_slots) {
    kv_block_copy(((cpu_be *)c)->kv, dst, src, n_slots);
}
static tk_status cb_step(void *c, const tk_batch *b, float *logits) {
    return fwd_step(((cpu_be *)c)->fwd, b, logits);
}
static uint64_t cb_bytes(void *c) { return fwd_last_bytes(((cpu_be *)c)->fwd); }

_Static_assert((int)TK_FLOOR_F32 == (int)TK_PEAK_F32 && (int)TK_FLOOR_INT8 == (int)TK_PEAK_INT8 &&
                   (int)TK_FLOOR_BF16 == (int)TK_PEAK_BF16 && (int)TK_FLOOR_PEAKS == TK_PEAK_COUNT,
               "the public floor peaks are the kernels' tk_peak");

/* The last step's stage costs as floor terms: each stage with multiply-adds
 * its own term, the stages that only read summed into the first (their
 * floors add: bytes over one bandwidth). The fused plan has seven stages
 * with multiply-adds (test_backend_floor_terms counts them): TK_STEP_TERMS
 * must grow with it. */
static void cb_floor_terms(void *c, tk_floor_term *out) {
    fwd_stage_cost cost[FWD_ST_COUNT];
    fwd_last_costs(((cpu_be *)c)->fwd, cost);
    memset(out, 0, TK_STEP_TERMS * sizeof *out);
    int n = 1;
    for (int s = 0; s < FWD_ST_COUNT; s++) {
        tk_floor_term *t = cost[s].ops > 0 && n < TK_STEP_TERMS ? &out[n++] : &out[0];
        t->bytes += cost[s].bytes;
        t->ops += cost[s].ops;
        if (t != &out[0]) t->peak = (int)cost[s].peak;
    }
}
static void cb_kv_read(void *c, int l, const int32_t *bt, int pos, float *k, float *v) {
    kv_read(((cpu_be *)c)->kv, l, bt, pos, k, v);
}

/* run_each: the pool's threads take items from a shared counter until none
 * is left. A pool shared with another backend is free here too: steps of
 * the two never overlap, and run_each is never called during a step. */
typedef struct cb_each {
    void (*fn)(void *arg, int i);
    void *arg;
    int n;
    _Atomic int next;
} cb_each;

static void cb_each_worker(void *ctx, int ith, int nth) {
    (void)ith;
    (void)nth;
    cb_each *w = ctx;
    for (;;) {
        int i = atomic_fetch_add_explicit(&w->next, 1, memory_order_relaxed);
        if (i >= w->n) break;
        w->fn(w->arg, i);
    }
}

static void cb_run_each(void *c, void (*fn)(void *arg, int i), void *arg, int n) {
    cb_each w = {.fn = fn, .arg = arg, .n = n};
    atomic_init(&w.next, 0);
    pool_run(((cpu_be *)c)->pool, cb_each_worker, &w);
}

static void cb_destroy(void *c) {
    cpu_be *cb = c;
    if (!cb) return;
    fwd_free(cb->fwd);
    kv_free(cb->kv);
    if (cb->own_pool) pool_free(cb->pool);
    tk_free(cb);
}

static uint64_t fnv_bytes(uint64_t h, const void *p, size_t n) {
    const unsigned char *c = p;
    for (size_t i = 0; i < n; i++) h = (h ^ c[i]) * 1099511628211ULL;
    return h;
}

/* The model as the prefix cache's hashes name it: its shape and weights as
 * loaded, and the model object itself (KV from another model, even one of the
 * same shape, is never the same KV). */
static uint64_t model_id_of(const tk_model *m) {
    tk_model_info in;
    tk_model_get_info(m, &in);
    int shape[] = {in.n_layer, in.n_embd, in.n_head, in.n_head_kv, in.head_dim, in.n_ff, in.n_vocab};
    uint64_t h = fnv_bytes(1469598103934665603ULL, shape, sizeof shape);
    h = fnv_bytes(h, &in.n_params, sizeof in.n_params);
    h = fnv_bytes(h, &in.weight_bytes, sizeof in.weight_bytes);
    const char *names[] = {in.arch, in.name, in.weight_dtype};
    for (int i = 0; i < 3; i++)
        if (names[i]) h = fnv_bytes(h, names[i], strlen(names[i]) + 1);
    uintptr_t self = (uintptr_t)m;
    return fnv_bytes(h, &self, sizeof self);
}

#define CPU_LIST_MAX 1024

/* --numa: the nodes of the threads' CPUs, and the weights moved there. On a
 * machine with nothing to place, one line says why. */
static tk_status numa_place_weights(const tk_model *m, const int *cpus, int n_cpus, tk_numa *nm) {
    char why[96];
    tk_status st = tk_numa_init(cpus, n_cpus, nm, why, sizeof why);
    if (st != TK_OK) return st;
    if (!nm->active) {
        tk_log_warn("numa: %s; --numa places nothing", why);
        return TK_OK;
    }
    void *p;
    size_t n;
    model_resident_region(m, &p, &n);
    st = tk_numa_move(nm, p, n);
    if (st == TK_OK) tk_log_info("numa: weights, KV and buffers interleaved over %d node(s)", nm->n_nodes);
    return st;
}

/* Blocks the options ask for: n_blocks, or what kv_mem holds. */
static tk_status blocks_of(const backend_cpu_opts *o, const tk_kv_opts *ko, int *out) {
    if (o->n_blocks > 0) {
        *out = o->n_blocks;
        return TK_OK;
    }
    size_t bb = kv_block_bytes(ko);
    uint64_t nb = bb ? o->kv_mem / bb : 0;
    if (nb > (1u << 30))
        return tk_fail(TK_ERR_RANGE, "KV pool of %llu blocks is too large", (unsigned long long)nb);
    if (nb < (uint64_t)(o->min_blocks > 1 ? o->min_blocks : 1))
        return tk_fail(
            TK_ERR_NOMEM,
            "kv_mem %zu bytes holds %llu blocks of %d tokens (%zu bytes each); one sequence of context "
            "%d needs %d",
            o->kv_mem, (unsigned long long)nb, o->block_size, bb, o->max_ctx, o->min_blocks);
    *out = (int)nb;
    return TK_OK;
}

tk_status backend_cpu_profile(const backend *be, struct fwd_prof *prof) {
    if (!be || be->destroy != cb_destroy || !be->ctx)
        return tk_fail(TK_ERR_INVALID, "backend: not a CPU backend");
    return fwd_set_profile(((cpu_be *)be->ctx)->fwd, prof);
}

tk_status backend_cpu_row_shares(const backend *be, double *out) {
    if (!be || be->destroy != cb_destroy || !be->ctx || !out)
        return tk_fail(TK_ERR_INVALID, "backend: not a CPU backend");
    fwd_row_shares(((cpu_be *)be->ctx)->fwd, out);
    return TK_OK;
}

tk_status backend_cpu_create(const tk_model *m, const backend_cpu_opts *o, backend *out) {
    if (!out) return tk_fail(TK_ERR_INVALID, "backend: out is NULL");
    memset(out, 0, sizeof *out);
    if (!m || !o) return tk_fail(TK_ERR_INVALID, "backend: NULL model or options");
    if (o->share_pool && o->share_pool->destroy != cb_destroy)
        return tk_fail(TK_ERR_INVALID, "backend: share_pool is not a CPU backend");
    const tk_hparams *hp = model_hparams(m);
    tk_kv_opts ko = {.n_layer = hp->n_layer,
                     .n_head_kv = hp->n_head_kv,
                     .head_dim = hp->head_dim,
                     .block_size = o->block_size,
                     .type = o->kv_type,
                     .scale = o->kv_scale};
    tk_status st = blocks_of(o, &ko, &ko.n_blocks);
    if (st != TK_OK) return st;
    cpu_be *cb = tk_calloc(1, sizeof *cb);
    if (!cb) return tk_fail(TK_ERR_NOMEM, "backend: out of memory");
    int cpus[CPU_LIST_MAX], n_cpus = 0;
    if (o->cpus) st = pool_parse_cpus(o->cpus, cpus, CPU_LIST_MAX, &n_cpus);
    if (st == TK_OK && o->share_pool) {
        cb->pool = ((const cpu_be *)o->share_pool->ctx)->pool;
    } else if (st == TK_OK) {
        st = n_cpus > 0 ? pool_init_cpus(o->n_threads > 0 ? o->n_threads : n_cpus, cpus, n_cpus, &cb->pool)
                        : pool_init(o->n_threads, o->pin_threads, &cb->pool);
        cb->own_pool = st == TK_OK;
    }
    tk_numa nm = {0};
    if (st == TK_OK && o->numa) st = numa_place_weights(m, n_cpus ? cpus : NULL, n_cpus, &nm);
    tk_numa_interleave_begin(&nm); /* the KV and the step's buffers */
    if (st == TK_OK) st = kv_init(&ko, &cb->kv);
    if (st == TK_OK) {
        fwd_opts fo = {.max_tokens = o->max_tokens,
                       .max_seqs = o->max_seqs,
                       .max_ctx = o->max_ctx,
                       .unfused = o->unfused,
                       .even_rows = o->even_rows,
                       .observe = o->observe,
                       .observe_ctx = o->observe_ctx};
        st = fwd_init(m, cb->kv, cb->pool, &fo, &cb->fwd);
    }
    tk_numa_interleave_end(&nm);
    tk_numa_free(&nm);
    if (st != TK_OK) {
        cb_destroy(cb);
        return st;
    }
    *out = (backend){.ctx = cb,
                     .n_vocab = hp->n_vocab,
                     .tok = model_tokenizer(m),
                     .weight_dtype = model_weight_dtype(m),
                     .n_threads = pool_size(cb->pool),
                     .model_id = model_id_of(m),
                     .n_blocks = ko.n_blocks,
                     .block_size = ko.block_size,
                     .kv_type = ko.type,
                     .kv_scale = ko.scale,
                     .kv_bytes_per_token = kv_bytes_per_token(&ko),
                     .max_tokens = o->max_tokens,
                     .max_seqs = o->max_seqs,
                     .max_ctx = o->max_ctx,
                     .block_alloc = cb_alloc,
                     .block_free = cb_free,
                     .blocks_free = cb_n_free,
                     .block_ref = cb_ref,
                     .block_refs = cb_refs,
                     .block_copy = cb_copy,
                     .step = cb_step,
                     .last_bytes = cb_bytes,
                     .last_floor_terms = cb_floor_terms,
                     .kv_read = cb_kv_read,
                     .run_each = cb_run_each,
                     .destroy = cb_destroy};
    return TK_OK;
}
