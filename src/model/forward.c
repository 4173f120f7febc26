/* One batched forward step (see forward.h).
 *
 * Every token of the step (decode tokens and prefill chunks of all sequences)
 * goes through each matmul together, so a weight is read once per step. The
 * step is one pool_run; inside it the stages below are separated by barriers.
 * Row-split stages own whole output rows for all tokens, token-split stages own
 * whole tokens, and each output element is one gemv dot computed the same way
 * whatever the split or the number of tokens, so a sequence's logits do not
 * depend on what else is in the batch.
 *
 * Fused plan per layer (7 barriers when the threads divide the kv heads, else 8;
 * one more when a decode context is split into parts; one fewer when
 * attention starts without waiting for every thread's kv_store,
 * attn_after_store):
 *   attn_norm_quant         tokens  rmsnorm, quantize activations (embed first in layer 0)
 *   attn_qkv_rope           heads   q,k,v projections (+bias), QK-norm, RoPE; by GQA
 *                                   group when the threads divide the kv heads, and then
 *                                   without a barrier before kv_store (qkv_by_group)
 *   kv_store                kv heads  write the new K and V into the paged cache
 *   attention_quant         GQA groups x sequences (x parts; attn_plan): attention, quantize own columns
 *   attn_out_residual       rows    output projection, x += ...
 *   ffn_norm_quant          tokens  rmsnorm, quantize
 *   ffn_gate_up_silu_quant  rows    gate and up projections, silu(g)*u, quantize own columns
 *   ffn_down_residual       rows    down projection, x += ...
 * In the last layer, when some tokens want no logits, attention and everything
 * after it run for the wanted tokens alone (trim_last: their outputs feed only
 * the logits, and the layer's K and V are stored for all tokens before), moved
 * to rows [0, n_out) by trim_rows after one more barrier. Then
 * output_norm_quant (wanted tokens) and output_logits (vocabulary rows).
 * The row stages split their rows in shares that follow the threads' measured
 * speeds (row_range, balance_update), not halves: a slower core gets fewer.
 * The unfused plan (fwd_opts.unfused) runs one op per stage with a barrier after
 * each; it computes the same values with more synchronisation (the ablation). */
#include "model/forward.h"

#include <math.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include "core/alloc.h"
#include "core/checked.h"
#include "core/clock.h"
#include "core/error.h"
#include "kernels/kernels.h"
#include "model/fwd_prof.h"
#include "model/model_internal.h"

/* A model's head_dim (arch.c checks TK_MAX_HEAD_DIM) must fit the KV pool's limit. */
_Static_assert(TK_MAX_HEAD_DIM <= KV_MAX_HEAD_DIM, "the KV pool takes every model head_dim");

/* Activation slots: the inputs of the matmuls, by width. */
enum { SLOT_EMBD = 0, SLOT_ATT, SLOT_FF, SLOT_COUNT };
/* Quantized activation formats (f32 activations read the float buffer itself). */
enum { ACT_Q8_0 = 0, ACT_Q8_K, ACT_COUNT };

/* Rows per gemv split unit: SIMD kernels handle several rows at once. */
#define ROW_ALIGN 16

typedef struct act_slot {
    int64_t k;             /* row width */
    float *f;              /* (max_tokens, k) the f32 rows (aliases a work buffer) */
    uint8_t *q[ACT_COUNT]; /* (max_tokens, row bytes) quantized rows, NULL if unused */
    size_t q_stride[ACT_COUNT];
    int64_t align; /* columns a partial quantization must start on (1, 32, 256) */
} act_slot;

/* An atomic counter on a cache line of its own. */
typedef struct line_int {
    atomic_int v;
} __attribute__((aligned(64))) line_int;

/* Attention work of a step: one unit is the heads [h0, h1) of a sequence's
 * query tokens [i0, i1) over their whole context (part < 0), or, for a
 * decode token whose context is split
 * (flash-decoding), one part of it, whose records go to rec and are folded
 * after a barrier (attn_merge). Units differ only in who runs them, never in
 * the arithmetic, so outputs do not depend on the plan. */
typedef struct attn_unit {
    int32_t owner; /* the thread that stores its kv heads (attn_after_store), else 0 */
    int32_t seq, h0, h1, part;
    int32_t i0, i1; /* the sequence's query tokens [i0, i1) of the step (part < 0) */
    float *rec;     /* part >= 0: this part's records for heads [h0, h1) */
    int64_t cost;   /* positions x heads attended: larger units are handed out first */
} attn_unit;

typedef struct attn_merge {
    int32_t seq, h0, h1, n_parts;
    const float *recs; /* part 0's records of head h0; part k at + k * part stride */
} attn_merge;

/* Part records kept for split decode contexts per step (each part holds
 * n_head records): 256 parts are 128k positions of split context. */
#define ATTN_SPLIT_PARTS 256
/* A prefill chunk's queries go to units of at most this many tokens (a
 * multiple of every tile's token count), so its attention spreads over the
 * threads in pieces small enough to even out cores that run at different
 * speeds. */
#define ATTN_SLICE 64

/* One thread's work in the row-split stages of a step: busy ns and weight
 * bytes x tokens. */
typedef struct row_work {
    uint64_t ns;
    double work;
} __attribute__((aligned(64))) row_work;

struct fwd_ctx {
    const tk_model *m;
    const tk_hparams *hp;
    tk_kv *kv;
    tk_pool *pool;
    fwd_opts o;
    const tk_kernels *K;
    int nth;
    int64_t q_dim, kv_dim; /* n_head*head_dim, n_head_kv*head_dim */
    int heads_per_group;   /* attention unit: whole quantization blocks of the output */
    int64_t ff_align;      /* gate/up row split unit */
    bool ff_floats;        /* silu(gate)*up is read as floats (a float down weight, the observer) */
    size_t kv_bytes_tok;   /* KV bytes per token of context (all layers) */
    uint64_t emb_row_bytes;

    /* work buffers, sized once at init; token-indexed ones hold max_tokens + 1
     * rows, the last for gemv padding (see gemv_tokens) */
    float *x;          /* (max_tokens, n_embd) residual stream */
    float *xn;         /* (max_tokens, n_embd) normed input of a matmul */
    float *q;          /* (max_tokens, n_head*head_dim) queries, RoPE applied */
    float *k, *v;      /* (max_tokens, n_head_kv*head_dim) new keys and values */
    float *att;        /* (max_tokens, n_head*head_dim) attention output */
    float *own;        /* (max_tokens, n_head, KV_PART_REC) own-block records (kv_attn_own_block), or NULL */
    float *y;          /* (max_tokens, n_embd) projection output before the residual add */
    float *gate;       /* (max_tokens, n_ff) gate projection, then silu(gate)*up in place */
    float *up;         /* (max_tokens, n_ff) */
    float *scratch;    /* (nth, attn_scratch) attention scratch per thread */
    float *logits_pad; /* (max_tokens + 1, n_vocab) output rows when the gemv pads (see gemv_tokens) */
    size_t attn_scratch;
    act_slot slot[SLOT_COUNT];

    /* the current step (set by fwd_step before pool_run) */
    const tk_batch *b;
    float *logits;
    int32_t *tok_pos;  /* (max_tokens) position of each token */
    float *rope_cs;    /* (max_tokens, head_dim) each token's RoPE (cos, sin) pairs, shared by the layers */
    int32_t *tok_seq;  /* (max_tokens) sequence of each token */
    int32_t *seq_tok0; /* (max_seqs) first token of each sequence */
    int32_t *out_tok;  /* (max_tokens) tokens whose logits are wanted, in order */
    int n_out;
    /* The last layer's attention, output projection and FFN feed only the
     * logits: with trim_last they run for the wanted tokens alone, moved to
     * rows [0, n_out) after attention (trim_rows); not in the unfused plan,
     * nor with an observer (calibration reads every token's activations).
     * rows: the token rows the stages after attention run on, n_tok until
     * then. */
    bool trim_last;
    int rows;
    uint64_t last_bytes;
    fwd_step_shape last_shape; /* the last step's (fwd_last_costs) */
    fwd_prof *prof;            /* stage timing (fwd_set_profile); NULL: off */

    /* the attention plan of the current step (attn_plan) */
    attn_unit *units; /* (max_units) by owner, then largest cost first (attn_plan) */
    int n_units;
    int max_units;
    /* (n_layer, nth) the next unit of a layer's attention among those owned by a thread */
    line_int *unit_next;
    int *unit_own0;     /* (nth + 1) thread o owns units [unit_own0[o], unit_own0[o + 1]) */
    attn_merge *merges; /* (max_seqs * chunks) split (sequence, head chunk)s to fold */
    int n_merges;
    /* attention starts without a barrier after kv_store (attn_after_store):
     * thread o sets stored[o] to l + 1 once it has stored layer l */
    bool attn_after_store;
    line_int *stored; /* (nth) */
    float *part_recs; /* (ATTN_SPLIT_PARTS, n_head, KV_PART_REC(head_dim)) part records */

    /* the row-split stages' shares (row_range): thread i takes the rows from
     * row_cum[i] to row_cum[i + 1] of every such matrix (row_cum[0] = 0,
     * row_cum[nth] = 1), fixed for a step; between steps they follow the
     * threads' measured speeds (balance_update) unless fixed by
     * fwd_set_row_shares */
    double *row_share; /* (nth) */
    double *row_cum;   /* (nth + 1) */
    bool shares_fixed;
    row_work *work; /* (nth) what each thread did in those stages this step */
    int attn_chunk; /* heads per attention unit: whole quantization blocks and GQA groups */
};

/* The end of a piece of work of stage s on thread ith (profiling only). */
#define MARK(f, ith, s)                                                                                      \
    do {                                                                                                     \
        if ((f)->prof) fwd_prof_mark((f)->prof, (ith), (s));                                                 \
    } while (0)

/* ---- activation helpers -------------------------------------------------------------- */

static int act_of(const tk_tensor *w) {
    tk_dtype a = kern_act_type(w->type, w->layout);
    return a == TK_DTYPE_Q8_0 ? ACT_Q8_0 : a == TK_DTYPE_Q8_K ? ACT_Q8_K : -1;
}

/* Activation rows for weight w from slot s. */
static const void *act_rows(const fwd_ctx *f, int s, const tk_tensor *w, size_t *stride) {
    const act_slot *sl = &f->slot[s];
    int a = act_of(w);
    if (a < 0) {
        *stride = (size_t)sl->k * sizeof(float);
        return sl->f;
    }
    *stride = sl->q_stride[a];
    return sl->q[a];
}

/* A thread that works on columns of token rows reads pieces of a page or
 * less, each on its own page, where the hardware prefetcher stops: it asks
 * for the next token's piece (n floats from p) as it starts a token. */
static void next_piece(const float *p, int64_t n) {
    for (int64_t i = 0; i < n; i += 64 / sizeof(float)) __builtin_prefetch(p + i, 1, 3);
}

/* Quantize n floats x, columns [c0, c0 + n) of token t of slot sl, into every
 * format the slot feeds. */
static void quant_piece(const fwd_ctx *f, const act_slot *sl, const float *x, int t, int64_t c0, int64_t n) {
    for (int a = 0; a < ACT_COUNT; a++) {
        if (!sl->q[a]) continue;
        tk_quant_act_fn fn = a == ACT_Q8_0 ? f->K->quant_q8_0 : f->K->quant_q8_k;
        int64_t qk = a == ACT_Q8_0 ? TK_QK8_0 : TK_QK_K;
        size_t bb = a == ACT_Q8_0 ? sizeof(tk_block_q8_0) : sizeof(tk_block_q8_k);
        fn(x, sl->q[a] + (size_t)t * sl->q_stride[a] + (size_t)(c0 / qk) * bb, n);
    }
}

/* Quantize columns [c0, c1) of tokens [t0, t1) of slot s into every format it
 * feeds. Blocks are independent, so a thread may quantize the columns it owns. */
static void quant_cols(const fwd_ctx *f, int s, int t0, int t1, int64_t c0, int64_t c1) {
    const act_slot *sl = &f->slot[s];
    if (c0 >= c1) return;
    for (int t = t0; t < t1; t++) quant_piece(f, sl, sl->f + (size_t)t * sl->k + c0, t, c0, c1 - c0);
}

/* Tokens a gemv is called with. Batch invariance needs each token's dot
 * product to be reduced the same way whatever n_tok and its place in a tile;
 * the kernels guarantee that now (one chain per row and token), so no padding.
 * Should a kernel special-case a lone token again, returning n_tok + 1 for odd
 * counts here restores invariance: every buffer keeps a spare row for it and
 * output_logits handles the padded case. test_forward_batch_invariance checks. */
static int gemv_tokens(tk_dtype wtype, int n_tok) {
    (void)wtype;
    return n_tok;
}

/* y[t, r] = W row r . act row t for rows [r0, r1) of all step tokens (y and the
 * activations hold one spare row for the padding above). */
static void matmul_rows(const fwd_ctx *f, const tk_tensor *w, int s, int n_tok, int64_t r0, int64_t r1,
                        float *y, int64_t ldy) {
    if (r0 >= r1 || n_tok <= 0) return;
    size_t stride;
    const void *xq = act_rows(f, s, w, &stride);
    kern_gemv_of(f->K, w)(w->ne[0], w->data, r0, r1, xq, stride, gemv_tokens(w->type, n_tok), y, ldy);
}

static void split_tokens(int n, int ith, int nth, int *t0, int *t1) {
    long lo, hi;
    pool_split(n, ith, nth, 1, &lo, &hi);
    *t0 = (int)lo;
    *t1 = (int)hi;
}

/* ---- stages shared by both plans ------------------------------------------------------ */

/* Rows [*r0, *r1) of n for thread ith in the step's shares (row_cum), in
 * multiples of align. Which thread computes a row never changes its value. */
static void row_range(const fwd_ctx *f, int64_t n, int ith, long align, long *r0, long *r1) {
    const long chunks = (long)((n + align - 1) / align);
    const long a = (long)((double)chunks * f->row_cum[ith] + 0.5);
    const long b = (long)((double)chunks * f->row_cum[ith + 1] + 0.5);
    *r0 = a * align < n ? a * align : (long)n;
    *r1 = b * align < n ? b * align : (long)n;
}

/* Rows [r0, r1) of w through matmul_rows, timed into the thread's row_work. */
static void matmul_timed(fwd_ctx *f, int ith, const tk_tensor *w, int s, int n_tok, int64_t r0, int64_t r1,
                         float *y, int64_t ldy) {
    if (r0 >= r1 || n_tok <= 0) return;
    const uint64_t t0 = tk_now_ns();
    matmul_rows(f, w, s, n_tok, r0, r1, y, ldy);
    row_work *wk = &f->work[ith];
    wk->ns += tk_now_ns() - t0;
    wk->work += (double)(r1 - r0) * ((double)w->nbytes / (double)w->ne[1]) * n_tok;
}

static void embed_tokens(fwd_ctx *f, int t0, int t1) {
    int hd = f->hp->head_dim;
    /* any layout: a tied output matrix may have been interleaved at load */
    for (int t = t0; t < t1; t++) {
        kern_dequant_tensor_row(f->K, &f->m->tok_embd, f->b->tokens[t], f->x + (size_t)t * f->hp->n_embd);
        kern_rope_angles(f->rope_cs + (size_t)t * (size_t)hd, hd, f->tok_pos[t], f->m->rope_freqs);
    }
}

static void rmsnorm_tokens(fwd_ctx *f, const float *w, int t0, int t1) {
    int64_t d = f->hp->n_embd;
    for (int t = t0; t < t1; t++) f->K->rmsnorm(f->xn + t * d, f->x + t * d, w, d, f->hp->rms_eps);
}

/* Bias, QK-norm and RoPE on heads [h0, h1) of q (n_head heads) or k. RoPE
 * runs once over the contiguous heads so its sines and cosines are shared. */
static void heads_bias_norm_rope(fwd_ctx *f, float *base, int64_t width, const float *bias, const float *norm,
                                 bool rope, int h0, int h1, int t0, int t1) {
    int hd = f->hp->head_dim;
    if (h0 >= h1 || (!bias && !norm && !rope)) return;
    for (int t = t0; t < t1; t++) {
        float *row = base + (size_t)t * width;
        if (t + 1 < t1 && h1 - h0 < width / hd)
            next_piece(row + width + (size_t)h0 * hd, (int64_t)(h1 - h0) * hd);
        for (int h = h0; h < h1; h++) {
            float *x = row + (size_t)h * hd;
            if (bias) f->K->add(x, bias + (size_t)h * hd, hd);
            if (norm) f->K->rmsnorm(x, x, norm, hd, f->hp->rms_eps);
        }
        if (rope) kern_rope_cs(row + (size_t)h0 * hd, h1 - h0, hd, f->rope_cs + (size_t)t * (size_t)hd, 1);
    }
}

/* Split by KV head, each thread writing every token in position order: int8
 * KV with per-head scales may rescale a block's earlier values for a head, so
 * one thread must own a (block, head) and see its tokens in order. There each
 * token's own-block record (kv_attention_own) is taken right after its write,
 * for the query heads of the thread's kv heads, so the token sees its block
 * as its own prefix left it. */
static void kv_store(fwd_ctx *f, int l, int ith, int nth) {
    long g0, g1;
    pool_split(f->hp->n_head_kv, ith, nth, 1, &g0, &g1);
    if (g0 >= g1) return;
    const int nh = f->hp->n_head, ratio = nh / f->hp->n_head_kv, hd = f->hp->head_dim;
    const float scale = 1.0f / sqrtf((float)hd);
    float *scratch = f->scratch + (size_t)ith * f->attn_scratch;
    /* the trimmed last layer attends for its wanted tokens alone: no record for the others */
    const bool trim = f->trim_last && l == f->hp->n_layer - 1;
    for (int t = 0; t < f->b->n_tok; t++) {
        const int s = f->tok_seq[t];
        const int32_t *bt = f->b->bt[s];
        if (t + 1 < f->b->n_tok && f->tok_seq[t + 1] != f->tok_seq[t])
            kv_prefetch_write(f->kv, l, f->b->bt[f->tok_seq[t + 1]], f->tok_pos[t + 1], (int)g0, (int)g1);
        const float *k = f->k + (size_t)t * f->kv_dim, *v = f->v + (size_t)t * f->kv_dim;
        if (t + 1 < f->b->n_tok && g1 - g0 < f->hp->n_head_kv) {
            next_piece(k + f->kv_dim + g0 * hd, (g1 - g0) * hd);
            next_piece(v + f->kv_dim + g0 * hd, (g1 - g0) * hd);
        }
        if (!f->own || (trim && t - f->seq_tok0[s] < f->b->n[s] - f->b->n_logits[s])) {
            kv_write_heads(f->kv, l, bt, f->tok_pos[t], k, v, (int)g0, (int)g1);
            continue;
        }
        for (int g = (int)g0; g < (int)g1; g++) {
            kv_write_heads(f->kv, l, bt, f->tok_pos[t], k, v, g, g + 1);
            /* what is written and read next, this token's next kv head or the
             * next token's first: its block is cold */
            const int32_t *nbt = bt;
            int npos = f->tok_pos[t], nkvh = g + 1;
            if (nkvh == (int)g1) {
                const bool more = t + 1 < f->b->n_tok;
                nbt = more ? f->b->bt[f->tok_seq[t + 1]] : NULL;
                npos = more ? f->tok_pos[t + 1] : 0;
                nkvh = (int)g0;
            }
            kv_attention_own(f->kv, l, bt, f->tok_pos[t], f->q + (size_t)t * f->q_dim, nh, g * ratio,
                             (g + 1) * ratio, scale,
                             f->own + ((size_t)t * nh + (size_t)g * ratio) * KV_PART_REC(hd), scratch, nbt,
                             npos, nkvh);
        }
    }
}

/* Whether the threads split the QKV projection by GQA group (kv head g with
 * its query heads): each thread then normalizes and rotates as many q and k
 * heads as the others, and owns the kv heads kv_store gives it (the same
 * pool_split of the kv heads), so it stores them without a barrier between. */
static bool qkv_by_group(const fwd_ctx *f, int nth) { return f->hp->n_head_kv % nth == 0; }

/* By owner, then larger cost first; ties in plan order (seq, heads, tokens, part). */
static int unit_cmp(const void *pa, const void *pb) {
    const attn_unit *a = pa, *b = pb;
    if (a->owner != b->owner) return a->owner < b->owner ? -1 : 1;
    if (a->cost != b->cost) return a->cost > b->cost ? -1 : 1;
    if (a->seq != b->seq) return a->seq < b->seq ? -1 : 1;
    if (a->h0 != b->h0) return a->h0 < b->h0 ? -1 : 1;
    if (a->i0 != b->i0) return a->i0 < b->i0 ? -1 : 1;
    return (a->part > b->part) - (a->part < b->part);
}

/* Splits the step's attention into units (see attn_unit), largest first:
 * threads take them as they go (grab_units), so a core that runs slower (a
 * shared machine's) takes fewer. A decode token's context is split into its
 * parts when its units would otherwise be more than a share of a thread's
 * work (one long sequence, or few heads), so every thread gets some; a
 * prefill chunk's queries into slices of ATTN_SLICE tokens. Parts and slices
 * are the same whatever the threads, and each query's arithmetic does not
 * depend on who runs it, so neither do the outputs. Runs before pool_run. */
static void attn_plan(fwd_ctx *f) {
    const tk_batch *b = f->b;
    const int U = f->attn_chunk, nh = f->hp->n_head, nth = f->nth;
    const size_t part_stride = (size_t)nh * KV_PART_REC(f->hp->head_dim);
    int64_t total = 0, max_unit = 0;
    for (int s = 0; s < b->n_seq; s++) {
        int64_t c = (int64_t)U * b->n[s] * (b->pos0[s] + (b->n[s] + 1) / 2);
        total += c * (nh / U);
        if (c > max_unit) max_unit = c;
    }
    const bool split = nth > 1 && max_unit * 2 * nth > total;
    int n = 0, recs = 0;
    f->n_merges = 0;
    for (int s = 0; s < b->n_seq; s++) {
        const int len = kv_attn_end(f->kv, b->pos0[s] + b->n[s] - 1), parts = kv_attn_parts(len);
        const bool sp = split && b->n[s] == 1 && parts > 1 && recs + parts <= ATTN_SPLIT_PARTS;
        float *base = sp ? f->part_recs + (size_t)recs * part_stride : NULL;
        for (int h = 0; h < nh; h += U) {
            if (!sp) {
                for (int i0 = 0; i0 < b->n[s]; i0 += ATTN_SLICE) {
                    const int i1 = i0 + ATTN_SLICE < b->n[s] ? i0 + ATTN_SLICE : b->n[s], ni = i1 - i0;
                    f->units[n++] = (attn_unit){.seq = s,
                                                .h0 = h,
                                                .h1 = h + U,
                                                .part = -1,
                                                .i0 = i0,
                                                .i1 = i1,
                                                .cost = (int64_t)U * ni * (b->pos0[s] + i0 + (ni + 1) / 2)};
                }
                continue;
            }
            for (int k = 0; k < parts; k++) {
                const int p1 = (k + 1) * KV_ATTN_PART < len ? (k + 1) * KV_ATTN_PART : len;
                f->units[n++] = (attn_unit){.seq = s,
                                            .h0 = h,
                                            .h1 = h + U,
                                            .part = k,
                                            .rec = base + (size_t)k * part_stride +
                                                   (size_t)h * KV_PART_REC(f->hp->head_dim),
                                            .cost = (int64_t)U * (p1 - k * KV_ATTN_PART)};
            }
            f->merges[f->n_merges++] = (attn_merge){.seq = s,
                                                    .h0 = h,
                                                    .h1 = h + U,
                                                    .n_parts = parts,
                                                    .recs = base + (size_t)h * KV_PART_REC(f->hp->head_dim)};
        }
        if (sp) recs += parts;
    }
    f->n_units = n;
    /* Without split contexts, and with each unit's kv heads stored by one
     * thread (qkv_by_group's split into whole units), a unit may start once
     * that thread has stored them: each thread takes its own units first. */
    const int own_heads = f->hp->n_head_kv / nth * (nh / f->hp->n_head_kv);
    f->attn_after_store = !f->o.unfused && f->n_merges == 0 && qkv_by_group(f, nth) && own_heads % U == 0;
    for (int u = 0; u < n; u++) f->units[u].owner = f->attn_after_store ? f->units[u].h0 / own_heads : 0;
    qsort(f->units, (size_t)n, sizeof *f->units, unit_cmp);
    for (int o = 0, u = 0; o <= nth; o++) {
        while (u < n && f->units[u].owner < o) u++;
        f->unit_own0[o] = u;
    }
    for (int i = 0; i < f->hp->n_layer * nth; i++)
        atomic_store_explicit(&f->unit_next[i].v, 0, memory_order_relaxed);
    for (int o = 0; o < nth; o++) atomic_store_explicit(&f->stored[o].v, 0, memory_order_relaxed);
}

/* The next units [u0, u1) of a layer's n for the calling thread: what is left
 * over 2 x nth at a time, at least one, so the large units go first in large
 * pieces and the small ones last even the threads out; the last keep units
 * are left to others. false: none left. */
static bool grab_units(atomic_int *next, int n, int keep, int nth, int *u0, int *u1) {
    int cur = atomic_load_explicit(next, memory_order_relaxed);
    for (;;) {
        if (cur >= n - keep) return false;
        int take = (n - cur) / (2 * nth);
        if (take < 1) take = 1;
        if (take > n - keep - cur) take = n - keep - cur;
        if (atomic_compare_exchange_weak_explicit(next, &cur, cur + take, memory_order_relaxed,
                                                  memory_order_relaxed)) {
            *u0 = cur;
            *u1 = cur + take;
            return true;
        }
    }
}

/* One unit of the plan (attn_unit); with quant, the thread quantizes the
 * output columns it wrote (whole blocks by construction). next: the unit the
 * thread runs after it, whose first block the attention asks for as it ends
 * (NULL: not known). */
static void attention_unit(fwd_ctx *f, int l, const attn_unit *w, const attn_unit *next, float scale,
                           bool quant, float *scratch) {
    const tk_batch *b = f->b;
    const int hd = f->hp->head_dim, nh = f->hp->n_head, s = w->seq;
    const bool trim = f->trim_last && l == f->hp->n_layer - 1;
    /* trimmed: a sequence's wanted tokens are its last n_logits */
    const int i0 = trim && w->i0 < b->n[s] - b->n_logits[s] ? b->n[s] - b->n_logits[s] : w->i0;
    if (trim && (w->part >= 0 ? b->n_logits[s] == 0 : i0 >= w->i1)) return;
    if (w->part >= 0) {
        const int t0 = f->seq_tok0[s];
        kv_attention_part(f->kv, l, b->bt[s], kv_attn_end(f->kv, b->pos0[s]), w->part,
                          f->q + (size_t)t0 * f->q_dim, nh, w->h0, w->h1, scale, w->rec, scratch);
        return;
    }
    const int t0 = f->seq_tok0[s] + i0, n = w->i1 - i0;
    const bool hint = next && next->part < 0;
    kv_attention(f->kv, l, b->bt[s], b->pos0[s] + i0, n, f->q + (size_t)t0 * f->q_dim, nh, w->h0, w->h1,
                 scale, f->own ? f->own + (size_t)t0 * nh * KV_PART_REC(hd) : NULL,
                 f->att + (size_t)t0 * f->q_dim, scratch, hint ? b->bt[next->seq] : NULL,
                 hint ? next->h0 / (nh / f->hp->n_head_kv) : 0);
    if (quant) quant_cols(f, SLOT_ATT, t0, t0 + n, (int64_t)w->h0 * hd, (int64_t)w->h1 * hd);
}

/* Attention over the plan's units, handed out as threads ask (grab_units):
 * with attn_after_store each thread takes its own units, then the others',
 * each once its owner has stored the layer. Split contexts are folded after a
 * barrier. */
static void attention_units(fwd_ctx *f, int l, int ith, int nth, bool quant) {
    const tk_batch *b = f->b;
    const int hd = f->hp->head_dim, nh = f->hp->n_head;
    float *scratch = f->scratch + (size_t)ith * f->attn_scratch;
    const float scale = 1.0f / sqrtf((float)hd);
    const bool trim = f->trim_last && l == f->hp->n_layer - 1;
    for (int k = 0; k < nth; k++) {
        const int o = (ith + k) % nth, first = f->unit_own0[o], n = f->unit_own0[o + 1] - first;
        bool ready = o == ith || !f->attn_after_store;
        unsigned spins = 0;
        int u0, u1;
        /* another's last unit is left to its owner, which has its data at hand */
        const int keep = o != ith && f->attn_after_store;
        while (grab_units(&f->unit_next[l * nth + o].v, n, keep, nth, &u0, &u1)) {
            /* the owner's stores (and q heads) are seen once it says so */
            while (!ready && !(ready = atomic_load_explicit(&f->stored[o].v, memory_order_acquire) > l))
                pool_spin(&spins);
            for (int u = first + u0; u < first + u1; u++)
                attention_unit(f, l, &f->units[u], u + 1 < first + u1 ? &f->units[u + 1] : NULL, scale, quant,
                               scratch);
        }
    }
    if (f->n_merges == 0) return;
    pool_barrier(f->pool);
    long m0, m1;
    pool_split(f->n_merges, ith, nth, 1, &m0, &m1);
    for (long i = m0; i < m1; i++) {
        const attn_merge *m = &f->merges[i];
        if (trim && b->n_logits[m->seq] == 0) continue;
        const int t0 = f->seq_tok0[m->seq];
        kv_attention_merge(f->kv, m->recs, m->n_parts, (size_t)nh * KV_PART_REC(hd), m->h1 - m->h0,
                           f->own ? f->own + ((size_t)t0 * nh + (size_t)m->h0) * KV_PART_REC(hd) : NULL,
                           f->att + (size_t)t0 * f->q_dim + (size_t)m->h0 * hd);
        if (quant) quant_cols(f, SLOT_ATT, t0, t0 + 1, (int64_t)m->h0 * hd, (int64_t)m->h1 * hd);
    }
}

static void add_rows(fwd_ctx *f, int64_t r0, int64_t r1) {
    int64_t d = f->hp->n_embd;
    if (r0 >= r1) return;
    for (int t = 0; t < f->rows; t++) {
        if (t + 1 < f->rows && r1 - r0 < d) {
            next_piece(f->x + (t + 1) * d + r0, r1 - r0);
            next_piece(f->y + (t + 1) * d + r0, r1 - r0);
        }
        f->K->add(f->x + t * d + r0, f->y + t * d + r0, r1 - r0);
    }
}

/* ---- the fused plan ------------------------------------------------------------------- */

/* The wanted tokens' residual rows and attention outputs (floats and each
 * activation format) moved to rows [0, n_out), in order (out_tok ascends, so
 * no row is overwritten before it is moved); out_tok then names those rows.
 * Thread 0 alone, between barriers: a few rows. */
static void trim_rows(fwd_ctx *f) {
    const act_slot *sl = &f->slot[SLOT_ATT];
    const int64_t d = f->hp->n_embd;
    for (int i = 0; i < f->n_out; i++) {
        const int t = f->out_tok[i];
        if (t != i) {
            memcpy(f->x + (size_t)i * d, f->x + (size_t)t * d, (size_t)d * sizeof(float));
            memcpy(f->att + (size_t)i * f->q_dim, f->att + (size_t)t * f->q_dim,
                   (size_t)f->q_dim * sizeof(float));
            for (int a = 0; a < ACT_COUNT; a++)
                if (sl->q[a])
                    memcpy(sl->q[a] + (size_t)i * sl->q_stride[a], sl->q[a] + (size_t)t * sl->q_stride[a],
                           sl->q_stride[a]);
        }
        f->out_tok[i] = i;
    }
    f->rows = f->n_out;
}

static void attn_norm_quant(fwd_ctx *f, int l, int ith, int nth) {
    int t0, t1;
    split_tokens(f->b->n_tok, ith, nth, &t0, &t1);
    if (l == 0) {
        embed_tokens(f, t0, t1);
        MARK(f, ith, FWD_ST_EMBED);
    }
    rmsnorm_tokens(f, f->m->layers[l].attn_norm, t0, t1);
    quant_cols(f, SLOT_EMBD, t0, t1, 0, f->hp->n_embd);
}

/* Heads are the split unit, by GQA group (qkv_by_group) or else q heads, then
 * k heads, then v heads, so the thread that computes a head's rows also
 * normalizes and rotates it. */
static void attn_qkv_rope(fwd_ctx *f, int l, int ith, int nth) {
    const tk_layer *L = &f->m->layers[l];
    int nh = f->hp->n_head, nkv = f->hp->n_head_kv, hd = f->hp->head_dim, n_tok = f->b->n_tok;
    int q0, q1, k0, k1, v0, v1;
    long u0, u1;
    if (qkv_by_group(f, nth)) {
        pool_split(nkv, ith, nth, 1, &u0, &u1);
        q0 = (int)u0 * (nh / nkv), q1 = (int)u1 * (nh / nkv);
        k0 = v0 = (int)u0, k1 = v1 = (int)u1;
    } else {
        pool_split(nh + 2 * nkv, ith, nth, 1, &u0, &u1);
        q0 = (int)(u0 < nh ? u0 : nh), q1 = (int)(u1 < nh ? u1 : nh);
        k0 = (int)(u0 - nh < 0 ? 0 : u0 - nh > nkv ? nkv : u0 - nh);
        k1 = (int)(u1 - nh < 0 ? 0 : u1 - nh > nkv ? nkv : u1 - nh);
        v0 = (int)(u0 - nh - nkv < 0 ? 0 : u0 - nh - nkv), v1 = (int)(u1 - nh - nkv < 0 ? 0 : u1 - nh - nkv);
    }
    matmul_rows(f, &L->wq, SLOT_EMBD, n_tok, (int64_t)q0 * hd, (int64_t)q1 * hd, f->q, f->q_dim);
    matmul_rows(f, &L->wk, SLOT_EMBD, n_tok, (int64_t)k0 * hd, (int64_t)k1 * hd, f->k, f->kv_dim);
    matmul_rows(f, &L->wv, SLOT_EMBD, n_tok, (int64_t)v0 * hd, (int64_t)v1 * hd, f->v, f->kv_dim);
    MARK(f, ith, FWD_ST_QKV);
    heads_bias_norm_rope(f, f->q, f->q_dim, L->bq, L->q_norm, true, q0, q1, 0, n_tok);
    heads_bias_norm_rope(f, f->k, f->kv_dim, L->bk, L->k_norm, true, k0, k1, 0, n_tok);
    heads_bias_norm_rope(f, f->v, f->kv_dim, L->bv, NULL, false, v0, v1, 0, n_tok);
}

static void attn_out_residual(fwd_ctx *f, int l, int ith) {
    long r0, r1;
    row_range(f, f->hp->n_embd, ith, ROW_ALIGN, &r0, &r1);
    matmul_timed(f, ith, &f->m->layers[l].wo, SLOT_ATT, f->rows, r0, r1, f->y, f->hp->n_embd);
    MARK(f, ith, FWD_ST_O);
    add_rows(f, r0, r1);
}

static void ffn_norm_quant(fwd_ctx *f, int l, int ith, int nth) {
    int t0, t1;
    split_tokens(f->rows, ith, nth, &t0, &t1);
    rmsnorm_tokens(f, f->m->layers[l].ffn_norm, t0, t1);
    quant_cols(f, SLOT_EMBD, t0, t1, 0, f->hp->n_embd);
}

/* silu(gate) * up of columns [c0, c1) of every token, quantized into the FF
 * slot through an L1 buffer of FF_PIECE columns instead of written back over
 * the gate rows and read again: the same elementwise kernel on whole vectors
 * (c0, c1 and FF_PIECE are multiples of the slot's block) and the same
 * blocks, so the same bits. Only when no one reads the floats (ff_floats). */
#define FF_PIECE 256
static void silu_mul_quant_l1(const fwd_ctx *f, int n_tok, int64_t c0, int64_t c1) {
    const act_slot *sl = &f->slot[SLOT_FF];
    const int64_t ff = f->hp->n_ff;
    _Alignas(64) float buf[FF_PIECE];
    for (int t = 0; t < n_tok; t++) {
        if (t + 1 < n_tok && c1 - c0 < ff) {
            next_piece(f->gate + (t + 1) * ff + c0, c1 - c0);
            next_piece(f->up + (t + 1) * ff + c0, c1 - c0);
        }
        for (int64_t c = c0; c < c1; c += FF_PIECE) {
            const int64_t n = c1 - c < FF_PIECE ? c1 - c : FF_PIECE;
            f->K->silu_mul(buf, f->gate + t * ff + c, f->up + t * ff + c, n);
            quant_piece(f, sl, buf, t, c, n);
        }
    }
}

static void ffn_gate_up_silu_quant(fwd_ctx *f, int l, int ith) {
    const tk_layer *L = &f->m->layers[l];
    int64_t ff = f->hp->n_ff;
    int n_tok = f->rows;
    long r0, r1;
    row_range(f, ff, ith, (long)f->ff_align, &r0, &r1);
    if (r0 >= r1) return;
    matmul_timed(f, ith, &L->w_gate, SLOT_EMBD, n_tok, r0, r1, f->gate, ff);
    matmul_timed(f, ith, &L->w_up, SLOT_EMBD, n_tok, r0, r1, f->up, ff);
    MARK(f, ith, FWD_ST_GATE_UP);
    if (!f->ff_floats) {
        silu_mul_quant_l1(f, n_tok, r0, r1);
        return;
    }
    for (int t = 0; t < n_tok; t++)
        f->K->silu_mul(f->gate + t * ff + r0, f->gate + t * ff + r0, f->up + t * ff + r0, r1 - r0);
    quant_cols(f, SLOT_FF, 0, n_tok, r0, r1);
}

static void ffn_down_residual(fwd_ctx *f, int l, int ith) {
    long r0, r1;
    row_range(f, f->hp->n_embd, ith, ROW_ALIGN, &r0, &r1);
    matmul_timed(f, ith, &f->m->layers[l].w_down, SLOT_FF, f->rows, r0, r1, f->y, f->hp->n_embd);
    MARK(f, ith, FWD_ST_DOWN);
    add_rows(f, r0, r1);
}

/* Final norm of the wanted tokens only, packed into rows [0, n_out) of xn. */
static void output_norm_quant(fwd_ctx *f, int ith, int nth) {
    int64_t d = f->hp->n_embd;
    int i0, i1;
    split_tokens(f->n_out, ith, nth, &i0, &i1);
    for (int i = i0; i < i1; i++)
        f->K->rmsnorm(f->xn + i * d, f->x + (size_t)f->out_tok[i] * d, f->m->output_norm, d, f->hp->rms_eps);
    quant_cols(f, SLOT_EMBD, i0, i1, 0, d);
}

/* When the gemv needs a padding row, the caller's buffer has no room for it:
 * the rows go to logits_pad and each thread copies out the columns it wrote. */
static void output_logits(fwd_ctx *f, int ith) {
    long r0, r1;
    int64_t V = f->hp->n_vocab;
    row_range(f, V, ith, ROW_ALIGN, &r0, &r1);
    bool pad = gemv_tokens(f->m->output.type, f->n_out) != f->n_out;
    matmul_timed(f, ith, &f->m->output, SLOT_EMBD, f->n_out, r0, r1, pad ? f->logits_pad : f->logits, V);
    if (pad && r0 < r1)
        for (int i = 0; i < f->n_out; i++)
            memcpy(f->logits + i * V + r0, f->logits_pad + i * V + r0, (size_t)(r1 - r0) * sizeof(float));
}

/* Stage s's work ends: a barrier (its wait timed apart when profiling). */
static void stage_end(fwd_ctx *f, int ith, fwd_stage s) {
    MARK(f, ith, s);
    pool_barrier(f->pool);
    MARK(f, ith, FWD_ST_WAIT);
}

/* Thread 0 shows a stage's finished input to the observer at the start of the
 * stage that reads it: the others only read it too, and it is next written
 * after barriers thread 0 has yet to reach. */
static void observe(const fwd_ctx *f, int ith, int l, backend_site site, const float *x, int64_t k) {
    if (ith == 0) f->o.observe(f->o.observe_ctx, l, site, x, f->b->n_tok, k);
}

static void forward_fused(fwd_ctx *f, int ith, int nth) {
    const bool obs = f->o.observe != NULL;
    for (int l = 0; l < f->hp->n_layer; l++) {
        attn_norm_quant(f, l, ith, nth);
        stage_end(f, ith, FWD_ST_NORM);
        if (obs) observe(f, ith, l, BACKEND_SITE_ATTN_IN, f->xn, f->hp->n_embd);
        attn_qkv_rope(f, l, ith, nth);
        if (qkv_by_group(f, nth))
            MARK(f, ith, FWD_ST_ROPE);
        else
            stage_end(f, ith, FWD_ST_ROPE);
        kv_store(f, l, ith, nth);
        if (f->attn_after_store) {
            atomic_store_explicit(&f->stored[ith].v, l + 1, memory_order_release);
            MARK(f, ith, FWD_ST_KV_STORE);
        } else {
            stage_end(f, ith, FWD_ST_KV_STORE);
        }
        attention_units(f, l, ith, nth, true);
        stage_end(f, ith, FWD_ST_ATTN);
        if (f->trim_last && l == f->hp->n_layer - 1) {
            if (ith == 0) trim_rows(f);
            stage_end(f, ith, FWD_ST_ATTN);
        }
        if (obs) observe(f, ith, l, BACKEND_SITE_ATTN_OUT, f->att, f->q_dim);
        attn_out_residual(f, l, ith);
        stage_end(f, ith, FWD_ST_RESID);
        ffn_norm_quant(f, l, ith, nth);
        stage_end(f, ith, FWD_ST_NORM);
        if (obs) observe(f, ith, l, BACKEND_SITE_FFN_IN, f->xn, f->hp->n_embd);
        ffn_gate_up_silu_quant(f, l, ith);
        stage_end(f, ith, FWD_ST_ACT);
        if (obs) observe(f, ith, l, BACKEND_SITE_FFN_MID, f->gate, f->hp->n_ff);
        ffn_down_residual(f, l, ith);
        stage_end(f, ith, FWD_ST_RESID);
    }
    if (f->n_out == 0) return;
    output_norm_quant(f, ith, nth);
    stage_end(f, ith, FWD_ST_NORM);
    output_logits(f, ith);
    MARK(f, ith, FWD_ST_LM_HEAD);
}

/* ---- the unfused plan: one op per stage, a barrier after each ----------------------------- */

static void step_matmul(fwd_ctx *f, const tk_tensor *w, int s, float *y, int64_t ldy, int ith, int nth) {
    long r0, r1;
    pool_split(w->ne[1], ith, nth, ROW_ALIGN, &r0, &r1);
    matmul_rows(f, w, s, f->b->n_tok, r0, r1, y, ldy);
    pool_barrier(f->pool);
}

static void step_quant(fwd_ctx *f, int s, int ith, int nth) {
    int t0, t1;
    split_tokens(f->b->n_tok, ith, nth, &t0, &t1);
    quant_cols(f, s, t0, t1, 0, f->slot[s].k);
    pool_barrier(f->pool);
}

static void step_rmsnorm(fwd_ctx *f, const float *w, int ith, int nth) {
    int t0, t1;
    split_tokens(f->b->n_tok, ith, nth, &t0, &t1);
    rmsnorm_tokens(f, w, t0, t1);
    pool_barrier(f->pool);
}

static void step_add(fwd_ctx *f, int ith, int nth) {
    int t0, t1;
    int64_t d = f->hp->n_embd;
    split_tokens(f->b->n_tok, ith, nth, &t0, &t1);
    for (int t = t0; t < t1; t++) f->K->add(f->x + t * d, f->y + t * d, d);
    pool_barrier(f->pool);
}

static void forward_unfused(fwd_ctx *f, int ith, int nth) {
    int t0, t1, n_tok = f->b->n_tok;
    int64_t ff = f->hp->n_ff;
    split_tokens(n_tok, ith, nth, &t0, &t1);
    embed_tokens(f, t0, t1);
    pool_barrier(f->pool);
    for (int l = 0; l < f->hp->n_layer; l++) {
        const tk_layer *L = &f->m->layers[l];
        step_rmsnorm(f, L->attn_norm, ith, nth);
        step_quant(f, SLOT_EMBD, ith, nth);
        step_matmul(f, &L->wq, SLOT_EMBD, f->q, f->q_dim, ith, nth);
        step_matmul(f, &L->wk, SLOT_EMBD, f->k, f->kv_dim, ith, nth);
        step_matmul(f, &L->wv, SLOT_EMBD, f->v, f->kv_dim, ith, nth);
        heads_bias_norm_rope(f, f->q, f->q_dim, L->bq, L->q_norm, true, 0, f->hp->n_head, t0, t1);
        heads_bias_norm_rope(f, f->k, f->kv_dim, L->bk, L->k_norm, true, 0, f->hp->n_head_kv, t0, t1);
        heads_bias_norm_rope(f, f->v, f->kv_dim, L->bv, NULL, false, 0, f->hp->n_head_kv, t0, t1);
        pool_barrier(f->pool);
        kv_store(f, l, ith, nth);
        pool_barrier(f->pool);
        attention_units(f, l, ith, nth, false);
        pool_barrier(f->pool);
        step_quant(f, SLOT_ATT, ith, nth);
        step_matmul(f, &L->wo, SLOT_ATT, f->y, f->hp->n_embd, ith, nth);
        step_add(f, ith, nth);
        step_rmsnorm(f, L->ffn_norm, ith, nth);
        step_quant(f, SLOT_EMBD, ith, nth);
        step_matmul(f, &L->w_gate, SLOT_EMBD, f->gate, ff, ith, nth);
        step_matmul(f, &L->w_up, SLOT_EMBD, f->up, ff, ith, nth);
        for (int t = t0; t < t1; t++) f->K->silu_mul(f->gate + t * ff, f->gate + t * ff, f->up + t * ff, ff);
        pool_barrier(f->pool);
        step_quant(f, SLOT_FF, ith, nth);
        step_matmul(f, &L->w_down, SLOT_FF, f->y, f->hp->n_embd, ith, nth);
        step_add(f, ith, nth);
    }
    if (f->n_out == 0) return;
    output_norm_quant(f, ith, nth);
    pool_barrier(f->pool);
    output_logits(f, ith);
}

static void fwd_worker(void *ctx, int ith, int nth) {
    fwd_ctx *f = ctx;
    if (f->prof && ith > 0) fwd_prof_start(f->prof, ith); /* thread 0 started in fwd_step */
    if (f->o.unfused)
        forward_unfused(f, ith, nth);
    else
        forward_fused(f, ith, nth);
    if (f->prof && ith > 0) fwd_prof_end(f->prof, ith); /* thread 0's ends in fwd_step */
}

/* ---- init / step ------------------------------------------------------------------------- */

void fwd_free(fwd_ctx *f) {
    if (!f) return;
    float *bufs[] = {f->x,   f->xn, f->q,    f->k,  f->v,       f->att,
                     f->own, f->y,  f->gate, f->up, f->scratch, f->logits_pad};
    for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++) tk_free_aligned(bufs[i]);
    for (int s = 0; s < SLOT_COUNT; s++)
        for (int a = 0; a < ACT_COUNT; a++) tk_free_aligned(f->slot[s].q[a]);
    tk_free(f->tok_pos);
    tk_free_aligned(f->rope_cs);
    tk_free(f->tok_seq);
    tk_free(f->seq_tok0);
    tk_free(f->out_tok);
    tk_free(f->units);
    tk_free_aligned(f->unit_next);
    tk_free_aligned(f->stored);
    tk_free(f->row_share);
    tk_free(f->row_cum);
    tk_free_aligned(f->work);
    tk_free(f->unit_own0);
    tk_free(f->merges);
    tk_free_aligned(f->part_recs);
    tk_free(f);
}

/* row_cum from row_share, and the work counters cleared. */
static void shares_set(fwd_ctx *f) {
    double c = 0;
    f->row_cum[0] = 0;
    for (int i = 0; i < f->nth; i++) {
        c += f->row_share[i];
        f->row_cum[i + 1] = c;
    }
    f->row_cum[f->nth] = 1; /* exactly: the last thread ends at the last row */
    memset(f->work, 0, (size_t)f->nth * sizeof *f->work);
}

/* The most a thread's row share moves in one step: one descheduled step (a
 * 50 ms outlier) then shifts the split by 1% of the rows, not by a quarter
 * of its skew. */
#define BALANCE_STEP 0.01

/* After a step: each thread's share moves a quarter of the way to its part
 * of the threads' summed speed (work per busy ns in the row-split stages),
 * by at most BALANCE_STEP, kept within [1/2, 3/2] of an even share, so a
 * core that runs slower (a shared VM's, or one the OS gives to another
 * process) is handed fewer rows and the others wait less at the barriers
 * after them. */
static void balance_update(fwd_ctx *f) {
    const int nth = f->nth;
    if (nth == 1 || f->shares_fixed) return;
    double sum = 0;
    for (int i = 0; i < nth; i++) {
        if (f->work[i].ns == 0 || f->work[i].work <= 0) { /* a thread without rows: nothing measured */
            memset(f->work, 0, (size_t)nth * sizeof *f->work);
            return;
        }
        sum += f->work[i].work / (double)f->work[i].ns;
    }
    double total = 0;
    for (int i = 0; i < nth; i++) {
        const double target = f->work[i].work / (double)f->work[i].ns / sum;
        double d = 0.25 * (target - f->row_share[i]);
        if (d > BALANCE_STEP) d = BALANCE_STEP;
        if (d < -BALANCE_STEP) d = -BALANCE_STEP;
        double v = f->row_share[i] + d;
        if (v < 0.5 / nth) v = 0.5 / nth;
        if (v > 1.5 / nth) v = 1.5 / nth;
        f->row_share[i] = v;
        total += v;
    }
    for (int i = 0; i < nth; i++) f->row_share[i] /= total;
    shares_set(f);
}

/* A zeroed aligned (rows x cols) float buffer; NULL on overflow or no memory. */
static float *alloc_f32(int64_t rows, int64_t cols) {
    size_t n;
    if (rows <= 0 || cols <= 0 || !tk_mul_size((size_t)rows, (size_t)cols, &n) ||
        !tk_mul_size(n, sizeof(float), &n))
        return NULL;
    return tk_alloc_aligned(n, 64);
}

static void slot_need(bool need[SLOT_COUNT][ACT_COUNT], int s, const tk_tensor *w) {
    int a = act_of(w);
    if (a >= 0) need[s][a] = true;
}

static tk_status slots_init(fwd_ctx *f) {
    const tk_model *m = f->m;
    bool need[SLOT_COUNT][ACT_COUNT] = {{false}};
    for (int l = 0; l < f->hp->n_layer; l++) {
        const tk_layer *L = &m->layers[l];
        slot_need(need, SLOT_EMBD, &L->wq);
        slot_need(need, SLOT_EMBD, &L->wk);
        slot_need(need, SLOT_EMBD, &L->wv);
        slot_need(need, SLOT_EMBD, &L->w_gate);
        slot_need(need, SLOT_EMBD, &L->w_up);
        slot_need(need, SLOT_ATT, &L->wo);
        slot_need(need, SLOT_FF, &L->w_down);
        if (act_of(&L->w_down) < 0) f->ff_floats = true;
    }
    if (f->o.observe) f->ff_floats = true;
    slot_need(need, SLOT_EMBD, &m->output);
    float *fbuf[SLOT_COUNT] = {f->xn, f->att, f->gate};
    int64_t width[SLOT_COUNT] = {f->hp->n_embd, f->q_dim, f->hp->n_ff};
    for (int s = 0; s < SLOT_COUNT; s++) {
        act_slot *sl = &f->slot[s];
        sl->k = width[s];
        sl->f = fbuf[s];
        sl->align = 1;
        for (int a = 0; a < ACT_COUNT; a++) {
            if (!need[s][a]) continue;
            tk_dtype at = a == ACT_Q8_0 ? TK_DTYPE_Q8_0 : TK_DTYPE_Q8_K;
            uint64_t rb;
            size_t total;
            if (!dtype_row_bytes(at, (uint64_t)sl->k, &rb))
                return tk_fail(TK_ERR_FORMAT, "forward: activation width %lld is not whole %s blocks",
                               (long long)sl->k, dtype_name(at));
            if (!tk_mul_size((size_t)rb, (size_t)f->o.max_tokens + 1, &total) ||
                !(sl->q[a] = tk_alloc_aligned(total, 64)))
                return tk_fail(TK_ERR_NOMEM, "forward: out of memory for activations");
            sl->q_stride[a] = (size_t)rb;
            int64_t blk = a == ACT_Q8_0 ? TK_QK8_0 : TK_QK_K;
            if (blk > sl->align) sl->align = blk;
        }
    }
    /* Attention units: the fewest heads whose output columns are whole blocks. */
    int hd = f->hp->head_dim, g = 1;
    while (((int64_t)g * hd) % f->slot[SLOT_ATT].align) g++;
    if (f->hp->n_head % g)
        return tk_fail(TK_ERR_FORMAT, "forward: %d heads of %d do not split into %lld-column blocks",
                       f->hp->n_head, hd, (long long)f->slot[SLOT_ATT].align);
    f->heads_per_group = g;
    /* Attention units: whole groups of heads (quantization blocks) and whole
     * GQA groups, so a unit reads each of its KV blocks once. */
    int ratio = f->hp->n_head / f->hp->n_head_kv, U = g;
    while (U % ratio) U += g;
    f->attn_chunk = f->hp->n_head % U ? g : U;
    f->ff_align = f->slot[SLOT_FF].align > ROW_ALIGN ? f->slot[SLOT_FF].align : ROW_ALIGN;
    return TK_OK;
}

tk_status fwd_init(const tk_model *m, tk_kv *kv, tk_pool *pool, const fwd_opts *o, fwd_ctx **out) {
    if (!m || !kv || !pool || !o || !out) return tk_fail(TK_ERR_INVALID, "forward: NULL argument");
    *out = NULL;
    const tk_hparams *hp = &m->hp;
    if (o->max_tokens < 1 || o->max_tokens > (1 << 20))
        return tk_fail(TK_ERR_INVALID, "forward: max_tokens %d out of range [1, 1048576]", o->max_tokens);
    if (o->max_seqs < 1 || o->max_seqs > o->max_tokens)
        return tk_fail(TK_ERR_INVALID, "forward: max_seqs %d out of range [1, max_tokens %d]", o->max_seqs,
                       o->max_tokens);
    if (o->max_ctx < 1 || o->max_ctx > (1 << 24))
        return tk_fail(TK_ERR_INVALID, "forward: max_ctx %d out of range [1, 16777216]", o->max_ctx);
    if (o->observe && o->unfused) return tk_fail(TK_ERR_INVALID, "forward: observation needs the fused plan");
    const tk_kv_opts *ko = kv_opts(kv);
    if (ko->n_layer != hp->n_layer || ko->n_head_kv != hp->n_head_kv || ko->head_dim != hp->head_dim)
        return tk_fail(
            TK_ERR_INVALID,
            "forward: KV pool shape (layers %d, kv heads %d, head_dim %d) does not match the model "
            "(%d, %d, %d)",
            ko->n_layer, ko->n_head_kv, ko->head_dim, hp->n_layer, hp->n_head_kv, hp->head_dim);
    fwd_ctx *f = tk_calloc(1, sizeof *f);
    if (!f) return tk_fail(TK_ERR_NOMEM, "forward: out of memory");
    f->m = m;
    f->hp = hp;
    f->kv = kv;
    f->pool = pool;
    f->o = *o;
    f->K = kernels_default();
    f->nth = pool_size(pool);
    f->q_dim = (int64_t)hp->n_head * hp->head_dim;
    f->kv_dim = (int64_t)hp->n_head_kv * hp->head_dim;
    f->kv_bytes_tok = kv_bytes_per_token(ko);
    f->emb_row_bytes = m->tok_embd.nbytes / (uint64_t)hp->n_vocab;
    f->attn_scratch = kv_attn_scratch_floats(kv, o->max_ctx);
    int64_t T = (int64_t)o->max_tokens + 1;
    f->x = alloc_f32(T, hp->n_embd);
    f->xn = alloc_f32(T, hp->n_embd);
    f->q = alloc_f32(T, f->q_dim);
    f->k = alloc_f32(T, f->kv_dim);
    f->v = alloc_f32(T, f->kv_dim);
    f->att = alloc_f32(T, f->q_dim);
    if (kv_attn_own_block(kv))
        f->own = alloc_f32(T, (int64_t)hp->n_head * (int64_t)KV_PART_REC(hp->head_dim));
    f->y = alloc_f32(T, hp->n_embd);
    f->gate = alloc_f32(T, hp->n_ff);
    f->up = alloc_f32(T, hp->n_ff);
    f->scratch = alloc_f32(f->nth, f->attn_scratch > 0 ? (int64_t)f->attn_scratch : 1);
    if (gemv_tokens(m->output.type, 1) != 1) f->logits_pad = alloc_f32(T, hp->n_vocab);
    f->tok_pos = tk_calloc((size_t)T, sizeof(int32_t));
    f->rope_cs = alloc_f32(T, hp->head_dim);
    f->tok_seq = tk_calloc((size_t)T, sizeof(int32_t));
    f->seq_tok0 = tk_calloc((size_t)o->max_seqs, sizeof(int32_t));
    f->out_tok = tk_calloc((size_t)T, sizeof(int32_t));
    if (!f->x || !f->xn || !f->q || !f->k || !f->v || !f->att || (kv_attn_own_block(kv) && !f->own) ||
        !f->y || !f->gate || !f->up || !f->scratch ||
        (gemv_tokens(m->output.type, 1) != 1 && !f->logits_pad) || !f->tok_pos || !f->rope_cs ||
        !f->tok_seq || !f->seq_tok0 || !f->out_tok) {
        fwd_free(f);
        return tk_fail(TK_ERR_NOMEM, "forward: out of memory for %d-token buffers", o->max_tokens);
    }
    tk_status st = slots_init(f);
    if (st) {
        fwd_free(f);
        return st;
    }
    int chunks = hp->n_head / f->attn_chunk;
    /* a sequence's slices: one more than its tokens / ATTN_SLICE at most */
    f->max_units = (o->max_seqs + o->max_tokens / ATTN_SLICE + ATTN_SPLIT_PARTS) * chunks;
    f->units = tk_calloc((size_t)f->max_units, sizeof *f->units);
    f->unit_next = tk_alloc_aligned((size_t)hp->n_layer * (size_t)f->nth * sizeof *f->unit_next, 64);
    f->stored = tk_alloc_aligned((size_t)f->nth * sizeof *f->stored, 64);
    f->unit_own0 = tk_calloc((size_t)f->nth + 1, sizeof *f->unit_own0);
    f->merges = tk_calloc((size_t)o->max_seqs * (size_t)chunks, sizeof *f->merges);
    f->part_recs = alloc_f32(ATTN_SPLIT_PARTS, (int64_t)hp->n_head * (int64_t)KV_PART_REC(hp->head_dim));
    if (!f->units || !f->unit_next || !f->stored || !f->unit_own0 || !f->merges || !f->part_recs) {
        fwd_free(f);
        return tk_fail(TK_ERR_NOMEM, "forward: out of memory for the attention plan");
    }
    f->row_share = tk_calloc((size_t)f->nth, sizeof *f->row_share);
    f->row_cum = tk_calloc((size_t)f->nth + 1, sizeof *f->row_cum);
    f->work = tk_alloc_aligned((size_t)f->nth * sizeof *f->work, 64);
    if (!f->row_share || !f->row_cum || !f->work) {
        fwd_free(f);
        return tk_fail(TK_ERR_NOMEM, "forward: out of memory for the row shares");
    }
    fwd_set_row_shares(f, NULL); /* even */
    f->shares_fixed = o->even_rows;
    *out = f;
    return TK_OK;
}

/* Everything about the batch is checked before the KV cache is touched. */
static tk_status batch_check(const fwd_ctx *f, const tk_batch *b) {
    if (b->n_seq < 0 || b->n_seq > f->o.max_seqs)
        return tk_fail(TK_ERR_INVALID, "forward: %d sequences in a step, at most %d", b->n_seq,
                       f->o.max_seqs);
    if (b->n_tok < 0 || b->n_tok > f->o.max_tokens)
        return tk_fail(TK_ERR_INVALID, "forward: %d tokens in a step, at most %d", b->n_tok, f->o.max_tokens);
    if (b->n_seq > 0 && (!b->tokens || !b->n || !b->pos0 || !b->bt || !b->n_logits))
        return tk_fail(TK_ERR_INVALID, "forward: batch has a NULL array");
    int64_t sum = 0;
    for (int s = 0; s < b->n_seq; s++) {
        if (b->n[s] < 1)
            return tk_fail(TK_ERR_INVALID, "forward: sequence %d has %d tokens", s, (int)b->n[s]);
        if (b->pos0[s] < 0 || (int64_t)b->pos0[s] + b->n[s] > f->o.max_ctx)
            return tk_fail(TK_ERR_INVALID, "forward: sequence %d spans positions [%d, %lld), past max_ctx %d",
                           s, (int)b->pos0[s], (long long)b->pos0[s] + b->n[s], f->o.max_ctx);
        if (!b->bt[s]) return tk_fail(TK_ERR_INVALID, "forward: sequence %d has no block table", s);
        if (b->n_logits[s] < 0 || b->n_logits[s] > b->n[s])
            return tk_fail(TK_ERR_INVALID, "forward: sequence %d wants logits of %d of its %d tokens", s,
                           (int)b->n_logits[s], (int)b->n[s]);
        sum += b->n[s];
    }
    if (sum != b->n_tok)
        return tk_fail(TK_ERR_INVALID, "forward: n_tok %d but the sequences hold %lld tokens", b->n_tok,
                       (long long)sum);
    for (int t = 0; t < b->n_tok; t++)
        if (b->tokens[t] < 0 || b->tokens[t] >= f->hp->n_vocab)
            return tk_fail(TK_ERR_RANGE, "forward: token id %d at %d outside the vocabulary of %d",
                           (int)b->tokens[t], t, f->hp->n_vocab);
    return TK_OK;
}

tk_status fwd_step(fwd_ctx *f, const tk_batch *b, float *logits) {
    if (!f || !b) return tk_fail(TK_ERR_INVALID, "forward: NULL argument");
    if (f->prof) fwd_prof_start(f->prof, 0);
    tk_status st = batch_check(f, b);
    if (st) return st;
    int n_out = 0, t = 0;
    const int own_block = f->own ? kv_opts(f->kv)->block_size : 0;
    fwd_step_shape sh = {0};
    for (int s = 0; s < b->n_seq; s++) {
        fwd_step_shape_add(&sh, b->n[s], b->pos0[s], b->n_logits[s], own_block);
        f->seq_tok0[s] = t;
        for (int i = 0; i < b->n[s]; i++, t++) {
            f->tok_pos[t] = b->pos0[s] + i;
            f->tok_seq[t] = s;
        }
        for (int i = t - b->n_logits[s]; i < t; i++) f->out_tok[n_out++] = i;
    }
    if (n_out > 0 && !logits) return tk_fail(TK_ERR_INVALID, "forward: logits wanted but no output buffer");
    f->n_out = n_out;
    f->trim_last = n_out < b->n_tok && !f->o.unfused && !f->o.observe;
    sh.untrimmed = !f->trim_last;
    f->last_shape = sh;
    f->rows = b->n_tok;
    f->b = b;
    f->logits = logits;
    /* Weights read once per step: every layer, one embedding row per token, and
     * the output matrix when any logits are wanted; plus KV at the real lengths. */
    uint64_t bytes = f->m->decode_bytes - f->emb_row_bytes + (uint64_t)b->n_tok * f->emb_row_bytes;
    if (n_out == 0) bytes -= f->m->output.nbytes;
    f->last_bytes = bytes + sh.kv_tokens * f->kv_bytes_tok; /* every sequence's length after the step */
    unsigned long bar0 = f->prof ? pool_barrier_count(f->pool) : 0;
    if (b->n_tok > 0) attn_plan(f);
    MARK(f, 0, FWD_ST_PLAN);
    if (b->n_tok > 0) {
        pool_run(f->pool, fwd_worker, f);
        balance_update(f);
    }
    if (f->prof) {
        MARK(f, 0, FWD_ST_WAIT); /* thread 0 waiting for the others to return */
        fwd_prof_end(f->prof, 0);
        f->prof->barriers += pool_barrier_count(f->pool) - bar0;
        f->prof->steps++;
    }
    f->b = NULL;
    return TK_OK;
}

uint64_t fwd_last_bytes(const fwd_ctx *f) { return f ? f->last_bytes : 0; }

void fwd_last_costs(const fwd_ctx *f, fwd_stage_cost *out) {
    if (f->last_shape.n_tok == 0) { /* no step yet, or an empty one: nothing read */
        for (int s = 0; s < FWD_ST_COUNT; s++) out[s] = (fwd_stage_cost){0, 0, TK_PEAK_F32};
        return;
    }
    fwd_prof_costs(f->m, f->kv_bytes_tok, kv_opts(f->kv)->type == TK_KV_INT8, &f->last_shape, out);
}

tk_status fwd_set_row_shares(fwd_ctx *f, const double *shares) {
    if (!f) return tk_fail(TK_ERR_INVALID, "forward: NULL context");
    if (shares) {
        double sum = 0;
        for (int i = 0; i < f->nth; i++) {
            if (!(shares[i] >= 0 && shares[i] <= 1))
                return tk_fail(TK_ERR_INVALID, "forward: row share %d is %g, not in [0, 1]", i, shares[i]);
            sum += shares[i];
        }
        if (fabs(sum - 1) > 1e-6) return tk_fail(TK_ERR_INVALID, "forward: row shares sum to %g, not 1", sum);
        for (int i = 0; i < f->nth; i++) f->row_share[i] = shares[i];
    } else {
        for (int i = 0; i < f->nth; i++) f->row_share[i] = 1.0 / f->nth;
    }
    f->shares_fixed = shares != NULL;
    shares_set(f);
    return TK_OK;
}

void fwd_row_shares(const fwd_ctx *f, double *out) {
    for (int i = 0; f && i < f->nth; i++) out[i] = f->row_share[i];
}

tk_status fwd_set_profile(fwd_ctx *f, fwd_prof *p) {
    if (!f) return tk_fail(TK_ERR_INVALID, "forward: NULL context");
    if (p && f->o.unfused)
        return tk_fail(TK_ERR_UNSUPPORTED, "forward: stage timing covers the fused plan only");
    if (p && (!p->rows || p->n_threads != f->nth))
        return tk_fail(TK_ERR_INVALID, "forward: a profile of %d thread rows for a pool of %d",
                       p ? p->n_threads : 0, f->nth);
    f->prof = p;
    return TK_OK;
}
