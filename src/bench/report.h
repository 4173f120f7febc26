/* Reports of a bench_result: a markdown table (stdout), JSON with every raw
 * sample, CSV with one row per measured run, and a gnuplot PNG. The writers
 * only read the result; each returns a status with a message on I/O errors. */
#ifndef TK_BENCH_REPORT_H
#define TK_BENCH_REPORT_H

#include <stdio.h>

#include "bench/bench.h"

/* Markdown: the header (machine, probe, model, options, commit), one table per
 * series, the spread over repeats when repeat > 1, and the ablation summary. */
void report_markdown(const bench_result *r, FILE *f);
/* The probe alone (tokamak bench --probe). */
void report_probe(const bench_info *info, FILE *f);
/* A "- scheduling:" line when the run is under the kernel's real-time
 * throttle (probe_rt_throttled: runtime_us > 0); nothing otherwise. */
void report_rt_throttle(int runtime_us, int period_us, FILE *f);
/* The same line for the calling thread as it runs now (probe_rt_throttled). */
void report_rt_throttle_now(FILE *f);
/* The engine's step model in words: "a step 10.80 ms + 1.85 a decode + 0.80 a
 * prefill token + 0.75 per 1,024 positions it attends to" (tk_engine_stats). */
void report_step_model(const tk_engine_stats *e, char *buf, size_t n);

tk_status report_json_write(const bench_result *r, const char *path);
tk_status report_csv_write(const bench_result *r, const char *path);
/* Runs gnuplot (must be on PATH): TPOT P50/P99 and output tokens/s against
 * concurrency (or rate). */
tk_status report_plot_write(const bench_result *r, const char *path);

/* The ablation summary of series s against series 0: TPOT at the smallest
 * level, output tok/s and P99 TPOT at the largest, and the ratios to rung 1
 * (speed-ups: >1 is better). False when a point is missing. */
typedef struct report_rung {
    int lo_level, hi_level;
    double tpot_lo_ms, thr_hi, tpot_p99_hi_ms;
    double tpot_lo_x, thr_hi_x, tpot_p99_hi_x;
    double roof_lo_pct; /* the rung's own decode roofline at lo: its floor / its TPOT */
} report_rung;
bool report_rung_summary(const bench_result *r, int s, report_rung *out);

#endif
