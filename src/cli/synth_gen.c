/* The tensor plan and the seeded weight generator of `tokamak synth`. */
#include <math.h>
#include <stdatomic.h>
#include <stdio.h>
#include <string.h>

#include "cli/synth.h"
#include "core/alloc.h"
#include "core/error.h"
#include "core/pool.h"
#include "kernels/kernels.h"

/* Output #ctr of a splitmix64 stream started at `key`: counter-based, so any
 * element of any tensor can be generated without generating the ones before. */
static uint64_t splitmix_at(uint64_t key, uint64_t ctr) {
    uint64_t z = key + (ctr + 1) * 0x9E3779B97F4A7C15ull;
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

static uint64_t name_key(uint64_t seed, const char *name) {
    uint64_t h = 0xcbf29ce484222325ull; /* FNV-1a */
    for (const unsigned char *p = (const unsigned char *)name; *p; p++) h = (h ^ *p) * 0x100000001b3ull;
    return splitmix_at(seed, h);
}

/* Standard normal values for elements [i0, i0+n) of a stream: element 2m and
 * 2m+1 are the cosine and sine halves of one Box-Muller pair. */
static void gauss_range(uint64_t key, uint64_t i0, int64_t n, float *out) {
    const double two_pi = 6.283185307179586476925286766559;
    for (int64_t j = 0; j < n;) {
        uint64_t i = i0 + (uint64_t)j, m = i >> 1;
        double u1 = (double)((splitmix_at(key, 2 * m) >> 11) + 1) * 0x1.0p-53; /* (0, 1] */
        double u2 = (double)(splitmix_at(key, 2 * m + 1) >> 11) * 0x1.0p-53;
        double r = sqrt(-2.0 * log(u1)), th = two_pi * u2;
        if (!(i & 1)) out[j++] = (float)(r * cos(th));
        if (j < n) out[j++] = (float)(r * sin(th));
    }
}

const char *synth_quant_name(synth_quant q) {
    static const char *const names[] = {"f32", "f16", "bf16", "q8_0", "q4_0", "q4_k_m"};
    return (unsigned)q < sizeof names / sizeof names[0] ? names[q] : "?";
}

uint32_t synth_file_type(synth_quant q) {
    switch (q) { /* llama_ftype values */
    case SYNTH_F32:
        return 0;
    case SYNTH_F16:
        return 1;
    case SYNTH_Q4_0:
        return 2;
    case SYNTH_Q8_0:
        return 7;
    case SYNTH_Q4_K_M:
        return 15;
    case SYNTH_BF16:
        return 32;
    }
    return 0;
}

/* Storage type of a 2-D weight. Q4_K_M follows llama.cpp's recipe: Q6_K for
 * attn_v, ffn_down and the output matrix (token_embd when tied, since it is the
 * output too), Q4_K for the rest; rows that are not whole 256-blocks fall back
 * to Q4_0 / Q8_0 as llama.cpp falls back to 32-blocks. */
static tk_dtype matrix_type(const synth_cfg *c, const char *gguf_name, int64_t row_len) {
    switch (c->quant) {
    case SYNTH_F32:
        return TK_DTYPE_F32;
    case SYNTH_F16:
        return TK_DTYPE_F16;
    case SYNTH_BF16:
        return TK_DTYPE_BF16;
    case SYNTH_Q8_0:
        return TK_DTYPE_Q8_0;
    case SYNTH_Q4_0:
        return TK_DTYPE_Q4_0;
    case SYNTH_Q4_K_M:
        break;
    }
    bool hi = strstr(gguf_name, "attn_v.") || strstr(gguf_name, "ffn_down.") ||
              !strcmp(gguf_name, "output.weight") || (c->p.tied && !strcmp(gguf_name, "token_embd.weight"));
    if (row_len % TK_QK_K) return hi ? TK_DTYPE_Q8_0 : TK_DTYPE_Q4_0;
    return hi ? TK_DTYPE_Q6_K : TK_DTYPE_Q4_K;
}

typedef struct plan_builder {
    const synth_cfg *c;
    synth_tensor *t;
    int n, cap;
    tk_status st;
} plan_builder;

static void plan_add(plan_builder *b, const char *gguf, const char *hf, synth_kind kind, int64_t ne0,
                     int64_t ne1, int permute_heads) {
    if (b->st != TK_OK) return;
    if (b->n == b->cap) {
        int cap = b->cap ? 2 * b->cap : 64;
        synth_tensor *nt = tk_realloc(b->t, (size_t)cap * sizeof *nt);
        if (!nt) {
            b->st = tk_fail(TK_ERR_NOMEM, "synth: out of memory for the tensor plan");
            return;
        }
        b->t = nt;
        b->cap = cap;
    }
    synth_tensor *t = &b->t[b->n++];
    memset(t, 0, sizeof *t);
    snprintf(t->gguf_name, sizeof t->gguf_name, "%s", gguf);
    snprintf(t->hf_name, sizeof t->hf_name, "%s", hf);
    t->kind = kind;
    t->n_dims = ne1 > 0 ? 2 : 1;
    t->ne[0] = ne0;
    t->ne[1] = ne1 > 0 ? ne1 : 1;
    t->permute_heads = permute_heads;
    t->key = name_key(b->c->seed, hf[0] ? hf : gguf);
    t->gguf_type = t->n_dims == 2 ? matrix_type(b->c, gguf, ne0) : TK_DTYPE_F32;
    int be = dtype_block_elems(t->gguf_type);
    if (be > 1 && ne0 % be)
        b->st = tk_fail(TK_ERR_INVALID,
                        "synth: tensor %s has rows of %lld elements, not a multiple of the %s block (%d)",
                        gguf, (long long)ne0, dtype_name(t->gguf_type), be);
}

/* A tensor of layer l: "blk.<l>.<gguf>" and "model.layers.<l>.<hf>". */
static void plan_add_layer(plan_builder *b, int l, const char *gguf, const char *hf, synth_kind kind,
                           int64_t ne0, int64_t ne1, int permute_heads) {
    char g[64], h[80];
    snprintf(g, sizeof g, "blk.%d.%s", l, gguf);
    snprintf(h, sizeof h, "model.layers.%d.%s", l, hf);
    plan_add(b, g, h, kind, ne0, ne1, permute_heads);
}

tk_status synth_plan(const synth_cfg *c, synth_tensor **out, int *n_out) {
    const tk_preset *p = &c->p;
    plan_builder b = {.c = c};
    int64_t E = p->n_embd, Q = (int64_t)p->n_head * p->head_dim, KV = (int64_t)p->n_head_kv * p->head_dim;
    bool llama = !strcmp(p->arch, "llama");
    plan_add(&b, "token_embd.weight", "model.embed_tokens.weight", SYNTH_MATRIX, E, p->n_vocab, 0);
    if (p->rope_factor > 0) plan_add(&b, "rope_freqs.weight", "", SYNTH_ROPE_FREQS, p->head_dim / 2, 0, 0);
    for (int l = 0; l < p->n_layer; l++) {
        plan_add_layer(&b, l, "attn_norm.weight", "input_layernorm.weight", SYNTH_NORM, E, 0, 0);
        plan_add_layer(&b, l, "attn_q.weight", "self_attn.q_proj.weight", SYNTH_MATRIX, E, Q,
                       llama ? p->n_head : 0);
        if (p->qkv_bias) plan_add_layer(&b, l, "attn_q.bias", "self_attn.q_proj.bias", SYNTH_BIAS, Q, 0, 0);
        plan_add_layer(&b, l, "attn_k.weight", "self_attn.k_proj.weight", SYNTH_MATRIX, E, KV,
                       llama ? p->n_head_kv : 0);
        if (p->qkv_bias) plan_add_layer(&b, l, "attn_k.bias", "self_attn.k_proj.bias", SYNTH_BIAS, KV, 0, 0);
        plan_add_layer(&b, l, "attn_v.weight", "self_attn.v_proj.weight", SYNTH_MATRIX, E, KV, 0);
        if (p->qkv_bias) plan_add_layer(&b, l, "attn_v.bias", "self_attn.v_proj.bias", SYNTH_BIAS, KV, 0, 0);
        plan_add_layer(&b, l, "attn_output.weight", "self_attn.o_proj.weight", SYNTH_MATRIX, Q, E, 0);
        if (p->qk_norm) {
            plan_add_layer(&b, l, "attn_q_norm.weight", "self_attn.q_norm.weight", SYNTH_NORM, p->head_dim, 0,
                           0);
            plan_add_layer(&b, l, "attn_k_norm.weight", "self_attn.k_norm.weight", SYNTH_NORM, p->head_dim, 0,
                           0);
        }
        plan_add_layer(&b, l, "ffn_norm.weight", "post_attention_layernorm.weight", SYNTH_NORM, E, 0, 0);
        plan_add_layer(&b, l, "ffn_gate.weight", "mlp.gate_proj.weight", SYNTH_MATRIX, E, p->n_ff, 0);
        plan_add_layer(&b, l, "ffn_up.weight", "mlp.up_proj.weight", SYNTH_MATRIX, E, p->n_ff, 0);
        plan_add_layer(&b, l, "ffn_down.weight", "mlp.down_proj.weight", SYNTH_MATRIX, p->n_ff, E, 0);
    }
    plan_add(&b, "output_norm.weight", "model.norm.weight", SYNTH_NORM, E, 0, 0);
    if (!p->tied) plan_add(&b, "output.weight", "lm_head.weight", SYNTH_MATRIX, E, p->n_vocab, 0);
    if (b.st != TK_OK) {
        tk_free(b.t);
        return b.st;
    }
    *out = b.t;
    *n_out = b.n;
    return TK_OK;
}

/* llama.cpp's convert_hf_to_gguf.py rope_freqs: per frequency, the divisor the
 * Llama-3 scaling applies (1 for short wavelengths, `factor` for long ones,
 * smooth in between). Frequencies in float32 as torch computes them. */
static void rope_factors(const tk_preset *p, int64_t n, float *out) {
    double lo_wav = p->rope_orig_ctx / p->rope_low_freq, hi_wav = p->rope_orig_ctx / p->rope_high_freq;
    for (int64_t i = 0; i < n; i++) {
        float freq = (float)(1.0 / pow(p->rope_theta, (double)(float)(2 * i) / (double)p->head_dim));
        double wavelen = 2.0 * M_PI / (double)freq, f;
        if (wavelen < hi_wav)
            f = 1.0;
        else if (wavelen > lo_wav)
            f = p->rope_factor;
        else {
            double smooth =
                (p->rope_orig_ctx / wavelen - p->rope_low_freq) / (p->rope_high_freq - p->rope_low_freq);
            f = 1.0 / ((1.0 - smooth) / p->rope_factor + smooth);
        }
        out[i] = (float)f;
    }
}

#define SYNTH_OUTLIER_SCALE 20.0f

/* Whether channel ch of n is one of tensor t's c->outliers planted ones. */
static bool synth_outlier(const synth_cfg *c, const synth_tensor *t, int64_t ch, int64_t n) {
    for (int i = 0; i < c->outliers; i++)
        if ((int64_t)(splitmix_at(t->key ^ 0x6f75746c69657273ull, (uint64_t)i) % (uint64_t)n) == ch)
            return true;
    return false;
}

/* GGUF row r of a llama q/k matrix holds HF row src_row(r): the converter's
 * reshape(n_head, 2, hd/2, ...).swapaxes(1, 2) turns halves into pairs. */
static int64_t src_row(int64_t r, int64_t head_dim) {
    int64_t h = r / head_dim, rr = r % head_dim;
    return h * head_dim + (rr % 2) * (head_dim / 2) + rr / 2;
}

void synth_gen_rows(const synth_cfg *c, const synth_tensor *t, int64_t row0, int64_t n, bool gguf,
                    float *out) {
    int64_t cols = t->ne[0];
    if (t->kind == SYNTH_ROPE_FREQS) {
        rope_factors(&c->p, cols, out);
        return;
    }
    for (int64_t r = 0; r < n; r++) {
        int64_t row = row0 + r;
        if (gguf && t->permute_heads > 0) row = src_row(row, t->ne[1] / t->permute_heads);
        gauss_range(t->key, (uint64_t)row * (uint64_t)cols, cols, out + r * cols);
    }
    /* planted outliers (--outliers): a few channels of the norms that feed q/k/v
     * and gate/up, and a few rows of up (channels of down's input), scaled
     * up, as real models' activations have a few channels far above the rest */
    bool norm_out =
        c->outliers > 0 && (strstr(t->gguf_name, "attn_norm.") || strstr(t->gguf_name, "ffn_norm."));
    bool up_out = c->outliers > 0 && strstr(t->gguf_name, "ffn_up.");
    int64_t total = n * cols;
    for (int64_t i = 0; i < total; i++) {
        float v = out[i];
        if ((norm_out && synth_outlier(c, t, i % cols, cols)) ||
            (up_out && synth_outlier(c, t, row0 + i / cols, t->ne[1])))
            v *= SYNTH_OUTLIER_SCALE;
        switch (t->kind) {
        case SYNTH_MATRIX:
            v *= 0.02f;
            break;
        case SYNTH_NORM:
            v = 1.0f + 0.1f * v;
            break;
        case SYNTH_BIAS:
            v *= 0.1f;
            break;
        case SYNTH_ROPE_FREQS:
            break;
        }
        if (c->quant == SYNTH_F16)
            v = tk_f16_to_f32(tk_f32_to_f16(v));
        else if (c->quant == SYNTH_BF16)
            v = tk_bf16_to_f32(tk_f32_to_bf16(v));
        out[i] = v;
    }
}

typedef struct gen_job {
    const synth_cfg *c;
    const synth_tensor *t;
    int64_t row0, n;
    bool gguf;
    float *out;
    uint8_t *quant;
    size_t row_bytes;
    atomic_bool failed;
} gen_job;

static void gen_part(void *ctx, int ith, int nth) {
    gen_job *j = ctx;
    long a, b;
    pool_split((long)j->n, ith, nth, 1, &a, &b);
    if (a >= b) return;
    const int64_t cols = j->t->ne[0];
    float *out = j->out + a * cols;
    synth_gen_rows(j->c, j->t, j->row0 + a, b - a, j->gguf, out);
    for (long r = a; r < b && j->quant; r++)
        if (!kern_quantize_row(j->t->gguf_type, out + (r - a) * cols, j->quant + (size_t)r * j->row_bytes,
                               cols))
            atomic_store(&j->failed, true);
}

bool synth_gen_rows_par(tk_pool *pool, const synth_cfg *c, const synth_tensor *t, int64_t row0, int64_t n,
                        bool gguf, float *out, uint8_t *quant, size_t row_bytes) {
    gen_job j = {.c = c,
                 .t = t,
                 .row0 = row0,
                 .n = n,
                 .gguf = gguf,
                 .out = out,
                 .quant = quant,
                 .row_bytes = row_bytes};
    atomic_init(&j.failed, false);
    pool_run_here(n > 1 && t->kind != SYNTH_ROPE_FREQS ? pool : NULL, gen_part, &j);
    return !atomic_load(&j.failed);
}
