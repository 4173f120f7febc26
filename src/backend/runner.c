/* One sequence on a backend (see runner.h): a block table grown on demand,
 * the token history (for rollback), copy-on-write before every write. */
#include "backend/runner.h"

#include <string.h>

#include "core/alloc.h"
#include "core/error.h"

struct runner {
    const backend *be;
    int32_t *bt; /* (max_blocks) block ids, position order; [0, n_held) are held */
    int max_blocks;
    int n_held;
    int32_t *toks; /* (max_ctx) tokens fed, position order */
    int len;
};

tk_status runner_init(const backend *be, runner **out) {
    if (!out) return tk_fail(TK_ERR_INVALID, "runner: out is NULL");
    *out = NULL;
    if (!be || !be->step || be->block_size < 1 || be->max_ctx < 1)
        return tk_fail(TK_ERR_INVALID, "runner: not a backend");
    runner *r = tk_calloc(1, sizeof *r);
    if (!r) return tk_fail(TK_ERR_NOMEM, "runner: out of memory");
    r->be = be;
    r->max_blocks = (be->max_ctx + be->block_size - 1) / be->block_size;
    r->bt = tk_calloc((size_t)r->max_blocks, sizeof *r->bt);
    r->toks = tk_calloc((size_t)be->max_ctx, sizeof *r->toks);
    if (!r->bt || !r->toks) {
        runner_free(r);
        return tk_fail(TK_ERR_NOMEM, "runner: out of memory for a %d-token sequence", be->max_ctx);
    }
    *out = r;
    return TK_OK;
}

static void release_from(runner *r, int keep) {
    while (r->n_held > keep) r->be->block_free(r->be->ctx, r->bt[--r->n_held]);
}

void runner_free(runner *r) {
    if (!r) return;
    if (r->bt) release_from(r, 0);
    tk_free(r->bt);
    tk_free(r->toks);
    tk_free(r);
}

int runner_len(const runner *r) { return r->len; }
const int32_t *runner_tokens(const runner *r) { return r->toks; }
int runner_blocks_held(const runner *r) { return r->n_held; }

/* Blocks for positions [len, len + n): allocated, and the table's own. */
static tk_status make_room(runner *r, int n) {
    const backend *be = r->be;
    int need = (r->len + n + be->block_size - 1) / be->block_size;
    while (r->n_held < need) {
        int b = be->block_alloc(be->ctx);
        if (b < 0)
            return tk_fail(TK_ERR_FULL, "runner: no free KV block for positions up to %d (%d blocks in all)",
                           r->len + n, be->n_blocks);
        r->bt[r->n_held++] = b;
    }
    for (int j = r->len / be->block_size; j < need; j++) {
        tk_status st = backend_block_cow(be, r->bt, j);
        if (st != TK_OK) return st;
    }
    return TK_OK;
}

tk_status runner_step(runner *r, const int32_t *toks, int n, int n_logits, float *logits) {
    if (!r || !toks) return tk_fail(TK_ERR_INVALID, "runner: NULL argument");
    const backend *be = r->be;
    if (n < 1 || n > be->max_tokens)
        return tk_fail(TK_ERR_INVALID, "runner: %d tokens in a step, expected 1..%d", n, be->max_tokens);
    if (n > be->max_ctx - r->len)
        return tk_fail(TK_ERR_RANGE, "runner: %d tokens after %d exceed the context of %d", n, r->len,
                       be->max_ctx);
    if (n_logits < 0 || n_logits > n)
        return tk_fail(TK_ERR_INVALID, "runner: logits of %d of %d tokens", n_logits, n);
    tk_status st = make_room(r, n);
    if (st != TK_OK) return st;
    int32_t n1 = n, pos0 = r->len, nl = n_logits;
    const int32_t *bts[1] = {r->bt};
    tk_batch b = {
        .n_seq = 1, .n_tok = n, .tokens = toks, .n = &n1, .pos0 = &pos0, .bt = bts, .n_logits = &nl};
    st = be->step(be->ctx, &b, n_logits ? logits : NULL);
    if (st != TK_OK) return st;
    memmove(r->toks + r->len, toks, (size_t)n * sizeof *toks); /* truncate feeds the history itself */
    r->len += n;
    return TK_OK;
}

tk_status runner_feed(runner *r, const int32_t *toks, int n, float *logits) {
    if (!r || !toks) return tk_fail(TK_ERR_INVALID, "runner: NULL argument");
    if (n < 1) return tk_fail(TK_ERR_INVALID, "runner: %d tokens to feed", n);
    for (int p = 0; p < n;) {
        const int k = n - p < r->be->max_tokens ? n - p : r->be->max_tokens;
        tk_status st = runner_step(r, toks + p, k, p + k == n && logits ? 1 : 0, logits);
        if (st != TK_OK) return st;
        p += k;
    }
    return TK_OK;
}

tk_status runner_truncate(runner *r, int n_pos) {
    if (!r) return tk_fail(TK_ERR_INVALID, "runner: NULL argument");
    if (n_pos < 0 || n_pos > r->len)
        return tk_fail(TK_ERR_RANGE, "runner: truncate to %d tokens of %d", n_pos, r->len);
    int w = backend_rewrite_from(r->be, n_pos), bs = r->be->block_size;
    /* The block holding w (when w < n_pos) is written afresh: never in place,
     * as another sequence may share it. */
    release_from(r, (w + bs - 1) / bs);
    r->len = w;
    return n_pos > w ? runner_feed(r, r->toks + w, n_pos - w, NULL) : TK_OK;
}

tk_status runner_fork(const runner *r, int n_pos, runner **out) {
    if (!out) return tk_fail(TK_ERR_INVALID, "runner: out is NULL");
    *out = NULL;
    if (!r) return tk_fail(TK_ERR_INVALID, "runner: NULL argument");
    if (n_pos < 0 || n_pos > r->len)
        return tk_fail(TK_ERR_RANGE, "runner: fork at %d tokens of %d", n_pos, r->len);
    if (!r->be->block_ref) return tk_fail(TK_ERR_UNSUPPORTED, "runner: the backend cannot share blocks");
    runner *c;
    tk_status st = runner_init(r->be, &c);
    if (st != TK_OK) return st;
    int share = (n_pos + r->be->block_size - 1) / r->be->block_size;
    for (int j = 0; j < share; j++) {
        r->be->block_ref(r->be->ctx, r->bt[j]);
        c->bt[c->n_held++] = r->bt[j];
    }
    memcpy(c->toks, r->toks, (size_t)n_pos * sizeof *c->toks);
    c->len = n_pos;
    /* r may have written past n_pos into the last shared block: roll that back. */
    st = n_pos < r->len ? runner_truncate(c, n_pos) : TK_OK;
    if (st != TK_OK) {
        runner_free(c);
        return st;
    }
    *out = c;
    return TK_OK;
}

tk_status runner_kv_read(const runner *r, int l, int pos, float *k, float *v) {
    if (!r || !k || !v || !r->be->kv_read) return tk_fail(TK_ERR_INVALID, "runner: cannot read the KV cache");
    if (pos < 0 || pos >= r->len) return tk_fail(TK_ERR_RANGE, "runner: position %d of %d", pos, r->len);
    r->be->kv_read(r->be->ctx, l, r->bt, pos, k, v);
    return TK_OK;
}
