/* bench statistics, metrics and report writers against hand-computed values,
 * and sanity of the machine probes. No engine: results are built by hand. */
#include <cjson/cJSON.h>
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

#include "bench/bench.h"
#include "bench/probe.h"
#include "bench/report.h"
#include "bench/stats.h"
#include "core/alloc.h"

#define assert_near(a, b, tol) assert_true(fabs((double)(a) - (double)(b)) <= (tol))

static void test_bench_percentile_numpy(void **state) {
    (void)state;
    /* numpy.percentile(x, p) with the default linear method. */
    const double x[] = {4, 1, 3, 2};
    double v;
    assert_int_equal(stats_percentile(x, 4, 50, &v), TK_OK);
    assert_near(v, 2.5, 1e-12);
    assert_int_equal(stats_percentile(x, 4, 95, &v), TK_OK);
    assert_near(v, 3.85, 1e-12);
    assert_int_equal(stats_percentile(x, 4, 99, &v), TK_OK);
    assert_near(v, 3.97, 1e-12);
    assert_int_equal(stats_percentile(x, 4, 0, &v), TK_OK);
    assert_near(v, 1, 0);
    assert_int_equal(stats_percentile(x, 4, 100, &v), TK_OK);
    assert_near(v, 4, 0);
    const double y[] = {15, 20, 35, 40, 50}; /* numpy docs: P40 = 29 */
    assert_int_equal(stats_percentile(y, 5, 40, &v), TK_OK);
    assert_near(v, 29, 1e-12);
    /* Out-of-range p clamps; a single sample is every percentile. */
    assert_near(stats_percentile_sorted(y, 5, 150), 50, 0);
    assert_near(stats_percentile_sorted(y, 5, -3), 15, 0);
    assert_near(stats_percentile_sorted(y, 1, 73), 15, 0);
    assert_true(isnan(stats_percentile_sorted(y, 0, 50)));
}

static void test_bench_summary_nan_and_empty(void **state) {
    (void)state;
    const double x[] = {NAN, 2, 10, NAN, 6};
    stats_summary s;
    assert_int_equal(stats_summarize(x, 5, &s), TK_OK);
    assert_int_equal(s.n, 3);
    assert_near(s.mean, 6, 1e-12);
    assert_near(s.min, 2, 0);
    assert_near(s.max, 10, 0);
    assert_near(s.p50, 6, 1e-12);
    assert_near(s.p90, 9.2, 1e-12); /* r = 1.8: 6 + 0.8 * 4 */
    assert_near(s.p99, 9.92, 1e-12);
    assert_int_equal(stats_summarize(NULL, 0, &s), TK_OK);
    assert_int_equal(s.n, 0);
    assert_true(isnan(s.mean) && isnan(s.p99));
    assert_int_equal(stats_summarize(NULL, 3, &s), TK_ERR_INVALID);
    assert_true(isnan(stats_mean(NULL, 0)));
}

/* Two requests of 3 tokens (4 prompt tokens), level start t0 = 100 s:
 *   r0: submit 100.00, tokens 100.10 100.15 100.25 -> TTFT .10, TPOT .075, E2E .25
 *   r1: submit 100.05, tokens 100.30 100.40 100.50 -> TTFT .25, TPOT .100, E2E .45 */
static void make_level(bench_level *l, int asked_out) {
    memset(l, 0, sizeof *l);
    const double t0 = 100.0;
    const double tok[2][3] = {{100.10, 100.15, 100.25}, {100.30, 100.40, 100.50}};
    const double sub[2] = {100.00, 100.05};
    l->concurrency = 2;
    l->n_requests = 2;
    l->req = tk_calloc(2, sizeof *l->req);
    l->itl = tk_calloc(4, sizeof(double));
    assert_non_null(l->req);
    assert_non_null(l->itl);
    for (int i = 0; i < 2; i++) {
        bench_request_fill(&l->req[i], t0, sub[i], tok[i], 3, l->itl + l->n_itl);
        l->req[i].itl_off = l->n_itl;
        l->req[i].n_prompt = 4;
        l->req[i].finish = TK_FINISH_LENGTH;
        l->n_itl += 2;
    }
    l->t_start = 0;
    l->t_end = 0.5;
    l->n_asked_out = asked_out;
    l->kv_blocks_peak = 3, l->block_size = 16, l->kv_bytes_per_token = 1000, l->kv_blocks_total = 10;
    l->read_bw_gbs = 40;
    l->steps = tk_calloc(2, sizeof *l->steps);
    assert_non_null(l->steps);
    l->steps[0] = (bench_step){.t = 0.2, .bytes = 1000000000ull, .time = 0.1, .running = 2};
    l->steps[1] = (bench_step){.t = 0.3, .bytes = 3000000000ull, .time = 0.1, .running = 2};
    l->n_steps = 2;
    assert_int_equal(bench_level_finalize(l), TK_OK);
}

static void test_bench_level_metrics(void **state) {
    (void)state;
    bench_level l;
    make_level(&l, 3);
    const bench_request *r = &l.req[0];
    assert_near(r->ttft, 0.10, 1e-9);
    assert_near(r->tpot, 0.075, 1e-9);
    assert_near(r->e2e, 0.25, 1e-9);
    for (int i = 0; i < 2; i++) /* E2E = TTFT + TPOT x (n - 1) by definition */
        assert_near(l.req[i].e2e, l.req[i].ttft + l.req[i].tpot * (l.req[i].n_output - 1), 1e-9);
    assert_near(l.itl[0], 0.05, 1e-9);
    assert_near(l.itl[1], 0.10, 1e-9);
    const double *m = l.m;
    assert_near(m[BM_TTFT_MEAN], 175, 1e-6);
    assert_near(m[BM_TTFT_P50], 175, 1e-6);
    assert_near(m[BM_TTFT_P99], 100 + 0.99 * 150, 1e-6);
    assert_near(m[BM_TPOT_MEAN], 87.5, 1e-6);
    assert_near(m[BM_TPOT_P95], 75 + 0.95 * 25, 1e-6);
    assert_near(m[BM_ITL_P50], 100, 1e-6); /* gaps .05 .10 .10 .10 */
    assert_near(m[BM_ITL_P95], 100, 1e-6);
    assert_near(m[BM_E2E_MEAN], 350, 1e-6);
    assert_near(m[BM_E2E_P99], 250 + 0.99 * 200, 1e-6);
    assert_near(m[BM_OUT_TOK_S], 12, 1e-9);   /* 6 tokens / 0.5 s */
    assert_near(m[BM_TOTAL_TOK_S], 28, 1e-9); /* 14 tokens / 0.5 s */
    assert_near(m[BM_REQ_S], 4, 1e-9);
    assert_near(m[BM_MEAN_OUT_LEN], 3, 0);
    assert_false(l.out_len_short);
    assert_near(m[BM_KV_PEAK_MB], 3 * 16 * 1000 / 1e6, 1e-12);
    assert_near(m[BM_STEP_GBS], 20, 1e-9); /* 4e9 bytes / 0.2 s */
    assert_near(m[BM_ROOF_PCT], 50, 1e-9);
    bench_level_free(&l);
    bench_level_free(NULL);

    make_level(&l, 4); /* asked for 4, produced 3: flagged */
    assert_true(l.out_len_short);
    bench_level_free(&l);

    /* A tail step with one sequence left reads as one stream does: the
     * roofline is over the steps that decode the whole level (2 here). */
    memset(&l, 0, sizeof l);
    make_level(&l, 3);
    bench_step *more = tk_realloc(l.steps, 3 * sizeof *l.steps);
    assert_non_null(more);
    l.steps = more;
    l.steps[2] = (bench_step){.t = 0.4, .bytes = 9000000000ull, .time = 0.1, .running = 1};
    l.n_steps = 3;
    assert_int_equal(bench_level_finalize(&l), TK_OK);
    assert_near(l.m[BM_STEP_GBS], 20, 1e-9);
    /* No step at the level's concurrency (it never filled): all of them. */
    l.concurrency = 4;
    assert_int_equal(bench_level_finalize(&l), TK_OK);
    assert_near(l.m[BM_STEP_GBS], 13e9 / 0.3 / 1e9, 1e-9);
    assert_near(l.m[BM_ROOF_PCT], 100, 1e-9); /* 43 GB/s over a 40 GB/s probe: capped */
    bench_level_free(&l);
}

/* The decode floor ratio: the same steps as the roofline, each step's floor
 * the sum over its terms of max(bytes / bandwidth, ops / the term's peak);
 * restated at another bandwidth; at least 1; NaN without terms. */
static void test_bench_level_floor(void **state) {
    (void)state;
    bench_level l;
    make_level(&l, 3);                   /* two steps of 0.1 s at the level's concurrency, read at 40 GB/s */
    assert_true(isnan(l.m[BM_X_FLOOR])); /* no terms: not known */
    l.peak_gops[TK_FLOOR_INT8] = 1000;
    /* step 0: 1 GB that only reads (25 ms at 40 GB/s) and 40 G int8 ops
     * (40 ms at 1000 GOP/s); step 1: 3 GB (75 ms) */
    l.steps[0].terms[0] = (tk_floor_term){.bytes = 1000000000ull};
    l.steps[0].terms[1] = (tk_floor_term){.ops = 40e9, .peak = TK_FLOOR_INT8};
    l.steps[1].terms[0] = (tk_floor_term){.bytes = 3000000000ull};
    const tk_floor_limits lim = {.read_gbs = 40, .peak_gops = {[TK_FLOOR_INT8] = 1000}};
    assert_near(tk_step_floor_s(l.steps[0].terms, &lim), 0.065, 1e-12);
    assert_near(tk_step_floor_s(NULL, &lim), 0, 0);
    assert_int_equal(bench_level_finalize(&l), TK_OK);
    assert_near(l.m[BM_X_FLOOR], 0.2 / 0.14, 1e-9);
    assert_int_equal(bench_level_max_running(&l), 2);
    /* a tail step of one sequence is left out, as from the roofline */
    bench_step *more = tk_realloc(l.steps, 3 * sizeof *l.steps);
    assert_non_null(more);
    l.steps = more;
    l.steps[2] = (bench_step){.t = 0.4, .bytes = 9000000000ull, .time = 0.1, .running = 1};
    l.steps[2].terms[0] = (tk_floor_term){.bytes = 9000000000ull};
    l.n_steps = 3;
    assert_int_equal(bench_level_finalize(&l), TK_OK);
    assert_near(l.m[BM_X_FLOOR], 0.2 / 0.14, 1e-9);
    assert_true(isnan(l.m[BM_X_FLOOR_MED])); /* no median pass given */
    /* a faster probe: the reads' parts halve, the int8 term's stays; at its
     * median pass (40 GB/s) the floors are the first probe's */
    bench_level_restate(&l, 80, 40);
    assert_near(l.read_bw_gbs, 80, 0);
    assert_near(l.read_bw_median_gbs, 40, 0);
    assert_near(l.m[BM_ROOF_PCT], 25, 1e-9);
    assert_near(l.m[BM_X_FLOOR], 0.2 / (0.0125 + 0.04 + 0.0375), 1e-9);
    assert_near(l.m[BM_X_FLOOR_MED], 0.2 / 0.14, 1e-9);
    /* an unknown peak leaves its part out */
    l.peak_gops[TK_FLOOR_INT8] = 0;
    bench_level_restate(&l, 80, 0);
    assert_near(l.m[BM_X_FLOOR], 0.2 / 0.05, 1e-9);
    /* steps faster than their floor: the probe under-read, shown as 1 */
    bench_level_restate(&l, 10, 10);
    assert_near(l.m[BM_X_FLOOR], 1, 0);
    assert_near(l.m[BM_X_FLOOR_MED], 1, 0);
    bench_level_free(&l);
}

static void test_bench_single_token_has_no_tpot(void **state) {
    (void)state;
    bench_request r;
    const double tok[1] = {5.5};
    bench_request_fill(&r, 5.0, 5.25, tok, 1, NULL);
    assert_int_equal(r.n_output, 1);
    assert_near(r.ttft, 0.25, 1e-12);
    assert_near(r.e2e, 0.25, 1e-12);
    assert_true(isnan(r.tpot));
    bench_request_fill(&r, 5.0, 5.25, NULL, 0, NULL);
    assert_int_equal(r.n_output, 0);
    assert_true(isnan(r.ttft) && isnan(r.e2e));
}

static void test_bench_point_median(void **state) {
    (void)state;
    bench_point p = {.concurrency = 2, .n_rep = 3};
    p.rep = tk_calloc(3, sizeof *p.rep);
    assert_non_null(p.rep);
    const double thr[3] = {10, 30, 20};
    for (int r = 0; r < 3; r++) {
        for (int k = 0; k < BM_COUNT; k++) p.rep[r].m[k] = NAN;
        p.rep[r].m[BM_OUT_TOK_S] = thr[r];
    }
    p.rep[1].out_len_short = true;
    bench_point_summarize(&p);
    assert_near(p.med[BM_OUT_TOK_S], 20, 0);
    assert_near(p.lo[BM_OUT_TOK_S], 10, 0);
    assert_near(p.hi[BM_OUT_TOK_S], 30, 0);
    assert_true(isnan(p.med[BM_TPOT_P50]));
    assert_true(p.out_len_short);
    bench_point_free(&p);
    bench_point_free(NULL);
}

/* A stream with tokens at 1.0 1.1 1.2 1.7 1.8 2.5 and the window (1.15, 1.8]:
 * the gaps ending at 1.2, 1.7 and 1.8 count (.1 .5 .1); the one ending at 1.1
 * is before it and the one ending at 2.5 after it. */
static void test_bench_window_gaps(void **state) {
    (void)state;
    const double t[] = {1.0, 1.1, 1.2, 1.7, 1.8, 2.5};
    double g[5], mean;
    size_t n = bench_window_gaps(t, 6, 1.15, 1.8, g, &mean);
    assert_int_equal(n, 3);
    assert_near(g[0], 0.1, 1e-12);
    assert_near(g[1], 0.5, 1e-12);
    assert_near(g[2], 0.1, 1e-12);
    assert_near(mean, 0.7 / 3, 1e-12);
    /* A gap that began before the window but ended in it is the window's stall. */
    n = bench_window_gaps(t, 6, 1.65, 1.75, g, &mean);
    assert_int_equal(n, 1);
    assert_near(g[0], 0.5, 1e-12);
    /* Nothing inside: NaN mean; one token has no gap. */
    assert_int_equal(bench_window_gaps(t, 6, 3, 4, g, &mean), 0);
    assert_true(isnan(mean));
    assert_int_equal(bench_window_gaps(t, 1, 0, 4, g, &mean), 0);
    assert_true(isnan(mean));
}

/* Two streams: gaps {10, 10, 50} ms (TPOT 70/3) and {10, 20} ms (TPOT 15). */
static void test_bench_bg_finalize(void **state) {
    (void)state;
    bench_level l;
    memset(&l, 0, sizeof l);
    assert_int_equal(bench_bg_finalize(&l), TK_OK); /* no streams: NaN metrics */
    for (int k = BM_BG_ITL_P50; k <= BM_BG_TPOT_RATIO; k++) assert_true(isnan(l.m[k]));
    bench_bg *b = &l.bg;
    b->n_streams = 2;
    b->stream = tk_calloc(2, sizeof *b->stream);
    b->itl = tk_calloc(5, sizeof(double));
    assert_non_null(b->stream);
    assert_non_null(b->itl);
    const double gaps[5] = {0.010, 0.010, 0.050, 0.010, 0.020};
    memcpy(b->itl, gaps, sizeof gaps);
    b->n_itl = 5;
    b->stream[0] = (bench_bg_stream){.n_window = 3, .tpot = 0.070 / 3, .itl_off = 0};
    b->stream[1] = (bench_bg_stream){.n_window = 2, .tpot = 0.015, .itl_off = 3};
    assert_int_equal(bench_bg_finalize(&l), TK_OK);
    /* sorted gaps 10 10 10 20 50: P50 10, P95 r=3.8 -> 20 + .8 x 30 = 44, P99 r=3.96 -> 48.8 */
    assert_int_equal(b->s_itl.n, 5);
    assert_near(l.m[BM_BG_ITL_P50], 10, 1e-9);
    assert_near(l.m[BM_BG_ITL_P95], 44, 1e-9);
    assert_near(l.m[BM_BG_ITL_P99], 48.8, 1e-9);
    assert_near(l.m[BM_BG_ITL_MAX], 50, 1e-9);
    assert_near(l.m[BM_BG_ITL_RATIO], 4.88, 1e-9);
    /* stream TPOTs 15 and 23.33: P50 19.17, P99 = 15 + .99 x 8.33 */
    double t1 = 70.0 / 3;
    assert_near(l.m[BM_BG_TPOT_P50], (15 + t1) / 2, 1e-9);
    assert_near(l.m[BM_BG_TPOT_P99], 15 + 0.99 * (t1 - 15), 1e-9);
    assert_near(l.m[BM_BG_TPOT_RATIO], (15 + 0.99 * (t1 - 15)) / ((15 + t1) / 2), 1e-9);
    /* The level's own finalize keeps the background metrics. */
    assert_int_equal(bench_level_finalize(&l), TK_OK);
    assert_near(l.m[BM_BG_ITL_MAX], 50, 1e-9);
    bench_level_free(&l);
    assert_null(l.bg.stream);
    assert_int_equal(l.bg.n_streams, 0);
}

static void test_bench_metric_names(void **state) {
    (void)state;
    for (int k = 0; k < BM_COUNT; k++) {
        const char *n = bench_metric_name((bench_metric)k);
        assert_non_null(n);
        assert_string_not_equal(n, "unknown");
        for (int j = 0; j < k; j++) assert_string_not_equal(n, bench_metric_name((bench_metric)j));
    }
    assert_string_equal(bench_metric_name(BM_COUNT), "unknown");
}

/* A two-series (ablation-like) result: series 1 is twice as fast. */
static void make_result(bench_result *r) {
    memset(r, 0, sizeof *r);
    r->opts.n_in = 4, r->opts.n_out = 3, r->opts.repeat = 1, r->opts.ablation = true;
    r->opts.levels[0] = 1, r->opts.levels[1] = 2, r->opts.n_levels = 2;
    snprintf(r->info.git_commit, sizeof r->info.git_commit, "abc1234");
    snprintf(r->info.model_name, sizeof r->info.model_name, "tiny");
    snprintf(r->info.cpu_brand, sizeof r->info.cpu_brand, "Test CPU");
    r->info.read_bw_gbs = 40;
    r->n_series = 2;
    for (int s = 0; s < 2; s++) {
        bench_series *sr = &r->series[s];
        snprintf(sr->label, sizeof sr->label, s ? "2 int8 weights, fast" : "1 bf16");
        snprintf(sr->weight_dtype, sizeof sr->weight_dtype, s ? "q8_0" : "bf16");
        sr->engine.kv_type = s ? TK_KV_INT8 : TK_KV_BF16;
        sr->engine.unfused = s == 0;
        sr->n_points = 2;
        sr->points = tk_calloc(2, sizeof *sr->points);
        assert_non_null(sr->points);
        for (int i = 0; i < 2; i++) {
            bench_point *p = &sr->points[i];
            p->concurrency = i + 1;
            p->n_rep = 1;
            p->rep = tk_calloc(1, sizeof *p->rep);
            assert_non_null(p->rep);
            make_level(&p->rep[0], 3);
            if (s == 1) { /* halve every latency, double every rate */
                for (int k = 0; k < BM_COUNT; k++)
                    p->rep[0].m[k] *= (k >= BM_OUT_TOK_S && k <= BM_REQ_S) ? 2 : 0.5;
            }
            bench_point_summarize(p);
        }
    }
}

static void free_result(bench_result *r) {
    for (int s = 0; s < r->n_series; s++) {
        for (int i = 0; i < r->series[s].n_points; i++) bench_point_free(&r->series[s].points[i]);
        tk_free(r->series[s].points);
    }
}

static char *read_all(const char *path) {
    FILE *f = fopen(path, "rb");
    assert_non_null(f);
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *buf = malloc((size_t)n + 1);
    assert_non_null(buf);
    assert_int_equal(fread(buf, 1, (size_t)n, f), (size_t)n);
    buf[n] = 0;
    fclose(f);
    return buf;
}

static void tmp_path(char *buf, size_t n, const char *name) {
    const char *dir = getenv("TK_TMP");
    snprintf(buf, n, "%s/test_bench_%d_%s", dir && *dir ? dir : "/tmp", (int)getpid(), name);
}

static void test_bench_ablation_ratios(void **state) {
    (void)state;
    bench_result r;
    make_result(&r);
    report_rung g;
    assert_true(report_rung_summary(&r, 1, &g));
    assert_int_equal(g.lo_level, 1);
    assert_int_equal(g.hi_level, 2);
    assert_near(g.tpot_lo_ms, 87.5 / 2, 1e-6); /* TPOT P50 of the level, halved */
    assert_near(g.tpot_lo_x, 2, 1e-9);
    assert_near(g.thr_hi_x, 2, 1e-9);
    assert_near(g.tpot_p99_hi_x, 2, 1e-9);
    assert_true(report_rung_summary(&r, 0, &g));
    assert_near(g.thr_hi_x, 1, 1e-12);
    assert_false(report_rung_summary(&r, 2, &g));
    free_result(&r);
}

static void test_bench_json_report(void **state) {
    (void)state;
    bench_result r;
    make_result(&r);
    char path[512];
    tmp_path(path, sizeof path, "r.json");
    assert_int_equal(report_json_write(&r, path), TK_OK);
    char *text = read_all(path);
    cJSON *root = cJSON_Parse(text);
    assert_non_null(root);
    assert_string_equal(cJSON_GetObjectItem(root, "git_commit")->valuestring, "abc1234");
    assert_non_null(cJSON_GetObjectItem(cJSON_GetObjectItem(root, "machine"), "probe"));
    cJSON *series = cJSON_GetObjectItem(root, "series");
    assert_int_equal(cJSON_GetArraySize(series), 2);
    cJSON *s1 = cJSON_GetArrayItem(series, 1);
    assert_string_equal(cJSON_GetObjectItem(cJSON_GetObjectItem(s1, "engine"), "kv_type")->valuestring,
                        "int8");
    cJSON *p0 = cJSON_GetArrayItem(cJSON_GetObjectItem(cJSON_GetArrayItem(series, 0), "points"), 0);
    cJSON *run = cJSON_GetArrayItem(cJSON_GetObjectItem(p0, "runs"), 0);
    cJSON *metrics = cJSON_GetObjectItem(run, "metrics");
    for (int k = 0; k < BM_COUNT; k++)
        assert_non_null(cJSON_GetObjectItem(metrics, bench_metric_name((bench_metric)k)));
    assert_near(cJSON_GetObjectItem(metrics, "tpot_mean_ms")->valuedouble, 87.5, 1e-6);
    cJSON *reqs = cJSON_GetObjectItem(run, "requests");
    assert_int_equal(cJSON_GetArraySize(reqs), 2);
    cJSON *q = cJSON_GetArrayItem(reqs, 1);
    assert_int_equal(cJSON_GetArraySize(cJSON_GetObjectItem(q, "itl_s")), 2);
    assert_near(cJSON_GetObjectItem(q, "ttft_s")->valuedouble, 0.25, 1e-9);
    assert_int_equal(cJSON_GetArraySize(cJSON_GetObjectItem(run, "decode_steps")), 2);
    cJSON *ab = cJSON_GetObjectItem(root, "ablation");
    assert_int_equal(cJSON_GetArraySize(ab), 2);
    assert_near(cJSON_GetObjectItem(cJSON_GetArrayItem(ab, 1), "output_tok_s_hi_speedup")->valuedouble, 2,
                1e-9);
    cJSON_Delete(root);
    free(text);
    unlink(path);
    free_result(&r);
}

static void test_bench_csv_and_markdown(void **state) {
    (void)state;
    bench_result r;
    make_result(&r);
    char path[512];
    tmp_path(path, sizeof path, "r.csv");
    assert_int_equal(report_csv_write(&r, path), TK_OK);
    char *text = read_all(path);
    int lines = 0;
    for (char *c = text; *c; c++) lines += *c == '\n';
    assert_int_equal(lines, 1 + 4); /* header + 2 series x 2 levels x 1 repeat */
    assert_non_null(strstr(text, "tpot_p99_ms"));
    assert_non_null(strstr(text, "\"2 int8 weights, fast\",q8_0,int8"));
    free(text);
    unlink(path);

    tmp_path(path, sizeof path, "r.md");
    /* a level of 4 whose decode steps ran 2 sequences: said so */
    r.series[1].points[1].concurrency = 4;
    FILE *f = fopen(path, "w");
    assert_non_null(f);
    report_markdown(&r, f);
    fclose(f);
    text = read_all(path);
    assert_non_null(strstr(text, "concurrency 4: at most 2 sequences decoded together"));
    assert_null(strstr(text, "concurrency 2: at most"));
    assert_non_null(strstr(text, "commit abc1234"));
    assert_non_null(strstr(text, "| concurrency | TTFT mean"));
    assert_non_null(strstr(text, "## Ablation"));
    assert_non_null(strstr(text, "Test CPU"));
    free(text);
    unlink(path);
    assert_int_equal(report_json_write(&r, "/nonexistent-dir/x.json"), TK_ERR_IO);
    free_result(&r);
}

static void test_bench_plot(void **state) {
    (void)state;
    if (system("command -v gnuplot >/dev/null 2>&1") != 0) /* a prerequisite: scripts/deps.sh installs it */
        fail_msg("gnuplot is not installed (scripts/deps.sh installs gnuplot-nox)");
    bench_result r;
    make_result(&r);
    /* A hostile model name must not break (or run code from) the script. */
    char pwned[64];
    snprintf(pwned, sizeof pwned, "/tmp/tk_bench_pwned_%d", (int)getpid());
    unlink(pwned);
    snprintf(r.info.model_name, sizeof r.info.model_name, "a\"b`touch %s`$x\nset", pwned);
    char path[512];
    tmp_path(path, sizeof path, "r.png");
    assert_int_equal(report_plot_write(&r, path), TK_OK);
    FILE *f = fopen(path, "rb");
    assert_non_null(f);
    unsigned char magic[4] = {0};
    assert_int_equal(fread(magic, 1, 4, f), 4);
    fclose(f);
    assert_memory_equal(magic, "\x89PNG", 4);
    assert_int_not_equal(access(pwned, F_OK), 0);
    unlink(path);
    assert_int_equal(report_plot_write(&r, "/tmp/bad\"name.png"), TK_ERR_INVALID);
    free_result(&r);
}

/* A run that reads faster than its probe: the roofline stops at 100% and the
 * report names the probe's shortfall with both rates. */
static void test_bench_probe_shortfall(void **state) {
    (void)state;
    bool sf = true;
    assert_near(probe_roofline_pct(20, 40, &sf), 50, 1e-12);
    assert_false(sf);
    assert_near(probe_roofline_pct(30.4, 26.6, &sf), 100, 1e-12);
    assert_true(sf);
    assert_near(probe_roofline_pct(10, 0, &sf), 0, 1e-12);
    assert_false(sf);
    bench_result r;
    make_result(&r);
    char path[512];
    tmp_path(path, sizeof path, "sf.md");
    for (int pass = 0; pass < 2; pass++) {
        r.info.read_bw_gbs = pass == 0 ? 1e6 : 1e-3; /* far above, then far below every level's rate */
        FILE *f = fopen(path, "w");
        assert_non_null(f);
        report_markdown(&r, f);
        fclose(f);
        char *text = read_all(path);
        if (pass == 0) {
            assert_null(strstr(text, "probe shortfall"));
        } else {
            assert_non_null(strstr(text, "probe shortfall: run read "));
            assert_non_null(strstr(text, " 100.0 * |"));
        }
        free(text);
    }
    unlink(path);
    free_result(&r);
}

static void test_bench_probe_sane(void **state) {
    (void)state;
    double bw = probe_read_bw(1);
    assert_true(bw > 0.5 && bw < 2000);
    probe_stats ps;
    probe_read_bw_stats(1, &ps);
    assert_true(ps.n > 2);
    assert_true(ps.min > 0 && ps.min <= ps.median && ps.median <= ps.best);
    /* the paged-read probe: KV-sized runs in a shuffled order; a run size it
     * does not take reads nothing */
    probe_read_runs_stats(1, (size_t)32 << 10, &ps);
    assert_true(ps.n > 2);
    assert_true(ps.min > 0 && ps.min <= ps.median && ps.median <= ps.best && ps.best < 2000);
    const size_t bad[] = {0, 1000, PROBE_RUN_MIN - 256, PROBE_RUN_MAX + 256, PROBE_RUN_MIN + 64};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        probe_read_runs_stats(1, bad[i], &ps);
        assert_true(ps.n == 0 && ps.best == 0 && ps.median == 0 && ps.min == 0);
    }
    double gf = probe_peak_gflops_f32(1);
    assert_true(gf > 0.1 && gf < 100000);
    double gi = probe_peak_gops_int8(1);
    assert_true(gi > 0.1 && gi < 100000);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_bench_percentile_numpy),
        cmocka_unit_test(test_bench_summary_nan_and_empty),
        cmocka_unit_test(test_bench_level_metrics),
        cmocka_unit_test(test_bench_level_floor),
        cmocka_unit_test(test_bench_single_token_has_no_tpot),
        cmocka_unit_test(test_bench_point_median),
        cmocka_unit_test(test_bench_metric_names),
        cmocka_unit_test(test_bench_ablation_ratios),
        cmocka_unit_test(test_bench_json_report),
        cmocka_unit_test(test_bench_csv_and_markdown),
        cmocka_unit_test(test_bench_plot),
        cmocka_unit_test(test_bench_probe_sane),
        cmocka_unit_test(test_bench_window_gaps),
        cmocka_unit_test(test_bench_bg_finalize),
        cmocka_unit_test(test_bench_probe_shortfall),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
