/* tokamak profile --kernels: the attention kernel alone (kbench.h,
 * kbench_attn_run). The KV is written once for one sequence (seeded
 * vectors through kv_write, so INT8 scales and layouts are the pool's own)
 * and its blocks copied to the others; every sequence holds its blocks in
 * consecutive ids, as the scheduler hands a decoding sequence its blocks. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "bench/kbench.h"
#include "core/alloc.h"
#include "core/clock.h"
#include "core/error.h"
#include "core/pool.h"
#include "kernels/kvattn.h"
#include "kv/kv.h"
#include "model/model.h"

#define KA_MIN_READ ((uint64_t)64 << 20) /* a timing reads at least this much */
#define KA_MAX_SEQS 4096                 /* sequences in the pool, at most */

typedef struct ka_job {
    tk_pool *pool;
    const tk_kv *kv;
    int n_head, n_head_kv, head_dim;
    int32_t *const *bt; /* [n_seqs] block tables */
    int n_seqs;         /* the pool's sequences; a pass takes n of them from s0, in turn */
    int s0, n, n_layer, pos, reps;
    bool barrier;     /* a barrier after each layer (streamed passes, as the step) */
    const float *q;   /* [n_head][head_dim], every query */
    const float *own; /* [n_layer][n_head] records, or NULL */
    float *out, *scratch;
    size_t scratch_floats;
} ka_job;

static void ka_worker(void *ctx, int ith, int nth) {
    const ka_job *j = ctx;
    const int nkv = j->n_head_kv, ratio = j->n_head / nkv, hd = j->head_dim;
    float *scratch = j->scratch + (size_t)ith * j->scratch_floats;
    float *out = j->out + (size_t)ith * (size_t)j->n_head * (size_t)hd;
    const float scale = 1.0f / sqrtf((float)hd);
    long u0, u1;
    pool_split((long)j->n * nkv, ith, nth, 1, &u0, &u1);
    for (int r = 0; r < j->reps; r++) {
        const int base = j->s0 + r * j->n;
        for (int l = 0; l < j->n_layer; l++) {
            const float *own = j->own ? j->own + (size_t)l * (size_t)j->n_head * KV_PART_REC(hd) : NULL;
            for (long u = u0; u < u1; u++) {
                const int s = (int)((base + u / nkv) % j->n_seqs), kvh = (int)(u % nkv);
                const int32_t *nbt = NULL;
                int nkvh = 0;
                if (u + 1 < u1) {
                    nbt = j->bt[(base + (u + 1) / nkv) % j->n_seqs];
                    nkvh = (int)((u + 1) % nkv);
                }
                kv_attention(j->kv, l, j->bt[s], j->pos, 1, j->q, j->n_head, kvh * ratio, (kvh + 1) * ratio,
                             scale, own, out, scratch, nbt, nkvh);
            }
            if (j->barrier) pool_barrier(j->pool);
        }
    }
}

static double ka_time(ka_job *j) {
    const uint64_t t0 = tk_now_ns();
    pool_run(j->pool, ka_worker, j);
    return (double)(tk_now_ns() - t0) * 1e-9;
}

/* What kbench_attn_run allocates; freed by ka_free. */
typedef struct ka_state {
    tk_kv *kv;
    tk_pool *pool;
    int32_t **bt;
    int n_seqs;
    float *q, *own, *hot_own, *out, *scratch, *kvec;
    double *t_str, *t_hot;
} ka_state;

static void ka_free(ka_state *a) {
    if (a->bt)
        for (int s = 0; s < a->n_seqs; s++) tk_free(a->bt[s]);
    tk_free(a->bt);
    kv_free(a->kv);
    pool_free(a->pool);
    tk_free(a->q);
    tk_free(a->own);
    tk_free(a->hot_own);
    tk_free_aligned(a->out);
    tk_free_aligned(a->scratch);
    tk_free(a->kvec);
    tk_free(a->t_str);
    tk_free(a->t_hot);
}

/* kbench_attn_run over the counts seq[0..n_counts), their rows in *rows;
 * with n_counts 0, only the cached pass (*hot's hot_ fields: the rows get
 * the same), over a pool of just what that pass reads. */
static tk_status ka_run(const tk_model *m, int n_threads, bool pin, const char *cpus, tk_kv_type type,
                        tk_kv_scale scale, int block_size, int ctx, const int *seq, int n_counts, int rounds,
                        ka_row *hot, ka_row **rows, int *n_rows) {
    if (rows) *rows = NULL, *n_rows = 0;
    if (n_counts < 0 || n_counts > KB_MAX_COUNTS || rounds < 1 || rounds > 64 || n_threads < 1 || ctx < 1 ||
        ctx > 65536)
        return tk_fail(TK_ERR_INVALID, "profile --kernels: attention at %d counts, %d rounds, context %d",
                       n_counts, rounds, ctx);
    for (int c = 0; c < n_counts; c++)
        if (seq[c] < 1 || seq[c] > KB_MAX_TOKENS)
            return tk_fail(TK_ERR_INVALID, "profile --kernels: %d sequences (1..%d)", seq[c], KB_MAX_TOKENS);
    const tk_hparams *hp = model_hparams(m);
    const int nl = hp->n_layer, nh = hp->n_head, nkv = hp->n_head_kv, hd = hp->head_dim;
    tk_kv_opts ko = {.n_layer = nl,
                     .n_head_kv = nkv,
                     .head_dim = hd,
                     .block_size = block_size,
                     .n_blocks = 1,
                     .type = type,
                     .scale = scale};
    /* what a query reads from the pool, asked of a one-block pool with these
     * options (kv_init refuses a geometry or block size no pool takes) */
    tk_kv *probe = NULL;
    tk_status st = kv_init(&ko, &probe);
    if (st != TK_OK) return st;
    const bool own = kv_attn_own_block(probe);
    const int pos = ctx - 1, end = kv_attn_end(probe, pos);
    kv_free(probe);
    if (end < 1) /* INT8 per head: the own block is the whole context */
        return tk_fail(TK_ERR_INVALID,
                       "profile --kernels: at context %d attention reads nothing from the pool but its own "
                       "block's record; give a --ctx above the block size (%d)",
                       ctx, block_size);
    /* the cached pass: the context (whole blocks) whose one layer fits
     * KB_ATTN_HOT bytes a thread, at most the streamed one's */
    const uint64_t tok_bytes = kv_bytes_per_token(&ko), layer_tok = tok_bytes / (uint64_t)nl;
    const int busy = n_threads < nkv ? n_threads : nkv;
    int hot_end = (int)(KB_ATTN_HOT * (uint64_t)busy / (layer_tok * (uint64_t)block_size)) * block_size;
    if (hot_end < block_size) hot_end = block_size;
    if (hot_end > end) hot_end = end < block_size ? end : end / block_size * block_size;
    const int hot_pos = own ? hot_end : hot_end - 1; /* the query whose pool context is hot_end positions */
    /* the positions written: the streamed context, or what the cached pass reads */
    const int fill = n_counts > 0 ? ctx : hot_pos + 1, bps = (fill + block_size - 1) / block_size;
    const uint64_t seq_bytes = tok_bytes * (uint64_t)bps * block_size;
    /* the counts kept, and the pool's sequences: enough for the largest and
     * for KB_ATTN_POOL bytes */
    int keep[KB_MAX_COUNTS], nk = 0, max_n = 0;
    for (int c = 0; c < n_counts; c++) {
        if ((uint64_t)seq[c] * seq_bytes > KB_ATTN_MAX) continue;
        keep[nk++] = seq[c];
        if (seq[c] > max_n) max_n = seq[c];
    }
    if (n_counts > 0 && nk == 0) return TK_OK; /* every count's KV is past KB_ATTN_MAX: no rows */
    uint64_t want = (KB_ATTN_POOL + seq_bytes - 1) / seq_bytes;
    if (want > KA_MAX_SEQS) want = KA_MAX_SEQS;
    if (want * seq_bytes > KB_ATTN_MAX) want = KB_ATTN_MAX / seq_bytes;
    const int n_seqs = nk == 0 ? 1 : (int)want > max_n ? (int)want : max_n;
    ko.n_blocks = n_seqs * bps;
    ka_state a = {.n_seqs = 0};
    st = kv_init(&ko, &a.kv);
    const tk_kv *kv = a.kv;
    const size_t rec = (size_t)nh * KV_PART_REC(hd);
    /* whole cache lines a thread, so no two threads write one line */
    const size_t sf = st == TK_OK ? (kv_attn_scratch_floats(kv, fill) + 15) / 16 * 16 : 0;
    if (st == TK_OK) {
        a.bt = tk_calloc((size_t)n_seqs, sizeof *a.bt);
        a.q = tk_malloc((size_t)nh * (size_t)hd * sizeof *a.q);
        a.own = own && nk > 0 ? tk_malloc((size_t)nl * rec * sizeof *a.own) : NULL;
        a.hot_own = own ? tk_malloc(rec * sizeof *a.hot_own) : NULL;
        a.out = tk_alloc_aligned((size_t)n_threads * (size_t)nh * (size_t)hd * sizeof *a.out, 64);
        a.scratch = tk_alloc_aligned((size_t)n_threads * sf * sizeof *a.scratch, 64);
        a.kvec = tk_malloc(2 * (size_t)nkv * (size_t)hd * sizeof *a.kvec);
        a.t_str = tk_calloc((size_t)(nk > 0 ? nk : 1) * (size_t)rounds, sizeof *a.t_str);
        a.t_hot = tk_calloc((size_t)rounds, sizeof *a.t_hot);
        if (!a.bt || !a.q || (own && nk > 0 && !a.own) || (own && !a.hot_own) || !a.out || !a.scratch ||
            !a.kvec || !a.t_str || !a.t_hot)
            st = tk_fail(TK_ERR_NOMEM, "profile --kernels: attention buffers");
    }
    /* every sequence's blocks in consecutive ids (a fresh pool hands them out in order) */
    for (int s = 0; st == TK_OK && s < n_seqs; s++) {
        a.bt[s] = tk_malloc((size_t)bps * sizeof **a.bt);
        if (!a.bt[s]) {
            st = tk_fail(TK_ERR_NOMEM, "profile --kernels: block tables");
            break;
        }
        a.n_seqs = s + 1;
        for (int b = 0; b < bps; b++) a.bt[s][b] = kv_block_alloc(a.kv);
    }
    uint64_t rs = 0x2545f4914f6cdd1dull;
    if (st == TK_OK) {
        kbench_fill(a.q, (int64_t)nh * hd, &rs);
        for (int p = 0; p < fill; p++)
            for (int l = 0; l < nl; l++) {
                kbench_fill(a.kvec, 2 * (int64_t)nkv * hd, &rs);
                kv_write(a.kv, l, a.bt[0], p, a.kvec, a.kvec + (size_t)nkv * hd);
            }
        for (int s = 1; s < n_seqs; s++)
            for (int b = 0; b < bps; b++) kv_block_copy(a.kv, a.bt[s][b], a.bt[0][b], block_size);
    }
    if (st == TK_OK && own) {
        const float sc = 1.0f / sqrtf((float)hd);
        for (int l = 0; l < nl && nk > 0; l++)
            kv_attention_own(kv, l, a.bt[0], pos, a.q, nh, 0, nh, sc, a.own + (size_t)l * rec, a.scratch,
                             NULL, 0, 0);
        kv_attention_own(kv, 0, a.bt[0], hot_pos, a.q, nh, 0, nh, sc, a.hot_own, a.scratch, NULL, 0, 0);
    }
    if (st == TK_OK) st = kbench_pool(n_threads, pin, cpus, &a.pool);
    ka_job base = {.pool = a.pool,
                   .kv = kv,
                   .n_head = nh,
                   .n_head_kv = nkv,
                   .head_dim = hd,
                   .bt = a.bt,
                   .n_seqs = n_seqs,
                   .q = a.q,
                   .out = a.out,
                   .scratch = a.scratch,
                   .scratch_floats = sf};
    const uint64_t hot_bytes = (uint64_t)hot_end * layer_tok;
    const int hot_reps = (int)((KA_MIN_READ + hot_bytes - 1) / hot_bytes);
    int s0 = 0;
    if (st == TK_OK && nk > 0) { /* untimed: every page once, the pool's threads running */
        ka_job j = base;
        j.n = n_seqs, j.n_layer = nl, j.pos = pos, j.reps = 1, j.barrier = true, j.own = a.own;
        ka_time(&j);
    }
    /* each round the cached pass once (it does not depend on the count), then the counts */
    for (int r = 0; st == TK_OK && r < rounds; r++) {
        ka_job h = base;
        h.n = 1, h.n_layer = 1, h.pos = hot_pos, h.own = a.hot_own, h.barrier = false, h.reps = hot_reps;
        h.n_seqs = 1; /* sequence 0 every time */
        a.t_hot[r] = ka_time(&h) / hot_reps;
        for (int q = 0; q < nk; q++) {
            const int ci = r % 2 ? nk - 1 - q : q, n = keep[ci];
            const uint64_t pass = (uint64_t)n * (uint64_t)end * tok_bytes;
            ka_job j = base;
            j.n = n, j.n_layer = nl, j.pos = pos, j.own = a.own, j.barrier = true, j.s0 = s0;
            j.reps = (int)((KA_MIN_READ + pass - 1) / pass);
            s0 = (s0 + j.reps * n) % n_seqs;
            a.t_str[ci * rounds + r] = ka_time(&j) / j.reps;
        }
    }
    ka_row h = {.hot_end = hot_end, .hot_bytes = hot_bytes};
    if (st == TK_OK) {
        double hgbs[64], hns[64];
        for (int r = 0; r < rounds; r++) {
            hgbs[r] = (double)hot_bytes / a.t_hot[r] * 1e-9;
            hns[r] = a.t_hot[r] * 1e9 * busy / ((double)hot_end * nkv);
        }
        h.hot_gbs = kbench_median(hgbs, rounds);
        h.hot_ns_pos = kbench_median(hns, rounds);
        if (hot) *hot = h;
    }
    ka_row *out = st == TK_OK && nk > 0 ? tk_calloc((size_t)nk, sizeof *out) : NULL;
    if (st == TK_OK && nk > 0 && !out) st = tk_fail(TK_ERR_NOMEM, "profile --kernels: attention rows");
    for (int ci = 0; st == TK_OK && ci < nk; ci++) {
        const int n = keep[ci];
        const double bytes = (double)n * end * (double)tok_bytes, ops = 4.0 * n * end * (double)nl * nh * hd;
        /* threads with units to run: a pass of n sequences has n nkv of them a layer */
        const int run = (long)n * nkv < n_threads ? n * nkv : n_threads;
        const double units = (double)n * end * nl * nkv;
        double gbs[64], gops[64], ns[64];
        for (int r = 0; r < rounds; r++) {
            const double ts = a.t_str[ci * rounds + r];
            gbs[r] = bytes / ts * 1e-9;
            gops[r] = ops / ts * 1e-9;
            ns[r] = ts * 1e9 * run / units;
        }
        out[ci] = h;
        out[ci].n_seq = n, out[ci].end = end, out[ci].bytes = (uint64_t)bytes, out[ci].ops = ops;
        out[ci].gbs = kbench_median(gbs, rounds);
        out[ci].gops = kbench_median(gops, rounds);
        out[ci].ns_pos = kbench_median(ns, rounds);
    }
    ka_free(&a);
    if (st != TK_OK) {
        tk_free(out);
        return st;
    }
    if (rows) *rows = out, *n_rows = nk;
    return TK_OK;
}

tk_status kbench_attn_run(const tk_model *m, int n_threads, bool pin, const char *cpus, tk_kv_type type,
                          tk_kv_scale scale, int block_size, int ctx, const int *seq, int n_counts,
                          int rounds, ka_row **rows, int *n_rows) {
    if (n_counts < 1) return tk_fail(TK_ERR_INVALID, "profile --kernels: attention at %d counts", n_counts);
    return ka_run(m, n_threads, pin, cpus, type, scale, block_size, ctx, seq, n_counts, rounds, NULL, rows,
                  n_rows);
}

tk_status kbench_attn_cached(const tk_model *m, int n_threads, bool pin, const char *cpus, tk_kv_type type,
                             tk_kv_scale scale, int block_size, int ctx, int rounds, ka_row *row) {
    *row = (ka_row){0};
    return ka_run(m, n_threads, pin, cpus, type, scale, block_size, ctx, NULL, 0, rounds, row, NULL, NULL);
}
