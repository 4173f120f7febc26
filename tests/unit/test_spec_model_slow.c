/* Speculative decoding over the tiny synthetic qwen3 (F32 weights, the real
 * 151,936-token vocabulary): the engine's greedy and seeded outputs with
 * n-gram drafts equal those without, token for token. Slow: every step runs
 * the full output layer. */
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cmocka.h>

#include "core/error.h"
#include "engine/engine.h"
#include "engine/sampler.h"
#include "engine_wait.h"
#include "model/model.h"
#include "tiny_model.h"
#include "tokamak.h"

#define MAXOUT 64

typedef struct rec {
    pthread_mutex_t mu;
    int32_t out[MAXOUT];
    int n_out, n_finish;
} rec;

static void on_tok(void *u, const tk_token_event *ev) {
    rec *r = u;
    pthread_mutex_lock(&r->mu);
    if (r->n_out < MAXOUT) r->out[r->n_out] = ev->token;
    r->n_out++;
    pthread_mutex_unlock(&r->mu);
}
static void on_fin(void *u, const tk_finish_event *ev) {
    rec *r = u;
    (void)ev;
    pthread_mutex_lock(&r->mu);
    r->n_finish++;
    pthread_mutex_unlock(&r->mu);
}

/* Greedy and seeded outputs of the engine over the tiny model are the same
 * with n-gram speculation as without, at batch 1 and 4, with F16 and INT8
 * per-token KV; every draft on offer is verified (the random model's drafts
 * are mostly rejected, so the controller alone would rarely verify any). */
static void test_spec_model_same_tokens(void **state) {
    (void)state;
    tk_model *m = open_tiny();
    if (!m) skip();
    const int V = model_hparams(m)->n_vocab;
    enum { NR = 4, NOUT = 24 };
    static int32_t prompts[NR][64], out[2][NR][NOUT + 4];
    static int n_out[2][NR];
    for (int i = 0; i < NR; i++)
        for (int j = 0; j < 64; j++)
            prompts[i][j] = j < 32 || i % 2 ? (int32_t)(sampler_uniform(40 + (uint64_t)i, (uint64_t)j) * V)
                                            : prompts[i][j - 32]; /* a repeat: drafts from the prompt */
    tk_kv_type kvs[] = {TK_KV_F16, TK_KV_INT8};
    tk_kv_scale scales[] = {TK_KV_SCALE_HEAD, TK_KV_SCALE_TOKEN};
    uint64_t drafted = 0;
    for (int kv = 0; kv < 2; kv++)
        for (int smp = 0; smp < 2; smp++)
            for (int bi = 0; bi < 2; bi++) {
                int batch = bi == 0 ? NR : 1;
                for (int spec = 0; spec < 2; spec++) {
                    if (bi > 0 && spec == 0) continue; /* the reference: batch NR without drafts */
                    tk_engine_opts o;
                    tk_engine_opts_default(&o);
                    o.ctx = 128;
                    o.block_size = 16;
                    o.max_batch = batch;
                    o.n_threads = 2;
                    o.kv_type = kvs[kv];
                    o.kv_scale = scales[kv];
                    o.spec = spec ? TK_SPEC_NGRAM : TK_SPEC_OFF;
                    o.spec_ngram = 2;
                    tk_engine *e = NULL;
                    if (tk_engine_create(m, &o, &e) != TK_OK) fail_msg("%s", tk_last_error());
                    engine_set_spec_force(e, true);
                    static rec r[NR];
                    for (int i = 0; i < NR; i++) {
                        memset(&r[i], 0, sizeof r[i]);
                        pthread_mutex_init(&r[i].mu, NULL);
                        tk_request q;
                        tk_request_default(&q);
                        q.prompt = prompts[i];
                        q.n_prompt = 64;
                        q.max_tokens = NOUT;
                        q.ignore_eos = true;
                        if (smp) {
                            q.sampling.temperature = 0.7f;
                            q.sampling.seed = 5 + (uint64_t)i;
                        }
                        q.on_token = on_tok;
                        q.on_finish = on_fin;
                        q.user = &r[i];
                        uint64_t id;
                        if (tk_engine_submit(e, &q, &id) != TK_OK) fail_msg("%s", tk_last_error());
                    }
                    wait_finished(e, NR);
                    tk_engine_stats st;
                    tk_engine_stats_get(e, &st);
                    drafted += st.spec_drafted;
                    tk_engine_free(e);
                    for (int i = 0; i < NR; i++) {
                        assert_int_equal(r[i].n_finish, 1);
                        if (spec == 0) {
                            n_out[smp][i] = r[i].n_out;
                            memcpy(out[smp][i], r[i].out, sizeof out[smp][i]);
                        } else {
                            assert_int_equal(r[i].n_out, n_out[smp][i]);
                            assert_memory_equal(r[i].out, out[smp][i], (size_t)r[i].n_out * sizeof(int32_t));
                        }
                    }
                }
            }
    print_message("tiny model: %llu draft tokens verified\n", (unsigned long long)drafted);
    assert_true(drafted > 0);
    tk_model_free(m);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_spec_model_same_tokens),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
