#include "bench/kbench.h"

#include <stdlib.h>
#include <string.h>

#include "bench/stats.h"
#include "core/alloc.h"
#include "core/clock.h"
#include "core/error.h"
#include "core/pool.h"
#include "kernels/kernels.h"
#include "model/model.h"

/* Rows split between threads in multiples of this: whole interleaved groups
 * (16 rows, BF16's pairs of them 32), as the decode step splits them. */
#define KB_ROW_ALIGN 32
/* The cached pass repeats its matrix until it has read this many bytes. */
#define KB_HOT_BYTES ((uint64_t)64 << 20)
#define KB_MAX_K     8 /* distinct row lengths per kind (a model has 2 or 3) */
#define KB_MAX_CPUS  1024

/* One kind of weight (type, layout): its matrices and the activations for
 * each of their row lengths (as many rows as the largest count, quantized as the kernel
 * reads them). */
typedef struct kb_kind {
    tk_dtype type;
    tk_layout layout;
    tk_gemv_fn gemv;
    const tk_tensor **mats;
    int n_mat, hot; /* hot: the smallest matrix */
    int64_t k[KB_MAX_K];
    void *act[KB_MAX_K];
    size_t stride[KB_MAX_K];
    int n_k;
} kb_kind;

typedef struct kb_job {
    tk_pool *pool;
    const kb_kind *kind;
    const tk_tensor *const *mats;
    int n_mat, reps, n_tok;
    float *y;
} kb_job;

static int kind_k(const kb_kind *kd, int64_t k) {
    for (int i = 0; i < kd->n_k; i++)
        if (kd->k[i] == k) return i;
    return -1;
}

static void kb_worker(void *ctx, int ith, int nth) {
    const kb_job *j = ctx;
    for (int r = 0; r < j->reps; r++)
        for (int i = 0; i < j->n_mat; i++) {
            const tk_tensor *w = j->mats[i];
            const int a = kind_k(j->kind, w->ne[0]);
            long r0, r1;
            pool_split((long)w->ne[1], ith, nth, KB_ROW_ALIGN, &r0, &r1);
            if (r0 < r1)
                j->kind->gemv(w->ne[0], w->data, r0, r1, j->kind->act[a], j->kind->stride[a], j->n_tok, j->y,
                              w->ne[1]);
            pool_barrier(j->pool);
        }
}

/* Seconds for reps passes over mats at n_tok tokens. */
static double kb_time(tk_pool *pool, const kb_kind *kd, const tk_tensor *const *mats, int n_mat, int reps,
                      int n_tok, float *y) {
    kb_job j = {.pool = pool, .kind = kd, .mats = mats, .n_mat = n_mat, .reps = reps, .n_tok = n_tok, .y = y};
    uint64_t t0 = tk_now_ns();
    pool_run(pool, kb_worker, &j);
    return (double)(tk_now_ns() - t0) * 1e-9;
}

static void kinds_free(kb_kind *kinds, int n) {
    for (int i = 0; kinds && i < n; i++) {
        for (int a = 0; a < kinds[i].n_k; a++) tk_free_aligned(kinds[i].act[a]);
        tk_free(kinds[i].mats);
    }
    tk_free(kinds);
}

/* Groups m's matmul weights by kind and quantizes n_act seeded activation
 * rows for each row length. */
static tk_status kinds_of(const tk_model *m, const tk_kernels *K, int n_act, kb_kind **out, int *n_out,
                          int64_t *max_rows) {
    const int n = model_n_matmuls(m);
    kb_kind *kinds = tk_calloc((size_t)n, sizeof *kinds);
    if (!kinds) return tk_fail(TK_ERR_NOMEM, "profile --kernels: %d weight kinds", n);
    int nk = 0;
    *max_rows = 0;
    tk_status st = TK_OK;
    float *x = NULL;
    for (int i = 0; i < n && st == TK_OK; i++) {
        const tk_tensor *w = model_matmul(m, i);
        int c = 0;
        while (c < nk && (kinds[c].type != w->type || kinds[c].layout != w->layout)) c++;
        if (c == nk) {
            kinds[c] = (kb_kind){.type = w->type, .layout = w->layout, .gemv = kern_gemv_of(K, w)};
            kinds[c].mats = tk_calloc((size_t)n, sizeof *kinds[c].mats);
            nk++;
            if (!kinds[c].mats)
                st = tk_fail(TK_ERR_NOMEM, "profile --kernels: a list of %d weights", n);
            else if (!kinds[c].gemv)
                st = tk_fail(TK_ERR_UNSUPPORTED, "profile --kernels: no kernel reads %s weights (%s)",
                             dtype_name(w->type), w->name ? w->name : "?");
            if (st != TK_OK) break;
        }
        kb_kind *kd = &kinds[c];
        if (kd->n_mat == 0 || w->nbytes < kd->mats[kd->hot]->nbytes) kd->hot = kd->n_mat;
        kd->mats[kd->n_mat++] = w;
        if (w->ne[1] > *max_rows) *max_rows = w->ne[1];
        if (kind_k(kd, w->ne[0]) >= 0) continue;
        const size_t rb = kern_act_row_bytes(w->type, w->layout, w->ne[0]);
        if (kd->n_k == KB_MAX_K || rb == 0) {
            st = tk_fail(TK_ERR_UNSUPPORTED, "profile --kernels: %s: row length %lld not timed", w->name,
                         (long long)w->ne[0]);
            break;
        }
        const int a = kd->n_k++;
        kd->k[a] = w->ne[0];
        kd->stride[a] = rb;
        kd->act[a] = tk_alloc_aligned(rb * (size_t)n_act, 64);
        tk_free(x);
        x = tk_malloc((size_t)w->ne[0] * sizeof *x);
        if (!kd->act[a] || !x) {
            st = tk_fail(TK_ERR_NOMEM, "profile --kernels: activations of %lld values", (long long)w->ne[0]);
            break;
        }
        uint64_t s = 0x9e3779b97f4a7c15ull * (uint64_t)(a + 1);
        for (int t = 0; t < n_act; t++) {
            kbench_fill(x, w->ne[0], &s);
            kern_quant_act(K, w->type, w->layout, x, (char *)kd->act[a] + (size_t)t * rb, w->ne[0]);
        }
    }
    tk_free(x);
    *out = kinds;
    *n_out = nk;
    if (st != TK_OK) {
        kinds_free(kinds, nk);
        *out = NULL;
        *n_out = 0;
    }
    return st;
}

/* The times of kind c at count ci, one per round: [c][ci][round]. */
static size_t kb_at(int c, int ci, int n_counts, int rounds) {
    return ((size_t)c * (size_t)n_counts + (size_t)ci) * (size_t)rounds;
}

double kbench_median(const double *v, int n) {
    double p = 0;
    stats_percentile(v, (size_t)n, 50, &p); /* out of memory: 0, as no rate */
    return p;
}

void kbench_fill(float *x, int64_t n, uint64_t *s) {
    for (int64_t i = 0; i < n; i++) {
        *s = *s * 6364136223846793005ull + 1442695040888963407ull;
        x[i] = (float)((double)(*s >> 11) * 0x1.0p-53 * 2.0 - 1.0);
    }
}

tk_status kbench_pool(int n_threads, bool pin, const char *cpus, tk_pool **out) {
    int cpu[KB_MAX_CPUS], n_cpu = 0;
    if (cpus) {
        tk_status st = pool_parse_cpus(cpus, cpu, KB_MAX_CPUS, &n_cpu);
        if (st != TK_OK) return st;
    }
    return n_cpu > 0 ? pool_init_cpus(n_threads, cpu, n_cpu, out) : pool_init(n_threads, pin, out);
}

tk_status kbench_run(const tk_model *m, int n_threads, bool pin, const char *cpus, const int *tok,
                     int n_counts, int rounds, kb_row **rows, int *n_rows) {
    *rows = NULL;
    *n_rows = 0;
    if (n_counts < 1 || n_counts > KB_MAX_COUNTS || rounds < 1 || rounds > 64 || n_threads < 1)
        return tk_fail(TK_ERR_INVALID, "profile --kernels: %d token counts (1..%d), %d rounds (1..64)",
                       n_counts, KB_MAX_COUNTS, rounds);
    for (int c = 0; c < n_counts; c++)
        if (tok[c] < 1 || tok[c] > KB_MAX_TOKENS)
            return tk_fail(TK_ERR_INVALID, "profile --kernels: %d tokens (1..%d)", tok[c], KB_MAX_TOKENS);
    int max_tok = 0;
    for (int c = 0; c < n_counts; c++)
        if (tok[c] > max_tok) max_tok = tok[c];
    const tk_kernels *K = kernels_default();
    kb_kind *kinds = NULL;
    int nk = 0;
    int64_t max_rows = 0;
    tk_status st = kinds_of(m, K, max_tok, &kinds, &nk, &max_rows);
    if (st != TK_OK) return st;
    tk_pool *pool = NULL;
    float *y = tk_alloc_aligned((size_t)max_rows * (size_t)max_tok * sizeof *y, 64);
    double *t_str = tk_calloc((size_t)nk * (size_t)n_counts * (size_t)rounds, sizeof *t_str);
    double *t_hot = tk_calloc((size_t)nk * (size_t)n_counts * (size_t)rounds, sizeof *t_hot);
    kb_row *out = tk_calloc((size_t)nk * (size_t)n_counts, sizeof *out);
    if (!y || !t_str || !t_hot || !out) st = tk_fail(TK_ERR_NOMEM, "profile --kernels: output buffers");
    if (st == TK_OK) st = kbench_pool(n_threads, pin, cpus, &pool);
    int *reps = tk_calloc((size_t)(nk > 0 ? nk : 1), sizeof *reps);
    if (st == TK_OK && !reps) st = tk_fail(TK_ERR_NOMEM, "profile --kernels: %d kinds", nk);
    for (int c = 0; st == TK_OK && c < nk; c++) {
        const uint64_t hb = kinds[c].mats[kinds[c].hot]->nbytes;
        reps[c] = hb > 0 && hb < KB_HOT_BYTES ? (int)(KB_HOT_BYTES / hb) : 1;
        /* untimed: every page once, and the pool's threads running */
        kb_time(pool, &kinds[c], kinds[c].mats, kinds[c].n_mat, 1, tok[0], y);
    }
    for (int r = 0; st == TK_OK && r < rounds; r++)
        for (int q = 0; q < n_counts; q++) {
            const int ci = r % 2 ? n_counts - 1 - q : q;
            for (int c = 0; c < nk; c++) {
                const size_t at = kb_at(c, ci, n_counts, rounds) + (size_t)r;
                const kb_kind *kd = &kinds[c];
                t_str[at] = kb_time(pool, kd, kd->mats, kd->n_mat, 1, tok[ci], y);
                t_hot[at] = kb_time(pool, kd, kd->mats + kd->hot, 1, reps[c], tok[ci], y);
            }
        }
    for (int c = 0; st == TK_OK && c < nk; c++) {
        const kb_kind *kd = &kinds[c];
        uint64_t bytes = 0;
        double macs = 0;
        for (int i = 0; i < kd->n_mat; i++) {
            bytes += kd->mats[i]->nbytes;
            macs += (double)kd->mats[i]->ne[0] * (double)kd->mats[i]->ne[1];
        }
        const tk_tensor *h = kd->mats[kd->hot];
        const double hot_bytes = (double)h->nbytes * reps[c],
                     hot_macs = (double)h->ne[0] * (double)h->ne[1] * reps[c];
        const tk_peak peak = kern_peak(K, kd->type, kd->layout);
        for (int ci = 0; ci < n_counts; ci++) {
            const double *ts = t_str + kb_at(c, ci, n_counts, rounds);
            const double *th = t_hot + kb_at(c, ci, n_counts, rounds);
            const double *t0 = t_str + kb_at(c, 0, n_counts, rounds);
            double gbs[64], gops[64], ratio[64], hgbs[64], hgops[64];
            for (int r = 0; r < rounds; r++) {
                gbs[r] = (double)bytes / ts[r] * 1e-9;
                gops[r] = 2.0 * macs * tok[ci] / ts[r] * 1e-9;
                ratio[r] = t0[r] / ts[r];
                hgbs[r] = hot_bytes / th[r] * 1e-9;
                hgops[r] = 2.0 * hot_macs * tok[ci] / th[r] * 1e-9;
            }
            out[c * n_counts + ci] = (kb_row){.type = kd->type,
                                              .layout = kd->layout,
                                              .peak = peak,
                                              .n_tok = tok[ci],
                                              .n_mat = kd->n_mat,
                                              .bytes = bytes,
                                              .ops = 2.0 * macs * tok[ci],
                                              .gbs = kbench_median(gbs, rounds),
                                              .gops = kbench_median(gops, rounds),
                                              .x_first = kbench_median(ratio, rounds),
                                              .hot_bytes = h->nbytes,
                                              .hot_gbs = kbench_median(hgbs, rounds),
                                              .hot_gops = kbench_median(hgops, rounds)};
        }
    }
    pool_free(pool);
    tk_free(reps);
    tk_free(t_str);
    tk_free(t_hot);
    tk_free_aligned(y);
    kinds_free(kinds, nk);
    if (st != TK_OK) {
        tk_free(out);
        return st;
    }
    *rows = out;
    *n_rows = nk * n_counts;
    return TK_OK;
}
