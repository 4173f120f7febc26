/* Stage costs and names of the forward step's profile (see fwd_prof.h). */
#include "model/fwd_prof.h"

#include "kernels/kernels.h"
#include "model/model_internal.h"

static const char *const STAGE_NAMES[FWD_ST_COUNT] = {
    [FWD_ST_PLAN] = "plan",       [FWD_ST_EMBED] = "embed",        [FWD_ST_NORM] = "norm_quant",
    [FWD_ST_QKV] = "qkv",         [FWD_ST_ROPE] = "qk_norm_rope",  [FWD_ST_KV_STORE] = "kv_store",
    [FWD_ST_ATTN] = "attention",  [FWD_ST_O] = "o_proj",           [FWD_ST_RESID] = "residual",
    [FWD_ST_GATE_UP] = "gate_up", [FWD_ST_ACT] = "silu_mul_quant", [FWD_ST_DOWN] = "down",
    [FWD_ST_LM_HEAD] = "lm_head", [FWD_ST_WAIT] = "barrier_wait",
};

const char *fwd_stage_name(fwd_stage s) { return (unsigned)s < FWD_ST_COUNT ? STAGE_NAMES[s] : "?"; }

/* A projection of weight w over n tokens. */
static void add_matmul(fwd_stage_cost *c, const tk_tensor *w, int n) {
    c->bytes += w->nbytes;
    c->ops += 2.0 * (double)w->ne[0] * (double)w->ne[1] * n;
    c->peak = kern_peak(kernels_default(), w->type, w->layout);
}

void fwd_prof_costs(const struct tk_model *m, size_t kv_bytes_tok, bool kv_int8, const fwd_step_shape *sh,
                    fwd_stage_cost out[FWD_ST_COUNT]) {
    const tk_hparams *hp = &m->hp;
    for (int s = 0; s < FWD_ST_COUNT; s++) out[s] = (fwd_stage_cost){0, 0, TK_PEAK_F32};
    int n = sh->n_tok;
    /* the last layer after attention: the wanted tokens (forward.c trims) */
    const bool trim = sh->n_out < n && !sh->untrimmed;
    for (int l = 0; l < hp->n_layer; l++) {
        const tk_layer *L = &m->layers[l];
        const int nr = trim && l == hp->n_layer - 1 ? sh->n_out : n;
        add_matmul(&out[FWD_ST_QKV], &L->wq, n);
        add_matmul(&out[FWD_ST_QKV], &L->wk, n);
        add_matmul(&out[FWD_ST_QKV], &L->wv, n);
        add_matmul(&out[FWD_ST_O], &L->wo, nr);
        add_matmul(&out[FWD_ST_GATE_UP], &L->w_gate, nr);
        add_matmul(&out[FWD_ST_GATE_UP], &L->w_up, nr);
        add_matmul(&out[FWD_ST_DOWN], &L->w_down, nr);
        /* the layer's vectors, as decode_bytes counts them */
        out[FWD_ST_NORM].bytes += 2 * (uint64_t)hp->n_embd * sizeof(float);
        int64_t qkd = (int64_t)hp->n_head * hp->head_dim + 2 * (int64_t)hp->n_head_kv * hp->head_dim;
        if (L->bq) out[FWD_ST_ROPE].bytes += (uint64_t)qkd * sizeof(float);
        if (L->q_norm) out[FWD_ST_ROPE].bytes += 2 * (uint64_t)hp->head_dim * sizeof(float);
    }
    out[FWD_ST_EMBED].bytes = (uint64_t)n * (m->tok_embd.nbytes / (uint64_t)hp->n_vocab);
    out[FWD_ST_NORM].bytes += (uint64_t)hp->n_embd * sizeof(float); /* the output norm */
    if (sh->n_out > 0) add_matmul(&out[FWD_ST_LM_HEAD], &m->output, sh->n_out);
    /* Every layer reads the context's K and V; per pair and head, q.k and p.v,
     * the own-block records' (kv_store) and the rest (attention). */
    const double own =
        (double)sh->own_pairs * (hp->n_layer - 1) + (double)(trim ? sh->own_pairs_out : sh->own_pairs);
    const double all =
        (double)sh->attn_pairs * (hp->n_layer - 1) + (double)(trim ? sh->attn_pairs_out : sh->attn_pairs);
    out[FWD_ST_ATTN].bytes = (sh->kv_tokens - sh->own_tokens) * kv_bytes_tok;
    out[FWD_ST_ATTN].ops = 4.0 * (all - own) * hp->n_head * hp->head_dim;
    out[FWD_ST_ATTN].peak = kv_int8 ? TK_PEAK_INT8 : TK_PEAK_F32;
    out[FWD_ST_KV_STORE].bytes = sh->own_tokens * kv_bytes_tok;
    out[FWD_ST_KV_STORE].ops = 4.0 * own * hp->n_head * hp->head_dim;
    out[FWD_ST_KV_STORE].peak = kv_int8 ? TK_PEAK_INT8 : TK_PEAK_F32;
}

/* Pairs of a query at position p with positions [from, p]. */
static uint64_t pairs_from(int from, int p) { return (uint64_t)(p - from + 1); }

void fwd_step_shape_add(fwd_step_shape *sh, int n, int pos0, int n_logits, int block) {
    const int last = pos0 + n - 1;
    sh->n_tok += n;
    sh->n_out += n_logits;
    sh->kv_tokens += (uint64_t)last + 1;
    for (int i = 0; i < n; i++) {
        const int p = pos0 + i;
        const bool out = i >= n - n_logits;
        sh->attn_pairs += pairs_from(0, p);
        if (out) sh->attn_pairs_out += pairs_from(0, p);
        if (block <= 0) continue;
        sh->own_pairs += pairs_from(p - p % block, p);
        if (out) sh->own_pairs_out += pairs_from(p - p % block, p);
    }
    if (block > 0) sh->own_tokens += (uint64_t)last + 1 - (uint64_t)(pos0 - pos0 % block);
}

/* max(bytes / (gbs GB/s), ops / (peak GOP/s)) in seconds; a limit <= 0
 * leaves its part out. The one floor formula of profile and bench. */
static double floor_s(uint64_t bytes, double ops, double gbs, double peak) {
    const double fb = gbs > 0 ? (double)bytes / (gbs * 1e9) : 0, fo = peak > 0 ? ops / (peak * 1e9) : 0;
    return fb > fo ? fb : fo;
}

double fwd_stage_floor_s(const fwd_stage_cost *c, double gbs, const double peak[TK_PEAK_COUNT]) {
    return floor_s(c->bytes, c->ops, gbs, peak[c->peak]);
}

double tk_step_floor_s(const tk_floor_term *terms, const tk_floor_limits *lim) {
    if (!terms || !lim) return 0;
    double f = 0;
    for (int i = 0; i < TK_STEP_TERMS; i++) {
        const tk_floor_term *t = &terms[i];
        const double pk = t->peak >= 0 && t->peak < TK_FLOOR_PEAKS ? lim->peak_gops[t->peak] : 0;
        f += floor_s(t->bytes, t->ops, lim->read_gbs, pk);
    }
    return f;
}
