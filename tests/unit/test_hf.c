/* Hugging Face checkpoint directories: single file, shards with an index, and
 * bad directories (escaping shard names, missing shards or tensors, bad JSON). */
#include <cjson/cJSON.h>
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

#include "core/alloc.h"
#include "core/error.h"
#include "format/hf.h"
#include "format/safetensors.h"

static char g_dir[512]; /* this test's scratch directory (test-local state, not library state) */

static void mkdir_fresh(const char *name) {
    const char *t = getenv("TK_TMP");
    snprintf(g_dir, sizeof g_dir, "%s/test_hf_%d_%s", t && *t ? t : "/tmp", (int)getpid(), name);
    char cmd[700];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", g_dir);
    assert_int_equal(system(cmd), 0);
    assert_int_equal(mkdir(g_dir, 0777), 0);
}

static void rm_dir(void) {
    char cmd[700];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", g_dir);
    assert_int_equal(system(cmd), 0);
}

static void put_file(const char *name, const char *text) {
    char p[700];
    snprintf(p, sizeof p, "%s/%s", g_dir, name);
    FILE *f = fopen(p, "wb");
    assert_non_null(f);
    fputs(text, f);
    fclose(f);
}

static void put_raw(const char *name, const char *data, size_t n) {
    char p[700];
    snprintf(p, sizeof p, "%s/%s", g_dir, name);
    FILE *f = fopen(p, "wb");
    assert_non_null(f);
    assert_int_equal(fwrite(data, 1, n, f), n);
    fclose(f);
}

static float g_a[6] = {1, 2, 3, 4, 5, 6}, g_b[2] = {7, 8}, g_c[3] = {9, 10, 11};

static void put_shard(const char *name, const char *t1, const char *t2) {
    char p[700];
    snprintf(p, sizeof p, "%s/%s", g_dir, name);
    tk_tensor ts[2] = {
        {.name = t1,
         .type = TK_DTYPE_F32,
         .n_dims = 2,
         .ne = {3, 2, 1, 1},
         .data = g_a,
         .nbytes = sizeof g_a},
        {.name = t2,
         .type = TK_DTYPE_F32,
         .n_dims = 1,
         .ne = {2, 1, 1, 1},
         .data = g_b,
         .nbytes = sizeof g_b},
    };
    const char *meta[] = {"format", "pt", NULL};
    assert_int_equal(st_write(p, ts, t2 ? 2 : 1, meta), TK_OK);
}

static const char *CONFIG =
    "{\"architectures\":[\"Qwen3ForCausalLM\"],\"hidden_size\":64,\"model_type\":\"qwen3\"}";

static void expect_open(tk_status want_st, const char *want) {
    hf_ckpt *h = (hf_ckpt *)1;
    tk_status st = hf_open(g_dir, &h);
    if (st != want_st || (want && !strstr(tk_last_error(), want)))
        print_error("got %s \"%s\", want %s containing \"%s\"\n", tk_status_str(st), tk_last_error(),
                    tk_status_str(want_st), want ? want : "");
    assert_int_equal(st, want_st);
    if (want) assert_non_null(strstr(tk_last_error(), want));
    if (st == TK_OK) {
        hf_close(h);
        return;
    }
    assert_null(h);
    /* Every message names the directory (or a file in it), exactly once. */
    const char *at = strstr(tk_last_error(), g_dir);
    if (!at || strstr(at + 1, g_dir)) print_error("\"%s\" should name %s once\n", tk_last_error(), g_dir);
    assert_true(at && !strstr(at + 1, g_dir));
}

static void test_hf_single(void **state) {
    (void)state;
    uint64_t live0 = tk_alloc_live_bytes();
    mkdir_fresh("single");
    put_file("config.json", CONFIG);
    put_shard("model.safetensors", "model.embed_tokens.weight", "model.norm.weight");
    hf_ckpt *h;
    assert_int_equal(hf_open(g_dir, &h), TK_OK);
    assert_string_equal(hf_dir(h), g_dir);
    const cJSON *cfg = hf_config(h);
    assert_non_null(cfg);
    assert_int_equal(cJSON_GetObjectItemCaseSensitive(cfg, "hidden_size")->valueint, 64);
    size_t len;
    const char *txt = hf_config_json(h, &len);
    assert_int_equal(len, strlen(CONFIG));
    assert_string_equal(txt, CONFIG);
    assert_int_equal(hf_n_tensors(h), 2);
    assert_int_equal(hf_n_shards(h), 1);
    assert_string_equal(hf_shard_name(h, 0), "model.safetensors");
    assert_null(hf_shard_name(h, 1));
    const tk_tensor *t = hf_find_tensor(h, "model.embed_tokens.weight");
    assert_non_null(t);
    assert_int_equal(t->ne[0], 3);
    assert_int_equal(t->ne[1], 2);
    assert_memory_equal(t->data, g_a, sizeof g_a);
    assert_null(hf_find_tensor(h, "lm_head.weight"));
    assert_string_equal(hf_tensor_at(h, 0)->name, "model.embed_tokens.weight"); /* sorted by name */
    assert_null(hf_tensor_at(h, 2));
    hf_close(h);
    hf_close(NULL);
    rm_dir();
    assert_int_equal(tk_alloc_live_bytes(), live0);
}

static void test_hf_sharded(void **state) {
    (void)state;
    mkdir_fresh("sharded");
    put_file("config.json", CONFIG);
    put_shard("model-00001-of-00002.safetensors", "a.weight", "b.weight");
    char p[700];
    snprintf(p, sizeof p, "%s/model-00002-of-00002.safetensors", g_dir);
    tk_tensor c = {.name = "c.weight",
                   .type = TK_DTYPE_F32,
                   .n_dims = 1,
                   .ne = {3, 1, 1, 1},
                   .data = g_c,
                   .nbytes = sizeof g_c};
    assert_int_equal(st_write(p, &c, 1, NULL), TK_OK);
    put_file(
        "model.safetensors.index.json",
        "{\"metadata\":{\"total_size\":44},\"weight_map\":{\"a.weight\":\"model-00001-of-00002.safetensors\","
        "\"c.weight\":\"model-00002-of-00002.safetensors\",\"b.weight\":\"model-00001-of-00002.safetensors\"}"
        "}");
    hf_ckpt *h;
    assert_int_equal(hf_open(g_dir, &h), TK_OK);
    assert_int_equal(hf_n_shards(h), 2);
    assert_int_equal(hf_n_tensors(h), 3);
    const tk_tensor *t = hf_find_tensor(h, "c.weight");
    assert_non_null(t);
    assert_memory_equal(t->data, g_c, sizeof g_c);
    assert_non_null(hf_find_tensor(h, "b.weight"));
    hf_close(h);

    /* a tensor in the index that its shard lacks */
    put_file("model.safetensors.index.json",
             "{\"weight_map\":{\"a.weight\":\"model-00001-of-00002.safetensors\","
             "\"d.weight\":\"model-00002-of-00002.safetensors\"}}");
    expect_open(
        TK_ERR_FORMAT,
        "tensor 'd.weight' is listed in the index but missing from shard 'model-00002-of-00002.safetensors'");
    /* a shard that does not exist */
    put_file("model.safetensors.index.json",
             "{\"weight_map\":{\"a.weight\":\"model-00009-of-00009.safetensors\"}}");
    expect_open(TK_ERR_IO, "model-00009-of-00009.safetensors");
    /* the same tensor in two shards */
    put_shard("model-00002-of-00002.safetensors", "z.weight", "a.weight");
    put_file("model.safetensors.index.json",
             "{\"weight_map\":{\"a.weight\":\"model-00001-of-00002.safetensors\","
             "\"z.weight\":\"model-00002-of-00002.safetensors\"}}");
    expect_open(TK_ERR_FORMAT, "tensor 'a.weight' appears in more than one shard");
    rm_dir();
}

static void test_hf_bad_shard_names(void **state) {
    (void)state;
    mkdir_fresh("names");
    put_file("config.json", CONFIG);
    put_shard("model.safetensors", "a.weight", NULL);
    static const char *bad[] = {"../model.safetensors",
                                "/etc/passwd",
                                "sub/model.safetensors",
                                "a\\\\b.safetensors",
                                "..",
                                ".",
                                "/",
                                ""};
    static const char *want[] = {"'../model.safetensors'",
                                 "'/etc/passwd'",
                                 "'sub/model.safetensors'",
                                 "'a\\b.safetensors'",
                                 "'..'",
                                 "'.'",
                                 "'/'",
                                 "shard name is empty"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        char idx[512];
        snprintf(idx, sizeof idx, "{\"weight_map\":{\"a.weight\":\"%s\"}}", bad[i]);
        put_file("model.safetensors.index.json", idx);
        expect_open(TK_ERR_FORMAT, want[i]);
        assert_non_null(strstr(tk_last_error(), "a.weight"));
    }
    put_file("model.safetensors.index.json", "{\"weight_map\":{\"a.weight\":7}}");
    expect_open(TK_ERR_FORMAT, "shard is not a string");
    /* ".." inside a name is no path component: these are plain files of the directory */
    static const char *good[] = {"a..b.safetensors", "..x.safetensors", "x..", "...", ".hidden"};
    for (size_t i = 0; i < sizeof good / sizeof good[0]; i++) {
        put_shard(good[i], "a.weight", NULL);
        char idx[512];
        snprintf(idx, sizeof idx, "{\"weight_map\":{\"a.weight\":\"%s\"}}", good[i]);
        put_file("model.safetensors.index.json", idx);
        expect_open(TK_OK, NULL);
    }
    rm_dir();
}

/* A FIFO where a file should be (config.json, the index, a shard) is refused at
 * once: opening it for reading would wait for a writer forever. */
static void test_hf_fifo(void **state) {
    (void)state;
    static const char *names[] = {"config.json", "model.safetensors.index.json", "model-1.safetensors"};
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++) {
        mkdir_fresh("fifo");
        put_file("config.json", CONFIG);
        put_shard("model-1.safetensors", "a.weight", NULL);
        put_file("model.safetensors.index.json", "{\"weight_map\":{\"a.weight\":\"model-1.safetensors\"}}");
        char p[700];
        snprintf(p, sizeof p, "%s/%s", g_dir, names[i]);
        assert_int_equal(unlink(p), 0);
        assert_int_equal(mkfifo(p, 0600), 0);
        alarm(20); /* a blocking open fails the test instead of hanging it */
        expect_open(TK_ERR_IO, "not a regular file (a FIFO)");
        alarm(0);
        assert_non_null(strstr(tk_last_error(), names[i]));
        rm_dir();
    }
}

static void test_hf_bad_json(void **state) {
    (void)state;
    mkdir_fresh("json");
    expect_open(TK_ERR_IO, "config.json"); /* missing */
    put_file("config.json", "{\"hidden_size\":");
    expect_open(TK_ERR_FORMAT, "config.json: not valid JSON");
    put_file("config.json", "[1]");
    expect_open(TK_ERR_FORMAT, "config.json: JSON is not an object");
    put_file("config.json", CONFIG);
    expect_open(TK_ERR_IO, "neither model.safetensors nor model.safetensors.index.json");
    put_shard("model.safetensors", "a.weight", NULL);
    put_file("model.safetensors.index.json", "{\"weight_map\":");
    expect_open(TK_ERR_FORMAT, "model.safetensors.index.json: not valid JSON");
    put_file("model.safetensors.index.json", "{\"metadata\":{}}");
    expect_open(TK_ERR_FORMAT, "weight_map is missing");
    put_file("model.safetensors.index.json", "{\"weight_map\":{}}");
    expect_open(TK_ERR_FORMAT, "weight_map is empty");
    put_file("model.safetensors.index.json", "{\"weight_map\":[]}");
    expect_open(TK_ERR_FORMAT, "weight_map is missing or not an object");
    /* a corrupt shard: st_open's message, prefixed with the shard's path */
    char p[700];
    snprintf(p, sizeof p, "%s/model.safetensors.index.json", g_dir);
    unlink(p);
    put_raw("model.safetensors", "\x05\0\0\0\0\0\0\0{\"a\":", 13);
    expect_open(TK_ERR_FORMAT, "model.safetensors: safetensors: header");
    /* a valid but empty checkpoint */
    put_raw("model.safetensors", "\x02\0\0\0\0\0\0\0{}", 10);
    expect_open(TK_ERR_FORMAT, "no tensors");
    rm_dir();
    expect_open(TK_ERR_IO, "config.json"); /* the directory itself is gone */
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_hf_single),
        cmocka_unit_test(test_hf_sharded),
        cmocka_unit_test(test_hf_bad_shard_names),
        cmocka_unit_test(test_hf_bad_json),
        cmocka_unit_test(test_hf_fifo),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
