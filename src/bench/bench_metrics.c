/* Metrics from raw samples; see docs/benchmarking.md for the definitions. */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "bench/bench.h"
#include "bench/probe.h"
#include "core/alloc.h"
#include "core/cpu.h"
#include "core/error.h"

static const char *const METRIC_NAMES[BM_COUNT] = {
    [BM_TTFT_MEAN] = "ttft_mean_ms",
    [BM_TTFT_P50] = "ttft_p50_ms",
    [BM_TTFT_P95] = "ttft_p95_ms",
    [BM_TTFT_P99] = "ttft_p99_ms",
    [BM_TPOT_MEAN] = "tpot_mean_ms",
    [BM_TPOT_P50] = "tpot_p50_ms",
    [BM_TPOT_P95] = "tpot_p95_ms",
    [BM_TPOT_P99] = "tpot_p99_ms",
    [BM_ITL_P50] = "itl_p50_ms",
    [BM_ITL_P95] = "itl_p95_ms",
    [BM_ITL_P99] = "itl_p99_ms",
    [BM_E2E_MEAN] = "e2e_mean_ms",
    [BM_E2E_P99] = "e2e_p99_ms",
    [BM_OUT_TOK_S] = "output_tok_s",
    [BM_TOTAL_TOK_S] = "total_tok_s",
    [BM_REQ_S] = "requests_s",
    [BM_MEAN_OUT_LEN] = "mean_output_len",
    [BM_KV_PEAK_BLOCKS] = "kv_peak_blocks",
    [BM_KV_PEAK_MB] = "kv_peak_mb",
    [BM_STEP_GBS] = "decode_read_gb_s",
    [BM_ROOF_PCT] = "roofline_pct",
    [BM_X_FLOOR] = "decode_x_floor",
    [BM_X_FLOOR_MED] = "decode_x_floor_median_read",
    [BM_DURATION] = "duration_s",
    [BM_ERRORS] = "errors",
    [BM_BG_ITL_P50] = "bg_itl_p50_ms",
    [BM_BG_ITL_P95] = "bg_itl_p95_ms",
    [BM_BG_ITL_P99] = "bg_itl_p99_ms",
    [BM_BG_ITL_MAX] = "bg_itl_max_ms",
    [BM_BG_ITL_RATIO] = "bg_itl_p99_over_p50",
    [BM_BG_TPOT_P50] = "bg_tpot_p50_ms",
    [BM_BG_TPOT_P99] = "bg_tpot_p99_ms",
    [BM_BG_TPOT_RATIO] = "bg_tpot_p99_over_p50",
};

const char *bench_metric_name(bench_metric m) { return (unsigned)m < BM_COUNT ? METRIC_NAMES[m] : "unknown"; }

void bench_request_fill(bench_request *r, double t0, double t_submit, const double *tok_t, int n_tok,
                        double *itl) {
    int k = n_tok > 0 ? n_tok : 0;
    r->n_output = k;
    r->t_submit = t_submit - t0;
    r->t_first = k ? tok_t[0] - t0 : NAN;
    r->t_last = k ? tok_t[k - 1] - t0 : NAN;
    r->ttft = r->t_first - r->t_submit;
    /* vLLM's definitions: E2E ends at the last token, so E2E = TTFT + TPOT x (n - 1) exactly. */
    r->e2e = r->t_last - r->t_submit;
    r->tpot = k > 1 ? (r->t_last - r->t_first) / (k - 1) : NAN;
    for (int j = 1; j < k; j++) itl[j - 1] = tok_t[j] - tok_t[j - 1];
}

tk_status bench_level_finalize(bench_level *l) {
    size_t n = (size_t)(l->n_requests > 0 ? l->n_requests : 0);
    double *buf = n ? tk_calloc(3 * n, sizeof(double)) : NULL;
    if (n && !buf) return tk_fail(TK_ERR_NOMEM, "bench: cannot summarise %zu requests", n);
    double *ttft = buf, *tpot = buf ? buf + n : NULL, *e2e = buf ? buf + 2 * n : NULL;
    double out_tokens = 0, all_tokens = 0, done = 0;
    l->out_len_short = false;
    for (size_t i = 0; i < n; i++) {
        const bench_request *r = &l->req[i];
        /* A request that produced nothing has no latency to report. */
        bool ok = r->n_output > 0;
        ttft[i] = ok ? r->ttft : NAN;
        tpot[i] = ok ? r->tpot : NAN;
        e2e[i] = ok ? r->e2e : NAN;
        out_tokens += r->n_output;
        all_tokens += r->n_output + r->n_prompt;
        done += ok;
        if (r->n_output != l->n_asked_out) l->out_len_short = true;
    }
    tk_status st = stats_summarize(ttft, n, &l->s_ttft);
    if (st == TK_OK) st = stats_summarize(tpot, n, &l->s_tpot);
    if (st == TK_OK) st = stats_summarize(e2e, n, &l->s_e2e);
    if (st == TK_OK) st = stats_summarize(l->itl, l->n_itl, &l->s_itl);
    tk_free(buf);
    if (st != TK_OK) return st;

    double *m = l->m;
    m[BM_TTFT_MEAN] = l->s_ttft.mean * 1e3, m[BM_TTFT_P50] = l->s_ttft.p50 * 1e3;
    m[BM_TTFT_P95] = l->s_ttft.p95 * 1e3, m[BM_TTFT_P99] = l->s_ttft.p99 * 1e3;
    m[BM_TPOT_MEAN] = l->s_tpot.mean * 1e3, m[BM_TPOT_P50] = l->s_tpot.p50 * 1e3;
    m[BM_TPOT_P95] = l->s_tpot.p95 * 1e3, m[BM_TPOT_P99] = l->s_tpot.p99 * 1e3;
    m[BM_ITL_P50] = l->s_itl.p50 * 1e3, m[BM_ITL_P95] = l->s_itl.p95 * 1e3,
    m[BM_ITL_P99] = l->s_itl.p99 * 1e3;
    m[BM_E2E_MEAN] = l->s_e2e.mean * 1e3, m[BM_E2E_P99] = l->s_e2e.p99 * 1e3;
    double dur = l->t_end - l->t_start;
    m[BM_DURATION] = dur;
    m[BM_OUT_TOK_S] = dur > 0 ? out_tokens / dur : NAN;
    m[BM_TOTAL_TOK_S] = dur > 0 ? all_tokens / dur : NAN;
    m[BM_REQ_S] = dur > 0 ? done / dur : NAN;
    m[BM_MEAN_OUT_LEN] = n ? out_tokens / (double)n : NAN;
    m[BM_ERRORS] = l->err.total;
    /* No engine seen (loadgen): no KV figures. */
    m[BM_KV_PEAK_BLOCKS] = l->block_size > 0 ? l->kv_blocks_peak : NAN;
    m[BM_KV_PEAK_MB] = l->block_size > 0
                           ? (double)l->kv_blocks_peak * l->block_size * (double)l->kv_bytes_per_token / 1e6
                           : NAN;
    bench_level_restate(l, l->read_bw_gbs, l->read_bw_median_gbs);
    return bench_bg_finalize(l);
}

/* The decode steps the level's decode figures are taken over. In a closed
 * loop, the steps that decode the whole level (its concurrency): the steady
 * state the level stands for, not the tail where the last requests decode
 * alone (they read as one stream does). Without such steps (rate mode, or a
 * level that never filled), all of them. */
static bool steady_only(const bench_level *l) {
    if (l->concurrency <= 0) return false;
    for (size_t i = 0; i < l->n_steps; i++)
        if (l->steps[i].running >= l->concurrency && l->steps[i].time > 0) return true;
    return false;
}

int bench_level_max_running(const bench_level *l) {
    int mx = 0;
    for (size_t i = 0; i < l->n_steps; i++)
        if (l->steps[i].running > mx) mx = l->steps[i].running;
    return mx;
}

tk_floor_limits bench_level_limits(const bench_level *l) {
    tk_floor_limits lim = {.read_gbs = l->read_bw_gbs};
    memcpy(lim.peak_gops, l->peak_gops, sizeof lim.peak_gops);
    return lim;
}

/* At least 1: steps faster than their floor mean the probe under-read the
 * machine (as the roofline is at most 100%). */
static double x_floor(double secs, double floor) {
    return secs > 0 && floor > 0 ? (secs > floor ? secs / floor : 1.0) : NAN;
}

void bench_level_restate(bench_level *l, double read_gbs, double median_gbs) {
    double *m = l->m;
    l->read_bw_gbs = read_gbs;
    l->read_bw_median_gbs = median_gbs;
    const tk_floor_limits lim = bench_level_limits(l);
    tk_floor_limits lim_med = lim;
    lim_med.read_gbs = median_gbs;
    /* Aggregates, not means of per-step ratios: long steps weigh by their time. */
    const bool steady = steady_only(l);
    double bytes = 0, secs = 0, floor = 0, floor_med = 0;
    for (size_t i = 0; i < l->n_steps; i++) {
        const bench_step *st = &l->steps[i];
        if (steady && st->running < l->concurrency) continue;
        bytes += (double)st->bytes, secs += st->time;
        floor += tk_step_floor_s(st->terms, &lim);
        floor_med += tk_step_floor_s(st->terms, &lim_med);
    }
    m[BM_STEP_GBS] = secs > 0 ? bytes / secs / 1e9 : NAN;
    /* Capped at 100%: a run that reads faster than the probe shows the probe's
     * shortfall (the report says so), not a roofline above the machine. */
    m[BM_ROOF_PCT] = secs > 0 && read_gbs > 0 ? probe_roofline_pct(m[BM_STEP_GBS], read_gbs, NULL) : NAN;
    m[BM_X_FLOOR] = x_floor(secs, floor);
    m[BM_X_FLOOR_MED] = median_gbs > 0 ? x_floor(secs, floor_med) : NAN;
}

void bench_errors_add(bench_errors *e, int status, const char *message) {
    e->total++;
    int i = 0;
    while (i < e->n_kinds && e->kind[i].status != status) i++;
    if (i == e->n_kinds) {
        if (e->n_kinds == BENCH_MAX_ERR_KINDS) {
            i = BENCH_MAX_ERR_KINDS - 1; /* the last slot becomes "other" */
            if (e->kind[i].status != BENCH_ERR_OTHER) {
                e->kind[i].status = BENCH_ERR_OTHER;
                snprintf(e->kind[i].message, sizeof e->kind[i].message, "%s",
                         "more kinds than the table holds");
            }
        } else {
            e->n_kinds++;
            e->kind[i].status = status;
            e->kind[i].count = 0;
            snprintf(e->kind[i].message, sizeof e->kind[i].message, "%s", message ? message : "");
        }
    }
    e->kind[i].count++;
}

const char *bench_error_kind_name(int status, char *buf, size_t n) {
    if (status == BENCH_ERR_TRANSPORT) return "transport";
    if (status == BENCH_ERR_STREAM) return "stream";
    if (status == BENCH_ERR_OTHER) return "other";
    snprintf(buf, n, "%d", status);
    return buf;
}

size_t bench_window_gaps(const double *tok_t, int n_tok, double w0, double w1, double *gaps, double *mean) {
    size_t n = 0;
    double sum = 0;
    for (int j = 1; j < n_tok; j++) {
        if (!(tok_t[j] > w0) || tok_t[j] > w1) continue;
        double g = tok_t[j] - tok_t[j - 1];
        gaps[n++] = g;
        sum += g;
    }
    *mean = n ? sum / (double)n : NAN;
    return n;
}

tk_status bench_bg_finalize(bench_level *l) {
    bench_bg *b = &l->bg;
    double *m = l->m;
    for (int k = BM_BG_ITL_P50; k <= BM_BG_TPOT_RATIO; k++) m[k] = NAN;
    if (b->n_streams <= 0) {
        memset(&b->s_itl, 0, sizeof b->s_itl);
        memset(&b->s_tpot, 0, sizeof b->s_tpot);
        return TK_OK;
    }
    double *tpot = tk_calloc((size_t)b->n_streams, sizeof(double));
    if (!tpot) return tk_fail(TK_ERR_NOMEM, "bench: cannot summarise %d background streams", b->n_streams);
    for (int i = 0; i < b->n_streams; i++) tpot[i] = b->stream[i].tpot;
    tk_status st = stats_summarize(tpot, (size_t)b->n_streams, &b->s_tpot);
    tk_free(tpot);
    if (st == TK_OK) st = stats_summarize(b->itl, b->n_itl, &b->s_itl);
    if (st != TK_OK) return st;
    m[BM_BG_ITL_P50] = b->s_itl.p50 * 1e3, m[BM_BG_ITL_P95] = b->s_itl.p95 * 1e3;
    m[BM_BG_ITL_P99] = b->s_itl.p99 * 1e3, m[BM_BG_ITL_MAX] = b->s_itl.max * 1e3;
    m[BM_BG_ITL_RATIO] = b->s_itl.p50 > 0 ? b->s_itl.p99 / b->s_itl.p50 : NAN;
    m[BM_BG_TPOT_P50] = b->s_tpot.p50 * 1e3, m[BM_BG_TPOT_P99] = b->s_tpot.p99 * 1e3;
    m[BM_BG_TPOT_RATIO] = b->s_tpot.p50 > 0 ? b->s_tpot.p99 / b->s_tpot.p50 : NAN;
    return TK_OK;
}

void bench_point_summarize(bench_point *p) {
    p->out_len_short = false;
    for (int k = 0; k < BM_COUNT; k++) {
        double v[64];
        int n = 0;
        for (int r = 0; r < p->n_rep && n < 64; r++)
            if (!isnan(p->rep[r].m[k])) v[n++] = p->rep[r].m[k];
        stats_summary s;
        /* n <= 64 values on the stack: stats_summarize's copy cannot overflow. */
        if (stats_summarize(v, (size_t)n, &s) != TK_OK) s.p50 = s.min = s.max = NAN;
        p->med[k] = s.p50, p->lo[k] = s.min, p->hi[k] = s.max;
    }
    for (int r = 0; r < p->n_rep; r++) p->out_len_short |= p->rep[r].out_len_short;
}

void bench_level_free(bench_level *l) {
    if (!l) return;
    tk_free(l->req);
    tk_free(l->itl);
    tk_free(l->steps);
    tk_free(l->bg.stream);
    tk_free(l->bg.itl);
    l->req = NULL, l->itl = NULL, l->steps = NULL;
    l->bg.stream = NULL, l->bg.itl = NULL, l->bg.n_streams = 0, l->bg.n_itl = 0;
}

void bench_point_free(bench_point *p) {
    if (!p) return;
    for (int r = 0; r < p->n_rep; r++) bench_level_free(&p->rep[r]);
    tk_free(p->rep);
    p->rep = NULL;
    p->n_rep = 0;
}

void bench_probe_machine(int n_threads, bench_info *info) {
    tk_cpu cpu;
    cpu_detect(&cpu);
    snprintf(info->cpu_brand, sizeof info->cpu_brand, "%s", cpu.brand[0] ? cpu.brand : "unknown");
    cpu_features_str(&cpu, info->cpu_features, (int)sizeof info->cpu_features);
    snprintf(info->isa, sizeof info->isa, "%s", cpu_isa_name(cpu_isa_from_env(&cpu)));
    info->n_cores = cpu.n_cores;
    info->probe_threads = n_threads > 0 ? n_threads : cpu.n_cores;
    probe_stats bw;
    probe_read_bw_stats(info->probe_threads, &bw);
    info->read_bw_gbs = bw.best;
    info->read_bw_min_gbs = bw.min;
    info->read_bw_median_gbs = bw.median;
    info->peak_gflops_f32 = probe_peak_gflops_f32(info->probe_threads);
    info->peak_gops_int8 = probe_peak_gops_int8(info->probe_threads);
    info->peak_gflops_bf16 = probe_peak_gflops_bf16(info->probe_threads);
    (void)probe_rt_throttled(&info->rt_runtime_us, &info->rt_period_us);
}
