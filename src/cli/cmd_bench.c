/* tokamak bench: TTFT, TPOT, ITL, throughput and the bandwidth roofline in
 * one command (see docs/benchmarking.md). */
#include <errno.h>
#include <getopt.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bench/bench.h"
#include "bench/probe.h"
#include "bench/report.h"
#include "cli/cli.h"
#include "core/dtype.h"
#include "tokamak.h"

#include "tk_git_commit.h" /* generated at build time: TK_GIT_COMMIT */

static void bench_usage(FILE *f) {
    fprintf(f,
            "usage: tokamak bench -m MODEL [options]\n"
            "       tokamak bench --probe [--threads N]\n\n"
            "load:\n"
            "  -m, --model PATH      GGUF file or HF directory (BF16 for --ablation)\n"
            "  --in N                prompt tokens per request (512)\n"
            "  --out N               output tokens per request, EOS ignored (512)\n"
            "  --batch LIST          closed-loop concurrency levels (1,4,8,16,32)\n"
            "  --rate LIST           Poisson arrival rates in req/s instead of --batch\n"
            "  --requests N|Nx       requests per level, or N x the level (default 2x; 16 per rate)\n"
            "  --warmup N            unmeasured requests first (1)\n"
            "  --repeat N            runs per level; reports the median and min-max (1)\n"
            "  --seed N              prompts and arrivals (1234)\n"
            "  --ablation            the optimisation ladder, each rung against the first\n"
            "  --background N        mixed load: N decode streams run through every measured run\n"
            "  --bg-in N             prompt tokens of a background stream (128)\n"
            "  --bg-out N            most output tokens of a background stream; cancelled when the run ends (2048)\n"
            "  --probe               print read bandwidth and peak compute, then exit\n"
            "engine:\n"
            "  --threads N           worker threads (0: one per core)\n"
            "  --pin                 pin threads to cores\n"
            "  --ctx N               context per sequence (default max(in + out, bg-in + bg-out) + 1)\n"
            "  --max-batch N         running sequences (default max(32, largest level))\n"
            "  --kv-mem MB           KV pool size (default max batch x ctx)\n"
            "  --block-size N        KV block tokens: 16..256 (128)\n"
            "  --kv-type T           f32|f16|bf16|int8 (f16)\n"
            "  --kv-scale S          head|token scales for int8 KV (head)\n"
            "  --step-ms MS          target step time; prefill chunks are sized from measured costs to fit it\n"
            "                        (default: automatic, 2 x the step's decode time, at most 1000 ms)\n"
            "  --step-tokens N       a fixed budget of N tokens a step (0: the time-based default); with\n"
            "                        --step-ms, the cap of the time-based budget (default 1024)\n"
            "  --no-chunking         prefill a whole prompt in one step\n"
            "  --unfused             run the unfused reference stages\n"
            "  --static              static batching\n"
            "  --repack DTYPE        repack weights at load (e.g. q8_0)\n"
            "  --mmap                read weights through the file mapping (default: huge-page copy)\n"
            "  --row-layout          keep Q8_0/BF16 weights in file row order (default: interleaved)\n"
            "output:\n"
            "  --json FILE           every raw sample\n"
            "  --csv FILE            one row per measured run\n"
            "  --plot FILE.png       TPOT P50/P99 and throughput against concurrency (gnuplot)\n"
            "  -q, --quiet           no progress on stderr\n");
}

static bool parse_int_opt(const char *name, const char *s, long lo, long hi, int *out) {
    long v;
    if (!cli_parse_long(s, lo, hi, &v)) {
        fprintf(stderr, "tokamak bench: %s wants an integer in %ld..%ld, got '%s'\n", name, lo, hi, s);
        return false;
    }
    *out = (int)v;
    return true;
}

/* "1,4,8" -> ints or doubles; false (with a message) on junk or too many. */
static bool parse_list(const char *name, const char *s, bool real, int *ints, double *reals, int *n) {
    *n = 0;
    const char *p = s;
    while (*p) {
        if (*n == BENCH_MAX_LEVELS) {
            fprintf(stderr, "tokamak bench: %s holds more than %d values\n", name, BENCH_MAX_LEVELS);
            return false;
        }
        char *end;
        errno = 0;
        if (real) {
            double v = strtod(p, &end);
            if (errno || end == p || !(v > 0) || !isfinite(v)) goto bad;
            reals[*n] = v;
        } else {
            long v = strtol(p, &end, 10);
            if (errno || end == p || v < 1 || v > 4096) goto bad;
            ints[*n] = (int)v;
        }
        (*n)++;
        if (*end == ',' && end[1]) p = end + 1;
        else if (*end == 0) p = end;
        else goto bad;
    }
    if (*n > 0) return true;
bad:
    fprintf(stderr, "tokamak bench: %s wants a comma-separated list of %s, got '%s'\n", name,
            real ? "positive numbers" : "integers in 1..4096", s);
    return false;
}

enum {
    OPT_IN = 256, OPT_OUT, OPT_BATCH, OPT_RATE, OPT_REQUESTS, OPT_WARMUP, OPT_REPEAT, OPT_SEED, OPT_ABLATION,
    OPT_PROBE, OPT_THREADS, OPT_PIN, OPT_CTX, OPT_MAX_BATCH, OPT_KV_MEM, OPT_BLOCK, OPT_KV_TYPE, OPT_KV_SCALE,
    OPT_STEP, OPT_NO_CHUNK, OPT_UNFUSED, OPT_STATIC, OPT_REPACK, OPT_MMAP, OPT_ROWS, OPT_JSON, OPT_CSV, OPT_PLOT,
    OPT_BACKGROUND, OPT_BG_IN, OPT_BG_OUT, OPT_STEP_MS,
};

int cmd_bench(int argc, char **argv) {
    static const struct option longopts[] = {
        {"model", required_argument, 0, 'm'},      {"in", required_argument, 0, OPT_IN},
        {"out", required_argument, 0, OPT_OUT},    {"batch", required_argument, 0, OPT_BATCH},
        {"rate", required_argument, 0, OPT_RATE},  {"requests", required_argument, 0, OPT_REQUESTS},
        {"warmup", required_argument, 0, OPT_WARMUP}, {"repeat", required_argument, 0, OPT_REPEAT},
        {"seed", required_argument, 0, OPT_SEED},  {"ablation", no_argument, 0, OPT_ABLATION},
        {"probe", no_argument, 0, OPT_PROBE},      {"threads", required_argument, 0, OPT_THREADS},
        {"pin", no_argument, 0, OPT_PIN},          {"ctx", required_argument, 0, OPT_CTX},
        {"max-batch", required_argument, 0, OPT_MAX_BATCH}, {"kv-mem", required_argument, 0, OPT_KV_MEM},
        {"block-size", required_argument, 0, OPT_BLOCK}, {"kv-type", required_argument, 0, OPT_KV_TYPE},
        {"kv-scale", required_argument, 0, OPT_KV_SCALE}, {"step-tokens", required_argument, 0, OPT_STEP},
        {"no-chunking", no_argument, 0, OPT_NO_CHUNK}, {"unfused", no_argument, 0, OPT_UNFUSED},
        {"static", no_argument, 0, OPT_STATIC},    {"repack", required_argument, 0, OPT_REPACK}, {"mmap", no_argument, 0, OPT_MMAP},
        {"row-layout", no_argument, 0, OPT_ROWS},
        {"json", required_argument, 0, OPT_JSON},  {"csv", required_argument, 0, OPT_CSV},
        {"plot", required_argument, 0, OPT_PLOT},  {"quiet", no_argument, 0, 'q'},
        {"background", required_argument, 0, OPT_BACKGROUND}, {"bg-in", required_argument, 0, OPT_BG_IN},
        {"bg-out", required_argument, 0, OPT_BG_OUT}, {"step-ms", required_argument, 0, OPT_STEP_MS},
        {"help", no_argument, 0, 'h'},             {0, 0, 0, 0},
    };
    bench_opts o;
    bench_opts_default(&o);
    o.git_commit = TK_GIT_COMMIT;
    const char *json = NULL, *csv = NULL, *plot = NULL;
    bool probe = false, batch_set = false;
    int kv_mem_mb = 0;
    optind = 1;
    opterr = 0;
    int c;
    while ((c = getopt_long(argc, argv, ":m:qh", longopts, NULL)) != -1) {
        bool ok = true;
        long v;
        switch (c) {
        case 'm': o.model_path = optarg; break;
        case 'q': o.quiet = true; break;
        case 'h': bench_usage(stdout); return 0;
        case OPT_IN: ok = parse_int_opt("--in", optarg, 1, 1 << 24, &o.n_in); break;
        case OPT_OUT: ok = parse_int_opt("--out", optarg, 1, 1 << 24, &o.n_out); break;
        case OPT_BATCH: ok = parse_list("--batch", optarg, false, o.levels, NULL, &o.n_levels), batch_set = true; break;
        case OPT_RATE: ok = parse_list("--rate", optarg, true, NULL, o.rates, &o.n_rates); break;
        case OPT_REQUESTS: {
            /* "N" requests per level, or "Nx": N times the level (one wave per slot with 1x). */
            size_t len = strlen(optarg);
            if (len > 1 && optarg[len - 1] == 'x') {
                char num[32];
                snprintf(num, sizeof num, "%.*s", (int)(len - 1), optarg);
                ok = parse_int_opt("--requests Nx", num, 1, 1000, &o.requests_x);
                o.requests = 0;
            } else {
                ok = parse_int_opt("--requests", optarg, 1, 1000000, &o.requests);
            }
            break;
        }
        case OPT_WARMUP: ok = parse_int_opt("--warmup", optarg, 0, 10000, &o.warmup); break;
        case OPT_REPEAT: ok = parse_int_opt("--repeat", optarg, 1, 64, &o.repeat); break;
        case OPT_SEED:
            ok = cli_parse_long(optarg, 0, LONG_MAX, &v);
            if (ok) o.seed = (uint64_t)v;
            else fprintf(stderr, "tokamak bench: --seed wants a non-negative integer, got '%s'\n", optarg);
            break;
        case OPT_ABLATION: o.ablation = true; break;
        case OPT_BACKGROUND: ok = parse_int_opt("--background", optarg, 0, 4096, &o.n_bg); break;
        case OPT_BG_IN: ok = parse_int_opt("--bg-in", optarg, 1, 1 << 24, &o.bg_in); break;
        case OPT_BG_OUT: ok = parse_int_opt("--bg-out", optarg, 2, 1 << 24, &o.bg_out); break;
        case OPT_PROBE: probe = true; break;
        case OPT_THREADS: ok = parse_int_opt("--threads", optarg, 0, 1024, &o.engine.n_threads); break;
        case OPT_PIN: o.engine.pin_threads = true; break;
        case OPT_CTX: ok = parse_int_opt("--ctx", optarg, 1, 1 << 24, &o.engine.ctx), o.engine_ctx_set = true; break;
        case OPT_MAX_BATCH:
            ok = parse_int_opt("--max-batch", optarg, 1, 4096, &o.engine.max_batch), o.engine_max_batch_set = true;
            break;
        case OPT_KV_MEM: ok = parse_int_opt("--kv-mem", optarg, 1, 1 << 22, &kv_mem_mb); break;
        case OPT_BLOCK: ok = parse_int_opt("--block-size", optarg, 1, 4096, &o.engine.block_size); break;
        case OPT_KV_TYPE:
            if (!strcmp(optarg, "f32")) o.engine.kv_type = TK_KV_F32;
            else if (!strcmp(optarg, "f16")) o.engine.kv_type = TK_KV_F16;
            else if (!strcmp(optarg, "bf16")) o.engine.kv_type = TK_KV_BF16;
            else if (!strcmp(optarg, "int8")) o.engine.kv_type = TK_KV_INT8;
            else {
                fprintf(stderr, "tokamak bench: --kv-type wants f32|f16|bf16|int8, got '%s'\n", optarg);
                ok = false;
            }
            break;
        case OPT_KV_SCALE:
            if (!strcmp(optarg, "head")) o.engine.kv_scale = TK_KV_SCALE_HEAD;
            else if (!strcmp(optarg, "token")) o.engine.kv_scale = TK_KV_SCALE_TOKEN;
            else {
                fprintf(stderr, "tokamak bench: --kv-scale wants head|token, got '%s'\n", optarg);
                ok = false;
            }
            break;
        case OPT_STEP: ok = parse_int_opt("--step-tokens", optarg, 0, 1 << 24, &o.engine.step_tokens); break;
        case OPT_STEP_MS: {
            char *end;
            errno = 0;
            double ms = strtod(optarg, &end);
            ok = !errno && end != optarg && !*end && ms > 0 && ms <= 3600e3;
            if (ok) o.engine.step_ms = ms;
            else fprintf(stderr, "tokamak bench: --step-ms wants milliseconds in (0, 3600000], got '%s'\n", optarg);
            break;
        }
        case OPT_NO_CHUNK: o.engine.no_chunking = true; break;
        case OPT_UNFUSED: o.engine.unfused = true; break;
        case OPT_STATIC: o.engine.static_batching = true; break;
        case OPT_ROWS:
            o.model.row_layout = true;
            break;
        case OPT_MMAP:
            o.model.use_mmap = true;
            break;
        case OPT_REPACK:
            if (!tk_weight_type_from_name(optarg, &o.model.repack)) {
                fprintf(stderr, "tokamak bench: --repack wants a type such as q8_0, got '%s'\n", optarg);
                ok = false;
            }
            break;
        case OPT_JSON: json = optarg; break;
        case OPT_CSV: csv = optarg; break;
        case OPT_PLOT: plot = optarg; break;
        case ':':
            fprintf(stderr, "tokamak bench: %s needs a value\n", argv[optind - 1]);
            ok = false;
            break;
        default:
            fprintf(stderr, "tokamak bench: unknown option '%s'\n", argv[optind - 1]);
            ok = false;
            break;
        }
        if (!ok) {
            fprintf(stderr, "'tokamak bench --help' lists the options.\n");
            return 2;
        }
    }
    if (optind < argc) {
        fprintf(stderr, "tokamak bench: unexpected argument '%s'\n", argv[optind]);
        return 2;
    }
    o.engine.kv_mem = (size_t)kv_mem_mb << 20;

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
            tk_status ws = i == 0 ? report_json_write(&r, what[i])
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
