/* GGUF reader and writer: a round trip through both, and a corpus of bad files
 * built here (one valid file, then one mutation each) that checks the exact
 * status and that the message names the field. */
#include <dirent.h>
#include <math.h>
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
#include "format/gguf.h"

/* ---- a byte builder for hand-made files --------------------------------------- */

typedef struct buf {
    uint8_t *p;
    size_t n, cap;
} buf;

static void b_put(buf *b, const void *p, size_t n) {
    if (b->n + n > b->cap) {
        b->cap = (b->n + n) * 2 + 64;
        b->p = realloc(b->p, b->cap);
        assert_non_null(b->p);
    }
    if (n) memcpy(b->p + b->n, p, n);
    b->n += n;
}
static void b_uint(buf *b, uint64_t v, int n) {
    for (int i = 0; i < n; i++) {
        uint8_t c = (uint8_t)(v >> (8 * i));
        b_put(b, &c, 1);
    }
}
static void b_u32(buf *b, uint32_t v) { b_uint(b, v, 4); }
static void b_u64(buf *b, uint64_t v) { b_uint(b, v, 8); }
static void b_strn(buf *b, const char *s, size_t n) {
    b_u64(b, n);
    b_put(b, s, n);
}
static void b_str(buf *b, const char *s) { b_strn(b, s, strlen(s)); }

typedef struct tinfo {
    const char *name;
    size_t name_len; /* 0: strlen */
    uint32_t n_dims;
    uint64_t ne[5];
    uint32_t type;
    uint64_t offset;
} tinfo;

/* A file description; mutate a copy of the valid one, then build. */
typedef struct spec {
    char magic[4];
    uint32_t version;
    int64_t n_tensors, n_kv; /* -1: the real counts */
    buf kv;                  /* raw kv bytes */
    uint64_t kv_count;
    tinfo t[4];
    int nt;
    uint32_t align;    /* for placing the data section */
    uint64_t data_len; /* bytes of data section */
} spec;

static void kv_str(spec *s, const char *k, const char *v) {
    b_str(&s->kv, k);
    b_u32(&s->kv, GGUF_T_STRING);
    b_str(&s->kv, v);
    s->kv_count++;
}
static void kv_u32(spec *s, const char *k, uint32_t v) {
    b_str(&s->kv, k);
    b_u32(&s->kv, GGUF_T_U32);
    b_u32(&s->kv, v);
    s->kv_count++;
}

/* Two tensors: "a" f32 [8,2] at 0 (64 B), "b" q8_0 [32] at 64 (34 B). */
static spec spec_valid(void) {
    spec s = {.magic = {'G', 'G', 'U', 'F'}, .version = 3, .n_tensors = -1, .n_kv = -1, .align = 32};
    kv_str(&s, "general.architecture", "llama");
    kv_u32(&s, "llama.block_count", 2);
    s.t[0] = (tinfo){.name = "a", .n_dims = 2, .ne = {8, 2}, .type = 0, .offset = 0};
    s.t[1] = (tinfo){.name = "b", .n_dims = 1, .ne = {32}, .type = 8, .offset = 64};
    s.nt = 2;
    s.data_len = 64 + 34;
    return s;
}

static buf spec_build(const spec *s) {
    buf b = {0};
    b_put(&b, s->magic, 4);
    b_u32(&b, s->version);
    b_u64(&b, s->n_tensors >= 0 ? (uint64_t)s->n_tensors : (uint64_t)s->nt);
    b_u64(&b, s->n_kv >= 0 ? (uint64_t)s->n_kv : s->kv_count);
    b_put(&b, s->kv.p, s->kv.n);
    for (int i = 0; i < s->nt; i++) {
        const tinfo *t = &s->t[i];
        b_strn(&b, t->name, t->name_len ? t->name_len : strlen(t->name));
        b_u32(&b, t->n_dims);
        for (uint32_t d = 0; d < t->n_dims; d++) b_u64(&b, t->ne[d]);
        b_u32(&b, t->type);
        b_u64(&b, t->offset);
    }
    while (b.n % s->align) b_uint(&b, 0, 1);
    for (uint64_t i = 0; i < s->data_len; i++) b_uint(&b, (uint8_t)(i * 7 + 1), 1);
    return b;
}

static void spec_free(spec *s) { free(s->kv.p); }

/* Build, open from memory, expect st and a message containing want. */
static void expect_bytes(const uint8_t *p, size_t n, tk_status want_st, const char *want) {
    gguf_file *f = (gguf_file *)1;
    tk_status st = gguf_open_mem(p, n, &f);
    if (st != want_st || (want && !strstr(tk_last_error(), want)))
        print_error("got %s \"%s\", want %s containing \"%s\"\n", tk_status_str(st), tk_last_error(),
                    tk_status_str(want_st), want ? want : "");
    assert_int_equal(st, want_st);
    if (want) assert_non_null(strstr(tk_last_error(), want));
    if (st == TK_OK) {
        assert_non_null(f);
        gguf_close(f);
    } else
        assert_null(f);
}

static void expect(spec *s, tk_status want_st, const char *want) {
    buf b = spec_build(s);
    expect_bytes(b.p, b.n, want_st, want);
    free(b.p);
    spec_free(s);
}

/* ---- the bad-file corpus -------------------------------------------------------------------- */

static void test_gguf_valid_base(void **state) {
    (void)state;
    spec s = spec_valid();
    buf b = spec_build(&s);
    gguf_file *f;
    assert_int_equal(gguf_open_mem(b.p, b.n, &f), TK_OK);
    assert_int_equal(gguf_n_tensors(f), 2);
    assert_int_equal(gguf_n_kv(f), 2);
    const tk_tensor *a = gguf_find_tensor(f, "a"), *bt = gguf_find_tensor(f, "b");
    assert_non_null(a);
    assert_non_null(bt);
    assert_null(gguf_find_tensor(f, "c"));
    assert_int_equal(a->nbytes, 64);
    assert_int_equal(bt->nbytes, 34);
    assert_int_equal(a->ne[1], 2);
    assert_int_equal(a->ne[2], 1);
    assert_int_equal((const uint8_t *)bt->data - (const uint8_t *)a->data, 64);
    assert_int_equal(((const uint8_t *)a->data - b.p) % 32, 0);
    uint32_t v;
    assert_int_equal(gguf_require_u32(f, "llama.block_count", &v), TK_OK);
    assert_int_equal(v, 2);
    gguf_close(f);
    free(b.p);
    spec_free(&s);
}

static void test_gguf_bad_header(void **state) {
    (void)state;
    spec s = spec_valid();
    s.magic[0] = 'X';
    expect(&s, TK_ERR_FORMAT, "magic");
    s = spec_valid();
    s.version = 1;
    expect(&s, TK_ERR_UNSUPPORTED, "version 1");
    s = spec_valid();
    s.version = 4;
    expect(&s, TK_ERR_FORMAT, "version 4");
    s = spec_valid();
    s.version = 0x03000000u; /* what a big-endian writer's 3 looks like */
    expect(&s, TK_ERR_UNSUPPORTED, "big-endian");
    s = spec_valid();
    s.version = 2; /* v2 has the same layout as v3 */
    expect(&s, TK_OK, NULL);
    expect_bytes((const uint8_t *)"GGUF\3\0\0\0", 8, TK_ERR_FORMAT, "header");
    expect_bytes(NULL, 0, TK_ERR_FORMAT, "header");
}

static void test_gguf_bad_counts(void **state) {
    (void)state;
    spec s = spec_valid();
    s.n_tensors = 1ll << 40;
    expect(&s, TK_ERR_FORMAT, "n_tensors");
    s = spec_valid();
    s.n_kv = INT64_MAX;
    expect(&s, TK_ERR_FORMAT, "n_kv");
    s = spec_valid();
    s.n_kv = 6; /* plausible for the size, but the kvs run out: the third "key" is tensor info */
    buf b = spec_build(&s);
    gguf_file *f;
    assert_int_equal(gguf_open_mem(b.p, b.n, &f), TK_ERR_FORMAT);
    free(b.p);
    spec_free(&s);
    s = spec_valid();
    s.n_tensors = 3; /* one more tensor info than present */
    expect(&s, TK_ERR_FORMAT, "tensor");
}

static void test_gguf_bad_strings(void **state) {
    (void)state;
    spec s = spec_valid();
    b_u64(&s.kv, 1ull << 40); /* key length */
    b_put(&s.kv, "k", 1);
    s.kv_count++;
    expect(&s, TK_ERR_FORMAT, "key length");
    s = spec_valid();
    b_str(&s.kv, "k");
    b_u32(&s.kv, GGUF_T_STRING);
    b_u64(&s.kv, UINT64_MAX); /* value length */
    s.kv_count++;
    expect(&s, TK_ERR_FORMAT, "string value length");
    s = spec_valid();
    b_str(&s.kv, "arr");
    b_u32(&s.kv, GGUF_T_ARRAY);
    b_u32(&s.kv, GGUF_T_U32);
    b_u64(&s.kv, 1ull << 61); /* n * 4 overflows u64 */
    s.kv_count++;
    expect(&s, TK_ERR_FORMAT, "array of 2305843009213693952 u32");
    s = spec_valid();
    b_str(&s.kv, "arr");
    b_u32(&s.kv, GGUF_T_ARRAY);
    b_u32(&s.kv, GGUF_T_STRING);
    b_u64(&s.kv, 1ull << 50);
    s.kv_count++;
    expect(&s, TK_ERR_FORMAT, "strings");
    s = spec_valid();
    b_str(&s.kv, "arr");
    b_u32(&s.kv, GGUF_T_ARRAY);
    b_u32(&s.kv, GGUF_T_STRING);
    b_u64(&s.kv, 2);
    b_str(&s.kv, "ok");
    b_u64(&s.kv, 1u << 30); /* second element's length */
    s.kv_count++;
    expect(&s, TK_ERR_FORMAT, "element 1");
}

static void test_gguf_bad_keys(void **state) {
    (void)state;
    spec s = spec_valid();
    kv_str(&s, "", "x");
    expect(&s, TK_ERR_FORMAT, "key is empty");
    s = spec_valid();
    kv_u32(&s, "llama.block_count", 3);
    expect(&s, TK_ERR_FORMAT, "key 'llama.block_count' is duplicated");
    s = spec_valid();
    b_str(&s.kv, "weird");
    b_u32(&s.kv, 13);
    b_u32(&s.kv, 0);
    s.kv_count++;
    expect(&s, TK_ERR_FORMAT, "value type 13");
    s = spec_valid();
    b_str(&s.kv, "weird");
    b_u32(&s.kv, GGUF_T_ARRAY);
    b_u32(&s.kv, 99);
    b_u64(&s.kv, 0);
    s.kv_count++;
    expect(&s, TK_ERR_FORMAT, "array element type 99");
    s = spec_valid();
    b_str(&s.kv, "flag");
    b_u32(&s.kv, GGUF_T_BOOL);
    b_uint(&s.kv, 2, 1);
    s.kv_count++;
    expect(&s, TK_ERR_FORMAT, "bool value is 2");
}

static void test_gguf_bad_alignment(void **state) {
    (void)state;
    spec s = spec_valid();
    kv_u32(&s, "general.alignment", 48);
    expect(&s, TK_ERR_FORMAT, "general.alignment 48");
    s = spec_valid();
    kv_u32(&s, "general.alignment", 0);
    expect(&s, TK_ERR_FORMAT, "general.alignment 0");
    s = spec_valid();
    b_str(&s.kv, "general.alignment");
    b_u32(&s.kv, GGUF_T_U64);
    b_u64(&s.kv, 64);
    s.kv_count++;
    expect(&s, TK_ERR_FORMAT, "general.alignment has type u64");
    /* 64 is fine; then offset 64 is aligned but a tensor at 32 is not. */
    s = spec_valid();
    kv_u32(&s, "general.alignment", 64);
    s.align = 64;
    expect(&s, TK_OK, NULL);
    s = spec_valid();
    kv_u32(&s, "general.alignment", 64);
    s.align = 64;
    s.t[1].offset = 96;
    s.data_len = 96 + 34;
    expect(&s, TK_ERR_FORMAT, "offset 96 is not a multiple of the alignment 64");
}

static void test_gguf_bad_tensor_shape(void **state) {
    (void)state;
    spec s = spec_valid();
    s.t[0].n_dims = 0;
    expect(&s, TK_ERR_FORMAT, "n_dims 0");
    s = spec_valid();
    s.t[0].n_dims = 5;
    s.t[0].ne[2] = s.t[0].ne[3] = s.t[0].ne[4] = 1;
    expect(&s, TK_ERR_FORMAT, "n_dims 5");
    s = spec_valid();
    s.t[0].ne[1] = 0;
    expect(&s, TK_ERR_FORMAT, "ne[1] = 0");
    s = spec_valid();
    s.t[0].ne[0] = (uint64_t)-8;
    expect(&s, TK_ERR_FORMAT, "ne[0] = -8");
    s = spec_valid();
    s.t[0].n_dims = 3;
    s.t[0].ne[1] = 1ull << 40;
    s.t[0].ne[2] = 1ull << 40;
    expect(&s, TK_ERR_FORMAT, "overflows");
    s = spec_valid();
    s.t[0].n_dims = 2;
    s.t[0].ne[1] = 1ull << 62; /* elements fit i64, bytes (x4) do not fit u64 */
    s.t[0].ne[0] = 1;
    expect(&s, TK_ERR_FORMAT, "overflows");
    s = spec_valid();
    s.t[1].ne[0] = 33;
    expect(&s, TK_ERR_FORMAT, "ne[0] = 33 is not a multiple of the q8_0 block size 32");
}

static void test_gguf_bad_tensor_type(void **state) {
    (void)state;
    spec s = spec_valid();
    s.t[1].type = 99;
    expect(&s, TK_ERR_FORMAT, "tensor 'b': type id 99 is unknown");
    s = spec_valid();
    s.t[1].type = 4; /* a hole in GGML's table (removed q4_2) */
    expect(&s, TK_ERR_FORMAT, "type id 4");
    s = spec_valid();
    s.t[1].type = 13;
    s.t[1].ne[0] = 256;
    expect(&s, TK_ERR_UNSUPPORTED, "tensor 'b': type q5_k");
}

static void test_gguf_bad_offsets(void **state) {
    (void)state;
    spec s = spec_valid();
    s.t[1].offset = 68;
    expect(&s, TK_ERR_FORMAT, "offset 68 is not a multiple");
    s = spec_valid();
    s.t[1].offset = 1ull << 40;
    expect(&s, TK_ERR_FORMAT, "outside");
    s = spec_valid();
    s.t[1].offset = UINT64_MAX - 31; /* aligned, and offset + nbytes wraps */
    expect(&s, TK_ERR_FORMAT, "outside");
    s = spec_valid();
    s.data_len = 64 + 33; /* last tensor one byte short */
    expect(&s, TK_ERR_FORMAT, "tensor 'b'");
    s = spec_valid();
    s.t[1].offset = 32; /* inside "a" */
    expect(&s, TK_ERR_FORMAT, "overlap");
    s = spec_valid();
    s.t[1].offset = 0; /* same start */
    expect(&s, TK_ERR_FORMAT, "overlap");
    /* any non-overlapping aligned layout is fine: b first, a after a gap */
    s = spec_valid();
    s.t[1].offset = 0;
    s.t[0].offset = 128;
    s.data_len = 192;
    expect(&s, TK_OK, NULL);
}

static void test_gguf_bad_names(void **state) {
    (void)state;
    spec s = spec_valid();
    s.t[1].name = "a";
    expect(&s, TK_ERR_FORMAT, "tensor name 'a' is duplicated");
    char longname[301];
    memset(longname, 'x', 300);
    longname[300] = 0;
    s = spec_valid();
    s.t[1].name = longname;
    expect(&s, TK_ERR_FORMAT, "name length 300");
    s = spec_valid();
    s.t[1].name = "b\0c";
    s.t[1].name_len = 3;
    expect(&s, TK_ERR_FORMAT, "NUL");
    s = spec_valid();
    s.t[1].name = "";
    s.t[1].name_len = 0;
    expect(&s, TK_ERR_FORMAT, "name is empty");
    s = spec_valid();
    memset(longname, 'y', 256);
    longname[256] = 0;
    s.t[1].name = longname; /* exactly the limit */
    expect(&s, TK_OK, NULL);
}

static void nested(buf *b, int depth) {
    b_u32(b, GGUF_T_ARRAY);
    b_u64(b, 1);
    if (depth == 0) {
        b_u32(b, GGUF_T_STRING);
        b_u64(b, 1);
        b_str(b, "leaf");
    } else
        nested(b, depth - 1);
}

static void test_gguf_nested_arrays(void **state) {
    (void)state;
    spec s = spec_valid();
    b_str(&s.kv, "nest");
    b_u32(&s.kv, GGUF_T_ARRAY);
    nested(&s.kv, 3);
    s.kv_count++;
    buf b = spec_build(&s);
    gguf_file *f;
    assert_int_equal(gguf_open_mem(b.p, b.n, &f), TK_OK);
    const gguf_kv *kv = gguf_find(f, "nest");
    assert_non_null(kv);
    assert_int_equal(kv->type, GGUF_T_ARRAY);
    assert_int_equal(kv->arr_type, GGUF_T_ARRAY);
    assert_int_equal(kv->arr_n, 1);
    int64_t x;
    assert_int_equal(gguf_arr_i64(kv, 0, &x), TK_ERR_FORMAT);
    gguf_close(f);
    free(b.p);
    spec_free(&s);
    s = spec_valid();
    b_str(&s.kv, "nest");
    b_u32(&s.kv, GGUF_T_ARRAY);
    nested(&s.kv, 20);
    s.kv_count++;
    expect(&s, TK_ERR_FORMAT, "nested deeper");
}

/* Every proper prefix of a valid file fails cleanly (ASan checks we never read past it). */
static void test_gguf_truncations(void **state) {
    (void)state;
    spec s = spec_valid();
    b_str(&s.kv, "arr");
    b_u32(&s.kv, GGUF_T_ARRAY);
    b_u32(&s.kv, GGUF_T_STRING);
    b_u64(&s.kv, 2);
    b_str(&s.kv, "x");
    b_str(&s.kv, "yz");
    s.kv_count++;
    buf b = spec_build(&s);
    for (size_t n = 0; n < b.n; n++) {
        uint8_t *copy = n ? malloc(n) : NULL; /* exact-size heap block: ASan sees any overread */
        if (n) memcpy(copy, b.p, n);
        gguf_file *f;
        tk_status st = gguf_open_mem(copy, n, &f);
        assert_int_not_equal(st, TK_OK);
        assert_true(strlen(tk_last_error()) > 0);
        free(copy);
    }
    free(b.p);
    spec_free(&s);
}

/* ---- typed getters -------------------------------------------------------------------------- */

static void test_gguf_getters(void **state) {
    (void)state;
    spec s = spec_valid();
    b_str(&s.kv, "neg");
    b_u32(&s.kv, GGUF_T_I32);
    b_u32(&s.kv, (uint32_t)-5);
    s.kv_count++;
    b_str(&s.kv, "big");
    b_u32(&s.kv, GGUF_T_U64);
    b_u64(&s.kv, 1ull << 40);
    s.kv_count++;
    b_str(&s.kv, "eps");
    b_u32(&s.kv, GGUF_T_F32);
    float e = 1e-6f;
    uint32_t eu;
    memcpy(&eu, &e, 4);
    b_u32(&s.kv, eu);
    s.kv_count++;
    buf b = spec_build(&s);
    gguf_file *f;
    assert_int_equal(gguf_open_mem(b.p, b.n, &f), TK_OK);
    uint32_t u;
    int64_t i;
    float x;
    bool bo;
    gguf_str str;
    bool found;
    assert_int_equal(gguf_require_u32(f, "missing.key", &u), TK_ERR_NOT_FOUND);
    assert_non_null(strstr(tk_last_error(), "missing.key"));
    assert_int_equal(gguf_get_u32(f, "missing.key", 7, &u), TK_OK);
    assert_int_equal(u, 7);
    assert_int_equal(gguf_require_u32(f, "neg", &u), TK_ERR_RANGE);
    assert_non_null(strstr(tk_last_error(), "neg"));
    assert_int_equal(gguf_require_u32(f, "big", &u), TK_ERR_RANGE);
    assert_int_equal(gguf_get_i64(f, "big", 0, &i), TK_OK);
    assert_int_equal(i, 1ll << 40);
    assert_int_equal(gguf_get_i64(f, "neg", 0, &i), TK_OK);
    assert_int_equal(i, -5);
    assert_int_equal(gguf_require_u32(f, "general.architecture", &u), TK_ERR_FORMAT);
    assert_non_null(strstr(tk_last_error(), "expected u32, found string"));
    assert_int_equal(gguf_require_f32(f, "eps", &x), TK_OK);
    assert_true(x == 1e-6f);
    assert_int_equal(gguf_get_f32(f, "neg", 1, &x), TK_ERR_FORMAT);
    assert_int_equal(gguf_get_bool(f, "nope", true, &bo), TK_OK);
    assert_true(bo);
    assert_int_equal(gguf_get_bool(f, "eps", true, &bo), TK_ERR_FORMAT);
    assert_int_equal(gguf_require_str(f, "general.architecture", &str), TK_OK);
    assert_true(gguf_str_eq(str, "llama"));
    assert_int_equal(gguf_get_str(f, "nope", &str, &found), TK_OK);
    assert_false(found);
    const gguf_kv *kv;
    assert_int_equal(gguf_require_arr(f, "eps", GGUF_T_F32, &kv), TK_ERR_FORMAT);
    assert_int_equal(gguf_require_arr(f, "nope", GGUF_T_F32, &kv), TK_ERR_NOT_FOUND);
    assert_null(gguf_kv_at(f, -1));
    assert_null(gguf_kv_at(f, gguf_n_kv(f)));
    assert_null(gguf_tensor_at(f, 2));
    assert_null(gguf_find(f, "llama"));
    gguf_close(f);
    gguf_close(NULL);
    free(b.p);
    spec_free(&s);
}

/* ---- round trip through the writer ------------------------------------------------------------ */

static const char *tmpdir(void) {
    const char *t = getenv("TK_TMP");
    return t && *t ? t : "/tmp";
}

static uint64_t rng_next(uint64_t *s) {
    *s ^= *s << 13;
    *s ^= *s >> 7;
    *s ^= *s << 17;
    return *s;
}

#define N_TT 7
static const tk_dtype TTYPES[N_TT] = {TK_DTYPE_F32,  TK_DTYPE_F16,  TK_DTYPE_BF16, TK_DTYPE_Q8_0,
                                      TK_DTYPE_Q4_0, TK_DTYPE_Q4_K, TK_DTYPE_Q6_K};

static void roundtrip(uint32_t align) {
    char path[512];
    snprintf(path, sizeof path, "%s/test_gguf_rt_%u_%d.gguf", tmpdir(), align, (int)getpid());
    uint64_t live0 = tk_alloc_live_bytes();
    gguf_writer *w;
    assert_int_equal(gguf_writer_init(align, &w), TK_OK);
    assert_int_equal(gguf_w_u32(w, "k.u32", 4000000000u), TK_OK);
    assert_int_equal(gguf_w_i32(w, "k.i32", -123456), TK_OK);
    assert_int_equal(gguf_w_u64(w, "k.u64", UINT64_MAX - 1), TK_OK);
    assert_int_equal(gguf_w_f32(w, "k.f32", -0.15625f), TK_OK);
    assert_int_equal(gguf_w_bool(w, "k.bool", true), TK_OK);
    assert_int_equal(gguf_w_str(w, "k.str", "h\xc3\xa9llo\x01\xff\t\"\\ \xf0\x9f\x98\x80"), TK_OK);
    assert_int_equal(gguf_w_str(w, "k.empty", ""), TK_OK);
    /* one array per numeric element type */
    static const uint8_t a_u8[] = {0, 1, 255};
    static const int8_t a_i8[] = {-128, 0, 127};
    static const uint16_t a_u16[] = {0, 65535};
    static const int16_t a_i16[] = {-32768, 32767};
    static const uint32_t a_u32[] = {1, 2, 4000000000u};
    static const int32_t a_i32[] = {-2147483647 - 1, 5};
    static const float a_f32[] = {1.5f, -2.25f, 1e30f};
    static const uint8_t a_bool[] = {1, 0, 1};
    static const uint64_t a_u64[] = {UINT64_MAX, 0};
    static const int64_t a_i64[] = {INT64_MIN, -1, INT64_MAX};
    static const double a_f64[] = {3.141592653589793, -1e-300};
    struct {
        const char *k;
        gguf_vtype t;
        const void *d;
        uint64_t n;
    } arrs[] = {
        {"a.u8", GGUF_T_U8, a_u8, 3},    {"a.i8", GGUF_T_I8, a_i8, 3},       {"a.u16", GGUF_T_U16, a_u16, 2},
        {"a.i16", GGUF_T_I16, a_i16, 2}, {"a.u32", GGUF_T_U32, a_u32, 3},    {"a.i32", GGUF_T_I32, a_i32, 2},
        {"a.f32", GGUF_T_F32, a_f32, 3}, {"a.bool", GGUF_T_BOOL, a_bool, 3}, {"a.u64", GGUF_T_U64, a_u64, 2},
        {"a.i64", GGUF_T_I64, a_i64, 3}, {"a.f64", GGUF_T_F64, a_f64, 2},    {"a.none", GGUF_T_U32, NULL, 0},
    };
    for (size_t i = 0; i < sizeof arrs / sizeof arrs[0]; i++)
        assert_int_equal(gguf_w_arr(w, arrs[i].k, arrs[i].t, arrs[i].d, arrs[i].n), TK_OK);
    const char *strs[] = {"tok", "", "a\0b", "\xe4\xb8\xad", "\xff\xfe"};
    const uint64_t lens[] = {3, 0, 3, 3, 2};
    assert_int_equal(gguf_w_arr_str(w, "a.str", strs, lens, 5), TK_OK);
    /* writer-side validation */
    assert_int_equal(gguf_w_u32(w, "k.u32", 1), TK_ERR_INVALID);
    assert_int_equal(gguf_w_u32(w, "", 1), TK_ERR_INVALID);
    assert_int_equal(gguf_w_arr(w, "a.bad", GGUF_T_STRING, a_u8, 1), TK_ERR_INVALID);

    /* several tensors of every supported type, with shapes of 1..4 dims */
    uint64_t seed = 0x9e3779b97f4a7c15ull ^ align;
    uint8_t *datas[2 * N_TT];
    uint64_t sizes[2 * N_TT];
    char names[2 * N_TT][32];
    int nt = 0;
    for (int r = 0; r < 2; r++)
        for (int k = 0; k < N_TT; k++, nt++) {
            tk_dtype ty = TTYPES[k];
            int64_t ne[4] = {dtype_block_elems(ty) * (1 + r), 3 + r, 2, 1 + r};
            int nd = 1 + (k + r) % 4;
            snprintf(names[nt], sizeof names[nt], "blk.%d.%s", r, dtype_name(ty));
            assert_int_equal(gguf_w_tensor_info(w, names[nt], ty, nd, ne), TK_OK);
            uint64_t rows = 1;
            for (int d = 1; d < nd; d++) rows *= (uint64_t)ne[d];
            uint64_t rb;
            assert_true(dtype_row_bytes(ty, (uint64_t)ne[0], &rb));
            sizes[nt] = rb * rows;
            datas[nt] = malloc(sizes[nt]);
            for (uint64_t i = 0; i < sizes[nt]; i++) datas[nt][i] = (uint8_t)rng_next(&seed);
        }
    int64_t bad_ne[2] = {33, 1};
    assert_int_equal(gguf_w_tensor_info(w, "bad", TK_DTYPE_Q8_0, 2, bad_ne), TK_ERR_INVALID);
    assert_int_equal(gguf_w_tensor_info(w, names[0], TK_DTYPE_F32, 1, bad_ne), TK_ERR_INVALID);

    assert_int_equal(gguf_w_begin(w, path), TK_OK);
    assert_int_equal(gguf_w_u32(w, "late", 1), TK_ERR_INVALID);
    assert_int_equal(gguf_w_tensor_data(w, datas[0], sizes[0] + 1), TK_ERR_INVALID);
    for (int i = 0; i < nt; i++) assert_int_equal(gguf_w_tensor_data(w, datas[i], sizes[i]), TK_OK);
    assert_int_equal(gguf_w_tensor_data(w, datas[0], sizes[0]), TK_ERR_INVALID);
    assert_int_equal(gguf_w_finish(w), TK_OK);
    gguf_writer_free(w);

    gguf_file *f;
    assert_int_equal(gguf_open(path, &f), TK_OK);
    assert_int_equal(gguf_version(f), 3);
    assert_int_equal(gguf_alignment(f), align);
    assert_string_equal(gguf_path(f), path);
    uint32_t u;
    int64_t i64;
    float x;
    bool bo;
    gguf_str s;
    assert_int_equal(gguf_require_u32(f, "k.u32", &u), TK_OK);
    assert_int_equal(u, 4000000000u);
    assert_int_equal(gguf_get_i64(f, "k.i32", 0, &i64), TK_OK);
    assert_int_equal(i64, -123456);
    assert_int_equal(gguf_find(f, "k.u64")->v.u, UINT64_MAX - 1);
    assert_int_equal(gguf_get_i64(f, "k.u64", 0, &i64), TK_ERR_RANGE);
    assert_int_equal(gguf_require_f32(f, "k.f32", &x), TK_OK);
    assert_true(x == -0.15625f);
    assert_int_equal(gguf_get_bool(f, "k.bool", false, &bo), TK_OK);
    assert_true(bo);
    assert_int_equal(gguf_require_str(f, "k.str", &s), TK_OK);
    assert_true(gguf_str_eq(s, "h\xc3\xa9llo\x01\xff\t\"\\ \xf0\x9f\x98\x80"));
    assert_int_equal(gguf_require_str(f, "k.empty", &s), TK_OK);
    assert_int_equal(s.len, 0);
    for (size_t a = 0; a < sizeof arrs / sizeof arrs[0]; a++) {
        const gguf_kv *kv;
        assert_int_equal(gguf_require_arr(f, arrs[a].k, arrs[a].t, &kv), TK_OK);
        assert_int_equal(kv->arr_n, arrs[a].n);
        if (arrs[a].n)
            assert_memory_equal(
                kv->arr_data, arrs[a].d,
                arrs[a].n * (arrs[a].t == GGUF_T_U8 || arrs[a].t == GGUF_T_I8 || arrs[a].t == GGUF_T_BOOL ? 1
                             : arrs[a].t == GGUF_T_U16 || arrs[a].t == GGUF_T_I16                         ? 2
                             : arrs[a].t == GGUF_T_U64 || arrs[a].t == GGUF_T_I64 || arrs[a].t == GGUF_T_F64
                                 ? 8
                                 : 4));
        assert_int_equal(gguf_arr_i64(kv, arrs[a].n, &i64), TK_ERR_RANGE);
    }
    const gguf_kv *kv;
    assert_int_equal(gguf_require_arr(f, "a.i64", GGUF_T_I64, &kv), TK_OK);
    assert_int_equal(gguf_arr_i64(kv, 0, &i64), TK_OK);
    assert_true(i64 == INT64_MIN);
    assert_int_equal(gguf_require_arr(f, "a.u64", GGUF_T_U64, &kv), TK_OK);
    assert_int_equal(gguf_arr_i64(kv, 0, &i64), TK_ERR_RANGE);
    assert_int_equal(gguf_arr_f32(kv, 1, &x), TK_OK);
    assert_true(x == 0.0f);
    assert_int_equal(gguf_require_arr(f, "a.i8", GGUF_T_I8, &kv), TK_OK);
    assert_int_equal(gguf_arr_i64(kv, 0, &i64), TK_OK);
    assert_int_equal(i64, -128);
    assert_int_equal(gguf_require_arr(f, "a.f64", GGUF_T_F64, &kv), TK_OK);
    assert_int_equal(gguf_arr_f32(kv, 0, &x), TK_OK);
    assert_true(x == (float)3.141592653589793);
    assert_int_equal(gguf_arr_i64(kv, 0, &i64), TK_ERR_FORMAT);
    assert_int_equal(gguf_require_arr(f, "a.f32", GGUF_T_F32, &kv), TK_OK);
    assert_int_equal(gguf_arr_f32(kv, 2, &x), TK_OK);
    assert_true(x == 1e30f);
    assert_int_equal(gguf_require_arr(f, "a.str", GGUF_T_STRING, &kv), TK_OK);
    assert_int_equal(kv->arr_n, 5);
    for (uint64_t k = 0; k < 5; k++) {
        assert_int_equal(gguf_arr_str(kv, k, &s), TK_OK);
        assert_int_equal(s.len, lens[k]);
        if (lens[k]) assert_memory_equal(s.ptr, strs[k], lens[k]);
    }
    assert_int_equal(gguf_arr_str(kv, 5, &s), TK_ERR_RANGE);
    assert_int_equal(gguf_arr_f32(kv, 0, &x), TK_ERR_FORMAT);
    if (align != 32) {
        assert_int_equal(gguf_require_u32(f, "general.alignment", &u), TK_OK);
        assert_int_equal(u, align);
    }

    /* tensors: same names, types, shapes and bytes; gguf-py's layout (offsets are
     * the running sum of sizes padded to the alignment, data section aligned) */
    assert_int_equal(gguf_n_tensors(f), nt);
    const uint8_t *base = gguf_tensor_at(f, 0)->data;
    uint64_t expect_off = 0;
    for (int k = 0; k < nt; k++) {
        const tk_tensor *t = gguf_tensor_at(f, k);
        assert_string_equal(t->name, names[k]);
        assert_ptr_equal(gguf_find_tensor(f, names[k]), t);
        assert_int_equal(t->type, TTYPES[k % N_TT]);
        assert_int_equal(t->nbytes, sizes[k]);
        assert_memory_equal(t->data, datas[k], sizes[k]);
        assert_int_equal((uint64_t)((const uint8_t *)t->data - base), expect_off);
        expect_off += (sizes[k] + align - 1) / align * align;
        int64_t prod = t->ne[0] * t->ne[1] * t->ne[2] * t->ne[3];
        assert_true(prod > 0);
    }
    /* the file ends with the last tensor's padding */
    assert_int_equal(gguf_file_size(f) % align, 0);
    assert_true(gguf_file_size(f) > expect_off);
    gguf_close(f);
    for (int k = 0; k < nt; k++) free(datas[k]);
    assert_int_equal(tk_alloc_live_bytes(), live0);
    unlink(path);
}

static void test_gguf_roundtrip_align32(void **state) {
    (void)state;
    roundtrip(32);
}
static void test_gguf_roundtrip_align64(void **state) {
    (void)state;
    roundtrip(64);
}

static void test_gguf_open_errors(void **state) {
    (void)state;
    gguf_file *f;
    assert_int_equal(gguf_open("/nonexistent/x.gguf", &f), TK_ERR_IO);
    assert_non_null(strstr(tk_last_error(), "/nonexistent/x.gguf"));
    char path[512];
    snprintf(path, sizeof path, "%s/test_gguf_empty_%d.gguf", tmpdir(), (int)getpid());
    FILE *fp = fopen(path, "wb");
    assert_non_null(fp);
    fclose(fp);
    assert_int_equal(gguf_open(path, &f), TK_ERR_FORMAT);
    assert_non_null(strstr(tk_last_error(), path)); /* the file name prefixes the message */
    assert_non_null(strstr(tk_last_error(), "header"));
    unlink(path);
    assert_int_equal(gguf_open(tmpdir(), &f), TK_ERR_IO); /* a directory */
    assert_non_null(strstr(tk_last_error(), "not a regular file (a directory)"));
    /* A FIFO is refused at once, not read (nothing will ever write it): the
     * alarm turns a blocking open into a failed test instead of a hang. */
    snprintf(path, sizeof path, "%s/test_gguf_fifo_%d.gguf", tmpdir(), (int)getpid());
    unlink(path);
    assert_int_equal(mkfifo(path, 0600), 0);
    alarm(20);
    assert_int_equal(gguf_open(path, &f), TK_ERR_IO);
    alarm(0);
    assert_non_null(strstr(tk_last_error(), "not a regular file (a FIFO)"));
    unlink(path);
    assert_int_equal(gguf_open("/dev/zero", &f), TK_ERR_IO);
    assert_non_null(strstr(tk_last_error(), "/dev/zero: not a regular file (a character device)"));
    /* writer errors */
    gguf_writer *w;
    assert_int_equal(gguf_writer_init(48, &w), TK_ERR_INVALID);
    assert_int_equal(gguf_writer_init(0, &w), TK_OK);
    assert_int_equal(gguf_w_begin(w, "/nonexistent/dir/x.gguf"), TK_ERR_IO);
    gguf_writer_free(w);
    assert_int_equal(gguf_writer_init(0, &w), TK_OK);
    int64_t ne[1] = {4};
    assert_int_equal(gguf_w_tensor_info(w, "t", TK_DTYPE_F32, 1, ne), TK_OK);
    snprintf(path, sizeof path, "%s/test_gguf_short_%d.gguf", tmpdir(), (int)getpid());
    assert_int_equal(gguf_w_begin(w, path), TK_OK);
    assert_int_equal(gguf_w_finish(w), TK_ERR_INVALID); /* tensor data missing */
    assert_non_null(strstr(tk_last_error(), "0 of 1"));
    gguf_writer_free(w);
    gguf_writer_free(NULL);
    unlink(path);
}

/* The committed fuzz seeds are valid files (written by tests/fuzz/make_seeds.py). */
static void test_gguf_seeds(void **state) {
    (void)state;
    const char *src = getenv("TK_SRC");
    if (!src || !*src) fail_msg("TK_SRC is not set (ctest sets it to the source tree)");
    char dir[512], path[1024];
    snprintf(dir, sizeof dir, "%s/tests/fuzz/seeds/fuzz_gguf", src);
    DIR *d = opendir(dir);
    assert_non_null(d);
    int n = 0;
    for (struct dirent *e; (e = readdir(d));) {
        if (e->d_name[0] == '.') continue;
        snprintf(path, sizeof path, "%s/%s", dir, e->d_name);
        gguf_file *f;
        tk_status st = gguf_open(path, &f);
        if (st != TK_OK) print_error("%s: %s\n", path, tk_last_error());
        assert_int_equal(st, TK_OK);
        gguf_close(f);
        n++;
    }
    closedir(d);
    assert_true(n >= 3);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_gguf_seeds),
        cmocka_unit_test(test_gguf_valid_base),
        cmocka_unit_test(test_gguf_bad_header),
        cmocka_unit_test(test_gguf_bad_counts),
        cmocka_unit_test(test_gguf_bad_strings),
        cmocka_unit_test(test_gguf_bad_keys),
        cmocka_unit_test(test_gguf_bad_alignment),
        cmocka_unit_test(test_gguf_bad_tensor_shape),
        cmocka_unit_test(test_gguf_bad_tensor_type),
        cmocka_unit_test(test_gguf_bad_offsets),
        cmocka_unit_test(test_gguf_bad_names),
        cmocka_unit_test(test_gguf_nested_arrays),
        cmocka_unit_test(test_gguf_truncations),
        cmocka_unit_test(test_gguf_getters),
        cmocka_unit_test(test_gguf_roundtrip_align32),
        cmocka_unit_test(test_gguf_roundtrip_align64),
        cmocka_unit_test(test_gguf_open_errors),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
