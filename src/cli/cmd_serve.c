/* tokamak serve: an OpenAI-compatible HTTP server over one engine (see
 * docs/server.md). SIGTERM or SIGINT drains: new requests get 503, in-flight
 * ones finish for up to --drain-timeout seconds, then the rest are cancelled
 * and the process exits 0; a second signal exits at once (128 + signal). */
#include <errno.h>
#include <getopt.h>
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "cli/cli.h"
#include "server/server.h"
#include "tokamak.h"

static void serve_usage(FILE *f) {
    fprintf(
        f,
        "usage: tokamak serve -m MODEL [options]\n\n"
        "server:\n"
        "  -m, --model PATH           GGUF file or HF directory\n"
        "  --host ADDR                address to listen on (127.0.0.1)\n"
        "  --port N                   port (8080; 0: any free port, printed at start)\n"
        "  --api-key KEY              require 'Authorization: Bearer KEY' (default: $TOKAMAK_API_KEY, else "
        "none)\n"
        "  --served-model-name NAME   the model's name in the API (default: the -m argument)\n"
        "  --max-queue N              waiting requests before 429 (1024)\n"
        "  --max-body BYTES           largest request body; larger gets 413 (8388608)\n"
        "  --max-pending BYTES        stream bytes a client may fall behind before it is cut off (4194304)\n"
        "  --drain-timeout S          on SIGTERM, seconds in-flight requests may take to finish (30)\n"
        "  --http-threads N           HTTP worker threads (4)\n"
        "  -q, --quiet                no per-request log lines\n"
        "engine:\n"
        "  --threads N                worker threads (0: one per core)\n"
        "  --pin                      pin threads to cores\n"
        "  --ctx N                    context per sequence (4096)\n"
        "  --max-batch N              running sequences (32)\n"
        "  --kv-mem MB                KV pool size (default max batch x ctx)\n"
        "  --block-size N             KV block tokens: 16..256 (128)\n"
        "  --kv-type T                f32|f16|bf16|int8 (f16)\n"
        "  --kv-scale S               head|token scales for int8 KV (head)\n"
        "  --step-ms MS               target step time (default: automatic)\n"
        "  --step-tokens N            a fixed budget of N tokens a step; with --step-ms, its cap\n"
        "  --no-chunking              prefill a whole prompt in one step\n"
        "  --unfused                  run the unfused reference stages\n"
        "  --static                   static batching\n"
        "  --repack DTYPE             repack weights at load (e.g. q8_0)\n"
        "  --mmap                     read weights through the file mapping (default: huge-page copy)\n"
        "  --row-layout               keep Q8_0/BF16 weights in file row order (default: interleaved)\n");
}

enum {
    O_HOST = 256,
    O_PORT,
    O_KEY,
    O_NAME,
    O_QUEUE,
    O_BODY,
    O_PENDING,
    O_DRAIN,
    O_HTTP_THREADS,
    O_THREADS,
    O_PIN,
    O_CTX,
    O_MAX_BATCH,
    O_KV_MEM,
    O_BLOCK,
    O_KV_TYPE,
    O_KV_SCALE,
    O_STEP_MS,
    O_STEP_TOKENS,
    O_NO_CHUNK,
    O_UNFUSED,
    O_STATIC,
    O_REPACK,
    O_MMAP,
    O_ROWS,
};

static bool int_opt(const char *name, const char *s, long lo, long hi, long *out) {
    if (cli_parse_long(s, lo, hi, out)) return true;
    fprintf(stderr, "tokamak serve: %s wants an integer in %ld..%ld, got '%s'\n", name, lo, hi, s);
    return false;
}

static bool real_opt(const char *name, const char *s, double lo, double hi, double *out) {
    char *end;
    errno = 0;
    double v = strtod(s, &end);
    if (!errno && end != s && !*end && isfinite(v) && v >= lo && v <= hi) {
        *out = v;
        return true;
    }
    fprintf(stderr, "tokamak serve: %s wants a number in %g..%g, got '%s'\n", name, lo, hi, s);
    return false;
}

/* Wait up to s seconds for a signal in set; its number, or 0. */
static int wait_signal(const sigset_t *set, double s) {
    struct timespec ts = {(time_t)s, (long)((s - floor(s)) * 1e9)};
    int sig = sigtimedwait(set, NULL, &ts);
    return sig > 0 ? sig : 0;
}

int cmd_serve(int argc, char **argv) {
    static const struct option longopts[] = {
        {"model", required_argument, 0, 'm'},
        {"host", required_argument, 0, O_HOST},
        {"port", required_argument, 0, O_PORT},
        {"api-key", required_argument, 0, O_KEY},
        {"served-model-name", required_argument, 0, O_NAME},
        {"max-queue", required_argument, 0, O_QUEUE},
        {"max-body", required_argument, 0, O_BODY},
        {"max-pending", required_argument, 0, O_PENDING},
        {"drain-timeout", required_argument, 0, O_DRAIN},
        {"http-threads", required_argument, 0, O_HTTP_THREADS},
        {"quiet", no_argument, 0, 'q'},
        {"threads", required_argument, 0, O_THREADS},
        {"pin", no_argument, 0, O_PIN},
        {"ctx", required_argument, 0, O_CTX},
        {"max-batch", required_argument, 0, O_MAX_BATCH},
        {"kv-mem", required_argument, 0, O_KV_MEM},
        {"block-size", required_argument, 0, O_BLOCK},
        {"kv-type", required_argument, 0, O_KV_TYPE},
        {"kv-scale", required_argument, 0, O_KV_SCALE},
        {"step-ms", required_argument, 0, O_STEP_MS},
        {"step-tokens", required_argument, 0, O_STEP_TOKENS},
        {"no-chunking", no_argument, 0, O_NO_CHUNK},
        {"unfused", no_argument, 0, O_UNFUSED},
        {"static", no_argument, 0, O_STATIC},
        {"repack", required_argument, 0, O_REPACK},
        {"mmap", no_argument, 0, O_MMAP},
        {"row-layout", no_argument, 0, O_ROWS},
        {"help", no_argument, 0, 'h'},
        {0, 0, 0, 0},
    };
    srv_opts so;
    srv_opts_default(&so);
    so.api_key = getenv("TOKAMAK_API_KEY");
    if (so.api_key && !*so.api_key) so.api_key = NULL;
    tk_engine_opts eo;
    tk_engine_opts_default(&eo);
    tk_model_opts mo;
    tk_model_opts_default(&mo);
    const char *model = NULL;
    double drain = 30;
    long v;
    double d;
    optind = 1;
    opterr = 0;
    int c;
    while ((c = getopt_long(argc, argv, ":m:qh", longopts, NULL)) != -1) {
        bool ok = true;
        switch (c) {
        case 'm':
            model = optarg;
            break;
        case 'q':
            so.quiet = true;
            break;
        case 'h':
            serve_usage(stdout);
            return 0;
        case O_HOST:
            so.host = optarg;
            break;
        case O_PORT:
            ok = int_opt("--port", optarg, 0, 65535, &v), so.port = (int)v;
            break;
        case O_KEY:
            so.api_key = optarg;
            break;
        case O_NAME:
            so.served_name = optarg;
            break;
        case O_QUEUE:
            ok = int_opt("--max-queue", optarg, 1, 1 << 20, &v), eo.max_queue = (int)v;
            break;
        case O_BODY:
            ok = int_opt("--max-body", optarg, 64, 1L << 32, &v), so.max_body = (size_t)v;
            break;
        case O_PENDING:
            ok = int_opt("--max-pending", optarg, 1024, 1L << 32, &v), so.max_pending = (size_t)v;
            break;
        case O_DRAIN:
            ok = real_opt("--drain-timeout", optarg, 0, 86400, &drain);
            break;
        case O_HTTP_THREADS:
            ok = int_opt("--http-threads", optarg, 1, 256, &v), so.http_threads = (int)v;
            break;
        case O_THREADS:
            ok = int_opt("--threads", optarg, 0, 1024, &v), eo.n_threads = (int)v;
            break;
        case O_PIN:
            eo.pin_threads = true;
            break;
        case O_CTX:
            ok = int_opt("--ctx", optarg, 1, 1 << 24, &v), eo.ctx = (int)v;
            break;
        case O_MAX_BATCH:
            ok = int_opt("--max-batch", optarg, 1, 4096, &v), eo.max_batch = (int)v;
            break;
        case O_KV_MEM:
            ok = int_opt("--kv-mem", optarg, 1, 1 << 22, &v), eo.kv_mem = (size_t)v << 20;
            break;
        case O_BLOCK:
            ok = int_opt("--block-size", optarg, 1, 4096, &v), eo.block_size = (int)v;
            break;
        case O_KV_TYPE:
            if (!strcmp(optarg, "f32"))
                eo.kv_type = TK_KV_F32;
            else if (!strcmp(optarg, "f16"))
                eo.kv_type = TK_KV_F16;
            else if (!strcmp(optarg, "bf16"))
                eo.kv_type = TK_KV_BF16;
            else if (!strcmp(optarg, "int8"))
                eo.kv_type = TK_KV_INT8;
            else
                ok = false,
                fprintf(stderr, "tokamak serve: --kv-type wants f32|f16|bf16|int8, got '%s'\n", optarg);
            break;
        case O_KV_SCALE:
            if (!strcmp(optarg, "head"))
                eo.kv_scale = TK_KV_SCALE_HEAD;
            else if (!strcmp(optarg, "token"))
                eo.kv_scale = TK_KV_SCALE_TOKEN;
            else
                ok = false, fprintf(stderr, "tokamak serve: --kv-scale wants head|token, got '%s'\n", optarg);
            break;
        case O_STEP_MS:
            ok = real_opt("--step-ms", optarg, 0, 60000, &eo.step_ms);
            break;
        case O_STEP_TOKENS:
            ok = int_opt("--step-tokens", optarg, 0, 1 << 20, &v), eo.step_tokens = (int)v;
            break;
        case O_NO_CHUNK:
            eo.no_chunking = true;
            break;
        case O_UNFUSED:
            eo.unfused = true;
            break;
        case O_STATIC:
            eo.static_batching = true;
            break;
        case O_REPACK:
            if (!tk_weight_type_from_name(optarg, &mo.repack))
                ok = false, fprintf(stderr, "tokamak serve: --repack wants a type such as q8_0, got '%s'\n", optarg);
            break;
        case O_MMAP:
            mo.use_mmap = true;
            break;
        case O_ROWS:
            mo.row_layout = true;
            break;
        case ':':
            fprintf(stderr, "tokamak serve: %s needs a value\n", argv[optind - 1]);
            return 2;
        default:
            fprintf(stderr, "tokamak serve: unknown option '%s'\n", argv[optind - 1]);
            return 2;
        }
        if (!ok) return 2;
    }
    if (optind < argc) {
        fprintf(stderr, "tokamak serve: unexpected argument '%s'\n", argv[optind]);
        return 2;
    }
    if (!model) {
        fprintf(stderr, "tokamak serve: need -m MODEL\n");
        serve_usage(stderr);
        return 2;
    }
    if (so.served_name == NULL || !strcmp(so.served_name, "tokamak")) so.served_name = model;
    (void)d;

    /* Signals are taken synchronously by this thread; every thread started from
     * here on inherits the mask. */
    sigset_t sigs;
    sigemptyset(&sigs);
    sigaddset(&sigs, SIGTERM);
    sigaddset(&sigs, SIGINT);
    pthread_sigmask(SIG_BLOCK, &sigs, NULL);
    signal(SIGPIPE, SIG_IGN);

    srv *s = NULL;
    if (!srv_start(&so, &s)) return 1;
    fprintf(stderr, "tokamak serve: listening on http://%s:%d (loading %s)\n", so.host, srv_port(s), model);
    tk_model *m = NULL;
    tk_engine *e = NULL;
    if (tk_model_open(model, &mo, &m) != TK_OK) {
        fprintf(stderr, "tokamak serve: cannot load the model: %s\n", tk_last_error());
        srv_stop(s);
        return 1;
    }
    tk_model_info mi;
    tk_model_get_info(m, &mi);
    if (!tk_model_chat_format(m)) {
        fprintf(stderr, "tokamak serve: %s carries no vocabulary; the server needs the model's tokenizer\n",
                model);
        srv_stop(s);
        tk_model_free(m);
        return 1;
    }
    if (tk_engine_create(m, &eo, &e) != TK_OK) {
        fprintf(stderr, "tokamak serve: cannot start the engine: %s\n", tk_last_error());
        srv_stop(s);
        tk_model_free(m);
        return 1;
    }
    srv_set_ready(s, m, e, eo.ctx);
    fprintf(stderr, "tokamak serve: ready: model '%s' (%s, %s, chat format %s), ctx %d, max batch %d\n",
            so.served_name, mi.arch, mi.weight_dtype, tk_model_chat_format(m), eo.ctx, eo.max_batch);

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
