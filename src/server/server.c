/* `tokamak serve`'s HTTP side on libmicrohttpd.
 *
 * Threads: libmicrohttpd's workers parse requests, tokenize and submit; the
 * engine loop thread runs the token/finish callbacks, which only append to
 * the request's bounded output buffer and wake its connection; a watcher
 * thread notices clients that hang up (POLLRDHUP on their sockets, also while
 * a request waits in the queue or prefills) and cancels their requests.
 *
 * A request (srv_call) is shared by the HTTP side and the engine: it holds one
 * reference for each and is freed when both have let go. Lock order: s->mu
 * (engine pointer, call list) before call->mu; engine callbacks take only
 * call->mu and the metrics lock, never s->mu, so a submit made under s->mu
 * cannot wait on a callback that waits on it. */
#include "server/server.h"

#include <arpa/inet.h>
#include <cjson/cJSON.h>
#include <errno.h>
#include <inttypes.h>
#include <microhttpd.h>
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "server/metrics.h"
#include "server/request.h"
#include "server/think.h"

enum { SRV_LOADING, SRV_READY, SRV_DRAINING };

typedef enum srv_route {
    R_NONE,
    R_COMPLETIONS,
    R_CHAT,
    R_MODELS,
    R_HEALTH,
    R_METRICS,
    R_TOKENIZE,
    R_DETOKENIZE,
    R_NOT_FOUND,
    R_BAD_METHOD,
} srv_route;

typedef struct srv_buf {
    char *p;
    size_t n, cap;
} srv_buf;

typedef struct srv_call srv_call;

struct srv {
    srv_opts o;
    char *host, *api_key, *name;
    struct MHD_Daemon *d;
    int port;
    _Atomic int state;
    pthread_mutex_t mu;
    const tk_model *m;
    tk_engine *e;
    int ctx, n_vocab;
    const char *chat_format;
    srv_call *calls; /* every live call (list under mu) */
    int n_calls;
    uint64_t next_seq;
    srv_metrics metrics;
    pthread_t watcher;
    bool watching;
    _Atomic bool stop;
    _Atomic uint64_t next_id, next_seed;
};

struct srv_call {
    srv *s;
    struct MHD_Connection *conn;
    int fd;
    uint64_t seq;
    srv_call *prev, *next;
    pthread_mutex_t mu;
    int refs; /* HTTP side + engine side */
    srv_route route;
    /* the body */
    char *body;
    size_t body_len, body_cap;
    bool too_large, handled;
    /* the request */
    srv_req req;
    int n_prompt;
    char id[48];
    long long created;
    double t_start;
    /* generation state */
    uint64_t eid;
    bool in_engine, finished, mhd_done, suspended, gone, cut_off;
    bool think; /* split <think>...</think> into reasoning_content */
    srv_think th;
    srv_buf out;    /* stream: SSE bytes not yet sent */
    size_t out_off; /* bytes of out already sent */
    srv_buf text, reasoning;
    cJSON *lp; /* non-stream logprobs: chat content list or completions object */
    double *itl;
    int n_itl, cap_itl;
    double t_prev;
    tk_finish reason;
    tk_request_times times;
    char *err_msg;
    int status;
};

/* ---- small helpers ------------------------------------------------------------ */

static bool buf_add(srv_buf *b, const char *p, size_t n) {
    if (b->n + n + 1 > b->cap) {
        size_t nc = b->cap ? b->cap : 256;
        while (nc < b->n + n + 1) nc *= 2;
        char *q = realloc(b->p, nc);
        if (!q) return false;
        b->p = q;
        b->cap = nc;
    }
    memcpy(b->p + b->n, p, n);
    b->n += n;
    b->p[b->n] = 0;
    return true;
}

static const char *finish_str(tk_finish f) {
    switch (f) {
    case TK_FINISH_STOP:
        return "stop";
    case TK_FINISH_LENGTH:
        return "length";
    case TK_FINISH_ERROR:
        return "error";
    default:
        return "abort";
    }
}

/* Constant-time comparison of a presented key with the configured one. */
static bool key_equal(const char *a, const char *b) {
    size_t la = strlen(a), lb = strlen(b);
    unsigned char d = (unsigned char)(la != lb);
    for (size_t i = 0; i < lb; i++) d |= (unsigned char)(b[i] ^ (i < la ? a[i] : 0));
    return d == 0;
}

static enum MHD_Result send_body(srv_call *c, int status, const char *ctype, const char *body, size_t len,
                                 int retry_after) {
    struct MHD_Response *r = MHD_create_response_from_buffer(len, (void *)body, MHD_RESPMEM_MUST_COPY);
    if (!r) return MHD_NO;
    MHD_add_response_header(r, "Content-Type", ctype);
    if (retry_after > 0) {
        char v[16];
        snprintf(v, sizeof v, "%d", retry_after);
        MHD_add_response_header(r, "Retry-After", v);
    }
    if (status == 401) MHD_add_response_header(r, "WWW-Authenticate", "Bearer");
    if (atomic_load(&c->s->state) == SRV_DRAINING) MHD_add_response_header(r, "Connection", "close");
    c->status = status;
    enum MHD_Result ret = MHD_queue_response(c->conn, (unsigned)status, r);
    MHD_destroy_response(r);
    return ret;
}

static enum MHD_Result send_json(srv_call *c, int status, cJSON *root) {
    char *s = root ? cJSON_PrintUnformatted(root) : NULL;
    cJSON_Delete(root);
    if (!s) return MHD_NO;
    enum MHD_Result r = send_body(c, status, "application/json", s, strlen(s), 0);
    free(s);
    return r;
}

static enum MHD_Result send_error(srv_call *c, const srv_error *err, int retry_after) {
    char *s = srv_error_json(err);
    if (!s) return MHD_NO;
    enum MHD_Result r = send_body(c, err->status, "application/json", s, strlen(s), retry_after);
    free(s);
    return r;
}

static enum MHD_Result fail(srv_call *c, int status, const char *type, const char *code, const char *param,
                            const char *msg) {
    srv_error e;
    srv_error_set(&e, status, type, code, param, "%s", msg);
    return send_error(c, &e, 0);
}

/* ---- call lifetime ---------------------------------------------------------- */

static void call_free(srv_call *c) {
    srv *s = c->s;
    pthread_mutex_lock(&s->mu);
    if (c->prev)
        c->prev->next = c->next;
    else
        s->calls = c->next;
    if (c->next) c->next->prev = c->prev;
    s->n_calls--;
    pthread_mutex_unlock(&s->mu);
    srv_req_free(&c->req);
    free(c->body);
    free(c->out.p);
    free(c->text.p);
    free(c->reasoning.p);
    cJSON_Delete(c->lp);
    free(c->itl);
    free(c->err_msg);
    pthread_mutex_destroy(&c->mu);
    free(c);
}

static void call_unref(srv_call *c) {
    pthread_mutex_lock(&c->mu);
    bool last = --c->refs == 0;
    pthread_mutex_unlock(&c->mu);
    if (last) call_free(c);
}

static srv_call *call_new(srv *s, struct MHD_Connection *conn) {
    srv_call *c = calloc(1, sizeof *c);
    if (!c) return NULL;
    c->s = s;
    c->conn = conn;
    c->refs = 1;
    c->fd = -1;
    c->t_start = tk_now_s();
    c->created = (long long)time(NULL);
    pthread_mutex_init(&c->mu, NULL);
    const union MHD_ConnectionInfo *ci = MHD_get_connection_info(conn, MHD_CONNECTION_INFO_CONNECTION_FD);
    if (ci) c->fd = ci->connect_fd;
    pthread_mutex_lock(&s->mu);
    c->seq = ++s->next_seq;
    c->next = s->calls;
    if (s->calls) s->calls->prev = c;
    s->calls = c;
    s->n_calls++;
    pthread_mutex_unlock(&s->mu);
    return c;
}

/* Ask the engine to end c's request (client gone, cut off, or shutting down). Takes s->mu. */
static void call_cancel(srv_call *c) {
    srv *s = c->s;
    pthread_mutex_lock(&s->mu);
    pthread_mutex_lock(&c->mu);
    bool live = c->in_engine && !c->finished;
    uint64_t id = c->eid;
    pthread_mutex_unlock(&c->mu);
    if (live && s->e) tk_engine_cancel(s->e, id);
    pthread_mutex_unlock(&s->mu);
}

/* Wake a suspended connection; c->mu must not be held. */
static void call_wake(srv_call *c, bool was_suspended) {
    if (was_suspended) MHD_resume_connection(c->conn);
}

/* ---- output: SSE frames and final bodies --------------------------------------- */

static cJSON *chunk_base(srv_call *c) {
    cJSON *o = cJSON_CreateObject();
    cJSON_AddStringToObject(o, "id", c->id);
    cJSON_AddStringToObject(o, "object", c->route == R_CHAT ? "chat.completion.chunk" : "text_completion");
    cJSON_AddNumberToObject(o, "created", (double)c->created);
    cJSON_AddStringToObject(o, "model", c->s->name);
    return o;
}

static bool sse_add(srv_call *c, cJSON *o) {
    char *s = cJSON_PrintUnformatted(o);
    cJSON_Delete(o);
    if (!s) return false;
    bool ok = buf_add(&c->out, "data: ", 6) && buf_add(&c->out, s, strlen(s)) && buf_add(&c->out, "\n\n", 2);
    free(s);
    return ok;
}

static cJSON *usage_json(const srv_call *c) {
    cJSON *u = cJSON_CreateObject();
    int out = c->times.n_output > 0 ? c->times.n_output : 0;
    cJSON_AddNumberToObject(u, "prompt_tokens", c->n_prompt);
    cJSON_AddNumberToObject(u, "completion_tokens", out);
    cJSON_AddNumberToObject(u, "total_tokens", c->n_prompt + out);
    return u;
}

/* The text of one token for logprobs (control tokens shown). */
static char *token_text(srv_call *c, int32_t tok) {
    char *t = NULL;
    size_t n = 0;
    if (tk_detokenize(c->s->m, &tok, 1, true, &t, &n) != TK_OK) return strdup("");
    char *d = strdup(t);
    tk_free_buf(t);
    return d ? d : strdup("");
}

static cJSON *bytes_json(const char *s) {
    cJSON *a = cJSON_CreateArray();
    for (const unsigned char *p = (const unsigned char *)s; *p; p++)
        cJSON_AddItemToArray(a, cJSON_CreateNumber(*p));
    return a;
}

/* One token's logprobs in the chat shape: {"token","logprob","bytes","top_logprobs":[...]}. */
static cJSON *chat_logprob(srv_call *c, const tk_token_event *ev) {
    cJSON *o = cJSON_CreateObject();
    char *t = token_text(c, ev->token);
    cJSON_AddStringToObject(o, "token", t ? t : "");
    cJSON_AddNumberToObject(o, "logprob", ev->logprob);
    cJSON_AddItemToObject(o, "bytes", bytes_json(t ? t : ""));
    free(t);
    cJSON *top = cJSON_AddArrayToObject(o, "top_logprobs");
    for (int i = 0; i < ev->n_top && i < c->req.sampling.n_logprobs; i++) {
        cJSON *e = cJSON_CreateObject();
        char *tt = token_text(c, ev->top_tokens[i]);
        cJSON_AddStringToObject(e, "token", tt ? tt : "");
        cJSON_AddNumberToObject(e, "logprob", ev->top_logprobs[i]);
        cJSON_AddItemToObject(e, "bytes", bytes_json(tt ? tt : ""));
        free(tt);
        cJSON_AddItemToArray(top, e);
    }
    return o;
}

/* Completions (legacy) logprobs: append one token to
 * {"tokens","token_logprobs","top_logprobs","text_offset"}. */
static void completion_logprob_add(srv_call *c, cJSON *lp, const tk_token_event *ev, size_t offset) {
    char *t = token_text(c, ev->token);
    cJSON_AddItemToArray(cJSON_GetObjectItem(lp, "tokens"), cJSON_CreateString(t ? t : ""));
    free(t);
    cJSON_AddItemToArray(cJSON_GetObjectItem(lp, "token_logprobs"), cJSON_CreateNumber(ev->logprob));
    cJSON *top = cJSON_CreateObject();
    for (int i = 0; i < ev->n_top && i < c->req.sampling.n_logprobs; i++) {
        char *tt = token_text(c, ev->top_tokens[i]);
        if (!cJSON_GetObjectItemCaseSensitive(top, tt ? tt : ""))
            cJSON_AddNumberToObject(top, tt ? tt : "", ev->top_logprobs[i]);
        free(tt);
    }
    cJSON_AddItemToArray(cJSON_GetObjectItem(lp, "top_logprobs"), top);
    cJSON_AddItemToArray(cJSON_GetObjectItem(lp, "text_offset"), cJSON_CreateNumber((double)offset));
}

static cJSON *completion_logprobs_new(void) {
    cJSON *lp = cJSON_CreateObject();
    cJSON_AddArrayToObject(lp, "tokens");
    cJSON_AddArrayToObject(lp, "token_logprobs");
    cJSON_AddArrayToObject(lp, "top_logprobs");
    cJSON_AddArrayToObject(lp, "text_offset");
    return lp;
}

/* A streamed piece of output: a chat delta or a completion choice. */
static bool stream_piece(srv_call *c, const char *content, size_t nc, const char *reasoning, size_t nr,
                         cJSON *lp) {
    cJSON *o = chunk_base(c), *choices = cJSON_AddArrayToObject(o, "choices"), *ch = cJSON_CreateObject();
    cJSON_AddItemToArray(choices, ch);
    cJSON_AddNumberToObject(ch, "index", 0);
    char *tc = strndup(content ? content : "", nc), *tr = strndup(reasoning ? reasoning : "", nr);
    if (c->route == R_CHAT) {
        cJSON *d = cJSON_AddObjectToObject(ch, "delta");
        if (nr) cJSON_AddStringToObject(d, "reasoning_content", tr ? tr : "");
        if (nc || !nr) cJSON_AddStringToObject(d, "content", tc ? tc : "");
    } else {
        cJSON_AddStringToObject(ch, "text", tc ? tc : "");
    }
    free(tc);
    free(tr);
    if (lp)
        cJSON_AddItemToObject(ch, "logprobs", lp);
    else
        cJSON_AddNullToObject(ch, "logprobs");
    cJSON_AddNullToObject(ch, "finish_reason");
    return sse_add(c, o);
}

/* Route new text through the reasoning splitter (chat with thinking) into the
 * stream or the accumulated message. */
static bool deliver_text(srv_call *c, const char *t, size_t n, cJSON *lp, bool flush) {
    srv_buf content = {0}, reasoning = {0};
    const char *pc = t, *pr = NULL;
    size_t nc = n, nr = 0;
    bool ok = true;
    if (c->think) {
        srv_think_out to = {0};
        ok = flush ? srv_think_flush(&c->th, &to) : srv_think_push(&c->th, t, n, &to);
        pc = to.content;
        nc = to.n_content;
        pr = to.reasoning;
        nr = to.n_reasoning;
        content.p = to.content;
        reasoning.p = to.reasoning;
    }
    if (ok) {
        if (c->req.stream) {
            if (nc || nr || lp)
                ok = stream_piece(c, pc, nc, pr, nr, lp);
            else
                cJSON_Delete(lp);
        } else {
            ok = buf_add(&c->text, pc ? pc : "", nc) && buf_add(&c->reasoning, pr ? pr : "", nr);
            cJSON_Delete(lp);
        }
    } else {
        cJSON_Delete(lp);
    }
    free(content.p);
    free(reasoning.p);
    return ok;
}

/* Cut off a client that fell too far behind (or when memory ran out). Under c->mu. */
static void cut_off_locked(srv_call *c) {
    if (c->cut_off) return;
    c->cut_off = true;
    if (c->in_engine && !c->finished && c->s->e) tk_engine_cancel(c->s->e, c->eid);
    /* A client that stopped reading leaves libmicrohttpd waiting to write into
     * a full socket until its connection timeout: shut the socket down (the
     * fd stays open, so it cannot be reused meanwhile), and the failing write
     * makes it close the connection now. */
    if (!c->mhd_done && c->fd >= 0) shutdown(c->fd, SHUT_RDWR);
}

static void on_token(void *user, const tk_token_event *ev) {
    srv_call *c = user;
    pthread_mutex_lock(&c->mu);
    if (c->t_prev > 0) {
        if (c->n_itl == c->cap_itl) {
            int nc = c->cap_itl ? c->cap_itl * 2 : 64;
            double *q = realloc(c->itl, (size_t)nc * sizeof *q);
            if (q) c->itl = q, c->cap_itl = nc;
        }
        if (c->n_itl < c->cap_itl) c->itl[c->n_itl++] = ev->t - c->t_prev;
    }
    c->t_prev = ev->t;
    if (c->gone || c->cut_off) {
        pthread_mutex_unlock(&c->mu);
        return;
    }
    cJSON *lp = NULL;
    if (c->req.sampling.logprobs) {
        if (c->route == R_CHAT) {
            cJSON *one = chat_logprob(c, ev);
            if (c->req.stream) {
                lp = cJSON_CreateObject();
                cJSON_AddItemToArray(cJSON_AddArrayToObject(lp, "content"), one);
            } else {
                cJSON_AddItemToArray(cJSON_GetObjectItem(c->lp, "content"), one);
            }
        } else if (c->req.stream) {
            lp = completion_logprobs_new();
            completion_logprob_add(c, lp, ev, 0);
        } else {
            completion_logprob_add(c, c->lp, ev, c->text.n);
        }
    }
    bool ok = deliver_text(c, ev->text, ev->text_len, lp, false);
    if (!ok || c->out.n - c->out_off > c->s->o.max_pending) cut_off_locked(c);
    bool wake = c->suspended && c->req.stream;
    if (wake) c->suspended = false;
    pthread_mutex_unlock(&c->mu);
    call_wake(c, wake);
}

static void stream_finish_frames(srv_call *c) {
    if (c->reason == TK_FINISH_ERROR) {
        srv_error e;
        srv_error_set(&e, 500, "server_error", NULL, NULL, "generation failed: %s",
                      c->err_msg ? c->err_msg : "unknown error");
        char *s = srv_error_json(&e);
        if (s) {
            buf_add(&c->out, "data: ", 6);
            buf_add(&c->out, s, strlen(s));
            buf_add(&c->out, "\n\n", 2);
            free(s);
        }
    } else {
        cJSON *o = chunk_base(c), *choices = cJSON_AddArrayToObject(o, "choices"), *ch = cJSON_CreateObject();
        cJSON_AddItemToArray(choices, ch);
        cJSON_AddNumberToObject(ch, "index", 0);
        if (c->route == R_CHAT)
            cJSON_AddObjectToObject(ch, "delta");
        else
            cJSON_AddStringToObject(ch, "text", "");
        cJSON_AddNullToObject(ch, "logprobs");
        cJSON_AddStringToObject(ch, "finish_reason", finish_str(c->reason));
        cJSON_AddItemToObject(o, "usage", usage_json(c));
        sse_add(c, o);
        if (c->req.include_usage) {
            o = chunk_base(c);
            cJSON_AddArrayToObject(o, "choices");
            cJSON_AddItemToObject(o, "usage", usage_json(c));
            sse_add(c, o);
        }
    }
    buf_add(&c->out, "data: [DONE]\n\n", 14);
}

static void on_finish(void *user, const tk_finish_event *ev) {
    srv_call *c = user;
    srv *s = c->s;
    pthread_mutex_lock(&c->mu);
    c->reason = ev->reason;
    c->times = ev->times;
    if (ev->reason == TK_FINISH_ERROR && ev->message) c->err_msg = strdup(ev->message);
    if (!c->gone && !c->cut_off) {
        if (ev->text_len) deliver_text(c, ev->text, ev->text_len, NULL, false);
        if (c->think) deliver_text(c, "", 0, NULL, true);
        if (c->req.stream) stream_finish_frames(c);
    }
    c->finished = true;
    bool wake = c->suspended;
    c->suspended = false;
    pthread_mutex_unlock(&c->mu);
    srv_metrics_finish(&s->metrics, ev->reason, &ev->times, c->itl, c->n_itl);
    call_wake(c, wake);
    call_unref(c); /* the engine's reference */
}

/* The stream's body: what the callbacks appended; suspends when there is nothing yet. */
static ssize_t stream_read(void *cls, uint64_t pos, char *buf, size_t max) {
    (void)pos;
    srv_call *c = cls;
    pthread_mutex_lock(&c->mu);
    ssize_t r;
    if (c->cut_off) {
        r = MHD_CONTENT_READER_END_WITH_ERROR;
    } else if (c->out.n > c->out_off) {
        size_t n = c->out.n - c->out_off;
        if (n > max) n = max;
        memcpy(buf, c->out.p + c->out_off, n);
        c->out_off += n;
        if (c->out_off == c->out.n) c->out.n = c->out_off = 0;
        r = (ssize_t)n;
    } else if (c->finished) {
        r = MHD_CONTENT_READER_END_OF_STREAM;
    } else {
        c->suspended = true;
        MHD_suspend_connection(c->conn);
        r = 0;
    }
    pthread_mutex_unlock(&c->mu);
    return r;
}

/* ---- endpoints --------------------------------------------------------------- */

static enum MHD_Result send_final(srv_call *c) {
    if (c->reason == TK_FINISH_ERROR)
        return fail(c, 500, "server_error", NULL, NULL, c->err_msg ? c->err_msg : "generation failed");
    if (c->reason == TK_FINISH_CANCELLED)
        return fail(c, 503, "server_error", "cancelled", NULL,
                    "the request was cancelled (server shutting down)");
    cJSON *o = cJSON_CreateObject();
    cJSON_AddStringToObject(o, "id", c->id);
    cJSON_AddStringToObject(o, "object", c->route == R_CHAT ? "chat.completion" : "text_completion");
    cJSON_AddNumberToObject(o, "created", (double)c->created);
    cJSON_AddStringToObject(o, "model", c->s->name);
    cJSON *choices = cJSON_AddArrayToObject(o, "choices"), *ch = cJSON_CreateObject();
    cJSON_AddItemToArray(choices, ch);
    cJSON_AddNumberToObject(ch, "index", 0);
    if (c->route == R_CHAT) {
        cJSON *msg = cJSON_AddObjectToObject(ch, "message");
        cJSON_AddStringToObject(msg, "role", "assistant");
        cJSON_AddStringToObject(msg, "content", c->text.p ? c->text.p : "");
        if (c->think) cJSON_AddStringToObject(msg, "reasoning_content", c->reasoning.p ? c->reasoning.p : "");
    } else {
        cJSON_AddStringToObject(ch, "text", c->text.p ? c->text.p : "");
    }
    if (c->lp) {
        cJSON_AddItemToObject(ch, "logprobs", c->lp);
        c->lp = NULL;
    } else {
        cJSON_AddNullToObject(ch, "logprobs");
    }
    cJSON_AddStringToObject(ch, "finish_reason", finish_str(c->reason));
    cJSON_AddItemToObject(o, "usage", usage_json(c));
    return send_json(c, 200, o);
}

static enum MHD_Result handle_generate(srv_call *c) {
    srv *s = c->s;
    srv_error err;
    srv_limits lim = {.n_vocab = s->n_vocab, .model_name = s->name};
    srv_kind kind = c->route == R_CHAT ? SRV_CHAT : SRV_COMPLETION;
    if (!srv_req_parse(c->body ? c->body : "", c->body_len, kind, &lim, &c->req, &err))
        return send_error(c, &err, 0);
    srv_req *q = &c->req;
    /* the prompt */
    int32_t *ids = NULL;
    size_t n = 0;
    tk_status st;
    bool own = true;
    if (kind == SRV_CHAT) {
        tk_chat_message *msgs = calloc((size_t)q->n_msgs, sizeof *msgs);
        if (!msgs) return fail(c, 500, "server_error", NULL, NULL, "out of memory");
        for (int i = 0; i < q->n_msgs; i++) msgs[i] = (tk_chat_message){q->msgs[i].role, q->msgs[i].content};
        tk_chat_opts co;
        tk_chat_opts_default(&co);
        co.enable_thinking = q->enable_thinking;
        st = tk_chat_tokenize(s->m, msgs, q->n_msgs, &co, &ids, &n);
        free(msgs);
        c->think = q->enable_thinking && s->chat_format && !strcmp(s->chat_format, "qwen3");
    } else if (q->prompt_text) {
        st = tk_tokenize(s->m, q->prompt_text, q->prompt_len, true, true, &ids, &n);
    } else {
        ids = q->prompt_ids;
        n = (size_t)q->n_prompt_ids;
        st = TK_OK;
        own = false;
    }
    if (st != TK_OK) {
        srv_error_set(&err, st == TK_ERR_NOMEM ? 500 : 400,
                      st == TK_ERR_NOMEM ? "server_error" : "invalid_request_error", NULL,
                      kind == SRV_CHAT ? "messages" : "prompt", "cannot encode the prompt: %s",
                      tk_last_error());
        return send_error(c, &err, 0);
    }
    if (n == 0) {
        if (own) tk_free_buf(ids);
        return fail(c, 400, "invalid_request_error", NULL, kind == SRV_CHAT ? "messages" : "prompt",
                    "the prompt is empty");
    }
    if (n > (size_t)s->ctx) {
        srv_error_set(&err, 400, "invalid_request_error", "context_length_exceeded",
                      kind == SRV_CHAT ? "messages" : "prompt",
                      "this model's maximum context length is %d tokens; the prompt holds %zu tokens", s->ctx,
                      n);
        if (own) tk_free_buf(ids);
        return send_error(c, &err, 0);
    }
    c->n_prompt = (int)n;
    snprintf(c->id, sizeof c->id, "%s-%016" PRIx64, kind == SRV_CHAT ? "chatcmpl" : "cmpl",
             atomic_fetch_add(&s->next_id, 1));
    if (q->sampling.logprobs && !q->stream) {
        if (kind == SRV_CHAT) {
            c->lp = cJSON_CreateObject();
            cJSON_AddArrayToObject(c->lp, "content");
        } else {
            c->lp = completion_logprobs_new();
        }
    }
    tk_request r;
    tk_request_default(&r);
    r.prompt = ids;
    r.n_prompt = (int)n;
    r.max_tokens = q->max_tokens;
    r.sampling = q->sampling;
    if (!q->seed_set) r.sampling.seed = atomic_fetch_add(&s->next_seed, 0x9e3779b97f4a7c15ull);
    for (int i = 0; i < q->n_stop; i++) r.stop[i] = q->stop[i];
    r.ignore_eos = q->ignore_eos;
    r.want_text = true;
    r.on_token = on_token;
    r.on_finish = on_finish;
    r.user = c;
    if (q->stream && kind == SRV_CHAT) {
        /* The first chunk carries the role, as OpenAI's does. */
        cJSON *o = chunk_base(c), *choices = cJSON_AddArrayToObject(o, "choices"), *ch = cJSON_CreateObject();
        cJSON_AddItemToArray(choices, ch);
        cJSON_AddNumberToObject(ch, "index", 0);
        cJSON *d = cJSON_AddObjectToObject(ch, "delta");
        cJSON_AddStringToObject(d, "role", "assistant");
        cJSON_AddStringToObject(d, "content", "");
        cJSON_AddNullToObject(ch, "logprobs");
        cJSON_AddNullToObject(ch, "finish_reason");
        sse_add(c, o);
    }
    /* Submit under s->mu so the engine cannot be detached meanwhile; the engine's
     * reference is taken first, since the finish callback may run before submit returns. */
    pthread_mutex_lock(&c->mu);
    c->refs++;
    pthread_mutex_unlock(&c->mu);
    uint64_t eid = 0;
    pthread_mutex_lock(&s->mu);
    if (atomic_load(&s->state) != SRV_READY || !s->e)
        st = TK_ERR_UNSUPPORTED;
    else
        st = tk_engine_submit(s->e, &r, &eid);
    char msg[512];
    snprintf(msg, sizeof msg, "%s", st == TK_OK ? "" : tk_last_error());
    tk_engine_stats es;
    bool have_stats = st == TK_ERR_FULL && tk_engine_stats_get(s->e, &es) == TK_OK;
    pthread_mutex_unlock(&s->mu);
    if (own) tk_free_buf(ids);
    if (st != TK_OK) {
        pthread_mutex_lock(&c->mu);
        c->refs--; /* no callback will come */
        pthread_mutex_unlock(&c->mu);
        if (st == TK_ERR_UNSUPPORTED) {
            srv_metrics_reject(&s->metrics, SRV_REJ_DRAINING);
            return fail(c, 503, "server_error", "draining", NULL, "the server is shutting down");
        }
        if (st == TK_ERR_FULL) {
            srv_metrics_reject(&s->metrics, SRV_REJ_QUEUE_FULL);
            srv_error_set(&err, 429, "rate_limit_error", "queue_full", NULL, "the server is busy: %s", msg);
            return send_error(c, &err,
                              srv_metrics_retry_after(&s->metrics, have_stats ? es.waiting : 0, tk_now_s()));
        }
        srv_error_set(&err, st == TK_ERR_NOMEM ? 500 : 400,
                      st == TK_ERR_NOMEM ? "server_error" : "invalid_request_error",
                      st == TK_ERR_RANGE ? "context_length_exceeded" : NULL, NULL, "%s", msg);
        return send_error(c, &err, 0);
    }
    pthread_mutex_lock(&c->mu);
    c->eid = eid;
    c->in_engine = true;
    bool done = c->finished;
    if (!q->stream && !done) {
        c->suspended = true;
        MHD_suspend_connection(c->conn);
    }
    pthread_mutex_unlock(&c->mu);
    if (!q->stream) return done ? send_final(c) : MHD_YES;
    struct MHD_Response *resp =
        MHD_create_response_from_callback(MHD_SIZE_UNKNOWN, 16384, stream_read, c, NULL);
    if (!resp) return MHD_NO;
    MHD_add_response_header(resp, "Content-Type", "text/event-stream");
    MHD_add_response_header(resp, "Cache-Control", "no-cache");
    c->status = 200;
    enum MHD_Result ret = MHD_queue_response(c->conn, 200, resp);
    MHD_destroy_response(resp);
    return ret;
}

static enum MHD_Result handle_tokenize(srv_call *c, bool detok) {
    srv *s = c->s;
    srv_error err;
    srv_limits lim = {.n_vocab = s->n_vocab, .model_name = s->name};
    if (!srv_req_parse(c->body ? c->body : "", c->body_len, detok ? SRV_DETOKENIZE : SRV_TOKENIZE, &lim,
                       &c->req, &err))
        return send_error(c, &err, 0);
    cJSON *o = cJSON_CreateObject();
    if (detok) {
        char *text = NULL;
        size_t len = 0;
        if (tk_detokenize(s->m, c->req.prompt_ids, (size_t)c->req.n_prompt_ids, false, &text, &len) !=
            TK_OK) {
            cJSON_Delete(o);
            return fail(c, 400, "invalid_request_error", NULL, "tokens", tk_last_error());
        }
        cJSON_AddStringToObject(o, "prompt", text);
        cJSON_AddStringToObject(o, "content", text);
        tk_free_buf(text);
    } else {
        int32_t *ids = NULL;
        size_t n = 0;
        if (tk_tokenize(s->m, c->req.prompt_text, c->req.prompt_len, c->req.add_special, true, &ids, &n) !=
            TK_OK) {
            cJSON_Delete(o);
            return fail(c, 400, "invalid_request_error", NULL, "prompt", tk_last_error());
        }
        cJSON *a = cJSON_AddArrayToObject(o, "tokens");
        for (size_t i = 0; i < n; i++) cJSON_AddItemToArray(a, cJSON_CreateNumber(ids[i]));
        cJSON_AddNumberToObject(o, "count", (double)n);
        cJSON_AddNumberToObject(o, "max_model_len", s->ctx);
        tk_free_buf(ids);
    }
    return send_json(c, 200, o);
}

static enum MHD_Result handle_models(srv_call *c) {
    cJSON *o = cJSON_CreateObject();
    cJSON_AddStringToObject(o, "object", "list");
    cJSON *m = cJSON_CreateObject();
    cJSON_AddItemToArray(cJSON_AddArrayToObject(o, "data"), m);
    cJSON_AddStringToObject(m, "id", c->s->name);
    cJSON_AddStringToObject(m, "object", "model");
    cJSON_AddNumberToObject(m, "created", (double)c->created);
    cJSON_AddStringToObject(m, "owned_by", "tokamak");
    cJSON_AddNumberToObject(m, "max_model_len", c->s->ctx);
    return send_json(c, 200, o);
}

static enum MHD_Result handle_metrics(srv_call *c) {
    srv *s = c->s;
    tk_engine_stats st;
    bool have = false;
    pthread_mutex_lock(&s->mu);
    if (s->e) have = tk_engine_stats_get(s->e, &st) == TK_OK;
    int live = s->n_calls - 1; /* not this one */
    pthread_mutex_unlock(&s->mu);
    size_t len = 0;
    char *text = srv_metrics_render(&s->metrics, have ? &st : NULL, live, &len);
    if (!text) return fail(c, 500, "server_error", NULL, NULL, "out of memory");
    enum MHD_Result r = send_body(c, 200, "text/plain; version=0.0.4; charset=utf-8", text, len, 0);
    free(text);
    return r;
}

static srv_route route_of(const char *method, const char *url) {
    static const struct {
        const char *path, *method;
        srv_route r;
    } T[] = {
        {"/v1/completions", "POST", R_COMPLETIONS},
        {"/v1/chat/completions", "POST", R_CHAT},
        {"/v1/models", "GET", R_MODELS},
        {"/health", "GET", R_HEALTH},
        {"/metrics", "GET", R_METRICS},
        {"/tokenize", "POST", R_TOKENIZE},
        {"/detokenize", "POST", R_DETOKENIZE},
    };
    for (size_t i = 0; i < sizeof T / sizeof T[0]; i++)
        if (!strcmp(url, T[i].path)) return strcmp(method, T[i].method) ? R_BAD_METHOD : T[i].r;
    return R_NOT_FOUND;
}

static bool authorized(srv_call *c) {
    srv *s = c->s;
    if (!s->api_key || c->route == R_HEALTH || c->route == R_METRICS) return true;
    const char *h = MHD_lookup_connection_value(c->conn, MHD_HEADER_KIND, "Authorization");
    if (!h || strncasecmp(h, "Bearer ", 7)) return false;
    return key_equal(h + 7, s->api_key);
}

static enum MHD_Result dispatch(srv_call *c) {
    srv *s = c->s;
    int state = atomic_load(&s->state);
    switch (c->route) {
    case R_HEALTH: {
        const char *st = state == SRV_READY ? "ok" : state == SRV_LOADING ? "loading" : "draining";
        cJSON *o = cJSON_CreateObject();
        cJSON_AddStringToObject(o, "status", st);
        return send_json(c, state == SRV_READY ? 200 : 503, o);
    }
    case R_METRICS:
        return handle_metrics(c);
    case R_NOT_FOUND:
        return fail(c, 404, "invalid_request_error", "not_found", NULL, "no such endpoint");
    case R_BAD_METHOD:
        return fail(c, 405, "invalid_request_error", "method_not_allowed", NULL, "method not allowed here");
    default:
        break;
    }
    if (state == SRV_LOADING)
        return fail(c, 503, "server_error", "loading", NULL, "the model is still loading");
    if (state == SRV_DRAINING && (c->route == R_COMPLETIONS || c->route == R_CHAT)) {
        srv_metrics_reject(&s->metrics, SRV_REJ_DRAINING);
        return fail(c, 503, "server_error", "draining", NULL, "the server is shutting down");
    }
    switch (c->route) {
    case R_MODELS:
        return handle_models(c);
    case R_TOKENIZE:
        return handle_tokenize(c, false);
    case R_DETOKENIZE:
        return handle_tokenize(c, true);
    default:
        return handle_generate(c);
    }
}

static enum MHD_Result too_large(srv_call *c) {
    srv_error e;
    srv_error_set(&e, 413, "invalid_request_error", "request_too_large", NULL,
                  "the request body is over the limit of %zu bytes", c->s->o.max_body);
    return send_error(c, &e, 0);
}

static enum MHD_Result on_request(void *cls, struct MHD_Connection *conn, const char *url, const char *method,
                                  const char *version, const char *upload, size_t *upload_size,
                                  void **con_cls) {
    (void)version;
    srv *s = cls;
    srv_call *c = *con_cls;
    if (!c) {
        if (!(c = call_new(s, conn))) return MHD_NO;
        *con_cls = c;
        c->route = route_of(method, url);
        /* Refuse what the headers already condemn before reading any body. */
        if (!authorized(c)) {
            c->handled = true;
            return fail(c, 401, "authentication_error", "invalid_api_key", NULL, "missing or wrong API key");
        }
        const char *cl = MHD_lookup_connection_value(conn, MHD_HEADER_KIND, "Content-Length");
        if (cl && strtoull(cl, NULL, 10) > s->o.max_body) {
            c->handled = true;
            return too_large(c);
        }
        return MHD_YES;
    }
    if (*upload_size) {
        if (!c->too_large) {
            if (c->body_len + *upload_size > s->o.max_body) {
                c->too_large = true;
            } else {
                if (c->body_len + *upload_size + 1 > c->body_cap) {
                    size_t nc = c->body_cap ? c->body_cap : 4096;
                    while (nc < c->body_len + *upload_size + 1) nc *= 2;
                    char *q = realloc(c->body, nc);
                    if (!q) return MHD_NO;
                    c->body = q;
                    c->body_cap = nc;
                }
                memcpy(c->body + c->body_len, upload, *upload_size);
                c->body_len += *upload_size;
                c->body[c->body_len] = 0;
            }
        }
        *upload_size = 0;
        return MHD_YES;
    }
    if (c->handled) {
        /* Resumed after a non-streaming request finished. */
        pthread_mutex_lock(&c->mu);
        bool done = c->in_engine && c->finished && !c->req.stream && !c->status;
        pthread_mutex_unlock(&c->mu);
        return done ? send_final(c) : MHD_YES;
    }
    c->handled = true;
    if (c->too_large) return too_large(c);
    return dispatch(c);
}

static void on_completed(void *cls, struct MHD_Connection *conn, void **con_cls,
                         enum MHD_RequestTerminationCode toe) {
    (void)conn;
    srv *s = cls;
    srv_call *c = *con_cls;
    if (!c) return;
    *con_cls = NULL;
    pthread_mutex_lock(&c->mu);
    c->mhd_done = true;
    if (toe != MHD_REQUEST_TERMINATED_COMPLETED_OK) c->gone = true;
    bool live = c->in_engine && !c->finished;
    pthread_mutex_unlock(&c->mu);
    if (live) call_cancel(c);
    int status = c->gone && (c->status == 200 || c->status == 0) ? 499 : c->status; /* 499: the client left */
    srv_metrics_response(&s->metrics, c->status);
    if (!s->o.quiet && (c->route == R_COMPLETIONS || c->route == R_CHAT)) {
        pthread_mutex_lock(&c->mu);
        tk_request_times t = c->times;
        bool fin = c->finished;
        pthread_mutex_unlock(&c->mu);
        double ttft = fin && t.first_token > 0 ? t.first_token - t.queued : -1;
        double e2e = tk_now_s() - c->t_start;
        fprintf(stderr, "request %s status %d prompt %d output %d ttft %.3f s e2e %.3f s%s%s\n",
                c->id[0] ? c->id : "-", status, c->n_prompt, fin ? t.n_output : 0, ttft, e2e,
                fin && c->in_engine ? " finish " : "", fin && c->in_engine ? finish_str(c->reason) : "");
    }
    call_unref(c);
}

/* ---- the watcher: clients that hang up -------------------------------------------- */

#define SRV_WATCH_MAX 4096

static void *watch_loop(void *arg) {
    srv *s = arg;
    struct pollfd *pf = calloc(SRV_WATCH_MAX, sizeof *pf);
    srv_call **who = calloc(SRV_WATCH_MAX, sizeof *who);
    uint64_t *seq = calloc(SRV_WATCH_MAX, sizeof *seq);
    if (!pf || !who || !seq) {
        free(pf), free(who), free(seq);
        return NULL;
    }
    while (!atomic_load(&s->stop)) {
        int n = 0;
        pthread_mutex_lock(&s->mu);
        for (srv_call *c = s->calls; c && n < SRV_WATCH_MAX; c = c->next) {
            pthread_mutex_lock(&c->mu);
            bool watch = c->in_engine && !c->finished && !c->gone && !c->mhd_done && c->fd >= 0;
            pthread_mutex_unlock(&c->mu);
            if (!watch) continue;
            pf[n] = (struct pollfd){.fd = c->fd, .events = POLLRDHUP};
            who[n] = c;
            seq[n++] = c->seq;
        }
        pthread_mutex_unlock(&s->mu);
        if (n == 0) {
            struct timespec ts = {0, 20 * 1000 * 1000};
            nanosleep(&ts, NULL);
            continue;
        }
        int k = poll(pf, (nfds_t)n, 20);
        if (k <= 0) continue;
        pthread_mutex_lock(&s->mu);
        for (int i = 0; i < n; i++) {
            if (!(pf[i].revents & (POLLRDHUP | POLLHUP | POLLERR))) continue;
            /* still there, and the same request? */
            srv_call *c = s->calls;
            while (c && !(c == who[i] && c->seq == seq[i])) c = c->next;
            if (!c) continue;
            pthread_mutex_lock(&c->mu);
            bool live = c->in_engine && !c->finished && !c->gone && !c->mhd_done;
            /* Only a call still in the engine: one that finished since the
             * poll has its answer out or on the way, and a client that reads
             * it and hangs up did not leave early (libmicrohttpd reports a
             * response cut short to on_completed). */
            if (live) c->gone = true;
            uint64_t id = c->eid;
            pthread_mutex_unlock(&c->mu);
            if (live && s->e) tk_engine_cancel(s->e, id);
        }
        pthread_mutex_unlock(&s->mu);
        /* A hung-up socket stays readable until libmicrohttpd closes it: don't spin on it. */
        struct timespec ts = {0, 5 * 1000 * 1000};
        nanosleep(&ts, NULL);
    }
    free(pf), free(who), free(seq);
    return NULL;
}

/* ---- lifecycle -------------------------------------------------------------------- */

void srv_opts_default(srv_opts *o) {
    memset(o, 0, sizeof *o);
    o->host = "127.0.0.1";
    o->port = 8080;
    o->served_name = "tokamak";
    o->max_body = 8u << 20;
    o->max_pending = 4u << 20;
    o->http_threads = 4;
}

bool srv_start(const srv_opts *o, srv **out) {
    *out = NULL;
    srv *s = calloc(1, sizeof *s);
    if (!s) return false;
    s->o = *o;
    s->host = strdup(o->host);
    s->name = strdup(o->served_name);
    s->api_key = o->api_key ? strdup(o->api_key) : NULL;
    pthread_mutex_init(&s->mu, NULL);
    srv_metrics_init(&s->metrics);
    atomic_store(&s->state, SRV_LOADING);
    uint64_t seed = (uint64_t)time(NULL) ^ ((uint64_t)getpid() << 32);
    atomic_store(&s->next_id, seed);
    atomic_store(&s->next_seed, seed * 0x2545f4914f6cdd1dull + (uint64_t)tk_now_s());
    struct sockaddr_in a4;
    struct sockaddr_in6 a6;
    struct sockaddr *sa;
    unsigned flags = MHD_USE_INTERNAL_POLLING_THREAD | MHD_USE_EPOLL | MHD_ALLOW_SUSPEND_RESUME;
    memset(&a4, 0, sizeof a4);
    memset(&a6, 0, sizeof a6);
    if (inet_pton(AF_INET, o->host, &a4.sin_addr) == 1) {
        a4.sin_family = AF_INET;
        a4.sin_port = htons((uint16_t)o->port);
        sa = (struct sockaddr *)&a4;
    } else if (inet_pton(AF_INET6, o->host, &a6.sin6_addr) == 1) {
        a6.sin6_family = AF_INET6;
        a6.sin6_port = htons((uint16_t)o->port);
        sa = (struct sockaddr *)&a6;
        flags |= MHD_USE_IPv6;
    } else {
        fprintf(stderr, "tokamak serve: --host '%s' is not an IPv4 or IPv6 address\n", o->host);
        srv_stop(s);
        return false;
    }
    if (!s->host || !s->name || (o->api_key && !s->api_key)) {
        srv_stop(s);
        return false;
    }
    s->d =
        MHD_start_daemon(flags, (uint16_t)o->port, NULL, NULL, on_request, s, MHD_OPTION_SOCK_ADDR, sa,
                         MHD_OPTION_NOTIFY_COMPLETED, on_completed, s, MHD_OPTION_THREAD_POOL_SIZE,
                         (unsigned)(o->http_threads > 0 ? o->http_threads : 1), MHD_OPTION_CONNECTION_TIMEOUT,
                         (unsigned)300, MHD_OPTION_LISTENING_ADDRESS_REUSE, (unsigned)1, MHD_OPTION_END);
    if (!s->d) {
        fprintf(stderr, "tokamak serve: cannot listen on %s:%d: %s\n", o->host, o->port, strerror(errno));
        srv_stop(s);
        return false;
    }
    const union MHD_DaemonInfo *di = MHD_get_daemon_info(s->d, MHD_DAEMON_INFO_BIND_PORT);
    s->port = di ? di->port : o->port;
    /* Accepted sockets inherit the listening socket's send buffer: it bounds
     * what the kernel holds for a client that stops reading, before
     * --max-pending counts the rest. */
    const union MHD_DaemonInfo *li =
        o->sndbuf > 0 ? MHD_get_daemon_info(s->d, MHD_DAEMON_INFO_LISTEN_FD) : NULL;
    if (o->sndbuf > 0 &&
        (!li || setsockopt(li->listen_fd, SOL_SOCKET, SO_SNDBUF, &o->sndbuf, sizeof o->sndbuf))) {
        fprintf(stderr, "tokamak serve: cannot set --sndbuf %d: %s\n", o->sndbuf,
                li ? strerror(errno) : "no socket");
        srv_stop(s);
        return false;
    }
    if (pthread_create(&s->watcher, NULL, watch_loop, s)) {
        fprintf(stderr, "tokamak serve: cannot start a thread\n");
        srv_stop(s);
        return false;
    }
    s->watching = true;
    *out = s;
    return true;
}

int srv_port(const srv *s) { return s->port; }

void srv_set_ready(srv *s, const tk_model *m, tk_engine *e, int ctx) {
    tk_model_info mi;
    tk_model_get_info(m, &mi);
    pthread_mutex_lock(&s->mu);
    s->m = m;
    s->e = e;
    s->ctx = ctx;
    s->n_vocab = mi.n_vocab;
    s->chat_format = tk_model_chat_format(m);
    pthread_mutex_unlock(&s->mu);
    atomic_store(&s->state, SRV_READY);
}

void srv_drain(srv *s) { atomic_store(&s->state, SRV_DRAINING); }

int srv_in_flight(srv *s) {
    pthread_mutex_lock(&s->mu);
    int n = s->n_calls;
    pthread_mutex_unlock(&s->mu);
    return n;
}

void srv_cancel_all(srv *s) {
    pthread_mutex_lock(&s->mu);
    for (srv_call *c = s->calls; c; c = c->next) {
        pthread_mutex_lock(&c->mu);
        bool live = c->in_engine && !c->finished;
        uint64_t id = c->eid;
        pthread_mutex_unlock(&c->mu);
        if (live && s->e) tk_engine_cancel(s->e, id);
    }
    pthread_mutex_unlock(&s->mu);
}

tk_engine *srv_detach_engine(srv *s) {
    atomic_store(&s->state, SRV_DRAINING);
    pthread_mutex_lock(&s->mu);
    tk_engine *e = s->e;
    s->e = NULL;
    pthread_mutex_unlock(&s->mu);
    return e;
}

void srv_stop(srv *s) {
    if (!s) return;
    if (s->watching) {
        atomic_store(&s->stop, true);
        pthread_join(s->watcher, NULL);
    }
    if (s->d) MHD_stop_daemon(s->d);
    srv_metrics_destroy(&s->metrics);
    pthread_mutex_destroy(&s->mu);
    free(s->host);
    free(s->name);
    free(s->api_key);
    free(s);
}
