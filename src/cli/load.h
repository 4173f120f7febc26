/* The options and reports that tokamak bench and tokamak loadgen share: the
 * same load (--in/--out, levels or rates, requests, repeats, background
 * streams) and the same outputs (markdown, --json, --csv, --plot). A
 * subcommand's argument struct starts with a load_args, so that LOAD_ROWS'
 * offsets hold for it (cli_cmd.own_shared). */
#ifndef TK_CLI_LOAD_H
#define TK_CLI_LOAD_H

#include "bench/bench.h"
#include "cli/opts.h"

typedef struct load_args {
    bench_opts b;
    const char *json, *csv, *plot;
} load_args;

extern const cli_opt LOAD_ROWS[];

/* The markdown report on stdout, then each file asked for. Returns 0, or 1
 * after printing a writer's error as "tokamak <who>: ...". */
int load_report(const bench_result *r, const load_args *a, const char *who);

#endif
