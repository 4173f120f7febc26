/* tokamak serve: an OpenAI-compatible HTTP server over one engine (see
 * docs/server.md). SIGTERM or SIGINT drains: new requests get 503, in-flight
 * ones finish for up to --drain-timeout seconds, then the rest are cancelled
 * and the process exits 0; a second signal exits at once (128 + signal). */
#include <math.h>
#include <signal.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "bench/probe.h"
#include "cli/cli.h"
#include "server/server.h"
#include "tokamak.h"

typedef struct serve_args {
    srv_opts so;
    long max_body, max_pending; /* into so once parsed */
    double drain;               /* seconds in-flight requests may take after a signal */
} serve_args;

#define S(f) offsetof(serve_args, so.f)
static const cli_opt SERVE_ROWS[] = {
    {.kind = CLI_SECTION, .name = "server"},
    {.name = "--host",
     .arg = "ADDR",
     .help = "address to listen on (127.0.0.1)",
     .kind = CLI_STR,
     .off = S(host)},
    {.name = "--port",
     .arg = "N",
     .help = "port (8080; 0: any free port, printed at start)",
     .kind = CLI_INT,
     .off = S(port),
     .lo = 0,
     .hi = 65535},
    {.name = "--api-key",
     .arg = "KEY",
     .help = "require 'Authorization: Bearer KEY' (default: $TOKAMAK_API_KEY, else none)",
     .kind = CLI_STR,
     .off = S(api_key)},
    {.name = "--served-model-name",
     .arg = "NAME",
     .help = "the model's name in the API (default: the -m argument)",
     .kind = CLI_STR,
     .off = S(served_name)},
    {.name = "--max-queue",
     .arg = "N",
     .help = "waiting requests before 429 (1024)",
     .kind = CLI_INT,
     .dest = CLI_D_ENGINE,
     .off = offsetof(tk_engine_opts, max_queue),
     .lo = 1,
     .hi = 1 << 20},
    {.name = "--max-body",
     .arg = "BYTES",
     .help = "largest request body; larger gets 413 (8388608)",
     .kind = CLI_LONG,
     .off = offsetof(serve_args, max_body),
     .lo = 64,
     .hi = 4294967296.0},
    {.name = "--max-pending",
     .arg = "BYTES",
     .help = "stream bytes a client may fall behind before it is cut off (4194304)",
     .kind = CLI_LONG,
     .off = offsetof(serve_args, max_pending),
     .lo = 1024,
     .hi = 4294967296.0},
    {.name = "--drain-timeout",
     .arg = "S",
     .help = "on SIGTERM, seconds in-flight requests may take to finish (30)",
     .kind = CLI_DOUBLE,
     .off = offsetof(serve_args, drain),
     .lo = 0,
     .hi = 86400},
    {.name = "--sndbuf",
     .arg = "BYTES",
     .help = "kernel send buffer of each connection (0: the kernel's autotuning, up to 4 MiB)",
     .kind = CLI_INT,
     .off = S(sndbuf),
     .lo = 0,
     .hi = 1 << 30},
    {.name = "--http-threads",
     .arg = "N",
     .help = "HTTP worker threads (4)",
     .kind = CLI_INT,
     .off = S(http_threads),
     .lo = 1,
     .hi = 256},
    {.name = "--quiet", .alias = "-q", .help = "no per-request log lines", .kind = CLI_FLAG, .off = S(quiet)},
    {0},
};
#undef S

static const cli_cmd SERVE_CMD = {
    "serve",
    "usage: tokamak serve -m MODEL [options]",
    CLI_G_MODEL | CLI_G_ENGINE,
    SERVE_ROWS,
    "SIGTERM or SIGINT drains: new requests get 503, in-flight ones finish for up to\n"
    "--drain-timeout seconds, then the rest are cancelled; a second signal exits at once.",
    0,
    NULL,
};

/* Wait up to s seconds for a signal in set; its number, or 0. */
static int wait_signal(const sigset_t *set, double s) {
    struct timespec ts = {(time_t)s, (long)((s - floor(s)) * 1e9)};
    int sig = sigtimedwait(set, NULL, &ts);
    return sig > 0 ? sig : 0;
}

int cmd_serve(int argc, char **argv) {
    serve_args sa = {.drain = 30};
    srv_opts *so = &sa.so;
    srv_opts_default(so);
    so->api_key = getenv("TOKAMAK_API_KEY");
    if (so->api_key && !*so->api_key) so->api_key = NULL;
    sa.max_body = (long)so->max_body;
    sa.max_pending = (long)so->max_pending;
    cli_opts o;
    cli_opts_init(&o, &SERVE_CMD, &sa);
    int rc = cli_opts_parse(&o, argc, argv);
    if (rc != CLI_GO_ON) return rc;
    const char *model = o.model_path;
    if (!model) {
        cli_error(&SERVE_CMD, "need -m MODEL");
        cli_opts_usage(&SERVE_CMD, stderr);
        return 2;
    }
    so->max_body = (size_t)sa.max_body;
    so->max_pending = (size_t)sa.max_pending;
    if (so->served_name == NULL || !strcmp(so->served_name, "tokamak")) so->served_name = model;
    double drain = sa.drain;

    /* Signals are taken synchronously by this thread; every thread started from
     * here on inherits the mask. */
    sigset_t sigs;
    sigemptyset(&sigs);
    sigaddset(&sigs, SIGTERM);
    sigaddset(&sigs, SIGINT);
    pthread_sigmask(SIG_BLOCK, &sigs, NULL);
    signal(SIGPIPE, SIG_IGN);

    srv *s = NULL;
    if (!srv_start(so, &s)) return 1;
    fprintf(stderr, "tokamak serve: listening on http://%s:%d (loading %s)\n", so->host, srv_port(s), model);
    tk_model *m = NULL;
    tk_engine *e = NULL;
    if (tk_model_open(model, &o.model, &m) != TK_OK) {
        fprintf(stderr, "tokamak serve: cannot load the model: %s\n", tk_last_error());
        srv_stop(s);
        return 1;
    }
    cli_opts_fit_model(&o, m);
    tk_model_info mi;
    tk_model_get_info(m, &mi);
    if (!tk_model_chat_format(m)) {
        fprintf(stderr, "tokamak serve: %s carries no vocabulary; the server needs the model's tokenizer\n",
                model);
        srv_stop(s);
        tk_model_free(m);
        return 1;
    }
    if (tk_engine_create(m, &o.engine, &e) != TK_OK) {
        fprintf(stderr, "tokamak serve: cannot start the engine: %s\n", tk_last_error());
        srv_stop(s);
        tk_model_free(m);
        return 1;
    }
    srv_set_ready(s, m, e, o.engine.ctx);
    fprintf(stderr, "tokamak serve: ready: model '%s' (%s, %s, chat format %s), ctx %d, max batch %d\n",
            so->served_name, mi.arch, mi.weight_dtype, tk_model_chat_format(m), o.engine.ctx,
            o.engine.max_batch);
    int rt_us, rt_per;
    if (probe_rt_throttled(&rt_us, &rt_per))
        fprintf(
            stderr,
            "tokamak serve: warning: a real-time class under the kernel's real-time throttle (%d of each %d "
            "us): the engine's busy threads stop ~%.0f ms each second, which every stream's inter-token "
            "latency sees; run at normal priority or under nice instead\n",
            rt_us, rt_per, 1e3 * (double)(rt_per - rt_us) / (double)rt_per);

    int sig;
    while (!(sig = wait_signal(&sigs, 3600))) {
    }
    fprintf(stderr, "tokamak serve: signal %d: draining (up to %g s)\n", sig, drain);
    srv_drain(s);
    double deadline = tk_now_s() + drain;
    while (srv_in_flight(s) > 0 && tk_now_s() < deadline)
        if ((sig = wait_signal(&sigs, 0.05))) {
            fprintf(stderr, "tokamak serve: second signal: exiting now\n");
            _exit(128 + sig);
        }
    if (srv_in_flight(s) > 0) {
        fprintf(stderr, "tokamak serve: drain timeout: cancelling %d requests\n", srv_in_flight(s));
        srv_cancel_all(s);
        double until = tk_now_s() + 2;
        while (srv_in_flight(s) > 0 && tk_now_s() < until)
            if ((sig = wait_signal(&sigs, 0.05))) _exit(128 + sig);
    }
    tk_engine_free(srv_detach_engine(s));
    srv_stop(s);
    tk_model_free(m);
    fprintf(stderr, "tokamak serve: stopped\n");
    return 0;
}
