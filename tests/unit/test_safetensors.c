/* safetensors reader and writer: valid files, a corpus of bad headers and
 * layouts (exact status, message naming the field), truncations, round trip. */
#include <dirent.h>
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
#include "format/safetensors.h"

/* 8-byte length + header + data_len bytes of data (len_override: lie about the length). */
static uint8_t *mk(const char *json, size_t data_len, uint64_t len_override, size_t *n) {
    size_t hl = strlen(json);
    *n = 8 + hl + data_len;
    uint8_t *p = malloc(*n);
    assert_non_null(p);
    uint64_t L = len_override ? len_override : hl;
    for (int i = 0; i < 8; i++) p[i] = (uint8_t)(L >> (8 * i));
    memcpy(p + 8, json, hl);
    for (size_t i = 0; i < data_len; i++) p[8 + hl + i] = (uint8_t)(i * 3 + 1);
    return p;
}

static void expect_raw(const uint8_t *p, size_t n, tk_status want_st, const char *want) {
    st_file *f = (st_file *)1;
    tk_status st = st_open_mem(p, n, &f);
    if (st != want_st || (want && !strstr(tk_last_error(), want)))
        print_error("got %s \"%s\", want %s containing \"%s\"\n", tk_status_str(st), tk_last_error(),
                    tk_status_str(want_st), want ? want : "");
    assert_int_equal(st, want_st);
    if (want) assert_non_null(strstr(tk_last_error(), want));
    if (st == TK_OK)
        st_close(f);
    else
        assert_null(f);
}

static void expect(const char *json, size_t data_len, tk_status want_st, const char *want) {
    size_t n;
    uint8_t *p = mk(json, data_len, 0, &n);
    expect_raw(p, n, want_st, want);
    free(p);
}

#define VALID                                                                                                \
    "{\"__metadata__\":{\"format\":\"pt\",\"note\":\"h\\u00e9\"},"                                           \
    "\"w\":{\"dtype\":\"F32\",\"shape\":[2,3],\"data_offsets\":[0,24]},"                                     \
    "\"b\":{\"dtype\":\"BF16\",\"shape\":[3],\"data_offsets\":[24,30]},"                                     \
    "\"h\":{\"dtype\":\"F16\",\"shape\":[1,1,2,1],\"data_offsets\":[30,34]}}"

static void test_safetensors_valid(void **state) {
    (void)state;
    size_t n;
    uint8_t *p = mk(VALID, 34, 0, &n);
    st_file *f;
    assert_int_equal(st_open_mem(p, n, &f), TK_OK);
    assert_int_equal(st_n_tensors(f), 3);
    assert_int_equal(st_data_bytes(f), 34);
    const tk_tensor *w = st_find_tensor(f, "w"), *b = st_find_tensor(f, "b"), *h = st_find_tensor(f, "h");
    assert_non_null(w);
    assert_non_null(b);
    assert_non_null(h);
    assert_null(st_find_tensor(f, "x"));
    assert_null(st_find_tensor(f, "__metadata__"));
    assert_ptr_equal(st_tensor_at(f, 0), w); /* header order */
    assert_null(st_tensor_at(f, 3));
    assert_int_equal(w->type, TK_DTYPE_F32);
    assert_int_equal(w->n_dims, 2);
    assert_int_equal(w->ne[0], 3); /* GGML order: last dim first */
    assert_int_equal(w->ne[1], 2);
    assert_int_equal(w->ne[2], 1);
    assert_int_equal(w->nbytes, 24);
    assert_ptr_equal(w->data, p + 8 + strlen(VALID));
    assert_int_equal(b->type, TK_DTYPE_BF16);
    assert_ptr_equal(b->data, p + 8 + strlen(VALID) + 24);
    assert_int_equal(h->type, TK_DTYPE_F16);
    assert_int_equal(h->n_dims, 4);
    assert_int_equal(h->ne[0], 1);
    assert_int_equal(h->ne[1], 2);
    assert_int_equal(st_n_meta(f), 2);
    assert_string_equal(st_meta_find(f, "format"), "pt");
    assert_string_equal(st_meta_find(f, "note"), "h\xc3\xa9");
    assert_null(st_meta_find(f, "nope"));
    const char *k, *v;
    assert_int_equal(st_meta_at(f, 1, &k, &v), TK_OK);
    assert_string_equal(k, "note");
    assert_int_equal(st_meta_at(f, 2, &k, &v), TK_ERR_RANGE);
    assert_string_equal(st_path(f), "");
    st_close(f);
    st_close(NULL);
    free(p);
    /* a scalar, an empty tensor, no metadata, trailing spaces (HF padding) */
    expect("{\"s\":{\"dtype\":\"F32\",\"shape\":[],\"data_offsets\":[0,4]},"
           "\"e\":{\"dtype\":\"F16\",\"shape\":[0,5],\"data_offsets\":[4,4]}}    ",
           4, TK_OK, NULL);
    expect("{}", 0, TK_OK, NULL);
}

static void test_safetensors_bad_header(void **state) {
    (void)state;
    expect_raw((const uint8_t *)"\x02\0\0\0", 4, TK_ERR_FORMAT, "8-byte header length");
    expect_raw(NULL, 0, TK_ERR_FORMAT, "8-byte header length");
    size_t n;
    uint8_t *p = mk("{}", 0, 3, &n);
    expect_raw(p, n, TK_ERR_FORMAT, "header length 3 is past the end");
    free(p);
    p = mk("{}", 0, 200000000, &n);
    expect_raw(p, n, TK_ERR_FORMAT, "header length 200000000 exceeds");
    free(p);
    p = mk("{}", 0, UINT64_MAX, &n);
    expect_raw(p, n, TK_ERR_FORMAT, "header length");
    free(p);
    expect("{\"w\":", 0, TK_ERR_FORMAT, "not valid JSON");
    expect("", 0, TK_ERR_FORMAT, "not valid JSON");
    expect("[1,2]", 0, TK_ERR_FORMAT, "not an object");
    expect("\"str\"", 0, TK_ERR_FORMAT, "not an object");
    expect("{}x", 0, TK_ERR_FORMAT, "trailing");
    expect("{}{}", 0, TK_ERR_FORMAT, "trailing");
    /* nesting past cJSON's limit (1000) is refused, not recursed into */
    size_t depth = 5000, len = 0;
    char *deep = malloc(depth * 2 + 16);
    len += (size_t)sprintf(deep, "{\"a\":");
    for (size_t i = 0; i < depth; i++) deep[len++] = '[';
    for (size_t i = 0; i < depth; i++) deep[len++] = ']';
    deep[len++] = '}';
    deep[len] = 0;
    expect(deep, 0, TK_ERR_FORMAT, "nested too deeply");
    free(deep);
    expect("{\"__metadata__\":[1]}", 0, TK_ERR_FORMAT, "__metadata__ is not an object");
    expect("{\"__metadata__\":{\"k\":1}}", 0, TK_ERR_FORMAT, "__metadata__ 'k' is not a string");
    expect("{\"__metadata__\":{},\"__metadata__\":{}}", 0, TK_ERR_FORMAT, "__metadata__ is duplicated");
}

static void test_safetensors_bad_entries(void **state) {
    (void)state;
    expect("{\"w\":3}", 0, TK_ERR_FORMAT, "tensor 'w': entry is not an object");
    expect("{\"w\":{\"shape\":[1],\"data_offsets\":[0,4]}}", 4, TK_ERR_FORMAT,
           "tensor 'w': dtype is missing");
    expect("{\"w\":{\"dtype\":\"F32\",\"data_offsets\":[0,4]}}", 4, TK_ERR_FORMAT,
           "tensor 'w': shape is missing");
    expect("{\"w\":{\"dtype\":\"F32\",\"shape\":[1]}}", 4, TK_ERR_FORMAT,
           "tensor 'w': data_offsets is missing");
    expect("{\"w\":{\"dtype\":5,\"shape\":[1],\"data_offsets\":[0,4]}}", 4, TK_ERR_FORMAT,
           "dtype is not a string");
    expect("{\"w\":{\"dtype\":\"I64\",\"shape\":[1],\"data_offsets\":[0,8]}}", 8, TK_ERR_UNSUPPORTED,
           "tensor 'w': dtype I64");
    expect("{\"w\":{\"dtype\":\"F8_E4M3\",\"shape\":[1],\"data_offsets\":[0,1]}}", 1, TK_ERR_UNSUPPORTED,
           "F8_E4M3");
    expect("{\"w\":{\"dtype\":\"F32\",\"shape\":3,\"data_offsets\":[0,12]}}", 12, TK_ERR_FORMAT,
           "shape is not an array");
    expect("{\"w\":{\"dtype\":\"F32\",\"shape\":[-1],\"data_offsets\":[0,4]}}", 4, TK_ERR_FORMAT, "shape[0]");
    expect("{\"w\":{\"dtype\":\"F32\",\"shape\":[1,1.5],\"data_offsets\":[0,4]}}", 4, TK_ERR_FORMAT,
           "shape[1]");
    expect("{\"w\":{\"dtype\":\"F32\",\"shape\":[\"1\"],\"data_offsets\":[0,4]}}", 4, TK_ERR_FORMAT,
           "shape[0]");
    expect("{\"w\":{\"dtype\":\"F32\",\"shape\":[1e300],\"data_offsets\":[0,4]}}", 4, TK_ERR_FORMAT,
           "shape[0]");
    expect("{\"w\":{\"dtype\":\"F32\",\"shape\":[4294967296,4294967296,4294967296],\"data_offsets\":[0,4]}}",
           4, TK_ERR_FORMAT, "overflows");
    expect("{\"w\":{\"dtype\":\"F32\",\"shape\":[1,1,1,1,1],\"data_offsets\":[0,4]}}", 4, TK_ERR_UNSUPPORTED,
           "5 dims");
    expect("{\"w\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0]}}", 4, TK_ERR_FORMAT,
           "data_offsets is not a pair");
    expect("{\"w\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,\"4\"]}}", 4, TK_ERR_FORMAT,
           "data_offsets is not a pair");
    expect("{\"w\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":{}}}", 4, TK_ERR_FORMAT,
           "data_offsets is not a pair");
    expect("{\"w\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[4,0]}}", 4, TK_ERR_FORMAT,
           "end before begin");
    expect("{\"w\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,4]}}", 4, TK_ERR_FORMAT,
           "hold 4 bytes");
    expect("{\"w\":{\"dtype\":\"BF16\",\"shape\":[2,2],\"data_offsets\":[0,4]}}", 4, TK_ERR_FORMAT,
           "shape x BF16");
    expect("{\"w\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[8,12]}}", 4, TK_ERR_FORMAT,
           "outside the 4-byte data section");
    expect("{\"w\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[9007199254740000,9007199254740004]}}",
           4, TK_ERR_FORMAT, "outside");
}

static void test_safetensors_bad_layout(void **state) {
    (void)state;
    /* gap at the start, gap between, overlap, data left over, duplicate names */
    expect("{\"w\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[4,8]}}", 8, TK_ERR_FORMAT,
           "gap after the start");
    expect("{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]},"
           "\"b\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[8,12]}}",
           12, TK_ERR_FORMAT, "tensor 'b': data_offsets begin at 8, leaving a gap after 'a'");
    expect("{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]},"
           "\"b\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[4,8]}}",
           8, TK_ERR_FORMAT, "overlap 'a'");
    expect("{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]},"
           "\"b\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]}}",
           4, TK_ERR_FORMAT, "overlap");
    expect("{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]}}", 8, TK_ERR_FORMAT,
           "end at 4 but the data section has 8 bytes");
    expect("{}", 4, TK_ERR_FORMAT, "end at 0");
    expect("{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]},"
           "\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[4,8]}}",
           8, TK_ERR_FORMAT, "tensor name 'a' is duplicated");
    /* out of order in the header is fine when the ranges tile */
    expect("{\"b\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[4,8]},"
           "\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]}}",
           8, TK_OK, NULL);
}

static void test_safetensors_truncations(void **state) {
    (void)state;
    size_t n;
    uint8_t *p = mk(VALID, 34, 0, &n);
    for (size_t k = 0; k < n; k++) {
        uint8_t *c = k ? malloc(k) : NULL;
        if (k) memcpy(c, p, k);
        st_file *f;
        assert_int_not_equal(st_open_mem(c, k, &f), TK_OK);
        assert_true(strlen(tk_last_error()) > 0);
        free(c);
    }
    free(p);
}

static const char *tmpdir(void) {
    const char *t = getenv("TK_TMP");
    return t && *t ? t : "/tmp";
}

static void test_safetensors_roundtrip(void **state) {
    (void)state;
    uint64_t live0 = tk_alloc_live_bytes();
    char path[512];
    snprintf(path, sizeof path, "%s/test_st_rt_%d.safetensors", tmpdir(), (int)getpid());
    float w[24];
    for (int i = 0; i < 24; i++) w[i] = (float)i * 0.5f - 3;
    uint16_t h[6] = {0x3c00, 0xbc00, 0x0001, 0x7bff, 0, 0x8000};
    uint16_t bf[5] = {0x3f80, 0x4000, 0xc000, 0x7f80, 1};
    float one = 42;
    tk_tensor ts[4] = {
        {.name = "model.layers.0.w",
         .type = TK_DTYPE_F32,
         .n_dims = 3,
         .ne = {4, 3, 2, 1},
         .data = w,
         .nbytes = sizeof w},
        {.name = "h.\xc3\xa9",
         .type = TK_DTYPE_F16,
         .n_dims = 2,
         .ne = {3, 2, 1, 1},
         .data = h,
         .nbytes = sizeof h},
        {.name = "bf",
         .type = TK_DTYPE_BF16,
         .n_dims = 1,
         .ne = {5, 1, 1, 1},
         .data = bf,
         .nbytes = sizeof bf},
        {.name = "s", .type = TK_DTYPE_F32, .n_dims = 4, .ne = {1, 1, 1, 1}, .data = &one, .nbytes = 4},
    };
    const char *meta[] = {"format", "pt", "quote", "a\"b\\c", NULL};
    assert_int_equal(st_write(path, ts, 4, meta), TK_OK);
    st_file *f;
    assert_int_equal(st_open(path, &f), TK_OK);
    assert_string_equal(st_path(f), path);
    assert_int_equal(st_n_tensors(f), 4);
    for (int i = 0; i < 4; i++) {
        const tk_tensor *t = st_find_tensor(f, ts[i].name);
        assert_non_null(t);
        assert_int_equal(t->type, ts[i].type);
        assert_int_equal(t->n_dims, ts[i].n_dims);
        for (int d = 0; d < 4; d++) assert_int_equal(t->ne[d], ts[i].ne[d]);
        assert_int_equal(t->nbytes, ts[i].nbytes);
        assert_memory_equal(t->data, ts[i].data, ts[i].nbytes);
    }
    assert_string_equal(st_meta_find(f, "quote"), "a\"b\\c");
    st_close(f);
    /* the header is padded with spaces to 8 bytes */
    FILE *fp = fopen(path, "rb");
    assert_non_null(fp);
    uint8_t len8[8];
    assert_int_equal(fread(len8, 1, 8, fp), 8);
    uint64_t L = 0;
    for (int i = 7; i >= 0; i--) L = (L << 8) | len8[i];
    assert_int_equal(L % 8, 0);
    char *hdr = malloc(L);
    assert_int_equal(fread(hdr, 1, L, fp), L);
    assert_true(hdr[0] == '{');
    size_t e = L;
    while (e > 0 && hdr[e - 1] == ' ') e--;
    assert_true(hdr[e - 1] == '}');
    free(hdr);
    fclose(fp);
    unlink(path);

    /* writer refuses what it cannot describe */
    tk_tensor bad = ts[0];
    bad.type = TK_DTYPE_Q8_0;
    assert_int_equal(st_write(path, &bad, 1, NULL), TK_ERR_INVALID);
    assert_non_null(strstr(tk_last_error(), "model.layers.0.w"));
    bad = ts[0];
    bad.nbytes = 8;
    assert_int_equal(st_write(path, &bad, 1, NULL), TK_ERR_INVALID);
    tk_tensor dup[2] = {ts[2], ts[2]};
    assert_int_equal(st_write(path, dup, 2, NULL), TK_ERR_INVALID);
    assert_non_null(strstr(tk_last_error(), "twice"));
    const char *odd[] = {"k", NULL};
    assert_int_equal(st_write(path, ts, 1, odd), TK_ERR_INVALID);
    assert_int_equal(st_write("/nonexistent/dir/x.safetensors", ts, 1, NULL), TK_ERR_IO);
    assert_int_equal(st_open("/nonexistent/x.safetensors", &f), TK_ERR_IO);
    unlink(path);
    assert_int_equal(tk_alloc_live_bytes(), live0);
}

/* The committed fuzz seeds are valid files (written by tests/fuzz/make_seeds.py). */
static void test_safetensors_seeds(void **state) {
    (void)state;
    const char *src = getenv("TK_SRC");
    if (!src || !*src) fail_msg("TK_SRC is not set (ctest sets it to the source tree)");
    char dir[512], path[1024];
    snprintf(dir, sizeof dir, "%s/tests/fuzz/seeds/fuzz_safetensors", src);
    DIR *d = opendir(dir);
    assert_non_null(d);
    int n = 0;
    for (struct dirent *e; (e = readdir(d));) {
        if (e->d_name[0] == '.') continue;
        snprintf(path, sizeof path, "%s/%s", dir, e->d_name);
        st_file *f;
        tk_status st = st_open(path, &f);
        if (st != TK_OK) print_error("%s: %s\n", path, tk_last_error());
        assert_int_equal(st, TK_OK);
        st_close(f);
        n++;
    }
    closedir(d);
    assert_true(n >= 3);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_safetensors_seeds),      cmocka_unit_test(test_safetensors_valid),
        cmocka_unit_test(test_safetensors_bad_header), cmocka_unit_test(test_safetensors_bad_entries),
        cmocka_unit_test(test_safetensors_bad_layout), cmocka_unit_test(test_safetensors_truncations),
        cmocka_unit_test(test_safetensors_roundtrip),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
