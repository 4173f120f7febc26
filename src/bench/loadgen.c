/* The loadgen driver: libcurl's multi interface runs every stream of a run
 * from this one thread, so each token's timestamp is taken when its bytes are
 * handed over, with no lock or queue between socket and clock. */
#include "bench/loadgen.h"

#include <cjson/cJSON.h>
#include <curl/curl.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <time.h>

#include "core/alloc.h"
#include "core/cpu.h"
#include "core/error.h"

#define LG_WARMUP_OUT   16
#define LG_ERRBODY_MAX  4096
#define LG_MAX_INFLIGHT 4096 /* rate mode: arrivals past this many open streams wait */
#define LG_POOL_EXTRA   4096 /* prompt windows start anywhere in this many tokens */

/* ---- SSE ------------------------------------------------------------------- */

static bool grow(char **p, size_t *cap, size_t need) {
    if (need <= *cap) return true;
    if (need > LG_SSE_MAX_LINE + 1) return false;
    size_t nc = *cap ? *cap : 256;
    while (nc < need) nc *= 2;
    char *q = tk_realloc(*p, nc);
    if (!q) return false;
    *p = q;
    *cap = nc;
    return true;
}

/* One complete line (without its end). */
static bool sse_line(lg_sse *p, lg_sse_fn fn, void *user) {
    const char *l = p->line ? p->line : "";
    size_t n = p->n_line;
    p->n_line = 0;
    if (n == 0) { /* blank: dispatch */
        if (!p->has_data) return true;
        p->has_data = false;
        size_t k = p->n_data;
        p->n_data = 0;
        if (!grow(&p->data, &p->cap_data, k + 1)) return false;
        p->data[k] = 0;
        return fn(user, p->data, k);
    }
    if (l[0] == ':') return true; /* a comment (keep-alive) */
    const char *colon = memchr(l, ':', n);
    size_t nf = colon ? (size_t)(colon - l) : n;
    if (nf != 4 || memcmp(l, "data", 4) != 0) return true; /* event, id, retry: not needed */
    const char *v = colon ? colon + 1 : l + n;
    size_t nv = (size_t)(l + n - v);
    if (nv && v[0] == ' ') v++, nv--;
    size_t need = p->n_data + (p->has_data ? 1 : 0) + nv;
    if (need > LG_SSE_MAX_LINE || !grow(&p->data, &p->cap_data, need + 1)) return false;
    if (p->has_data) p->data[p->n_data++] = '\n';
    memcpy(p->data + p->n_data, v, nv);
    p->n_data += nv;
    p->has_data = true;
    return true;
}

bool lg_sse_feed(lg_sse *p, const char *buf, size_t n, lg_sse_fn fn, void *user) {
    for (size_t i = 0; i < n; i++) {
        char c = buf[i];
        if (c == '\n' && p->cr) {
            p->cr = false;
            continue;
        }
        p->cr = c == '\r';
        if (c == '\n' || c == '\r') {
            if (!sse_line(p, fn, user)) return false;
            continue;
        }
        /* Copy the run of ordinary bytes at once. */
        size_t j = i;
        while (j < n && buf[j] != '\n' && buf[j] != '\r') j++;
        size_t k = j - i;
        if (p->n_line + k > LG_SSE_MAX_LINE || !grow(&p->line, &p->cap_line, p->n_line + k + 1)) return false;
        memcpy(p->line + p->n_line, buf + i, k);
        p->n_line += k;
        i = j - 1;
    }
    return true;
}

void lg_sse_free(lg_sse *p) {
    tk_free(p->line);
    tk_free(p->data);
    memset(p, 0, sizeof *p);
}

static int json_int(const cJSON *o, const char *k) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, k);
    if (!cJSON_IsNumber(v) || !(v->valuedouble >= 0) || v->valuedouble > 1e9) return -1;
    return (int)v->valuedouble;
}

static bool nonempty_str(const cJSON *o, const char *k) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, k);
    return cJSON_IsString(v) && v->valuestring && v->valuestring[0];
}

void lg_frame_parse(const char *data, size_t n, lg_frame *f) {
    memset(f, 0, sizeof *f);
    f->completion_tokens = f->prompt_tokens = -1;
    if (n == 6 && memcmp(data, "[DONE]", 6) == 0) {
        f->done = true;
        return;
    }
    cJSON *o = cJSON_ParseWithLength(data, n);
    if (!cJSON_IsObject(o)) {
        cJSON_Delete(o);
        return;
    }
    f->json_ok = true;
    const cJSON *err = cJSON_GetObjectItemCaseSensitive(o, "error");
    if (err) {
        const cJSON *m = cJSON_IsObject(err) ? cJSON_GetObjectItemCaseSensitive(err, "message") : err;
        snprintf(f->error, sizeof f->error, "%s",
                 cJSON_IsString(m) && m->valuestring && m->valuestring[0] ? m->valuestring
                                                                          : "an error frame");
    }
    const cJSON *ch = cJSON_GetObjectItemCaseSensitive(o, "choices");
    const cJSON *c0 = cJSON_IsArray(ch) ? ch->child : NULL;
    if (cJSON_IsObject(c0)) {
        const cJSON *d = cJSON_GetObjectItemCaseSensitive(c0, "delta");
        f->has_text =
            nonempty_str(c0, "text") ||
            (cJSON_IsObject(d) && (nonempty_str(d, "content") || nonempty_str(d, "reasoning_content") ||
                                   nonempty_str(d, "reasoning")));
        const cJSON *fr = cJSON_GetObjectItemCaseSensitive(c0, "finish_reason");
        if (cJSON_IsString(fr) && fr->valuestring) {
            const char *s = fr->valuestring;
            f->finish = !strcmp(s, "length")                             ? TK_FINISH_LENGTH
                        : !strcmp(s, "stop") || !strcmp(s, "eos")        ? TK_FINISH_STOP
                        : !strcmp(s, "abort") || !strcmp(s, "cancelled") ? TK_FINISH_CANCELLED
                                                                         : TK_FINISH_ERROR;
        }
    }
    const cJSON *u = cJSON_GetObjectItemCaseSensitive(o, "usage");
    if (cJSON_IsObject(u)) {
        f->completion_tokens = json_int(u, "completion_tokens");
        f->prompt_tokens = json_int(u, "prompt_tokens");
    }
    cJSON_Delete(o);
}

/* ---- requests ------------------------------------------------------------------ */

typedef struct lg lg;

typedef struct lg_req {
    lg *g;
    CURL *h;
    char *body;
    lg_sse sse;
    long status; /* HTTP status once the headers are in; 0 before */
    double t_submit, t_done;
    double *tok_t; /* arrival of each frame that carried text */
    int n_tok, cap_tok;
    int usage_out, usage_prompt; /* -1 unknown */
    tk_finish finish;
    bool saw_done, finished, failed;
    int err_status; /* when failed: HTTP status, BENCH_ERR_TRANSPORT or BENCH_ERR_STREAM */
    char err[160];
    char *ebody; /* a non-200 answer's body (its first LG_ERRBODY_MAX bytes) */
    size_t n_ebody;
    double now; /* the time of the bytes being read */
} lg_req;

struct lg {
    const loadgen_opts *o;
    CURLM *multi;
    struct curl_slist *hdr;
    char url_completions[512];
    int32_t *pool; /* prompt token ids */
    size_t n_pool;
    int n_active; /* handles in the multi */
};

static void req_fail(lg_req *r, int status, const char *fmt, const char *arg) {
    if (r->failed) return;
    r->failed = true;
    r->err_status = status;
    snprintf(r->err, sizeof r->err, fmt, arg ? arg : "");
}

static bool on_event(void *user, const char *data, size_t n) {
    lg_req *r = user;
    lg_frame f;
    lg_frame_parse(data, n, &f);
    if (f.done) {
        r->saw_done = true;
        return true;
    }
    if (!f.json_ok) {
        req_fail(r, BENCH_ERR_STREAM, "a stream frame is not a JSON object%s", NULL);
        return true;
    }
    if (f.error[0]) req_fail(r, BENCH_ERR_STREAM, "error frame: %s", f.error);
    if (f.has_text) {
        if (r->n_tok == r->cap_tok) {
            int nc = r->cap_tok ? r->cap_tok * 2 : 64;
            double *q = tk_realloc(r->tok_t, (size_t)nc * sizeof *q);
            if (!q) return false;
            r->tok_t = q;
            r->cap_tok = nc;
        }
        r->tok_t[r->n_tok++] = r->now;
    }
    if (f.finish != TK_FINISH_NONE) r->finish = f.finish;
    if (f.completion_tokens >= 0) r->usage_out = f.completion_tokens;
    if (f.prompt_tokens >= 0) r->usage_prompt = f.prompt_tokens;
    return true;
}

static size_t on_write(char *ptr, size_t size, size_t nmemb, void *user) {
    lg_req *r = user;
    size_t n = size * nmemb;
    r->now = tk_now_s();
    if (r->status == 0) curl_easy_getinfo(r->h, CURLINFO_RESPONSE_CODE, &r->status);
    if (r->status != 200) {
        size_t k = r->n_ebody + n > LG_ERRBODY_MAX ? LG_ERRBODY_MAX - r->n_ebody : n;
        if (k) {
            char *q = tk_realloc(r->ebody, r->n_ebody + k + 1);
            if (!q) return 0;
            memcpy(q + r->n_ebody, ptr, k);
            r->ebody = q;
            r->n_ebody += k;
            r->ebody[r->n_ebody] = 0;
        }
        return n;
    }
    if (!lg_sse_feed(&r->sse, ptr, n, on_event, r)) {
        req_fail(r, BENCH_ERR_STREAM, "unreadable stream (a line or event past 1 MiB, or no memory)%s", NULL);
        return 0; /* aborts the transfer */
    }
    return n;
}

static void req_free(lg_req *r) {
    if (!r) return;
    if (r->h) {
        if (r->g && !r->finished) {
            curl_multi_remove_handle(r->g->multi, r->h);
            r->g->n_active--;
        }
        curl_easy_cleanup(r->h);
    }
    lg_sse_free(&r->sse);
    tk_free(r->body);
    tk_free(r->tok_t);
    tk_free(r->ebody);
    tk_free(r);
}

/* The body of a run's request idx: n_in ids from the pool, starting at the
 * run's seeded position + idx, so that the first LG_POOL_EXTRA requests of a
 * run start at distinct positions and share no prefix (a prefix cache must
 * not serve one from another's prompt). */
static char *make_body(const lg *g, int n_in, int n_out, uint64_t seed, int idx) {
    uint64_t x = seed;
    size_t span = g->n_pool - (size_t)n_in + 1;
    size_t off = (size_t)((bench_splitmix64(&x) + (uint64_t)idx) % span);
    cJSON *o = cJSON_CreateObject();
    cJSON_AddStringToObject(o, "model", g->o->model);
    cJSON *p = cJSON_AddArrayToObject(o, "prompt");
    for (int i = 0; p && i < n_in; i++) cJSON_AddItemToArray(p, cJSON_CreateNumber(g->pool[off + (size_t)i]));
    cJSON_AddNumberToObject(o, "max_tokens", n_out);
    cJSON_AddNumberToObject(o, "temperature", 0);
    cJSON_AddBoolToObject(o, "ignore_eos",
                          true); /* exact lengths: a model that stops early would look fast */
    cJSON_AddBoolToObject(o, "stream", true);
    cJSON_AddBoolToObject(cJSON_AddObjectToObject(o, "stream_options"), "include_usage", true);
    char *s = cJSON_PrintUnformatted(o);
    cJSON_Delete(o);
    return s;
}

static tk_status req_start(lg *g, int n_in, int n_out, uint64_t seed, int idx, lg_req **out) {
    *out = NULL;
    lg_req *r = tk_calloc(1, sizeof *r);
    if (!r) return tk_fail(TK_ERR_NOMEM, "loadgen: no memory for a request");
    r->g = g;
    r->usage_out = r->usage_prompt = -1;
    char *b = make_body(g, n_in, n_out, seed, idx);
    r->body = b ? tk_malloc(strlen(b) + 1) : NULL;
    if (r->body) memcpy(r->body, b, strlen(b) + 1);
    cJSON_free(b);
    r->h = curl_easy_init();
    if (!r->body || !r->h) {
        req_free(r);
        return tk_fail(TK_ERR_NOMEM, "loadgen: no memory for a request");
    }
    CURL *h = r->h;
    curl_easy_setopt(h, CURLOPT_URL, g->url_completions);
    curl_easy_setopt(h, CURLOPT_HTTPHEADER, g->hdr);
    curl_easy_setopt(h, CURLOPT_POSTFIELDS, r->body);
    curl_easy_setopt(h, CURLOPT_WRITEFUNCTION, on_write);
    curl_easy_setopt(h, CURLOPT_WRITEDATA, r);
    curl_easy_setopt(h, CURLOPT_PRIVATE, r);
    curl_easy_setopt(h, CURLOPT_NOSIGNAL, 1L);
    curl_easy_setopt(h, CURLOPT_TCP_NODELAY, 1L);
    curl_easy_setopt(h, CURLOPT_CONNECTTIMEOUT, 30L);
    /* Nothing received for timeout_s: the request failed (a stalled server). */
    curl_easy_setopt(h, CURLOPT_LOW_SPEED_LIMIT, 1L);
    curl_easy_setopt(h, CURLOPT_LOW_SPEED_TIME, (long)ceil(g->o->timeout_s));
    r->t_submit = tk_now_s();
    if (curl_multi_add_handle(g->multi, h) != CURLM_OK) {
        req_free(r);
        return tk_fail(TK_ERR_INTERNAL, "loadgen: curl refused a request handle");
    }
    g->n_active++;
    *out = r;
    return TK_OK;
}

/* The message of an OpenAI-form error body ({"error": {"message": ...}} or
 * {"error": "..."}), else the body's start; "" without a body. */
static void error_message(const char *body, char *out, size_t n) {
    out[0] = 0;
    if (!body) return;
    cJSON *o = cJSON_Parse(body);
    const cJSON *e = cJSON_GetObjectItemCaseSensitive(o, "error");
    const cJSON *m = cJSON_IsObject(e) ? cJSON_GetObjectItemCaseSensitive(e, "message") : e;
    if (cJSON_IsString(m) && m->valuestring)
        snprintf(out, n, "%s", m->valuestring);
    else
        snprintf(out, n, "%.120s", body);
    cJSON_Delete(o);
}

/* A transfer ended: settle how the request went. */
static void req_done(lg_req *r, CURLcode rc) {
    r->finished = true;
    r->t_done = tk_now_s();
    if (r->status == 0) curl_easy_getinfo(r->h, CURLINFO_RESPONSE_CODE, &r->status);
    if (r->failed) return;
    if (rc != CURLE_OK && r->status == 0) {
        req_fail(r, BENCH_ERR_TRANSPORT, "%s", curl_easy_strerror(rc));
    } else if (r->status != 200 && r->status != 0) {
        char msg[160];
        error_message(r->ebody, msg, sizeof msg);
        req_fail(r, (int)r->status, "%s", msg);
    } else if (rc != CURLE_OK) {
        req_fail(r, BENCH_ERR_STREAM, "stream broke: %s", curl_easy_strerror(rc));
    } else if (!r->saw_done) {
        req_fail(r, BENCH_ERR_STREAM, "the stream ended without data: [DONE]%s", NULL);
    }
}

/* Let curl work for at most wait_ms, then settle the transfers that ended. */
static tk_status pump(lg *g, int wait_ms) {
    int running = 0;
    if (curl_multi_perform(g->multi, &running) != CURLM_OK)
        return tk_fail(TK_ERR_INTERNAL, "loadgen: curl_multi_perform failed");
    CURLMsg *msg;
    int left;
    while ((msg = curl_multi_info_read(g->multi, &left))) {
        if (msg->msg != CURLMSG_DONE) continue;
        lg_req *r = NULL;
        curl_easy_getinfo(msg->easy_handle, CURLINFO_PRIVATE, (char **)&r);
        CURLcode rc = msg->data.result;
        curl_multi_remove_handle(g->multi, msg->easy_handle);
        g->n_active--;
        if (r) req_done(r, rc);
    }
    if (wait_ms > 0 && curl_multi_poll(g->multi, NULL, 0, wait_ms, NULL) != CURLM_OK)
        return tk_fail(TK_ERR_INTERNAL, "loadgen: curl_multi_poll failed");
    return TK_OK;
}

/* ---- one run ------------------------------------------------------------------ */

typedef struct lg_plan {
    int n_requests; /* 0 with a duration: as many as it takes */
    double duration_s;
    int concurrency; /* 0: rate mode */
    double rate;
    int n_in, n_out;
    uint64_t seed;
} lg_plan;

typedef struct lg_run {
    lg_req **req;
    int n, cap;
    double t0;
} lg_run;

static void run_free(lg_run *u) {
    for (int i = 0; i < u->n; i++) req_free(u->req[i]);
    tk_free(u->req);
    memset(u, 0, sizeof *u);
}

static tk_status run_push(lg_run *u, lg_req *r) {
    if (u->n == u->cap) {
        int nc = u->cap ? u->cap * 2 : 64;
        lg_req **q = tk_realloc(u->req, (size_t)nc * sizeof *q);
        if (!q) return tk_fail(TK_ERR_NOMEM, "loadgen: no memory for %d requests", nc);
        u->req = q;
        u->cap = nc;
    }
    u->req[u->n++] = r;
    return TK_OK;
}

static int run_done(const lg_run *u) {
    int k = 0;
    for (int i = 0; i < u->n; i++) k += u->req[i]->finished;
    return k;
}

/* Submit and drive the plan until every request submitted has ended. */
static tk_status run_plan(lg *g, const lg_plan *p, lg_run *u) {
    uint64_t arrivals = p->seed ^ 0xa5a5a5a5deadbeefull;
    double t0 = tk_now_s(), next_arrival = t0;
    u->t0 = t0;
    for (;;) {
        double now = tk_now_s();
        int done = run_done(u);
        bool more = p->duration_s > 0 ? now - t0 < p->duration_s : u->n < p->n_requests;
        while (more) {
            int inflight = u->n - done;
            if (p->concurrency > 0 ? inflight >= p->concurrency
                                   : now < next_arrival || inflight >= LG_MAX_INFLIGHT)
                break;
            lg_req *r;
            tk_status st = req_start(g, p->n_in, p->n_out, p->seed, u->n, &r);
            if (st != TK_OK) return st;
            st = run_push(u, r);
            if (st != TK_OK) {
                req_free(r);
                return st;
            }
            if (p->concurrency == 0) next_arrival += -log(bench_rand_unit(&arrivals)) / p->rate;
            more = p->duration_s > 0 ? now - t0 < p->duration_s : u->n < p->n_requests;
        }
        if (!more && run_done(u) == u->n) return TK_OK;
        /* Wake for bytes, or by the next arrival, or after 50 ms to re-check. */
        int wait_ms = 50;
        if (more && p->concurrency == 0) {
            double d = (next_arrival - tk_now_s()) * 1e3;
            wait_ms = d < 1 ? 1 : d < 50 ? (int)d : 50;
        }
        tk_status st = pump(g, wait_ms);
        if (st != TK_OK) return st;
    }
}

/* The measured samples of a finished run (submit order) into l. */
static tk_status run_collect(const lg_run *u, const lg_plan *p, bench_level *l) {
    l->concurrency = p->concurrency;
    l->rate = p->rate;
    l->n_asked_out = p->n_out;
    l->req = u->n ? tk_calloc((size_t)u->n, sizeof *l->req) : NULL;
    size_t n_itl = 0;
    for (int i = 0; i < u->n; i++) n_itl += u->req[i]->n_tok > 1 ? (size_t)(u->req[i]->n_tok - 1) : 0;
    l->itl = n_itl ? tk_calloc(n_itl, sizeof(double)) : NULL;
    if ((u->n && !l->req) || (n_itl && !l->itl))
        return tk_fail(TK_ERR_NOMEM, "loadgen: no memory for the samples");
    l->n_requests = u->n;
    double t_end = u->t0;
    for (int i = 0; i < u->n; i++) {
        const lg_req *q = u->req[i];
        bench_request *r = &l->req[i];
        bench_request_fill(r, u->t0, q->t_submit, q->tok_t, q->n_tok, l->itl ? l->itl + l->n_itl : NULL);
        r->itl_off = l->n_itl;
        l->n_itl += q->n_tok > 1 ? (size_t)(q->n_tok - 1) : 0;
        /* The server counts tokens; frames may carry several (or a partial
         * character none). TPOT spreads the decode time over its count. */
        if (q->usage_out >= 0 && q->n_tok > 0) {
            r->n_output = q->usage_out;
            r->tpot = q->usage_out > 1 ? (r->t_last - r->t_first) / (q->usage_out - 1) : NAN;
        }
        r->n_prompt = q->usage_prompt >= 0 ? q->usage_prompt : p->n_in;
        r->finish = q->failed ? TK_FINISH_ERROR : q->finish;
        if (q->failed) {
            bench_errors_add(&l->err, q->err_status, q->err);
            /* A failed request delivered no usable latency. */
            r->n_output = 0;
        }
        if (q->t_done > t_end) t_end = q->t_done;
    }
    l->t_start = 0;
    l->t_end = t_end - u->t0;
    l->t_origin = u->t0;
    return bench_level_finalize(l);
}

/* ---- background streams ---------------------------------------------------------- */

static tk_status bg_start(lg *g, const loadgen_opts *o, uint64_t seed, lg_run *bg) {
    for (int i = 0; i < o->b.n_bg; i++) {
        lg_req *r;
        tk_status st = req_start(g, o->b.bg_in, o->b.bg_out, seed, i, &r);
        if (st != TK_OK) return st;
        st = run_push(bg, r);
        if (st != TK_OK) {
            req_free(r);
            return st;
        }
    }
    double t_last = tk_now_s();
    int seen = 0;
    for (;;) {
        int first = 0;
        for (int i = 0; i < bg->n; i++) {
            const lg_req *r = bg->req[i];
            if (r->finished || r->failed) {
                char buf[16];
                return tk_fail(TK_ERR_INTERNAL,
                               "loadgen: background stream %d ended before all %d decoded (%s%s%s)", i, bg->n,
                               r->failed ? bench_error_kind_name(r->err_status, buf, sizeof buf) : "finished",
                               r->failed ? ": " : "", r->failed ? r->err : "");
            }
            first += r->n_tok > 0;
        }
        if (first == bg->n) return TK_OK;
        if (first != seen) seen = first, t_last = tk_now_s();
        if (tk_now_s() - t_last > o->timeout_s)
            return tk_fail(TK_ERR_INTERNAL, "loadgen: only %d of %d background streams decoded after %.0f s",
                           first, bg->n, o->timeout_s);
        tk_status st = pump(g, 20);
        if (st != TK_OK) return st;
    }
}

/* Close the streams (the server sees the connections go) and keep what they
 * did inside l's window. */
static tk_status bg_stop(lg_run *bg, bench_level *l) {
    bench_bg *b = &l->bg;
    int n = bg->n;
    size_t n_gap = 0;
    for (int i = 0; i < n; i++) n_gap += bg->req[i]->n_tok > 1 ? (size_t)(bg->req[i]->n_tok - 1) : 0;
    b->stream = tk_calloc((size_t)n, sizeof *b->stream);
    b->itl = n_gap ? tk_calloc(n_gap, sizeof(double)) : NULL;
    if (!b->stream || (n_gap && !b->itl))
        return tk_fail(TK_ERR_NOMEM, "loadgen: no memory for background samples");
    b->n_streams = n;
    b->w0 = 0;
    b->w1 = l->t_end;
    double w0 = l->t_origin, w1 = l->t_origin + l->t_end;
    for (int i = 0; i < n; i++) {
        const lg_req *r = bg->req[i];
        bench_bg_stream *q = &b->stream[i];
        q->itl_off = b->n_itl;
        q->n_window =
            (int)bench_window_gaps(r->tok_t, r->n_tok, w0, w1, b->itl ? b->itl + b->n_itl : NULL, &q->tpot);
        b->n_itl += (size_t)q->n_window;
        q->n_output = r->usage_out >= 0 ? r->usage_out : r->n_tok;
        q->finish = r->failed ? TK_FINISH_ERROR : r->finished ? r->finish : TK_FINISH_CANCELLED;
        double last = r->n_tok ? r->tok_t[r->n_tok - 1] : r->t_submit;
        if (r->finished && last <= w1) b->exhausted = true;
    }
    return bench_bg_finalize(l);
}

/* ---- set-up: model name and prompt pool ------------------------------------------ */

typedef struct lg_buf {
    char *p;
    size_t n;
} lg_buf;

static size_t buf_write(char *ptr, size_t size, size_t nmemb, void *user) {
    lg_buf *b = user;
    size_t n = size * nmemb;
    if (b->n + n > (64u << 20)) return 0;
    char *q = tk_realloc(b->p, b->n + n + 1);
    if (!q) return 0;
    memcpy(q + b->n, ptr, n);
    b->p = q;
    b->n += n;
    b->p[b->n] = 0;
    return n;
}

/* One blocking request; *out is the parsed JSON answer (NULL if it is not JSON). */
static tk_status http_json(const lg *g, const char *path, const char *body, cJSON **out) {
    *out = NULL;
    char url[600];
    snprintf(url, sizeof url, "%s%s", g->o->url, path);
    CURL *h = curl_easy_init();
    if (!h) return tk_fail(TK_ERR_NOMEM, "loadgen: curl_easy_init failed");
    lg_buf b = {0};
    curl_easy_setopt(h, CURLOPT_URL, url);
    curl_easy_setopt(h, CURLOPT_HTTPHEADER, g->hdr);
    if (body) curl_easy_setopt(h, CURLOPT_POSTFIELDS, body);
    curl_easy_setopt(h, CURLOPT_WRITEFUNCTION, buf_write);
    curl_easy_setopt(h, CURLOPT_WRITEDATA, &b);
    curl_easy_setopt(h, CURLOPT_NOSIGNAL, 1L);
    curl_easy_setopt(h, CURLOPT_CONNECTTIMEOUT, 30L);
    curl_easy_setopt(h, CURLOPT_TIMEOUT, (long)ceil(g->o->timeout_s));
    CURLcode rc = curl_easy_perform(h);
    long status = 0;
    curl_easy_getinfo(h, CURLINFO_RESPONSE_CODE, &status);
    curl_easy_cleanup(h);
    tk_status st = TK_OK;
    if (rc != CURLE_OK) {
        st = tk_fail(TK_ERR_IO, "loadgen: %s%s: %s", g->o->url, path, curl_easy_strerror(rc));
    } else if (status != 200) {
        char msg[160];
        error_message(b.p, msg, sizeof msg);
        st = tk_fail(TK_ERR_IO, "loadgen: %s%s answered %ld%s%s", g->o->url, path, status, msg[0] ? ": " : "",
                     msg);
    } else {
        *out = b.p ? cJSON_Parse(b.p) : NULL;
        if (!*out) st = tk_fail(TK_ERR_FORMAT, "loadgen: %s%s did not answer JSON", g->o->url, path);
    }
    tk_free(b.p);
    return st;
}

/* Common English words: prompts read as text, and most words are one token. */
static const char *const WORDS[] = {
    "the",    "of",     "and",      "to",     "in",     "a",       "is",       "that",    "for",
    "it",     "as",     "was",      "with",   "be",     "by",      "on",       "not",     "he",
    "this",   "are",    "or",       "his",    "from",   "at",      "which",    "but",     "have",
    "an",     "had",    "they",     "you",    "were",   "their",   "one",      "all",     "we",
    "can",    "her",    "has",      "there",  "been",   "if",      "more",     "when",    "will",
    "would",  "who",    "so",       "no",     "time",   "water",   "light",    "river",   "house",
    "world",  "people", "number",   "city",   "small",  "large",   "night",    "morning", "road",
    "letter", "market", "garden",   "winter", "summer", "north",   "south",    "machine", "memory",
    "signal", "engine", "number",   "table",  "window", "stone",   "field",    "forest",  "music",
    "story",  "paper",  "question", "answer", "reason", "history", "language", "country", "mountain",
    "began",  "found",  "made",     "said",   "came",   "went",    "looked",   "thought", "called",
    "turned",
};

static tk_status make_pool(lg *g, const loadgen_opts *o, char *how, size_t how_n) {
    int max_in = o->b.n_in > o->b.bg_in || o->b.n_bg == 0 ? o->b.n_in : o->b.bg_in;
    size_t want = (size_t)max_in + LG_POOL_EXTRA;
    g->pool = tk_calloc(want, sizeof *g->pool);
    if (!g->pool) return tk_fail(TK_ERR_NOMEM, "loadgen: no memory for %zu prompt tokens", want);
    tk_model *m = NULL;
    if (o->tokenizer) {
        tk_model_opts mo;
        tk_model_opts_default(&mo);
        mo.use_mmap = true; /* only the vocabulary is needed */
        tk_status st = tk_model_open(o->tokenizer, &mo, &m);
        if (st != TK_OK) {
            tk_error_prefix("loadgen: --tokenizer %s", o->tokenizer);
            return st;
        }
    }
    uint64_t x = o->b.seed ^ 0x70726f6d707473ull;
    const size_t n_words = sizeof WORDS / sizeof WORDS[0];
    tk_status st = TK_OK;
    char *text = tk_malloc(64 * 1024);
    if (!text) st = tk_fail(TK_ERR_NOMEM, "loadgen: no memory for prompt text");
    /* Chunks of ~1,000 words, each starting with a space, so that the ids of
     * the chunks read on as one text. */
    while (st == TK_OK && g->n_pool < want) {
        size_t k = 0;
        for (int w = 0; w < 1000; w++) {
            const char *word = WORDS[bench_splitmix64(&x) % n_words];
            bool cap = w % 14 == 0, stop = w % 14 == 13;
            k += (size_t)snprintf(text + k, 64 * 1024 - k, " %c%s%s", cap ? word[0] - 32 : word[0], word + 1,
                                  stop ? "." : "");
        }
        int32_t *ids = NULL;
        size_t n = 0;
        if (m) {
            st = tk_tokenize(m, text, k, false, false, &ids, &n);
        } else {
            cJSON *req = cJSON_CreateObject(), *ans = NULL;
            cJSON_AddStringToObject(req, "model", o->model);
            cJSON_AddStringToObject(req, "prompt", text);  /* vLLM's name */
            cJSON_AddStringToObject(req, "content", text); /* llama.cpp's */
            cJSON_AddBoolToObject(req, "add_special_tokens", false);
            cJSON_AddBoolToObject(req, "add_special", false);
            char *body = cJSON_PrintUnformatted(req);
            cJSON_Delete(req);
            st = body ? http_json(g, "/tokenize", body, &ans) : tk_fail(TK_ERR_NOMEM, "loadgen: no memory");
            cJSON_free(body);
            const cJSON *t = cJSON_GetObjectItemCaseSensitive(ans, "tokens");
            if (st == TK_OK && !cJSON_IsArray(t))
                st = tk_fail(TK_ERR_FORMAT, "loadgen: %s/tokenize answered no 'tokens' list", o->url);
            int nt = st == TK_OK ? cJSON_GetArraySize(t) : 0;
            ids = nt > 0 ? tk_calloc((size_t)nt, sizeof *ids) : NULL;
            const cJSON *v;
            cJSON_ArrayForEach(v, t) {
                /* vLLM may return {"id": N, ...} objects with return_token_strs; plain ids here. */
                if (!ids || !cJSON_IsNumber(v) || v->valuedouble < 0 || v->valuedouble > 2147483647.0) {
                    st = tk_fail(TK_ERR_FORMAT, "loadgen: %s/tokenize answered a token that is not an id",
                                 o->url);
                    break;
                }
                ids[n++] = (int32_t)v->valuedouble;
            }
            cJSON_Delete(ans);
        }
        if (st == TK_OK && n == 0)
            st = tk_fail(TK_ERR_FORMAT, "loadgen: the tokenizer made no tokens of the text");
        for (size_t i = 0; st == TK_OK && i < n && g->n_pool < want; i++) g->pool[g->n_pool++] = ids[i];
        if (m)
            tk_free_buf(ids);
        else
            tk_free(ids);
    }
    tk_free(text);
    tk_model_free(m);
    if (st == TK_OK)
        snprintf(how, how_n, "%d token ids a request (%s), windows of %zu tokens of generated English words",
                 o->b.n_in,
                 o->tokenizer ? "tokenized locally by the model file's tokenizer"
                              : "tokenized by the server's /tokenize",
                 g->n_pool);
    return st;
}

static tk_status find_model(lg *g, char *name, size_t n) {
    cJSON *ans = NULL;
    tk_status st = http_json(g, "/v1/models", NULL, &ans);
    const cJSON *d = cJSON_GetObjectItemCaseSensitive(ans, "data");
    const cJSON *id = cJSON_IsArray(d) && d->child ? cJSON_GetObjectItemCaseSensitive(d->child, "id") : NULL;
    if (st == TK_OK && !(cJSON_IsString(id) && id->valuestring && id->valuestring[0]))
        st = tk_fail(TK_ERR_FORMAT, "loadgen: %s/v1/models lists no model; name one with --model", g->o->url);
    if (st == TK_OK) snprintf(name, n, "%s", id->valuestring);
    cJSON_Delete(ans);
    return st;
}

/* ---- the whole run --------------------------------------------------------------- */

void loadgen_opts_default(loadgen_opts *o) {
    memset(o, 0, sizeof *o);
    bench_opts_default(&o->b);
    o->timeout_s = 300;
}

static tk_status check_opts(const loadgen_opts *o) {
    if (!o->url || !o->url[0]) return tk_fail(TK_ERR_INVALID, "loadgen: no server (--url)");
    if (strncmp(o->url, "http://", 7) != 0 && strncmp(o->url, "https://", 8) != 0)
        return tk_fail(TK_ERR_INVALID, "loadgen: --url %s is not an http:// or https:// URL", o->url);
    if (strlen(o->url) > 400) return tk_fail(TK_ERR_RANGE, "loadgen: --url is longer than 400 characters");
    if (o->model && strlen(o->model) > 120)
        return tk_fail(TK_ERR_RANGE, "loadgen: --model is longer than 120 characters");
    const bench_opts *b = &o->b;
    if (b->n_rates == 0 && b->n_levels < 1)
        return tk_fail(TK_ERR_INVALID, "loadgen: no --concurrency levels");
    if (!(o->timeout_s >= 1) || o->timeout_s > 86400)
        return tk_fail(TK_ERR_RANGE, "loadgen: --timeout %g not in 1..86400 s", o->timeout_s);
    if (o->duration_s < 0 || o->duration_s > 86400)
        return tk_fail(TK_ERR_RANGE, "loadgen: --duration %g not in 0..86400 s", o->duration_s);
    if (b->n_in < 1 || b->n_out < 1) return tk_fail(TK_ERR_INVALID, "loadgen: --in / --out must be >= 1");
    return TK_OK;
}

tk_status loadgen_run(const loadgen_opts *opts, bench_result *out) {
    memset(out, 0, sizeof *out);
    tk_status st = check_opts(opts);
    if (st != TK_OK) return st;
    loadgen_opts o = *opts;
    char url[512];
    snprintf(url, sizeof url, "%s", o.url);
    size_t ul = strlen(url);
    while (ul && url[ul - 1] == '/') url[--ul] = 0;
    if (ul >= 3 && !strcmp(url + ul - 3, "/v1")) url[ul -= 3] = 0;
    o.url = url;

    out->opts = o.b;
    bench_info *info = &out->info;
    bench_remote *rm = &out->remote;
    rm->on = true;
    rm->duration_s = o.duration_s;
    snprintf(rm->url, sizeof rm->url, "%s", url);
    snprintf(info->git_commit, sizeof info->git_commit, "%s", o.b.git_commit ? o.b.git_commit : "unknown");
    snprintf(info->model_path, sizeof info->model_path, "%s", url);
    time_t now = time(NULL);
    struct tm tmv;
    gmtime_r(&now, &tmv);
    strftime(info->date, sizeof info->date, "%Y-%m-%dT%H:%M:%SZ", &tmv);
    tk_cpu cpu;
    cpu_detect(&cpu);
    snprintf(info->cpu_brand, sizeof info->cpu_brand, "%s", cpu.brand[0] ? cpu.brand : "unknown");
    cpu_features_str(&cpu, info->cpu_features, (int)sizeof info->cpu_features);
    info->n_cores = cpu.n_cores;
    info->read_bw_gbs = NAN;

    /* One socket per open stream: lift the soft descriptor limit (often 1,024) to the hard one. */
    struct rlimit rl;
    if (getrlimit(RLIMIT_NOFILE, &rl) == 0 && rl.rlim_cur < rl.rlim_max) {
        rl.rlim_cur = rl.rlim_max;
        setrlimit(RLIMIT_NOFILE, &rl);
    }
    if (curl_global_init(CURL_GLOBAL_DEFAULT) != CURLE_OK)
        return tk_fail(TK_ERR_INTERNAL, "loadgen: curl_global_init failed");
    lg g = {.o = &o};
    char auth[512], model[128] = "";
    g.hdr = curl_slist_append(NULL, "Content-Type: application/json");
    if (g.hdr && o.api_key) {
        snprintf(auth, sizeof auth, "Authorization: Bearer %s", o.api_key);
        g.hdr = curl_slist_append(g.hdr, auth);
    }
    g.multi = curl_multi_init();
    if (!g.hdr || !g.multi) st = tk_fail(TK_ERR_NOMEM, "loadgen: no memory for curl");
    snprintf(g.url_completions, sizeof g.url_completions, "%s/v1/completions", url);
    if (st == TK_OK && !o.model) {
        st = find_model(&g, model, sizeof model);
        o.model = model;
    }
    if (st == TK_OK) {
        snprintf(rm->model, sizeof rm->model, "%s", o.model);
        snprintf(info->model_name, sizeof info->model_name, "%s", o.model);
        if (!o.b.quiet) fprintf(stderr, "loadgen: %s, model %s: making prompts\n", url, o.model);
        st = make_pool(&g, &o, rm->prompts, sizeof rm->prompts);
    }
    bench_series *sr = &out->series[0];
    snprintf(sr->label, sizeof sr->label, "%s", "server");
    int n_points = o.b.n_rates > 0 ? o.b.n_rates : o.b.n_levels;
    if (st == TK_OK) {
        out->n_series = 1;
        sr->points = tk_calloc((size_t)n_points, sizeof *sr->points);
        if (!sr->points) st = tk_fail(TK_ERR_NOMEM, "loadgen: no memory for %d points", n_points);
    }
    int max_level = 1;
    for (int i = 0; i < o.b.n_levels; i++) max_level = o.b.levels[i] > max_level ? o.b.levels[i] : max_level;
    if (st == TK_OK && o.b.warmup > 0) {
        lg_plan wp = {.n_requests = o.b.warmup,
                      .concurrency = o.b.warmup < max_level ? o.b.warmup : max_level,
                      .n_in = o.b.n_in,
                      .n_out = o.b.n_out < LG_WARMUP_OUT ? o.b.n_out : LG_WARMUP_OUT,
                      .seed = o.b.seed ^ 0x77};
        lg_run u = {0};
        st = run_plan(&g, &wp, &u);
        for (int i = 0; st == TK_OK && i < u.n; i++)
            if (u.req[i]->failed) {
                char buf[16];
                st = tk_fail(TK_ERR_IO, "loadgen: the warm-up request failed (%s: %s)",
                             bench_error_kind_name(u.req[i]->err_status, buf, sizeof buf), u.req[i]->err);
            }
        run_free(&u);
    }
    for (int i = 0; st == TK_OK && i < n_points; i++) {
        bench_point *pt = &sr->points[i];
        sr->n_points = i + 1;
        pt->concurrency = o.b.n_rates > 0 ? 0 : o.b.levels[i];
        pt->rate = o.b.n_rates > 0 ? o.b.rates[i] : 0;
        pt->rep = tk_calloc((size_t)o.b.repeat, sizeof *pt->rep);
        if (!pt->rep) {
            st = tk_fail(TK_ERR_NOMEM, "loadgen: no memory for %d repeats", o.b.repeat);
            break;
        }
        for (int r = 0; st == TK_OK && r < o.b.repeat; r++) {
            int n_req = o.b.requests > 0      ? o.b.requests
                        : pt->concurrency > 0 ? (o.b.requests_x > 0 ? o.b.requests_x : 2) * pt->concurrency
                                              : 16;
            lg_plan lp = {.n_requests = o.duration_s > 0 ? 0 : n_req,
                          .duration_s = o.duration_s,
                          .concurrency = pt->concurrency,
                          .rate = pt->rate,
                          .n_in = o.b.n_in,
                          .n_out = o.b.n_out,
                          .seed = o.b.seed + 1000003ull * (uint64_t)(i + 1) + 7919ull * (uint64_t)r};
            lg_run bg = {0}, u = {0};
            bench_level *l = &pt->rep[r];
            if (o.b.n_bg > 0) st = bg_start(&g, &o, lp.seed ^ 0xb6b6b6b6ull, &bg);
            if (st == TK_OK) st = run_plan(&g, &lp, &u);
            if (st == TK_OK) st = run_collect(&u, &lp, l);
            if (st == TK_OK && o.b.n_bg > 0) {
                st = bg_stop(&bg, l);
                l->bg.n_prompt = o.b.bg_in;
            }
            run_free(&u);
            run_free(&bg); /* closes the background connections */
            if (st == TK_OK)
                pt->n_rep = r + 1;
            else
                bench_level_free(l);
            if (st == TK_OK && !o.b.quiet) {
                fprintf(stderr,
                        "loadgen: %s %g rep %d/%d: TPOT p50 %.2f ms, %.1f out tok/s, TTFT p50 %.1f ms, %d "
                        "errors\n",
                        pt->rate > 0 ? "rate" : "concurrency",
                        pt->rate > 0 ? pt->rate : (double)pt->concurrency, r + 1, o.b.repeat,
                        l->m[BM_TPOT_P50], l->m[BM_OUT_TOK_S], l->m[BM_TTFT_P50], l->err.total);
                if (l->bg.n_streams > 0)
                    fprintf(stderr, "loadgen:   background %d streams: ITL p50 %.2f p99 %.2f max %.2f ms%s\n",
                            l->bg.n_streams, l->m[BM_BG_ITL_P50], l->m[BM_BG_ITL_P99], l->m[BM_BG_ITL_MAX],
                            l->bg.exhausted ? " (a stream ran out inside the window: raise --bg-out)" : "");
            }
        }
        bench_point_summarize(pt);
    }
    curl_multi_cleanup(g.multi);
    curl_slist_free_all(g.hdr);
    tk_free(g.pool);
    curl_global_cleanup();
    return st;
}
