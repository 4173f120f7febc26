/* Loading a model: validate hyper-parameters, look up and check every tensor,
 * convert what the forward pass needs in another form (norms to f32, GGUF llama
 * Q/K rows un-permuted, optional repack of the matmul weights), and account for
 * the bytes a decode token reads. */
#include "model/model.h"

#include <errno.h>
#include <math.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>

#include "core/alloc.h"
#include "core/checked.h"
#include "core/error.h"
#include "core/log.h"
#include "core/pool.h"
#include "kernels/kernels.h"
#include "model/model_internal.h"

void tk_model_opts_default(tk_model_opts *o) {
    memset(o, 0, sizeof *o);
    o->repack = TK_WEIGHTS_KEEP;
}

/* The internal type of each public weight type (KEEP has none). */
static const tk_dtype WEIGHT_DTYPE[] = {
    [TK_WEIGHTS_F32] = TK_DTYPE_F32,   [TK_WEIGHTS_F16] = TK_DTYPE_F16,   [TK_WEIGHTS_BF16] = TK_DTYPE_BF16,
    [TK_WEIGHTS_Q8_0] = TK_DTYPE_Q8_0, [TK_WEIGHTS_Q4_0] = TK_DTYPE_Q4_0, [TK_WEIGHTS_Q4_K] = TK_DTYPE_Q4_K,
    [TK_WEIGHTS_Q6_K] = TK_DTYPE_Q6_K,
};
#define N_WEIGHT_TYPES ((int)(sizeof WEIGHT_DTYPE / sizeof WEIGHT_DTYPE[0]))

const char *tk_weight_type_name(tk_weight_type t) {
    if (t == TK_WEIGHTS_KEEP) return "keep";
    if ((int)t < 0 || (int)t >= N_WEIGHT_TYPES) return NULL;
    return dtype_name(WEIGHT_DTYPE[t]);
}

bool tk_weight_type_from_name(const char *name, tk_weight_type *out) {
    if (!name) return false;
    for (int i = 0; i < N_WEIGHT_TYPES; i++)
        if (!strcmp(name, tk_weight_type_name((tk_weight_type)i))) {
            *out = (tk_weight_type)i;
            return true;
        }
    return false;
}

const tk_hparams *model_hparams(const tk_model *m) { return &m->hp; }
const struct tk_tokenizer *model_tokenizer(const tk_model *m) { return m->tok; }
uint64_t model_decode_bytes(const tk_model *m) { return m->decode_bytes; }
void model_resident_region(const tk_model *m, void **p, size_t *n) {
    *p = m->resident;
    *n = m->resident ? m->resident_size : 0;
}
const char *model_weight_dtype(const tk_model *m) { return m->weight_dtype; }

void tk_model_free(tk_model *m) {
    if (!m) return;
    for (int i = 0; i < m->n_owned; i++) tk_free_aligned(m->owned[i]);
    tk_free(m->owned);
    tk_free_huge(m->resident, m->resident_size);
    tk_free(m->layers);
    tk_free(m->name);
    tok_free(m->tok);
    gguf_close(m->gguf);
    if (m->src_close) m->src_close(m->src_handle);
    tk_free(m);
}

/* An aligned buffer owned by the model (freed with it): zeroed, or with raw
 * not (model_own_raw: the caller writes it whole; a repack's threads then
 * fault its pages in as they write, no zeroing pass before them). */
static void *model_own_as(tk_model *m, size_t n, bool raw) {
    if (m->n_owned == m->cap_owned) {
        int cap = m->cap_owned ? m->cap_owned * 2 : 64;
        void **p = tk_realloc(m->owned, (size_t)cap * sizeof *p);
        if (!p) return NULL;
        m->owned = p;
        m->cap_owned = cap;
    }
    void *b = (raw ? tk_alloc_aligned_raw : tk_alloc_aligned)(n ? n : 1, 64);
    if (b) m->owned[m->n_owned++] = b;
    return b;
}
static void *model_own(tk_model *m, size_t n) { return model_own_as(m, n, false); }
static void *model_own_raw(tk_model *m, size_t n) { return model_own_as(m, n, true); }

/* ---- tensor lookup and checks --------------------------------------------------- */

static void shape_str(const int64_t ne[4], char *buf, size_t n) {
    int nd = 4;
    while (nd > 1 && ne[nd - 1] == 1) nd--;
    size_t off = 0;
    off += (size_t)snprintf(buf + off, n - off, "[");
    for (int i = 0; i < nd && off < n; i++)
        off += (size_t)snprintf(buf + off, n - off, "%s%lld", i ? ", " : "", (long long)ne[i]);
    if (off < n) snprintf(buf + off, n - off, "]");
}

/* The tensor of a role, shape-checked; *t = NULL when absent and !required. */
static tk_status find_role(const tk_model *m, const model_source *src, tk_role role, int layer, bool required,
                           const tk_tensor **t) {
    char name[128];
    *t = NULL;
    if (!arch_tensor_name(src->naming, role, layer, name, sizeof name)) {
        if (required) return tk_fail(TK_ERR_INTERNAL, "model: no tensor name for role %d", (int)role);
        return TK_OK;
    }
    const tk_tensor *x = src->find(src->ctx, name);
    if (!x) {
        if (required) return tk_fail(TK_ERR_FORMAT, "model: missing tensor %s", name);
        return TK_OK;
    }
    int64_t ne[4];
    arch_tensor_shape(&m->hp, role, ne);
    if (x->ne[0] != ne[0] || x->ne[1] != ne[1] || x->ne[2] != ne[2] || x->ne[3] != ne[3]) {
        char want[96], got[96];
        shape_str(ne, want, sizeof want);
        shape_str(x->ne, got, sizeof got);
        return tk_fail(TK_ERR_FORMAT, "model: tensor %s has shape %s, expected %s for %s", name, got, want,
                       arch_name(m->hp.arch));
    }
    *t = x;
    return TK_OK;
}

/* Norms, biases and rope factors: small vectors converted to owned f32. */
static tk_status load_vector(tk_model *m, const model_source *src, tk_role role, int layer, bool required,
                             const float **out) {
    const tk_tensor *t;
    tk_status st = find_role(m, src, role, layer, required, &t);
    *out = NULL;
    if (st || !t) return st;
    if (t->type != TK_DTYPE_F32 && t->type != TK_DTYPE_F16 && t->type != TK_DTYPE_BF16)
        return tk_fail(TK_ERR_FORMAT, "model: tensor %s has type %s (expected f32, f16 or bf16)", t->name,
                       dtype_name(t->type));
    int64_t n = t->ne[0];
    float *v = model_own(m, (size_t)n * sizeof(float));
    if (!v) return tk_fail(TK_ERR_NOMEM, "model: out of memory for %s", t->name);
    const uint8_t *p = t->data;
    for (int64_t i = 0; i < n; i++) {
        if (t->type == TK_DTYPE_F32) {
            memcpy(&v[i], p + 4 * i, 4);
        } else {
            uint16_t h;
            memcpy(&h, p + 2 * i, 2);
            v[i] = t->type == TK_DTYPE_F16 ? tk_f16_to_f32(h) : tk_bf16_to_f32(h);
        }
    }
    *out = v;
    return TK_OK;
}

static tk_status row_bytes_of(const tk_tensor *t, tk_dtype type, uint64_t *rb) {
    if (!dtype_row_bytes(type, (uint64_t)t->ne[0], rb))
        return tk_fail(TK_ERR_FORMAT, "model: tensor %s rows of %lld are not whole %s blocks", t->name,
                       (long long)t->ne[0], dtype_name(type));
    return TK_OK;
}

void model_unpermute_rows(const void *src, void *dst, int n_head, int head_dim, size_t row_bytes) {
    /* llama.cpp's converter stores HF row j*(hd/2)+i of a head at row 2i+j. */
    const uint8_t *s = src;
    uint8_t *d = dst;
    int half = head_dim / 2;
    for (int h = 0; h < n_head; h++)
        for (int r = 0; r < head_dim; r++) {
            int i = r % half, j = r / half;
            size_t from = ((size_t)h * head_dim + (size_t)(2 * i + j)) * row_bytes;
            size_t to = ((size_t)h * head_dim + (size_t)r) * row_bytes;
            memcpy(d + to, s + from, row_bytes);
        }
}

/* ---- load-time work on every CPU ------------------------------------------------ */

/* Runs fn(ctx, ith, nth) on as many threads as the process has CPUs (at most
 * 16, and at most max: the load's copies and conversions are memory-bound
 * past a few), or on the caller alone where a pool cannot start. fn must
 * give the same result for any nth. */
static void load_parallel(tk_pool_fn fn, void *ctx, int max) {
    tk_pool *pool = pool_open_allowed(max < 16 ? max : 16);
    pool_run_here(pool, fn, ctx);
    pool_free(pool);
}

/* Rows [r0, r1) of a repack: each dequantized to f32 (tmp, k floats) and
 * converted; Q8_0 and Q8_K through the level's activation quantizers, which
 * give their references' bytes (kernels_test_simd). */
typedef struct repack_job {
    const tk_kernels *K;
    const tk_tensor *t;
    tk_dtype to;
    uint8_t *out;
    size_t rb_from, rb_to;
    int64_t rows;
    atomic_bool failed, nomem;
} repack_job;

static void repack_rows(void *ctx, int ith, int nth) {
    repack_job *j = ctx;
    const int64_t k = j->t->ne[0];
    long r0, r1;
    pool_split((long)j->rows, ith, nth, 1, &r0, &r1);
    float *tmp = r0 < r1 ? tk_malloc((size_t)k * sizeof(float)) : NULL;
    if (r0 < r1 && !tmp) {
        atomic_store(&j->nomem, true);
        return;
    }
    const uint8_t *in = j->t->data;
    for (long r = r0; r < r1 && !atomic_load_explicit(&j->failed, memory_order_relaxed); r++) {
        j->K->dequant_row[j->t->type](in + (size_t)r * j->rb_from, tmp, k);
        void *dst = j->out + (size_t)r * j->rb_to;
        if (j->to == TK_DTYPE_Q8_0 && k % TK_QK8_0 == 0)
            j->K->quant_q8_0(tmp, dst, k);
        else if (j->to == TK_DTYPE_Q8_K && k % TK_QK_K == 0)
            j->K->quant_q8_k(tmp, dst, k);
        else if (!kern_quantize_row(j->to, tmp, dst, k))
            atomic_store(&j->failed, true);
    }
    tk_free(tmp);
}

/* Convert every row of t to type `to` into an owned buffer (dequantize to f32,
 * then quantize), so a BF16 file can run as Q8_0 ("W8A8"); the rows split
 * over the CPUs. */
static tk_status repack(tk_model *m, tk_tensor *t, tk_dtype to) {
    const tk_kernels *K = kernels_default();
    if (!K->dequant_row[t->type])
        return tk_fail(TK_ERR_UNSUPPORTED, "model: cannot read %s rows of %s", dtype_name(t->type), t->name);
    uint64_t rb_from, rb_to, total;
    tk_status st;
    if ((st = row_bytes_of(t, t->type, &rb_from)) || (st = row_bytes_of(t, to, &rb_to))) return st;
    int64_t rows = t->ne[1] * t->ne[2] * t->ne[3];
    if (!tk_mul_u64(rb_to, (uint64_t)rows, &total) || total > SIZE_MAX)
        return tk_fail(TK_ERR_NOMEM, "model: repacked %s too large", t->name);
    uint8_t *out = model_own_raw(m, (size_t)total); /* every row written below */
    if (!out) return tk_fail(TK_ERR_NOMEM, "model: out of memory repacking %s", t->name);
    repack_job job = {.K = K, .t = t, .to = to, .out = out, .rb_from = rb_from, .rb_to = rb_to, .rows = rows};
    atomic_init(&job.failed, false);
    atomic_init(&job.nomem, false);
    /* a thread per 256 KiB of output at most: small tensors stay on the caller */
    const uint64_t parts = total >> 18;
    load_parallel(repack_rows, &job, parts < 1 ? 1 : parts > 16 ? 16 : (int)parts);
    if (atomic_load(&job.nomem)) return tk_fail(TK_ERR_NOMEM, "model: out of memory repacking %s", t->name);
    if (atomic_load(&job.failed))
        return tk_fail(TK_ERR_UNSUPPORTED, "model: cannot repack %s to %s", t->name, dtype_name(to));
    t->type = to;
    t->data = out;
    t->nbytes = total;
    return TK_OK;
}

/* safetensors only pads its header to 8 bytes, so a tensor may start off its
 * element alignment; such a tensor gets an aligned copy (kernels load floats). */
static tk_status ensure_aligned(tk_model *m, tk_tensor *t) {
    uintptr_t need = t->type == TK_DTYPE_F32 ? 4 : 2;
    if ((uintptr_t)t->data % need == 0) return TK_OK;
    void *dst = model_own(m, (size_t)t->nbytes);
    if (!dst) return tk_fail(TK_ERR_NOMEM, "model: out of memory copying %s", t->name);
    memcpy(dst, t->data, (size_t)t->nbytes);
    t->data = dst;
    return TK_OK;
}

/* The type a weight of this role is repacked to; KEEP: none. */
static tk_weight_type repack_to(const tk_model_opts *o, tk_role role) {
    if (role == TK_ROLE_OUTPUT && o->repack_output != TK_WEIGHTS_KEEP) return o->repack_output;
    return o->repack;
}

/* A matmul weight: shape-checked, un-permuted for GGUF llama Q/K, repacked on request. */
static tk_status load_matmul(tk_model *m, const model_source *src, const tk_model_opts *o, tk_role role,
                             int layer, tk_tensor *out) {
    const tk_tensor *t;
    tk_status st = find_role(m, src, role, layer, true, &t);
    if (st) return st;
    *out = *t;
    const tk_kernels *K = kernels_default();
    if (!dtype_supported(t->type) || !kern_gemv(K, t->type, TK_LAYOUT_ROWS))
        return tk_fail(TK_ERR_UNSUPPORTED, "model: tensor %s has type %s, which has no matmul kernel",
                       t->name, dtype_name(t->type));
    uint64_t rb;
    if ((st = row_bytes_of(t, t->type, &rb))) return st;
    if (src->naming == TK_NAMING_GGUF && m->hp.arch == TK_ARCH_LLAMA &&
        (role == TK_ROLE_Q || role == TK_ROLE_K)) {
        int nh = role == TK_ROLE_Q ? m->hp.n_head : m->hp.n_head_kv;
        void *dst = model_own(m, (size_t)t->nbytes);
        if (!dst) return tk_fail(TK_ERR_NOMEM, "model: out of memory un-permuting %s", t->name);
        model_unpermute_rows(t->data, dst, nh, m->hp.head_dim, (size_t)rb);
        out->data = dst;
    }
    if ((st = ensure_aligned(m, out))) return st;
    tk_weight_type to = repack_to(o, role);
    if (to != TK_WEIGHTS_KEEP && WEIGHT_DTYPE[to] != out->type) {
        if ((st = repack(m, out, WEIGHT_DTYPE[to]))) return st;
        m->repacked = true;
    }
    return TK_OK;
}

static tk_status load_layer(tk_model *m, const model_source *src, const tk_model_opts *o, int l) {
    tk_layer *L = &m->layers[l];
    tk_status st;
    if ((st = load_vector(m, src, TK_ROLE_ATTN_NORM, l, true, &L->attn_norm))) return st;
    if ((st = load_matmul(m, src, o, TK_ROLE_Q, l, &L->wq))) return st;
    if ((st = load_matmul(m, src, o, TK_ROLE_K, l, &L->wk))) return st;
    if ((st = load_matmul(m, src, o, TK_ROLE_V, l, &L->wv))) return st;
    if ((st = load_matmul(m, src, o, TK_ROLE_O, l, &L->wo))) return st;
    bool bias = m->hp.qkv_bias;
    if ((st = load_vector(m, src, TK_ROLE_Q_BIAS, l, bias, &L->bq))) return st;
    if ((st = load_vector(m, src, TK_ROLE_K_BIAS, l, bias, &L->bk))) return st;
    if ((st = load_vector(m, src, TK_ROLE_V_BIAS, l, bias, &L->bv))) return st;
    if (m->hp.qk_norm) {
        if ((st = load_vector(m, src, TK_ROLE_Q_NORM, l, true, &L->q_norm))) return st;
        if ((st = load_vector(m, src, TK_ROLE_K_NORM, l, true, &L->k_norm))) return st;
    }
    if ((st = load_vector(m, src, TK_ROLE_FFN_NORM, l, true, &L->ffn_norm))) return st;
    if ((st = load_matmul(m, src, o, TK_ROLE_GATE, l, &L->w_gate))) return st;
    if ((st = load_matmul(m, src, o, TK_ROLE_UP, l, &L->w_up))) return st;
    if ((st = load_matmul(m, src, o, TK_ROLE_DOWN, l, &L->w_down))) return st;
    return TK_OK;
}

/* Inverse RoPE frequencies, theta^(-2i/d), divided by the scaling factor of
 * each frequency. Llama-3 factors follow the HF converter (the same numbers as
 * GGUF's rope_freqs.weight), rounded to float in both paths so HF and GGUF
 * checkpoints rotate identically. */
static tk_status rope_init(tk_model *m, const model_source *src) {
    const tk_hparams *hp = &m->hp;
    int half = hp->head_dim / 2;
    m->rope_freqs = model_own(m, (size_t)half * sizeof(float));
    if (!m->rope_freqs) return tk_fail(TK_ERR_NOMEM, "model: out of memory for rope frequencies");
    const float *tensor_factors = NULL;
    if (hp->rope_scaling == TK_ROPE_SCALING_LLAMA3 && src->naming == TK_NAMING_GGUF) {
        tk_status st = load_vector(m, src, TK_ROLE_ROPE_FREQS, 0, true, &tensor_factors);
        if (st) return st;
    }
    for (int i = 0; i < half; i++) {
        double f = 1.0 / pow((double)hp->rope_theta, (double)(2 * i) / hp->head_dim);
        float factor = 1.0f;
        if (hp->rope_scaling == TK_ROPE_SCALING_LINEAR) {
            factor = hp->rope_factor;
        } else if (tensor_factors) {
            factor = tensor_factors[i];
        } else if (hp->rope_scaling == TK_ROPE_SCALING_LLAMA3) {
            double old = hp->rope_orig_ctx, lo = hp->rope_low_freq_factor, hi = hp->rope_high_freq_factor;
            double wavelen = 2.0 * M_PI / f;
            if (wavelen < old / hi)
                factor = 1.0f;
            else if (wavelen > old / lo)
                factor = hp->rope_factor;
            else {
                double smooth = (old / wavelen - lo) / (hi - lo);
                factor = (float)(1.0 / ((1.0 - smooth) / hp->rope_factor + smooth));
            }
        }
        if (!(factor > 0.0f) || !isfinite(factor))
            return tk_fail(TK_ERR_FORMAT, "model: rope factor %d is %g (must be finite and > 0)", i,
                           (double)factor);
        m->rope_freqs[i] = (float)(f / (double)factor);
    }
    return TK_OK;
}

static uint64_t vec_bytes(int64_t n) { return (uint64_t)n * sizeof(float); }

/* A layer's matmul weights, in the order a decode token reads them: q, k,
 * v, output, gate, up, down. */
#define LAYER_MATMULS 7
static const size_t LAYER_MATMUL_OFF[LAYER_MATMULS] = {
    offsetof(tk_layer, wq),     offsetof(tk_layer, wk),   offsetof(tk_layer, wv),    offsetof(tk_layer, wo),
    offsetof(tk_layer, w_gate), offsetof(tk_layer, w_up), offsetof(tk_layer, w_down)};
static tk_tensor *layer_matmul(tk_layer *L, int i) { return (tk_tensor *)((char *)L + LAYER_MATMUL_OFF[i]); }
static const tk_tensor *layer_matmul_c(const tk_layer *L, int i) {
    return (const tk_tensor *)((const char *)L + LAYER_MATMUL_OFF[i]);
}

/* Bytes, parameters and the dominant type; decode_bytes = what one decode token reads. */
static void model_account(tk_model *m) {
    const tk_hparams *hp = &m->hp;
    uint64_t by_type[TK_DTYPE_COUNT] = {0};
    uint64_t layer_bytes = 0;
    int64_t params = 0;
    int64_t qd = (int64_t)hp->n_head * hp->head_dim, kvd = (int64_t)hp->n_head_kv * hp->head_dim;
    for (int l = 0; l < hp->n_layer; l++) {
        const tk_layer *L = &m->layers[l];
        for (int i = 0; i < LAYER_MATMULS; i++) {
            const tk_tensor *w = layer_matmul_c(L, i);
            layer_bytes += w->nbytes;
            by_type[w->type] += w->nbytes;
            params += w->ne[0] * w->ne[1];
        }
        int64_t vec = 2 * (int64_t)hp->n_embd;
        if (L->bq) vec += qd + 2 * kvd;
        if (L->q_norm) vec += 2 * (int64_t)hp->head_dim;
        layer_bytes += vec_bytes(vec);
        params += vec;
    }
    uint64_t emb_row = m->tok_embd.nbytes / (uint64_t)hp->n_vocab;
    params += (int64_t)hp->n_embd * hp->n_vocab + hp->n_embd; /* embeddings + output norm */
    if (!hp->tied) params += (int64_t)hp->n_embd * hp->n_vocab;
    m->n_params = params;
    m->decode_bytes = layer_bytes + vec_bytes(hp->n_embd) + m->output.nbytes + emb_row;
    m->weight_bytes = layer_bytes + vec_bytes(hp->n_embd) + m->tok_embd.nbytes;
    if (m->output.data != m->tok_embd.data) m->weight_bytes += m->output.nbytes;
    int best = 0;
    for (int t = 1; t < TK_DTYPE_COUNT; t++)
        if (by_type[t] > by_type[best]) best = t;
    m->weight_dtype = dtype_name((uint32_t)best);
}

static tk_status model_build(tk_model *m, const model_source *src, const tk_model_opts *o) {
    const tk_hparams *hp = &m->hp;
    tk_status st = arch_hparams_validate(hp);
    if (st) return st;
    m->layers = tk_calloc((size_t)hp->n_layer, sizeof *m->layers);
    if (!m->layers) return tk_fail(TK_ERR_NOMEM, "model: out of memory for %d layers", hp->n_layer);
    for (int l = 0; l < hp->n_layer; l++)
        if ((st = load_layer(m, src, o, l))) return st;

    const tk_tensor *emb;
    if ((st = find_role(m, src, TK_ROLE_TOK_EMBD, 0, true, &emb))) return st;
    if (!dtype_supported(emb->type) || !kernels_default()->dequant_row[emb->type])
        return tk_fail(TK_ERR_UNSUPPORTED, "model: tensor %s has unsupported type %s", emb->name,
                       dtype_name(emb->type));
    m->tok_embd = *emb;
    if ((st = ensure_aligned(m, &m->tok_embd))) return st;
    if ((st = load_vector(m, src, TK_ROLE_OUTPUT_NORM, 0, true, &m->output_norm))) return st;
    if (hp->tied) {
        /* The output matrix is the embedding matrix; a repack gets its own copy
         * so embedding lookups keep reading the file's rows. */
        m->output = m->tok_embd;
        if (!kern_gemv(kernels_default(), emb->type, TK_LAYOUT_ROWS))
            return tk_fail(TK_ERR_UNSUPPORTED, "model: tied %s has type %s, which has no matmul kernel",
                           emb->name, dtype_name(emb->type));
        tk_weight_type to = repack_to(o, TK_ROLE_OUTPUT);
        if (to != TK_WEIGHTS_KEEP && WEIGHT_DTYPE[to] != emb->type) {
            if ((st = repack(m, &m->output, WEIGHT_DTYPE[to]))) return st;
            m->repacked = true;
        }
    } else if ((st = load_matmul(m, src, o, TK_ROLE_OUTPUT, 0, &m->output))) {
        return st;
    }
    return rope_init(m, src);
}

/* Drop an owned buffer early (its tensor moved to the resident copy); a
 * pointer the model does not own (a file view) is left alone. */
static void model_disown(tk_model *m, const void *p) {
    for (int i = 0; i < m->n_owned; i++)
        if (m->owned[i] == p) {
            tk_free_aligned(m->owned[i]);
            m->owned[i] = m->owned[--m->n_owned];
            return;
        }
}

/* Whether a tensor is read by a matmul (the embedding only when tied). */
static bool is_matmul_weight(const tk_model *m, const tk_tensor *t) {
    return t != &m->tok_embd || m->output.data == m->tok_embd.data;
}

/* Copy every matmul weight (file views and owned repacks alike) to one
 * anonymous region advised for transparent huge pages, packing each matrix
 * into its type's interleaved layout on the way where the kernels have one
 * (kern_pack: Q8_0 by 16 or 8 rows, Q4_0 and Q4_K by 16, BF16 by pairs of 16 rows or by 4; with
 * o->bf16_dot, BF16 pairs whose gemv rounds activations to BF16; with
 * o->q8_coarse, Q8_0 requantized to a scale per 256 values), unless
 * o->row_layout. A layout that packs into fewer bytes (X16S) sets the
 * tensor's nbytes to them, so the byte counts (model_account) are what the
 * step reads. Decode
 * streams all weights every token; with 4 KiB file pages each page costs a
 * TLB walk and stops the hardware prefetcher, which measured 10-15% of the
 * read bandwidth here. */
#define HUGE_PAGE ((size_t)2 << 20)

/* The matrices model_make_resident copies: src[i] (sel[i]'s data) goes to
 * p + off[i] in the layout lay[i] its pack chose; threads take them largest
 * first and free a source the model owned (a repack) once it is copied. */
typedef struct resident_job {
    tk_model *m;
    const tk_model_opts *o;
    tk_tensor *const *sel;
    const void *const *src;
    const int *order;
    const size_t *off;
    tk_layout *lay;
    unsigned char *p;
    int k;
    atomic_int next;
    pthread_mutex_t owned; /* m->owned */
} resident_job;

static void resident_copy(void *ctx, int ith, int nth) {
    (void)ith, (void)nth;
    resident_job *j = ctx;
    for (int n; (n = atomic_fetch_add(&j->next, 1)) < j->k;) {
        const int i = j->order[n];
        const tk_tensor *t = j->sel[i];
        const int64_t rows = t->ne[1] * t->ne[2] * t->ne[3];
        tk_layout lay = TK_LAYOUT_ROWS;
        if (!j->o->row_layout && is_matmul_weight(j->m, t)) {
            const bool opt =
                t->type == TK_DTYPE_BF16 ? j->o->bf16_dot : t->type == TK_DTYPE_Q8_0 && j->o->q8_coarse;
            lay = (opt ? kern_pack_opt_in : kern_pack)(t->type, j->src[i], j->p + j->off[i], rows, t->ne[0]);
        }
        if (lay == TK_LAYOUT_ROWS) memcpy(j->p + j->off[i], j->src[i], (size_t)t->nbytes);
        j->lay[i] = lay;
        pthread_mutex_lock(&j->owned);
        model_disown(j->m, j->src[i]);
        pthread_mutex_unlock(&j->owned);
    }
}

static tk_status model_make_resident(tk_model *m, const tk_model_opts *o) {
    int n_layer = m->hp.n_layer, n = 0;
    tk_tensor **ts = tk_calloc((size_t)n_layer * LAYER_MATMULS + 2, 2 * sizeof *ts);
    if (!ts) return tk_fail(TK_ERR_NOMEM, "model: out of memory");
    /* the tensors to copy, each data pointer once */
    tk_tensor **sel = ts + (size_t)n_layer * LAYER_MATMULS + 2;
    for (int l = 0; l < n_layer; l++)
        for (int i = 0; i < LAYER_MATMULS; i++) ts[n++] = layer_matmul(&m->layers[l], i);
    ts[n++] = &m->tok_embd;
    ts[n++] = &m->output;
    size_t total = 0;
    int k = 0;
    for (int i = 0; i < n; i++) {
        bool dup = false;
        for (int j = 0; j < k; j++) dup |= sel[j]->data == ts[i]->data;
        if (dup) continue;
        sel[k++] = ts[i];
        total += ((size_t)ts[i]->nbytes + 63) & ~(size_t)63;
    }
    if (total == 0) {
        tk_free(ts);
        return TK_OK;
    }
    size_t size = (total + HUGE_PAGE - 1) / HUGE_PAGE * HUGE_PAGE;
    unsigned char *p = tk_alloc_huge(size, 0);
    if (!p) {
        tk_free(ts);
        return tk_fail(TK_ERR_NOMEM, "model: cannot map %zu bytes for the weights (use_mmap avoids the copy)",
                       size);
    }
    /* the packs are pure functions of their matrix: any number of threads
     * gives the same bytes */
    size_t *offs = tk_calloc((size_t)k, sizeof *offs + sizeof(void *) + sizeof(int) + sizeof(tk_layout));
    int *at = tk_calloc((size_t)n, sizeof *at);
    if (!offs || !at) {
        tk_free(offs);
        tk_free(at);
        tk_free_huge(p, size);
        tk_free(ts);
        return tk_fail(TK_ERR_NOMEM, "model: out of memory");
    }
    const void **src = (const void **)(offs + k);
    int *order = (int *)(src + k);
    tk_layout *lays = (tk_layout *)(order + k);
    size_t off = 0;
    for (int i = 0; i < k; i++) {
        offs[i] = off;
        off += ((size_t)sel[i]->nbytes + 63) & ~(size_t)63;
        src[i] = sel[i]->data;
        int r = i; /* insertion by size, largest first */
        while (r > 0 && sel[order[r - 1]]->nbytes < sel[i]->nbytes) {
            order[r] = order[r - 1];
            r--;
        }
        order[r] = i;
    }
    for (int j = 0; j < n; j++) /* which copy each tensor's data moves with (a tied output shares one) */
        for (int i = 0; i < k; i++)
            if (ts[j]->data == src[i]) at[j] = i;
    resident_job job = {
        .m = m, .o = o, .sel = sel, .src = src, .order = order, .off = offs, .lay = lays, .p = p, .k = k};
    atomic_init(&job.next, 0);
    pthread_mutex_init(&job.owned, NULL);
    load_parallel(resident_copy, &job, k);
    pthread_mutex_destroy(&job.owned);
    bool p16r = false;
    for (int j = 0; j < n; j++) {
        tk_tensor *t = ts[j];
        const int i = at[j];
        const int64_t rows = t->ne[1] * t->ne[2] * t->ne[3];
        const tk_weight_kernels *wk = kern_weight(t->type, lays[i]);
        t->data = p + offs[i];
        t->layout = lays[i];
        t->nbytes = wk && wk->packed_bytes ? wk->packed_bytes(rows, t->ne[0]) : t->nbytes;
        p16r |= t->layout == TK_LAYOUT_P16R;
    }
    /* times vdpbf16ps against two FMAs now, at load, not in a step */
    if (p16r && kernels_default()->isa == TK_ISA_AVX512) {
        double ratio;
        const bool hw = kern_bf16_dot_hw(&ratio);
        tk_log_info("bf16-dot: P16R runs as %s (two FMAs take %.2fx vdpbf16ps's time here)",
                    hw ? "vdpbf16ps" : "two FMAs", ratio);
    }
    tk_free(at);
    tk_free(offs);
    mprotect(p, size, PROT_READ);
    m->resident = p;
    m->resident_size = size;
    tk_free(ts);
    return TK_OK;
}

tk_status model_create(const tk_hparams *hp, const model_source *src, const tk_model_opts *o,
                       tk_model **out) {
    *out = NULL;
    tk_model_opts def;
    if (!o) {
        tk_model_opts_default(&def);
        o = &def;
    }
    if (!tk_weight_type_name(o->repack))
        return tk_fail(TK_ERR_INVALID, "model: repack type %d is not a tk_weight_type", (int)o->repack);
    if (!tk_weight_type_name(o->repack_output))
        return tk_fail(TK_ERR_INVALID, "model: output repack type %d is not a tk_weight_type",
                       (int)o->repack_output);
    tk_model *m = tk_calloc(1, sizeof *m);
    if (!m) return tk_fail(TK_ERR_NOMEM, "model: out of memory");
    m->hp = *hp;
    tk_status st = model_build(m, src, o);
    if (!st && !o->use_mmap) st = model_make_resident(m, o);
    if (!st) model_account(m); /* after the packs: their bytes (X16S) */
    if (st) {
        tk_model_free(m);
        return st;
    }
    *out = m;
    return TK_OK;
}

/* ---- GGUF ----------------------------------------------------------------------- */

static const tk_tensor *gguf_source_find(void *ctx, const char *name) { return gguf_find_tensor(ctx, name); }

static const char *base_name(const char *path) {
    const char *s = strrchr(path, '/');
    return s && s[1] ? s + 1 : path;
}

/* The model of an open GGUF file f (owned from here on: closed on failure). */
static tk_status model_from_gguf(gguf_file *f, const char *path, const tk_model_opts *o, tk_model **out) {
    tk_status st;
    tk_hparams hp;
    if ((st = arch_hparams_gguf(f, &hp))) {
        gguf_close(f);
        return st;
    }
    model_source src = {TK_NAMING_GGUF, gguf_source_find, f};
    tk_model *m;
    if ((st = model_create(&hp, &src, o, &m))) {
        gguf_close(f);
        return st;
    }
    m->gguf = f;
    gguf_str nm;
    bool found = false;
    if (gguf_get_str(f, "general.name", &nm, &found) == TK_OK && found)
        m->name = tk_strndup(nm.ptr, (size_t)nm.len);
    else
        m->name = tk_strdup(base_name(path));
    if (!m->name) {
        tk_model_free(m);
        return tk_fail(TK_ERR_NOMEM, "model: out of memory");
    }
    if (gguf_find(f, "tokenizer.ggml.tokens")) {
        if ((st = tok_load_gguf(f, &m->tok))) {
            tk_model_free(m);
            return st;
        }
        if (tok_n_vocab(m->tok) > hp.n_vocab) {
            int nv = tok_n_vocab(m->tok);
            tk_model_free(m);
            return tk_fail(TK_ERR_FORMAT, "model: tokenizer has %d tokens but the embedding only %d rows", nv,
                           hp.n_vocab);
        }
    }
    *out = m;
    return TK_OK;
}

static tk_status model_open_gguf(const char *path, const tk_model_opts *o, tk_model **out) {
    gguf_file *f;
    tk_status st = gguf_open(path, &f);
    if (st) return st; /* gguf_open's messages name the path */
    if ((st = model_from_gguf(f, path, o, out))) tk_error_prefix("%s", path);
    return st;
}

/* Every message names the path once: the GGUF and HF readers name the file
 * they fail on, and the model steps after them are prefixed with it. */
tk_status tk_model_open(const char *path, const tk_model_opts *opts, tk_model **out) {
    if (!path || !out) return tk_fail(TK_ERR_INVALID, "model: NULL path or output");
    *out = NULL;
    struct stat sb;
    if (stat(path, &sb) != 0) return tk_fail(TK_ERR_IO, "%s: cannot open: %s", path, strerror(errno));
    return S_ISDIR(sb.st_mode) ? model_open_hf(path, opts, out) : model_open_gguf(path, opts, out);
}

void model_dtype_bytes(const tk_model *m, uint64_t *bytes) {
    const tk_hparams *hp = &m->hp;
    memset(bytes, 0, TK_DTYPE_COUNT * sizeof *bytes);
    int64_t vec = hp->n_embd;
    for (int l = 0; l < hp->n_layer; l++) {
        const tk_layer *L = &m->layers[l];
        for (int i = 0; i < LAYER_MATMULS; i++) {
            const tk_tensor *w = layer_matmul_c(L, i);
            bytes[w->type] += w->nbytes;
        }
        vec += 2 * (int64_t)hp->n_embd;
        if (L->bq) vec += ((int64_t)hp->n_head + 2 * hp->n_head_kv) * hp->head_dim;
        if (L->q_norm) vec += 2 * (int64_t)hp->head_dim;
    }
    bytes[TK_DTYPE_F32] += vec_bytes(vec);
    bytes[m->tok_embd.type] += m->tok_embd.nbytes;
    if (m->output.data != m->tok_embd.data) bytes[m->output.type] += m->output.nbytes;
}

int model_n_matmuls(const tk_model *m) { return LAYER_MATMULS * m->hp.n_layer + 1; }

const tk_tensor *model_matmul(const tk_model *m, int i) {
    TK_ASSERT(i >= 0 && i < model_n_matmuls(m));
    if (i == LAYER_MATMULS * m->hp.n_layer) return &m->output;
    return layer_matmul_c(&m->layers[i / LAYER_MATMULS], i % LAYER_MATMULS);
}

void tk_model_get_info(const tk_model *m, tk_model_info *out) {
    const tk_hparams *hp = &m->hp;
    memset(out, 0, sizeof *out);
    out->arch = arch_name(hp->arch);
    out->name = m->name ? m->name : "";
    out->n_layer = hp->n_layer;
    out->n_embd = hp->n_embd;
    out->n_head = hp->n_head;
    out->n_head_kv = hp->n_head_kv;
    out->head_dim = hp->head_dim;
    out->n_ff = hp->n_ff;
    out->n_vocab = hp->n_vocab;
    out->n_ctx_train = hp->n_ctx_train;
    out->n_params = m->n_params;
    out->weight_bytes = m->weight_bytes;
    out->decode_bytes = m->decode_bytes;
    /* K and V, every layer, f16 elements. */
    out->kv_bytes_per_token =
        2ull * (uint64_t)hp->n_layer * (uint64_t)hp->n_head_kv * (uint64_t)hp->head_dim * 2ull;
    out->weight_dtype = m->weight_dtype;
    out->tied_embeddings = hp->tied;
}
