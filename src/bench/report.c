#include "bench/report.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "bench/probe.h"
#include "core/alloc.h"
#include "core/dtype.h"
#include "core/error.h"
#include "core/names.h"

static const char *kv_str(tk_kv_type t) { return names_str(&NAMES_KV_TYPE, (int)t); }

static const char *finish_str(tk_finish f) { return names_str(&NAMES_FINISH, (int)f); }

/* ---- markdown -------------------------------------------------------------- */

/* The step budget as the engine ran it: "time-based (target auto, cap 1024;
 * measured at the end: a step 10.80 ms + 1.85 a decode + 0.80 a prefill
 * token + 0.75 per 1,024 positions it attends to)" or "fixed 256 tokens". */
static void budget_str(const tk_engine_stats *e, char *buf, size_t n) {
    if (!e->step_adaptive) {
        snprintf(buf, n, "fixed %d tokens", e->step_tokens);
        return;
    }
    char target[32] = "auto";
    if (e->step_ms > 0) snprintf(target, sizeof target, "%g ms", e->step_ms);
    int k = snprintf(buf, n, "time-based (target %s, cap %d", target, e->step_tokens);
    if (k > 0 && (size_t)k < n &&
        (e->step_fixed_ms > 0 || e->decode_ms_per_token > 0 || e->prefill_ms_per_token > 0)) {
        char model[160];
        report_step_model(e, model, sizeof model);
        k += snprintf(buf + k, n - (size_t)k, "; measured at the end: %s", model);
    }
    if (k > 0 && (size_t)k < n) snprintf(buf + k, n - (size_t)k, ")");
}

void report_step_model(const tk_engine_stats *e, char *buf, size_t n) {
    snprintf(buf, n,
             "a step %.2f ms + %.2f a decode + %.2f a prefill token + %.2f per 1,024 positions it attends to",
             e->step_fixed_ms, e->decode_ms_per_token, e->prefill_ms_per_token, e->prefill_ms_per_kpos);
}

void report_probe(const bench_info *in, FILE *f) {
    fprintf(f, "- machine: %s, %d cores, ISA %s (%s)\n", in->cpu_brand, in->n_cores, in->isa,
            in->cpu_features[0] ? in->cpu_features : "no SIMD features");
    fprintf(
        f,
        "- probe (%d threads): read bandwidth %.1f GB/s (best pass; min %.1f, median %.1f), peak fp32 %.1f "
        "GFLOP/s, peak int8 %.1f GOP/s",
        in->probe_threads, in->read_bw_gbs, in->read_bw_min_gbs, in->read_bw_median_gbs, in->peak_gflops_f32,
        in->peak_gops_int8);
    if (in->peak_gflops_bf16 > 0) fprintf(f, ", peak BF16 dot %.1f GFLOP/s", in->peak_gflops_bf16);
    fprintf(f, "\n");
    report_rt_throttle(in->rt_runtime_us, in->rt_period_us, f);
}

void report_rt_throttle(int runtime_us, int period_us, FILE *f) {
    if (runtime_us <= 0 || period_us <= 0) return;
    const double stall_ms = 1e3 * (double)(period_us - runtime_us) / (double)period_us;
    fprintf(f, "- scheduling: a real-time class (e.g. chrt) with the kernel's real-time throttling on ");
    fprintf(f, "(%d of each %d us): threads that keep every core busy stop for the rest of each period, ",
            runtime_us, period_us);
    fprintf(f, "~%.0f ms a second, which means and tail latencies count; ", stall_ms);
    fprintf(f, "run at normal priority or under nice instead\n");
}

void report_rt_throttle_now(FILE *f) {
    int runtime_us, period_us;
    if (probe_rt_throttled(&runtime_us, &period_us)) report_rt_throttle(runtime_us, period_us, f);
}

/* A closed-loop level whose pure decode steps never ran all its requests
 * at once: its decode figures are over every decode step (bench_metrics.c),
 * and the report says how many ran together. */
static void md_unfilled(const bench_series *s, FILE *f) {
    for (int i = 0; i < s->n_points; i++) {
        const bench_point *p = &s->points[i];
        if (p->concurrency <= 0 || p->n_rep == 0) continue;
        int mx = 0;
        for (int r = 0; r < p->n_rep; r++) {
            const int m = bench_level_max_running(&p->rep[r]);
            if (r == 0 || m < mx) mx = m;
        }
        if (mx <= 0 || mx >= p->concurrency) continue;
        fprintf(f,
                "\nconcurrency %d: at most %d sequences decoded together in a pure decode step (the step "
                "budget admits queued prompts beside the running decodes; --step-ms trades their ITL for "
                "more at once), so its decode GB/s, roofline and x floor are over all its decode steps.\n",
                p->concurrency, mx);
    }
}

static void md_cell(FILE *f, double v, int prec) {
    if (isnan(v))
        fprintf(f, " - |");
    else
        fprintf(f, " %.*f |", prec, v);
}

/* The background streams of a mixed run, inside each run's foreground window. */
static void md_background(const bench_result *r, const bench_series *s, FILE *f) {
    bool rate = r->opts.n_rates > 0;
    fprintf(f,
            "\nBackground decode: %d streams (prompt %d tokens) decoding before the first foreground submit, "
            "measured from it to the last foreground finish:\n\n",
            r->opts.n_bg, r->opts.bg_in);
    fprintf(f,
            "| %s | window s | gaps | ITL P50 | ITL P95 | ITL P99 | ITL max (longest stall) | ITL P99/P50 | "
            "TPOT P50 | TPOT P99 | TPOT P99/P50 | preempted |\n"
            "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n",
            rate ? "rate (req/s)" : "concurrency");
    bool any_exhausted = false;
    for (int i = 0; i < s->n_points; i++) {
        const bench_point *p = &s->points[i];
        if (rate)
            fprintf(f, "| %g |", p->rate);
        else
            fprintf(f, "| %d |", p->concurrency);
        size_t gaps = 0;
        int preempted = 0;
        double window = 0;
        bool exhausted = false;
        for (int k = 0; k < p->n_rep; k++) {
            const bench_bg *b = &p->rep[k].bg;
            gaps += b->n_itl;
            window += b->w1 - b->w0;
            exhausted |= b->exhausted;
            for (int j = 0; j < b->n_streams; j++) preempted += b->stream[j].n_preempted;
        }
        any_exhausted |= exhausted;
        md_cell(f, p->n_rep ? window / p->n_rep : NAN, 2);
        fprintf(f, " %zu%s |", gaps, exhausted ? " !" : "");
        static const bench_metric bm[] = {BM_BG_ITL_P50, BM_BG_ITL_P95, BM_BG_ITL_P99, BM_BG_ITL_MAX};
        for (size_t k = 0; k < sizeof bm / sizeof bm[0]; k++) md_cell(f, p->med[bm[k]], 2);
        md_cell(f, p->med[BM_BG_ITL_RATIO], 2);
        md_cell(f, p->med[BM_BG_TPOT_P50], 2);
        md_cell(f, p->med[BM_BG_TPOT_P99], 2);
        md_cell(f, p->med[BM_BG_TPOT_RATIO], 2);
        fprintf(f, " %d |\n", preempted);
    }
    fprintf(
        f,
        "\nLatencies in ms (median over repeats; window and gaps: mean window, all gaps of all repeats). "
        "ITL: "
        "every gap between two tokens of a stream that ended inside the window; TPOT: one value per stream, "
        "the mean of its gaps in the window.\n");
    if (any_exhausted)
        fprintf(
            f,
            "\n**!** a background stream stopped inside the window (--bg-out %d too small): fewer streams "
            "decoded than asked for part of it.\n",
            r->opts.bg_out);
}

/* Failed requests of each point, by status, with the first message of each kind. */
static void md_errors(const bench_series *s, bool rate, FILE *f) {
    bool any = false;
    for (int i = 0; i < s->n_points; i++)
        for (int k = 0; k < s->points[i].n_rep; k++) any |= s->points[i].rep[k].err.total > 0;
    if (!any) return;
    fprintf(
        f, "\n**Errors** (all repeats):\n\n| %s | status | requests | first message |\n|---:|---|---:|---|\n",
        rate ? "rate (req/s)" : "concurrency");
    for (int i = 0; i < s->n_points; i++) {
        const bench_point *p = &s->points[i];
        bench_errors sum = {0};
        for (int k = 0; k < p->n_rep; k++) {
            const bench_errors *e = &p->rep[k].err;
            for (int j = 0; j < e->n_kinds; j++)
                for (int c = 0; c < e->kind[j].count; c++)
                    bench_errors_add(&sum, e->kind[j].status, e->kind[j].message);
        }
        for (int j = 0; j < sum.n_kinds; j++) {
            char buf[16], msg[sizeof sum.kind[j].message];
            /* A table cell: no pipes or line breaks from a server's message. */
            snprintf(msg, sizeof msg, "%s", sum.kind[j].message);
            for (char *c = msg; *c; c++)
                if (*c == '|' || *c == '\n' || *c == '\r') *c = ' ';
            if (rate)
                fprintf(f, "| %g |", p->rate);
            else
                fprintf(f, "| %d |", p->concurrency);
            fprintf(f, " %s | %d | %s |\n", bench_error_kind_name(sum.kind[j].status, buf, sizeof buf),
                    sum.kind[j].count, msg);
        }
    }
}

static void md_series(const bench_result *r, const bench_series *s, FILE *f) {
    const tk_engine_stats *e = &s->engine;
    char budget[256];
    budget_str(e, budget, sizeof budget);
    if (r->remote.on)
        fprintf(f, "\n## %s\n\nseen from the client: the server's configuration is its own\n\n", s->label);
    else
        fprintf(
            f,
            "\n## %s\n\nweights %s, KV %s%s, %s kernels, %s batching, %s prefill, block %d, step budget %s, "
            "max batch %d, %d threads\n\n",
            s->label, s->weight_dtype[0] ? s->weight_dtype : "?", kv_str(e->kv_type),
            e->kv_type == TK_KV_INT8
                ? (e->kv_scale == TK_KV_SCALE_TOKEN ? " (per-token scales)" : " (per-head scales)")
                : "",
            e->unfused ? "unfused" : "fused", e->static_batching ? "static" : "continuous",
            e->no_chunking ? "whole" : "chunked", e->block_size, budget, e->max_batch, e->n_threads);
    bool rate = r->opts.n_rates > 0;
    fprintf(
        f,
        "| %s | TTFT mean | TTFT P50 | TTFT P95 | TTFT P99 | TPOT mean | TPOT P50 | TPOT P95 | TPOT P99 | "
        "ITL P50 | ITL P95 | ITL P99 | E2E mean | E2E P99 | out tok/s | total tok/s | req/s | out len | "
        "errors | KV peak MB | decode GB/s | roofline %% | x floor |\n",
        rate ? "rate (req/s)" : "concurrency");
    fprintf(f, "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|--"
               "-:|---:|---:|---:|---:|\n");
    bool any_short = false, any_under = false;
    double over_gbs = 0; /* the fastest decode read above the probe, if any */
    for (int i = 0; i < s->n_points; i++) {
        const bench_point *p = &s->points[i];
        const double *m = p->med;
        if (rate)
            fprintf(f, "| %g |", p->rate);
        else
            fprintf(f, "| %d |", p->concurrency);
        static const bench_metric lat[] = {BM_TTFT_MEAN, BM_TTFT_P50, BM_TTFT_P95, BM_TTFT_P99, BM_TPOT_MEAN,
                                           BM_TPOT_P50,  BM_TPOT_P95, BM_TPOT_P99, BM_ITL_P50,  BM_ITL_P95,
                                           BM_ITL_P99,   BM_E2E_MEAN, BM_E2E_P99};
        for (size_t k = 0; k < sizeof lat / sizeof lat[0]; k++) md_cell(f, m[lat[k]], 2);
        md_cell(f, m[BM_OUT_TOK_S], 1);
        md_cell(f, m[BM_TOTAL_TOK_S], 1);
        md_cell(f, m[BM_REQ_S], 3);
        fprintf(f, " %.1f%s |", m[BM_MEAN_OUT_LEN], p->out_len_short ? " !" : "");
        any_short |= p->out_len_short;
        md_cell(f, m[BM_ERRORS], 0);
        md_cell(f, m[BM_KV_PEAK_MB], 1);
        md_cell(f, m[BM_STEP_GBS], 2);
        bool shortfall = false;
        probe_roofline_pct(m[BM_STEP_GBS], r->info.read_bw_gbs, &shortfall);
        if (shortfall) {
            fprintf(f, " 100.0 * |");
            if (m[BM_STEP_GBS] > over_gbs) over_gbs = m[BM_STEP_GBS];
        } else {
            md_cell(f, m[BM_ROOF_PCT], 1);
        }
        if (m[BM_X_FLOOR] == 1.0) { /* capped: the steps beat their floor */
            fprintf(f, " 1.00 * |");
            any_under = true;
        } else {
            md_cell(f, m[BM_X_FLOOR], 2);
        }
        fprintf(f, "\n");
    }
    if (r->remote.on)
        fprintf(f,
                "\nLatencies in ms, from client-side timestamps: a token arrives with the stream frame that "
                "carries it; output lengths are the server's usage counts.\n");
    else
        fprintf(f,
                "\nLatencies in ms. Roofline: bytes the decode steps read (weights + KV) / their time, as a "
                "share "
                "of the %.1f GB/s read bandwidth probed by this run. x floor: the decode steps' time over "
                "their floor, the sum over each step's stages of max(bytes / that bandwidth, operations / "
                "the peak the stage's multiply-adds run at), as tokamak profile counts them; 1.00 is the "
                "machine's limit (a step that computes more than it reads is judged by the peak).\n",
                r->info.read_bw_gbs);
    if (over_gbs > 0)
        fprintf(f,
                "\n**\\*** probe shortfall: run read %.1f GB/s > probe %.1f GB/s. The probe under-read this "
                "machine: a roofline above it is shown as 100%%.\n",
                over_gbs, r->info.read_bw_gbs);
    if (!r->remote.on && r->info.read_bw_median_gbs > 0) {
        fprintf(f, "\nx floor at the probe's median pass (%.1f GB/s, what the machine gave most of the run):",
                r->info.read_bw_median_gbs);
        for (int i = 0; i < s->n_points; i++) {
            const bench_point *p = &s->points[i];
            if (rate)
                fprintf(f, "%s rate %g: ", i ? ";" : "", p->rate);
            else
                fprintf(f, "%s concurrency %d: ", i ? ";" : "", p->concurrency);
            if (isnan(p->med[BM_X_FLOOR_MED]))
                fprintf(f, "-");
            else
                fprintf(f, "%.2f", p->med[BM_X_FLOOR_MED]);
        }
        fprintf(f, ".\n");
    }
    if (any_under)
        fprintf(f,
                "\n**\\*** x floor: the decode steps took less than their floor at this run's probe, which "
                "under-read the machine; shown as 1.00.\n");
    if (any_short)
        fprintf(f,
                "\n**!** some request produced a different number of tokens than --out %d: its level's "
                "throughput and TPOT are not comparable.\n",
                r->opts.n_out);
    md_unfilled(s, f);
    md_errors(s, rate, f);
    if (r->opts.n_bg > 0) md_background(r, s, f);
    if (r->opts.repeat > 1) {
        fprintf(f,
                "\nSpread over %d repeats (median, min-max):\n\n| %s | TTFT P50 | TPOT P50 | TPOT P99 | out "
                "tok/s "
                "| roofline %% | x floor |\n|---:|---:|---:|---:|---:|---:|---:|\n",
                r->opts.repeat, rate ? "rate" : "concurrency");
        static const bench_metric sp[] = {BM_TTFT_P50,  BM_TPOT_P50, BM_TPOT_P99,
                                          BM_OUT_TOK_S, BM_ROOF_PCT, BM_X_FLOOR};
        for (int i = 0; i < s->n_points; i++) {
            const bench_point *p = &s->points[i];
            if (rate)
                fprintf(f, "| %g |", p->rate);
            else
                fprintf(f, "| %d |", p->concurrency);
            for (size_t k = 0; k < sizeof sp / sizeof sp[0]; k++)
                fprintf(f, " %.2f (%.2f-%.2f) |", p->med[sp[k]], p->lo[sp[k]], p->hi[sp[k]]);
            fprintf(f, "\n");
        }
    }
}

static const bench_point *point_at_level(const bench_series *s, bool want_max, int *level) {
    const bench_point *best = NULL;
    for (int i = 0; i < s->n_points; i++) {
        const bench_point *p = &s->points[i];
        if (p->n_rep == 0 || p->concurrency <= 0) continue;
        if (!best || (want_max ? p->concurrency > best->concurrency : p->concurrency < best->concurrency))
            best = p;
    }
    if (best) *level = best->concurrency;
    return best;
}

/* The median over the repeats both points ran of p's metric k against
 * base's in the same repeat (base / p where a lower value is better); NAN
 * when no repeat has both. */
static double rung_ratio(const bench_point *base, const bench_point *p, bench_metric k, bool lower_better) {
    double v[64];
    size_t n = 0;
    for (int r = 0; r < base->n_rep && r < p->n_rep && n < 64; r++) {
        double b = base->rep[r].m[k], x = p->rep[r].m[k];
        double q = lower_better ? b / x : x / b;
        if (isfinite(q)) v[n++] = q;
    }
    stats_summary s;
    return n > 0 && stats_summarize(v, n, &s) == TK_OK ? s.p50 : NAN;
}

bool report_rung_summary(const bench_result *r, int s, report_rung *o) {
    if (s < 0 || s >= r->n_series || r->n_series < 1) return false;
    int lo0, hi0;
    const bench_point *l0 = point_at_level(&r->series[0], false, &lo0);
    const bench_point *h0 = point_at_level(&r->series[0], true, &hi0);
    const bench_point *l = point_at_level(&r->series[s], false, &o->lo_level);
    const bench_point *h = point_at_level(&r->series[s], true, &o->hi_level);
    if (!l0 || !h0 || !l || !h) return false;
    o->tpot_lo_ms = l->med[BM_TPOT_P50];
    o->thr_hi = h->med[BM_OUT_TOK_S];
    o->tpot_p99_hi_ms = h->med[BM_TPOT_P99];
    o->roof_lo_pct = l->med[BM_ROOF_PCT];
    /* Speed-ups: the time ratios are inverted so that > 1 always means
     * better; each the median over the repeats (the ladder's rounds) of the
     * rung's value against rung 1's in the same round. */
    o->tpot_lo_x = rung_ratio(l0, l, BM_TPOT_P50, true);
    o->thr_hi_x = rung_ratio(h0, h, BM_OUT_TOK_S, false);
    o->tpot_p99_hi_x = rung_ratio(h0, h, BM_TPOT_P99, true);
    return true;
}

/* The load options both tools share. */
static void md_load_opts(const bench_opts *o, const bench_remote *rm, FILE *f) {
    fprintf(f, "--in %d --out %d, ", o->n_in, o->n_out);
    if (rm->duration_s > 0)
        fprintf(f, "requests for %g s per run", rm->duration_s);
    else if (o->requests > 0)
        fprintf(f, "%d requests per level", o->requests);
    else
        fprintf(f, "requests per level: %d x concurrency (16 per rate)",
                o->requests_x > 0 ? o->requests_x : 2);
    fprintf(f, ", warmup %d, repeat %d, seed %llu", o->warmup, o->repeat, (unsigned long long)o->seed);
}

static void md_remote_header(const bench_result *r, FILE *f) {
    const bench_info *in = &r->info;
    const bench_opts *o = &r->opts;
    fprintf(f, "# tokamak loadgen\n\n");
    fprintf(f, "- server: %s, model %s (streaming /v1/completions, temperature 0, ignore_eos)\n",
            r->remote.url, r->remote.model);
    fprintf(f, "- prompts: %s\n", r->remote.prompts);
    fprintf(f, "- client: %s, %d cores\n", in->cpu_brand, in->n_cores);
    fprintf(f, "- options: ");
    md_load_opts(o, &r->remote, f);
    fprintf(f, "\n");
    if (o->n_bg > 0)
        fprintf(
            f, "- mixed load: --background %d streams, --bg-in %d, --bg-out %d (closed when each run ends)\n",
            o->n_bg, o->bg_in, o->bg_out);
    fprintf(f, "- commit %s, %s\n", in->git_commit, in->date);
}

void report_markdown(const bench_result *r, FILE *f) {
    const bench_info *in = &r->info;
    const bench_opts *o = &r->opts;
    const tk_engine_opts *e = &o->engine;
    if (r->remote.on) {
        md_remote_header(r, f);
        for (int i = 0; i < r->n_series; i++) md_series(r, &r->series[i], f);
        return;
    }
    fprintf(f, "# tokamak bench%s\n\n", o->ablation ? " --ablation" : "");
    report_probe(in, f);
    fprintf(
        f,
        "- model: %s (%s, %s, %s weights, %.3f B params, %.1f MB; a decode token reads %.1f MB of weights + "
        "%.1f KB of f16 KV per context token)\n",
        in->model_path, in->model_name, in->model_arch, in->model_dtype, (double)in->n_params / 1e9,
        (double)in->weight_bytes / 1e6, (double)in->decode_bytes / 1e6, (double)in->kv_bytes_per_token / 1e3);
    char threads[16] = "auto";
    if (e->n_threads > 0) snprintf(threads, sizeof threads, "%d", e->n_threads);
    fprintf(f, "- options: ");
    md_load_opts(o, &r->remote, f);
    char repack[80] = "";
    if (o->model.repack != TK_WEIGHTS_KEEP && !o->ablation)
        snprintf(repack, sizeof repack, ", weights repacked to %s", tk_weight_type_name(o->model.repack));
    if (o->model.repack_output != TK_WEIGHTS_KEEP && !o->ablation)
        snprintf(repack + strlen(repack), sizeof repack - strlen(repack), ", output layer %s",
                 tk_weight_type_name(o->model.repack_output));
    char step[64];
    if (e->step_ms > 0 && e->step_tokens > 0)
        snprintf(step, sizeof step, "--step-ms %g --step-tokens %d (cap)", e->step_ms, e->step_tokens);
    else if (e->step_ms > 0)
        snprintf(step, sizeof step, "--step-ms %g", e->step_ms);
    else if (e->step_tokens > 0)
        snprintf(step, sizeof step, "--step-tokens %d (fixed)", e->step_tokens);
    else
        snprintf(step, sizeof step, "time-based, automatic target (engine default)");
    fprintf(f, "; engine: threads %s%s, ctx %d, block %d, max batch %d, step budget %s, KV %s%s%s%s%s\n",
            threads, e->pin_threads ? " pinned" : "", e->ctx, e->block_size, e->max_batch, step,
            kv_str(e->kv_type), e->unfused ? ", unfused" : "", e->static_batching ? ", static batching" : "",
            e->no_chunking ? ", no chunking" : "", repack);
    if (o->n_bg > 0)
        fprintf(
            f,
            "- mixed load: --background %d streams, --bg-in %d, --bg-out %d (cancelled when each run ends)\n",
            o->n_bg, o->bg_in, o->bg_out);
    fprintf(f, "- commit %s, %s\n", in->git_commit, in->date);
    for (int i = 0; i < r->n_series; i++) md_series(r, &r->series[i], f);
    if (o->ablation && r->n_series > 0) {
        fprintf(f,
                "\n## Ablation (speed-up against rung 1; > 1 is better)\n\n| rung | TPOT P50 @lo (ms) | x | "
                "roofline @lo | out tok/s @hi | x | TPOT P99 @hi (ms) | x |\n"
                "|---|---:|---:|---:|---:|---:|---:|---:|\n");
        for (int s = 0; s < r->n_series; s++) {
            report_rung g;
            if (!report_rung_summary(r, s, &g)) continue;
            fprintf(f, "| %s | %.2f | %.2f | %.0f%% | %.1f | %.2f | %.2f | %.2f |\n", r->series[s].label,
                    g.tpot_lo_ms, g.tpot_lo_x, g.roof_lo_pct, g.thr_hi, g.thr_hi_x, g.tpot_p99_hi_ms,
                    g.tpot_p99_hi_x);
        }
        report_rung g;
        if (report_rung_summary(r, 0, &g)) {
            fprintf(f,
                    "\nlo = concurrency %d, hi = concurrency %d; roofline: the rung's own decode floor (the "
                    "bytes "
                    "its weights and KV make a step read, at the probe's bandwidth) / its TPOT.",
                    g.lo_level, g.hi_level);
            if (o->repeat > 1)
                fprintf(f,
                        " %d rounds, the rungs' order reversed every other round; values are medians over "
                        "the rounds, each x the median of the rung's ratios to rung 1 in the same round.",
                        o->repeat);
            fprintf(f, "\n");
        }
    }
}

/* ---- JSON ------------------------------------------------------------------ */

/* JSON has no NaN: missing values are null. */
static void js_num(cJSON *o, const char *k, double v) {
    if (isfinite(v))
        cJSON_AddNumberToObject(o, k, v);
    else
        cJSON_AddNullToObject(o, k);
}

static cJSON *js_summary(const stats_summary *s) {
    cJSON *o = cJSON_CreateObject();
    cJSON_AddNumberToObject(o, "n", (double)s->n);
    js_num(o, "mean", s->mean);
    js_num(o, "min", s->min);
    js_num(o, "p50", s->p50);
    js_num(o, "p90", s->p90);
    js_num(o, "p95", s->p95);
    js_num(o, "p99", s->p99);
    js_num(o, "max", s->max);
    return o;
}

static cJSON *js_metrics(const double *m) {
    cJSON *o = cJSON_CreateObject();
    for (int k = 0; k < BM_COUNT; k++) js_num(o, bench_metric_name((bench_metric)k), m[k]);
    return o;
}

static cJSON *js_background(const bench_bg *b) {
    cJSON *o = cJSON_CreateObject();
    cJSON_AddNumberToObject(o, "n_streams", b->n_streams);
    cJSON_AddNumberToObject(o, "n_prompt", b->n_prompt);
    js_num(o, "window_start_s", b->w0);
    js_num(o, "window_end_s", b->w1);
    cJSON_AddBoolToObject(o, "exhausted", b->exhausted);
    cJSON_AddItemToObject(o, "itl_s", js_summary(&b->s_itl));
    cJSON_AddItemToObject(o, "tpot_s", js_summary(&b->s_tpot));
    cJSON *arr = cJSON_AddArrayToObject(o, "streams");
    for (int i = 0; i < b->n_streams; i++) {
        const bench_bg_stream *q = &b->stream[i];
        cJSON *j = cJSON_CreateObject();
        cJSON_AddNumberToObject(j, "n_output", q->n_output);
        cJSON_AddNumberToObject(j, "n_window", q->n_window);
        js_num(j, "tpot_s", q->tpot);
        cJSON_AddNumberToObject(j, "n_preempted", q->n_preempted);
        cJSON_AddStringToObject(j, "finish", finish_str(q->finish));
        cJSON *itl = cJSON_AddArrayToObject(j, "itl_s");
        for (int k = 0; k < q->n_window && q->itl_off + (size_t)k < b->n_itl; k++)
            cJSON_AddItemToArray(itl, cJSON_CreateNumber(b->itl[q->itl_off + (size_t)k]));
        cJSON_AddItemToArray(arr, j);
    }
    return o;
}

static cJSON *js_level(const bench_level *l) {
    cJSON *o = cJSON_CreateObject();
    cJSON_AddItemToObject(o, "metrics", js_metrics(l->m));
    cJSON_AddItemToObject(o, "ttft_s", js_summary(&l->s_ttft));
    cJSON_AddItemToObject(o, "tpot_s", js_summary(&l->s_tpot));
    cJSON_AddItemToObject(o, "itl_s", js_summary(&l->s_itl));
    cJSON_AddItemToObject(o, "e2e_s", js_summary(&l->s_e2e));
    cJSON_AddBoolToObject(o, "output_length_mismatch", l->out_len_short);
    cJSON_AddNumberToObject(o, "asked_output_len", l->n_asked_out);
    js_num(o, "duration_s", l->t_end - l->t_start);
    cJSON_AddNumberToObject(o, "kv_blocks_peak", l->kv_blocks_peak);
    cJSON_AddNumberToObject(o, "kv_blocks_total", l->kv_blocks_total);
    cJSON_AddNumberToObject(o, "block_size", l->block_size);
    cJSON_AddNumberToObject(o, "kv_bytes_per_token", (double)l->kv_bytes_per_token);
    js_num(o, "read_bw_gbs", l->read_bw_gbs);
    js_num(o, "read_bw_median_gbs", l->read_bw_median_gbs);
    cJSON *reqs = cJSON_AddArrayToObject(o, "requests");
    for (int i = 0; i < l->n_requests; i++) {
        const bench_request *q = &l->req[i];
        cJSON *j = cJSON_CreateObject();
        js_num(j, "t_submit_s", q->t_submit);
        js_num(j, "t_first_s", q->t_first);
        js_num(j, "t_last_s", q->t_last);
        js_num(j, "ttft_s", q->ttft);
        js_num(j, "tpot_s", q->tpot);
        js_num(j, "e2e_s", q->e2e);
        cJSON_AddNumberToObject(j, "n_prompt", q->n_prompt);
        cJSON_AddNumberToObject(j, "n_output", q->n_output);
        cJSON_AddNumberToObject(j, "n_preempted", q->n_preempted);
        cJSON_AddStringToObject(j, "finish", finish_str(q->finish));
        cJSON *itl = cJSON_AddArrayToObject(j, "itl_s");
        /* Gaps were kept for at most n_asked_out + 1 tokens (the slot's buffer). */
        int kept = q->n_output < l->n_asked_out + 1 ? q->n_output : l->n_asked_out + 1;
        int n_itl = kept > 1 ? kept - 1 : 0;
        for (int k = 0; k < n_itl && q->itl_off + (size_t)k < l->n_itl; k++)
            cJSON_AddItemToArray(itl, cJSON_CreateNumber(l->itl[q->itl_off + (size_t)k]));
        cJSON_AddItemToArray(reqs, j);
    }
    if (l->bg.n_streams > 0) cJSON_AddItemToObject(o, "background", js_background(&l->bg));
    cJSON *errs = cJSON_AddArrayToObject(o, "errors");
    for (int i = 0; i < l->err.n_kinds; i++) {
        const bench_error_kind *k = &l->err.kind[i];
        char buf[16];
        cJSON *j = cJSON_CreateObject();
        cJSON_AddStringToObject(j, "status", bench_error_kind_name(k->status, buf, sizeof buf));
        cJSON_AddNumberToObject(j, "count", k->count);
        cJSON_AddStringToObject(j, "message", k->message);
        cJSON_AddItemToArray(errs, j);
    }
    const tk_floor_limits lim = bench_level_limits(l);
    js_num(o, "peak_gflops_f32", l->peak_gops[TK_FLOOR_F32]);
    js_num(o, "peak_gops_int8", l->peak_gops[TK_FLOOR_INT8]);
    js_num(o, "peak_gflops_bf16", l->peak_gops[TK_FLOOR_BF16]);
    cJSON_AddNumberToObject(o, "max_decoding", bench_level_max_running(l));
    cJSON *steps = cJSON_AddArrayToObject(o, "decode_steps");
    for (size_t i = 0; i < l->n_steps; i++) {
        cJSON *j = cJSON_CreateObject();
        cJSON_AddNumberToObject(j, "t_s", l->steps[i].t);
        cJSON_AddNumberToObject(j, "bytes", (double)l->steps[i].bytes);
        cJSON_AddNumberToObject(j, "time_s", l->steps[i].time);
        cJSON_AddNumberToObject(j, "running", l->steps[i].running);
        js_num(j, "floor_s", tk_step_floor_s(l->steps[i].terms, &lim));
        cJSON_AddItemToArray(steps, j);
    }
    return o;
}

static cJSON *js_engine(const bench_series *s) {
    const tk_engine_stats *e = &s->engine;
    cJSON *o = cJSON_CreateObject();
    cJSON_AddStringToObject(o, "weight_dtype", s->weight_dtype);
    cJSON_AddStringToObject(o, "kv_type", kv_str(e->kv_type));
    cJSON_AddStringToObject(o, "kv_scale", names_str(&NAMES_KV_SCALE, (int)e->kv_scale));
    cJSON_AddBoolToObject(o, "unfused", e->unfused);
    cJSON_AddBoolToObject(o, "static_batching", e->static_batching);
    cJSON_AddBoolToObject(o, "no_chunking", e->no_chunking);
    cJSON_AddNumberToObject(o, "step_tokens", e->step_tokens);
    cJSON_AddBoolToObject(o, "step_adaptive", e->step_adaptive);
    cJSON_AddNumberToObject(o, "step_ms", e->step_ms);
    cJSON_AddNumberToObject(o, "step_fixed_ms", e->step_fixed_ms);
    cJSON_AddNumberToObject(o, "decode_ms_per_token", e->decode_ms_per_token);
    cJSON_AddNumberToObject(o, "prefill_ms_per_token", e->prefill_ms_per_token);
    cJSON_AddNumberToObject(o, "prefill_ms_per_kpos", e->prefill_ms_per_kpos);
    cJSON_AddNumberToObject(o, "max_batch", e->max_batch);
    cJSON_AddNumberToObject(o, "n_threads", e->n_threads);
    cJSON_AddNumberToObject(o, "block_size", e->block_size);
    cJSON_AddNumberToObject(o, "kv_blocks_total", e->kv_blocks_total);
    cJSON_AddNumberToObject(o, "kv_bytes_per_token", (double)e->kv_bytes_per_token);
    return o;
}

static cJSON *js_result(const bench_result *r) {
    const bench_info *in = &r->info;
    const bench_opts *o = &r->opts;
    cJSON *root = cJSON_CreateObject();
    cJSON_AddStringToObject(root, "tool", r->remote.on ? "tokamak loadgen" : "tokamak bench");
    if (r->remote.on) {
        cJSON *sv = cJSON_AddObjectToObject(root, "server");
        cJSON_AddStringToObject(sv, "url", r->remote.url);
        cJSON_AddStringToObject(sv, "model", r->remote.model);
        cJSON_AddStringToObject(sv, "prompts", r->remote.prompts);
        js_num(sv, "duration_s", r->remote.duration_s);
    }
    cJSON_AddStringToObject(root, "version", TK_VERSION);
    cJSON_AddStringToObject(root, "git_commit", in->git_commit);
    cJSON_AddStringToObject(root, "date", in->date);
    cJSON *mc = cJSON_AddObjectToObject(root, "machine");
    cJSON_AddStringToObject(mc, "cpu", in->cpu_brand);
    cJSON_AddStringToObject(mc, "features", in->cpu_features);
    cJSON_AddStringToObject(mc, "isa", in->isa);
    cJSON_AddNumberToObject(mc, "n_cores", in->n_cores);
    cJSON *pr = cJSON_AddObjectToObject(mc, "probe");
    cJSON_AddNumberToObject(pr, "threads", in->probe_threads);
    js_num(pr, "read_bw_gbs", in->read_bw_gbs);
    js_num(pr, "read_bw_min_gbs", in->read_bw_min_gbs);
    js_num(pr, "read_bw_median_gbs", in->read_bw_median_gbs);
    js_num(pr, "peak_gflops_f32", in->peak_gflops_f32);
    js_num(pr, "peak_gops_int8", in->peak_gops_int8);
    js_num(pr, "peak_gflops_bf16", in->peak_gflops_bf16);
    if (in->rt_runtime_us > 0) {
        cJSON *rt = cJSON_AddObjectToObject(mc, "rt_throttle");
        cJSON_AddNumberToObject(rt, "runtime_us", in->rt_runtime_us);
        cJSON_AddNumberToObject(rt, "period_us", in->rt_period_us);
    } else {
        cJSON_AddNullToObject(mc, "rt_throttle");
    }
    cJSON *md = cJSON_AddObjectToObject(root, "model");
    cJSON_AddStringToObject(md, "path", in->model_path);
    cJSON_AddStringToObject(md, "name", in->model_name);
    cJSON_AddStringToObject(md, "arch", in->model_arch);
    cJSON_AddStringToObject(md, "weight_dtype", in->model_dtype);
    cJSON_AddNumberToObject(md, "n_params", (double)in->n_params);
    cJSON_AddNumberToObject(md, "weight_bytes", (double)in->weight_bytes);
    cJSON_AddNumberToObject(md, "decode_bytes", (double)in->decode_bytes);
    cJSON_AddNumberToObject(md, "kv_bytes_per_token_f16", (double)in->kv_bytes_per_token);
    cJSON *op = cJSON_AddObjectToObject(root, "options");
    cJSON_AddNumberToObject(op, "in", o->n_in);
    cJSON_AddNumberToObject(op, "out", o->n_out);
    cJSON *lv = cJSON_AddArrayToObject(op, "batch");
    for (int i = 0; i < o->n_levels && o->n_rates == 0; i++)
        cJSON_AddItemToArray(lv, cJSON_CreateNumber(o->levels[i]));
    cJSON *rt = cJSON_AddArrayToObject(op, "rate");
    for (int i = 0; i < o->n_rates; i++) cJSON_AddItemToArray(rt, cJSON_CreateNumber(o->rates[i]));
    cJSON_AddNumberToObject(op, "requests", o->requests);
    cJSON_AddNumberToObject(op, "requests_x", o->requests_x);
    cJSON_AddNumberToObject(op, "warmup", o->warmup);
    cJSON_AddNumberToObject(op, "repeat", o->repeat);
    cJSON_AddNumberToObject(op, "seed", (double)o->seed);
    cJSON_AddBoolToObject(op, "ablation", o->ablation);
    cJSON_AddNumberToObject(op, "threads", o->engine.n_threads);
    cJSON_AddBoolToObject(op, "pin_threads", o->engine.pin_threads);
    cJSON_AddNumberToObject(op, "ctx", o->engine.ctx);
    cJSON_AddNumberToObject(op, "block_size", o->engine.block_size);
    cJSON_AddNumberToObject(op, "max_batch", o->engine.max_batch);
    cJSON_AddNumberToObject(op, "step_tokens", o->engine.step_tokens);
    cJSON_AddNumberToObject(op, "step_ms", o->engine.step_ms);
    cJSON_AddNumberToObject(op, "kv_mem", (double)o->engine.kv_mem);
    cJSON_AddNumberToObject(op, "background", o->n_bg);
    cJSON_AddNumberToObject(op, "bg_in", o->bg_in);
    cJSON_AddNumberToObject(op, "bg_out", o->bg_out);
    cJSON *ser = cJSON_AddArrayToObject(root, "series");
    for (int s = 0; s < r->n_series; s++) {
        const bench_series *sr = &r->series[s];
        cJSON *js = cJSON_CreateObject();
        cJSON_AddStringToObject(js, "label", sr->label);
        cJSON_AddStringToObject(js, "repack", tk_weight_type_name(sr->repack));
        cJSON_AddStringToObject(js, "repack_output", tk_weight_type_name(sr->repack_output));
        if (!r->remote.on) cJSON_AddItemToObject(js, "engine", js_engine(sr));
        cJSON *pts = cJSON_AddArrayToObject(js, "points");
        for (int i = 0; i < sr->n_points; i++) {
            const bench_point *p = &sr->points[i];
            cJSON *jp = cJSON_CreateObject();
            cJSON_AddNumberToObject(jp, "concurrency", p->concurrency);
            cJSON_AddNumberToObject(jp, "rate", p->rate);
            cJSON_AddBoolToObject(jp, "output_length_mismatch", p->out_len_short);
            cJSON_AddItemToObject(jp, "median", js_metrics(p->med));
            cJSON_AddItemToObject(jp, "min", js_metrics(p->lo));
            cJSON_AddItemToObject(jp, "max", js_metrics(p->hi));
            cJSON *runs = cJSON_AddArrayToObject(jp, "runs");
            for (int k = 0; k < p->n_rep; k++) cJSON_AddItemToArray(runs, js_level(&p->rep[k]));
            cJSON_AddItemToArray(pts, jp);
        }
        cJSON_AddItemToArray(ser, js);
    }
    if (o->ablation) {
        cJSON *ab = cJSON_AddArrayToObject(root, "ablation");
        for (int s = 0; s < r->n_series; s++) {
            report_rung g;
            if (!report_rung_summary(r, s, &g)) continue;
            cJSON *j = cJSON_CreateObject();
            cJSON_AddStringToObject(j, "rung", r->series[s].label);
            cJSON_AddNumberToObject(j, "lo_concurrency", g.lo_level);
            cJSON_AddNumberToObject(j, "hi_concurrency", g.hi_level);
            js_num(j, "tpot_p50_lo_ms", g.tpot_lo_ms);
            js_num(j, "tpot_p50_lo_speedup", g.tpot_lo_x);
            js_num(j, "roofline_pct_lo", g.roof_lo_pct);
            js_num(j, "output_tok_s_hi", g.thr_hi);
            js_num(j, "output_tok_s_hi_speedup", g.thr_hi_x);
            js_num(j, "tpot_p99_hi_ms", g.tpot_p99_hi_ms);
            js_num(j, "tpot_p99_hi_speedup", g.tpot_p99_hi_x);
            cJSON_AddItemToArray(ab, j);
        }
    }
    return root;
}

static tk_status write_text(const char *path, const char *text) {
    FILE *f = fopen(path, "w");
    if (!f) return tk_fail(TK_ERR_IO, "bench: cannot write %s: %s", path, strerror(errno));
    size_t n = strlen(text);
    bool ok = fwrite(text, 1, n, f) == n;
    ok &= fclose(f) == 0;
    return ok ? TK_OK : tk_fail(TK_ERR_IO, "bench: writing %s failed", path);
}

tk_status report_json_write(const bench_result *r, const char *path) {
    cJSON *root = js_result(r);
    char *text = root ? cJSON_Print(root) : NULL;
    cJSON_Delete(root);
    if (!text) return tk_fail(TK_ERR_NOMEM, "bench: cannot build the JSON report");
    tk_status st = write_text(path, text);
    cJSON_free(text);
    return st;
}

/* ---- CSV ------------------------------------------------------------------- */

tk_status report_csv_write(const bench_result *r, const char *path) {
    FILE *f = fopen(path, "w");
    if (!f) return tk_fail(TK_ERR_IO, "bench: cannot write %s: %s", path, strerror(errno));
    fprintf(f, "series,weight_dtype,kv_type,unfused,static_batching,no_chunking,concurrency,rate,repeat,"
               "output_length_mismatch");
    for (int k = 0; k < BM_COUNT; k++) fprintf(f, ",%s", bench_metric_name((bench_metric)k));
    fprintf(f, "\n");
    for (int s = 0; s < r->n_series; s++) {
        const bench_series *sr = &r->series[s];
        for (int i = 0; i < sr->n_points; i++) {
            const bench_point *p = &sr->points[i];
            for (int k = 0; k < p->n_rep; k++) {
                const bench_level *l = &p->rep[k];
                /* Labels hold commas: quote them. */
                fprintf(f, "\"%s\",%s,%s,%d,%d,%d,%d,%g,%d,%d", sr->label, sr->weight_dtype,
                        kv_str(sr->engine.kv_type), sr->engine.unfused, sr->engine.static_batching,
                        sr->engine.no_chunking, p->concurrency, p->rate, k + 1, l->out_len_short);
                for (int j = 0; j < BM_COUNT; j++) {
                    if (isnan(l->m[j]))
                        fprintf(f, ",");
                    else
                        fprintf(f, ",%.6g", l->m[j]);
                }
                fprintf(f, "\n");
            }
        }
    }
    bool ok = !ferror(f);
    ok &= fclose(f) == 0;
    return ok ? TK_OK : tk_fail(TK_ERR_IO, "bench: writing %s failed", path);
}

/* ---- plot ------------------------------------------------------------------ */

/* Text from a model file goes into a gnuplot script, which can run shell
 * commands: keep only characters that cannot end a string or expand. */
static void plot_safe(char *dst, size_t n, const char *src) {
    size_t k = 0;
    for (; src && *src && k + 1 < n; src++) {
        unsigned char ch = (unsigned char)*src;
        dst[k++] = (ch < 32 || ch == '"' || ch == '\\' || ch == '`' || ch == '$' || ch == '\'' || ch >= 127)
                       ? '_'
                       : (char)ch;
    }
    dst[k] = 0;
}

tk_status report_plot_write(const bench_result *r, const char *path) {
    if (strpbrk(path, "\"`\n"))
        return tk_fail(TK_ERR_INVALID, "bench: plot path %s holds a quote, backquote or newline", path);
    char script[] = "/tmp/tokamak-plot-XXXXXX";
    int fd = mkstemp(script);
    if (fd < 0) return tk_fail(TK_ERR_IO, "bench: cannot create a gnuplot script: %s", strerror(errno));
    FILE *f = fdopen(fd, "w");
    if (!f) {
        close(fd);
        unlink(script);
        return tk_fail(TK_ERR_IO, "bench: cannot open the gnuplot script");
    }
    bool rate = r->opts.n_rates > 0;
    /* pngcairo looks better; plain png (libgd) exists in more gnuplot builds. */
    fprintf(f, "if (strstrt(GPVAL_TERMINALS, 'pngcairo') > 0) { set terminal pngcairo size 1400,560 } "
               "else { set terminal png size 1400,560 }\n");
    fprintf(f, "set output \"%s\"\nset datafile missing 'nan'\nset grid\nset key top left\n", path);
    if (!rate) fprintf(f, "set logscale x 2\n");
    for (int s = 0; s < r->n_series; s++) {
        fprintf(f, "$s%d << EOD\n", s);
        const bench_series *sr = &r->series[s];
        for (int i = 0; i < sr->n_points; i++) {
            const bench_point *p = &sr->points[i];
            fprintf(f, "%g %g %g %g\n", rate ? p->rate : (double)p->concurrency, p->med[BM_TPOT_P50],
                    p->med[BM_TPOT_P99], p->med[BM_OUT_TOK_S]);
        }
        fprintf(f, "EOD\n");
    }
    const char *xl = rate ? "arrival rate (req/s)" : "concurrency";
    char name[128], commit[64];
    plot_safe(name, sizeof name, r->info.model_name);
    plot_safe(commit, sizeof commit, r->info.git_commit);
    if (r->remote.on) plot_safe(name, sizeof name, r->remote.model);
    fprintf(f, "set multiplot layout 1,2 title \"tokamak %s: %s, in %d / out %d (commit %s)\"\n",
            r->remote.on ? "loadgen" : "bench", name, r->opts.n_in, r->opts.n_out, commit);
    fprintf(f, "set xlabel '%s'\nset ylabel 'TPOT (ms)'\nset title 'TPOT P50 / P99'\nplot ", xl);
    char label[96];
    for (int s = 0; s < r->n_series; s++) {
        plot_safe(label, sizeof label, r->series[s].label);
        fprintf(
            f,
            "%s$s%d using 1:2 with linespoints lw 2 title \"%s P50\", $s%d using 1:3 with linespoints dt 2 "
            "title \"%s P99\"",
            s ? ", " : "", s, label, s, label);
    }
    fprintf(f, "\nset ylabel 'output tokens/s'\nset title 'Throughput'\nplot ");
    for (int s = 0; s < r->n_series; s++) {
        plot_safe(label, sizeof label, r->series[s].label);
        fprintf(f, "%s$s%d using 1:4 with linespoints lw 2 title \"%s\"", s ? ", " : "", s, label);
    }
    fprintf(f, "\nunset multiplot\n");
    bool ok = !ferror(f);
    ok &= fclose(f) == 0;
    if (!ok) {
        unlink(script);
        return tk_fail(TK_ERR_IO, "bench: writing the gnuplot script failed");
    }
    char cmd[sizeof script + 64];
    snprintf(cmd, sizeof cmd, "gnuplot %s 2>&1", script);
    int rc = system(cmd);
    unlink(script);
    if (rc != 0) return tk_fail(TK_ERR_IO, "bench: gnuplot failed (exit %d) writing %s", rc, path);
    if (access(path, F_OK) != 0) return tk_fail(TK_ERR_IO, "bench: gnuplot wrote no %s", path);
    return TK_OK;
}
