/* The HTTP side of `tokamak serve`: an OpenAI-compatible API over one engine,
 * on libmicrohttpd (docs/server.md). Built only on include/tokamak.h.
 *
 * Lifecycle: srv_start listens at once (GET /health answers 503 "loading");
 * srv_set_ready hands it the model and engine; srv_drain stops admitting;
 * srv_detach_engine takes the engine away (after every request has finished
 * or been cancelled) so the caller can free it; srv_stop closes everything. */
#ifndef TK_SERVER_SERVER_H
#define TK_SERVER_SERVER_H

#include <stdbool.h>
#include <stddef.h>

#include "tokamak.h"

typedef struct srv srv;

typedef struct srv_opts {
    const char *host;        /* IPv4 or IPv6 literal (default 127.0.0.1) */
    int port;                /* 0: an ephemeral port (srv_port tells which) */
    const char *api_key;     /* NULL: no authentication */
    const char *served_name; /* the model's name in the API */
    size_t max_body;         /* request bodies over this get 413 */
    size_t max_pending;      /* stream bytes a client may fall behind before it is cut off */
    int http_threads;        /* libmicrohttpd worker threads */
    int sndbuf;              /* SO_SNDBUF of every connection in bytes; 0: the kernel's autotuning */
    bool quiet;              /* no per-request log lines */
} srv_opts;

void srv_opts_default(srv_opts *o);

/* Listen; false with a message on stderr when the address cannot be bound. */
bool srv_start(const srv_opts *o, srv **out);
int srv_port(const srv *s);
/* From now on requests run on e over m (both must outlive the server's use:
 * see srv_detach_engine). ctx: the engine's context per sequence. */
void srv_set_ready(srv *s, const tk_model *m, tk_engine *e, int ctx);
/* Refuse new work with 503 from now on. */
void srv_drain(srv *s);
/* HTTP requests being handled (any endpoint). */
int srv_in_flight(srv *s);
/* Cancel every request in the engine. */
void srv_cancel_all(srv *s);
/* Forget the engine (no more submit or cancel); returns it for the caller to free. */
tk_engine *srv_detach_engine(srv *s);
/* Stop listening, close every connection, free. NULL is a no-op. */
void srv_stop(srv *s);

#endif
