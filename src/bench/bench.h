/* tokamak bench: an in-process load generator over tk_engine, its raw samples,
 * and the metrics derived from them (definitions in docs/benchmarking.md).
 *
 * Ownership: bench_run fills a bench_result that the caller frees with
 * bench_result_free (NULL-safe, also after a failed run). Nothing here is
 * shared between threads except inside bench_run. */
#ifndef TK_BENCH_BENCH_H
#define TK_BENCH_BENCH_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "bench/stats.h"
#include "tokamak.h"

#define BENCH_MAX_LEVELS 32
#define BENCH_MAX_SERIES 8

typedef struct bench_opts {
    const char *model_path;
    int n_in, n_out;              /* prompt and output tokens per request */
    int levels[BENCH_MAX_LEVELS]; /* closed-loop concurrency levels */
    int n_levels;
    double rates[BENCH_MAX_LEVELS]; /* Poisson arrival rates (req/s); used when n_rates > 0 */
    int n_rates;
    int requests;   /* per level; 0: requests_x x the level (rate mode: 16) */
    int requests_x; /* requests per level as a multiple of the level when requests is 0 (default 2) */
    int warmup;     /* unmeasured requests before the first level */
    int repeat;     /* measured runs of each level (>= 1) */
    uint64_t seed;  /* prompts and arrival times */
    bool ablation;  /* the optimisation ladder instead of one configuration */
    bool quiet;     /* no progress lines on stderr */
    tk_model_opts model;
    tk_engine_opts engine;
    bool engine_ctx_set, engine_max_batch_set; /* else sized from the levels */
    /* Mixed load: n_bg long decode streams (bg_in prompt tokens, at most bg_out
     * output tokens) start before each measured run, all decode before its
     * first submit, and are cancelled once its last request finished. */
    int n_bg, bg_in, bg_out;
    const char *git_commit;
} bench_opts;

/* Defaults: 512 in, 512 out, levels 1,4,8,16,32, one repeat. */
/* The ladder's rounds unless --repeat says otherwise (tokamak bench --ablation). */
#define BENCH_ABLATION_ROUNDS 3
void bench_opts_default(bench_opts *o);

/* The seeded draws of prompts and arrival times (splitmix64), shared by bench
 * and loadgen: the next 64-bit value of the stream *x, and one uniform in (0, 1]. */
uint64_t bench_splitmix64(uint64_t *x);
double bench_rand_unit(uint64_t *x);

/* One measured request. Times are seconds on tk_now_s() relative to the
 * level's start; latencies are seconds. */
typedef struct bench_request {
    double t_submit, t_first, t_last; /* submit, first token, last token */
    double ttft;                      /* t_first - t_submit */
    double tpot;                      /* (t_last - t_first) / (n_output - 1); NaN if n_output < 2 */
    double e2e;                       /* t_last - t_submit */
    int n_prompt, n_output;
    int n_preempted;
    tk_finish finish;
    size_t itl_off; /* this request's gaps: level itl[itl_off .. itl_off + n_output - 1) */
} bench_request;

/* One pure decode step of a level (no prompt token, tokens out), every one
 * from the engine's step log (tk_engine_step_log). */
typedef struct bench_step {
    double t;                           /* when the poller read it, relative to the level's start */
    uint64_t bytes;                     /* decode_bytes_last: weights + KV the step read */
    double time;                        /* step_time_last, seconds */
    int running;                        /* sequences in the step */
    tk_floor_term terms[TK_STEP_TERMS]; /* what its stages read and computed (its floor) */
} bench_step;

typedef enum bench_metric {
    BM_TTFT_MEAN,
    BM_TTFT_P50,
    BM_TTFT_P95,
    BM_TTFT_P99,
    BM_TPOT_MEAN,
    BM_TPOT_P50,
    BM_TPOT_P95,
    BM_TPOT_P99,
    BM_ITL_P50,
    BM_ITL_P95,
    BM_ITL_P99,
    BM_E2E_MEAN,
    BM_E2E_P99,
    BM_OUT_TOK_S,
    BM_TOTAL_TOK_S,
    BM_REQ_S,
    BM_MEAN_OUT_LEN,
    BM_KV_PEAK_BLOCKS,
    BM_KV_PEAK_MB,
    BM_STEP_GBS,
    BM_ROOF_PCT,
    BM_X_FLOOR,
    BM_X_FLOOR_MED, /* the same at the probe's median pass */
    BM_DURATION,
    BM_ERRORS, /* requests that failed (loadgen: by status in bench_level.err; bench: always 0) */
    /* The background streams inside the foreground window (NaN without --background). */
    BM_BG_ITL_P50,
    BM_BG_ITL_P95,
    BM_BG_ITL_P99,
    BM_BG_ITL_MAX,
    BM_BG_ITL_RATIO,
    BM_BG_TPOT_P50,
    BM_BG_TPOT_P99,
    BM_BG_TPOT_RATIO,
    BM_COUNT
} bench_metric;

/* One background stream of a mixed run, seen through the foreground window. */
typedef struct bench_bg_stream {
    int n_output;   /* tokens it produced in all */
    int n_window;   /* gaps that ended inside the window */
    double tpot;    /* mean of those gaps, seconds; NaN if none */
    size_t itl_off; /* its gaps: bg.itl[itl_off .. itl_off + n_window) */
    int n_preempted;
    tk_finish finish; /* TK_FINISH_CANCELLED unless it ran out (or failed) */
} bench_bg_stream;

typedef struct bench_bg {
    int n_streams; /* 0: no background */
    int n_prompt;
    bench_bg_stream *stream; /* (n_streams) */
    double *itl;             /* (n_itl) seconds, every stream's in-window gaps */
    size_t n_itl;
    double w0, w1;               /* the window, relative to the level's start: first submit, last finish */
    bool exhausted;              /* a stream stopped before the window closed: raise --bg-out */
    stats_summary s_itl, s_tpot; /* seconds; s_tpot over the streams' tpot */
} bench_bg;

/* Failed requests of a run, by kind: an HTTP status (>= 100), BENCH_ERR_TRANSPORT
 * (no HTTP answer: refused, reset, timed out) or BENCH_ERR_STREAM (a 200 whose
 * stream broke, carried an error frame or ended without its [DONE]). */
#define BENCH_MAX_ERR_KINDS 8
enum { BENCH_ERR_TRANSPORT = 0, BENCH_ERR_STREAM = 1, BENCH_ERR_OTHER = -1 /* kinds past the table */ };
typedef struct bench_error_kind {
    int status;
    int count;
    char message[160]; /* the first one seen */
} bench_error_kind;
typedef struct bench_errors {
    int total, n_kinds;
    bench_error_kind kind[BENCH_MAX_ERR_KINDS];
} bench_errors;
/* Count one failure of this status (the last slot collects kinds past the table). */
void bench_errors_add(bench_errors *e, int status, const char *message);
/* "401", "transport", "stream" or "other". */
const char *bench_error_kind_name(int status, char *buf, size_t n);

/* One measured run of a level (one repeat). */
typedef struct bench_level {
    int concurrency; /* closed-loop level; 0 in rate mode */
    double rate;     /* req/s in rate mode; 0 in closed loop */
    int n_requests;
    bench_request *req; /* (n_requests) */
    double *itl;        /* (sum over requests of max(n_output - 1, 0)) seconds */
    size_t n_itl;
    bench_step *steps; /* (n_steps) */
    size_t n_steps;
    double t_start, t_end; /* first submit, last finish (relative) */
    int kv_blocks_peak;    /* max kv_blocks_used seen during the level */
    int kv_blocks_total, block_size;
    size_t kv_bytes_per_token;
    double read_bw_gbs;                         /* the probe's bandwidth this run compares with */
    double read_bw_median_gbs;                  /* that probe's median pass */
    double peak_gops[TK_FLOOR_PEAKS];           /* and its peaks (TK_FLOOR_*; 0: not probed) */
    int n_asked_out;                            /* output tokens asked of each request */
    stats_summary s_ttft, s_tpot, s_itl, s_e2e; /* seconds */
    double m[BM_COUNT];                         /* every metric, filled by bench_level_finalize */
    bool out_len_short;                         /* a request produced fewer or more tokens than asked */
    double t_origin;                            /* tk_now_s() of the level's start (absolute) */
    bench_bg bg;                                /* the background streams (mixed load) */
    bench_errors err;                           /* failed requests (loadgen) */
} bench_level;

/* A level over its repeats: the median and the min-max of every metric. */
typedef struct bench_point {
    int concurrency;
    double rate;
    int n_rep;
    bench_level *rep; /* (n_rep) */
    double med[BM_COUNT], lo[BM_COUNT], hi[BM_COUNT];
    bool out_len_short;
} bench_point;

/* One engine configuration and its points (one series for a plain run, one
 * per rung for --ablation). */
typedef struct bench_series {
    char label[96];
    tk_weight_type repack;        /* tk_model_opts.repack used */
    tk_weight_type repack_output; /* tk_model_opts.repack_output used */
    tk_engine_stats engine;       /* the configuration as the engine reported it */
    char weight_dtype[16];        /* engine.weight_dtype copied (the model owns the string) */
    int n_points;
    bench_point *points; /* (n_points) */
} bench_series;

typedef struct bench_info {
    char cpu_brand[64];
    char cpu_features[256];
    char isa[16];
    int n_cores;
    char git_commit[64];
    char date[40]; /* UTC, ISO 8601 */
    char model_path[512];
    char model_name[128], model_arch[32], model_dtype[16];
    int64_t n_params;
    uint64_t weight_bytes, decode_bytes, kv_bytes_per_token;
    double read_bw_gbs;                         /* probe_read_bw(engine threads), measured by this run */
    double read_bw_min_gbs, read_bw_median_gbs; /* the spread of that probe's passes */
    double peak_gflops_f32, peak_gops_int8;
    double peak_gflops_bf16; /* the BF16 dot (vdpbf16ps) loop; 0 where the CPU or level lacks it */
    int probe_threads;
    /* probe_rt_throttled: the real-time throttle the run is under (0s: none) */
    int rt_runtime_us, rt_period_us;
} bench_info;

/* What tokamak loadgen measured: a server over HTTP, seen from the client
 * (the engine fields of the series and the roofline stay empty). */
typedef struct bench_remote {
    bool on;
    char url[256];
    char model[128];
    char prompts[192]; /* how the prompts were made and counted */
    double duration_s; /* > 0: each run submitted for this long */
} bench_remote;

typedef struct bench_result {
    bench_opts opts; /* as run (ctx, max_batch, requests resolved) */
    bench_info info;
    bench_remote remote;
    int n_series;
    bench_series series[BENCH_MAX_SERIES];
} bench_result;

/* Run the benchmark described by o: open the model, probe, create an engine
 * per series, run warm-up and every level `repeat` times. Progress goes to
 * stderr unless o->quiet. On error returns a status with a message; whatever
 * was measured stays in *out (free it either way). */
tk_status bench_run(const bench_opts *o, bench_result *out);
void bench_result_free(bench_result *r);

/* ---- metrics (no engine needed; bench_metrics.c) ------------------------- */

const char *bench_metric_name(bench_metric m); /* "tpot_p50_ms" */
/* Derive r's times and latencies from its token times tok_t[0..n_tok)
 * (absolute, ascending), submit time and the level start t0 (all tk_now_s());
 * writes the n_tok - 1 inter-token gaps to itl (which must hold them). */
void bench_request_fill(bench_request *r, double t0, double t_submit, const double *tok_t, int n_tok,
                        double *itl);
/* Derive l->ttft/tpot/itl/e2e summaries and l->m[] from the raw samples. */
tk_status bench_level_finalize(bench_level *l);
/* The level's decode figures (read rate, roofline, floor ratio) from its
 * steps, against read_gbs (which becomes l->read_bw_gbs, the probe's best
 * pass; median_gbs its median pass, l->read_bw_median_gbs) and
 * l->peak_gops. */
void bench_level_restate(bench_level *l, double read_gbs, double median_gbs);
/* The most sequences any of l's pure decode steps ran (0: no step). */
int bench_level_max_running(const bench_level *l);
/* The limits l's floors are taken at: l->read_bw_gbs and l->peak_gops. */
tk_floor_limits bench_level_limits(const bench_level *l);
/* The gaps of one stream's ascending token times tok_t[0..n_tok) that end
 * inside the window (w0, w1]: written to gaps (room for n_tok - 1), counted
 * in the return value; *mean is their mean, NaN when there is none. A gap that
 * began before w0 counts: a stall the window's first arrival caused. */
size_t bench_window_gaps(const double *tok_t, int n_tok, double w0, double w1, double *gaps, double *mean);
/* Summaries of l->bg and its l->m[BM_BG_*] (NaN without streams). */
tk_status bench_bg_finalize(bench_level *l);
/* Fill p->med/lo/hi from p->rep[*].m. */
void bench_point_summarize(bench_point *p);
void bench_level_free(bench_level *l);
void bench_point_free(bench_point *p);

/* Measure only the machine: fills info's CPU fields and the three probes. */
void bench_probe_machine(int n_threads, bench_info *info);

#endif
