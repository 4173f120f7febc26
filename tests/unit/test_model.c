/* Model loading: hyper-parameters from GGUF and config.json, validation
 * messages, tensor checks (missing, wrong shape, wrong type), GGUF files written
 * with the writer and opened with tk_model_open, and the info accounting. */
#include <sched.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cmocka.h>

#include <cjson/cJSON.h>

#include "core/error.h"
#include "core/pool.h"
#include "format/gguf.h"
#include "format/safetensors.h"
#include "model/forward.h"
#include "test_model_fixture.h"

#define expect_err(call, st, needle)                                                                         \
    do {                                                                                                     \
        tk_status s_ = (call);                                                                               \
        if (s_ != (st) || !strstr(tk_last_error(), (needle)))                                                \
            fail_msg("got %s '%s', wanted %s containing '%s'", tk_status_str(s_), tk_last_error(),           \
                     tk_status_str(st), (needle));                                                           \
    } while (0)

static void test_model_loads_every_arch(void **state) {
    (void)state;
    tk_arch archs[3] = {TK_ARCH_QWEN3, TK_ARCH_QWEN2, TK_ARCH_LLAMA};
    for (int i = 0; i < 3; i++) {
        fx_model fx;
        fx_build(&fx, archs[i], TK_DTYPE_F32, TK_NAMING_HF);
        tk_model *m;
        assert_int_equal(fx_open(&fx, NULL, &m), TK_OK);
        tk_model_info info;
        tk_model_get_info(m, &info);
        assert_string_equal(info.arch, arch_name(archs[i]));
        assert_int_equal(info.n_layer, 4);
        assert_int_equal(info.head_dim, archs[i] == TK_ARCH_QWEN3 ? 32 : 16);
        assert_string_equal(info.weight_dtype, "f32");
        assert_int_equal(info.tied_embeddings, archs[i] == TK_ARCH_QWEN3);
        /* parameters: count by hand */
        int64_t qd = 4 * info.head_dim, kvd = 2 * info.head_dim, D = 64, F = 128, V = 300;
        int64_t per_layer = D * qd + 2 * D * kvd + qd * D + 3 * D * F + 2 * D;
        if (archs[i] == TK_ARCH_QWEN2) per_layer += qd + 2 * kvd;
        if (archs[i] == TK_ARCH_QWEN3) per_layer += 2 * info.head_dim;
        int64_t want = 4 * per_layer + D * V + D + (info.tied_embeddings ? 0 : D * V);
        assert_int_equal(info.n_params, want);
        /* f32 everywhere: one decode token reads every weight but the embedding matrix, plus one row */
        uint64_t emb = (uint64_t)(D * V * 4), row = (uint64_t)D * 4;
        uint64_t out_bytes = (uint64_t)(D * V * 4);
        assert_int_equal(info.decode_bytes,
                         (uint64_t)want * 4 - emb - (info.tied_embeddings ? 0 : out_bytes) + out_bytes + row);
        assert_int_equal(info.kv_bytes_per_token, 2ull * 4 * 2 * info.head_dim * 2);
        assert_null(model_tokenizer(m));
        tk_model_free(m);
        fx_free(&fx);
    }
}

/* Every tensor model_make_resident moved, as bytes, layout and count. */
static void expect_same_weights(const tk_model *a, const tk_model *b, const char *what) {
    for (int l = 0; l < a->hp.n_layer; l++) {
        const tk_tensor *ta[7] = {&a->layers[l].wq,    &a->layers[l].wk,     &a->layers[l].wv,
                                  &a->layers[l].wo,    &a->layers[l].w_gate, &a->layers[l].w_up,
                                  &a->layers[l].w_down};
        const tk_tensor *tb[7] = {&b->layers[l].wq,    &b->layers[l].wk,     &b->layers[l].wv,
                                  &b->layers[l].wo,    &b->layers[l].w_gate, &b->layers[l].w_up,
                                  &b->layers[l].w_down};
        for (int i = 0; i < 7; i++) {
            if (ta[i]->layout != tb[i]->layout || ta[i]->nbytes != tb[i]->nbytes ||
                memcmp(ta[i]->data, tb[i]->data, (size_t)ta[i]->nbytes))
                fail_msg("%s: layer %d matrix %d differs between one thread and many", what, l, i);
        }
    }
    assert_int_equal(a->output.layout, b->output.layout);
    assert_memory_equal(a->output.data, b->output.data, (size_t)a->output.nbytes);
    assert_memory_equal(a->tok_embd.data, b->tok_embd.data, (size_t)a->tok_embd.nbytes);
    assert_true(a->resident && b->resident);
}

/* The weights are copied and packed by as many threads as the process has
 * CPUs: the same bytes as one thread (a process held to one CPU), for file
 * views (Q8_0 by 16 rows; --q8-coarse), and for repacks, whose rows are
 * converted on several threads and which the model owns and frees as they
 * are copied (BF16 -> Q8_0). */
static void test_model_resident_threads(void **state) {
    (void)state;
    cpu_set_t all, one;
    assert_int_equal(sched_getaffinity(0, sizeof all, &all), 0);
    if (CPU_COUNT(&all) < 2) print_message("one CPU: both loads run on one thread\n");
    tk_hparams hp;
    fx_hparams(&hp, TK_ARCH_QWEN3);
    hp.n_layer = 3;
    hp.n_embd = 512;
    hp.n_ff = 1536; /* 816 KiB of Q8_0 per FFN matrix: a repack on several threads */
    hp.head_dim = 64;
    static const struct {
        tk_dtype file;
        bool coarse;
        tk_weight_type repack;
    } cases[] = {{TK_DTYPE_Q8_0, false, TK_WEIGHTS_KEEP},
                 {TK_DTYPE_Q8_0, true, TK_WEIGHTS_KEEP},
                 {TK_DTYPE_BF16, false, TK_WEIGHTS_Q8_0}};
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        fx_model fx;
        fx_build_hp(&fx, &hp, cases[c].file, TK_NAMING_HF);
        tk_model_opts o;
        tk_model_opts_default(&o);
        o.q8_coarse = cases[c].coarse;
        o.repack = cases[c].repack;
        tk_model *m1, *mn;
        CPU_ZERO(&one);
        for (int cpu = 0; cpu < CPU_SETSIZE; cpu++)
            if (CPU_ISSET(cpu, &all)) {
                CPU_SET(cpu, &one);
                break;
            }
        assert_int_equal(sched_setaffinity(0, sizeof one, &one), 0);
        const tk_status s1 = fx_open(&fx, &o, &m1);
        assert_int_equal(sched_setaffinity(0, sizeof all, &all), 0);
        assert_int_equal(s1, TK_OK);
        assert_int_equal(fx_open(&fx, &o, &mn), TK_OK);
        assert_int_equal(mn->layers[0].wq.layout, cases[c].coarse ? TK_LAYOUT_X16S : TK_LAYOUT_X16);
        expect_same_weights(m1, mn, cases[c].coarse ? "q8_0 --q8-coarse" : c == 0 ? "q8_0" : "bf16 repacked");
        tk_model_free(m1);
        tk_model_free(mn);
        fx_free(&fx);
    }
}

static void test_model_bad_hparams(void **state) {
    (void)state;
    tk_hparams hp, base;
    fx_hparams(&base, TK_ARCH_QWEN3);
    assert_int_equal(arch_hparams_validate(&base), TK_OK);
    hp = base, hp.n_layer = 0;
    expect_err(arch_hparams_validate(&hp), TK_ERR_FORMAT, "block_count 0");
    hp = base, hp.n_layer = 5000;
    expect_err(arch_hparams_validate(&hp), TK_ERR_FORMAT, "block_count 5000");
    hp = base, hp.n_head_kv = 3;
    expect_err(arch_hparams_validate(&hp), TK_ERR_FORMAT,
               "head_count 4 is not a multiple of head_count_kv 3");
    hp = base, hp.head_dim = 15;
    expect_err(arch_hparams_validate(&hp), TK_ERR_FORMAT, "head_dim 15 is odd");
    hp = base, hp.head_dim = 0;
    expect_err(arch_hparams_validate(&hp), TK_ERR_FORMAT, "head_dim) 0");
    hp = base, hp.n_vocab = 0;
    expect_err(arch_hparams_validate(&hp), TK_ERR_FORMAT, "vocab_size 0");
    hp = base, hp.n_embd = 1 << 20;
    expect_err(arch_hparams_validate(&hp), TK_ERR_FORMAT, "embedding_length 1048576");
    hp = base, hp.n_ff = 0;
    expect_err(arch_hparams_validate(&hp), TK_ERR_FORMAT, "feed_forward_length 0");
    hp = base, hp.eos_id = 300;
    expect_err(arch_hparams_validate(&hp), TK_ERR_RANGE, "eos_token_id 300 outside the vocabulary of 300");
    hp = base, hp.bos_id = -7;
    expect_err(arch_hparams_validate(&hp), TK_ERR_RANGE, "bos_token_id -7");
    tk_arch a;
    expect_err(arch_from_name("gpt2", 4, &a), TK_ERR_UNSUPPORTED, "unsupported architecture 'gpt2'");
}

static void test_model_tensor_errors(void **state) {
    (void)state;
    fx_model fx;
    tk_model *m = (tk_model *)0x1;
    fx_build(&fx, TK_ARCH_QWEN3, TK_DTYPE_F32, TK_NAMING_HF);
    fx_remove(&fx, "model.layers.2.self_attn.k_proj.weight");
    expect_err(fx_open(&fx, NULL, &m), TK_ERR_FORMAT,
               "missing tensor model.layers.2.self_attn.k_proj.weight");
    assert_null(m);
    fx_free(&fx);

    fx_build(&fx, TK_ARCH_QWEN3, TK_DTYPE_F32, TK_NAMING_HF);
    fx_get(&fx, "model.layers.1.self_attn.k_proj.weight")->ne[1] = 32 * 3;
    expect_err(fx_open(&fx, NULL, &m), TK_ERR_FORMAT,
               "model.layers.1.self_attn.k_proj.weight has shape [64, 96], expected [64, 64] for qwen3");
    fx_free(&fx);

    fx_build(&fx, TK_ARCH_QWEN3, TK_DTYPE_F32, TK_NAMING_HF);
    fx_remove(&fx, "model.layers.0.self_attn.q_norm.weight");
    expect_err(fx_open(&fx, NULL, &m), TK_ERR_FORMAT,
               "missing tensor model.layers.0.self_attn.q_norm.weight");
    fx_free(&fx);

    /* a norm stored quantized */
    fx_build(&fx, TK_ARCH_LLAMA, TK_DTYPE_F32, TK_NAMING_GGUF);
    tk_tensor *n = fx_get(&fx, "blk.3.ffn_norm.weight");
    n->type = TK_DTYPE_Q8_0;
    n->nbytes = 68;
    expect_err(fx_open(&fx, NULL, &m), TK_ERR_FORMAT,
               "blk.3.ffn_norm.weight has type q8_0 (expected f32, f16 or bf16)");
    fx_free(&fx);

    /* qwen2 requires its biases; untied models their output matrix */
    fx_build(&fx, TK_ARCH_QWEN2, TK_DTYPE_F32, TK_NAMING_GGUF);
    fx_remove(&fx, "blk.1.attn_v.bias");
    expect_err(fx_open(&fx, NULL, &m), TK_ERR_FORMAT, "missing tensor blk.1.attn_v.bias");
    fx_free(&fx);
    fx_build(&fx, TK_ARCH_LLAMA, TK_DTYPE_F32, TK_NAMING_HF);
    fx_remove(&fx, "lm_head.weight");
    expect_err(fx_open(&fx, NULL, &m), TK_ERR_FORMAT, "missing tensor lm_head.weight");
    fx_free(&fx);
    /* llama3 scaling in GGUF needs rope_freqs.weight */
    fx_build(&fx, TK_ARCH_LLAMA, TK_DTYPE_F32, TK_NAMING_GGUF);
    fx_remove(&fx, "rope_freqs.weight");
    expect_err(fx_open(&fx, NULL, &m), TK_ERR_FORMAT, "missing tensor rope_freqs.weight");
    fx_free(&fx);
    /* a matmul type without a kernel */
    fx_build(&fx, TK_ARCH_QWEN3, TK_DTYPE_F32, TK_NAMING_HF);
    fx_get(&fx, "model.layers.0.mlp.up_proj.weight")->type = (tk_dtype)13; /* q5_k */
    expect_err(fx_open(&fx, NULL, &m), TK_ERR_UNSUPPORTED, "up_proj.weight has type q5_k");
    fx_free(&fx);
}

static void test_model_unpermute_rows(void **state) {
    (void)state;
    /* 2 heads of head_dim 6, one float per row: GGUF row 2i+j holds HF row j*3+i */
    float hf[12], gg[12], back[12];
    for (int i = 0; i < 12; i++) hf[i] = (float)i;
    memcpy(gg, hf, sizeof gg);
    fx_permute(gg, 2, 6, 1);
    const float want_gg[12] = {0, 3, 1, 4, 2, 5, 6, 9, 7, 10, 8, 11};
    assert_memory_equal(gg, want_gg, sizeof gg);
    model_unpermute_rows(gg, back, 2, 6, sizeof(float));
    assert_memory_equal(back, hf, sizeof hf);
}

/* ---- GGUF files ------------------------------------------------------------------ */

typedef struct gguf_tweak {
    const char *arch; /* general.architecture override */
    int block_count;  /* 0: the real one; -1: write 0 */
    int bos;          /* -1: none */
    bool vocab_key;
    int ctx;               /* context_length: 0 the real one; -1 write 0; -2 leave the key out */
    const char *rope_type; /* rope.scaling.type, written when set */
    float rope_factor;     /* rope.scaling.factor, written when > 0 */
} gguf_tweak;

static void write_gguf(fx_model *fx, const char *path, const gguf_tweak *tw) {
    gguf_writer *w;
    const tk_hparams *hp = &fx->hp;
    const char *a = tw && tw->arch ? tw->arch : arch_name(hp->arch);
    char k[128];
    assert_int_equal(gguf_writer_init(0, &w), TK_OK);
    assert_int_equal(gguf_w_str(w, "general.architecture", a), TK_OK);
    assert_int_equal(gguf_w_str(w, "general.name", "fixture"), TK_OK);
#define KU32(suffix, v)                                                                                      \
    snprintf(k, sizeof k, "%s." suffix, a);                                                                  \
    assert_int_equal(gguf_w_u32(w, k, (uint32_t)(v)), TK_OK)
    KU32("block_count", tw && tw->block_count ? (tw->block_count < 0 ? 0 : tw->block_count) : hp->n_layer);
    if (!tw || tw->ctx != -2) {
        KU32("context_length", tw && tw->ctx ? (tw->ctx < 0 ? 0 : tw->ctx) : hp->n_ctx_train);
    }
    KU32("embedding_length", hp->n_embd);
    KU32("feed_forward_length", hp->n_ff);
    KU32("attention.head_count", hp->n_head);
    KU32("attention.head_count_kv", hp->n_head_kv);
    KU32("attention.key_length", hp->head_dim);
    KU32("attention.value_length", hp->head_dim);
    if (tw && tw->vocab_key) {
        KU32("vocab_size", hp->n_vocab);
    }
#undef KU32
    snprintf(k, sizeof k, "%s.attention.layer_norm_rms_epsilon", a);
    assert_int_equal(gguf_w_f32(w, k, hp->rms_eps), TK_OK);
    snprintf(k, sizeof k, "%s.rope.freq_base", a);
    assert_int_equal(gguf_w_f32(w, k, hp->rope_theta), TK_OK);
    if (tw && tw->rope_type) {
        snprintf(k, sizeof k, "%s.rope.scaling.type", a);
        assert_int_equal(gguf_w_str(w, k, tw->rope_type), TK_OK);
    }
    if (tw && tw->rope_factor > 0) {
        snprintf(k, sizeof k, "%s.rope.scaling.factor", a);
        assert_int_equal(gguf_w_f32(w, k, tw->rope_factor), TK_OK);
    }
    if (tw && tw->bos >= 0)
        assert_int_equal(gguf_w_u32(w, "tokenizer.ggml.bos_token_id", (uint32_t)tw->bos), TK_OK);
    else if (!tw)
        assert_int_equal(gguf_w_u32(w, "tokenizer.ggml.bos_token_id", (uint32_t)hp->bos_id), TK_OK);
    for (int i = 0; i < fx->n; i++)
        if (gguf_w_tensor_info(w, fx->t[i].name, fx->t[i].type, fx->t[i].n_dims, fx->t[i].ne) != TK_OK)
            fail_msg("%s", tk_last_error());
    assert_int_equal(gguf_w_begin(w, path), TK_OK);
    for (int i = 0; i < fx->n; i++)
        assert_int_equal(gguf_w_tensor_data(w, fx->t[i].data, fx->t[i].nbytes), TK_OK);
    assert_int_equal(gguf_w_finish(w), TK_OK);
    gguf_writer_free(w);
}

static void tmp_path(char *buf, size_t n, const char *name) {
    const char *d = getenv("TK_TMP");
    snprintf(buf, n, "%s/test_model_%d_%s.gguf", d && *d ? d : "/tmp", (int)getpid(), name);
}

static void logits_of(tk_model *m, float *out) {
    tk_kv_opts ko = {.n_layer = m->hp.n_layer,
                     .n_head_kv = m->hp.n_head_kv,
                     .head_dim = m->hp.head_dim,
                     .block_size = 16,
                     .n_blocks = 2,
                     .type = TK_KV_F16};
    tk_kv *kv;
    tk_pool *pool;
    fwd_ctx *f;
    assert_int_equal(kv_init(&ko, &kv), TK_OK);
    assert_int_equal(pool_init(2, false, &pool), TK_OK);
    fwd_opts fo = {.max_tokens = 16, .max_seqs = 1, .max_ctx = 32};
    assert_int_equal(fwd_init(m, kv, pool, &fo, &f), TK_OK);
    int32_t toks[6] = {3, 1, 4, 1, 5, 9}, n = 6, pos0 = 0, bt[2] = {kv_block_alloc(kv), kv_block_alloc(kv)};
    const int32_t *bts[1] = {bt};
    int32_t want = 1;
    tk_batch b = {
        .n_seq = 1, .n_tok = 6, .tokens = toks, .n = &n, .pos0 = &pos0, .bt = bts, .n_logits = &want};
    assert_int_equal(fwd_step(f, &b, out), TK_OK);
    fwd_free(f);
    pool_free(pool);
    kv_free(kv);
}

/* A GGUF file written by the writer loads with the same hyper-parameters and
 * gives the same logits as the in-memory model built from the same tensors. */
static void test_model_gguf_roundtrip(void **state) {
    (void)state;
    tk_arch archs[3] = {TK_ARCH_QWEN3, TK_ARCH_QWEN2, TK_ARCH_LLAMA};
    tk_dtype types[3] = {TK_DTYPE_Q8_0, TK_DTYPE_F16, TK_DTYPE_F32};
    for (int i = 0; i < 3; i++) {
        fx_model fx;
        fx_build(&fx, archs[i], types[i], TK_NAMING_GGUF);
        char path[512];
        tmp_path(path, sizeof path, arch_name(archs[i]));
        write_gguf(&fx, path, NULL);
        tk_model *mf, *mm;
        if (tk_model_open(path, NULL, &mf) != TK_OK) fail_msg("open: %s", tk_last_error());
        assert_int_equal(fx_open(&fx, NULL, &mm), TK_OK);
        const tk_hparams *a = model_hparams(mf), *b = model_hparams(mm);
        assert_int_equal(a->arch, b->arch);
        assert_int_equal(a->n_layer, b->n_layer);
        assert_int_equal(a->head_dim, b->head_dim);
        assert_int_equal(a->n_vocab, b->n_vocab);
        assert_int_equal(a->tied, b->tied);
        assert_int_equal(a->qkv_bias, b->qkv_bias);
        assert_int_equal(a->qk_norm, b->qk_norm);
        assert_int_equal(a->rope_scaling, b->rope_scaling);
        assert_int_equal(a->bos_id, 1);
        assert_true(a->rms_eps == b->rms_eps && a->rope_theta == b->rope_theta);
        tk_model_info info;
        tk_model_get_info(mf, &info);
        assert_string_equal(info.name, "fixture");
        assert_string_equal(info.weight_dtype, dtype_name(types[i]));
        float *la = malloc(300 * sizeof(float)), *lb = malloc(300 * sizeof(float));
        logits_of(mf, la);
        logits_of(mm, lb);
        assert_memory_equal(la, lb, 300 * sizeof(float));
        free(la);
        free(lb);
        tk_model_free(mf);
        tk_model_free(mm);
        unlink(path);
        fx_free(&fx);
    }
}

/* tk_model_open's message names the path exactly once. */
#define expect_open_err(path, st, needle)                                                                    \
    do {                                                                                                     \
        tk_model *m_ = (tk_model *)0x1;                                                                      \
        expect_err(tk_model_open((path), NULL, &m_), st, needle);                                            \
        assert_null(m_);                                                                                     \
        const char *at_ = strstr(tk_last_error(), (path));                                                   \
        if (!at_ || strstr(at_ + 1, (path))) fail_msg("'%s' should name %s once", tk_last_error(), (path));  \
    } while (0)

static void test_model_gguf_errors(void **state) {
    (void)state;
    fx_model fx;
    fx_build(&fx, TK_ARCH_QWEN2, TK_DTYPE_F32, TK_NAMING_GGUF);
    char path[512];
    tmp_path(path, sizeof path, "bad");
    gguf_tweak tw = {.arch = "gpt2", .bos = -1};
    write_gguf(&fx, path, &tw);
    expect_open_err(path, TK_ERR_UNSUPPORTED, "unsupported architecture 'gpt2'");
    tw = (gguf_tweak){.block_count = -1, .bos = -1};
    write_gguf(&fx, path, &tw);
    expect_open_err(path, TK_ERR_FORMAT, "block_count 0");
    tw = (gguf_tweak){.bos = 300, .vocab_key = true};
    write_gguf(&fx, path, &tw);
    expect_open_err(path, TK_ERR_RANGE, "bos_token_id 300 outside the vocabulary of 300");
    tw = (gguf_tweak){.block_count = 5, .bos = -1};
    write_gguf(&fx, path, &tw);
    expect_open_err(path, TK_ERR_FORMAT, "missing tensor blk.4.attn_norm.weight");
    FILE *f = fopen(path, "wb"); /* not GGUF: the reader's own message */
    assert_non_null(f);
    fputs("GGUFxxxx", f);
    fclose(f);
    expect_open_err(path, TK_ERR_FORMAT, "shorter than the 24-byte header");
    unlink(path);
    expect_open_err(path, TK_ERR_IO, "No such file");
    assert_int_equal(mkfifo(path, 0600), 0);
    alarm(20); /* a blocking open fails the test instead of hanging it */
    expect_open_err(path, TK_ERR_IO, "not a regular file (a FIFO)");
    alarm(0);
    unlink(path);
    fx_free(&fx);
}

/* context_length, when written, is a usable context (8 is tiny but legal);
 * a rope scaling type comes with what it needs. */
static void test_model_gguf_limits(void **state) {
    (void)state;
    fx_model fx;
    fx_build(&fx, TK_ARCH_QWEN2, TK_DTYPE_F32, TK_NAMING_GGUF);
    char path[512];
    tmp_path(path, sizeof path, "limits");
    tk_model *m;
    gguf_tweak tw = {.bos = -1, .ctx = -1};
    write_gguf(&fx, path, &tw);
    expect_open_err(path, TK_ERR_FORMAT, "qwen2.context_length 0 out of range [1, 16777216]");
    tw = (gguf_tweak){.bos = -1, .ctx = 8};
    write_gguf(&fx, path, &tw);
    if (tk_model_open(path, NULL, &m) != TK_OK) fail_msg("%s", tk_last_error());
    assert_int_equal(model_hparams(m)->n_ctx_train, 8);
    tk_model_free(m);
    tw = (gguf_tweak){.bos = -1, .ctx = -2}; /* not stated: unknown */
    write_gguf(&fx, path, &tw);
    if (tk_model_open(path, NULL, &m) != TK_OK) fail_msg("%s", tk_last_error());
    assert_int_equal(model_hparams(m)->n_ctx_train, 0);
    tk_model_free(m);
    tw = (gguf_tweak){.bos = -1, .rope_type = "llama3", .rope_factor = 8};
    write_gguf(&fx, path, &tw);
    expect_open_err(path, TK_ERR_FORMAT,
                    "qwen2.rope.scaling.type is llama3 but the rope_freqs.weight tensor is missing");
    tw = (gguf_tweak){.bos = -1, .rope_type = "linear"};
    write_gguf(&fx, path, &tw);
    expect_open_err(path, TK_ERR_FORMAT,
                    "qwen2.rope.scaling.type is linear but qwen2.rope.scaling.factor is missing");
    tw = (gguf_tweak){.bos = -1, .rope_type = "linear", .rope_factor = 4};
    write_gguf(&fx, path, &tw);
    if (tk_model_open(path, NULL, &m) != TK_OK) fail_msg("%s", tk_last_error());
    assert_int_equal(model_hparams(m)->rope_scaling, TK_ROPE_SCALING_LINEAR);
    assert_true(model_hparams(m)->rope_factor == 4.0f);
    tk_model_free(m);
    unlink(path);
    fx_free(&fx);
}

/* The same llama written as an HF directory (HF row order, llama3 factors from
 * config.json) and as GGUF (permuted Q/K, rope_freqs.weight): bit-identical logits. */
static void test_model_hf_dir_matches_gguf(void **state) {
    (void)state;
    fx_model hf, gg;
    fx_build(&hf, TK_ARCH_LLAMA, TK_DTYPE_BF16, TK_NAMING_HF);
    fx_build(&gg, TK_ARCH_LLAMA, TK_DTYPE_BF16, TK_NAMING_GGUF);
    char dir[512], path[600], gpath[512];
    const char *t = getenv("TK_TMP");
    snprintf(dir, sizeof dir, "%s/test_model_%d_hf", t && *t ? t : "/tmp", (int)getpid());
    assert_int_equal(mkdir(dir, 0755), 0);
    snprintf(path, sizeof path, "%s/model.safetensors", dir);
    if (st_write(path, hf.t, hf.n, NULL) != TK_OK) fail_msg("%s", tk_last_error());
    snprintf(path, sizeof path, "%s/config.json", dir);
    FILE *f = fopen(path, "w");
    assert_non_null(f);
    fputs("{\"architectures\":[\"LlamaForCausalLM\"],\"model_type\":\"llama\",\"hidden_size\":64,"
          "\"num_hidden_layers\":4,\"num_attention_heads\":4,\"num_key_value_heads\":2,\"intermediate_size\":"
          "128,"
          "\"vocab_size\":300,\"rms_norm_eps\":1e-06,\"rope_theta\":10000.0,\"tie_word_embeddings\":false,"
          "\"rope_scaling\":{\"rope_type\":\"llama3\",\"factor\":8.0,\"low_freq_factor\":1.0,"
          "\"high_freq_factor\":4.0,\"original_max_position_embeddings\":8192},\"bos_token_id\":1,"
          "\"eos_token_id\":2}",
          f);
    fclose(f);
    tmp_path(gpath, sizeof gpath, "llama_gguf");
    write_gguf(&gg, gpath, NULL);
    tk_model *mh, *mg;
    if (tk_model_open(dir, NULL, &mh) != TK_OK) fail_msg("%s", tk_last_error());
    if (tk_model_open(gpath, NULL, &mg) != TK_OK) fail_msg("%s", tk_last_error());
    tk_model_info info;
    tk_model_get_info(mh, &info);
    assert_string_equal(info.weight_dtype, "bf16");
    assert_int_equal(info.n_vocab, 300);
    float *la = malloc(300 * sizeof(float)), *lb = malloc(300 * sizeof(float));
    logits_of(mh, la);
    logits_of(mg, lb);
    assert_memory_equal(la, lb, 300 * sizeof(float));
    free(la);
    free(lb);
    tk_model_free(mh);
    tk_model_free(mg);
    unlink(path);
    snprintf(path, sizeof path, "%s/model.safetensors", dir);
    unlink(path);
    rmdir(dir);
    unlink(gpath);
    fx_free(&hf);
    fx_free(&gg);
}

/* ---- config.json ------------------------------------------------------------------ */

static void test_model_hf_config(void **state) {
    (void)state;
    tk_hparams hp;
    const char *qwen3 =
        "{\"architectures\":[\"Qwen3ForCausalLM\"],\"model_type\":\"qwen3\",\"hidden_size\":1024,"
        "\"num_hidden_layers\":28,\"num_attention_heads\":16,\"num_key_value_heads\":8,\"head_dim\":128,"
        "\"intermediate_size\":3072,\"rms_norm_eps\":1e-06,\"rope_theta\":1000000,\"rope_scaling\":null,"
        "\"tie_word_embeddings\":true,\"vocab_size\":151936,\"max_position_embeddings\":40960,"
        "\"bos_token_id\":151643,\"eos_token_id\":151645}";
    assert_int_equal(arch_hparams_hf_json(qwen3, strlen(qwen3), &hp), TK_OK);
    assert_int_equal(hp.arch, TK_ARCH_QWEN3);
    assert_int_equal(hp.n_layer, 28);
    assert_int_equal(hp.head_dim, 128);
    assert_int_equal(hp.n_head_kv, 8);
    assert_int_equal(hp.n_ctx_train, 40960);
    assert_true(hp.tied && hp.qk_norm && !hp.qkv_bias);
    assert_int_equal(hp.eos_id, 151645);
    assert_true(hp.rope_theta == 1e6f);

    const char *llama =
        "{\"architectures\":[\"LlamaForCausalLM\"],\"hidden_size\":2048,\"num_hidden_layers\":16,"
        "\"num_attention_heads\":32,\"num_key_value_heads\":8,\"intermediate_size\":8192,"
        "\"rms_norm_eps\":1e-05,\"rope_theta\":500000.0,\"vocab_size\":128256,"
        "\"rope_scaling\":{\"factor\":32.0,\"high_freq_factor\":4.0,\"low_freq_factor\":1.0,"
        "\"original_max_position_embeddings\":8192,\"rope_type\":\"llama3\"},"
        "\"eos_token_id\":[128001,128008,128009],\"bos_token_id\":128000}";
    assert_int_equal(arch_hparams_hf_json(llama, strlen(llama), &hp), TK_OK);
    assert_int_equal(hp.arch, TK_ARCH_LLAMA);
    assert_int_equal(hp.head_dim, 64);
    assert_int_equal(hp.rope_scaling, TK_ROPE_SCALING_LLAMA3);
    assert_true(hp.rope_factor == 32.0f && hp.rope_orig_ctx == 8192);
    assert_int_equal(hp.eos_id, 128001);
    assert_false(hp.tied);

    const char *mistral = "{\"model_type\":\"mistral\",\"hidden_size\":64}";
    expect_err(arch_hparams_hf_json(mistral, strlen(mistral), &hp), TK_ERR_UNSUPPORTED, "'mistral'");
    const char *nohidden = "{\"model_type\":\"qwen2\",\"num_hidden_layers\":2}";
    expect_err(arch_hparams_hf_json(nohidden, strlen(nohidden), &hp), TK_ERR_FORMAT, "lacks hidden_size");
    const char *badeos =
        "{\"model_type\":\"qwen2\",\"hidden_size\":64,\"num_hidden_layers\":2,\"intermediate_size\":"
        "128,\"num_attention_heads\":4,\"vocab_size\":300,\"eos_token_id\":[2,400]}";
    expect_err(arch_hparams_hf_json(badeos, strlen(badeos), &hp), TK_ERR_RANGE, "eos_token_id entry 400");
    const char *yarn =
        "{\"model_type\":\"qwen2\",\"hidden_size\":64,\"num_hidden_layers\":2,\"intermediate_size\":128,"
        "\"num_attention_heads\":4,\"vocab_size\":300,\"rope_scaling\":{\"type\":\"yarn\",\"factor\":4}}";
    expect_err(arch_hparams_hf_json(yarn, strlen(yarn), &hp), TK_ERR_UNSUPPORTED, "'yarn'");
    expect_err(arch_hparams_hf_json("{", 1, &hp), TK_ERR_FORMAT, "not valid JSON");
}

/* A small qwen2 config.json with key set to the JSON text val (NULL: removed). */
static const char *HF_BASE =
    "{\"model_type\":\"qwen2\",\"hidden_size\":64,\"num_hidden_layers\":4,"
    "\"intermediate_size\":128,\"num_attention_heads\":4,\"num_key_value_heads\":2,"
    "\"vocab_size\":300,\"max_position_embeddings\":4096,\"tie_word_embeddings\":false}";

static char *hf_with(const char *key, const char *val) {
    cJSON *root = cJSON_Parse(HF_BASE);
    assert_non_null(root);
    cJSON_DeleteItemFromObjectCaseSensitive(root, key);
    if (val) {
        cJSON *v = cJSON_Parse(val);
        assert_non_null(v);
        cJSON_AddItemToObject(root, key, v);
    }
    char *out = cJSON_PrintUnformatted(root);
    cJSON_Delete(root);
    return out;
}

static void expect_hf(const char *key, const char *val, tk_status want, const char *needle) {
    char *j = hf_with(key, val);
    tk_hparams hp;
    if (want == TK_OK) {
        if (arch_hparams_hf_json(j, strlen(j), &hp) != TK_OK)
            fail_msg("%s=%s: %s", key, val, tk_last_error());
    } else {
        expect_err(arch_hparams_hf_json(j, strlen(j), &hp), want, needle);
    }
    cJSON_free(j);
}

/* Optional keys are checked as written: never silently replaced by a default. */
static void test_model_hf_config_limits(void **state) {
    (void)state;
    expect_hf("max_position_embeddings", "0", TK_ERR_FORMAT,
              "config.json max_position_embeddings 0 out of range [1,");
    expect_hf("max_position_embeddings", "-5", TK_ERR_FORMAT, "max_position_embeddings -5 out of range");
    expect_hf("max_position_embeddings", "8", TK_OK, NULL);  /* tiny but legal */
    expect_hf("max_position_embeddings", NULL, TK_OK, NULL); /* not stated */
    expect_hf("head_dim", "-4", TK_ERR_FORMAT, "config.json head_dim -4 out of range [1, 1024]");
    expect_hf("head_dim", "0", TK_ERR_FORMAT, "config.json head_dim 0 out of range");
    expect_hf("head_dim", "null", TK_OK, NULL);
    expect_hf("num_key_value_heads", "-2", TK_ERR_FORMAT,
              "config.json num_key_value_heads -2 out of range [1, 1024]");
    expect_hf("num_key_value_heads", "0", TK_ERR_FORMAT, "num_key_value_heads 0 out of range");
    expect_hf("num_key_value_heads", "2.5", TK_ERR_FORMAT, "num_key_value_heads is not an integer");
    expect_hf("tie_word_embeddings", "\"yes\"", TK_ERR_FORMAT, "tie_word_embeddings is not true or false");
    expect_hf("tie_word_embeddings", "1", TK_ERR_FORMAT, "tie_word_embeddings is not true or false");
    expect_hf("tie_word_embeddings", "true", TK_OK, NULL);
    expect_hf("attention_bias", "\"false\"", TK_ERR_FORMAT, "attention_bias is not true or false");
    expect_hf("model_type", "7", TK_ERR_FORMAT, "model_type is not a string");
    expect_hf("eos_token_id", "2.5", TK_ERR_FORMAT, "eos_token_id is not a token id");
    expect_hf("eos_token_id", "[2, 3.5]", TK_ERR_RANGE, "eos_token_id entry 3.5");
    expect_hf("rope_scaling", "{\"rope_type\":\"llama3\"}", TK_ERR_FORMAT,
              "rope_scaling of type llama3 lacks factor");
    expect_hf("rope_scaling",
              "{\"rope_type\":\"llama3\",\"factor\":8,\"low_freq_factor\":1,\"high_freq_factor\":4}",
              TK_ERR_FORMAT, "rope_scaling of type llama3 lacks original_max_position_embeddings");
    expect_hf("rope_scaling",
              "{\"rope_type\":\"llama3\",\"factor\":8,\"high_freq_factor\":4,"
              "\"original_max_position_embeddings\":8192}",
              TK_ERR_FORMAT, "rope_scaling of type llama3 lacks low_freq_factor");
    expect_hf("rope_scaling",
              "{\"rope_type\":\"llama3\",\"factor\":\"8\",\"low_freq_factor\":1,\"high_freq_factor\":4,"
              "\"original_max_position_embeddings\":8192}",
              TK_ERR_FORMAT, "config.json factor is not a number");
    expect_hf("rope_scaling",
              "{\"rope_type\":\"llama3\",\"factor\":8,\"low_freq_factor\":1,\"high_freq_factor\":4,"
              "\"original_max_position_embeddings\":8192}",
              TK_OK, NULL);
    expect_hf("rope_scaling", "{\"type\":\"linear\"}", TK_ERR_FORMAT,
              "rope_scaling of type linear lacks factor");
    expect_hf("rope_scaling", "{\"type\":\"linear\",\"factor\":2}", TK_OK, NULL);
    expect_hf("rope_scaling", "[1]", TK_ERR_FORMAT, "rope_scaling is not an object");
}

/* An HF directory's errors name it (or the file in it) once. */
static void test_model_hf_dir_errors(void **state) {
    (void)state;
    fx_model fx;
    fx_build(&fx, TK_ARCH_QWEN2, TK_DTYPE_F32, TK_NAMING_HF);
    char dir[512], path[600];
    const char *t = getenv("TK_TMP");
    snprintf(dir, sizeof dir, "%s/test_model_%d_hferr", t && *t ? t : "/tmp", (int)getpid());
    assert_int_equal(mkdir(dir, 0755), 0);
    snprintf(path, sizeof path, "%s/model.safetensors", dir);
    if (st_write(path, fx.t, fx.n, NULL) != TK_OK) fail_msg("%s", tk_last_error());
    snprintf(path, sizeof path, "%s/config.json", dir);
    static const struct {
        const char *key, *val;
        tk_status st;
        const char *needle;
    } cases[] = {
        {"max_position_embeddings", "0", TK_ERR_FORMAT, "max_position_embeddings 0 out of range"},
        {"head_dim", "-4", TK_ERR_FORMAT, "head_dim -4 out of range"},
        {"tie_word_embeddings", "\"yes\"", TK_ERR_FORMAT, "tie_word_embeddings is not true or false"},
        {"intermediate_size", "96", TK_ERR_FORMAT, "model.layers.0.mlp.gate_proj.weight"},
        {"vocab_size", "300", TK_OK, NULL},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        char *j = hf_with(cases[i].key, cases[i].val);
        FILE *f = fopen(path, "w");
        assert_non_null(f);
        fputs(j, f);
        fclose(f);
        cJSON_free(j);
        if (cases[i].st != TK_OK) {
            expect_open_err(dir, cases[i].st, cases[i].needle);
        } else {
            tk_model *m;
            if (tk_model_open(dir, NULL, &m) != TK_OK) fail_msg("%s", tk_last_error());
            tk_model_free(m);
        }
    }
    unlink(path);
    expect_open_err(dir, TK_ERR_IO, "config.json");
    assert_int_equal(mkfifo(path, 0600), 0);
    alarm(20);
    expect_open_err(dir, TK_ERR_IO, "config.json: not a regular file (a FIFO)");
    alarm(0);
    unlink(path);
    snprintf(path, sizeof path, "%s/model.safetensors", dir);
    unlink(path);
    rmdir(dir);
    fx_free(&fx);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_model_loads_every_arch),    cmocka_unit_test(test_model_resident_threads),
        cmocka_unit_test(test_model_bad_hparams),         cmocka_unit_test(test_model_tensor_errors),
        cmocka_unit_test(test_model_unpermute_rows),      cmocka_unit_test(test_model_gguf_roundtrip),
        cmocka_unit_test(test_model_gguf_errors),         cmocka_unit_test(test_model_hf_config),
        cmocka_unit_test(test_model_hf_dir_matches_gguf), cmocka_unit_test(test_model_gguf_limits),
        cmocka_unit_test(test_model_hf_config_limits),    cmocka_unit_test(test_model_hf_dir_errors),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
