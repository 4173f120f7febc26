/* The engine: a loop thread that owns every mutable thing (scheduler, KV
 * blocks, samplers, detokenizers) and a mutex-protected inbox through which
 * other threads submit and cancel. Each loop turn: take the inbox, finish the
 * cancelled (their blocks return before the step), plan, run one forward pass,
 * sample, fire callbacks. */
#include "engine/engine.h"

#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

#include "core/alloc.h"
#include "core/checked.h"
#include "core/error.h"
#include "core/log.h"
#include "engine/draft.h"
#include "engine/prefix.h"
#include "engine/sampler.h"
#include "engine/sched.h"
#include "engine/spec.h"
#include "engine/stop.h"
#include "tokenizer/tokenizer.h"

#define STOP_MAX_LEN 4096 /* longest stop string (stop.c enforces it) */

typedef struct eng_req {
    sched_seq seq; /* first member: plan items point here */
    uint64_t id;
    int32_t *tokens; /* (cap) prompt, then output */
    int cap;
    int n_prompt, n_output;
    int max_tokens;           /* 0: until the context limit */
    tk_sampling sampling;     /* logit_bias points at bias */
    tk_logit_bias *bias;      /* (sampling.n_logit_bias) owned copy */
    tk_sampler *sampler;      /* made at first schedule, so the queue holds no vocab-sized buffers */
    char *stops[TK_MAX_STOP]; /* owned copies */
    int n_stops;
    int32_t *stop_tokens; /* (n_stop_tokens) owned copy */
    int n_stop_tokens;
    bool ignore_eos, need_text;
    tok_stream *ts;
    stop_matcher *sm;
    tk_on_token on_token;
    tk_on_finish on_finish;
    void *user;
    tk_request_times times;
    double spec_alpha;     /* acceptance estimate (spec.h) */
    int32_t spec_first;    /* the first draft on offer this step (-1: none), scored when not verified */
    draft_seq ds;          /* the draft model's KV of this sequence (spec draft) */
    const float *draft_q;  /* (drafts this step, n_vocab) the draft's distributions; NULL: none */
    bool in_sched, cancel; /* cancel: under the engine mutex */
    struct eng_req *lprev, *lnext; /* live list (under the mutex) */
    struct eng_req *inext;         /* inbox (under the mutex) */
    struct eng_req *cnext;         /* the loop's list of cancelled ones to finish */
} eng_req;

/* A plain decode's token, sampled on the backend's threads before the serial
 * pass that takes it (run_step). */
typedef struct eng_pick {
    eng_req *q;
    float *lg;   /* its logits row */
    int32_t tok; /* -1: no token has a finite logit */
    tk_token_event ev;
} eng_pick;

struct tk_engine {
    backend be;
    tk_engine_opts o; /* resolved options */
    sched *sc;
    sched_opts so;
    pthread_t thread;
    bool thread_started;

    pthread_mutex_t mu; /* guards everything down to stats */
    pthread_cond_t cv;
    bool stopping;
    uint64_t next_id;
    eng_req *live; /* every accepted, unfinished request */
    int n_live, n_running_seen;
    eng_req *inbox_head, *inbox_tail;
    int cancel_pending; /* cancel flags set since the loop last looked */

    pthread_mutex_t stats_mu;
    tk_engine_stats stats;
    tk_step_record step_log[TK_STEP_LOG]; /* step i at [(i - 1) % TK_STEP_LOG], under stats_mu */

    /* loop-thread scratch, sized at create */
    int32_t *b_tokens;     /* (max step tokens) */
    int32_t *b_n, *b_pos0; /* (max_batch) */
    const int32_t **b_bt;  /* (max_batch) */
    int32_t *b_want;       /* (max_batch) logits wanted: 0, 1, or 1 + drafts */
    float *logits;         /* (max_batch + spec max_total, n_vocab) */
    eng_pick *picks;       /* (max_batch) this step's plain decodes, in plan order */
    int32_t *b_pick;       /* (max_batch) an item's pick; -1: none (drafts), -2: finished */
    /* speculative decoding (spec.h) */
    spec_ctl spec;
    eng_req **sp_req; /* (max_batch) the decodes offered drafts this step */
    double *sp_alpha; /* (max_batch) */
    int *sp_avail, *sp_k;
    uint64_t sp_decodes, sp_verifies, sp_drafted, sp_accepted;
    int sp_k_last;
    drafter *dr;                  /* the draft model (spec draft), else NULL */
    draft_job *sp_jobs;           /* (max_batch) */
    draft_follow *df;             /* (max_batch) the prompts the draft follows (draft_follow_step) */
    float *dq;                    /* (max_draft, n_vocab) the draft's distributions of this step's drafts */
    int dq_rows;                  /* max_draft */
    float *pbuf;                  /* (n_vocab) the target's distribution at one position */
    double sp_draft_s, sp_turn_s; /* seconds in draft passes, and in the turns that ran them or decoded */
    double sp_follow_s;           /* seconds the draft spent following the prompts (drafter_follow) */
    uint64_t sp_follow_tok;       /* tokens it fed doing so */
    char *tbuf;                   /* (tok bound) detokenized bytes of one token */
    char *obuf;                   /* (2 * (STOP_MAX_LEN + tok bound) + 1) text released to callbacks */
    size_t tbound;
};

/* ---- defaults ---------------------------------------------------------------- */

void tk_engine_opts_default(tk_engine_opts *o) {
    if (!o) return;
    memset(o, 0, sizeof *o);
    o->n_threads = 0;
    o->ctx = 4096;
    o->block_size = 128;
    o->kv_type = TK_KV_F16;
    o->kv_scale = TK_KV_SCALE_HEAD;
    o->max_batch = 32;
    o->max_queue = 1024;
}

void tk_request_default(tk_request *r) {
    if (!r) return;
    memset(r, 0, sizeof *r);
    tk_sampling_default(&r->sampling);
}

/* The cap of the time-based budget (the forward's buffers are sized for it):
 * 1,024 tokens, or every decode of the batch plus 256. On this project's 2-core
 * CPU the time target, not the cap, decides (a 1 s step holds ~80 prefill
 * tokens); a machine that prefills 10k tokens/s reaches the cap in ~100 ms,
 * past the point where bigger chunks prefill faster, and 1,024 tokens of
 * activations cost ~70 MB for qwen3-0.6b (~250 MB for an 8B model). */
int engine_default_step_tokens(int max_batch) { return max_batch + 256 > 1024 ? max_batch + 256 : 1024; }

void engine_default_budget(sched_budget_opts *b) {
    memset(b, 0, sizeof *b);
    b->adaptive = true;
    b->ratio = ENGINE_STEP_RATIO;
    b->max_s = ENGINE_STEP_MAX_S;
    b->min_chunk = ENGINE_STEP_MIN_CHUNK;
}

/* ---- request lifetime ---------------------------------------------------------- */

static void req_free(eng_req *q) {
    if (!q) return;
    tk_free(q->tokens);
    drafter_seq_free(NULL, &q->ds); /* its blocks went back at finish */
    tk_free(q->bias);
    sampler_free(q->sampler);
    for (int i = 0; i < q->n_stops; i++) tk_free(q->stops[i]);
    tk_free(q->stop_tokens);
    tok_stream_free(q->ts);
    stop_free(q->sm);
    tk_free(q);
}

static void live_unlink(tk_engine *e, eng_req *q) {
    if (q->lprev)
        q->lprev->lnext = q->lnext;
    else
        e->live = q->lnext;
    if (q->lnext) q->lnext->lprev = q->lprev;
    q->lprev = q->lnext = NULL;
    e->n_live--;
}

/* Release the text still held (detokenizer tail, stop-string candidates) into
 * buf; returns its length. */
static size_t req_flush_text(tk_engine *e, eng_req *q, char *buf) {
    if (!q->need_text || !q->ts) return 0;
    size_t n = tok_stream_flush(q->ts, e->tbuf, e->tbound);
    size_t out = 0;
    if (q->sm) {
        if (stop_push(q->sm, e->tbuf, n, buf, &out)) return out;
        out += stop_flush(q->sm, buf + out);
    } else {
        memcpy(buf, e->tbuf, n);
        out = n;
    }
    return out;
}

/* The scheduler's counts into the stats (the caller holds stats_mu): at the
 * end of each step, and when a request finishes, with its count, so a reader
 * that sees it finished also sees the blocks it gave back. */
static void stats_put_counts(tk_engine_stats *s, const sched_counts *c) {
    s->preemptions = c->preemptions;
    s->running = c->running;
    s->waiting = c->waiting;
    s->waiting_no_blocks = c->waiting_no_blocks;
    s->waiting_behind_prefill = c->waiting_behind_prefill;
    s->waiting_preempted = c->waiting_preempted;
    s->kv_blocks_total = c->blocks_total;
    s->kv_blocks_used = c->blocks_used;
    s->kv_blocks_peak = c->blocks_peak;
    s->prefix_cache_query_tokens = c->prefix_query_tokens;
    s->prefix_cache_hit_tokens = c->prefix_hit_tokens;
    s->prefix_cache_blocks = c->prefix_blocks;
    s->prefix_cache_evictions = c->prefix_evictions;
    s->spec_kv_restores = c->spec_restores;
    s->spec_refed_tokens = c->spec_refed;
}

/* The one place a request ends: blocks back, live list left, one callback. */
static void req_finish(tk_engine *e, eng_req *q, tk_finish reason, const char *message) {
    if (q->in_sched) sched_remove(e->sc, &q->seq);
    drafter_seq_release(e->dr, &q->ds);
    q->in_sched = false;
    /* After a stop-string match the matcher releases nothing more: "" here. */
    size_t tl = reason == TK_FINISH_ERROR ? 0 : req_flush_text(e, q, e->obuf);
    e->obuf[tl] = 0;
    q->times.finished = tk_now_s();
    q->times.n_output = q->n_output;
    q->times.n_preempted = q->seq.n_preempted;
    pthread_mutex_lock(&e->mu);
    live_unlink(e, q);
    pthread_mutex_unlock(&e->mu);
    if (q->on_finish) {
        tk_finish_event ev = {.id = q->id,
                              .reason = reason,
                              .message = reason == TK_FINISH_ERROR ? message : NULL,
                              .text = e->obuf,
                              .text_len = tl,
                              .times = q->times};
        q->on_finish(q->user, &ev);
    }
    req_free(q);
    /* Counted after the callback returned: a reader that sees the count also
     * sees everything the callback did, and the blocks the request held back
     * (the step's own publish comes later). */
    sched_counts c;
    sched_counts_get(e->sc, &c);
    pthread_mutex_lock(&e->stats_mu);
    e->stats.requests_finished++;
    stats_put_counts(&e->stats, &c);
    pthread_mutex_unlock(&e->stats_mu);
}

/* ---- submit / cancel (any thread) ----------------------------------------------- */

static tk_status req_build(tk_engine *e, const tk_request *r, eng_req **out) {
    const int V = e->be.n_vocab, ctx = e->o.ctx;
    if (!r->prompt || r->n_prompt <= 0)
        return tk_fail(TK_ERR_INVALID, "submit: empty prompt (n_prompt %d)", r->n_prompt);
    if (r->n_prompt > ctx)
        return tk_fail(TK_ERR_RANGE, "submit: prompt of %d tokens is longer than the context of %d",
                       r->n_prompt, ctx);
    for (int i = 0; i < r->n_prompt; i++)
        if (r->prompt[i] < 0 || r->prompt[i] >= V)
            return tk_fail(TK_ERR_RANGE, "submit: prompt token %d at %d outside the vocabulary [0, %d)",
                           (int)r->prompt[i], i, V);
    if (r->max_tokens < 0)
        return tk_fail(TK_ERR_INVALID, "submit: max_tokens %d must be >= 0", r->max_tokens);
    tk_status st = sampler_check(&r->sampling, V);
    if (st != TK_OK) return st;
    int n_stops = 0;
    while (n_stops < TK_MAX_STOP && r->stop[n_stops]) {
        size_t l = strlen(r->stop[n_stops]);
        if (l == 0 || l > STOP_MAX_LEN)
            return tk_fail(TK_ERR_INVALID, "submit: stop string %d has %zu bytes, expected 1..%d", n_stops, l,
                           STOP_MAX_LEN);
        n_stops++;
    }
    if (r->n_stop_tokens < 0 || (r->n_stop_tokens > 0 && !r->stop_tokens))
        return tk_fail(TK_ERR_INVALID, "submit: n_stop_tokens %d without ids", r->n_stop_tokens);
    for (int i = 0; i < r->n_stop_tokens; i++)
        if (r->stop_tokens[i] < 0 || r->stop_tokens[i] >= V)
            return tk_fail(TK_ERR_RANGE, "submit: stop token %d outside the vocabulary [0, %d)",
                           (int)r->stop_tokens[i], V);
    bool need_text = r->want_text || n_stops > 0;
    if (need_text && !e->be.tok)
        return tk_fail(TK_ERR_INVALID, "submit: %s needs a tokenizer and this model has none",
                       n_stops ? "a stop string" : "want_text");

    eng_req *q = tk_calloc(1, sizeof *q);
    if (!q) return tk_fail(TK_ERR_NOMEM, "submit: out of memory");
    /* Room for the prompt and every output token that can still be fed. */
    int64_t cap = (int64_t)ctx + 1;
    if (r->max_tokens > 0 && (int64_t)r->n_prompt + r->max_tokens < cap)
        cap = (int64_t)r->n_prompt + r->max_tokens;
    q->cap = (int)cap;
    q->tokens = tk_calloc((size_t)cap, sizeof *q->tokens);
    if (!q->tokens) goto nomem;
    memcpy(q->tokens, r->prompt, (size_t)r->n_prompt * sizeof *q->tokens);
    q->n_prompt = r->n_prompt;
    q->max_tokens = r->max_tokens;
    q->sampling = r->sampling;
    if (r->sampling.n_logit_bias > 0) {
        q->bias = tk_calloc((size_t)r->sampling.n_logit_bias, sizeof *q->bias);
        if (!q->bias) goto nomem;
        memcpy(q->bias, r->sampling.logit_bias, (size_t)r->sampling.n_logit_bias * sizeof *q->bias);
    }
    q->sampling.logit_bias = q->bias;
    for (int i = 0; i < n_stops; i++) {
        q->stops[i] = tk_strdup(r->stop[i]);
        if (!q->stops[i]) goto nomem;
        q->n_stops = i + 1;
    }
    if (r->n_stop_tokens > 0) {
        q->stop_tokens = tk_calloc((size_t)r->n_stop_tokens, sizeof *q->stop_tokens);
        if (!q->stop_tokens) goto nomem;
        memcpy(q->stop_tokens, r->stop_tokens, (size_t)r->n_stop_tokens * sizeof *q->stop_tokens);
        q->n_stop_tokens = r->n_stop_tokens;
    }
    q->ignore_eos = r->ignore_eos;
    q->need_text = need_text;
    if (need_text) {
        st = tok_stream_init(e->be.tok, false, &q->ts);
        if (st != TK_OK) goto fail;
        if (n_stops) {
            st = stop_init((const char *const *)q->stops, n_stops, e->tbound, &q->sm);
            if (st != TK_OK) goto fail;
        }
    }
    q->on_token = r->on_token;
    q->on_finish = r->on_finish;
    q->user = r->user;
    q->seq.tokens = q->tokens;
    q->seq.n_tokens = r->n_prompt;
    q->spec_alpha = e->dr ? SPEC_ALPHA_PRIOR_DRAFT : SPEC_ALPHA_PRIOR;
    q->spec_first = -1;
    if (e->dr) {
        st = drafter_seq_init(e->dr, &q->ds);
        if (st != TK_OK) goto fail;
    }
    q->times.n_prompt = r->n_prompt;
    *out = q;
    return TK_OK;
nomem:
    st = tk_fail(TK_ERR_NOMEM, "submit: out of memory");
fail:
    req_free(q);
    return st;
}

tk_status tk_engine_submit(tk_engine *e, const tk_request *r, uint64_t *id) {
    if (!e || !r) return tk_fail(TK_ERR_INVALID, "submit: NULL engine or request");
    eng_req *q = NULL;
    tk_status st = req_build(e, r, &q);
    if (st != TK_OK) return st;
    pthread_mutex_lock(&e->mu);
    if (e->stopping) {
        pthread_mutex_unlock(&e->mu);
        req_free(q);
        return tk_fail(TK_ERR_INVALID, "submit: the engine is shutting down");
    }
    int waiting = e->n_live - e->n_running_seen;
    if (waiting >= e->o.max_queue) {
        pthread_mutex_unlock(&e->mu);
        req_free(q);
        return tk_fail(TK_ERR_FULL, "submit: %d requests waiting, the queue holds %d", waiting,
                       e->o.max_queue);
    }
    q->id = ++e->next_id;
    q->times.queued = tk_now_s();
    q->lnext = e->live;
    if (e->live) e->live->lprev = q;
    e->live = q;
    e->n_live++;
    if (e->inbox_tail)
        e->inbox_tail->inext = q;
    else
        e->inbox_head = q;
    e->inbox_tail = q;
    if (id) *id = q->id;
    pthread_cond_signal(&e->cv);
    pthread_mutex_unlock(&e->mu);
    pthread_mutex_lock(&e->stats_mu);
    e->stats.requests_submitted++;
    pthread_mutex_unlock(&e->stats_mu);
    return TK_OK;
}

tk_status tk_engine_cancel(tk_engine *e, uint64_t id) {
    if (!e) return tk_fail(TK_ERR_INVALID, "cancel: NULL engine");
    pthread_mutex_lock(&e->mu);
    eng_req *q = e->live;
    while (q && q->id != id) q = q->lnext;
    if (!q) {
        pthread_mutex_unlock(&e->mu);
        return tk_fail(TK_ERR_NOT_FOUND, "cancel: request %llu is not live (finished or never submitted)",
                       (unsigned long long)id);
    }
    if (!q->cancel) {
        q->cancel = true;
        e->cancel_pending++;
        pthread_cond_signal(&e->cv);
    }
    pthread_mutex_unlock(&e->mu);
    return TK_OK;
}

/* ---- one step ---------------------------------------------------------------- */

static bool is_stop_token(tk_engine *e, const eng_req *q, int32_t tok) {
    for (int i = 0; i < q->n_stop_tokens; i++)
        if (q->stop_tokens[i] == tok) return true;
    return !q->ignore_eos && e->be.tok && tok_is_eog(e->be.tok, tok);
}

/* Take the sampled token: callbacks, then finish if it ends the request.
 * False when it did (q is gone). */
static bool req_accept_token(tk_engine *e, eng_req *q, int32_t tok, tk_token_event *ev) {
    if (q->n_output == 0) q->times.first_token = ev->t;
    if (is_stop_token(e, q, tok)) {
        /* Stop ids and EOS are not output; text held before them is flushed at finish. */
        req_finish(e, q, TK_FINISH_STOP, NULL);
        return false;
    }
    q->tokens[q->n_prompt + q->n_output] = tok;
    q->n_output++;
    q->seq.n_tokens++;
    bool hit = false;
    size_t tl = 0;
    if (q->need_text) {
        size_t n = tok_stream_push(q->ts, tok, e->tbuf, e->tbound);
        if (q->sm)
            hit = stop_push(q->sm, e->tbuf, n, e->obuf, &tl);
        else {
            memcpy(e->obuf, e->tbuf, n);
            tl = n;
        }
    }
    e->obuf[tl] = 0;
    ev->id = q->id;
    ev->text = e->obuf;
    ev->text_len = tl;
    if (q->on_token) q->on_token(q->user, ev);
    tk_finish why = TK_FINISH_NONE;
    if (hit)
        why = TK_FINISH_STOP;
    else if (q->max_tokens > 0 && q->n_output >= q->max_tokens)
        why = TK_FINISH_LENGTH;
    /* The new token sits at position n_prompt + n_output - 1; it can be fed only below ctx. */
    else if (q->n_prompt + q->n_output - 1 >= e->o.ctx)
        why = TK_FINISH_LENGTH;
    else if (q->n_output >= q->cap - q->n_prompt + 1)
        why = TK_FINISH_LENGTH;
    if (why == TK_FINISH_NONE) return true;
    req_finish(e, q, why, NULL);
    return false;
}

/* ---- speculative decoding ------------------------------------------------------ */

/* The draft model drafts what the controller chose (sp_k) for the sp_req;
 * sp_k becomes what it made. Returns the seconds it took. */
static double draft_make(tk_engine *e, int n) {
    const size_t V = (size_t)e->be.n_vocab;
    int row = 0;
    for (int i = 0; i < n; i++) {
        eng_req *q = e->sp_req[i];
        draft_job *jb = &e->sp_jobs[i];
        int k = e->sp_k[i];
        bool sample = q->sampling.temperature > 0;
        if (sample && k > e->dq_rows - row) k = e->dq_rows - row; /* rows for the draft's distributions */
        *jb = (draft_job){.ds = &q->ds,
                          .tokens = q->tokens,
                          .n_tokens = q->seq.n_tokens,
                          .n_prompt = q->n_prompt,
                          .sampling = &q->sampling,
                          .k = k,
                          .q = sample ? e->dq + (size_t)row * V : NULL};
        if (sample) row += k;
    }
    double dt = drafter_run(e->dr, e->sp_jobs, n, &e->spec.draft);
    for (int i = 0; i < n; i++) {
        e->sp_k[i] = e->sp_jobs[i].k;
        e->sp_req[i]->draft_q = e->sp_jobs[i].q;
    }
    return dt;
}

/* After the target's forward: the draft follows the prompt tokens this step
 * prefilled (drafter_follow), up to each sequence's last known token, which
 * its first draft pass feeds. Decodes are left to the draft passes (feeding
 * the draft at every decode would read its weights every step, drafting or
 * not). Returns the seconds it took. */
static double draft_follow_step(tk_engine *e, const sched_plan *p) {
    int n = 0;
    for (int i = 0; i < p->n_items; i++) {
        const sched_item *it = &p->items[i];
        if (sched_item_is_decode(it)) continue;
        eng_req *q = (eng_req *)it->seq;
        int end = it->pos0 + it->n;
        if (end > q->seq.n_tokens - 1) end = q->seq.n_tokens - 1;
        if (end <= q->ds.n_done) continue;
        e->df[n++] = (draft_follow){.ds = &q->ds, .tokens = q->tokens, .end = end};
    }
    if (n == 0) return 0;
    int fed = 0;
    double dt = drafter_follow(e->dr, e->df, n, &fed);
    e->sp_follow_s += dt;
    e->sp_follow_tok += (uint64_t)fed;
    return dt;
}

/* Before planning: every running decode drafts what it can, the controller
 * chooses how many of them each verifies (sched_seq.n_draft). With the draft
 * model the drafts on offer are the room left, and are made after the choice.
 * Returns the seconds the draft model took. */
static double spec_prepare(tk_engine *e) {
    int n = 0;
    for (sched_seq *s = sched_running(e->sc); s && n < e->o.max_batch; s = s->next) {
        eng_req *q = (eng_req *)s;
        q->spec_first = -1;
        q->draft_q = NULL;
        /* Decodes only, from a request's second token: a prompt's last token
         * that a chunk left alone is sampled as the end of its prefill would
         * be (with a draft model, drafting there would make a seeded run's
         * tokens depend on where the time-based chunks fell). */
        if (s->n_tokens - s->n_computed != 1 || q->n_output == 0) continue;
        int room = e->o.spec_k;
        if (room > q->cap - s->n_tokens) room = q->cap - s->n_tokens;
        if (room > e->o.ctx - s->n_tokens) room = e->o.ctx - s->n_tokens;
        if (q->max_tokens > 0 && room > q->max_tokens - q->n_output - 1)
            room = q->max_tokens - q->n_output - 1;
        int m = room <= 0 ? 0
                : e->dr   ? room
                          : spec_ngram_draft(q->tokens, s->n_tokens, e->o.spec_ngram, room,
                                             q->tokens + s->n_tokens);
        if (m == 0) continue;
        if (!e->dr) q->spec_first = q->tokens[s->n_tokens];
        e->sp_req[n] = q;
        e->sp_alpha[n] = q->spec_alpha;
        e->sp_avail[n] = m;
        n++;
    }
    int total = spec_choose(&e->spec, n, e->sp_alpha, e->sp_avail, e->sp_k);
    if (e->o.spec_fixed) { /* no controller: every draft on offer */
        total = 0;
        for (int i = 0; i < n; i++) total += e->sp_k[i] = e->sp_avail[i];
    }
    double dt = 0;
    if (e->dr && total > 0) {
        dt = draft_make(e, n);
        total = 0;
        for (int i = 0; i < n; i++) total += e->sp_k[i];
    }
    for (int i = 0; i < n; i++) e->sp_req[i]->seq.n_draft = e->sp_k[i];
    e->sp_decodes += (uint64_t)n;
    e->sp_k_last = total;
    return dt;
}

/* Speculative sampling of draft j at row lg (spec_verify_token): the target's
 * distribution against the draft's, the accept test and the residual drawn
 * from the request's seeded stream. */
static int32_t verify_sampled(tk_engine *e, eng_req *q, int j, int32_t draft, float *lg, tk_token_event *ev) {
    const int V = e->be.n_vocab;
    float lse;
    int32_t tok = sampler_dist(q->sampler, lg, q->tokens, q->n_prompt + q->n_output, e->pbuf, &lse);
    uint64_t draw = sampler_next_draw(q->sampler);
    if (tok < 0) return -1;
    bool acc;
    tok = spec_verify_token(e->pbuf, q->draft_q + (size_t)j * (size_t)V, V, draft,
                            sampler_uniform(q->sampling.seed ^ SPEC_SALT_ACCEPT, draw),
                            sampler_uniform(q->sampling.seed, draw), &acc);
    if (tok >= 0) sampler_event(q->sampler, lg, lse, tok, ev);
    return tok;
}

/* Sample an item's rows (1 + n_draft) and take the tokens; returns how many
 * were sampled. Without drafts: one token, the plain decode. With drafts: a
 * draft is kept while it equals the token sampled at its position, and the
 * first token that differs (or the one after the last draft) ends the run.
 * Each row is sampled exactly as a plain decode of that position would be, so
 * the output is the same. A draft model's drafts under temperature sampling
 * are verified by speculative sampling instead (verify_sampled): the token
 * at a draft's position is the draft when accepted, else a draw from the
 * residual, so it differs from the draft exactly when the draft is rejected.
 * The KV past the last kept position is dropped (sched_spec_settle, and
 * drafter_settle for the draft model's). pk: a plain decode's token, already
 * sampled (sample_pick); NULL: sampled here. */
static int take_tokens(tk_engine *e, eng_req *q, const sched_item *it, float *logits, const eng_pick *pk) {
    const int V = e->be.n_vocab, nd = it->n_draft;
    int a = 0, sampled = 0;
    for (int j = 0; j <= nd; j++) {
        float *lg = logits + (size_t)j * (size_t)V;
        int32_t draft = j < nd ? q->tokens[it->pos0 + 1 + j] : -1;
        tk_token_event ev;
        int32_t tok;
        if (pk) {
            ev = pk->ev;
            tok = pk->tok;
        } else {
            memset(&ev, 0, sizeof ev);
            tok = j < nd && q->draft_q
                      ? verify_sampled(e, q, j, draft, lg, &ev)
                      : sampler_sample(q->sampler, lg, q->tokens, q->n_prompt + q->n_output, &ev);
        }
        ev.t = tk_now_s();
        if (tok < 0) {
            req_finish(e, q, TK_FINISH_ERROR, "sampler: no token has a finite logit");
            return sampled;
        }
        sampled++;
        if (nd == 0 && q->spec_first >= 0) /* a draft on offer, not verified: score it for free */
            q->spec_alpha = spec_alpha_update(q->spec_alpha, tok == q->spec_first, tok != q->spec_first);
        else if (nd > 0 && (tok != draft || j == nd))
            q->spec_alpha = spec_alpha_update(q->spec_alpha, a, j < nd);
        q->spec_first = -1;
        bool keep = j < nd && tok == draft;
        e->sp_accepted += keep;
        a += keep;
        if (!req_accept_token(e, q, tok, &ev)) return sampled;
        if (!keep) break;
    }
    if (nd > 0) sched_spec_settle(e->sc, &q->seq, it->pos0 + 1 + a);
    drafter_settle(e->dr, &q->ds, it->pos0 + 1 + a);
    return sampled;
}

/* Sample plain decode i of this step (backend_run_each): each request has its
 * own sampler and draws are a function of (seed, draw index), so requests
 * sampled at once give the tokens they give one after another. */
static void sample_pick(void *arg, int i) {
    eng_pick *pk = &((eng_pick *)arg)[i];
    eng_req *q = pk->q;
    memset(&pk->ev, 0, sizeof pk->ev);
    pk->tok = sampler_sample(q->sampler, pk->lg, q->tokens, q->n_prompt + q->n_output, &pk->ev);
}

static void publish_stats(tk_engine *e, const sched_plan *p, double dt, uint64_t prompt_tok,
                          uint64_t out_tok) {
    sched_counts c;
    sched_counts_get(e->sc, &c);
    pthread_mutex_lock(&e->mu);
    e->n_running_seen = c.running;
    pthread_mutex_unlock(&e->mu);
    pthread_mutex_lock(&e->stats_mu);
    tk_engine_stats *s = &e->stats;
    if (p) {
        s->steps++;
        s->step_time_last = dt;
        s->decode_bytes_last = e->be.last_bytes ? e->be.last_bytes(e->be.ctx) : 0;
        tk_step_record r = {.step = s->steps,
                            .seconds = dt,
                            .bytes = s->decode_bytes_last,
                            .n_seqs = p->n_items,
                            .n_tokens = p->n_tok,
                            .prompt_tokens = (int)prompt_tok,
                            .out_tokens = (int)out_tok};
        if (e->be.last_floor_terms) e->be.last_floor_terms(e->be.ctx, r.floor_terms);
        e->step_log[(s->steps - 1) % TK_STEP_LOG] = r;
        if (tk_step_is_decode(&r)) {
            s->decode_steps++;
            s->decode_seconds += dt;
            s->decode_bytes += (double)r.bytes;
        }
        s->step_budget_last = c.budget;
        s->step_target_ms_last = c.target_s * 1e3;
    }
    s->step_fixed_ms = c.cost.fixed_s * 1e3;
    s->decode_ms_per_token = c.cost.dec_s * 1e3;
    s->prefill_ms_per_token = c.cost.pre_s * 1e3;
    s->prefill_ms_per_kpos = c.cost.attn_s * 1e3;
    s->prompt_tokens += prompt_tok;
    s->output_tokens += out_tok;
    stats_put_counts(s, &c);
    s->spec_decodes = e->sp_decodes;
    s->spec_verifies = e->sp_verifies;
    s->spec_drafted = e->sp_drafted;
    s->spec_accepted = e->sp_accepted;
    s->spec_k_last = e->sp_k_last;
    double c0, c1;
    if (e->o.spec != TK_SPEC_OFF && spec_cost_fit(&e->spec.cost, &c0, &c1)) {
        s->spec_step_ms_base = c0 * 1e3;
        s->spec_step_ms_per_token = c1 * 1e3;
    }
    s->spec_draft_seconds = e->sp_draft_s;
    s->spec_turn_seconds = e->sp_turn_s;
    s->spec_follow_seconds = e->sp_follow_s;
    s->spec_follow_tokens = e->sp_follow_tok;
    if (e->dr && spec_cost_price(&e->spec.draft, &c0, &c1)) {
        s->spec_draft_ms_base = c0 * 1e3;
        s->spec_draft_ms_per_seq = c1 * 1e3;
    }
    pthread_mutex_unlock(&e->stats_mu);
}

static void run_step(tk_engine *e) {
    double t_turn = tk_now_s(), t_draft = 0;
    if (e->o.spec != TK_SPEC_OFF) t_draft = spec_prepare(e);
    const sched_plan *p = sched_plan_step(e->sc);
    if (p->n_items == 0) {
        publish_stats(e, NULL, 0, 0, 0);
        return;
    }
    double now = tk_now_s();
    int nt = 0, n_want = 0;
    uint64_t prompt_tok = 0;
    for (int i = 0; i < p->n_items; i++) {
        const sched_item *it = &p->items[i];
        eng_req *q = (eng_req *)it->seq;
        if (q->times.scheduled == 0) {
            q->times.scheduled = now;
            q->times.n_cached = q->seq.n_hit;
        }
        memcpy(e->b_tokens + nt, q->tokens + it->pos0, (size_t)it->n * sizeof *e->b_tokens);
        nt += it->n;
        e->b_n[i] = it->n;
        e->b_pos0[i] = it->pos0;
        e->b_bt[i] = it->seq->bt;
        e->b_want[i] = it->want_logits ? 1 + it->n_draft : 0;
        n_want += e->b_want[i];
        if (it->n_draft > 0) {
            e->sp_verifies++;
            e->sp_drafted += (uint64_t)it->n_draft;
        }
        /* Prompt tokens processed (recomputation after preemption included). */
        if (it->n > 1 || it->pos0 < q->n_prompt) prompt_tok += (uint64_t)it->n;
    }
    tk_batch b = {.n_seq = p->n_items,
                  .n_tok = nt,
                  .tokens = e->b_tokens,
                  .n = e->b_n,
                  .pos0 = e->b_pos0,
                  .bt = e->b_bt,
                  .n_logits = e->b_want};
    double t0 = tk_now_s();
    tk_status st = e->be.step(e->be.ctx, &b, e->logits);
    double t1 = tk_now_s();
    if (st != TK_OK) {
        char msg[256];
        snprintf(msg, sizeof msg, "forward: %s", tk_last_error());
        tk_log_error("engine: step failed: %s", msg);
        for (int i = 0; i < p->n_items; i++) req_finish(e, (eng_req *)p->items[i].seq, TK_FINISH_ERROR, msg);
        publish_stats(e, p, t1 - t0, 0, 0);
        return;
    }
    sched_advance(e->sc, p);
    double t_follow = e->dr ? draft_follow_step(e, p) : 0;
    /* Every plain decode (no drafts) is sampled first, on the backend's
     * threads; then, one item after another in plan order, the tokens are
     * taken (drafts verified there) with every side effect: callbacks,
     * finishing, speculation bookkeeping. */
    int k = 0, n_pick = 0;
    for (int i = 0; i < p->n_items; i++) {
        const sched_item *it = &p->items[i];
        if (!it->want_logits) continue;
        eng_req *q = (eng_req *)it->seq;
        float *lg = e->logits + (size_t)k * (size_t)e->be.n_vocab;
        k += 1 + it->n_draft;
        e->b_pick[i] = -1;
        if (!q->sampler) {
            if (sampler_init(&q->sampling, e->be.n_vocab, &q->sampler) != TK_OK) {
                e->b_pick[i] = -2;
                req_finish(e, q, TK_FINISH_ERROR, "sampler: out of memory");
                continue;
            }
            sampler_set_n_prompt(q->sampler, q->n_prompt);
        }
        if (it->n_draft == 0) {
            e->b_pick[i] = n_pick;
            e->picks[n_pick++] = (eng_pick){.q = q, .lg = lg};
        }
    }
    backend_run_each(&e->be, sample_pick, e->picks, n_pick);
    uint64_t out_tok = 0;
    k = 0;
    for (int i = 0; i < p->n_items; i++) {
        const sched_item *it = &p->items[i];
        if (!it->want_logits) continue;
        float *lg = e->logits + (size_t)k * (size_t)e->be.n_vocab;
        k += 1 + it->n_draft;
        if (e->b_pick[i] == -2) continue; /* finished above */
        const eng_pick *pk = e->b_pick[i] >= 0 ? &e->picks[e->b_pick[i]] : NULL;
        out_tok += (uint64_t)take_tokens(e, (eng_req *)it->seq, it, lg, pk);
    }
    (void)n_want;
    /* The budget's costs are whole turns (plan, forward, sampling, callbacks):
     * what a stream waits between two tokens. Sampling a 150k vocabulary per
     * sequence is a real share of a decode step on a CPU. sched_observe reads
     * only the plan's counts; finished requests are already gone. */
    double t_end = tk_now_s();
    sched_observe(e->sc, p, t_end - t_turn);
    /* The target's step cost leaves the draft passes out: they are priced apart. */
    if (e->o.spec != TK_SPEC_OFF && p->n_tok == p->n_decode + p->n_draft) {
        spec_cost_observe(&e->spec.cost, p->n_tok, t_end - t_turn - t_draft - t_follow);
        e->sp_turn_s += t_end - t_turn;
        e->sp_draft_s += t_draft;
    }
    publish_stats(e, p, t1 - t0, prompt_tok, out_tok);
}

/* ---- the loop ------------------------------------------------------------------ */

static void *engine_loop(void *arg) {
    tk_engine *e = arg;
    for (;;) {
        pthread_mutex_lock(&e->mu);
        while (!e->stopping && !e->inbox_head && !e->cancel_pending && !sched_busy(e->sc))
            pthread_cond_wait(&e->cv, &e->mu);
        eng_req *in = e->inbox_head;
        e->inbox_head = e->inbox_tail = NULL;
        bool stopping = e->stopping;
        pthread_mutex_unlock(&e->mu);

        for (eng_req *q = in; q;) {
            eng_req *next = q->inext;
            q->inext = NULL;
            if (sched_add(e->sc, &q->seq, q->id) == TK_OK)
                q->in_sched = true;
            else
                req_finish(e, q, TK_FINISH_ERROR, "engine: out of memory for a block table");
            q = next;
        }
        /* Collect the cancelled under the lock, finish them outside it (callbacks
         * may call tk_engine_cancel). Only this thread frees requests, so the
         * collected pointers stay valid. */
        eng_req *cancels = NULL;
        pthread_mutex_lock(&e->mu);
        if (e->cancel_pending) {
            for (eng_req *q = e->live; q; q = q->lnext)
                if (q->cancel && q->in_sched) {
                    q->cnext = cancels;
                    cancels = q;
                }
            e->cancel_pending = 0;
        }
        pthread_mutex_unlock(&e->mu);
        for (eng_req *q = cancels; q;) {
            eng_req *next = q->cnext;
            req_finish(e, q, TK_FINISH_CANCELLED, NULL);
            q = next;
        }
        if (stopping) {
            for (;;) {
                pthread_mutex_lock(&e->mu);
                eng_req *q = e->live;
                pthread_mutex_unlock(&e->mu);
                if (!q) break;
                req_finish(e, q, TK_FINISH_CANCELLED, NULL);
            }
            publish_stats(e, NULL, 0, 0, 0);
            return NULL;
        }
        if (sched_busy(e->sc))
            run_step(e);
        else if (cancels)
            publish_stats(e, NULL, 0, 0, 0); /* no step will: say the blocks are back */
    }
}

/* ---- create / free ----------------------------------------------------------------- */

bool engine_step_adaptive(const tk_engine_opts *o) { return !o || o->step_tokens == 0 || o->step_ms > 0; }

static int be_sched_alloc(void *c) {
    tk_engine *e = c;
    return e->be.block_alloc(e->be.ctx);
}
static void be_sched_free(void *c, int b) {
    tk_engine *e = c;
    e->be.block_free(e->be.ctx, b);
}
static int be_sched_n_free(void *c) {
    tk_engine *e = c;
    return e->be.blocks_free(e->be.ctx);
}
static void be_sched_ref(void *c, int b) {
    tk_engine *e = c;
    e->be.block_ref(e->be.ctx, b);
}
static int be_sched_refs(void *c, int b) {
    tk_engine *e = c;
    return e->be.block_refs(e->be.ctx, b);
}
static tk_status be_sched_cow(void *c, int32_t *bt, int j) {
    tk_engine *e = c;
    return backend_block_cow(&e->be, bt, j);
}
static void be_sched_copy(void *c, int dst, int src, int n_slots) {
    tk_engine *e = c;
    e->be.block_copy(e->be.ctx, dst, src, n_slots);
}
static void be_sched_preempted(void *c, sched_seq *seq) {
    tk_engine *e = c;
    drafter_seq_release(e->dr, &((eng_req *)seq)->ds);
}

static tk_status resolve_opts(const tk_engine_opts *in, tk_engine_opts *o) {
    tk_engine_opts d;
    tk_engine_opts_default(&d);
    *o = in ? *in : d;
    if (o->ctx == 0) o->ctx = d.ctx;
    if (o->block_size == 0) o->block_size = d.block_size;
    if (o->max_batch == 0) o->max_batch = d.max_batch;
    if (o->max_queue == 0) o->max_queue = d.max_queue;
    if (o->max_seqs == 0) o->max_seqs = o->max_batch;
    if (!(o->step_ms >= 0) || o->step_ms > 3600e3)
        return tk_fail(TK_ERR_INVALID, "engine: step_ms %g, expected 0 (automatic) up to 3600000",
                       o->step_ms);
    if (o->step_tokens < 0)
        return tk_fail(TK_ERR_INVALID, "engine: step_tokens %d must be >= 0", o->step_tokens);
    if (o->step_tokens == 0) o->step_tokens = engine_default_step_tokens(o->max_batch > 0 ? o->max_batch : 0);
    if (o->ctx < 1 || o->ctx > (1 << 24))
        return tk_fail(TK_ERR_INVALID, "engine: ctx %d, expected 1..%d", o->ctx, 1 << 24);
    if (o->max_batch < 1 || o->max_batch > 4096)
        return tk_fail(TK_ERR_INVALID, "engine: max_batch %d, expected 1..4096", o->max_batch);
    if (o->max_seqs < 1) return tk_fail(TK_ERR_INVALID, "engine: max_seqs %d must be >= 1", o->max_seqs);
    if (o->max_queue < 1) return tk_fail(TK_ERR_INVALID, "engine: max_queue %d must be >= 1", o->max_queue);
    if (o->n_threads < 0) return tk_fail(TK_ERR_INVALID, "engine: n_threads %d must be >= 0", o->n_threads);
    if ((unsigned)o->kv_type > TK_KV_INT8)
        return tk_fail(TK_ERR_INVALID, "engine: unknown kv_type %d", (int)o->kv_type);
    if ((unsigned)o->kv_scale > TK_KV_SCALE_TOKEN)
        return tk_fail(TK_ERR_INVALID, "engine: unknown kv_scale %d", (int)o->kv_scale);
    if ((unsigned)o->spec > TK_SPEC_DRAFT)
        return tk_fail(TK_ERR_INVALID, "engine: unknown spec mode %d", (int)o->spec);
    if (o->draft_model && !*o->draft_model) o->draft_model = NULL;
    if (o->draft_model && o->spec == TK_SPEC_OFF) o->spec = TK_SPEC_DRAFT;
    if (o->spec == TK_SPEC_DRAFT && !o->draft_model)
        return tk_fail(TK_ERR_INVALID, "engine: spec draft needs a draft model (draft_model)");
    if (o->draft_model && o->spec != TK_SPEC_DRAFT)
        return tk_fail(TK_ERR_INVALID, "engine: a draft model drafts only with spec draft, not %s",
                       o->spec == TK_SPEC_NGRAM ? "ngram" : "off");
    if (o->spec_k == 0) o->spec_k = ENGINE_SPEC_K;
    if (o->spec_ngram == 0) o->spec_ngram = ENGINE_SPEC_NGRAM;
    if (o->spec_k < 1 || o->spec_k > ENGINE_SPEC_K_MAX)
        return tk_fail(TK_ERR_INVALID, "engine: spec_k %d, expected 1..%d", o->spec_k, ENGINE_SPEC_K_MAX);
    if (o->spec_ngram < 1 || o->spec_ngram > ENGINE_SPEC_NGRAM_MAX)
        return tk_fail(TK_ERR_INVALID, "engine: spec_ngram %d, expected 1..%d", o->spec_ngram,
                       ENGINE_SPEC_NGRAM_MAX);
    return TK_OK;
}

tk_status engine_create_backend(const backend *be, const tk_engine_opts *opts, tk_engine **out) {
    if (!out || !be) {
        if (be && be->destroy) be->destroy(be->ctx);
        return tk_fail(TK_ERR_INVALID, "engine: NULL argument");
    }
    *out = NULL;
    tk_engine_opts o;
    tk_status st = resolve_opts(opts, &o);
    if (st != TK_OK) {
        if (be->destroy) be->destroy(be->ctx);
        return st;
    }
    tk_engine *e = tk_calloc(1, sizeof *e);
    if (!e) {
        if (be->destroy) be->destroy(be->ctx);
        return tk_fail(TK_ERR_NOMEM, "engine: out of memory");
    }
    e->be = *be;
    e->o = o;
    pthread_mutex_init(&e->mu, NULL);
    pthread_cond_init(&e->cv, NULL);
    pthread_mutex_init(&e->stats_mu, NULL);
    e->so = (sched_opts){.block_size = o.block_size,
                         .ctx = o.ctx,
                         .n_blocks = be->n_blocks,
                         .max_batch = o.max_batch,
                         .step_tokens = o.step_tokens,
                         .no_chunking = o.no_chunking,
                         .static_batching = o.static_batching};
    /* An explicit step_tokens alone is a fixed budget; otherwise the budget is
     * time-based, with step_tokens (given or default) as its cap. */
    engine_default_budget(&e->so.budget);
    e->so.budget.adaptive = engine_step_adaptive(opts);
    e->so.budget.target_s = o.step_ms / 1e3;
    if (e->so.budget.min_chunk > o.step_tokens) e->so.budget.min_chunk = o.step_tokens;
    /* The prefix cache shares blocks, so it needs a backend that can; a test
     * double without the sharing calls runs without it. */
    bool can_share = be->block_ref && be->block_refs && be->block_copy;
    e->so.prefix_cache = !o.no_prefix_cache && can_share;
    e->so.prefix_seed = prefix_seed(be->model_id, be->kv_type, be->kv_scale, o.block_size);
    e->so.rewrite_block = backend_rewrite_from(be, 1) != 1;
    sched_blocks sb = {.ctx = e,
                       .alloc = be_sched_alloc,
                       .free = be_sched_free,
                       .n_free = be_sched_n_free,
                       .ref = can_share ? be_sched_ref : NULL,
                       .refs = can_share ? be_sched_refs : NULL,
                       .cow = can_share ? be_sched_cow : NULL,
                       .copy = be->block_copy ? be_sched_copy : NULL,
                       .preempted = o.spec == TK_SPEC_DRAFT ? be_sched_preempted : NULL};
    st = sched_init(&e->so, &sb, &e->sc);
    if (st != TK_OK) goto fail;
    int max_tok = sched_max_step_tokens(&e->so);
    e->tbound = be->tok ? tok_stream_bound(be->tok) : 0;
    if (e->tbound < 8) e->tbound = 8;
    size_t ob = 2 * (STOP_MAX_LEN + e->tbound) + 1;
    e->b_tokens = tk_calloc((size_t)max_tok, sizeof *e->b_tokens);
    e->b_n = tk_calloc((size_t)o.max_batch, sizeof *e->b_n);
    e->b_pos0 = tk_calloc((size_t)o.max_batch, sizeof *e->b_pos0);
    e->b_bt = tk_calloc((size_t)o.max_batch, sizeof *e->b_bt);
    e->b_want = tk_calloc((size_t)o.max_batch, sizeof *e->b_want);
    e->picks = tk_calloc((size_t)o.max_batch, sizeof *e->picks);
    e->b_pick = tk_calloc((size_t)o.max_batch, sizeof *e->b_pick);
    /* Drafts: at most spec_k a sequence and what the step cap leaves after the decodes. */
    int max_draft = 0;
    if (o.spec != TK_SPEC_OFF) {
        max_draft = o.max_batch * o.spec_k;
        if (max_draft > ENGINE_SPEC_MAX_ROWS) max_draft = ENGINE_SPEC_MAX_ROWS;
        if (max_draft > max_tok - o.max_batch) max_draft = max_tok - o.max_batch;
        if (max_draft < 0) max_draft = 0;
        e->spec =
            (spec_ctl){.k_max = o.spec_k, .max_total = max_draft, .draft_model = o.spec == TK_SPEC_DRAFT};
        e->sp_req = tk_calloc((size_t)o.max_batch, sizeof *e->sp_req);
        e->sp_alpha = tk_calloc((size_t)o.max_batch, sizeof *e->sp_alpha);
        e->sp_avail = tk_calloc((size_t)o.max_batch, sizeof *e->sp_avail);
        e->sp_k = tk_calloc((size_t)o.max_batch, sizeof *e->sp_k);
        if (!e->sp_req || !e->sp_alpha || !e->sp_avail || !e->sp_k) {
            st = tk_fail(TK_ERR_NOMEM, "engine: out of memory for the speculation state");
            goto fail;
        }
    }
    if (o.spec == TK_SPEC_DRAFT) {
        /* Its own pool: a full context for every running sequence, at most
         * the target's blocks (a sequence that finds it short drafts nothing). */
        int per_seq = (o.ctx + o.block_size - 1) / o.block_size;
        int nb = be->n_blocks;
        if ((int64_t)o.max_batch * per_seq < nb) nb = o.max_batch * per_seq;
        st = drafter_create(o.draft_model, &e->be, nb, be->max_tokens, o.max_batch, o.ctx, &e->dr);
        if (st != TK_OK) goto fail;
        e->dq_rows = max_draft;
        e->sp_jobs = tk_calloc((size_t)o.max_batch, sizeof *e->sp_jobs);
        e->df = tk_calloc((size_t)o.max_batch, sizeof *e->df);
        e->dq = tk_calloc((size_t)(max_draft > 0 ? max_draft : 1) * (size_t)be->n_vocab, sizeof *e->dq);
        e->pbuf = tk_calloc((size_t)be->n_vocab, sizeof *e->pbuf);
        if (!e->sp_jobs || !e->df || !e->dq || !e->pbuf) {
            st = tk_fail(TK_ERR_NOMEM, "engine: out of memory for the draft model's buffers");
            goto fail;
        }
    }
    e->logits = tk_calloc((size_t)(o.max_batch + max_draft) * (size_t)be->n_vocab, sizeof *e->logits);
    e->tbuf = tk_malloc(e->tbound + 1);
    e->obuf = tk_malloc(ob);
    if (!e->b_tokens || !e->b_n || !e->b_pos0 || !e->b_bt || !e->b_want || !e->picks || !e->b_pick ||
        !e->logits || !e->tbuf || !e->obuf) {
        st = tk_fail(TK_ERR_NOMEM, "engine: out of memory for step buffers (batch %d, vocab %d)", o.max_batch,
                     be->n_vocab);
        goto fail;
    }
    tk_engine_stats *s = &e->stats;
    s->block_size = o.block_size;
    s->kv_bytes_per_token = be->kv_bytes_per_token;
    s->kv_type = o.kv_type;
    s->kv_scale = o.kv_scale;
    s->unfused = o.unfused;
    s->static_batching = o.static_batching;
    s->no_chunking = o.no_chunking;
    s->step_tokens = o.step_tokens;
    s->step_adaptive = e->so.budget.adaptive;
    s->step_ms = o.step_ms;
    s->step_budget_last = e->so.budget.adaptive ? 0 : o.step_tokens;
    s->max_batch = o.max_batch;
    s->n_threads = be->n_threads;
    s->weight_dtype = be->weight_dtype;
    s->kv_blocks_total = be->n_blocks;
    s->prefix_cache = e->so.prefix_cache;
    s->spec = o.spec;
    s->spec_k = o.spec != TK_SPEC_OFF ? o.spec_k : 0;
    s->spec_fixed = o.spec != TK_SPEC_OFF && o.spec_fixed;
    if (pthread_create(&e->thread, NULL, engine_loop, e) != 0) {
        st = tk_fail(TK_ERR_NOMEM, "engine: cannot start the loop thread");
        goto fail;
    }
    e->thread_started = true;
    *out = e;
    return TK_OK;
fail:
    tk_engine_free(e);
    return st;
}

void tk_engine_free(tk_engine *e) {
    if (!e) return;
    if (e->thread_started) {
        pthread_mutex_lock(&e->mu);
        e->stopping = true;
        pthread_cond_signal(&e->cv);
        pthread_mutex_unlock(&e->mu);
        pthread_join(e->thread, NULL);
    }
    sched_free(e->sc);
    drafter_free(e->dr); /* runs on the target's pool: before it */
    if (e->be.destroy) e->be.destroy(e->be.ctx);
    tk_free(e->b_tokens);
    tk_free(e->b_n);
    tk_free(e->b_pos0);
    tk_free(e->b_bt);
    tk_free(e->b_want);
    tk_free(e->picks);
    tk_free(e->b_pick);
    tk_free(e->logits);
    tk_free(e->sp_req);
    tk_free(e->sp_alpha);
    tk_free(e->sp_avail);
    tk_free(e->sp_k);
    tk_free(e->sp_jobs);
    tk_free(e->df);
    tk_free(e->dq);
    tk_free(e->pbuf);
    tk_free(e->tbuf);
    tk_free(e->obuf);
    pthread_mutex_destroy(&e->mu);
    pthread_cond_destroy(&e->cv);
    pthread_mutex_destroy(&e->stats_mu);
    tk_free(e);
}

void engine_set_prefix_hash(tk_engine *e, prefix_hash_fn fn) { sched_set_prefix_hash(e->sc, fn); }

tk_status tk_engine_stats_get(tk_engine *e, tk_engine_stats *out) {
    if (!e || !out) return tk_fail(TK_ERR_INVALID, "stats: NULL argument");
    pthread_mutex_lock(&e->stats_mu);
    *out = e->stats;
    pthread_mutex_unlock(&e->stats_mu);
    return TK_OK;
}

int tk_engine_step_log(tk_engine *e, uint64_t after, tk_step_record *out, int max) {
    if (!e || (!out && max > 0)) return -1;
    pthread_mutex_lock(&e->stats_mu);
    const uint64_t last = e->stats.steps;
    uint64_t first = after < last ? after + 1 : last + 1; /* nothing new: no record */
    if (last >= TK_STEP_LOG && first < last - TK_STEP_LOG + 1) first = last - TK_STEP_LOG + 1;
    int n = 0;
    for (uint64_t i = first; i <= last && n < max; i++) out[n++] = e->step_log[(i - 1) % TK_STEP_LOG];
    pthread_mutex_unlock(&e->stats_mu);
    return n;
}

/* ---- over the CPU backend ------------------------------------------------------------ */

tk_status tk_engine_create(const tk_model *m, const tk_engine_opts *opts, tk_engine **out) {
    if (!out) return tk_fail(TK_ERR_INVALID, "engine: out is NULL");
    *out = NULL;
    if (!m) return tk_fail(TK_ERR_INVALID, "engine: model is NULL");
    tk_engine_opts o;
    tk_status st = resolve_opts(opts, &o);
    if (st != TK_OK) return st;
    int per_seq = (o.ctx + o.block_size - 1) / o.block_size;
    uint64_t nb = 0; /* 0: what kv_mem holds */
    if (o.kv_mem == 0) {
        if (!tk_mul_u64((uint64_t)o.max_seqs, (uint64_t)per_seq, &nb)) nb = UINT64_MAX;
        if (nb > (1u << 30))
            return tk_fail(TK_ERR_RANGE, "engine: KV pool of %llu blocks is too large",
                           (unsigned long long)nb);
    }
    backend_cpu_opts bo = {
        .n_threads = o.n_threads,
        .pin_threads = o.pin_threads,
        .cpus = o.cpus,
        .numa = o.numa,
        .block_size = o.block_size,
        .kv_type = o.kv_type,
        .kv_scale = o.kv_scale,
        .n_blocks = (int)nb,
        .kv_mem = o.kv_mem,
        .min_blocks = per_seq,
        .max_tokens = sched_max_step_tokens(
            &(sched_opts){.step_tokens = o.step_tokens, .ctx = o.ctx, .no_chunking = o.no_chunking}),
        .max_seqs = o.max_batch,
        .max_ctx = o.ctx,
        .unfused = o.unfused,
        .even_rows = o.even_rows,
    };
    backend be;
    st = backend_cpu_create(m, &bo, &be);
    if (st != TK_OK) {
        tk_error_prefix("engine");
        return st;
    }
    /* The caller's options, not the resolved ones: whether step_tokens was
     * given decides between a fixed and a time-based budget. */
    return engine_create_backend(&be, opts, out);
}
