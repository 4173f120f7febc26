/* Calibration for quantize: the model run in its own precision over lines of
 * text, every matmul's input observed (backend_cpu_opts.observe). Per layer
 * and site (backend_site): the mean square of each input channel over every
 * token, and the rows of an evenly spaced subsample of tokens, on which a
 * quantized matmul's output error ||(W - Q(W)) X|| is measured. */
#ifndef TK_CLI_CALIB_H
#define TK_CLI_CALIB_H

#include <stdint.h>

#include "backend/backend.h"
#include "core/dtype.h"
#include "core/pool.h"
#include "tokamak.h"

typedef struct calib_site {
    int64_t k;      /* input channels */
    double *sumsq;  /* (k) sum of squares over the tokens seen */
    float *ms;      /* (k) mean square (after calib_run) */
    float *samples; /* (n_samples, k) sampled tokens' rows */
} calib_site;

typedef struct calib {
    int n_layer;
    int n_samples, cap; /* rows held per site, room for */
    long n_tok, stride; /* tokens run; every stride-th is sampled */
    long step_base;     /* index of the current step's first token */
    calib_site *site;   /* (n_layer, BACKEND_SITE_COUNT) */
    tk_pool *pool;      /* threads of the scale search */
} calib;

/* Runs model_path (GGUF or HF directory, loaded as it is) over the first
 * max_lines non-empty lines of text_path, each its own sequence (cut at 512
 * tokens), keeping up to max_samples token rows per site. progress: a bar on
 * stderr. Free with calib_free. */
tk_status calib_run(const char *model_path, const char *text_path, int max_lines, int max_samples,
                    int threads, bool progress, calib **out);
void calib_free(calib *c);

static inline const calib_site *calib_at(const calib *c, int layer, backend_site s) {
    return &c->site[(size_t)layer * BACKEND_SITE_COUNT + s];
}

/* A bar on stderr: "label [#####.....] done/total", redrawn in place when it
 * moves; when stderr is not a terminal only the finished bar is written. */
void cli_progress(const char *label, long done, long total);

#endif

/* sum over the sampled rows x of site cs of (d . x)^2, d a row of W - Q(W). */
double calib_row_error(const calib *c, const calib_site *cs, const float *d);

/* AWQ-style scale search for the n_mats matrices W[i] (rows[i] x cs->k
 * floats, quantized as types[i]) that share the input of site cs: for alpha
 * on 0, 0.1, ..., 1, s_j = rms_j^alpha (normalised around 1), each W
 * quantized as Q(W diag(s)) diag(1/s), and the alpha with the least sampled
 * output error kept. Writes s (cs->k); returns the alpha chosen. */
float calib_awq_search(const calib *c, const calib_site *cs, float *const *W, const int64_t *rows,
                       const tk_dtype *types, int n_mats, float *s);
