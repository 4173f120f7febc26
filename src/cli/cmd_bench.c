/* tokamak bench: TTFT, TPOT, ITL, throughput and the bandwidth roofline in
 * one command (see docs/benchmarking.md). */
#include <errno.h>
#include <math.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bench/bench.h"
#include "bench/probe.h"
#include "bench/report.h"
#include "cli/cli.h"
#include "cli/opts.h"
#include "tokamak.h"

#include "tk_git_commit.h" /* generated at build time: TK_GIT_COMMIT */

typedef struct bench_args {
    bench_opts b;
    const char *json, *csv, *plot;
    bool probe;
} bench_args;

/* "1,4,8" -> ints in 1..4096 (real: positive finite numbers); false on junk or too many. */
static bool parse_list(const char *s, bool real, int *ints, double *reals, int *n) {
    int k = 0;
    const char *p = s;
    while (*p) {
        if (k == BENCH_MAX_LEVELS) return false;
        char *end;
        errno = 0;
        if (real) {
            double v = strtod(p, &end);
            if (errno || end == p || !(v > 0) || !isfinite(v)) return false;
            reals[k] = v;
        } else {
            long v = strtol(p, &end, 10);
            if (errno || end == p || v < 1 || v > 4096) return false;
            ints[k] = (int)v;
        }
        k++;
        if (*end == ',' && end[1])
            p = end + 1;
        else if (*end == 0)
            p = end;
        else
            return false;
    }
    *n = k;
    return k > 0;
}

static bool parse_batch(const char *v, void *dst) {
    bench_opts *b = dst;
    return parse_list(v, false, b->levels, NULL, &b->n_levels);
}

static bool parse_rate(const char *v, void *dst) {
    bench_opts *b = dst;
    return parse_list(v, true, NULL, b->rates, &b->n_rates);
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

#define B(f) offsetof(bench_args, b.f)
static const cli_opt BENCH_ROWS[] = {
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
    {.name = "--batch",
     .arg = "LIST",
     .help = "closed-loop concurrency levels (1,4,8,16,32)",
     .kind = CLI_FN,
     .off = offsetof(bench_args, b),
     .fn = parse_batch,
     .want = "a comma-separated list of at most 32 integers in 1..4096"},
    {.name = "--rate",
     .arg = "LIST",
     .help = "Poisson arrival rates in req/s instead of --batch",
     .kind = CLI_FN,
     .off = offsetof(bench_args, b),
     .fn = parse_rate,
     .want = "a comma-separated list of at most 32 positive numbers"},
    {.name = "--requests",
     .arg = "N|Nx",
     .help = "requests per level, or N x the level (default 2x; 16 per rate)",
     .kind = CLI_FN,
     .off = offsetof(bench_args, b),
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
    {.name = "--ablation",
     .help = "the optimisation ladder, each rung against the first",
     .kind = CLI_FLAG,
     .off = B(ablation)},
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
    {.name = "--probe",
     .help = "print read bandwidth and peak compute, then exit",
     .kind = CLI_FLAG,
     .off = offsetof(bench_args, probe)},
    {.kind = CLI_SECTION, .name = "output"},
    {.name = "--json",
     .arg = "FILE",
     .help = "every raw sample",
     .kind = CLI_STR,
     .off = offsetof(bench_args, json)},
    {.name = "--csv",
     .arg = "FILE",
     .help = "one row per measured run",
     .kind = CLI_STR,
     .off = offsetof(bench_args, csv)},
    {.name = "--plot",
     .arg = "FILE.png",
     .help = "TPOT P50/P99 and throughput against concurrency (gnuplot)",
     .kind = CLI_STR,
     .off = offsetof(bench_args, plot)},
    {.name = "--quiet", .alias = "-q", .help = "no progress on stderr", .kind = CLI_FLAG, .off = B(quiet)},
    {0},
};
#undef B

static const cli_cmd BENCH_CMD = {
    "bench",
    "usage: tokamak bench -m MODEL [options]\n"
    "       tokamak bench --probe [--threads N]",
    CLI_G_MODEL | CLI_G_ENGINE,
    BENCH_ROWS,
    "In bench, --ctx defaults to max(in + out, bg-in + bg-out) + 1 and --max-batch to\n"
    "max(32, the largest level); --ablation wants a BF16 model.",
    0,
};

int cmd_bench(int argc, char **argv) {
    bench_args ba = {.json = NULL};
    bench_opts_default(&ba.b);
    cli_opts co;
    cli_opts_init(&co, &BENCH_CMD, &ba);
    int prc = cli_opts_parse(&co, argc, argv);
    if (prc != CLI_GO_ON) return prc;
    bench_opts o = ba.b;
    o.git_commit = TK_GIT_COMMIT;
    o.model_path = co.model_path;
    o.model = co.model;
    o.engine = co.engine;
    o.engine_ctx_set = cli_opts_given(&co, "--ctx");
    o.engine_max_batch_set = cli_opts_given(&co, "--max-batch");
    const char *json = ba.json, *csv = ba.csv, *plot = ba.plot;
    bool probe = ba.probe, batch_set = cli_opts_given(&co, "--batch");
    if (probe) {
        bench_info info;
        memset(&info, 0, sizeof info);
        bench_probe_machine(o.engine.n_threads, &info);
        printf("# tokamak bench --probe\n\n");
        report_probe(&info, stdout);
        printf("- commit %s\n", TK_GIT_COMMIT);
        return 0;
    }
    if (!o.model_path) {
        fprintf(stderr, "tokamak bench: no model: -m MODEL (or --probe)\n");
        return 2;
    }
    if (o.n_rates > 0 && batch_set) {
        fprintf(stderr, "tokamak bench: --rate and --batch exclude each other\n");
        return 2;
    }
    /* The ablation reports batch 1 and batch 32 unless told otherwise. */
    if (o.ablation && !batch_set && o.n_rates == 0) {
        o.levels[0] = 1, o.levels[1] = 32;
        o.n_levels = 2;
    }
    if (o.ablation && o.n_bg > 0) {
        fprintf(stderr, "tokamak bench: --background measures one configuration, not --ablation\n");
        return 2;
    }
    if (o.ablation && o.n_rates > 0) {
        fprintf(stderr, "tokamak bench: --ablation runs closed-loop levels, not --rate\n");
        return 2;
    }

    bench_result r;
    tk_status st = bench_run(&o, &r);
    int rc = 0;
    if (st != TK_OK) {
        fprintf(stderr, "tokamak bench: %s\n", tk_last_error());
        rc = 1;
    }
    /* What was measured before a failure is still reported. */
    if (r.n_series > 0) {
        report_markdown(&r, stdout);
        fflush(stdout);
        const char *what[3] = {json, csv, plot};
        for (int i = 0; i < 3; i++) {
            if (!what[i]) continue;
            tk_status ws = i == 0   ? report_json_write(&r, what[i])
                           : i == 1 ? report_csv_write(&r, what[i])
                                    : report_plot_write(&r, what[i]);
            if (ws != TK_OK) {
                fprintf(stderr, "tokamak bench: %s\n", tk_last_error());
                rc = 1;
            } else if (!o.quiet) {
                fprintf(stderr, "bench: wrote %s\n", what[i]);
            }
        }
    }
    bench_result_free(&r);
    return rc;
}
