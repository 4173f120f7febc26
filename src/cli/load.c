/* The load options and reports of tokamak bench and tokamak loadgen. */
#include "cli/load.h"

#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bench/report.h"
#include "cli/cli.h"

static bool parse_batch(const char *v, void *dst) {
    bench_opts *b = dst;
    return cli_parse_int_list(v, 1, 4096, BENCH_MAX_LEVELS, b->levels, &b->n_levels);
}

static bool parse_rate(const char *v, void *dst) {
    bench_opts *b = dst;
    return cli_parse_real_list(v, BENCH_MAX_LEVELS, b->rates, &b->n_rates);
}

/* "N" requests per level, or "Nx": N times the level (one wave per slot with 1x). */
static bool parse_requests(const char *v, void *dst) {
    bench_opts *b = dst;
    size_t len = strlen(v);
    long n;
    if (len > 1 && v[len - 1] == 'x') {
        char num[32];
        if (len > sizeof num) return false;
        snprintf(num, sizeof num, "%.*s", (int)(len - 1), v);
        if (!cli_parse_long(num, 1, 1000, &n)) return false;
        b->requests_x = (int)n;
        b->requests = 0;
        return true;
    }
    if (!cli_parse_long(v, 1, 1000000, &n)) return false;
    b->requests = (int)n;
    return true;
}

#define B(f) offsetof(load_args, b.f)
const cli_opt LOAD_ROWS[] = {
    {.kind = CLI_SECTION, .name = "load"},
    {.name = "--in",
     .arg = "N",
     .help = "prompt tokens per request (512)",
     .kind = CLI_INT,
     .off = B(n_in),
     .lo = 1,
     .hi = 1 << 24},
    {.name = "--out",
     .arg = "N",
     .help = "output tokens per request, EOS ignored (512)",
     .kind = CLI_INT,
     .off = B(n_out),
     .lo = 1,
     .hi = 1 << 24},
    {.name = "--concurrency",
     .alias = "--batch",
     .arg = "LIST",
     .help = "closed-loop concurrency levels (1,4,8,16,32)",
     .kind = CLI_FN,
     .off = offsetof(load_args, b),
     .fn = parse_batch,
     .want = "a comma-separated list of at most 32 integers in 1..4096"},
    {.name = "--rate",
     .arg = "LIST",
     .help = "Poisson arrival rates in req/s instead of --concurrency",
     .kind = CLI_FN,
     .off = offsetof(load_args, b),
     .fn = parse_rate,
     .want = "a comma-separated list of at most 32 positive numbers"},
    {.name = "--requests",
     .arg = "N|Nx",
     .help = "requests per level, or N x the level (default 2x; 16 per rate)",
     .kind = CLI_FN,
     .off = offsetof(load_args, b),
     .fn = parse_requests,
     .want = "N in 1..1000000, or Nx with N in 1..1000"},
    {.name = "--warmup",
     .arg = "N",
     .help = "unmeasured requests first (1)",
     .kind = CLI_INT,
     .off = B(warmup),
     .lo = 0,
     .hi = 10000},
    {.name = "--repeat",
     .arg = "N",
     .help = "runs per level; reports the median and min-max (1)",
     .kind = CLI_INT,
     .off = B(repeat),
     .lo = 1,
     .hi = 64},
    {.name = "--seed", .arg = "N", .help = "prompts and arrivals (1234)", .kind = CLI_U64, .off = B(seed)},
    {.name = "--background",
     .arg = "N",
     .help = "mixed load: N decode streams run through every measured run",
     .kind = CLI_INT,
     .off = B(n_bg),
     .lo = 0,
     .hi = 4096},
    {.name = "--bg-in",
     .arg = "N",
     .help = "prompt tokens of a background stream (128)",
     .kind = CLI_INT,
     .off = B(bg_in),
     .lo = 1,
     .hi = 1 << 24},
    {.name = "--bg-out",
     .arg = "N",
     .help = "most output tokens of a background stream; cancelled when the run ends (2048)",
     .kind = CLI_INT,
     .off = B(bg_out),
     .lo = 2,
     .hi = 1 << 24},
    {.kind = CLI_SECTION, .name = "output"},
    {.name = "--json",
     .arg = "FILE",
     .help = "every raw sample",
     .kind = CLI_STR,
     .off = offsetof(load_args, json)},
    {.name = "--csv",
     .arg = "FILE",
     .help = "one row per measured run",
     .kind = CLI_STR,
     .off = offsetof(load_args, csv)},
    {.name = "--plot",
     .arg = "FILE.png",
     .help = "TPOT P50/P99 and throughput against concurrency (gnuplot)",
     .kind = CLI_STR,
     .off = offsetof(load_args, plot)},
    {.name = "--quiet", .alias = "-q", .help = "no progress on stderr", .kind = CLI_FLAG, .off = B(quiet)},
    {0},
};
#undef B

int load_report(const bench_result *r, const load_args *a, const char *who) {
    int rc = 0;
    report_markdown(r, stdout);
    fflush(stdout);
    const char *what[3] = {a->json, a->csv, a->plot};
    for (int i = 0; i < 3; i++) {
        if (!what[i]) continue;
        tk_status ws = i == 0   ? report_json_write(r, what[i])
                       : i == 1 ? report_csv_write(r, what[i])
                                : report_plot_write(r, what[i]);
        if (ws != TK_OK) {
            fprintf(stderr, "tokamak %s: %s\n", who, tk_last_error());
            rc = 1;
        } else if (!a->b.quiet) {
            fprintf(stderr, "%s: wrote %s\n", who, what[i]);
        }
    }
    return rc;
}
