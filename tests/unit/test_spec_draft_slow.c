/* Speculation with a draft model over the tiny synthetic qwen3 (the real
 * 151,936-token vocabulary, so slow): greedy tokens with the draft model, the
 * same model (every draft accepted) or one with other weights (most
 * rejected), equal those without it over 16 prompts at batch 1, 4 and 16, with
 * F16 and INT8 per-token KV; seeded sampling with a mostly rejected draft gives
 * the same tokens twice. Every draft on offer is verified. */
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "core/error.h"
#include "engine/sampler.h"
#include "model/model.h"
#include "tiny_draft.h"
#include "tiny_model.h"
#include "tokamak.h"

enum { NR = 16, NP = 24, NOUT = 12 };

static void test_spec_draft_same_tokens_batches(void **state) {
    (void)state;
    char same[512], other[512];
    tk_model *m = open_tiny();
    if (!m || !tiny_path(0, same, sizeof same) || !tiny_path(1, other, sizeof other)) skip();
    const int V = model_hparams(m)->n_vocab;
    static int32_t prompts[NR * NP];
    /* Half the prompts repeat their first half: the model's own drafts and
     * lookups both have something to follow. */
    for (int i = 0; i < NR; i++)
        for (int j = 0; j < NP; j++)
            prompts[i * NP + j] = j < NP / 2 || i % 2
                                      ? (int32_t)(sampler_uniform(43 + (uint64_t)i, (uint64_t)j) * V)
                                      : prompts[i * NP + j - NP / 2];
    static td_rec ref[NR], got[NR], again[NR];
    tk_kv_type kvs[] = {TK_KV_F16, TK_KV_INT8, TK_KV_INT8};
    tk_kv_scale scales[] = {TK_KV_SCALE_HEAD, TK_KV_SCALE_HEAD, TK_KV_SCALE_TOKEN};
    const char *drafts[2] = {same, other};
    int batches[] = {1, 4, 16};
    uint64_t drafted = 0, accepted = 0;
    for (int kv = 0; kv < 3; kv++) {
        tk_engine_opts o;
        tk_engine_opts_default(&o);
        o.ctx = 64;
        o.block_size = 16;
        o.n_threads = 2;
        o.kv_type = kvs[kv];
        o.kv_scale = scales[kv];
        o.spec_k = 4;
        o.max_batch = NR;
        td_run(m, &o, false, prompts, NP, NR, NOUT, 0, ref);
        for (int b = 0; b < 3; b++)
            for (int dm = 0; dm < 2; dm++) {
                int nr = batches[b] == 1 ? 4 : NR; /* batch 1 runs one at a time: fewer prompts */
                o.max_batch = batches[b];
                o.draft_model = drafts[dm];
                tk_engine_stats st = td_run(m, &o, true, prompts, NP, nr, NOUT, 0, got);
                print_message("kv %d batch %d draft %d: %llu drafted, %llu accepted\n", kv, batches[b], dm,
                              (unsigned long long)st.spec_drafted, (unsigned long long)st.spec_accepted);
                for (int i = 0; i < nr; i++)
                    assert_memory_equal(got[i].out, ref[i].out, NOUT * sizeof(int32_t));
                if (dm == 0) assert_int_equal(st.spec_accepted, st.spec_drafted);
                drafted += st.spec_drafted;
                accepted += st.spec_accepted;
                o.draft_model = NULL;
            }
    }
    print_message("%llu draft tokens verified, %llu accepted\n", (unsigned long long)drafted,
                  (unsigned long long)accepted);
    assert_true(drafted > accepted && accepted > 0);
    /* Seeded sampling: reproducible with a mostly rejected draft. */
    tk_engine_opts o;
    tk_engine_opts_default(&o);
    o.ctx = 64;
    o.block_size = 16;
    o.n_threads = 2;
    o.max_batch = 4;
    o.spec_k = 4;
    o.draft_model = other;
    td_run(m, &o, true, prompts, NP, 8, NOUT, 1.0f, got);
    td_run(m, &o, true, prompts, NP, 8, NOUT, 1.0f, again);
    for (int i = 0; i < 8; i++) assert_memory_equal(got[i].out, again[i].out, NOUT * sizeof(int32_t));
    tk_model_free(m);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_spec_draft_same_tokens_batches),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
