/* tokamak bench: TTFT, TPOT, ITL, throughput and the bandwidth roofline in
 * one command (see docs/benchmarking.md). */
#include <stddef.h>
#include <stdio.h>
#include <string.h>

#include "bench/bench.h"
#include "bench/probe.h"
#include "bench/report.h"
#include "cli/cli.h"
#include "cli/load.h"
#include "cli/opts.h"
#include "tokamak.h"

#include "tk_git_commit.h" /* generated at build time: TK_GIT_COMMIT */

typedef struct bench_args {
    load_args l; /* first: LOAD_ROWS' offsets */
    bool probe;
} bench_args;

static const cli_opt BENCH_ROWS[] = {
    {.kind = CLI_SECTION, .name = "bench"},
    {.name = "--ablation",
     .help = "the optimisation ladder, each rung against the first, in rounds (--repeat, default 3) that "
             "alternate the rungs' order",
     .kind = CLI_FLAG,
     .off = offsetof(bench_args, l.b.ablation)},
    {.name = "--probe",
     .help = "print read bandwidth and peak compute, then exit",
     .kind = CLI_FLAG,
     .off = offsetof(bench_args, probe)},
    {0},
};

static const cli_cmd BENCH_CMD = {
    "bench",
    "usage: tokamak bench -m MODEL [options]\n"
    "       tokamak bench --probe [--threads N]",
    CLI_G_MODEL | CLI_G_ENGINE,
    BENCH_ROWS,
    "In bench, --ctx defaults to max(in + out, bg-in + bg-out) + 1 and --max-batch to\n"
    "max(32, the largest level); --ablation wants a BF16 model.",
    0,
    LOAD_ROWS,
};

int cmd_bench(int argc, char **argv) {
    bench_args ba = {.probe = false};
    bench_opts_default(&ba.l.b);
    cli_opts co;
    cli_opts_init(&co, &BENCH_CMD, &ba);
    int prc = cli_opts_parse(&co, argc, argv);
    if (prc != CLI_GO_ON) return prc;
    bench_opts o = ba.l.b;
    o.git_commit = TK_GIT_COMMIT;
    o.model_path = co.model_path;
    o.model = co.model;
    o.engine = co.engine;
    o.engine_ctx_set = cli_opts_given(&co, "--ctx");
    o.engine_max_batch_set = cli_opts_given(&co, "--max-batch");
    bool probe = ba.probe, batch_set = cli_opts_given(&co, "--concurrency");
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
        fprintf(stderr, "tokamak bench: --rate and --concurrency exclude each other\n");
        return 2;
    }
    /* The ablation reports batch 1 and batch 32 unless told otherwise, in
     * three rounds (bench_run) unless --repeat says how many. */
    if (o.ablation && !batch_set && o.n_rates == 0) {
        o.levels[0] = 1, o.levels[1] = 32;
        o.n_levels = 2;
    }
    if (o.ablation && !cli_opts_given(&co, "--repeat")) o.repeat = BENCH_ABLATION_ROUNDS;
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
        /* The message names its tool ("bench: ..."). */
        fprintf(stderr, "tokamak %s\n", tk_last_error());
        rc = 1;
    }
    /* What was measured before a failure is still reported. */
    if (r.n_series > 0) {
        ba.l.b = o;
        if (load_report(&r, &ba.l, "bench") != 0) rc = 1;
    }
    bench_result_free(&r);
    return rc;
}
