/* tokamak profile: where a batched decode step (or a prefill chunk) spends its time. B sequences
 * are built at context C (one prompt prefilled, its KV blocks copied to the
 * others, not timed), then N decode steps run with stage timing attached to
 * the forward pass. Per stage: the median over steps of its work (the longest
 * busy time of any thread), the bytes it reads and the operations it does,
 * the rates as a share of the probe's bandwidth and int8/fp32 peak, its own
 * floor max(bytes / bandwidth, ops / peak) and its time over that floor. The
 * rest of a step (threads idle at barriers, the pool's start and end) is the
 * barrier_wait row; sampling the B rows of logits (on the backend's threads,
 * as the engine samples them; its cpu ms is the calling thread's) is timed
 * apart. With --prefill N each timed step is instead one sequence's chunk of
 * N prompt tokens at positions C.. (the same positions every step: the
 * chunk's KV is rewritten), which shows why prefill and decode differ: the
 * same weights serve N tokens, and attention grows with N times C. */
#include <errno.h>
#include <math.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>

#include "backend/backend.h"
#include "bench/kbench.h"
#include "bench/probe.h"
#include "bench/report.h"
#include "bench/stats.h"
#include "cli/cli.h"
#include "cli/opts.h"
#include "core/alloc.h"
#include "core/clock.h"
#include "core/cpu.h"
#include "core/error.h"
#include "core/names.h"
#include "engine/sampler.h"
#include "kernels/kvattn.h"
#include "kv/kv.h"
#include "model/fwd_prof.h"
#include "model/model.h"
#include "tokamak.h"

#define PF_WARMUP 2
/* Rows of the report: the forward's stages, then sampling. */
#define PF_SAMPLE FWD_ST_COUNT
#define PF_ROWS   (FWD_ST_COUNT + 1)

typedef struct pf_args {
    int batch, steps, prefill;
    int ctx_spread; /* decode: the sequences' contexts spread evenly over this many positions */
    double bw, peak_int8, peak_f32, peak_bf16;
    const char *json;
    bool stage_cpu;
    bool kernels; /* --kernels: the weight kernels alone (kbench.h) */
    int tokens[KB_MAX_COUNTS], n_tokens, rounds;
} pf_args;

/* --tokens: a comma-separated list of token counts. */
static bool parse_tokens(const char *v, void *dst) {
    pf_args *a = dst;
    return cli_parse_int_list(v, 1, KB_MAX_TOKENS, KB_MAX_COUNTS, a->tokens, &a->n_tokens);
}

static const cli_opt PF_ROWS_OPT[] = {
    {.name = "--batch",
     .arg = "B",
     .help = "sequences decoding together (default 8)",
     .kind = CLI_INT,
     .off = offsetof(pf_args, batch),
     .lo = 1,
     .hi = 1024},
    {.name = "--ctx-spread",
     .arg = "S",
     .help = "decode: sequence q of B holds --ctx - S/2 + q S/(B-1) tokens, contexts spread evenly\n"
             "over S as a served batch's differ (default 0: every sequence at --ctx)",
     .kind = CLI_INT,
     .off = offsetof(pf_args, ctx_spread),
     .lo = 0,
     .hi = 1 << 20},
    {.name = "--prefill",
     .arg = "N",
     .help = "time N-token prefill chunks of one sequence at context --ctx instead of decode steps",
     .kind = CLI_INT,
     .off = offsetof(pf_args, prefill),
     .lo = 1,
     .hi = 65536},
    {.name = "--steps",
     .arg = "N",
     .help = "timed decode steps (default 16; 2 more warm up first)",
     .kind = CLI_INT,
     .off = offsetof(pf_args, steps),
     .lo = 1,
     .hi = 100000},
    {.name = "--bw",
     .arg = "GBPS",
     .help = "read bandwidth for the floors (default: probed now)",
     .kind = CLI_DOUBLE,
     .off = offsetof(pf_args, bw),
     .lo = 0,
     .hi = 1e6,
     .flags = CLI_LO_OPEN},
    {.name = "--peak-int8",
     .arg = "GOPS",
     .help = "int8 peak for the floors (default: probed now)",
     .kind = CLI_DOUBLE,
     .off = offsetof(pf_args, peak_int8),
     .lo = 0,
     .hi = 1e9,
     .flags = CLI_LO_OPEN},
    {.name = "--peak-f32",
     .arg = "GFLOPS",
     .help = "fp32 peak for the floors (default: probed now)",
     .kind = CLI_DOUBLE,
     .off = offsetof(pf_args, peak_f32),
     .lo = 0,
     .hi = 1e9,
     .flags = CLI_LO_OPEN},
    {.name = "--peak-bf16",
     .arg = "GFLOPS",
     .help = "BF16 dot (vdpbf16ps) peak for the floors of BF16 matmuls that run it (default: probed now)",
     .kind = CLI_DOUBLE,
     .off = offsetof(pf_args, peak_bf16),
     .lo = 0,
     .hi = 1e9,
     .flags = CLI_LO_OPEN},
    {.name = "--json",
     .arg = "FILE",
     .help = "also write the report as JSON",
     .kind = CLI_STR,
     .off = offsetof(pf_args, json)},
    {.name = "--kernels",
     .help = "time the weight kernels alone instead of a step: the model's matrices of each kind\n"
             "streamed from memory and one held in cache, at each --tokens count; and the attention\n"
             "kernel over that many sequences' KV at --ctx (--kv-type, --kv-scale, --block-size)",
     .kind = CLI_FLAG,
     .off = offsetof(pf_args, kernels)},
    {.name = "--tokens",
     .arg = "LIST",
     .help = "--kernels: token counts, and sequences for the attention rows (default 1,2,4,8,16,32)",
     .kind = CLI_FN,
     .off = 0,
     .fn = parse_tokens,
     .want = "a comma-separated list of at most 16 counts in 1..256"},
    {.name = "--rounds",
     .arg = "N",
     .help = "--kernels: rounds over the counts (default 5; medians)",
     .kind = CLI_INT,
     .off = offsetof(pf_args, rounds),
     .lo = 1,
     .hi = 64},
    {.name = "--stage-cpu",
     .help = "also read each thread's CPU clock at every stage (cpu ms columns; a system call per\n"
             "stage, ~1 us on some VMs, which the step's times then include)",
     .kind = CLI_FLAG,
     .off = offsetof(pf_args, stage_cpu)},
    {0},
};

static const cli_cmd PF_CMD = {
    "profile",
    "usage: tokamak profile -m MODEL [--batch B | --prefill N] [--ctx C] [--kv-type T] [--steps N] [--json "
    "FILE]\n"
    "       tokamak profile -m MODEL --kernels [--tokens LIST] [--rounds N] [--ctx C] [--kv-type T] [--json "
    "FILE]",
    CLI_G_MODEL | CLI_G_THREADS | CLI_G_PLACE | CLI_G_KV | CLI_G_SAMPLING,
    PF_ROWS_OPT,
    "--ctx is the context each sequence holds when the timed steps start (default 512).\n"
    "--prefill N: each timed step is one sequence's N-token prompt chunk after --ctx tokens (a 2,048-token "
    "prompt's last chunk: --prefill 512 --ctx 1536).\n"
    "--bw, --peak-int8 and --peak-f32 replace the probes (a quiet machine's figures when this one is "
    "loaded).\n"
    "Times the fused plan. Floors use the bandwidth and peaks probed at the start of the run.\n"
    "--kernels shows where each weight kernel stops being bound by memory: its streamed rate against its "
    "rate over a cached matrix; the same for attention over the paged KV.",
    0,
    NULL,
};

/* Per step, per row: ns of work; plus the step's wall time and barriers. */
typedef struct pf_data {
    int n_steps;
    double *ns[PF_ROWS];     /* (n_steps) */
    double *step_ns;         /* forward + sampling */
    double *fwd_ns;          /* the forward step alone */
    double *cpu[PF_ROWS];    /* (n_steps) the largest CPU time of any thread in the stage (--stage-cpu) */
    double *uneven[PF_ROWS]; /* (n_steps) the longest busy time minus the threads' mean */
    double *offcpu;          /* (n_steps) share of the threads' time in the step off the CPU (preempted) */
    double *overlap_ns;      /* (n_steps) the stages' longest times beyond the forward step: stages
                              * between the same two barriers whose longest threads differ */
    double overlap_ms, overlap_mean_ms; /* its median and mean over the steps */
    double *mark_err;      /* (n_steps) share of the forward step thread 0 spent outside its marks: the lesser
                            * of that wall time and that CPU time (a thread taken off its core between marks
                            * is not code outside them) */
    double thread_sum_err; /* its median over the steps: work left out of the marks shows in every step,
                            * a step whose thread 0 spun while a preempted worker started does not */
    uint64_t barriers;
    fwd_stage_cost cost[PF_ROWS];
    uint64_t fwd_bytes; /* backend last_bytes of a timed step */
    double *row_shares; /* (threads) the row-split projections' shares after the last step */
} pf_data;

static int cmp_dbl(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static double median_of(const double *v, int n, double *tmp) {
    memcpy(tmp, v, (size_t)n * sizeof *v);
    qsort(tmp, (size_t)n, sizeof *tmp, cmp_dbl);
    return stats_percentile_sorted(tmp, (size_t)n, 50);
}

typedef struct pf_machine {
    int threads;
    probe_stats bw; /* GB/s */
    /* the probed (or given) peaks by tk_peak: fp32 and BF16 dot GFLOP/s,
     * int8 GOP/s; BF16 0 where no kernel runs vdpbf16ps */
    double peak[TK_PEAK_COUNT];
    bool given[TK_PEAK_COUNT];
    /* The bandwidth floors use: the probe's best, or a stage's own read rate
     * where one read faster (the probe's shortfall, named in the report). */
    double ceil_gbs;
    const char *over_stage; /* the stage that set ceil_gbs above the probe, or NULL */
    /* The same from the probe's median pass: what the machine gave most of
     * the time, which a machine whose passes spread (a shared VM's) may keep
     * to, where the floors' best pass is rare. Equal to ceil_gbs when the
     * bandwidth was given. */
    double med_gbs;
    /* The peaks the floors use, the same way: the probe's, or a stage's own
     * rate where one computed faster (its stage named), by tk_peak. */
    double ceil_peak[TK_PEAK_COUNT];
    const char *over_peak[TK_PEAK_COUNT];
    /* The read probe over the paged KV's runs (a kv head's blocks of one
     * sequence and part) in a shuffled order, as attention reads them: shown beside the floors,
     * which count the streaming rate (n 0: not probed). */
    probe_stats runs;
    size_t run_bytes;
    /* Decode: the attention kernel's rate over one cached layer of one
     * sequence at the run's KV options (kbench_attn_cached), attn_pos
     * positions a query; 0: not measured. */
    double attn_gbs;
    int attn_pos;
} pf_machine;

/* One stage's summary row. */
typedef struct pf_row {
    const char *name;
    double ms, mean_ms, cpu_ms, uneven_ms, mb, gbs, bw_pct, gop, gops, peak_pct, floor_ms, x_floor;
    tk_peak peak;
} pf_row;

/* A peak's rate unit: int8 operations or flops per second. */
static const char *peak_rate(tk_peak p) { return p == TK_PEAK_INT8 ? "GOP/s" : "GFLOP/s"; }

/* "peak int8 N GOP/s, peak fp32 N GFLOP/s[, peak bf16 dot N GFLOP/s]", each
 * "(given)" or "(probed now)". */
static void print_peaks(const pf_machine *mc) {
    static const tk_peak order[TK_PEAK_COUNT] = {TK_PEAK_INT8, TK_PEAK_F32, TK_PEAK_BF16};
    for (int k = 0; k < TK_PEAK_COUNT; k++) {
        const tk_peak i = order[k];
        if (i == TK_PEAK_BF16 && mc->peak[i] <= 0) continue;
        printf("%speak %s%s %.0f %s (%s)", k ? ", " : "", kern_peak_name(i), i == TK_PEAK_BF16 ? " dot" : "",
               mc->peak[i], peak_rate(i), mc->given[i] ? "given" : "probed now");
    }
}

/* The peak of the floors: the one given (> 0), else probe's on `threads`
 * (NULL: none, 0). */
static double peak_of(double given, double (*probe)(int), int threads, bool *was_given) {
    *was_given = given > 0;
    return given > 0 ? given : probe ? probe(threads) : 0;
}

/* A stage's floor in ms, max(bytes / bandwidth at gbs, ops / its peak); 0
 * under a microsecond, where no floor is worth a ratio. */
static double stage_floor_ms(const fwd_stage_cost *c, const pf_machine *mc, double gbs) {
    const double f = 1e3 * fwd_stage_floor_s(c, gbs, mc->ceil_peak);
    return f < 1e-3 ? 0 : f;
}

static pf_row row_of(const pf_data *d, const pf_machine *mc, int r, double *tmp) {
    pf_row o = {.name = r == PF_SAMPLE ? "sampling" : fwd_stage_name((fwd_stage)r)};
    const fwd_stage_cost *c = &d->cost[r];
    o.ms = median_of(d->ns[r], d->n_steps, tmp) / 1e6;
    o.mean_ms = stats_mean(d->ns[r], (size_t)d->n_steps) / 1e6;
    o.cpu_ms = median_of(d->cpu[r], d->n_steps, tmp) / 1e6;
    o.uneven_ms = median_of(d->uneven[r], d->n_steps, tmp) / 1e6;
    o.mb = (double)c->bytes / 1e6;
    o.gop = c->ops / 1e9;
    o.peak = c->peak;
    double s = o.ms / 1e3, peak = mc->ceil_peak[c->peak];
    o.gbs = s > 0 ? (double)c->bytes / 1e9 / s : 0;
    o.gops = s > 0 ? o.gop / s : 0;
    o.bw_pct = mc->ceil_gbs > 0 ? 100.0 * o.gbs / mc->ceil_gbs : 0;
    o.peak_pct = peak > 0 ? 100.0 * o.gops / peak : 0;
    o.floor_ms = stage_floor_ms(c, mc, mc->ceil_gbs);
    o.x_floor = o.floor_ms > 0 ? o.ms / o.floor_ms : 0;
    return o;
}

/* Stages reading at least 1 MB per step (weights, KV) whose median rate beat
 * the probe raise the bandwidth the floors use: a floor the step beat is no
 * floor. A stage's time can only be stretched by interference, never
 * shortened, so its rate is a lower bound of what the machine gives. The
 * same for the peaks, from stages of at least 0.1 GOP (int8 or fp32, as
 * their floors count them). */
static void set_ceiling(const pf_data *d, pf_machine *mc, double *tmp) {
    mc->ceil_gbs = mc->bw.best;
    mc->med_gbs = mc->bw.median;
    mc->over_stage = NULL;
    for (int i = 0; i < TK_PEAK_COUNT; i++) {
        mc->ceil_peak[i] = mc->peak[i];
        mc->over_peak[i] = NULL;
    }
    for (int r = 0; r < FWD_ST_COUNT; r++) {
        const fwd_stage_cost *c = &d->cost[r];
        double s = median_of(d->ns[r], d->n_steps, tmp) / 1e9;
        if (s <= 0) continue;
        if (c->ops >= 1e8 && c->ops / 1e9 / s > mc->ceil_peak[c->peak]) {
            mc->ceil_peak[c->peak] = c->ops / 1e9 / s;
            mc->over_peak[c->peak] = fwd_stage_name((fwd_stage)r);
        }
        if (c->bytes < 1000000) continue;
        double gbs = (double)c->bytes / 1e9 / s;
        if (gbs > mc->ceil_gbs) {
            mc->ceil_gbs = gbs;
            mc->over_stage = fwd_stage_name((fwd_stage)r);
        }
        if (gbs > mc->med_gbs) mc->med_gbs = gbs;
    }
}

/* The step's floor (the stages' floors summed) with the bandwidth at gbs. */
static double floor_at(const pf_data *d, const pf_machine *mc, double gbs) {
    double sum = 0;
    for (int r = 0; r < PF_ROWS; r++) sum += stage_floor_ms(&d->cost[r], mc, gbs);
    return sum;
}

typedef struct pf_run {
    const char *model;
    const char *weight_dtype;
    const char *kv_type;
    int batch, ctx, steps, threads;
    int ctx_spread; /* --ctx-spread */
    int prefill;    /* tokens of the timed chunk; 0: decode steps */
    bool even_rows; /* --even-rows: the row-split projections in even shares */
    bool stage_cpu; /* --stage-cpu: the stages' CPU times were read */
} pf_run;

/* Sequence q of batch's context offset from --ctx with --ctx-spread S:
 * -S/2 for the first, S - S/2 for the last, even steps between. */
static int spread_off(int spread, int q, int batch) {
    return batch > 1 ? -spread / 2 + (int)((int64_t)q * spread / (batch - 1)) : 0;
}

/* Tokens a timed step processes. */
static int run_tokens(const pf_run *ru) { return ru->prefill > 0 ? ru->prefill : ru->batch; }

/* The attention stage's KV bytes at the kernel's rate over cached KV, in
 * ms: its arithmetic alone; 0 where that was not measured. */
static double attn_cached_ms(const pf_data *d, const pf_machine *mc) {
    const double b = (double)d->cost[FWD_ST_ATTN].bytes;
    return mc->attn_gbs > 0 && b > 0 ? b / (mc->attn_gbs * 1e9) * 1e3 : 0;
}

/* The attention stage's KV bytes at the paged-read probe's best pass, in ms;
 * 0 where that probe did not run or the stage reads nothing. */
static double attn_at_runs_ms(const pf_data *d, const pf_machine *mc) {
    const double b = (double)d->cost[FWD_ST_ATTN].bytes;
    return mc->runs.n > 0 && mc->runs.best > 0 && b > 0 ? b / (mc->runs.best * 1e9) * 1e3 : 0;
}

static void print_markdown(const pf_run *ru, const pf_machine *mc, const pf_data *d, const pf_row *rows,
                           double step_ms, double fwd_ms, double off) {
    printf("# tokamak profile\n\n");
    if (ru->prefill > 0)
        printf("- model %s (%s weights), %d threads, a %d-token prefill chunk after %d tokens of context, KV "
               "%s, "
               "%d timed chunks (medians)\n",
               ru->model, ru->weight_dtype, ru->threads, ru->prefill, ru->ctx, ru->kv_type, ru->steps);
    else if (ru->ctx_spread > 0)
        printf("- model %s (%s weights), %d threads, batch %d at contexts %d-%d (spread evenly), KV %s, %d "
               "timed decode steps (medians)\n",
               ru->model, ru->weight_dtype, ru->threads, ru->batch,
               ru->ctx + spread_off(ru->ctx_spread, 0, ru->batch),
               ru->ctx + spread_off(ru->ctx_spread, ru->batch - 1, ru->batch), ru->kv_type, ru->steps);
    else
        printf("- model %s (%s weights), %d threads, batch %d at context %d, KV %s, %d timed decode steps "
               "(medians)\n",
               ru->model, ru->weight_dtype, ru->threads, ru->batch, ru->ctx, ru->kv_type, ru->steps);
    if (mc->bw.n > 0)
        printf("- probe (%d thread%s): read %.1f GB/s (best of %d passes; min %.1f, median %.1f), ",
               mc->threads, mc->threads == 1 ? "" : "s", mc->bw.best, mc->bw.n, mc->bw.min, mc->bw.median);
    else
        printf("- read bandwidth %.1f GB/s (given), ", mc->bw.best);
    print_peaks(mc);
    printf("\n");
    report_rt_throttle_now(stdout);
    printf("\n");
    if (mc->runs.n > 0)
        printf(
            "- paged KV reads (%zu KiB runs, a kv head's blocks of one sequence and part side by side, in a "
            "shuffled order, the next asked for in step, as attention reads them): "
            "best %.1f GB/s (median %.1f), %.0f%% of the streaming probe's best\n\n",
            mc->run_bytes >> 10, mc->runs.best, mc->runs.median,
            mc->bw.best > 0 ? 100.0 * mc->runs.best / mc->bw.best : 0);
    if (mc->over_stage)
        printf(
            "- **probe shortfall**: %s read %.1f GB/s > probe %.1f GB/s; bandwidth floors and %% of bw use "
            "%.1f GB/s\n\n",
            mc->over_stage, mc->ceil_gbs, mc->bw.best, mc->ceil_gbs);
    for (int i = TK_PEAK_COUNT - 1; i >= 0; i--)
        if (mc->over_peak[i])
            printf(
                "- **probe shortfall**: %s ran %.0f %s %s > probe peak %.0f; its floors and %% of peak use "
                "%.0f\n\n",
                mc->over_peak[i], mc->ceil_peak[i], kern_peak_name((tk_peak)i), peak_rate((tk_peak)i),
                mc->peak[i], mc->ceil_peak[i]);
    printf("| stage | ms | cpu ms | %% of step | MB read | GB/s | %% of bw | GOP | GOP/s | %% of peak | "
           "floor ms | "
           "x floor | cpu x floor | uneven ms |\n");
    printf("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n");
    double floor_sum = 0, cpu_sum = 0;
    for (int r = 0; r < PF_ROWS; r++) {
        const pf_row *o = &rows[r];
        floor_sum += o->floor_ms;
        cpu_sum += o->cpu_ms;
        printf("| %s | %.3f | ", o->name, o->ms);
        if (ru->stage_cpu)
            printf("%.3f | ", o->cpu_ms);
        else
            printf("- | ");
        printf("%.1f | ", step_ms > 0 ? 100.0 * o->ms / step_ms : 0);
        if (o->mb > 0)
            printf("%.1f | %.1f | %.0f | ", o->mb, o->gbs, o->bw_pct);
        else
            printf("- | - | - | ");
        if (o->gop > 0)
            printf("%.2f | %.0f | %.0f (%s) | ", o->gop, o->gops, o->peak_pct, kern_peak_name(o->peak));
        else
            printf("- | - | - | ");
        if (o->floor_ms > 0 && ru->stage_cpu)
            printf("%.3f | %.1f | %.1f | ", o->floor_ms, o->x_floor, o->cpu_ms / o->floor_ms);
        else if (o->floor_ms > 0)
            printf("%.3f | %.1f | - | ", o->floor_ms, o->x_floor);
        else
            printf("- | - | - | ");
        if (r < FWD_ST_COUNT && r != FWD_ST_WAIT && ru->threads > 1)
            printf("%.3f |\n", o->uneven_ms);
        else
            printf("- |\n");
    }
    char cpu_col[32] = "-", cpu_x[32] = "-";
    if (ru->stage_cpu) {
        snprintf(cpu_col, sizeof cpu_col, "%.3f", cpu_sum);
        snprintf(cpu_x, sizeof cpu_x, "%.1f", floor_sum > 0 ? cpu_sum / floor_sum : 0);
    }
    printf("| **step** | **%.3f** | %s | 100 | %.1f | %.1f | %.0f | | | | **%.3f** | **%.1f** | %s | |\n\n",
           step_ms, cpu_col, (double)d->fwd_bytes / 1e6,
           step_ms > 0 ? (double)d->fwd_bytes / 1e6 / step_ms : 0,
           step_ms > 0 && mc->ceil_gbs > 0 ? 100.0 * (double)d->fwd_bytes / 1e6 / step_ms / mc->ceil_gbs : 0,
           floor_sum, floor_sum > 0 ? step_ms / floor_sum : 0, cpu_x);
    if (mc->med_gbs < mc->ceil_gbs) {
        const double fm = floor_at(d, mc, mc->med_gbs);
        printf("- at the probe's median pass (%.1f GB/s) the floors sum to %.3f ms: the step is %.1fx that\n",
               mc->med_gbs, fm, fm > 0 ? step_ms / fm : 0);
    }
    const double runs_ms = attn_at_runs_ms(d, mc);
    if (runs_ms > 0)
        printf("- attention's %.1f MB at the paged-read rate (%.1f GB/s) take %.3f ms: the stage took %.1fx "
               "that (its floor counts the streaming rate)\n",
               rows[FWD_ST_ATTN].mb, mc->runs.best, runs_ms, rows[FWD_ST_ATTN].ms / runs_ms);
    const double hot_ms = attn_cached_ms(d, mc);
    if (hot_ms > 0)
        printf("- attention's kernel over cached KV (one layer of one sequence, %d positions, held in cache: "
               "its "
               "arithmetic alone) reads %.1f GB/s: the stage's %.1f MB in %.3f ms; the stage took %.1fx "
               "that%s\n",
               mc->attn_pos, mc->attn_gbs, rows[FWD_ST_ATTN].mb, hot_ms, rows[FWD_ST_ATTN].ms / hot_ms,
               runs_ms > 0
                   ? " (the two times bound the stage: max of them where reads and arithmetic overlap, "
                     "their sum where they do not)"
                   : "");
    printf("- forward %.3f ms + sampling %.3f ms; %.1f %s tok/s\n", fwd_ms, rows[PF_SAMPLE].ms,
           step_ms > 0 ? 1e3 * run_tokens(ru) / step_ms : 0, ru->prefill > 0 ? "prefill" : "output");
    printf("- barriers per step: %.1f\n", d->n_steps ? (double)d->barriers / d->n_steps : 0);
    if (ru->threads > 1 && d->row_shares) {
        printf("- the output, gate/up, down and vocabulary rows were split %s:",
               ru->even_rows ? "evenly (--even-rows)"
                             : "by each thread's measured speed; shares after the last step");
        for (int t = 0; t < ru->threads; t++) printf("%s %.1f%%", t ? " /" : "", 100.0 * d->row_shares[t]);
        printf("\n");
    }
    printf("- the threads were off the CPU %.1f%% of their time in the step (median)%s\n", 100.0 * off,
           off <= 0.02 ? ""
           : ru->stage_cpu
               ? ": the machine was loaded; a stage's cpu ms is its work without the waits for a core"
               : ": the machine was loaded; --stage-cpu gives each stage's work without the waits "
                 "for a core");
    printf("- a stage's ms is the longest busy time of any thread; barrier_wait is the rest of the forward "
           "step (threads idle at barriers, the pool's start and end)\n");
    if (d->overlap_mean_ms > 0)
        printf("- stages between the same two barriers overlapped by %.3f ms (median; mean %.3f): where "
               "their longest threads differ, the rows add up to more than the forward step by that\n",
               d->overlap_ms, d->overlap_mean_ms);
    if (ru->threads > 1)
        printf("- uneven ms: a stage's longest busy time minus the threads' mean, what its split leaves the "
               "others waiting (stages between the same two barriers may offset each other)\n");
}

static cJSON *json_of(const pf_run *ru, const pf_machine *mc, const pf_data *d, const pf_row *rows,
                      double step_ms, double fwd_ms, double off) {
    cJSON *root = cJSON_CreateObject();
    if (!root) return NULL;
    cJSON_AddStringToObject(root, "model", ru->model);
    cJSON_AddStringToObject(root, "weight_dtype", ru->weight_dtype);
    cJSON_AddStringToObject(root, "kv_type", ru->kv_type);
    cJSON_AddNumberToObject(root, "threads", ru->threads);
    cJSON_AddNumberToObject(root, "batch", ru->batch);
    cJSON_AddNumberToObject(root, "ctx", ru->ctx);
    cJSON_AddNumberToObject(root, "ctx_spread", ru->ctx_spread);
    cJSON_AddNumberToObject(root, "prefill", ru->prefill);
    cJSON_AddNumberToObject(root, "steps", ru->steps);
    cJSON *pr = cJSON_AddObjectToObject(root, "probe");
    cJSON_AddNumberToObject(pr, "threads", mc->threads);
    cJSON_AddNumberToObject(pr, "read_gbs", mc->bw.best);
    cJSON_AddNumberToObject(pr, "floor_gbs", mc->ceil_gbs);
    cJSON_AddNumberToObject(pr, "floor_gbs_median", mc->med_gbs);
    if (mc->over_stage) cJSON_AddStringToObject(pr, "shortfall_stage", mc->over_stage);
    cJSON_AddNumberToObject(pr, "read_gbs_min", mc->bw.min);
    cJSON_AddNumberToObject(pr, "read_gbs_median", mc->bw.median);
    cJSON_AddNumberToObject(pr, "read_passes", mc->bw.n);
    if (mc->runs.n > 0) {
        cJSON_AddNumberToObject(pr, "kv_run_bytes", (double)mc->run_bytes);
        cJSON_AddNumberToObject(pr, "kv_runs_gbs", mc->runs.best);
        cJSON_AddNumberToObject(pr, "kv_runs_gbs_median", mc->runs.median);
        cJSON_AddNumberToObject(pr, "kv_runs_gbs_min", mc->runs.min);
    }
    if (mc->attn_gbs > 0) {
        cJSON_AddNumberToObject(pr, "attn_cached_gbs", mc->attn_gbs);
        cJSON_AddNumberToObject(pr, "attn_cached_positions", mc->attn_pos);
    }
    cJSON_AddNumberToObject(pr, "peak_gops_int8", mc->peak[TK_PEAK_INT8]);
    cJSON_AddNumberToObject(pr, "peak_gflops_f32", mc->peak[TK_PEAK_F32]);
    cJSON_AddNumberToObject(pr, "peak_gflops_bf16", mc->peak[TK_PEAK_BF16]);
    cJSON_AddNumberToObject(pr, "floor_gops_int8", mc->ceil_peak[TK_PEAK_INT8]);
    cJSON_AddNumberToObject(pr, "floor_gflops_f32", mc->ceil_peak[TK_PEAK_F32]);
    cJSON_AddNumberToObject(pr, "floor_gflops_bf16", mc->ceil_peak[TK_PEAK_BF16]);
    static const char *const short_key[TK_PEAK_COUNT] = {"f32_shortfall_stage", "int8_shortfall_stage",
                                                         "bf16_shortfall_stage"};
    for (int i = 0; i < TK_PEAK_COUNT; i++)
        if (mc->over_peak[i]) cJSON_AddStringToObject(pr, short_key[i], mc->over_peak[i]);
    cJSON *st = cJSON_AddArrayToObject(root, "stages");
    double floor_sum = 0, stage_sum = 0;
    for (int r = 0; r < PF_ROWS; r++) {
        const pf_row *o = &rows[r];
        cJSON *j = cJSON_CreateObject();
        cJSON_AddStringToObject(j, "stage", o->name);
        cJSON_AddNumberToObject(j, "ms", o->ms);
        cJSON_AddNumberToObject(j, "mean_ms", o->mean_ms);
        if (ru->stage_cpu) cJSON_AddNumberToObject(j, "cpu_ms", o->cpu_ms);
        cJSON_AddNumberToObject(j, "uneven_ms", o->uneven_ms);
        cJSON_AddNumberToObject(j, "bytes", (double)d->cost[r].bytes);
        cJSON_AddNumberToObject(j, "ops", d->cost[r].ops);
        cJSON_AddStringToObject(j, "peak", kern_peak_name(o->peak));
        cJSON_AddNumberToObject(j, "gbs", o->gbs);
        cJSON_AddNumberToObject(j, "bw_pct", o->bw_pct);
        cJSON_AddNumberToObject(j, "gops", o->gops);
        cJSON_AddNumberToObject(j, "peak_pct", o->peak_pct);
        cJSON_AddNumberToObject(j, "floor_ms", o->floor_ms);
        cJSON_AddNumberToObject(j, "x_floor", o->x_floor);
        const double paged_ms = r == FWD_ST_ATTN ? attn_at_runs_ms(d, mc) : 0;
        if (paged_ms > 0) cJSON_AddNumberToObject(j, "paged_read_ms", paged_ms);
        const double hot_ms = r == FWD_ST_ATTN ? attn_cached_ms(d, mc) : 0;
        if (hot_ms > 0) cJSON_AddNumberToObject(j, "cached_kernel_ms", hot_ms);
        cJSON_AddItemToArray(st, j);
        floor_sum += o->floor_ms;
        stage_sum += o->mean_ms;
    }
    cJSON *sp = cJSON_AddObjectToObject(root, "step");
    cJSON_AddNumberToObject(sp, "ms", step_ms);
    cJSON_AddNumberToObject(sp, "mean_ms", stats_mean(d->step_ns, (size_t)d->n_steps) / 1e6);
    cJSON_AddNumberToObject(sp, "forward_ms", fwd_ms);
    cJSON_AddNumberToObject(sp, "stages_mean_sum_ms", stage_sum);
    cJSON_AddNumberToObject(sp, "overlap_ms", d->overlap_ms);
    cJSON_AddNumberToObject(sp, "overlap_mean_ms", d->overlap_mean_ms);
    cJSON_AddNumberToObject(sp, "thread0_mark_error", d->thread_sum_err);
    cJSON_AddNumberToObject(sp, "off_cpu", off);
    cJSON_AddNumberToObject(sp, "bytes", (double)d->fwd_bytes);
    cJSON_AddNumberToObject(sp, "floor_ms", floor_sum);
    cJSON_AddNumberToObject(sp, "x_floor", floor_sum > 0 ? step_ms / floor_sum : 0);
    const double fm = floor_at(d, mc, mc->med_gbs);
    cJSON_AddNumberToObject(sp, "floor_ms_median_read", fm);
    cJSON_AddNumberToObject(sp, "x_floor_median_read", fm > 0 ? step_ms / fm : 0);
    cJSON_AddNumberToObject(sp, "barriers", d->n_steps ? (double)d->barriers / d->n_steps : 0);
    if (d->row_shares) {
        cJSON *rs = cJSON_AddArrayToObject(sp, "row_shares");
        for (int t = 0; rs && t < ru->threads; t++)
            cJSON_AddItemToArray(rs, cJSON_CreateNumber(d->row_shares[t]));
    }
    cJSON_AddNumberToObject(sp, ru->prefill > 0 ? "prefill_tok_s" : "output_tok_s",
                            step_ms > 0 ? 1e3 * run_tokens(ru) / step_ms : 0);
    return root;
}

static tk_status write_json(const char *path, cJSON *root) {
    char *text = root ? cJSON_Print(root) : NULL;
    if (!text) return tk_fail(TK_ERR_NOMEM, "profile: cannot build the JSON report");
    FILE *f = fopen(path, "w");
    if (!f) {
        cJSON_free(text);
        return tk_fail(TK_ERR_IO, "profile: cannot write %s: %s", path, strerror(errno));
    }
    size_t n = strlen(text);
    bool ok = fwrite(text, 1, n, f) == n;
    ok &= fclose(f) == 0;
    cJSON_free(text);
    return ok ? TK_OK : tk_fail(TK_ERR_IO, "profile: writing %s failed", path);
}

/* Everything the run holds, freed by pf_free. */
typedef struct pf_state {
    backend be;
    int32_t **bt; /* (batch) block tables */
    int32_t *tok, *n, *pos0, *n_logits;
    int32_t *chunk; /* (prefill) the timed chunk's tokens; NULL for decode */
    int spread;     /* --ctx-spread */
    float *logits;  /* (batch, n_vocab) */
    float *prompt_logits;
    tk_sampler **smp; /* (batch) */
    fwd_prof prof;
    pf_data d;
    double *tmp;
} pf_state;

static void pf_free(pf_state *s, int batch) {
    if (s->bt)
        for (int i = 0; i < batch; i++) tk_free(s->bt[i]);
    if (s->smp)
        for (int i = 0; i < batch; i++) sampler_free(s->smp[i]);
    tk_free(s->bt);
    tk_free(s->smp);
    tk_free(s->tok);
    tk_free(s->n);
    tk_free(s->pos0);
    tk_free(s->n_logits);
    tk_free_aligned(s->logits);
    tk_free(s->prompt_logits);
    tk_free_aligned(s->prof.rows);
    for (int r = 0; r < PF_ROWS; r++) {
        tk_free(s->d.ns[r]);
        tk_free(s->d.cpu[r]);
        tk_free(s->d.uneven[r]);
    }
    tk_free(s->d.offcpu);
    tk_free(s->d.overlap_ns);
    tk_free(s->d.mark_err);
    tk_free(s->d.step_ns);
    tk_free(s->d.fwd_ns);
    tk_free(s->d.row_shares);
    tk_free(s->tmp);
    tk_free(s->chunk);
    backend_free(&s->be); /* blocks go with the pool */
}

/* The prompt: sequence 0 prefilled in chunks of the step budget, then its
 * blocks copied to every other sequence (same KV, separate memory). */
static void random_tokens(uint64_t *x, int32_t *t, int n, int n_vocab) {
    for (int i = 0; i < n; i++) {
        *x ^= *x << 13, *x ^= *x >> 7, *x ^= *x << 17;
        t[i] = (int32_t)(*x % (uint64_t)n_vocab);
    }
}

static tk_status build_context(pf_state *s, int batch, int ctx, int nb_seq, int n_vocab) {
    const backend *be = &s->be;
    uint64_t x = 0x9E3779B97F4A7C15ull;
    int32_t *chunk = tk_calloc((size_t)be->max_tokens, sizeof *chunk);
    if (!chunk) return tk_fail(TK_ERR_NOMEM, "profile: out of memory");
    tk_status st = TK_OK;
    for (int p = 0; p < ctx && st == TK_OK;) {
        int n = ctx - p < be->max_tokens ? ctx - p : be->max_tokens;
        random_tokens(&x, chunk, n, n_vocab);
        int32_t nl = p + n == ctx;
        const int32_t *bt0 = s->bt[0];
        int32_t pos = p;
        tk_batch b = {
            .n_seq = 1, .n_tok = n, .tokens = chunk, .n = &n, .pos0 = &pos, .bt = &bt0, .n_logits = &nl};
        st = be->step(be->ctx, &b, nl ? s->prompt_logits : NULL);
        p += n;
    }
    if (st == TK_OK && s->chunk) random_tokens(&x, s->chunk, be->max_tokens, n_vocab);
    tk_free(chunk);
    if (st != TK_OK) return st;
    for (int q = 1; q < batch; q++)
        for (int j = 0; j < nb_seq; j++) be->block_copy(be->ctx, s->bt[q][j], s->bt[0][j], be->block_size);
    return TK_OK;
}

static tk_status pf_setup(pf_state *s, tk_model *m, const cli_opts *o, int batch, int ctx, int steps,
                          int prefill, int *nb_seq) {
    const tk_engine_opts *e = &o->engine;
    /* every sequence's context is a prefix of the longest one's */
    const int built = ctx + spread_off(s->spread, batch - 1, batch);
    int64_t total = (int64_t)built + (prefill > 0 ? prefill : PF_WARMUP + steps);
    int bs = e->block_size;
    const int64_t nbs64 = (total + bs - 1) / bs;
    if (nbs64 * batch > (1 << 30)) return tk_fail(TK_ERR_RANGE, "profile: too many KV blocks");
    const int nbs = (int)nbs64;
    *nb_seq = nbs;
    int max_tok = batch > 512 ? batch : 512;
    if (prefill > max_tok) max_tok = prefill;
    if (prefill > 0 && !(s->chunk = tk_calloc((size_t)max_tok, sizeof *s->chunk)))
        return tk_fail(TK_ERR_NOMEM, "profile: out of memory");
    backend_cpu_opts bo = {.n_threads = e->n_threads,
                           .pin_threads = e->pin_threads,
                           .cpus = e->cpus,
                           .numa = e->numa,
                           .block_size = bs,
                           .kv_type = e->kv_type,
                           .kv_scale = e->kv_scale,
                           .n_blocks = nbs * batch,
                           .max_tokens = max_tok,
                           .max_seqs = batch,
                           .max_ctx = nbs * bs,
                           .even_rows = e->even_rows};
    tk_status st = backend_cpu_create(m, &bo, &s->be);
    if (st != TK_OK) return st;
    int V = s->be.n_vocab, nth = s->be.n_threads;
    s->bt = tk_calloc((size_t)batch, sizeof *s->bt);
    s->smp = tk_calloc((size_t)batch, sizeof *s->smp);
    s->tok = tk_calloc((size_t)batch, sizeof *s->tok);
    s->n = tk_calloc((size_t)batch, sizeof *s->n);
    s->pos0 = tk_calloc((size_t)batch, sizeof *s->pos0);
    s->n_logits = tk_calloc((size_t)batch, sizeof *s->n_logits);
    s->logits = tk_alloc_aligned((size_t)batch * (size_t)V * sizeof(float), 64);
    s->prompt_logits = tk_calloc((size_t)V, sizeof(float));
    s->prof.rows = tk_alloc_aligned((size_t)nth * sizeof(fwd_prof_thread), 64);
    s->prof.n_threads = nth;
    s->d.n_steps = steps;
    for (int r = 0; r < PF_ROWS; r++) {
        s->d.ns[r] = tk_calloc((size_t)steps, sizeof(double));
        s->d.cpu[r] = tk_calloc((size_t)steps, sizeof(double));
        s->d.uneven[r] = tk_calloc((size_t)steps, sizeof(double));
    }
    s->d.offcpu = tk_calloc((size_t)steps, sizeof(double));
    s->d.overlap_ns = tk_calloc((size_t)steps, sizeof(double));
    s->d.mark_err = tk_calloc((size_t)steps, sizeof(double));
    s->d.step_ns = tk_calloc((size_t)steps, sizeof(double));
    s->d.fwd_ns = tk_calloc((size_t)steps, sizeof(double));
    s->tmp = tk_calloc((size_t)steps, sizeof(double));
    bool ok = s->bt && s->smp && s->tok && s->n && s->pos0 && s->n_logits && s->logits && s->prompt_logits &&
              s->prof.rows && s->d.step_ns && s->d.fwd_ns && s->tmp;
    for (int r = 0; r < PF_ROWS; r++) ok &= s->d.ns[r] && s->d.cpu[r] && s->d.uneven[r];
    ok &= s->d.offcpu != NULL && s->d.overlap_ns != NULL && s->d.mark_err != NULL;
    for (int q = 0; ok && q < batch; q++) ok = (s->bt[q] = tk_calloc((size_t)nbs, sizeof(int32_t))) != NULL;
    if (!ok) return tk_fail(TK_ERR_NOMEM, "profile: out of memory for a batch of %d", batch);
    memset(s->prof.rows, 0, (size_t)nth * sizeof(fwd_prof_thread));
    for (int q = 0; q < batch; q++)
        for (int j = 0; j < nbs; j++)
            if ((s->bt[q][j] = s->be.block_alloc(s->be.ctx)) < 0)
                return tk_fail(TK_ERR_NOMEM, "profile: KV pool out of blocks");
    for (int q = 0; q < batch; q++) {
        tk_sampling sp = o->sampling;
        sp.seed += (uint64_t)q;
        if ((st = sampler_init(&sp, V, &s->smp[q])) != TK_OK) return st;
    }
    return build_context(s, batch, built, nbs, V);
}

/* Sample sequence q's next token (on the backend's threads, as the engine does). */
static void pf_sample(void *arg, int q) {
    pf_state *s = arg;
    tk_token_event ev;
    int32_t tok = sampler_sample(s->smp[q], s->logits + (size_t)q * s->be.n_vocab, NULL, 0, &ev);
    s->tok[q] = tok >= 0 ? tok : 0;
}

/* One decode step of every sequence at position pos, or with prefill > 0
 * sequence 0's chunk of that many tokens from pos; timed when i >= 0. */
static tk_status pf_step(pf_state *s, const tk_model *m, int batch, int prefill, int pos, int i) {
    const backend *be = &s->be;
    int V = be->n_vocab, nth = be->n_threads;
    for (int q = 0; q < batch; q++) {
        s->n[q] = prefill > 0 ? prefill : 1;
        s->pos0[q] = pos + spread_off(s->spread, q, batch);
        s->n_logits[q] = 1;
    }
    const int n_tok = prefill > 0 ? prefill : batch;
    tk_batch b = {.n_seq = batch,
                  .n_tok = n_tok,
                  .tokens = prefill > 0 ? s->chunk : s->tok,
                  .n = s->n,
                  .pos0 = s->pos0,
                  .bt = (const int32_t *const *)s->bt,
                  .n_logits = s->n_logits};
    for (int t = 0; t < nth; t++) {
        fwd_prof_thread *row = &s->prof.rows[t];
        memset(row->ns, 0, sizeof row->ns);
        memset(row->cpu_ns, 0, sizeof row->cpu_ns);
        row->part_ns = row->part_cpu_ns = 0;
    }
    /* the thread's CPU clock is a system call (fwd_prof.h): read outside the
     * timed spans, and around sampling only for the stages' CPU times */
    const bool sc = s->prof.stage_cpu;
    uint64_t c0 = fwd_prof_cpu_ns(), t0 = tk_now_ns();
    tk_status st = be->step(be->ctx, &b, s->logits);
    uint64_t t1 = tk_now_ns(), c1 = fwd_prof_cpu_ns();
    if (st != TK_OK) return st;
    backend_run_each(be, pf_sample, s, batch);
    uint64_t c2 = sc ? fwd_prof_cpu_ns() : 0, t2 = tk_now_ns();
    if (i < 0) return TK_OK;
    pf_data *d = &s->d;
    double work = 0, th0 = 0, wall_all = 0, cpu_all = 0;
    for (int t = 0; t < nth; t++) {
        wall_all += (double)s->prof.rows[t].part_ns;
        cpu_all += (double)s->prof.rows[t].part_cpu_ns;
    }
    for (int r = 0; r < FWD_ST_COUNT; r++) {
        uint64_t mx = 0, mc = 0;
        double sum = 0;
        for (int t = 0; t < nth; t++) {
            const fwd_prof_thread *row = &s->prof.rows[t];
            sum += (double)row->ns[r];
            if (row->ns[r] > mx) mx = row->ns[r];
            if (row->cpu_ns[r] > mc) mc = row->cpu_ns[r];
        }
        th0 += (double)s->prof.rows[0].ns[r];
        d->cpu[r][i] = (double)mc;
        d->uneven[r][i] = (double)mx - sum / nth;
        if (r != FWD_ST_WAIT) {
            d->ns[r][i] = (double)mx;
            work += (double)mx;
        }
    }
    d->offcpu[i] = wall_all > 0 && cpu_all < wall_all ? 1.0 - cpu_all / wall_all : 0;
    d->cpu[PF_SAMPLE][i] = (double)(c2 - c1);
    double fwd = (double)(t1 - t0);
    d->ns[FWD_ST_WAIT][i] = fwd > work ? fwd - work : 0;
    d->overlap_ns[i] = work > fwd ? work - fwd : 0;
    d->ns[PF_SAMPLE][i] = (double)(t2 - t1);
    d->fwd_ns[i] = fwd;
    d->step_ns[i] = (double)(t2 - t0);
    /* the caller is pool thread 0: its time outside its marks, on the clock
     * and on its CPU (its part of the step spans its marks) */
    double out_wall = fwd - th0, out_cpu = (double)(c1 - c0) - (double)s->prof.rows[0].part_cpu_ns;
    d->mark_err[i] = fmax(0.0, fmin(out_wall, out_cpu)) / fwd;
    if (i == 0) {
        d->fwd_bytes = be->last_bytes ? be->last_bytes(be->ctx) : 0;
        /* each token attends to the context before it and to itself */
        fwd_step_shape sh = {0};
        for (int q = 0; q < batch; q++)
            fwd_step_shape_add(&sh, s->n[q], s->pos0[q], 1, backend_kv_rescales(be) ? be->block_size : 0);
        fwd_prof_costs(m, be->kv_bytes_per_token, be->kv_type == TK_KV_INT8, &sh, d->cost);
        d->cost[PF_SAMPLE] = (fwd_stage_cost){.bytes = (uint64_t)batch * (uint64_t)V * sizeof(float)};
    }
    return TK_OK;
}

/* ---- --kernels ------------------------------------------------------------------------ */

static const char *layout_name(tk_layout l) {
    static const char *const names[TK_LAYOUT_COUNT] = {"rows", "x16", "x8", "p16", "x4", "p16r", "x16s"};
    return (int)l >= 0 && l < TK_LAYOUT_COUNT ? names[l] : "?";
}

static void print_kernels(const char *model, const pf_machine *mc, const pf_args *pa, const kb_row *r,
                          int n) {
    printf("# tokamak profile --kernels\n\n");
    printf("- model %s, %d threads, %d rounds over the token counts (medians)\n", model, mc->threads,
           pa->rounds);
    printf("- read bandwidth %.1f GB/s (%s), ", mc->bw.best,
           mc->bw.n > 0 ? "probed now, best pass" : "given");
    print_peaks(mc);
    printf("\n");
    report_rt_throttle_now(stdout);
    printf("\n");
    printf(
        "| kernel | tokens | MB streamed | streamed GB/s | x first count | GOP/s | %% of bw | %% of peak | "
        "cached GB/s | cached GOP/s | streamed / cached |\n");
    printf("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n");
    for (int i = 0; i < n; i++) {
        const double peak = mc->peak[r[i].peak];
        printf("| %s %s | %d | %.1f | %.1f | %.2f | %.0f | %.0f | %.0f | %.1f | %.0f | %.2f |\n",
               dtype_name(r[i].type), layout_name(r[i].layout), r[i].n_tok, (double)r[i].bytes / 1e6,
               r[i].gbs, r[i].x_first, r[i].gops, mc->bw.best > 0 ? 100.0 * r[i].gbs / mc->bw.best : 0.0,
               peak > 0 ? 100.0 * r[i].gops / peak : 0.0, r[i].hot_gbs, r[i].hot_gops,
               r[i].hot_gbs > 0 ? r[i].gbs / r[i].hot_gbs : 0.0);
    }
    printf("\n- streamed: every matrix of the kind once, its rows split between the threads, a barrier after "
           "each, as a decode step reads them; cached: the kind's smallest matrix again and again (each "
           "thread's share of it stays in cache). Both on seeded activations. A kind whose MB streamed fits "
           "the caches (a small model) is read from them, not from memory\n");
    printf("- x first count: the streamed rate over the first count's, round by round; streamed / cached "
           "near 1: the kernel's arithmetic binds at that count, well below 1: memory does\n");
    printf("- %% of peak against the int8 peak where the kernel's dot products run on quantized activations, "
           "the BF16 dot peak where they run as vdpbf16ps, else fp32; %% of bw above 100: part of the kind's "
           "bytes came from the last-level cache, or the "
           "probe under-read this machine\n");
}

static void print_attn(const cli_opts *o, const pf_machine *mc, const ka_row *r, int n, int asked) {
    const tk_engine_opts *e = &o->engine;
    const bool int8 = e->kv_type == TK_KV_INT8;
    printf(
        "\n## attention, KV %s%s, context %d, blocks of %d\n\n", names_str(&NAMES_KV_TYPE, (int)e->kv_type),
        int8 ? (e->kv_scale == TK_KV_SCALE_TOKEN ? " per token" : " per head") : "", e->ctx, e->block_size);
    if (n == 0) {
        printf("- no count's KV fits %.0f GiB: no rows (a shorter --ctx or fewer --tokens)\n",
               (double)KB_ATTN_MAX / (1 << 30));
        return;
    }
    printf(
        "| sequences | positions read | MB streamed | streamed GB/s | %% of bw | GOP/s | %% of peak | ns per "
        "position | cached positions | cached GB/s | cached ns per position | streamed / cached |\n");
    printf("|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n");
    const double peak = mc->peak[int8 ? TK_PEAK_INT8 : TK_PEAK_F32];
    for (int i = 0; i < n; i++)
        printf("| %d | %d | %.1f | %.1f | %.0f | %.0f | %.0f | %.2f | %d | %.1f | %.2f | %.2f |\n",
               r[i].n_seq, r[i].end, (double)r[i].bytes / 1e6, r[i].gbs,
               mc->bw.best > 0 ? 100.0 * r[i].gbs / mc->bw.best : 0, r[i].gops,
               peak > 0 ? 100.0 * r[i].gops / peak : 0, r[i].ns_pos, r[i].hot_end, r[i].hot_gbs,
               r[i].hot_ns_pos, r[i].ns_pos > 0 ? r[i].hot_ns_pos / r[i].ns_pos : 0.0);
    printf(
        "\n- streamed: one query token per sequence over every layer's KV up to its positions read (INT8 "
        "per head: up to its own block, whose record is folded last), the (sequence, kv head) units of a "
        "layer split between the threads and a barrier after each layer, as the decode step's attention "
        "stage; the sequences take turns through a pool of at least %.0f MiB, so each pass reads memory. "
        "Cached: one sequence's first layer at the cached positions, whose KV fits %.0f KiB a thread, again "
        "and again\n",
        (double)KB_ATTN_POOL / (1 << 20), (double)KB_ATTN_HOT / 1024);
    printf(
        "- ns per position: one thread's time per (position, kv head, layer), every query head of its GQA "
        "group; streamed / cached near 1: the kernel's arithmetic binds, well below 1: reads the arithmetic "
        "does not hide\n");
    if (n < asked)
        printf("- %d of the %d counts left out: their KV would pass %.0f GiB\n", asked - n, asked,
               (double)KB_ATTN_MAX / (1 << 30));
}

static cJSON *json_kernels(const char *model, const pf_machine *mc, const pf_args *pa, const kb_row *r, int n,
                           const cli_opts *op, const ka_row *ar, int na) {
    cJSON *root = cJSON_CreateObject(), *rows = cJSON_CreateArray();
    if (!root || !rows) {
        cJSON_Delete(root);
        cJSON_Delete(rows);
        return NULL;
    }
    cJSON_AddStringToObject(root, "model", model);
    cJSON_AddNumberToObject(root, "threads", mc->threads);
    cJSON_AddNumberToObject(root, "rounds", pa->rounds);
    cJSON_AddNumberToObject(root, "bw_gbs", mc->bw.best);
    cJSON_AddNumberToObject(root, "peak_int8_gops", mc->peak[TK_PEAK_INT8]);
    cJSON_AddNumberToObject(root, "peak_f32_gflops", mc->peak[TK_PEAK_F32]);
    cJSON_AddNumberToObject(root, "peak_bf16_gflops", mc->peak[TK_PEAK_BF16]);
    cJSON_AddItemToObject(root, "kernels", rows);
    for (int i = 0; i < n; i++) {
        cJSON *o = cJSON_CreateObject();
        if (!o) {
            cJSON_Delete(root);
            return NULL;
        }
        cJSON_AddItemToArray(rows, o);
        cJSON_AddStringToObject(o, "type", dtype_name(r[i].type));
        cJSON_AddStringToObject(o, "layout", layout_name(r[i].layout));
        cJSON_AddBoolToObject(o, "int8", r[i].peak == TK_PEAK_INT8);
        cJSON_AddStringToObject(o, "peak", kern_peak_name(r[i].peak));
        cJSON_AddNumberToObject(o, "tokens", r[i].n_tok);
        cJSON_AddNumberToObject(o, "matrices", r[i].n_mat);
        cJSON_AddNumberToObject(o, "bytes", (double)r[i].bytes);
        cJSON_AddNumberToObject(o, "ops", r[i].ops);
        cJSON_AddNumberToObject(o, "gbs", r[i].gbs);
        cJSON_AddNumberToObject(o, "gops", r[i].gops);
        cJSON_AddNumberToObject(o, "x_first", r[i].x_first);
        cJSON_AddNumberToObject(o, "cached_bytes", (double)r[i].hot_bytes);
        cJSON_AddNumberToObject(o, "cached_gbs", r[i].hot_gbs);
        cJSON_AddNumberToObject(o, "cached_gops", r[i].hot_gops);
    }
    cJSON *at = cJSON_AddObjectToObject(root, "attention");
    cJSON *arows = at ? cJSON_AddArrayToObject(at, "rows") : NULL;
    if (!arows) {
        cJSON_Delete(root);
        return NULL;
    }
    cJSON_AddStringToObject(at, "kv_type", names_str(&NAMES_KV_TYPE, (int)op->engine.kv_type));
    cJSON_AddStringToObject(at, "kv_scale", op->engine.kv_scale == TK_KV_SCALE_TOKEN ? "token" : "head");
    cJSON_AddNumberToObject(at, "ctx", op->engine.ctx);
    cJSON_AddNumberToObject(at, "block_size", op->engine.block_size);
    for (int i = 0; i < na; i++) {
        cJSON *o = cJSON_CreateObject();
        if (!o) {
            cJSON_Delete(root);
            return NULL;
        }
        cJSON_AddItemToArray(arows, o);
        cJSON_AddNumberToObject(o, "sequences", ar[i].n_seq);
        cJSON_AddNumberToObject(o, "positions", ar[i].end);
        cJSON_AddNumberToObject(o, "bytes", (double)ar[i].bytes);
        cJSON_AddNumberToObject(o, "ops", ar[i].ops);
        cJSON_AddNumberToObject(o, "gbs", ar[i].gbs);
        cJSON_AddNumberToObject(o, "gops", ar[i].gops);
        cJSON_AddNumberToObject(o, "ns_per_position", ar[i].ns_pos);
        cJSON_AddNumberToObject(o, "cached_positions", ar[i].hot_end);
        cJSON_AddNumberToObject(o, "cached_bytes", (double)ar[i].hot_bytes);
        cJSON_AddNumberToObject(o, "cached_gbs", ar[i].hot_gbs);
        cJSON_AddNumberToObject(o, "cached_ns_per_position", ar[i].hot_ns_pos);
    }
    return root;
}

static int run_kernels(const cli_opts *o, pf_args *pa, pf_machine *mc, tk_model *m, const char *model) {
    if (pa->n_tokens == 0) {
        static const int def[] = {1, 2, 4, 8, 16, 32};
        pa->n_tokens = (int)(sizeof def / sizeof def[0]);
        memcpy(pa->tokens, def, sizeof def);
    }
    if (pa->rounds == 0) pa->rounds = 5;
    kb_row *rows = NULL;
    ka_row *arows = NULL;
    int n = 0, na = 0;
    const tk_engine_opts *e = &o->engine;
    /* attention first: it refuses a context too short to time before the weights' rounds */
    tk_status st = kbench_attn_run(m, mc->threads, e->pin_threads, e->cpus, e->kv_type, e->kv_scale,
                                   e->block_size, e->ctx, pa->tokens, pa->n_tokens, pa->rounds, &arows, &na);
    if (st == TK_OK)
        st = kbench_run(m, mc->threads, e->pin_threads, e->cpus, pa->tokens, pa->n_tokens, pa->rounds, &rows,
                        &n);
    if (st == TK_OK) {
        print_kernels(model, mc, pa, rows, n);
        print_attn(o, mc, arows, na, pa->n_tokens);
        if (pa->json) {
            cJSON *root = json_kernels(model, mc, pa, rows, n, o, arows, na);
            st = root ? write_json(pa->json, root)
                      : tk_fail(TK_ERR_NOMEM, "profile: cannot build the JSON report");
            cJSON_Delete(root);
        }
    }
    tk_free(rows);
    tk_free(arows);
    if (st != TK_OK) {
        fprintf(stderr, "tokamak profile: %s\n", tk_last_error());
        return st == TK_ERR_INVALID ? 2 : 1; /* the options asked for what cannot be timed */
    }
    return 0;
}

int cmd_profile(int argc, char **argv) {
    pf_args pa = {.batch = 8, .steps = 16};
    cli_opts o;
    cli_opts_init(&o, &PF_CMD, &pa);
    o.engine.ctx = 512;
    int prc = cli_opts_parse(&o, argc, argv);
    if (prc != CLI_GO_ON) return prc;
    if (!o.model_path) {
        cli_error(&PF_CMD, "-m MODEL is required; 'tokamak profile --help' lists the options");
        return 2;
    }
    if (cli_opts_given(&o, "--kv-mem")) {
        cli_error(&PF_CMD, "--kv-mem: profile sizes the KV pool to its batch and context itself");
        return 2;
    }
    if (pa.kernels) {
        static const char *const step_only[] = {"--batch", "--prefill", "--steps", "--stage-cpu",
                                                "--ctx-spread"};
        for (size_t i = 0; i < sizeof step_only / sizeof step_only[0]; i++)
            if (cli_opts_given(&o, step_only[i])) {
                cli_error(&PF_CMD, "%s is for steps; --kernels times the kernels alone", step_only[i]);
                return 2;
            }
    } else if (pa.n_tokens > 0 || pa.rounds > 0) {
        cli_error(&PF_CMD, "--tokens and --rounds go with --kernels");
        return 2;
    }
    if (pa.prefill > 0 && (cli_opts_given(&o, "--batch") || cli_opts_given(&o, "--ctx-spread"))) {
        cli_error(&PF_CMD,
                  "--prefill times one sequence's chunks; --batch and --ctx-spread are for decode steps");
        return 2;
    }
    if (pa.ctx_spread > 0 && pa.ctx_spread / 2 >= o.engine.ctx) {
        cli_error(&PF_CMD, "--ctx-spread %d: the shortest context would be %d; it needs --ctx above %d",
                  pa.ctx_spread, o.engine.ctx - pa.ctx_spread / 2, pa.ctx_spread / 2);
        return 2;
    }
    int batch = pa.prefill > 0 ? 1 : pa.batch, steps = pa.steps, ctx = o.engine.ctx, prefill = pa.prefill;
    if (o.engine.n_threads == 0) {
        tk_cpu c;
        cpu_detect(&c);
        o.engine.n_threads = c.n_cores > 0 ? c.n_cores : 1;
    }
    pf_machine mc = {.threads = o.engine.n_threads};
    /* The probes start their own threads: before the backend's exist. */
    if (pa.bw > 0)
        mc.bw = (probe_stats){.best = pa.bw, .median = pa.bw, .min = pa.bw, .n = 0};
    else
        probe_read_bw_stats(mc.threads, &mc.bw);
    mc.peak[TK_PEAK_INT8] = peak_of(pa.peak_int8, probe_peak_gops_int8, mc.threads, &mc.given[TK_PEAK_INT8]);
    mc.peak[TK_PEAK_F32] = peak_of(pa.peak_f32, probe_peak_gflops_f32, mc.threads, &mc.given[TK_PEAK_F32]);
    /* only where a BF16 matmul will run vdpbf16ps */
    mc.peak[TK_PEAK_BF16] =
        peak_of(pa.peak_bf16, o.model.bf16_dot && kern_bf16_dot_hw(NULL) ? probe_peak_gflops_bf16 : NULL,
                mc.threads, &mc.given[TK_PEAK_BF16]);
    tk_model *m = NULL;
    if (tk_model_open(o.model_path, &o.model, &m) != TK_OK) {
        fprintf(stderr, "tokamak profile: %s\n", tk_last_error());
        return 1;
    }
    tk_model_info in;
    tk_model_get_info(m, &in);
    const char *model_name = in.name && in.name[0] ? in.name : o.model_path;
    if (pa.kernels) {
        int krc = run_kernels(&o, &pa, &mc, m, model_name);
        tk_model_free(m);
        return krc;
    }
    /* the paged-read probe where the read probe ran: before the backend's threads too */
    if (pa.bw <= 0) {
        const tk_kv_opts ko = {.n_layer = in.n_layer,
                               .n_head_kv = in.n_head_kv,
                               .head_dim = in.head_dim,
                               .block_size = o.engine.block_size,
                               .n_blocks = 1,
                               .type = o.engine.kv_type,
                               .scale = o.engine.kv_scale};
        /* A sequence's blocks are consecutive here (pf_setup), so attention
         * reads one run per (layer, kv head) and part: its blocks' units. */
        const int span = ctx + prefill, part_blocks = KV_ATTN_PART / ko.block_size,
                  seq_blocks = (span + ko.block_size - 1) / ko.block_size;
        mc.run_bytes = kv_run_bytes(&ko) * (size_t)(seq_blocks < part_blocks ? seq_blocks : part_blocks);
        mc.run_bytes &= ~(size_t)255; /* the probe reads whole 256-byte steps */
        probe_read_runs_stats(mc.threads, mc.run_bytes, &mc.runs);
    }
    /* decode: the attention kernel's own rate, with memory out of the way
     * (none where the context leaves it nothing to read from the pool) */
    if (prefill == 0) {
        ka_row ar;
        if (kbench_attn_cached(m, mc.threads, o.engine.pin_threads, o.engine.cpus, o.engine.kv_type,
                               o.engine.kv_scale, o.engine.block_size, ctx, 3, &ar) == TK_OK) {
            mc.attn_gbs = ar.hot_gbs;
            mc.attn_pos = ar.hot_end;
        } else {
            tk_error_clear();
        }
    }
    pf_state s;
    memset(&s, 0, sizeof s);
    s.spread = pa.ctx_spread;
    int nb_seq = 0, rc = 1;
    tk_status st = pf_setup(&s, m, &o, batch, ctx, steps, prefill, &nb_seq);
    /* decode steps move on a position each; prefill chunks rewrite the same ones */
    for (int i = 0; st == TK_OK && i < PF_WARMUP; i++)
        st = pf_step(&s, m, batch, prefill, ctx + (prefill ? 0 : i), -1);
    s.prof.stage_cpu = pa.stage_cpu;
    if (st == TK_OK) st = backend_cpu_profile(&s.be, &s.prof);
    for (int i = 0; st == TK_OK && i < steps; i++)
        st = pf_step(&s, m, batch, prefill, ctx + (prefill ? 0 : PF_WARMUP + i), i);
    if (st == TK_OK) {
        s.d.barriers = s.prof.barriers;
        backend_cpu_profile(&s.be, NULL);
        s.d.row_shares = tk_calloc((size_t)s.be.n_threads, sizeof *s.d.row_shares);
        if (s.d.row_shares) backend_cpu_row_shares(&s.be, s.d.row_shares);
        pf_row rows[PF_ROWS];
        set_ceiling(&s.d, &mc, s.tmp);
        for (int r = 0; r < PF_ROWS; r++) rows[r] = row_of(&s.d, &mc, r, s.tmp);
        double step_ms = median_of(s.d.step_ns, steps, s.tmp) / 1e6;
        double fwd_ms = median_of(s.d.fwd_ns, steps, s.tmp) / 1e6;
        pf_run ru = {.model = model_name,
                     .weight_dtype = in.weight_dtype,
                     .kv_type = names_str(&NAMES_KV_TYPE, (int)s.be.kv_type),
                     .batch = batch,
                     .ctx = ctx,
                     .ctx_spread = pa.ctx_spread,
                     .steps = steps,
                     .threads = s.be.n_threads,
                     .prefill = prefill,
                     .even_rows = o.engine.even_rows,
                     .stage_cpu = pa.stage_cpu};
        double off = median_of(s.d.offcpu, steps, s.tmp);
        s.d.overlap_ms = median_of(s.d.overlap_ns, steps, s.tmp) / 1e6;
        s.d.thread_sum_err = median_of(s.d.mark_err, steps, s.tmp);
        s.d.overlap_mean_ms = stats_mean(s.d.overlap_ns, (size_t)steps) / 1e6;
        print_markdown(&ru, &mc, &s.d, rows, step_ms, fwd_ms, off);
        rc = 0;
        if (pa.json) {
            cJSON *root = json_of(&ru, &mc, &s.d, rows, step_ms, fwd_ms, off);
            st = write_json(pa.json, root);
            cJSON_Delete(root);
            if (st != TK_OK) rc = 1;
        }
    }
    if (st != TK_OK) fprintf(stderr, "tokamak profile: %s\n", tk_last_error());
    pf_free(&s, batch);
    tk_model_free(m);
    return rc;
}
