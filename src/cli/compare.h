/* What kvcheck and eval share: one sequence on its own CPU backend (the
 * runner), and the comparisons of next-token distributions. */
#ifndef TK_CLI_COMPARE_H
#define TK_CLI_COMPARE_H

#include <stdbool.h>

#include "backend/backend.h"
#include "backend/runner.h"

typedef struct cli_seq {
    backend be;
    runner *r;
} cli_seq;

/* A sequence of up to ctx tokens, steps of up to max_tok, over m with KV type
 * t/s. pool_of: NULL (own threads) or a sequence whose pool this one runs on.
 * observe/observe_ctx: backend_cpu_opts' (NULL: none). False on failure
 * (tk_last_error says why); free with cli_seq_free. */
bool cli_seq_init(cli_seq *q, tk_model *m, const cli_seq *pool_of, int threads, bool pin, tk_kv_type t,
                  tk_kv_scale s, int ctx, int bs, int max_tok, backend_observe_fn observe, void *observe_ctx);
void cli_seq_free(cli_seq *q);

int cli_argmax(const float *l, int n);
/* KL(p || q) of the softmaxes of two logit vectors, in double. */
double cli_kl(const float *lp, const float *lq, int n);
/* log sum exp(l), in double: log softmax(l)[i] = l[i] - cli_log_z(l). */
double cli_log_z(const float *l, int n);
/* cli_kl with both normalisers given. */
double cli_kl_z(const float *lp, double lzp, const float *lq, double lzq, int n);

#endif
