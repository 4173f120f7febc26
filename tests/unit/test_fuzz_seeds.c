/* The committed seeds of the tokenizer and model fuzzers (written by
 * tests/fuzz/make_seeds.py) are valid inputs, so each run starts from files
 * that reach past the parsers into encode, chat and model validation. */
#include <dirent.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h> /* after the headers it needs */

#include "core/alloc.h"
#include "core/error.h"
#include "format/fmap.h"
#include "format/gguf.h"
#include "model/arch.h"
#include "tokenizer/tokenizer.h"

typedef void (*seed_fn)(const char *path, const char *data, size_t len);

/* Calls fn on every file of tests/fuzz/seeds/<sub>; returns how many. */
static int each_seed(const char *sub, seed_fn fn) {
    const char *src = getenv("TK_SRC");
    if (!src || !*src) fail_msg("TK_SRC is not set (ctest sets it to the source tree)");
    char dir[512], path[1024];
    snprintf(dir, sizeof dir, "%s/tests/fuzz/seeds/%s", src, sub);
    DIR *d = opendir(dir);
    if (!d) fail_msg("%s: no seed directory", dir);
    int n = 0;
    for (struct dirent *e; (e = readdir(d));) {
        if (e->d_name[0] == '.') continue;
        snprintf(path, sizeof path, "%s/%s", dir, e->d_name);
        char *data;
        size_t len;
        if (fmap_read_all(path, 1 << 20, &data, &len) != TK_OK) fail_msg("%s", tk_last_error());
        fn(path, data, len);
        tk_free(data);
        n++;
    }
    closedir(d);
    return n;
}

static void tokenizer_seed(const char *path, const char *data, size_t len) {
    const char *nul = memchr(data, 0, len);
    tk_tokenizer *t;
    if (tok_load_json(data, nul ? (size_t)(nul - data) : len, nul ? nul + 1 : NULL, &t) != TK_OK)
        fail_msg("%s: %s", path, tk_last_error());
    int32_t ids[64];
    size_t n;
    assert_int_equal(tok_encode(t, "the 123 hello", 13, true, true, ids, 64, &n), TK_OK);
    assert_true(n > 0);
    tok_free(t);
}

static void tokenizer_gguf_seed(const char *path, const char *data, size_t len) {
    gguf_file *f;
    tk_tokenizer *t;
    if (gguf_open_mem(data, len, &f) != TK_OK || tok_load_gguf(f, &t) != TK_OK)
        fail_msg("%s: %s", path, tk_last_error());
    tok_free(t);
    gguf_close(f);
}

/* 'H' + config.json: the hyper-parameters are valid; anything else is a GGUF model that opens. */
static void model_seed(const char *path, const char *data, size_t len) {
    if (len && data[0] == 'H') {
        tk_hparams hp;
        if (arch_hparams_hf_json(data + 1, len - 1, &hp) != TK_OK) fail_msg("%s: %s", path, tk_last_error());
        assert_int_equal(hp.n_embd, 16);
        return;
    }
    tk_model *m;
    if (tk_model_open(path, NULL, &m) != TK_OK) fail_msg("%s", tk_last_error());
    tk_model_free(m);
}

static void test_fuzz_seeds_tokenizer(void **state) {
    (void)state;
    assert_true(each_seed("fuzz_tokenizer", tokenizer_seed) >= 3);
    assert_true(each_seed("fuzz_tokenizer_gguf", tokenizer_gguf_seed) >= 2);
}

static void test_fuzz_seeds_model(void **state) {
    (void)state;
    assert_true(each_seed("fuzz_model", model_seed) >= 4);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_fuzz_seeds_tokenizer),
        cmocka_unit_test(test_fuzz_seeds_model),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
