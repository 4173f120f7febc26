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
#include "tiny_draft.h"
#include "tiny_model.h"
#include "tokamak.h"

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
    tk_kv_type kvs[] = {TK_KV_F16, TK_KV_INT8, TK_KV_INT8};
    tk_kv_scale scales[] = {TK_KV_SCALE_HEAD, TK_KV_SCALE_HEAD, TK_KV_SCALE_TOKEN};
    uint64_t drafted = 0;
    for (int kv = 0; kv < 3; kv++)
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
                    static td_rec r[NR];
                    tk_engine_stats st = td_run(m, &o, true, &prompts[0][0], 64, NR, NOUT, smp ? 0.7f : 0, r);
                    drafted += st.spec_drafted;
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
