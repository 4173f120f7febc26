/* Sequences and distribution comparisons for kvcheck and eval (compare.h). */
#include "cli/compare.h"

#include <math.h>
#include <string.h>

bool cli_seq_init(cli_seq *q, tk_model *m, const cli_seq *pool_of, int threads, bool pin, tk_kv_type t,
                  tk_kv_scale s, int ctx, int bs, int max_tok, backend_observe_fn observe,
                  void *observe_ctx) {
    int nb = (ctx + bs - 1) / bs;
    backend_cpu_opts o = {.n_threads = threads,
                          .pin_threads = pin,
                          .block_size = bs,
                          .kv_type = t,
                          .kv_scale = s,
                          .n_blocks = nb,
                          .max_tokens = max_tok,
                          .max_seqs = 1,
                          .max_ctx = nb * bs,
                          .share_pool = pool_of ? &pool_of->be : NULL,
                          .observe = observe,
                          .observe_ctx = observe_ctx};
    memset(q, 0, sizeof *q);
    return backend_cpu_create(m, &o, &q->be) == TK_OK && runner_init(&q->be, &q->r) == TK_OK;
}

void cli_seq_free(cli_seq *q) {
    runner_free(q->r);
    backend_free(&q->be);
    memset(q, 0, sizeof *q);
}

int cli_argmax(const float *l, int n) {
    int b = 0;
    for (int i = 1; i < n; i++)
        if (l[i] > l[b]) b = i;
    return b;
}

double cli_log_z(const float *l, int n) {
    double m = l[cli_argmax(l, n)], z = 0;
    for (int i = 0; i < n; i++) z += exp(l[i] - m);
    return log(z) + m;
}

double cli_kl(const float *lp, const float *lq, int n) {
    return cli_kl_z(lp, cli_log_z(lp, n), lq, cli_log_z(lq, n), n);
}

double cli_kl_z(const float *lp, double lzp, const float *lq, double lzq, int n) {
    double kl = 0;
    for (int i = 0; i < n; i++) {
        double a = lp[i] - lzp, b = lq[i] - lzq;
        kl += exp(a) * (a - b);
    }
    return kl;
}
