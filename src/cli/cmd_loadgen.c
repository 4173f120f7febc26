/* tokamak loadgen: bench's load and report against any OpenAI-compatible
 * server over HTTP (see docs/benchmarking.md). */
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bench/loadgen.h"
#include "cli/cli.h"
#include "cli/load.h"
#include "cli/opts.h"
#include "tokamak.h"

#include "tk_git_commit.h" /* generated at build time: TK_GIT_COMMIT */

typedef struct loadgen_args {
    load_args l; /* first: LOAD_ROWS' offsets */
    const char *url, *model, *api_key, *tokenizer;
    double duration, timeout;
} loadgen_args;

#define A(f) offsetof(loadgen_args, f)
static const cli_opt LOADGEN_ROWS[] = {
    {.kind = CLI_SECTION, .name = "server"},
    {.name = "--url",
     .arg = "URL",
     .help = "the server, e.g. http://127.0.0.1:8080",
     .kind = CLI_STR,
     .off = A(url)},
    {.name = "--model",
     .arg = "NAME",
     .help = "the model to ask for (default: the first of GET /v1/models)",
     .kind = CLI_STR,
     .off = A(model)},
    {.name = "--api-key",
     .arg = "KEY",
     .help = "sent as a bearer token (default: $OPENAI_API_KEY, else none)",
     .kind = CLI_STR,
     .off = A(api_key)},
    {.name = "--tokenizer",
     .arg = "MODEL",
     .help = "make the prompts with this model file's tokenizer\n(default: the server's POST /tokenize)",
     .kind = CLI_STR,
     .off = A(tokenizer)},
    {.name = "--duration",
     .arg = "S",
     .help = "submit for S seconds per run instead of --requests",
     .kind = CLI_DOUBLE,
     .off = A(duration),
     .lo = 0,
     .hi = 86400,
     .flags = CLI_LO_OPEN},
    {.name = "--timeout",
     .arg = "S",
     .help = "a request that receives nothing for S seconds fails (300)",
     .kind = CLI_DOUBLE,
     .off = A(timeout),
     .lo = 1,
     .hi = 86400},
    {0},
};
#undef A

static const cli_cmd LOADGEN_CMD = {
    "loadgen",
    "usage: tokamak loadgen --url URL [--model NAME] [options]",
    0,
    LOADGEN_ROWS,
    "Every request streams POST /v1/completions with a prompt of exactly --in token ids,\n"
    "temperature 0 and ignore_eos; times are taken on this side of the connection.",
    0,
    LOAD_ROWS,
};

int cmd_loadgen(int argc, char **argv) {
    loadgen_opts lo;
    loadgen_opts_default(&lo);
    loadgen_args a = {.l = {.b = lo.b}, .timeout = lo.timeout_s};
    cli_opts co;
    cli_opts_init(&co, &LOADGEN_CMD, &a);
    int prc = cli_opts_parse(&co, argc, argv);
    if (prc != CLI_GO_ON) return prc;
    if (!a.url) {
        cli_error(&LOADGEN_CMD, "no server: --url URL");
        return 2;
    }
    if (a.l.b.n_rates > 0 && cli_opts_given(&co, "--concurrency")) {
        cli_error(&LOADGEN_CMD, "--rate and --concurrency exclude each other");
        return 2;
    }
    if (a.duration > 0 && cli_opts_given(&co, "--requests")) {
        cli_error(&LOADGEN_CMD, "--duration and --requests exclude each other");
        return 2;
    }
    lo.b = a.l.b;
    lo.b.git_commit = TK_GIT_COMMIT;
    lo.url = a.url;
    lo.model = a.model;
    lo.api_key = a.api_key ? a.api_key : getenv("OPENAI_API_KEY");
    if (lo.api_key && !lo.api_key[0]) lo.api_key = NULL;
    lo.tokenizer = a.tokenizer;
    lo.duration_s = a.duration;
    lo.timeout_s = a.timeout;

    bench_result r;
    tk_status st = loadgen_run(&lo, &r);
    int rc = 0;
    if (st != TK_OK) {
        /* The message names its tool ("loadgen: ..."). */
        fprintf(stderr, "tokamak %s\n", tk_last_error());
        rc = 1;
    }
    int failed = 0, total = 0;
    for (int i = 0; i < r.n_series; i++)
        for (int p = 0; p < r.series[i].n_points; p++)
            for (int k = 0; k < r.series[i].points[p].n_rep; k++) {
                failed += r.series[i].points[p].rep[k].err.total;
                total += r.series[i].points[p].rep[k].n_requests;
            }
    /* What was measured before a failure is still reported. */
    if (r.n_series > 0 && r.series[0].n_points > 0 && r.series[0].points[0].n_rep > 0) {
        if (load_report(&r, &a.l, "loadgen") != 0) rc = 1;
    }
    if (failed > 0) {
        fprintf(stderr, "tokamak loadgen: %d of %d requests failed (by status in the report)\n", failed,
                total);
        rc = 1;
    }
    bench_result_free(&r);
    return rc;
}
