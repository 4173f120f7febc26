/* Prometheus text exposition of the server's and the engine's numbers. */
#include "server/metrics.h"

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Bucket bounds in seconds: token gaps span ms to seconds on a CPU, requests
 * up to minutes. */
static const double B_TOKEN[] = {0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2,
                                 0.3,   0.4,    0.5,   0.75, 1.0,   1.5,  2.0,   2.5, 5.0,  10.0};
static const double B_REQUEST[] = {0.01, 0.025, 0.05, 0.1,  0.25, 0.5,  1.0,   2.5,   5.0,  10.0,
                                   15.0, 20.0,  30.0, 45.0, 60.0, 90.0, 120.0, 300.0, 600.0};

static void hist_init(srv_hist *h, const double *b, int n) {
    memset(h, 0, sizeof *h);
    h->bounds = b;
    h->n = n;
}

static void hist_add(srv_hist *h, double v) {
    if (!(v >= 0)) return; /* a time never measured */
    int i = 0;
    while (i < h->n && v > h->bounds[i]) i++;
    h->counts[i]++;
    h->sum += v;
    h->count++;
}

void srv_metrics_init(srv_metrics *m) {
    memset(m, 0, sizeof *m);
    pthread_mutex_init(&m->mu, NULL);
    int nt = (int)(sizeof B_TOKEN / sizeof B_TOKEN[0]), nr = (int)(sizeof B_REQUEST / sizeof B_REQUEST[0]);
    hist_init(&m->ttft, B_REQUEST, nr);
    hist_init(&m->tpot, B_TOKEN, nt);
    hist_init(&m->itl, B_TOKEN, nt);
    hist_init(&m->e2e, B_REQUEST, nr);
    hist_init(&m->queue, B_REQUEST, nr);
}

void srv_metrics_destroy(srv_metrics *m) { pthread_mutex_destroy(&m->mu); }

void srv_metrics_finish(srv_metrics *m, tk_finish reason, const tk_request_times *t, const double *itl,
                        int n_itl) {
    int k = reason == TK_FINISH_STOP     ? SRV_FIN_STOP
            : reason == TK_FINISH_LENGTH ? SRV_FIN_LENGTH
            : reason == TK_FINISH_ERROR  ? SRV_FIN_ERROR
                                         : SRV_FIN_ABORT;
    pthread_mutex_lock(&m->mu);
    m->finished[k]++;
    m->prompt_tokens += (uint64_t)(t->n_prompt > 0 ? t->n_prompt : 0);
    m->generation_tokens += (uint64_t)(t->n_output > 0 ? t->n_output : 0);
    if (t->scheduled > 0) hist_add(&m->queue, t->scheduled - t->queued);
    if (t->first_token > 0) hist_add(&m->ttft, t->first_token - t->queued);
    if (t->finished > 0) hist_add(&m->e2e, t->finished - t->queued);
    /* TPOT: the mean gap after the first token, for requests with two or more tokens. */
    if (t->first_token > 0 && t->n_output > 1 && n_itl > 0) {
        double s = 0;
        for (int i = 0; i < n_itl; i++) s += itl[i];
        hist_add(&m->tpot, s / n_itl);
    }
    for (int i = 0; i < n_itl; i++) hist_add(&m->itl, itl[i]);
    if (t->finished > 0) {
        m->finish_times[m->finish_at] = t->finished;
        m->finish_at = (m->finish_at + 1) % 64;
        if (m->n_finish < 64) m->n_finish++;
    }
    pthread_mutex_unlock(&m->mu);
}

void srv_metrics_reject(srv_metrics *m, int why) {
    pthread_mutex_lock(&m->mu);
    m->rejected[why]++;
    pthread_mutex_unlock(&m->mu);
}

void srv_metrics_response(srv_metrics *m, int status) {
    int c = status / 100;
    if (c < 1 || c > 5) return;
    pthread_mutex_lock(&m->mu);
    m->responses[c]++;
    pthread_mutex_unlock(&m->mu);
}

int srv_metrics_retry_after(srv_metrics *m, int waiting, double now) {
    pthread_mutex_lock(&m->mu);
    double oldest = now, newest = 0;
    int n = m->n_finish;
    for (int i = 0; i < n; i++) {
        double t = m->finish_times[i];
        if (t < oldest) oldest = t;
        if (t > newest) newest = t;
    }
    pthread_mutex_unlock(&m->mu);
    /* Requests finished per second over the recent ones (the newest counted up to now). */
    double rate = n >= 2 && now > oldest ? (n - 1) / (now - oldest) : 0;
    double s = rate > 0 ? (waiting + 1) / rate : 60;
    if (!(s >= 1)) s = 1;
    if (s > 60) s = 60;
    return (int)ceil(s);
}

/* ---- rendering ---- */

typedef struct sbuf {
    char *p;
    size_t n, cap;
    int oom;
} sbuf;

static void sb_printf(sbuf *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void sb_printf(sbuf *b, const char *fmt, ...) {
    if (b->oom) return;
    for (;;) {
        va_list ap;
        va_start(ap, fmt);
        int k = vsnprintf(b->p + b->n, b->cap - b->n, fmt, ap);
        va_end(ap);
        if (k < 0) {
            b->oom = 1;
            return;
        }
        if ((size_t)k < b->cap - b->n) {
            b->n += (size_t)k;
            return;
        }
        size_t nc = (b->cap + (size_t)k + 1) * 2;
        char *q = realloc(b->p, nc);
        if (!q) {
            b->oom = 1;
            return;
        }
        b->p = q;
        b->cap = nc;
    }
}

static void head(sbuf *b, const char *name, const char *type, const char *help) {
    sb_printf(b, "# HELP %s %s\n# TYPE %s %s\n", name, help, name, type);
}

static void one(sbuf *b, const char *name, const char *type, const char *help, double v) {
    head(b, name, type, help);
    sb_printf(b, "%s %.17g\n", name, v);
}

static void hist(sbuf *b, const char *name, const char *help, const srv_hist *h) {
    head(b, name, "histogram", help);
    uint64_t cum = 0;
    for (int i = 0; i < h->n; i++) {
        cum += h->counts[i];
        sb_printf(b, "%s_bucket{le=\"%g\"} %llu\n", name, h->bounds[i], (unsigned long long)cum);
    }
    cum += h->counts[h->n];
    sb_printf(b, "%s_bucket{le=\"+Inf\"} %llu\n%s_sum %.17g\n%s_count %llu\n", name, (unsigned long long)cum,
              name, h->sum, name, (unsigned long long)h->count);
}

char *srv_metrics_render(srv_metrics *m, const tk_engine_stats *st, int live, size_t *len) {
    sbuf b = {.cap = 8192};
    if (!(b.p = malloc(b.cap))) return NULL;
    b.p[0] = 0;
    pthread_mutex_lock(&m->mu);
    static const char *const fin[SRV_FIN_N] = {"stop", "length", "abort", "error"};
    head(&b, "tokamak_requests_total", "counter", "Generation requests finished, by finish reason.");
    for (int i = 0; i < SRV_FIN_N; i++)
        sb_printf(&b, "tokamak_requests_total{finish_reason=\"%s\"} %llu\n", fin[i],
                  (unsigned long long)m->finished[i]);
    static const char *const rej[SRV_REJ_N] = {"queue_full", "draining"};
    head(&b, "tokamak_requests_rejected_total", "counter",
         "Generation requests refused before queueing, by reason.");
    for (int i = 0; i < SRV_REJ_N; i++)
        sb_printf(&b, "tokamak_requests_rejected_total{reason=\"%s\"} %llu\n", rej[i],
                  (unsigned long long)m->rejected[i]);
    head(&b, "tokamak_http_responses_total", "counter", "HTTP responses sent, by status class.");
    for (int c = 2; c <= 5; c++)
        sb_printf(&b, "tokamak_http_responses_total{code=\"%dxx\"} %llu\n", c,
                  (unsigned long long)m->responses[c]);
    one(&b, "tokamak_prompt_tokens_total", "counter", "Prompt tokens of finished requests.",
        (double)m->prompt_tokens);
    one(&b, "tokamak_generation_tokens_total", "counter", "Output tokens of finished requests.",
        (double)m->generation_tokens);
    hist(&b, "tokamak_time_to_first_token_seconds", "Time from queueing to the first output token.",
         &m->ttft);
    hist(&b, "tokamak_time_per_output_token_seconds",
         "Mean gap between output tokens after the first, per request.", &m->tpot);
    hist(&b, "tokamak_inter_token_latency_seconds", "Gap between consecutive output tokens.", &m->itl);
    hist(&b, "tokamak_e2e_request_latency_seconds", "Time from queueing to the end of a request.", &m->e2e);
    hist(&b, "tokamak_request_queue_time_seconds", "Time from queueing to the first scheduled step.",
         &m->queue);
    pthread_mutex_unlock(&m->mu);
    one(&b, "tokamak_http_requests_in_flight", "gauge", "HTTP requests the server is handling.", live);
    if (st) {
        one(&b, "tokamak_requests_running", "gauge", "Requests in the running batch.", st->running);
        one(&b, "tokamak_requests_waiting", "gauge", "Requests queued and not running.", st->waiting);
        head(&b, "tokamak_requests_waiting_reason", "gauge", "Waiting requests by why they wait.");
        sb_printf(&b, "tokamak_requests_waiting_reason{reason=\"no_kv_blocks\"} %d\n", st->waiting_no_blocks);
        sb_printf(&b, "tokamak_requests_waiting_reason{reason=\"behind_prefill\"} %d\n",
                  st->waiting_behind_prefill);
        sb_printf(&b, "tokamak_requests_waiting_reason{reason=\"preempted\"} %d\n", st->waiting_preempted);
        one(&b, "tokamak_kv_blocks_used", "gauge", "KV cache blocks in use.", st->kv_blocks_used);
        one(&b, "tokamak_kv_blocks_total", "gauge", "KV cache blocks in the pool.", st->kv_blocks_total);
        one(&b, "tokamak_kv_blocks_peak", "gauge", "Most KV cache blocks ever in use.", st->kv_blocks_peak);
        one(&b, "tokamak_kv_cache_usage_ratio", "gauge", "KV cache blocks in use over the pool (0..1).",
            st->kv_blocks_total ? (double)st->kv_blocks_used / st->kv_blocks_total : 0.0);
        one(&b, "tokamak_kv_block_size_tokens", "gauge", "Tokens per KV cache block.", st->block_size);
        one(&b, "tokamak_preemptions_total", "counter", "Running requests preempted to free KV blocks.",
            (double)st->preemptions);
        one(&b, "tokamak_prefix_cache_queries_tokens_total", "counter",
            "Prompt tokens looked up in the prefix cache at admission.",
            (double)st->prefix_cache_query_tokens);
        one(&b, "tokamak_prefix_cache_hits_tokens_total", "counter",
            "Prompt tokens found in the prefix cache (not prefilled).", (double)st->prefix_cache_hit_tokens);
        one(&b, "tokamak_prefix_cache_blocks", "gauge", "Full KV blocks in the prefix cache.",
            st->prefix_cache_blocks);
        one(&b, "tokamak_prefix_cache_evictions_total", "counter",
            "Idle cached KV blocks evicted to make room.", (double)st->prefix_cache_evictions);
        one(&b, "tokamak_spec_drafted_tokens_total", "counter",
            "Draft tokens verified by speculative decoding.", (double)st->spec_drafted);
        one(&b, "tokamak_spec_accepted_tokens_total", "counter", "Draft tokens accepted.",
            (double)st->spec_accepted);
        one(&b, "tokamak_spec_acceptance_ratio", "gauge", "Accepted over drafted tokens (0..1).",
            st->spec_drafted ? (double)st->spec_accepted / (double)st->spec_drafted : 0.0);
        one(&b, "tokamak_spec_verify_decodes_total", "counter", "Decodes that verified drafts.",
            (double)st->spec_verifies);
        one(&b, "tokamak_spec_offered_decodes_total", "counter",
            "Decodes with a draft on offer (the controller chose k for them).", (double)st->spec_decodes);
        one(&b, "tokamak_spec_k_last", "gauge", "Draft tokens the controller chose in the last step.",
            st->spec_k_last);
        head(&b, "tokamak_spec_drafter", "gauge",
             "The drafter speculative decoding runs (1 for the one in use).");
        sb_printf(&b, "tokamak_spec_drafter{drafter=\"%s\"} 1\n",
                  st->spec == TK_SPEC_DRAFT   ? "draft"
                  : st->spec == TK_SPEC_NGRAM ? "ngram"
                                              : "off");
        one(&b, "tokamak_spec_draft_seconds_total", "counter",
            "Seconds the draft model spent drafting (its passes and their sampling).",
            st->spec_draft_seconds);
        one(&b, "tokamak_spec_draft_prefill_seconds_total", "counter",
            "Seconds the draft model spent prefilling prompts beside the model's prefill.",
            st->spec_follow_seconds);
        one(&b, "tokamak_spec_draft_prefill_tokens_total", "counter",
            "Prompt tokens the draft model prefilled beside the model's prefill.",
            (double)st->spec_follow_tokens);
        one(&b, "tokamak_spec_kv_restores_total", "counter",
            "Blocks put back from their copy after a rejected draft (INT8 per-head KV).",
            (double)st->spec_kv_restores);
        one(&b, "tokamak_spec_refed_tokens_total", "counter",
            "Known positions computed again after rejected drafts (INT8 per-head KV).",
            (double)st->spec_refed_tokens);
        one(&b, "tokamak_spec_draft_time_ratio", "gauge",
            "The draft model's share of the decode steps it drafted in (0..1).",
            st->spec_turn_seconds > 0 ? st->spec_draft_seconds / st->spec_turn_seconds : 0.0);
        one(&b, "tokamak_engine_steps_total", "counter", "Engine steps run.", (double)st->steps);
        one(&b, "tokamak_engine_step_duration_seconds", "gauge", "Wall time of the last engine step.",
            st->step_time_last);
        one(&b, "tokamak_decode_steps_total", "counter",
            "Steps that processed no prompt token (pure decode).", (double)st->decode_steps);
        one(&b, "tokamak_decode_step_seconds_total", "counter", "Forward time of the pure decode steps.",
            st->decode_seconds);
        one(&b, "tokamak_decode_read_bytes_total", "counter",
            "Weight and KV bytes the pure decode steps had to read (their rate over the seconds: the "
            "bandwidth decode achieves).",
            st->decode_bytes);
    }
    if (b.oom) {
        free(b.p);
        return NULL;
    }
    *len = b.n;
    return b.p;
}
