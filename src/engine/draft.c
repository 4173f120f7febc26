#include "engine/draft.h"

#include <string.h>

#include "core/alloc.h"
#include "core/error.h"
#include "engine/sched.h"
#include "model/model.h"
#include "tokenizer/tokenizer.h"

struct drafter {
    tk_model *m;
    backend be;
    int n_vocab, block_size, ctx, bt_cap;
    int max_tokens, max_seqs;
    /* one pass's batch */
    int32_t *b_tokens;     /* (max_tokens) */
    int32_t *b_n, *b_pos0; /* (max_seqs) */
    int32_t *b_want;       /* (max_seqs) */
    const int32_t **b_bt;  /* (max_seqs) */
    int *b_job;            /* (max_seqs) the job of each row */
    int *made;             /* (max_seqs) drafts each job has made */
    float *logits;         /* (max_seqs, n_vocab) */
};

/* ---- the tokenizer check -------------------------------------------------------------- */

/* The draft proposes ids the target reads as the same text and stops on. */
static tk_status same_tokenizer(const struct tk_tokenizer *t, const struct tk_tokenizer *d, int n_t,
                                int n_d) {
    if (n_t != n_d)
        return tk_fail(TK_ERR_INVALID, "draft model: vocabulary of %d tokens, the model's has %d", n_d, n_t);
    if (!t || !d) {
        if (t != d)
            return tk_fail(TK_ERR_INVALID, "draft model: %s a tokenizer and the model %s",
                           d ? "has" : "has no", t ? "has" : "has none");
        return TK_OK;
    }
    if (tok_bos(t) != tok_bos(d) || tok_eos(t) != tok_eos(d))
        return tk_fail(TK_ERR_INVALID, "draft model: BOS/EOS ids %d/%d, the model's are %d/%d",
                       (int)tok_bos(d), (int)tok_eos(d), (int)tok_bos(t), (int)tok_eos(t));
    for (int32_t i = 0; i < n_t; i++) {
        size_t lt = 0, ld = 0;
        const char *pt = tok_piece(t, i, &lt), *pd = tok_piece(d, i, &ld);
        if (lt != ld || (lt && memcmp(pt, pd, lt) != 0) || tok_is_eog(t, i) != tok_is_eog(d, i) ||
            tok_token_type(t, i) != tok_token_type(d, i))
            return tk_fail(TK_ERR_INVALID,
                           "draft model: token %d differs from the model's (another tokenizer)", (int)i);
    }
    return TK_OK;
}

/* ---- create / free ----------------------------------------------------------------- */

tk_status drafter_create(const char *path, const backend *target, int n_blocks, int max_tokens, int max_seqs,
                         int ctx, drafter **out) {
    if (!out || !path || !target) return tk_fail(TK_ERR_INVALID, "draft model: NULL argument");
    *out = NULL;
    drafter *d = tk_calloc(1, sizeof *d);
    if (!d) return tk_fail(TK_ERR_NOMEM, "draft model: out of memory");
    tk_status st = tk_model_open(path, NULL, &d->m);
    if (st != TK_OK) {
        tk_error_prefix("draft model");
        goto fail;
    }
    const tk_hparams *hp = model_hparams(d->m);
    st = same_tokenizer(target->tok, model_tokenizer(d->m), target->n_vocab, hp->n_vocab);
    if (st != TK_OK) goto fail;
    int per_seq = (ctx + target->block_size - 1) / target->block_size;
    if (n_blocks < per_seq) n_blocks = per_seq;
    backend_cpu_opts bo = {.block_size = target->block_size,
                           .kv_type = target->kv_type,
                           .kv_scale = target->kv_scale,
                           .n_blocks = n_blocks,
                           .min_blocks = per_seq,
                           .max_tokens = max_tokens,
                           .max_seqs = max_seqs,
                           .max_ctx = ctx,
                           .share_pool = target};
    st = backend_cpu_create(d->m, &bo, &d->be);
    if (st != TK_OK) {
        tk_error_prefix("draft model");
        goto fail;
    }
    d->n_vocab = hp->n_vocab;
    d->block_size = target->block_size;
    d->ctx = ctx;
    d->bt_cap = per_seq;
    d->max_tokens = max_tokens;
    d->max_seqs = max_seqs;
    d->b_tokens = tk_calloc((size_t)max_tokens, sizeof *d->b_tokens);
    d->b_n = tk_calloc((size_t)max_seqs, sizeof *d->b_n);
    d->b_pos0 = tk_calloc((size_t)max_seqs, sizeof *d->b_pos0);
    d->b_want = tk_calloc((size_t)max_seqs, sizeof *d->b_want);
    d->b_bt = tk_calloc((size_t)max_seqs, sizeof *d->b_bt);
    d->b_job = tk_calloc((size_t)max_seqs, sizeof *d->b_job);
    d->made = tk_calloc((size_t)max_seqs, sizeof *d->made);
    d->logits = tk_calloc((size_t)max_seqs * (size_t)d->n_vocab, sizeof *d->logits);
    if (!d->b_tokens || !d->b_n || !d->b_pos0 || !d->b_want || !d->b_bt || !d->b_job || !d->made ||
        !d->logits) {
        st = tk_fail(TK_ERR_NOMEM, "draft model: out of memory for step buffers (batch %d, vocab %d)",
                     max_seqs, d->n_vocab);
        goto fail;
    }
    *out = d;
    return TK_OK;
fail:
    drafter_free(d);
    return st;
}

void drafter_free(drafter *d) {
    if (!d) return;
    backend_free(&d->be);
    tk_model_free(d->m);
    tk_free(d->b_tokens);
    tk_free(d->b_n);
    tk_free(d->b_pos0);
    tk_free(d->b_want);
    tk_free(d->b_bt);
    tk_free(d->b_job);
    tk_free(d->made);
    tk_free(d->logits);
    tk_free(d);
}

int drafter_n_vocab(const drafter *d) { return d->n_vocab; }

const backend *drafter_backend(const drafter *d) { return &d->be; }

/* ---- per sequence ----------------------------------------------------------------------- */

tk_status drafter_seq_init(drafter *d, draft_seq *ds) {
    memset(ds, 0, sizeof *ds);
    ds->bt = tk_calloc((size_t)d->bt_cap, sizeof *ds->bt);
    if (!ds->bt) return tk_fail(TK_ERR_NOMEM, "draft model: out of memory for a block table");
    ds->bt_cap = d->bt_cap;
    return TK_OK;
}

/* Keep the blocks of the first n positions, drop the rest. */
static void keep_blocks(drafter *d, draft_seq *ds, int n) {
    int keep = (n + d->block_size - 1) / d->block_size;
    while (ds->n_blocks > keep) d->be.block_free(d->be.ctx, ds->bt[--ds->n_blocks]);
}

static void journal_drop(drafter *d, draft_seq *ds) {
    if (!ds->has_journal) return;
    d->be.block_free(d->be.ctx, ds->journal);
    ds->has_journal = false;
}

/* Before the draft passes feed drafts from position pos into a block that
 * already holds positions, with a KV type that rescales: a copy of that
 * block (from a free one; none when the pool has none), so that a rejected
 * draft puts it back instead of the block being fed again from its first
 * slot. */
static void journal_take(drafter *d, draft_seq *ds, int pos) {
    journal_drop(d, ds);
    const int j = pos / d->block_size;
    if (!backend_kv_rescales(&d->be) || !d->be.block_copy || pos % d->block_size == 0 || j >= ds->n_blocks)
        return;
    const int b = d->be.block_alloc(d->be.ctx);
    if (b < 0) return;
    d->be.block_copy(d->be.ctx, b, ds->bt[j], pos % d->block_size);
    ds->journal = b;
    ds->journal_pos = pos;
    ds->has_journal = true;
}

void drafter_seq_release(drafter *d, draft_seq *ds) {
    if (!d || !ds->bt) return;
    journal_drop(d, ds);
    keep_blocks(d, ds, 0);
    ds->n_done = 0;
}

void drafter_seq_free(drafter *d, draft_seq *ds) {
    drafter_seq_release(d, ds);
    tk_free(ds->bt);
    sampler_free(ds->sampler);
    memset(ds, 0, sizeof *ds);
}

/* Blocks for n positions; false when the pool is short (what was taken stays). */
static bool reserve(drafter *d, draft_seq *ds, int n) {
    int need = (n + d->block_size - 1) / d->block_size;
    if (need > ds->bt_cap) return false;
    while (ds->n_blocks < need) {
        int b = d->be.block_alloc(d->be.ctx);
        if (b < 0) return false;
        ds->bt[ds->n_blocks++] = b;
    }
    return true;
}

void drafter_settle(drafter *d, draft_seq *ds, int n_keep) {
    if (!d) return;
    if (n_keep < ds->n_done) {
        if (n_keep < 0) n_keep = 0;
        bool restore;
        ds->n_done = sched_rollback_to(n_keep, d->block_size, backend_kv_rescales(&d->be),
                                       ds->has_journal ? ds->journal_pos : -1, &restore);
        /* the block as it was before the passes; the kept positions since fed again */
        if (restore)
            d->be.block_copy(d->be.ctx, ds->bt[ds->n_done / d->block_size], ds->journal,
                             ds->n_done % d->block_size);
        keep_blocks(d, ds, ds->n_done);
    }
    journal_drop(d, ds);
}

/* ---- drafting ------------------------------------------------------------------------------ */

/* Draft j (0-based) of job jb from its logits row; false when it cannot (the
 * job then stops at j drafts). */
static bool draft_one(drafter *d, draft_job *jb, int j, float *lg) {
    draft_seq *ds = jb->ds;
    if (!ds->sampler) {
        if (sampler_init(jb->sampling, d->n_vocab, &ds->sampler) != TK_OK) return false;
        sampler_set_n_prompt(ds->sampler, jb->n_prompt);
    }
    const int pos = jb->n_tokens + j;
    const bool sample = jb->sampling->temperature > 0;
    float *q = sample && jb->q ? jb->q + (size_t)j * (size_t)d->n_vocab : NULL;
    int32_t tok = sampler_dist(ds->sampler, lg, jb->tokens, pos, q, NULL);
    /* The draft's own stream, keyed by position: the same drafts for the same history. */
    if (tok >= 0 && q)
        tok = spec_draw(q, d->n_vocab, sampler_uniform(jb->sampling->seed ^ SPEC_SALT_DRAFT, (uint64_t)pos));
    if (tok < 0) return false;
    jb->tokens[pos] = tok;
    return true;
}

/* Row rows of the batch arrays: feed tokens of ds's known tokens from where
 * its draft KV stops, for job, wanting logits or not. */
static void put_row(drafter *d, int rows, int nt, const int32_t *tokens, draft_seq *ds, int feed, bool want,
                    int job) {
    memcpy(d->b_tokens + nt, tokens + ds->n_done, (size_t)feed * sizeof *d->b_tokens);
    d->b_n[rows] = feed;
    d->b_pos0[rows] = ds->n_done;
    d->b_bt[rows] = ds->bt;
    d->b_want[rows] = want;
    d->b_job[rows] = job;
}

/* One pass over the rows in the batch arrays; false on a backend failure. */
static bool run_pass(drafter *d, int n_rows, int n_tok) {
    tk_batch b = {.n_seq = n_rows,
                  .n_tok = n_tok,
                  .tokens = d->b_tokens,
                  .n = d->b_n,
                  .pos0 = d->b_pos0,
                  .bt = d->b_bt,
                  .n_logits = d->b_want};
    return d->be.step(d->be.ctx, &b, d->logits) == TK_OK;
}

double drafter_follow(drafter *d, const draft_follow *jobs, int n, int *n_fed) {
    double t_start = tk_now_s();
    int rows = 0, nt = 0;
    *n_fed = 0;
    for (int i = 0; i < n && rows < d->max_seqs && nt < d->max_tokens; i++) {
        draft_seq *ds = jobs[i].ds;
        int feed = jobs[i].end - ds->n_done;
        if (feed > d->max_tokens - nt) feed = d->max_tokens - nt;
        if (feed <= 0 || !reserve(d, ds, ds->n_done + feed)) continue;
        put_row(d, rows, nt, jobs[i].tokens, ds, feed, false, i);
        nt += feed;
        rows++;
    }
    if (rows == 0) return 0;
    bool ok = run_pass(d, rows, nt);
    if (ok) *n_fed = nt;
    for (int r = 0; r < rows; r++) {
        draft_seq *ds = jobs[d->b_job[r]].ds;
        if (ok)
            ds->n_done += d->b_n[r];
        else
            drafter_seq_release(d, ds);
    }
    return tk_now_s() - t_start;
}

double drafter_run(drafter *d, draft_job *jobs, int n, spec_cost *cost) {
    double t_start = tk_now_s();
    int k_max = 0, *made = d->made;
    for (int i = d->max_seqs; i < n; i++) jobs[i].k = 0;
    if (n > d->max_seqs) n = d->max_seqs;
    for (int i = 0; i < n; i++) {
        draft_job *jb = &jobs[i];
        if (jb->k <= 0) continue;
        /* Never past what the target knows, nor past the context. */
        if (jb->ds->n_done > jb->n_tokens - 1) drafter_settle(d, jb->ds, jb->n_tokens - 1);
        if (jb->k > d->ctx - jb->n_tokens + 1) jb->k = d->ctx - jb->n_tokens + 1;
        if (jb->k > k_max) k_max = jb->k;
        journal_drop(d, jb->ds);
    }
    for (int i = 0; i < n; i++) made[i] = 0;
    for (int pass = 0; pass < k_max; pass++) {
        double t0 = tk_now_s();
        int rows = 0, nt = 0, want = 0;
        for (int i = 0; i < n && rows < d->max_seqs; i++) {
            draft_job *jb = &jobs[i];
            if (jb->k <= pass || made[i] < pass) continue;
            draft_seq *ds = jb->ds;
            /* Pass 0 catches up on the known tokens; pass j feeds draft j - 1. */
            int feed = jb->n_tokens + pass - ds->n_done;
            bool wants = true;
            if (pass == 0 && feed > d->max_tokens - nt) {
                feed = d->max_tokens - nt; /* a long catch-up: a chunk now, drafts on a later step */
                wants = false;
            }
            if (feed <= 0 || !reserve(d, ds, ds->n_done + feed + (wants ? jb->k - 1 - pass : 0))) {
                jb->k = made[i];
                continue;
            }
            if (!wants) jb->k = 0;
            put_row(d, rows, nt, jb->tokens, ds, feed, wants, i);
            nt += feed;
            want += wants;
            rows++;
        }
        if (rows == 0) break;
        if (!run_pass(d, rows, nt)) {
            for (int i = 0; i < n; i++) {
                drafter_seq_release(d, jobs[i].ds);
                jobs[i].k = 0;
            }
            return tk_now_s() - t_start;
        }
        int r_lg = 0;
        for (int r = 0; r < rows; r++) {
            draft_job *jb = &jobs[d->b_job[r]];
            jb->ds->n_done += d->b_n[r];
            if (!d->b_want[r]) continue;
            float *lg = d->logits + (size_t)r_lg++ * (size_t)d->n_vocab;
            if (draft_one(d, jb, pass, lg))
                made[d->b_job[r]] = pass + 1;
            else
                jb->k = pass;
            /* pass 0 fed the known tokens; the next passes feed drafts */
            if (pass == 0 && jb->k > 1) journal_take(d, jb->ds, jb->ds->n_done);
        }
        /* Every pass prices the draft per sequence drafting, its catch-up
         * included: a draft that runs rarely pays for the tokens it missed. */
        if (want > 0 && cost) spec_cost_observe(cost, want, tk_now_s() - t0);
    }
    for (int i = 0; i < n; i++)
        if (jobs[i].k > made[i]) jobs[i].k = made[i];
    return tk_now_s() - t_start;
}
