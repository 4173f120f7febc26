/* The bench driver: closed-loop or Poisson load over one engine per series,
 * with a stats poller that samples decode steps for the roofline.
 *
 * Threads: the engine's loop thread runs the callbacks, which write only their
 * own request's slot and, under ctx->mu, the finish count; this thread submits,
 * polls tk_engine_stats_get and reads a slot only after its finish was seen
 * under the same mutex. */
#include "bench/bench.h"

#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

#include "bench/probe.h"
#include "core/alloc.h"
#include "core/checked.h"
#include "core/dtype.h"
#include "core/error.h"
#include "core/names.h"

/* No new token, step or finish for this long means the engine is stuck. */
#define BENCH_STALL_S    120.0
#define BENCH_WARMUP_OUT 16

typedef struct bench_ctx bench_ctx;

typedef struct bench_slot {
    bench_ctx *ctx;
    double *tok_t;   /* (cap) tk_now_s() of each token event */
    int cap, n_tok;  /* n_tok counts every event, even past cap */
    double t_submit; /* absolute */
    tk_finish finish;
    tk_request_times times;
    bool done;
} bench_slot;

struct bench_ctx {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int n_done;       /* finishes seen since the last reset (under mu) */
    int n_first;      /* requests that produced a token since the last reset (under mu) */
    bench_slot *slot; /* (n_slot) */
    int n_slot;
    double *tok_store; /* (n_slot * cap) */
    int32_t *prompt;   /* (n_in) scratch for one prompt */
    int n_vocab;
};

static void on_token(void *user, const tk_token_event *ev) {
    bench_slot *s = user;
    if (s->n_tok < s->cap) s->tok_t[s->n_tok] = ev->t;
    /* The first token is announced (once per request) so that a mixed run can
     * wait until every background stream decodes. */
    if (s->n_tok++ == 0) {
        bench_ctx *c = s->ctx;
        pthread_mutex_lock(&c->mu);
        c->n_first++;
        pthread_cond_signal(&c->cv);
        pthread_mutex_unlock(&c->mu);
    }
}

static void on_finish(void *user, const tk_finish_event *ev) {
    bench_slot *s = user;
    bench_ctx *c = s->ctx;
    pthread_mutex_lock(&c->mu);
    s->finish = ev->reason;
    s->times = ev->times;
    s->done = true;
    c->n_done++;
    pthread_cond_signal(&c->cv);
    pthread_mutex_unlock(&c->mu);
}

uint64_t bench_splitmix64(uint64_t *x) {
    uint64_t z = (*x += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

double bench_rand_unit(uint64_t *x) {
    return ((double)(bench_splitmix64(x) >> 11) + 1.0) / 9007199254740992.0;
}

void bench_opts_default(bench_opts *o) {
    memset(o, 0, sizeof *o);
    o->n_in = 512;
    o->n_out = 512;
    static const int levels[] = {1, 4, 8, 16, 32};
    for (int i = 0; i < 5; i++) o->levels[i] = levels[i];
    o->n_levels = 5;
    o->warmup = 1;
    o->repeat = 1;
    o->requests_x = 2;
    o->seed = 1234;
    tk_model_opts_default(&o->model);
    tk_engine_opts_default(&o->engine);
    o->git_commit = "unknown";
    o->bg_in = 128;
    o->bg_out = 2048;
}

static void ctx_free(bench_ctx *c) {
    if (!c) return;
    pthread_cond_destroy(&c->cv);
    pthread_mutex_destroy(&c->mu);
    tk_free(c->slot);
    tk_free(c->tok_store);
    tk_free(c->prompt);
    tk_free(c);
}

static tk_status ctx_new(int n_slot, int n_out, int n_in, int n_vocab, bench_ctx **out) {
    *out = NULL;
    bench_ctx *c = tk_calloc(1, sizeof *c);
    if (!c) return tk_fail(TK_ERR_NOMEM, "bench: no memory for the request table");
    pthread_condattr_t ca;
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    pthread_mutex_init(&c->mu, NULL);
    pthread_cond_init(&c->cv, &ca);
    pthread_condattr_destroy(&ca);
    int cap = n_out + 1;
    size_t n_tok;
    if (!tk_mul_size((size_t)n_slot, (size_t)cap, &n_tok)) {
        ctx_free(c);
        return tk_fail(TK_ERR_RANGE, "bench: %d requests x %d tokens overflow", n_slot, cap);
    }
    c->slot = tk_calloc((size_t)n_slot, sizeof *c->slot);
    c->tok_store = tk_calloc(n_tok, sizeof(double));
    c->prompt = tk_calloc((size_t)n_in, sizeof(int32_t));
    if (!c->slot || !c->tok_store || !c->prompt) {
        ctx_free(c);
        return tk_fail(TK_ERR_NOMEM, "bench: no memory for %d requests of %d tokens", n_slot, cap);
    }
    c->n_slot = n_slot;
    c->n_vocab = n_vocab;
    for (int i = 0; i < n_slot; i++) {
        c->slot[i].ctx = c;
        c->slot[i].cap = cap;
        c->slot[i].tok_t = c->tok_store + (size_t)i * (size_t)cap;
    }
    *out = c;
    return TK_OK;
}

static void ctx_reset(bench_ctx *c) {
    pthread_mutex_lock(&c->mu);
    c->n_done = 0;
    c->n_first = 0;
    for (int i = 0; i < c->n_slot; i++) {
        bench_slot *s = &c->slot[i];
        s->n_tok = 0, s->done = false, s->finish = TK_FINISH_NONE;
        memset(&s->times, 0, sizeof s->times);
    }
    pthread_mutex_unlock(&c->mu);
}

/* One run of a level: what to send and how. */
typedef struct level_plan {
    int n_requests, concurrency; /* concurrency 0: rate mode */
    double rate;
    int n_in, n_out;
    uint64_t seed; /* prompts and arrivals of this run */
    double read_bw_gbs, read_bw_median_gbs;
    double peak_gops[TK_FLOOR_PEAKS];
    bool measure; /* false for the warm-up */
} level_plan;

static tk_status submit_one(tk_engine *e, bench_ctx *c, const level_plan *p, int idx, uint64_t *id) {
    uint64_t x = p->seed ^ (0x51ed270b27a1c3f5ull * (uint64_t)(idx + 1));
    for (int i = 0; i < p->n_in; i++) c->prompt[i] = (int32_t)(bench_splitmix64(&x) % (uint64_t)c->n_vocab);
    tk_request r;
    tk_request_default(&r);
    r.prompt = c->prompt;
    r.n_prompt = p->n_in;
    r.max_tokens = p->n_out;
    r.ignore_eos = true; /* exact lengths: a model that stops early would look fast */
    r.sampling.temperature = 0;
    r.on_token = on_token;
    r.on_finish = on_finish;
    r.user = &c->slot[idx];
    c->slot[idx].t_submit = tk_now_s();
    return tk_engine_submit(e, &r, id);
}

/* Wait for in-flight requests after a failure so no callback outlives the slots. */
static void drain(bench_ctx *c, int submitted) {
    double t_end = tk_now_s() + BENCH_STALL_S;
    pthread_mutex_lock(&c->mu);
    while (c->n_done < submitted && tk_now_s() < t_end) {
        struct timespec ts;
        clock_gettime(CLOCK_MONOTONIC, &ts);
        ts.tv_nsec += 10000000;
        if (ts.tv_nsec >= 1000000000) ts.tv_sec++, ts.tv_nsec -= 1000000000;
        pthread_cond_timedwait(&c->cv, &c->mu, &ts);
    }
    pthread_mutex_unlock(&c->mu);
}

static tk_status steps_push(bench_level *l, size_t *cap, const bench_step *s) {
    if (l->n_steps == *cap) {
        size_t ncap = *cap ? *cap * 2 : 256, bytes;
        if (!tk_mul_size(ncap, sizeof *l->steps, &bytes))
            return tk_fail(TK_ERR_RANGE, "bench: too many steps");
        bench_step *ns = tk_realloc(l->steps, bytes);
        if (!ns) return tk_fail(TK_ERR_NOMEM, "bench: no memory for %zu step samples", ncap);
        l->steps = ns;
        *cap = ncap;
    }
    l->steps[l->n_steps++] = *s;
    return TK_OK;
}

/* Copy the slots of a finished run into l's raw samples. */
static tk_status level_collect(bench_ctx *c, const level_plan *p, double t0, bench_level *l) {
    l->req = tk_calloc((size_t)p->n_requests, sizeof *l->req);
    size_t n_itl = 0;
    for (int i = 0; i < p->n_requests; i++) {
        int k = c->slot[i].n_tok < c->slot[i].cap ? c->slot[i].n_tok : c->slot[i].cap;
        n_itl += k > 1 ? (size_t)(k - 1) : 0;
    }
    l->itl = n_itl ? tk_calloc(n_itl, sizeof(double)) : NULL;
    if (!l->req || (n_itl && !l->itl)) return tk_fail(TK_ERR_NOMEM, "bench: no memory for the samples");
    l->n_requests = p->n_requests;
    l->n_asked_out = p->n_out;
    double t_end = t0;
    for (int i = 0; i < p->n_requests; i++) {
        const bench_slot *s = &c->slot[i];
        bench_request *r = &l->req[i];
        int k = s->n_tok < s->cap ? s->n_tok : s->cap;
        bench_request_fill(r, t0, s->t_submit, s->tok_t, k, l->itl ? l->itl + l->n_itl : NULL);
        r->itl_off = l->n_itl;
        l->n_itl += k > 1 ? (size_t)(k - 1) : 0;
        /* Events past the buffer still count: more tokens than asked is flagged too. */
        r->n_output = s->n_tok;
        r->n_prompt = p->n_in;
        r->n_preempted = s->times.n_preempted;
        r->finish = s->finish;
        double fin = k ? s->tok_t[k - 1] : s->t_submit;
        if (s->times.finished > fin) fin = s->times.finished;
        if (fin > t_end) t_end = fin;
    }
    l->t_start = 0;
    l->t_end = t_end - t0;
    return TK_OK;
}

static tk_status level_run(tk_engine *e, bench_ctx *c, const level_plan *p, bench_level *l) {
    memset(l, 0, sizeof *l);
    l->concurrency = p->concurrency;
    l->rate = p->rate;
    l->read_bw_gbs = p->read_bw_gbs;
    l->read_bw_median_gbs = p->read_bw_median_gbs;
    memcpy(l->peak_gops, p->peak_gops, sizeof l->peak_gops);
    ctx_reset(c);
    tk_engine_stats prev, cur;
    tk_status st = tk_engine_stats_get(e, &prev);
    if (st != TK_OK) return st;
    l->kv_blocks_total = prev.kv_blocks_total;
    l->block_size = prev.block_size;
    l->kv_bytes_per_token = prev.kv_bytes_per_token;
    uint64_t seen_step = prev.steps; /* the last step whose record was read */
    size_t steps_cap = 0;
    uint64_t arrivals = p->seed ^ 0xa5a5a5a5deadbeefull;
    double t0 = tk_now_s(), next_arrival = t0, last_progress = t0;
    l->t_origin = t0;
    int submitted = 0, seen_done = 0;
    while (seen_done < p->n_requests) {
        double now = tk_now_s();
        /* Submit what the mode allows now; FULL means retry on the next poll. */
        while (submitted < p->n_requests) {
            if (p->concurrency > 0 ? submitted - seen_done >= p->concurrency : now < next_arrival) break;
            uint64_t id;
            st = submit_one(e, c, p, submitted, &id);
            if (st == TK_ERR_FULL) break;
            if (st != TK_OK) {
                tk_error_prefix("bench: submit %d", submitted);
                drain(c, submitted);
                return st;
            }
            submitted++;
            if (p->concurrency == 0) next_arrival += -log(bench_rand_unit(&arrivals)) / p->rate;
        }
        /* Sleep until a finish or 1 ms: fine enough to see each decode step of
         * a real model, cheap enough not to steal the engine's cores. */
        pthread_mutex_lock(&c->mu);
        if (c->n_done == seen_done) {
            struct timespec ts;
            clock_gettime(CLOCK_MONOTONIC, &ts);
            ts.tv_nsec += 1000000;
            if (ts.tv_nsec >= 1000000000) ts.tv_sec++, ts.tv_nsec -= 1000000000;
            pthread_cond_timedwait(&c->cv, &c->mu, &ts);
        }
        int done = c->n_done;
        pthread_mutex_unlock(&c->mu);
        if (done != seen_done) last_progress = tk_now_s();
        seen_done = done;

        st = tk_engine_stats_get(e, &cur);
        if (st != TK_OK) {
            drain(c, submitted);
            return st;
        }
        if (cur.kv_blocks_used > l->kv_blocks_peak) l->kv_blocks_peak = cur.kv_blocks_used;
        if (cur.steps != prev.steps) last_progress = tk_now_s();
        /* Every step since the last poll from the engine's log; the pure
         * decode ones (no prompt token, tokens out) are the roofline's. */
        while (p->measure && seen_step < cur.steps) {
            tk_step_record rec[64];
            const int nr = tk_engine_step_log(e, seen_step, rec, 64);
            if (nr <= 0) break;
            for (int i = 0; i < nr; i++) {
                seen_step = rec[i].step;
                if (!tk_step_is_decode(&rec[i])) continue;
                bench_step s = {.t = tk_now_s() - t0,
                                .bytes = rec[i].bytes,
                                .time = rec[i].seconds,
                                .running = rec[i].n_seqs};
                memcpy(s.terms, rec[i].floor_terms, sizeof s.terms);
                st = steps_push(l, &steps_cap, &s);
                if (st != TK_OK) {
                    drain(c, submitted);
                    return st;
                }
            }
        }
        prev = cur;
        if (tk_now_s() - last_progress > BENCH_STALL_S) {
            drain(c, submitted);
            return tk_fail(TK_ERR_INTERNAL,
                           "bench: engine made no progress for %.0f s (%d of %d requests done)",
                           BENCH_STALL_S, seen_done, p->n_requests);
        }
    }
    if (!p->measure) return TK_OK;
    st = level_collect(c, p, t0, l);
    if (st == TK_OK) st = bench_level_finalize(l);
    return st;
}

/* ---- background streams (mixed load) -------------------------------------- */

/* Wait for a condition-variable event or 10 ms. Caller holds c->mu. */
static void wait_tick(bench_ctx *c) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    ts.tv_nsec += 10000000;
    if (ts.tv_nsec >= 1000000000) ts.tv_sec++, ts.tv_nsec -= 1000000000;
    pthread_cond_timedwait(&c->cv, &c->mu, &ts);
}

/* Submit the n streams of bgc and return once every one has its first token:
 * the measured window must see them decoding, not prefilling. */
static tk_status bg_start(tk_engine *e, bench_ctx *bgc, const level_plan *bp, uint64_t *ids) {
    ctx_reset(bgc);
    int n = bp->n_requests;
    for (int i = 0; i < n; i++) {
        tk_status st = submit_one(e, bgc, bp, i, &ids[i]);
        if (st != TK_OK) {
            tk_error_prefix("bench: background stream %d", i);
            for (int k = 0; k < i; k++) tk_engine_cancel(e, ids[k]);
            drain(bgc, i);
            return st;
        }
    }
    double last_progress = tk_now_s();
    int seen = 0;
    pthread_mutex_lock(&bgc->mu);
    while (bgc->n_first < n && bgc->n_done == 0 && tk_now_s() - last_progress < BENCH_STALL_S) {
        wait_tick(bgc);
        if (bgc->n_first != seen) seen = bgc->n_first, last_progress = tk_now_s();
    }
    int first = bgc->n_first, done = bgc->n_done;
    pthread_mutex_unlock(&bgc->mu);
    if (first == n && done == 0) return TK_OK;
    for (int k = 0; k < n; k++) tk_engine_cancel(e, ids[k]);
    drain(bgc, n);
    if (done > 0)
        return tk_fail(TK_ERR_INTERNAL,
                       "bench: a background stream finished before all %d decoded (--bg-out %d)", n,
                       bp->n_out);
    return tk_fail(TK_ERR_INTERNAL, "bench: only %d of %d background streams decoded after %.0f s", first, n,
                   BENCH_STALL_S);
}

/* Cancel the streams, wait for their finishes, and keep what they did inside
 * the foreground window of l (its first submit to its last finish). */
static tk_status bg_stop(tk_engine *e, bench_ctx *bgc, const level_plan *bp, const uint64_t *ids,
                         bench_level *l) {
    int n = bp->n_requests;
    for (int i = 0; i < n; i++) tk_engine_cancel(e, ids[i]); /* NOT_FOUND: it already stopped */
    drain(bgc, n);
    pthread_mutex_lock(&bgc->mu);
    int done = bgc->n_done;
    pthread_mutex_unlock(&bgc->mu);
    if (done < n)
        return tk_fail(TK_ERR_INTERNAL, "bench: %d of %d background streams did not finish after cancel",
                       n - done, n);
    bench_bg *b = &l->bg;
    size_t n_gap = 0;
    for (int i = 0; i < n; i++) {
        int k = bgc->slot[i].n_tok < bgc->slot[i].cap ? bgc->slot[i].n_tok : bgc->slot[i].cap;
        n_gap += k > 1 ? (size_t)(k - 1) : 0;
    }
    b->stream = tk_calloc((size_t)n, sizeof *b->stream);
    b->itl = n_gap ? tk_calloc(n_gap, sizeof(double)) : NULL;
    if (!b->stream || (n_gap && !b->itl))
        return tk_fail(TK_ERR_NOMEM, "bench: no memory for background samples");
    b->n_streams = n;
    b->n_prompt = bp->n_in;
    b->w0 = 0;
    b->w1 = l->t_end;
    double w0 = l->t_origin, w1 = l->t_origin + l->t_end;
    for (int i = 0; i < n; i++) {
        const bench_slot *s = &bgc->slot[i];
        bench_bg_stream *q = &b->stream[i];
        int k = s->n_tok < s->cap ? s->n_tok : s->cap;
        q->itl_off = b->n_itl;
        q->n_window =
            (int)bench_window_gaps(s->tok_t, k, w0, w1, b->itl ? b->itl + b->n_itl : NULL, &q->tpot);
        b->n_itl += (size_t)q->n_window;
        q->n_output = s->n_tok;
        q->n_preempted = s->times.n_preempted;
        q->finish = s->finish;
        /* Stopped on its own inside the window: the window saw fewer streams. */
        double last = k ? s->tok_t[k - 1] : s->t_submit;
        if (s->finish != TK_FINISH_CANCELLED && last <= w1) b->exhausted = true;
    }
    return bench_bg_finalize(l);
}

/* One measured run, with the background streams around it in a mixed run. */
static tk_status measured_run(tk_engine *e, bench_ctx *c, bench_ctx *bgc, const level_plan *p,
                              const level_plan *bp, uint64_t *ids, bench_level *l) {
    if (!bgc) return level_run(e, c, p, l);
    tk_status st = bg_start(e, bgc, bp, ids);
    if (st != TK_OK) {
        memset(l, 0, sizeof *l);
        return st;
    }
    st = level_run(e, c, p, l);
    tk_status st2 = st == TK_OK ? bg_stop(e, bgc, bp, ids, l) : TK_OK;
    if (st != TK_OK) {
        for (int i = 0; i < bp->n_requests; i++) tk_engine_cancel(e, ids[i]);
        drain(bgc, bp->n_requests);
    }
    return st != TK_OK ? st : st2;
}

/* ---- series ---------------------------------------------------------------- */

typedef struct series_spec {
    const char *label;
    tk_weight_type repack, repack_output; /* tk_model_opts at load */
    tk_kv_type kv_type;
    bool unfused, static_batching, no_chunking;
    bool check;                    /* the engine must report exactly these settings */
    const char *want_weight_dtype; /* NULL: any */
} series_spec;

/* The engine must run what the series asked for, or the rung's label lies. */
static tk_status check_config(const series_spec *sp, const tk_engine_stats *s) {
    if (s->kv_type != sp->kv_type)
        return tk_fail(TK_ERR_INTERNAL, "bench: '%s' asked for KV %s, the engine runs %s", sp->label,
                       names_str(&NAMES_KV_TYPE, (int)sp->kv_type),
                       names_str(&NAMES_KV_TYPE, (int)s->kv_type));
    if (s->unfused != sp->unfused || s->static_batching != sp->static_batching ||
        s->no_chunking != sp->no_chunking)
        return tk_fail(TK_ERR_INTERNAL,
                       "bench: '%s' asked for unfused=%d static=%d no_chunking=%d, the engine runs %d %d %d",
                       sp->label, sp->unfused, sp->static_batching, sp->no_chunking, s->unfused,
                       s->static_batching, s->no_chunking);
    if (sp->want_weight_dtype && (!s->weight_dtype || strcmp(s->weight_dtype, sp->want_weight_dtype) != 0))
        return tk_fail(TK_ERR_INTERNAL, "bench: '%s' asked for %s weights, the engine runs %s", sp->label,
                       sp->want_weight_dtype, s->weight_dtype ? s->weight_dtype : "(none)");
    return TK_OK;
}

static int max_level(const bench_opts *o) {
    int m = 1;
    for (int i = 0; i < o->n_levels; i++)
        if (o->levels[i] > m) m = o->levels[i];
    return m;
}

static int level_requests(const bench_opts *o, int level) {
    if (o->requests > 0) return o->requests;
    int x = o->requests_x > 0 ? o->requests_x : 2;
    return level > 0 ? x * level : 16;
}

/* Repeats [r0, r1) of every level of one series, in one engine of its own
 * (warm-up first). The first call allocates the levels' repeats; a later call
 * for the same series fills the next ones (the ladder's rounds). */
static tk_status series_run(const bench_opts *o, const series_spec *sp, const tk_model *m, bench_info *info,
                            bench_series *out, int r0, int r1) {
    snprintf(out->label, sizeof out->label, "%s", sp->label);
    out->repack = sp->repack;
    out->repack_output = sp->repack_output;
    tk_engine_opts eo = o->engine;
    eo.kv_type = sp->kv_type;
    eo.unfused = sp->unfused;
    eo.static_batching = sp->static_batching;
    eo.no_chunking = sp->no_chunking;
    tk_engine *e = NULL;
    tk_status st = tk_engine_create(m, &eo, &e);
    if (st != TK_OK) {
        tk_error_prefix("bench: %s", sp->label);
        return st;
    }
    bench_ctx *c = NULL;
    st = tk_engine_stats_get(e, &out->engine);
    if (st == TK_OK) {
        snprintf(out->weight_dtype, sizeof out->weight_dtype, "%s",
                 out->engine.weight_dtype ? out->engine.weight_dtype : "");
        out->engine.weight_dtype = NULL; /* owned by the model, which dies first */
        tk_engine_stats tmp = out->engine;
        tmp.weight_dtype = out->weight_dtype;
        if (sp->check) st = check_config(sp, &tmp);
    }
    int n_points = o->n_rates > 0 ? o->n_rates : o->n_levels;
    int max_req = o->warmup;
    for (int i = 0; i < n_points; i++) {
        int r = level_requests(o, o->n_rates > 0 ? 0 : o->levels[i]);
        if (r > max_req) max_req = r;
    }
    tk_model_info mi;
    tk_model_get_info(m, &mi);
    if (st == TK_OK) st = ctx_new(max_req, o->n_out, o->n_in, mi.n_vocab, &c);
    bench_ctx *bgc = NULL;
    uint64_t *bg_ids = NULL;
    if (st == TK_OK && o->n_bg > 0) {
        st = ctx_new(o->n_bg, o->bg_out, o->bg_in, mi.n_vocab, &bgc);
        bg_ids = tk_calloc((size_t)o->n_bg, sizeof *bg_ids);
        if (st == TK_OK && !bg_ids) st = tk_fail(TK_ERR_NOMEM, "bench: no memory for %d stream ids", o->n_bg);
    }
    if (st == TK_OK && o->warmup > 0) {
        level_plan wp = {.n_requests = o->warmup,
                         .concurrency = o->warmup < max_level(o) ? o->warmup : max_level(o),
                         .n_in = o->n_in,
                         .n_out = o->n_out < BENCH_WARMUP_OUT ? o->n_out : BENCH_WARMUP_OUT,
                         .seed = o->seed ^ 0x77,
                         .measure = false};
        bench_level scratch;
        st = level_run(e, c, &wp, &scratch);
        bench_level_free(&scratch);
    }
    if (st == TK_OK && !out->points) {
        out->points = tk_calloc((size_t)n_points, sizeof *out->points);
        if (!out->points) st = tk_fail(TK_ERR_NOMEM, "bench: no memory for %d points", n_points);
    }
    for (int i = 0; st == TK_OK && i < n_points; i++) {
        bench_point *pt = &out->points[i];
        if (out->n_points < i + 1) out->n_points = i + 1;
        pt->concurrency = o->n_rates > 0 ? 0 : o->levels[i];
        pt->rate = o->n_rates > 0 ? o->rates[i] : 0;
        if (!pt->rep) pt->rep = tk_calloc((size_t)o->repeat, sizeof *pt->rep);
        if (!pt->rep) {
            st = tk_fail(TK_ERR_NOMEM, "bench: no memory for %d repeats", o->repeat);
            break;
        }
        for (int r = r0; st == TK_OK && r < r1; r++) {
            level_plan lp = {.n_requests = level_requests(o, pt->concurrency),
                             .concurrency = pt->concurrency,
                             .rate = pt->rate,
                             .n_in = o->n_in,
                             .n_out = o->n_out,
                             .seed = o->seed + 1000003ull * (uint64_t)(i + 1) + 7919ull * (uint64_t)r,
                             .read_bw_gbs = info->read_bw_gbs,
                             .read_bw_median_gbs = info->read_bw_median_gbs,
                             .peak_gops = {[TK_FLOOR_F32] = info->peak_gflops_f32,
                                           [TK_FLOOR_INT8] = info->peak_gops_int8,
                                           [TK_FLOOR_BF16] = info->peak_gflops_bf16},
                             .measure = true};
            level_plan bp = {.n_requests = o->n_bg,
                             .concurrency = o->n_bg,
                             .n_in = o->bg_in,
                             .n_out = o->bg_out,
                             .seed = lp.seed ^ 0xb6b6b6b6ull,
                             .measure = true};
            st = measured_run(e, c, bgc, &lp, &bp, bg_ids, &pt->rep[r]);
            pt->n_rep = r + 1;
            if (st == TK_OK && !o->quiet) {
                const bench_level *l = &pt->rep[r];
                /* one output token has no TPOT, and a run without a decode-only
                 * step no roofline: a dash, not nan */
                char tpot[32], roof[48];
                if (isnan(l->m[BM_TPOT_P50]))
                    snprintf(tpot, sizeof tpot, "-");
                else
                    snprintf(tpot, sizeof tpot, "%.2f ms", l->m[BM_TPOT_P50]);
                if (isnan(l->m[BM_ROOF_PCT]))
                    snprintf(roof, sizeof roof, "- (no decode step sampled)");
                else
                    snprintf(roof, sizeof roof, "%.1f%%", l->m[BM_ROOF_PCT]);
                fprintf(stderr,
                        "bench: %s %s %g rep %d/%d: TPOT p50 %s, %.1f out tok/s, TTFT p50 %.1f ms, "
                        "roofline %s\n",
                        sp->label, pt->rate > 0 ? "rate" : "concurrency",
                        pt->rate > 0 ? pt->rate : (double)pt->concurrency, r + 1, o->repeat, tpot,
                        l->m[BM_OUT_TOK_S], l->m[BM_TTFT_P50], roof);
                if (l->bg.n_streams > 0)
                    fprintf(stderr,
                            "bench:   background %d streams: ITL p50 %.2f p99 %.2f max %.2f ms, TPOT p50 "
                            "%.2f p99 "
                            "%.2f ms%s\n",
                            l->bg.n_streams, l->m[BM_BG_ITL_P50], l->m[BM_BG_ITL_P99], l->m[BM_BG_ITL_MAX],
                            l->m[BM_BG_TPOT_P50], l->m[BM_BG_TPOT_P99],
                            l->bg.exhausted ? " (a stream ran out inside the window: raise --bg-out)" : "");
            }
        }
        bench_point_summarize(pt);
    }
    /* The step budget's cost estimates as the runs left them (the rest of
     * out->engine is the configuration, read at create). */
    tk_engine_stats end;
    if (tk_engine_stats_get(e, &end) == TK_OK) {
        out->engine.step_fixed_ms = end.step_fixed_ms;
        out->engine.decode_ms_per_token = end.decode_ms_per_token;
        out->engine.prefill_ms_per_token = end.prefill_ms_per_token;
        out->engine.prefill_ms_per_kpos = end.prefill_ms_per_kpos;
    }
    /* The engine first: its shutdown fires the callbacks of anything still live. */
    tk_engine_free(e);
    ctx_free(c);
    ctx_free(bgc);
    tk_free(bg_ids);
    return st;
}

/* The model with the user's options (mapping, layouts), the series' types. */
static tk_status open_model(const char *path, const tk_model_opts *user, const series_spec *sp,
                            bench_info *info, tk_model **m) {
    tk_model_opts mo = *user;
    mo.repack = sp->repack;
    mo.repack_output = sp->repack_output;
    tk_status st = tk_model_open(path, &mo, m);
    if (st != TK_OK) return st;
    tk_model_info mi;
    tk_model_get_info(*m, &mi);
    if (info->model_name[0] == 0) {
        snprintf(info->model_name, sizeof info->model_name, "%s", mi.name ? mi.name : "");
        snprintf(info->model_arch, sizeof info->model_arch, "%s", mi.arch ? mi.arch : "");
        snprintf(info->model_dtype, sizeof info->model_dtype, "%s", mi.weight_dtype ? mi.weight_dtype : "");
        info->n_params = mi.n_params;
        info->weight_bytes = mi.weight_bytes;
        info->decode_bytes = mi.decode_bytes;
        info->kv_bytes_per_token = mi.kv_bytes_per_token;
    }
    return TK_OK;
}

static tk_status check_opts(const bench_opts *o) {
    if (!o->model_path) return tk_fail(TK_ERR_INVALID, "bench: no model (-m)");
    if (o->n_in < 1 || o->n_out < 1)
        return tk_fail(TK_ERR_INVALID, "bench: --in %d / --out %d must be >= 1", o->n_in, o->n_out);
    if (o->n_in > (1 << 24) || o->n_out > (1 << 24))
        return tk_fail(TK_ERR_RANGE, "bench: --in %d / --out %d past 16M tokens", o->n_in, o->n_out);
    if (o->n_rates == 0 && o->n_levels < 1) return tk_fail(TK_ERR_INVALID, "bench: no --batch levels");
    for (int i = 0; i < o->n_levels; i++)
        if (o->levels[i] < 1 || o->levels[i] > 4096)
            return tk_fail(TK_ERR_RANGE, "bench: --batch level %d is not in 1..4096", o->levels[i]);
    for (int i = 0; i < o->n_rates; i++)
        if (!(o->rates[i] > 0) || o->rates[i] > 1e6)
            return tk_fail(TK_ERR_RANGE, "bench: --rate %g is not in (0, 1e6]", o->rates[i]);
    if (o->repeat < 1 || o->repeat > 64)
        return tk_fail(TK_ERR_RANGE, "bench: --repeat %d not in 1..64", o->repeat);
    if (o->requests < 0 || o->requests > 1000000)
        return tk_fail(TK_ERR_RANGE, "bench: --requests %d not in 0..1000000", o->requests);
    if (o->requests_x < 0 || o->requests_x > 1000)
        return tk_fail(TK_ERR_RANGE, "bench: --requests %dx not in 1x..1000x", o->requests_x);
    if (o->warmup < 0 || o->warmup > 10000)
        return tk_fail(TK_ERR_RANGE, "bench: --warmup %d not in 0..10000", o->warmup);
    if (o->n_bg < 0 || o->n_bg > 4096)
        return tk_fail(TK_ERR_RANGE, "bench: --background %d not in 0..4096", o->n_bg);
    if (o->n_bg > 0) {
        if (o->bg_in < 1 || o->bg_in > (1 << 24))
            return tk_fail(TK_ERR_RANGE, "bench: --bg-in %d not in 1..%d", o->bg_in, 1 << 24);
        /* Two tokens at least: the first proves a stream decodes, the rest are measured. */
        if (o->bg_out < 2 || o->bg_out > (1 << 24))
            return tk_fail(TK_ERR_RANGE, "bench: --bg-out %d not in 2..%d", o->bg_out, 1 << 24);
        if (o->ablation)
            return tk_fail(TK_ERR_INVALID, "bench: --background measures one configuration, not --ablation");
    }
    return TK_OK;
}

tk_status bench_run(const bench_opts *o, bench_result *out) {
    memset(out, 0, sizeof *out);
    tk_status st = check_opts(o);
    if (st != TK_OK) return st;
    out->opts = *o;
    bench_opts *ro = &out->opts;
    bench_info *info = &out->info;
    /* Size the engine for the run unless told otherwise: every sequence needs
     * n_in + n_out positions, and the largest level must run at once. */
    if (!ro->engine_ctx_set) {
        ro->engine.ctx = ro->n_in + ro->n_out + 1;
        /* A background stream needs its whole prompt + output window too. */
        if (ro->n_bg > 0 && ro->bg_in + ro->bg_out + 1 > ro->engine.ctx)
            ro->engine.ctx = ro->bg_in + ro->bg_out + 1;
    }
    /* Closed-loop levels never run more than the largest at once: the KV
     * pool (max-batch x ctx by default) is sized for that, not for the
     * engine's default 32 (at --in 2048 that was 7.5 GB of F16 KV for one
     * sequence, and seconds of page faults before the first request). */
    if (!ro->engine_max_batch_set && ro->n_rates == 0) ro->engine.max_batch = max_level(ro);
    /* The background streams run beside the foreground: room for both (16
     * foreground slots in rate mode, where arrivals bound nothing). */
    if (!ro->engine_max_batch_set && ro->n_bg > 0) {
        int need = ro->n_bg + (ro->n_rates > 0 ? 16 : max_level(ro));
        if (need > ro->engine.max_batch) ro->engine.max_batch = need;
    }
    snprintf(info->git_commit, sizeof info->git_commit, "%s", o->git_commit ? o->git_commit : "unknown");
    snprintf(info->model_path, sizeof info->model_path, "%s", o->model_path);
    time_t now = time(NULL);
    struct tm tmv;
    gmtime_r(&now, &tmv);
    strftime(info->date, sizeof info->date, "%Y-%m-%dT%H:%M:%SZ", &tmv);

    /* Probe before any engine exists, on as many threads as the engine uses. */
    if (!o->quiet) fprintf(stderr, "bench: probing the machine...\n");
    bench_probe_machine(ro->engine.n_threads, info);

    series_spec specs[BENCH_MAX_SERIES];
    int n_specs = 0;
    if (!o->ablation) {
        specs[n_specs++] = (series_spec){.label = "run",
                                         .repack = o->model.repack,
                                         .repack_output = o->model.repack_output,
                                         .kv_type = o->engine.kv_type,
                                         .unfused = o->engine.unfused,
                                         .static_batching = o->engine.static_batching,
                                         .no_chunking = o->engine.no_chunking,
                                         .check = true};
    } else {
        /* The ladder: each rung adds one optimisation to the one before. */
        const series_spec ladder[] = {
            {.label = "1 bf16 weights, bf16 KV, unfused, static",
             .kv_type = TK_KV_BF16,
             .unfused = true,
             .static_batching = true,
             .no_chunking = true,
             .want_weight_dtype = "bf16"},
            {.label = "2 int8 weights (W8A8)",
             .repack = TK_WEIGHTS_Q8_0,
             .kv_type = TK_KV_BF16,
             .unfused = true,
             .static_batching = true,
             .no_chunking = true,
             .want_weight_dtype = "q8_0"},
            {.label = "3 + int8 KV",
             .repack = TK_WEIGHTS_Q8_0,
             .kv_type = TK_KV_INT8,
             .unfused = true,
             .static_batching = true,
             .no_chunking = true,
             .want_weight_dtype = "q8_0"},
            {.label = "4 + fused kernels",
             .repack = TK_WEIGHTS_Q8_0,
             .kv_type = TK_KV_INT8,
             .static_batching = true,
             .no_chunking = true,
             .want_weight_dtype = "q8_0"},
            {.label = "5 + continuous batching, chunked prefill",
             .repack = TK_WEIGHTS_Q8_0,
             .kv_type = TK_KV_INT8,
             .want_weight_dtype = "q8_0"},
            {.label = "6 + 4-bit weights (W4A8), 8-bit output layer",
             .repack = TK_WEIGHTS_Q4_0,
             .repack_output = TK_WEIGHTS_Q8_0,
             .kv_type = TK_KV_INT8,
             .want_weight_dtype = "q4_0"},
        };
        for (size_t i = 0; i < sizeof ladder / sizeof ladder[0]; i++) {
            specs[n_specs] = ladder[i];
            specs[n_specs++].check = true;
        }
    }
    /* One configuration runs its repeats one after another. The ladder runs
     * in rounds, one repeat of every rung a round, in reverse order every
     * other round, so that a machine whose speed drifts during the ladder
     * (this project's VMs' memory does, by 2x within an hour) weighs on every
     * rung alike; its speed-ups are the medians of the rounds' ratios. */
    const int rounds = o->ablation ? o->repeat : 1, per_round = o->ablation ? 1 : o->repeat;
    tk_model *m = NULL;
    const series_spec *loaded = NULL;
    for (int r = 0; st == TK_OK && r < rounds; r++)
        for (int k = 0; k < n_specs; k++) {
            const int i = r % 2 ? n_specs - 1 - k : k;
            if (!loaded || specs[i].repack != loaded->repack ||
                specs[i].repack_output != loaded->repack_output) {
                tk_model_free(m);
                m = NULL;
                loaded = NULL;
                if (!o->quiet) fprintf(stderr, "bench: loading %s\n", o->model_path);
                st = open_model(o->model_path, &o->model, &specs[i], info, &m);
                if (st != TK_OK) break;
                loaded = &specs[i];
                if (o->ablation && r == 0 && k == 0 && strcmp(info->model_dtype, "bf16") != 0) {
                    st = tk_fail(TK_ERR_INVALID, "bench: --ablation needs a BF16 model; %s holds %s weights",
                                 o->model_path, info->model_dtype);
                    break;
                }
            }
            if (out->n_series < i + 1) out->n_series = i + 1;
            st = series_run(ro, &specs[i], m, info, &out->series[i], r * per_round, (r + 1) * per_round);
            if (st != TK_OK) break;
        }
    tk_model_free(m);
    /* Probe again after the engines are gone: a neighbour's load only ever
     * lowers a probe, so the higher of the two is the machine's ceiling, and
     * every roofline is restated against it. */
    probe_stats ps;
    probe_read_bw_stats(info->probe_threads, &ps);
    double bw = ps.best;
    if (bw > info->read_bw_gbs) {
        info->read_bw_gbs = bw;
        info->read_bw_min_gbs = ps.min;
        info->read_bw_median_gbs = ps.median;
        for (int s = 0; s < out->n_series; s++)
            for (int i = 0; i < out->series[s].n_points; i++) {
                bench_point *p = &out->series[s].points[i];
                for (int r = 0; r < p->n_rep; r++) bench_level_restate(&p->rep[r], bw, ps.median);
                bench_point_summarize(p);
            }
    }
    return st;
}

void bench_result_free(bench_result *r) {
    if (!r) return;
    for (int i = 0; i < r->n_series; i++) {
        bench_series *s = &r->series[i];
        for (int k = 0; k < s->n_points; k++) bench_point_free(&s->points[k]);
        tk_free(s->points);
        s->points = NULL;
        s->n_points = 0;
    }
    r->n_series = 0;
}
