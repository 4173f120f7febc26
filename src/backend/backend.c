/* What every backend shares: batch accounting, copy-on-write of a shared KV
 * block and the rollback rule, written against the table alone. */
#include "backend/backend.h"

#include <string.h>

#include "core/error.h"

int backend_batch_logits(const tk_batch *b) {
    int n = 0;
    for (int s = 0; s < b->n_seq; s++) n += b->n_logits[s];
    return n;
}

tk_status backend_block_cow(const backend *be, int32_t *bt, int j) {
    int old = bt[j];
    if (!be->block_refs || be->block_refs(be->ctx, old) <= 1) return TK_OK;
    int b = be->block_alloc(be->ctx);
    if (b < 0) return tk_fail(TK_ERR_FULL, "backend: no free KV block to copy shared block %d into", old);
    be->block_copy(be->ctx, b, old, be->block_size);
    be->block_free(be->ctx, old);
    bt[j] = b;
    return TK_OK;
}

bool backend_kv_rescales(const backend *be) {
    return be->kv_type == TK_KV_INT8 && be->kv_scale == TK_KV_SCALE_HEAD;
}

int backend_rewrite_from(const backend *be, int n_pos) {
    if (!backend_kv_rescales(be)) return n_pos;
    return n_pos - n_pos % be->block_size;
}

void backend_run_each(const backend *be, void (*fn)(void *arg, int i), void *arg, int n) {
    if (n > 1 && be->run_each) {
        be->run_each(be->ctx, fn, arg, n);
        return;
    }
    for (int i = 0; i < n; i++) fn(arg, i);
}

void backend_free(backend *be) {
    if (!be) return;
    if (be->destroy) be->destroy(be->ctx);
    memset(be, 0, sizeof *be);
}
