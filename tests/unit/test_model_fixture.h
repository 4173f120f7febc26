/* Tiny in-memory models for the model and forward tests (4 layers, dim 64,
 * heads 4 / kv 2, head_dim 16 (32 for qwen3, so head_dim != dim / heads), ffn
 * 128, vocab 300), seeded weights per (role, layer) so two namings of the same
 * model hold the same numbers, and a float64 reference forward pass. */
#ifndef TEST_MODEL_FIXTURE_H
#define TEST_MODEL_FIXTURE_H

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/alloc.h"
#include "core/dtype.h"
#include "kernels/kernels.h"
#include "model/arch.h"
#include "model/model_internal.h"

#define FX_MAX_TENSORS 80

typedef struct fx_model {
    tk_hparams hp;
    tk_naming naming;
    bool permuted; /* GGUF llama: Q/K rows as llama.cpp's converter stores them */
    int n;
    tk_tensor t[FX_MAX_TENSORS];
    char names[FX_MAX_TENSORS][96];
    void *data[FX_MAX_TENSORS];
} fx_model;

static inline uint64_t fx_rng_next(uint64_t *s) {
    *s += 0x9e3779b97f4a7c15ull;
    uint64_t z = *s;
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}
static inline float fx_uniform(uint64_t *s) {
    return (float)((double)(fx_rng_next(s) >> 11) / 9007199254740992.0 * 2.0 - 1.0);
}

static inline void fx_hparams(tk_hparams *hp, tk_arch arch) {
    memset(hp, 0, sizeof *hp);
    hp->arch = arch;
    hp->n_layer = 4;
    hp->n_ctx_train = 4096;
    hp->n_embd = 64;
    hp->n_ff = 128;
    hp->n_head = 4;
    hp->n_head_kv = 2;
    hp->head_dim = arch == TK_ARCH_QWEN3 ? 32 : 16;
    hp->n_vocab = 300;
    hp->rms_eps = 1e-6f;
    hp->rope_theta = 10000.0f;
    hp->rope_factor = 1.0f;
    hp->tied = arch == TK_ARCH_QWEN3;
    hp->qk_norm = arch == TK_ARCH_QWEN3;
    hp->qkv_bias = arch == TK_ARCH_QWEN2;
    hp->bos_id = 1;
    hp->eos_id = 2;
    hp->pad_id = -1;
    if (arch == TK_ARCH_LLAMA) {
        /* Llama 3 scaling over head_dim 16 covers all three cases (kept, scaled, smoothed). */
        hp->rope_scaling = TK_ROPE_SCALING_LLAMA3;
        hp->rope_factor = 8.0f;
        hp->rope_low_freq_factor = 1.0f;
        hp->rope_high_freq_factor = 4.0f;
        hp->rope_orig_ctx = 8192;
    }
}

/* The llama3 factors as the HF->GGUF converter writes rope_freqs.weight. */
static inline float fx_llama3_factor(const tk_hparams *hp, int i) {
    double f = 1.0 / pow((double)hp->rope_theta, (double)(2 * i) / hp->head_dim);
    double wl = 2 * M_PI / f, old = hp->rope_orig_ctx;
    double lo = hp->rope_low_freq_factor, hi = hp->rope_high_freq_factor;
    if (wl < old / hi) return 1.0f;
    if (wl > old / lo) return hp->rope_factor;
    double smooth = (old / wl - lo) / (hi - lo);
    return (float)(1.0 / ((1.0 - smooth) / hp->rope_factor + smooth));
}

static inline void fx_store_rows(tk_dtype type, const float *v, int64_t rows, int64_t k, void *out) {
    uint64_t rb = 0;
    dtype_row_bytes(type, (uint64_t)k, &rb);
    for (int64_t r = 0; r < rows; r++) {
        const float *x = v + r * k;
        uint8_t *o = (uint8_t *)out + (size_t)r * rb;
        if (type == TK_DTYPE_F32) {
            memcpy(o, x, (size_t)k * 4);
        } else if (type == TK_DTYPE_F16 || type == TK_DTYPE_BF16) {
            for (int64_t i = 0; i < k; i++) {
                uint16_t h = type == TK_DTYPE_F16 ? tk_f32_to_f16(x[i]) : tk_f32_to_bf16(x[i]);
                memcpy(o + 2 * i, &h, 2);
            }
        } else {
            kern_quantize_row(type, x, o, k);
        }
    }
}

/* Add one tensor with explicit shape and float values (converted to type). */
static inline tk_tensor *fx_add(fx_model *fx, const char *name, tk_dtype type, const int64_t ne[4],
                                const float *v) {
    int i = fx->n++;
    tk_tensor *t = &fx->t[i];
    snprintf(fx->names[i], sizeof fx->names[i], "%s", name);
    uint64_t rb = 0;
    dtype_row_bytes(type, (uint64_t)ne[0], &rb);
    int64_t rows = ne[1] * ne[2] * ne[3];
    fx->data[i] = tk_alloc_aligned((size_t)(rb * (uint64_t)rows) + 64, 64);
    fx_store_rows(type, v, rows, ne[0], fx->data[i]);
    t->name = fx->names[i];
    t->type = type;
    t->n_dims = ne[1] > 1 ? 2 : 1;
    memcpy(t->ne, ne, sizeof t->ne);
    t->data = fx->data[i];
    t->nbytes = rb * (uint64_t)rows;
    return t;
}

/* GGUF row 2i+j of a head holds HF row j*(hd/2)+i (llama.cpp's permute()). */
static inline void fx_permute(float *v, int n_head, int hd, int64_t k) {
    float *tmp = malloc((size_t)n_head * hd * k * sizeof(float));
    int half = hd / 2;
    for (int h = 0; h < n_head; h++)
        for (int i = 0; i < half; i++)
            for (int j = 0; j < 2; j++)
                memcpy(tmp + ((size_t)h * hd + 2 * i + j) * k, v + ((size_t)h * hd + j * half + i) * k,
                       (size_t)k * sizeof(float));
    memcpy(v, tmp, (size_t)n_head * hd * k * sizeof(float));
    free(tmp);
}

static inline void fx_role(fx_model *fx, tk_role role, int layer, tk_dtype wtype) {
    int64_t ne[4];
    arch_tensor_shape(&fx->hp, role, ne);
    int64_t n = ne[0] * ne[1];
    float *v = malloc((size_t)n * sizeof(float));
    uint64_t seed = 0x1234u + (uint64_t)role * 1000003u + (uint64_t)layer * 7919u;
    bool norm = role == TK_ROLE_ATTN_NORM || role == TK_ROLE_FFN_NORM || role == TK_ROLE_OUTPUT_NORM ||
                role == TK_ROLE_Q_NORM || role == TK_ROLE_K_NORM;
    float scale = arch_role_is_matmul(role)  ? 1.5f / sqrtf((float)ne[0])
                  : role == TK_ROLE_TOK_EMBD ? 1.0f
                                             : 0.2f;
    for (int64_t i = 0; i < n; i++) v[i] = (norm ? 1.0f : 0.0f) + scale * fx_uniform(&seed);
    tk_dtype type = arch_role_is_matmul(role) || role == TK_ROLE_TOK_EMBD ? wtype : TK_DTYPE_F32;
    if (role == TK_ROLE_ROPE_FREQS)
        for (int i = 0; i < ne[0]; i++) v[i] = fx_llama3_factor(&fx->hp, i);
    if (fx->permuted && (role == TK_ROLE_Q || role == TK_ROLE_K))
        fx_permute(v, role == TK_ROLE_Q ? fx->hp.n_head : fx->hp.n_head_kv, fx->hp.head_dim, ne[0]);
    char name[96];
    arch_tensor_name(fx->naming, role, layer, name, sizeof name);
    fx_add(fx, name, type, ne, v);
    free(v);
}

/* fx_build with other shapes (hp from fx_hparams, then changed). */
static inline void fx_build_hp(fx_model *fx, const tk_hparams *hp, tk_dtype wtype, tk_naming naming) {
    memset(fx, 0, sizeof *fx);
    fx->hp = *hp;
    const tk_arch arch = hp->arch;
    fx->naming = naming;
    fx->permuted = naming == TK_NAMING_GGUF && arch == TK_ARCH_LLAMA;
    for (int l = 0; l < fx->hp.n_layer; l++)
        for (int r = 0; r < TK_ROLE_LAYER_COUNT; r++) {
            if (!fx->hp.qkv_bias && (r == TK_ROLE_Q_BIAS || r == TK_ROLE_K_BIAS || r == TK_ROLE_V_BIAS))
                continue;
            if (!fx->hp.qk_norm && (r == TK_ROLE_Q_NORM || r == TK_ROLE_K_NORM)) continue;
            fx_role(fx, (tk_role)r, l, wtype);
        }
    fx_role(fx, TK_ROLE_TOK_EMBD, 0, wtype);
    fx_role(fx, TK_ROLE_OUTPUT_NORM, 0, wtype);
    if (!fx->hp.tied) fx_role(fx, TK_ROLE_OUTPUT, 0, wtype);
    if (naming == TK_NAMING_GGUF && fx->hp.rope_scaling == TK_ROPE_SCALING_LLAMA3)
        fx_role(fx, TK_ROLE_ROPE_FREQS, 0, wtype);
}

static inline void fx_build(fx_model *fx, tk_arch arch, tk_dtype wtype, tk_naming naming) {
    tk_hparams hp;
    fx_hparams(&hp, arch);
    fx_build_hp(fx, &hp, wtype, naming);
}

static inline void fx_free(fx_model *fx) {
    for (int i = 0; i < fx->n; i++) tk_free_aligned(fx->data[i]);
    fx->n = 0;
}

static inline tk_tensor *fx_get(fx_model *fx, const char *name) {
    for (int i = 0; i < fx->n; i++)
        if (!strcmp(fx->names[i], name)) return &fx->t[i];
    return NULL;
}

/* Remove a tensor by name (swap with the last). */
static inline void fx_remove(fx_model *fx, const char *name) {
    for (int i = 0; i < fx->n; i++)
        if (!strcmp(fx->names[i], name)) {
            tk_free_aligned(fx->data[i]);
            int last = --fx->n;
            if (i != last) {
                fx->t[i] = fx->t[last];
                memcpy(fx->names[i], fx->names[last], sizeof fx->names[i]);
                fx->data[i] = fx->data[last];
                fx->t[i].name = fx->names[i];
            }
            return;
        }
}

static inline const tk_tensor *fx_find(void *ctx, const char *name) { return fx_get(ctx, name); }

static inline tk_status fx_open(fx_model *fx, const tk_model_opts *o, tk_model **out) {
    model_source src = {fx->naming, fx_find, fx};
    return model_create(&fx->hp, &src, o, out);
}

/* ---- float64 reference forward over the loaded weights ------------------------ */

static inline void fx_rows(const tk_tensor *t, int64_t r, double *out) {
    int64_t k = t->ne[0];
    float *tmp = malloc((size_t)k * sizeof(float));
    kern_dequant_tensor_row(kernels_get(TK_ISA_SCALAR), t, r, tmp); /* any layout */
    for (int64_t i = 0; i < k; i++) out[i] = tmp[i];
    free(tmp);
}

static inline void fx_matvec(const tk_tensor *w, const double *x, double *y) {
    int64_t k = w->ne[0];
    double *row = malloc((size_t)k * sizeof(double));
    for (int64_t r = 0; r < w->ne[1]; r++) {
        fx_rows(w, r, row);
        double s = 0;
        for (int64_t i = 0; i < k; i++) s += row[i] * x[i];
        y[r] = s;
    }
    free(row);
}

static inline void fx_rmsnorm(const double *x, const float *w, int64_t n, double eps, double *out) {
    double ss = 0;
    for (int64_t i = 0; i < n; i++) ss += x[i] * x[i];
    double inv = 1.0 / sqrt(ss / n + eps);
    for (int64_t i = 0; i < n; i++) out[i] = x[i] * inv * w[i];
}

/* Logits (n x n_vocab) at every position of one sequence of n tokens. */
static inline void fx_reference(const tk_model *m, const int32_t *toks, int n, float *logits) {
    const tk_hparams *hp = &m->hp;
    int D = hp->n_embd, hd = hp->head_dim, nh = hp->n_head, nkv = hp->n_head_kv, F = hp->n_ff,
        V = hp->n_vocab;
    int qd = nh * hd, kvd = nkv * hd;
    double *K = calloc((size_t)hp->n_layer * n * kvd, sizeof(double));
    double *Vc = calloc((size_t)hp->n_layer * n * kvd, sizeof(double));
    double *x = malloc(D * sizeof(double)), *xn = malloc(D * sizeof(double)),
           *q = malloc(qd * sizeof(double));
    double *att = malloc(qd * sizeof(double)), *o = malloc(D * sizeof(double)),
           *g = malloc(F * sizeof(double));
    double *u = malloc(F * sizeof(double)), *sc = malloc((size_t)n * sizeof(double)),
           *lg = malloc(V * sizeof(double));
    for (int p = 0; p < n; p++) {
        fx_rows(&m->tok_embd, toks[p], x);
        for (int l = 0; l < hp->n_layer; l++) {
            const tk_layer *L = &m->layers[l];
            double *kp = K + ((size_t)l * n + p) * kvd, *vp = Vc + ((size_t)l * n + p) * kvd;
            fx_rmsnorm(x, L->attn_norm, D, hp->rms_eps, xn);
            fx_matvec(&L->wq, xn, q);
            fx_matvec(&L->wk, xn, kp);
            fx_matvec(&L->wv, xn, vp);
            for (int i = 0; L->bq && i < qd; i++) q[i] += L->bq[i];
            for (int i = 0; L->bk && i < kvd; i++) kp[i] += L->bk[i], vp[i] += L->bv[i];
            for (int h = 0; h < nh + nkv; h++) {
                double *v = h < nh ? q + h * hd : kp + (h - nh) * hd;
                if (L->q_norm) fx_rmsnorm(v, h < nh ? L->q_norm : L->k_norm, hd, hp->rms_eps, v);
                for (int i = 0; i < hd / 2; i++) {
                    double th = (double)p * m->rope_freqs[i], a = v[i], b = v[i + hd / 2];
                    v[i] = a * cos(th) - b * sin(th);
                    v[i + hd / 2] = a * sin(th) + b * cos(th);
                }
            }
            for (int h = 0; h < nh; h++) {
                int kh = h / (nh / nkv);
                double mx = -INFINITY, sum = 0;
                for (int j = 0; j <= p; j++) {
                    double s = 0;
                    for (int i = 0; i < hd; i++)
                        s += q[h * hd + i] * K[((size_t)l * n + j) * kvd + kh * hd + i];
                    sc[j] = s / sqrt((double)hd);
                    if (sc[j] > mx) mx = sc[j];
                }
                for (int j = 0; j <= p; j++) sum += (sc[j] = exp(sc[j] - mx));
                for (int i = 0; i < hd; i++) {
                    double a = 0;
                    for (int j = 0; j <= p; j++) a += sc[j] * Vc[((size_t)l * n + j) * kvd + kh * hd + i];
                    att[h * hd + i] = a / sum;
                }
            }
            fx_matvec(&L->wo, att, o);
            for (int i = 0; i < D; i++) x[i] += o[i];
            fx_rmsnorm(x, L->ffn_norm, D, hp->rms_eps, xn);
            fx_matvec(&L->w_gate, xn, g);
            fx_matvec(&L->w_up, xn, u);
            for (int i = 0; i < F; i++) g[i] = g[i] / (1.0 + exp(-g[i])) * u[i];
            fx_matvec(&L->w_down, g, o);
            for (int i = 0; i < D; i++) x[i] += o[i];
        }
        fx_rmsnorm(x, m->output_norm, D, hp->rms_eps, xn);
        fx_matvec(&m->output, xn, lg);
        for (int i = 0; i < V; i++) logits[(size_t)p * V + i] = (float)lg[i];
    }
    free(K), free(Vc), free(x), free(xn), free(q), free(att), free(o), free(g), free(u), free(sc), free(lg);
}

/* max |a-b| / max |b| */
static inline double fx_rel_err(const float *a, const float *b, size_t n) {
    double md = 0, mb = 0;
    for (size_t i = 0; i < n; i++) {
        double d = fabs((double)a[i] - b[i]);
        if (d > md) md = d;
        if (fabs(b[i]) > mb) mb = fabs(b[i]);
    }
    return mb > 0 ? md / mb : md;
}

#endif
