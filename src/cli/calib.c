/* Calibration statistics for quantize (calib.h). */
#include "cli/calib.h"

#include <math.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "cli/compare.h"
#include "core/alloc.h"
#include "core/error.h"
#include "core/pool.h"
#include "kernels/kernels.h"
#include "model/model.h"

#define CALIB_MAX_LINE_TOKENS 512

void cli_progress(const char *label, long done, long total) {
    enum { W = 30 };
    int fill = total > 0 ? (int)(W * done / total) : W;
    bool last = done >= total;
    /* redrawn only when the bar moves; a log file gets the finished bar only */
    if (!last && (!isatty(STDERR_FILENO) || (done > 1 && fill == (int)(W * (done - 1) / total)))) return;
    char bar[W + 1];
    for (int i = 0; i < W; i++) bar[i] = i < fill ? '#' : '.';
    bar[W] = 0;
    fprintf(stderr, "\r%s [%s] %ld/%ld%s", label, bar, done, total, last ? "\n" : "");
    fflush(stderr);
}

static void calib_observe(void *ctx, int layer, backend_site s, const float *x, int n_tok, int64_t k) {
    calib *c = ctx;
    calib_site *cs = &c->site[(size_t)layer * BACKEND_SITE_COUNT + s];
    if (layer == 0 && s == BACKEND_SITE_ATTN_IN) c->step_base = c->n_tok, c->n_tok += n_tok;
    for (int t = 0; t < n_tok; t++) {
        const float *row = x + (size_t)t * (size_t)k;
        for (int64_t j = 0; j < k; j++) cs->sumsq[j] += (double)row[j] * row[j];
        long g = c->step_base + t;
        if (g % c->stride == 0 && g / c->stride < c->cap)
            memcpy(cs->samples + (size_t)(g / c->stride) * (size_t)k, row, (size_t)k * sizeof *row);
    }
}

void calib_free(calib *c) {
    if (!c) return;
    for (int i = 0; c->site && i < c->n_layer * BACKEND_SITE_COUNT; i++) {
        tk_free(c->site[i].sumsq);
        tk_free(c->site[i].ms);
        tk_free(c->site[i].samples);
    }
    tk_free(c->site);
    pool_free(c->pool);
    tk_free(c);
}

/* The first max_lines non-empty lines of path, tokenized (ids: n_lines arrays). */
static tk_status calib_lines(const tk_model *m, const char *path, int max_lines, int32_t ***ids,
                             size_t **lens, int *n_lines, long *total) {
    FILE *f = fopen(path, "rb");
    if (!f) return tk_fail(TK_ERR_IO, "calibration: cannot read %s", path);
    *ids = tk_calloc((size_t)max_lines, sizeof **ids);
    *lens = tk_calloc((size_t)max_lines, sizeof **lens);
    *n_lines = 0, *total = 0;
    tk_status st = *ids && *lens ? TK_OK : tk_fail(TK_ERR_NOMEM, "calibration: out of memory");
    char line[16384];
    while (!st && *n_lines < max_lines && fgets(line, sizeof line, f)) {
        size_t len = strlen(line);
        if (len == 0 || (len == 1 && line[0] == '\n')) continue;
        int i = *n_lines;
        if ((st = tk_tokenize(m, line, len, true, false, &(*ids)[i], &(*lens)[i]))) break;
        if ((*lens)[i] == 0) {
            tk_free_buf((*ids)[i]);
            (*ids)[i] = NULL;
            continue;
        }
        if ((*lens)[i] > CALIB_MAX_LINE_TOKENS) (*lens)[i] = CALIB_MAX_LINE_TOKENS;
        *total += (long)(*lens)[i];
        (*n_lines)++;
    }
    fclose(f);
    if (!st && *n_lines == 0) st = tk_fail(TK_ERR_INVALID, "calibration: %s has no text", path);
    return st;
}

tk_status calib_run(const char *model_path, const char *text_path, int max_lines, int max_samples,
                    int threads, bool progress, calib **out) {
    *out = NULL;
    tk_model *m = NULL;
    tk_status st = tk_model_open(model_path, NULL, &m);
    if (st) return st;
    const tk_hparams *hp = model_hparams(m);
    int32_t **ids = NULL;
    size_t *lens = NULL;
    int n_lines = 0;
    long total = 0;
    cli_seq q;
    memset(&q, 0, sizeof q);
    calib *c = tk_calloc(1, sizeof *c);
    if (!c) {
        st = tk_fail(TK_ERR_NOMEM, "calibration: out of memory");
        goto done;
    }
    c->n_layer = hp->n_layer;
    if ((st = pool_init(threads, false, &c->pool))) goto done;
    if ((st = calib_lines(m, text_path, max_lines, &ids, &lens, &n_lines, &total))) goto done;
    c->cap = max_samples;
    c->stride = total > max_samples ? (total + max_samples - 1) / max_samples : 1;
    c->site = tk_calloc((size_t)c->n_layer * BACKEND_SITE_COUNT, sizeof *c->site);
    if (!c->site) {
        st = tk_fail(TK_ERR_NOMEM, "calibration: out of memory");
        goto done;
    }
    const int64_t widths[BACKEND_SITE_COUNT] = {hp->n_embd, (int64_t)hp->n_head * hp->head_dim, hp->n_embd,
                                                hp->n_ff};
    for (int l = 0; l < c->n_layer; l++)
        for (int s = 0; s < BACKEND_SITE_COUNT; s++) {
            calib_site *cs = &c->site[l * BACKEND_SITE_COUNT + s];
            cs->k = widths[s];
            cs->sumsq = tk_calloc((size_t)cs->k, sizeof *cs->sumsq);
            cs->ms = tk_calloc((size_t)cs->k, sizeof *cs->ms);
            cs->samples = tk_calloc((size_t)max_samples * (size_t)cs->k, sizeof *cs->samples);
            if (!cs->sumsq || !cs->ms || !cs->samples) {
                st = tk_fail(TK_ERR_NOMEM, "calibration: out of memory for the samples");
                goto done;
            }
        }
    if (!cli_seq_init(&q, m, NULL, threads, false, TK_KV_F32, TK_KV_SCALE_HEAD, CALIB_MAX_LINE_TOKENS, 16,
                      CALIB_MAX_LINE_TOKENS, calib_observe, c)) {
        tk_error_prefix("calibration: ");
        st = TK_ERR_INVALID;
        goto done;
    }
    for (int i = 0; i < n_lines; i++) {
        if ((st = runner_truncate(q.r, 0)) || (st = runner_step(q.r, ids[i], (int)lens[i], 0, NULL)))
            goto done;
        if (progress) cli_progress("calibrating", i + 1, n_lines);
    }
    c->n_samples = (int)((c->n_tok + c->stride - 1) / c->stride);
    if (c->n_samples > c->cap) c->n_samples = c->cap;
    for (int i = 0; i < c->n_layer * BACKEND_SITE_COUNT; i++)
        for (int64_t j = 0; j < c->site[i].k; j++)
            c->site[i].ms[j] = (float)(c->site[i].sumsq[j] / (double)c->n_tok);
done:
    cli_seq_free(&q);
    for (int i = 0; ids && i < max_lines; i++) tk_free_buf(ids[i]);
    tk_free(ids);
    tk_free(lens);
    tk_model_free(m);
    if (st)
        calib_free(c);
    else
        *out = c;
    return st;
}

/* Eight partial sums, so the compiler can keep them in vector lanes. */
static float dot8(const float *a, const float *b, int64_t k) {
    float acc[8] = {0};
    int64_t j = 0;
    for (; j + 8 <= k; j += 8)
        for (int i = 0; i < 8; i++) acc[i] += a[j + i] * b[j + i];
    float s = 0.0f;
    for (; j < k; j++) s += a[j] * b[j];
    for (int i = 0; i < 8; i++) s += acc[i];
    return s;
}

double calib_row_error(const calib *c, const calib_site *cs, const float *d) {
    double e = 0.0;
    for (int t = 0; t < c->n_samples; t++) {
        double v = dot8(d, cs->samples + (size_t)t * (size_t)cs->k, cs->k);
        e += v * v;
    }
    return e;
}

/* Sampled output error of W quantized as Q(W diag(s)) diag(1/s), rows split
 * over the pool; each thread has its own scratch and partial sum. */
typedef struct mat_job {
    const calib *c;
    const calib_site *cs;
    const float *W, *s;
    int64_t rows;
    tk_dtype t;
    float *scratch; /* (nth, 3 k) */
    double *part;   /* (nth) */
} mat_job;

static void mat_error_rows(void *ctx, int ith, int nth) {
    mat_job *j = ctx;
    const tk_kernels *K = kernels_default();
    const int64_t k = j->cs->k;
    float *tmp = j->scratch + (size_t)ith * 3 * (size_t)k, *dq = tmp + k, *qbuf = dq + k;
    long r0, r1;
    pool_split(j->rows, ith, nth, 1, &r0, &r1);
    double e = 0.0;
    for (long r = r0; r < r1; r++) {
        const float *w = j->W + (size_t)r * (size_t)k;
        for (int64_t i = 0; i < k; i++) tmp[i] = w[i] * j->s[i];
        kern_quantize_row(j->t, tmp, qbuf, k);
        K->dequant_row[j->t](qbuf, dq, k);
        for (int64_t i = 0; i < k; i++) dq[i] = dq[i] / j->s[i] - w[i];
        e += calib_row_error(j->c, j->cs, dq);
    }
    j->part[ith] = e;
}

float calib_awq_search(const calib *c, const calib_site *cs, float *const *W, const int64_t *rows,
                       const tk_dtype *types, int n_mats, float *s) {
    const int64_t k = cs->k;
    const int nth = pool_size(c->pool);
    float *cand = tk_malloc((size_t)k * sizeof *cand);
    /* a quantized row takes at most 4 bytes per element (f32), so k floats hold it */
    mat_job job = {.c = c,
                   .cs = cs,
                   .s = cand,
                   .scratch = tk_malloc((size_t)nth * 3 * (size_t)k * sizeof(float)),
                   .part = tk_calloc((size_t)nth, sizeof(double))};
    float best_alpha = 0.0f;
    for (int64_t j = 0; j < k; j++) s[j] = 1.0f;
    if (!cand || !job.scratch || !job.part) goto out; /* scales of 1: plain quantization */
    double best = INFINITY;
    for (int a = 0; a <= 10; a++) {
        float alpha = 0.1f * (float)a, mn = INFINITY, mx = 0.0f;
        for (int64_t j = 0; j < k; j++) {
            float rms = sqrtf(cs->ms[j]);
            cand[j] = powf(rms > 1e-6f ? rms : 1e-6f, alpha);
            mn = fminf(mn, cand[j]);
            mx = fmaxf(mx, cand[j]);
        }
        float norm = 1.0f / sqrtf(mn * mx);
        for (int64_t j = 0; j < k; j++) cand[j] *= norm;
        double e = 0.0;
        for (int i = 0; i < n_mats; i++) {
            job.W = W[i], job.rows = rows[i], job.t = types[i];
            pool_run(c->pool, mat_error_rows, &job);
            for (int t = 0; t < nth; t++) e += job.part[t];
        }
        if (e < best) {
            best = e, best_alpha = alpha;
            memcpy(s, cand, (size_t)k * sizeof *s);
        }
    }
out:
    tk_free(cand);
    tk_free(job.scratch);
    tk_free(job.part);
    return best_alpha;
}
