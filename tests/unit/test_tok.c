/* Tokenizer on vocabularies built here: a Llama-3-style byte-level BPE
 * (tokenizer.json), a SentencePiece-style one (GGUF "llama"), with expected ids
 * worked out by hand; invalid UTF-8; the streaming detokenizer; chat formats and
 * the marked encoding beneath them; and bad tokenizer files that must fail at
 * load with a clear message. */
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
#include "tokenizer/tok_internal.h"
#include "tokenizer/tokenizer.h"

/* ---- helpers ---------------------------------------------------------------- */

static size_t enc(const tk_tokenizer *t, const char *s, size_t len, bool bos, bool special, int32_t *ids,
                  size_t cap) {
    size_t n = 0;
    tk_status st = tok_encode(t, s, len, bos, special, ids, cap, &n);
    if (st) fprintf(stderr, "tok_encode: %s\n", tk_last_error());
    assert_int_equal(st, TK_OK);
    return n;
}

static void expect_ids(const tk_tokenizer *t, const char *s, bool bos, bool special, const int32_t *want,
                       size_t nwant) {
    int32_t ids[256];
    size_t n = enc(t, s, strlen(s), bos, special, ids, 256);
    if (n != nwant || memcmp(ids, want, n * sizeof *ids)) {
        fprintf(stderr, "encode \"%s\": got", s);
        for (size_t i = 0; i < n; i++) fprintf(stderr, " %d", ids[i]);
        fprintf(stderr, ", want");
        for (size_t i = 0; i < nwant; i++) fprintf(stderr, " %d", want[i]);
        fprintf(stderr, "\n");
        fail();
    }
}

/* Decode ids through a stream, pushing one id at a time. */
static char *decode(const tk_tokenizer *t, const int32_t *ids, size_t n, bool special) {
    tok_stream *s;
    assert_int_equal(tok_stream_init(t, special, &s), TK_OK);
    size_t bound = tok_stream_bound(t), cap = (n + 1) * bound + 1, k = 0;
    char *out = malloc(cap);
    assert_non_null(out);
    for (size_t i = 0; i < n; i++) k += tok_stream_push(s, ids[i], out + k, bound);
    k += tok_stream_flush(s, out + k, bound);
    out[k] = 0;
    tok_stream_free(s);
    return out;
}

static void roundtrip(const tk_tokenizer *t, const char *s, bool bos, bool show_special) {
    int32_t ids[512];
    size_t n = enc(t, s, strlen(s), bos, true, ids, 512);
    char *d = decode(t, ids, n, show_special);
    assert_string_equal(d, s);
    free(d);
}

#define IDS(...) ((const int32_t[]){__VA_ARGS__}), (sizeof((const int32_t[]){__VA_ARGS__}) / sizeof(int32_t))

/* ---- a Llama-3-style byte-level BPE, as tokenizer.json ------------------------- */

/* GPT-2's byte -> character map, as tokenizer.json pieces spell it. */
static void byte_char(int b, char *o) {
    uint32_t cp = (uint32_t)b;
    if (!((b >= 0x21 && b <= 0x7e) || (b >= 0xa1 && b <= 0xac) || (b >= 0xae && b <= 0xff))) {
        int n = 0;
        for (int i = 0; i < b; i++)
            if (!((i >= 0x21 && i <= 0x7e) || (i >= 0xa1 && i <= 0xac) || (i >= 0xae && i <= 0xff))) n++;
        cp = 256u + (uint32_t)n;
    }
    if (cp < 0x80) {
        o[0] = (char)cp;
        o[1] = 0;
    } else {
        o[0] = (char)(0xc0 | (cp >> 6));
        o[1] = (char)(0x80 | (cp & 0x3f));
        o[2] = 0;
    }
}

static void json_str(char **p, const char *s) {
    *p += sprintf(*p, "\"");
    for (; *s; s++) {
        if (*s == '"' || *s == '\\')
            *p += sprintf(*p, "\\%c", *s);
        else
            *p += sprintf(*p, "%c", *s);
    }
    *p += sprintf(*p, "\"");
}

#define LLAMA3_RE                                                                                            \
    "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\\\r\\\\n\\\\p{L}\\\\p{N}]?\\\\p{L}+|\\\\p{N}{1,3}| "                   \
    "?[^\\\\s\\\\p{L}\\\\p{N}]+[\\\\r\\\\n]*|"                                                               \
    "\\\\s*[\\\\r\\\\n]+|\\\\s+(?!\\\\S)|\\\\s+"

/* ids 0..255: the byte characters in byte order; then the merged tokens below;
 * then the added tokens. `variant` breaks the file in one way for the error tests. */
static char *llama3_json(const char *variant) {
    char *buf = malloc(1 << 16), *p = buf;
    assert_non_null(buf);
    p += sprintf(p, "{\"version\":\"1.0\",");
    if (!strcmp(variant, "added_range"))
        p += sprintf(p, "\"added_tokens\":[{\"id\":99999,\"content\":\"<|x|>\",\"special\":true}],");
    else if (!strcmp(variant, "added_nul")) /* cJSON would cut it to "a" */
        p += sprintf(p, "\"added_tokens\":[{\"id\":262,\"content\":\"a\\u0000b\",\"special\":false}],");
    else if (!strcmp(variant, "added_empty"))
        p += sprintf(p, "\"added_tokens\":[{\"id\":262,\"content\":\"\",\"special\":true}],");
    else
        p += sprintf(p, "\"added_tokens\":[{\"id\":262,\"content\":\"<|begin_of_text|>\",\"special\":true},"
                        "{\"id\":263,\"content\":\"<|eot_id|>\",\"special\":true},"
                        "{\"id\":264,\"content\":\"<|eot|>\",\"special\":false}],");
    p += sprintf(p, "\"normalizer\":null,");
    const char *re = !strcmp(variant, "bad_regex") ? "\\\\w+" : LLAMA3_RE;
    p += sprintf(
        p,
        "\"pre_tokenizer\":{\"type\":\"Sequence\",\"pretokenizers\":[{\"type\":\"Split\",\"pattern\":{"
        "\"Regex\":\"%s\"},"
        "\"behavior\":\"Isolated\",\"invert\":false},{\"type\":\"ByteLevel\",\"add_prefix_space\":false,"
        "\"trim_offsets\":true,\"use_regex\":false}]},",
        re);
    p += sprintf(p,
                 "\"post_processor\":{\"type\":\"TemplateProcessing\",\"single\":[{\"SpecialToken\":{\"id\":"
                 "\"<|begin_of_text|>\",\"type_id\":0}},{\"Sequence\":{\"id\":\"A\",\"type_id\":0}}]},");
    p += sprintf(p, "\"decoder\":{\"type\":\"ByteLevel\"},");
    if (!strcmp(variant, "no_model")) {
        p += sprintf(p, "\"nomodel\":{}}");
        return buf;
    }
    p += sprintf(p, "\"model\":{\"type\":\"BPE\",\"ignore_merges\":%s,\"vocab\":{",
                 !strcmp(variant, "no_ignore") ? "false" : "true");
    for (int b = 0; b < 256; b++) {
        char c[4];
        byte_char(b, c);
        json_str(&p, c);
        p += sprintf(p, ":%d,", b);
    }
    /* 256 Ġt, 257 he, 258 Ġthe, 259 12, 260 123, 261 xyz (no merge makes it) */
    p += sprintf(p, "\"\xc4\xa0t\":256,%s\"\xc4\xa0the\":258,\"12\":259,\"123\":260%s},\"merges\":[",
                 !strcmp(variant, "vocab_hole") ? "" : "\"he\":257,",
                 !strcmp(variant, "vocab_last")    ? ""
                 : !strcmp(variant, "vocab_empty") ? ",\"\":261"
                                                   : ",\"xyz\":261");
    p += sprintf(p, "[\"\xc4\xa0\",\"t\"],\"h e\",[\"\xc4\xa0t\",\"he\"],[\"1\",\"2\"],[\"12\",\"3\"]");
    if (!strcmp(variant, "bad_merge")) p += sprintf(p, ",[\"q\",\"nosuch\"]");
    p += sprintf(p, "]}}");
    return buf;
}

static tk_tokenizer *load_llama3(const char *variant) {
    char *j = llama3_json(variant);
    tk_tokenizer *t = NULL;
    tk_status st = tok_load_json(j, strlen(j), NULL, &t);
    if (st) fprintf(stderr, "load: %s\n", tk_last_error());
    assert_int_equal(st, TK_OK);
    free(j);
    return t;
}

static void test_tok_llama3_ids(void **state) {
    (void)state;
    tk_tokenizer *t = load_llama3("ok");
    assert_int_equal(tok_n_vocab(t), 265);
    assert_string_equal(tok_model_name(t), "gpt2");
    assert_string_equal(tok_pre_name(t), "llama-bpe");
    assert_int_equal(tok_bos(t), 262);
    /* "the": t + he (no merge t+he); " the": Ġt, he, then Ġthe */
    expect_ids(t, "the the", false, true, IDS('t', 257, 258));
    /* BOS from the TemplateProcessing; \p{N}{1,3} splits 12345 as 123|45 */
    expect_ids(t, "12345", true, true, IDS(262, 260, '4', '5'));
    /* ignore_merges: a word that is a token is taken whole even with no merge path */
    expect_ids(t, "xyz", false, true, IDS(261));
    /* special tokens: matched with parse_special, plain text without (except non-special added ones) */
    expect_ids(t, "a<|eot_id|>b", false, true, IDS('a', 263, 'b'));
    expect_ids(t, "<|eot|>", false, false, IDS(264));
    int32_t ids[64];
    size_t n = enc(t, "<|eot_id|>", 10, false, false, ids, 64);
    assert_true(n > 1); /* split into byte-level pieces */
    /* longest match first: <|eot_id|> is not <|eot|> + junk */
    expect_ids(t, "<|eot_id|><|eot|>", false, true, IDS(263, 264));
    assert_true(tok_is_eog(t, 263));
    assert_false(tok_is_eog(t, 'a'));
    roundtrip(t, "the 12345 xyz <|eot_id|> \xe4\xbd\xa0\xe5\xa5\xbd \xf0\x9f\x98\x80\tend\r\n", false, true);
    tok_free(t);

    t = load_llama3("no_ignore");
    expect_ids(t, "xyz", false, true, IDS('x', 'y', 'z'));
    tok_free(t);
}

static void test_tok_encode_bound_and_cap(void **state) {
    (void)state;
    tk_tokenizer *t = load_llama3("ok");
    int32_t ids[4];
    size_t n = 99;
    /* too small a buffer is an error naming the count, not a silent truncation */
    assert_int_equal(tok_encode(t, "a b c d e f", 11, false, true, ids, 4, &n), TK_ERR_RANGE);
    assert_non_null(strstr(tk_last_error(), "tok_encode_bound"));
    assert_true(tok_encode_bound(t, 11) >= 11);
    assert_int_equal(tok_encode(t, "", 0, false, true, ids, 4, &n), TK_OK);
    assert_int_equal(n, 0);
    tok_free(t);
}

/* Invalid UTF-8 is encoded as U+FFFD, one per maximal invalid subpart. */
static void test_tok_invalid_utf8(void **state) {
    (void)state;
    tk_tokenizer *t = load_llama3("ok");
    static const struct {
        const char *bad, *good;
    } cases[] = {
        {"a\xff"
         "b",
         "a\xef\xbf\xbd"
         "b"},
        {"x\xe4\xb8", "x\xef\xbf\xbd"},                           /* truncated at the end */
        {"\xed\xa0\x80", "\xef\xbf\xbd\xef\xbf\xbd\xef\xbf\xbd"}, /* a surrogate: 3 subparts */
        {"\xc0\xaf", "\xef\xbf\xbd\xef\xbf\xbd"},                 /* overlong */
        {"\xe4\xb8q\xe4\xb8\xad", "\xef\xbf\xbdq\xe4\xb8\xad"},   /* cut off, then valid */
        {"\xf4\x90\x80\x80", "\xef\xbf\xbd\xef\xbf\xbd\xef\xbf\xbd\xef\xbf\xbd"}, /* past U+10FFFF */
        {"\xf0\x9f\x98", "\xef\xbf\xbd"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        int32_t a[64], b[64];
        size_t na = enc(t, cases[i].bad, strlen(cases[i].bad), false, true, a, 64);
        size_t nb = enc(t, cases[i].good, strlen(cases[i].good), false, true, b, 64);
        assert_int_equal(na, nb);
        assert_memory_equal(a, b, na * sizeof *a);
        char *d = decode(t, a, na, false);
        assert_string_equal(d, cases[i].good);
        free(d);
    }
    tok_free(t);
}

/* A token may end inside a character: the stream holds it back. */
static void test_tok_stream_partial_utf8(void **state) {
    (void)state;
    tk_tokenizer *t = load_llama3("ok");
    tok_stream *s;
    assert_int_equal(tok_stream_init(t, false, &s), TK_OK);
    char out[256];
    assert_true(tok_stream_bound(t) <= sizeof out);
    /* 你 = E4 BD A0, one byte token each */
    assert_int_equal(tok_stream_push(s, t->byte_tok[0xe4], out, sizeof out), 0);
    assert_int_equal(tok_stream_push(s, t->byte_tok[0xbd], out, sizeof out), 0);
    size_t n = tok_stream_push(s, t->byte_tok[0xa0], out, sizeof out);
    assert_int_equal(n, 3);
    assert_memory_equal(out, "\xe4\xbd\xa0", 3);
    /* an unfinished character followed by ASCII: U+FFFD, then the ASCII */
    assert_int_equal(tok_stream_push(s, t->byte_tok[0xe4], out, sizeof out), 0);
    n = tok_stream_push(s, 'a', out, sizeof out);
    assert_int_equal(n, 4);
    assert_memory_equal(out,
                        "\xef\xbf\xbd"
                        "a",
                        4);
    /* flush emits what is left as U+FFFD */
    assert_int_equal(tok_stream_push(s, t->byte_tok[0xf0], out, sizeof out), 0);
    assert_int_equal(tok_stream_push(s, t->byte_tok[0x9f], out, sizeof out), 0);
    n = tok_stream_flush(s, out, sizeof out);
    assert_int_equal(n, 3);
    assert_memory_equal(out, "\xef\xbf\xbd", 3);
    /* special tokens hidden by default, an unknown id is U+FFFD */
    assert_int_equal(tok_stream_push(s, 263, out, sizeof out), 0);
    n = tok_stream_push(s, 99999, out, sizeof out);
    assert_int_equal(n, 3);
    tok_stream_free(s);
    assert_int_equal(tok_stream_init(t, true, &s), TK_OK);
    n = tok_stream_push(s, 263, out, sizeof out);
    assert_int_equal(n, strlen("<|eot_id|>"));
    assert_memory_equal(out, "<|eot_id|>", n);
    tok_stream_free(s);
    tok_stream_free(NULL);
    tok_free(t);
    tok_free(NULL);
}

/* ---- bad files fail at load with a message that says what is wrong ------------- */

static void expect_load_error(const char *json, size_t len, tk_status want, const char *needle) {
    tk_tokenizer *t = (tk_tokenizer *)0x1;
    tk_status st = tok_load_json(json, len, NULL, &t);
    assert_int_equal(st, want);
    assert_null(t);
    if (!strstr(tk_last_error(), needle)) {
        fprintf(stderr, "message \"%s\" lacks \"%s\"\n", tk_last_error(), needle);
        fail();
    }
}

static void test_tok_bad_files(void **state) {
    (void)state;
    uint64_t live = tk_alloc_live_bytes();
    char *j = llama3_json("bad_merge");
    expect_load_error(j, strlen(j), TK_ERR_FORMAT, "unknown token 'nosuch'");
    free(j);
    j = llama3_json("added_range");
    expect_load_error(
        j, strlen(j), TK_ERR_FORMAT,
        "token ids are not contiguous: id 262 is missing (vocab ids run to 261, added token ids to 99999)");
    free(j);
    /* a vocab entry removed: said as such, not as an added token's range error */
    j = llama3_json("vocab_hole");
    expect_load_error(j, strlen(j), TK_ERR_FORMAT, "vocab ids are not contiguous: id 257 is missing");
    free(j);
    j = llama3_json("vocab_last");
    expect_load_error(j, strlen(j), TK_ERR_FORMAT, "token ids are not contiguous: id 261 is missing");
    free(j);
    j = llama3_json("vocab_empty");
    expect_load_error(j, strlen(j), TK_ERR_FORMAT, "vocab entry 261 is the empty string");
    free(j);
    /* an added token holding a NUL is refused, not cut at it (every "a" would become it) */
    j = llama3_json("added_nul");
    expect_load_error(j, strlen(j), TK_ERR_FORMAT, "\\u0000 (NUL)");
    free(j);
    j = llama3_json("added_empty");
    expect_load_error(j, strlen(j), TK_ERR_FORMAT, "added token 262 has empty content");
    free(j);
    expect_load_error("{\"model\":\"a\0b\"}", 15, TK_ERR_FORMAT, "NUL byte at byte 11");
    const char *esc = "{\"a\\u0000\":1}", *lit = "{\"a\\\\u0000\":1}";
    expect_load_error(esc, strlen(esc), TK_ERR_FORMAT, "\\u0000 (NUL) at byte 3");
    /* an escaped backslash before "u0000" is text, not a NUL */
    expect_load_error(lit, strlen(lit), TK_ERR_FORMAT, "missing \"model\"");
    j = llama3_json("no_model");
    expect_load_error(j, strlen(j), TK_ERR_FORMAT, "missing \"model\"");
    free(j);
    j = llama3_json("bad_regex");
    expect_load_error(j, strlen(j), TK_ERR_UNSUPPORTED, "unknown pre-tokenizer regex");
    free(j);
    /* deeply nested: refused before the recursive parser sees it */
    char deep[4096];
    size_t k = 0;
    k += (size_t)sprintf(deep, "{\"model\":");
    for (int i = 0; i < 1500; i++) deep[k++] = '[';
    for (int i = 0; i < 1500; i++) deep[k++] = ']';
    deep[k++] = '}';
    expect_load_error(deep, k, TK_ERR_FORMAT, "nested deeper");
    /* huge: the size check comes before any byte is read */
    expect_load_error("{}", TOK_MAX_JSON + 1, TK_ERR_FORMAT, "limit");
    expect_load_error("{\"model\": [1, 2", 15, TK_ERR_FORMAT, "invalid JSON");
    expect_load_error("[]", 2, TK_ERR_FORMAT, "JSON object");
    expect_load_error("{\"model\":{\"type\":\"Unigram\",\"vocab\":[]}}", 39, TK_ERR_UNSUPPORTED, "Unigram");
    assert_int_equal(tk_alloc_live_bytes(), live);
}

/* ---- SentencePiece-style BPE from a GGUF built here ----------------------------- */

/* extra: one more token (user-defined, extra_len bytes) after the fixed ones, or NULL. */
static tk_tokenizer *load_spm_with(const char *path, const char *extra, size_t extra_len) {
    enum { N = 3 + 256 + 10 };
    char *pieces[N + 1];
    uint64_t lens[N + 1];
    float scores[N + 1];
    int32_t types[N + 1];
    char names[N][16];
    const char *base[] = {"<unk>", "<s>", "</s>"};
    int btype[] = {2, 3, 3};
    for (int i = 0; i < 3; i++) {
        snprintf(names[i], 16, "%s", base[i]);
        types[i] = btype[i];
        scores[i] = 0;
    }
    for (int b = 0; b < 256; b++) {
        snprintf(names[3 + b], 16, "<0x%02X>", b);
        types[3 + b] = 6;
        scores[3 + b] = 0;
    }
    /* 259 ▁, 260 h, 261 e, 262 l, 263 o, 264 ▁h, 265 ll, 266 ▁he, 267 llo, 268 ▁hello */
    const char *words[] = {
        "\xe2\x96\x81",     "h", "e", "l", "o", "\xe2\x96\x81h", "ll", "\xe2\x96\x81he", "llo",
        "\xe2\x96\x81hello"};
    float wscore[] = {-10, -10, -10, -10, -10, -1, -2, -3, -4, -5};
    for (int i = 0; i < 10; i++) {
        snprintf(names[259 + i], 16, "%s", words[i]);
        types[259 + i] = 1;
        scores[259 + i] = wscore[i];
    }
    for (int i = 0; i < N; i++) {
        pieces[i] = names[i];
        lens[i] = strlen(names[i]);
    }
    uint64_t n = N;
    if (extra) {
        pieces[N] = (char *)extra;
        lens[N] = extra_len;
        scores[N] = 0;
        types[N] = 4;
        n = N + 1;
    }
    gguf_writer *w;
    assert_int_equal(gguf_writer_init(0, &w), TK_OK);
    assert_int_equal(gguf_w_str(w, "general.architecture", "llama"), TK_OK);
    assert_int_equal(gguf_w_str(w, "tokenizer.ggml.model", "llama"), TK_OK);
    assert_int_equal(gguf_w_arr_str(w, "tokenizer.ggml.tokens", (const char *const *)pieces, lens, n), TK_OK);
    assert_int_equal(gguf_w_arr(w, "tokenizer.ggml.scores", GGUF_T_F32, scores, n), TK_OK);
    assert_int_equal(gguf_w_arr(w, "tokenizer.ggml.token_type", GGUF_T_I32, types, n), TK_OK);
    assert_int_equal(gguf_w_u32(w, "tokenizer.ggml.bos_token_id", 1), TK_OK);
    assert_int_equal(gguf_w_u32(w, "tokenizer.ggml.eos_token_id", 2), TK_OK);
    assert_int_equal(gguf_w_u32(w, "tokenizer.ggml.unknown_token_id", 0), TK_OK);
    assert_int_equal(gguf_w_begin(w, path), TK_OK);
    assert_int_equal(gguf_w_finish(w), TK_OK);
    gguf_writer_free(w);
    gguf_file *f;
    assert_int_equal(gguf_open(path, &f), TK_OK);
    tk_tokenizer *t = NULL;
    tk_status st = tok_load_gguf(f, &t);
    if (st) fprintf(stderr, "tok_load_gguf: %s\n", tk_last_error());
    assert_int_equal(st, TK_OK);
    gguf_close(f);
    return t;
}

static tk_tokenizer *load_spm(const char *path) { return load_spm_with(path, NULL, 0); }

static void tmp_path(char *p, size_t cap, const char *name) {
    const char *dir = getenv("TK_TMP");
    snprintf(p, cap, "%s/%s.%d", dir && *dir ? dir : "/tmp", name, (int)getpid());
}

static void test_tok_spm_ids(void **state) {
    (void)state;
    char path[512];
    tmp_path(path, sizeof path, "tok_spm.gguf");
    tk_tokenizer *t = load_spm(path);
    assert_string_equal(tok_model_name(t), "llama");
    assert_int_equal(tok_bos(t), 1);
    assert_true(tok_is_eog(t, 2));
    /* ▁h (-1) first, then ll (-2), ▁he (-3), llo (-4), ▁hello (-5) */
    expect_ids(t, "hello", true, true, IDS(1, 268));
    /* unknown characters fall back to bytes: w = <0x77> = 3 + 0x77 */
    expect_ids(t, "hello world", true, true, IDS(1, 268, 259, 3 + 'w', 263, 3 + 'r', 262, 3 + 'd'));
    expect_ids(t, "\xc3\xa9", false, true, IDS(259, 3 + 0xc3, 3 + 0xa9));
    /* text after a special token gets its own space prefix, as llama.cpp does */
    expect_ids(t, "hello</s>hello", true, true, IDS(1, 268, 2, 268));
    int32_t ids[64];
    size_t n = enc(t, "hello world", 11, true, true, ids, 64);
    char *d = decode(t, ids, n, false);
    assert_string_equal(d, "hello world");
    free(d);
    n = enc(t, "hello</s>hello", 14, true, true, ids, 64);
    d = decode(t, ids, n, true);
    assert_string_equal(d, "<s>hello</s>hello");
    free(d);
    roundtrip(t, "hello \xc3\xa9t\xc3\xa9  \xe4\xbd\xa0 ll", true, false);
    tok_free(t);
    unlink(path);
}

/* A GGUF piece carries its length, so a NUL inside one is kept, not cut: a
 * user-defined "h\0e" is its own 3-byte token and never captures "h". */
static void test_tok_gguf_piece_with_nul(void **state) {
    (void)state;
    char path[512];
    tmp_path(path, sizeof path, "tok_spm_nul.gguf");
    tk_tokenizer *t = load_spm_with(path, "h\0e", 3);
    int32_t nul_id = tok_n_vocab(t) - 1;
    size_t len;
    const char *p = tok_piece(t, nul_id, &len);
    assert_int_equal(len, 3);
    assert_memory_equal(p, "h\0e", 3);
    char base_path[512];
    tmp_path(base_path, sizeof base_path, "tok_spm_base.gguf");
    tk_tokenizer *base = load_spm(base_path);
    static const char *texts[] = {"h", "he", "hello h e", "eh"};
    for (size_t i = 0; i < sizeof texts / sizeof texts[0]; i++) { /* the extra token changes nothing */
        int32_t a[64], b[64];
        size_t na = enc(t, texts[i], strlen(texts[i]), true, true, a, 64);
        size_t nb = enc(base, texts[i], strlen(texts[i]), true, true, b, 64);
        assert_int_equal(na, nb);
        assert_memory_equal(a, b, na * sizeof *a);
    }
    tok_free(base);
    unlink(base_path);
    int32_t ids[1] = {nul_id};
    char *d = decode(t, ids, 1, true);
    assert_memory_equal(d, "h\0e", 3);
    free(d);
    tok_free(t);
    unlink(path);
}

/* A FIFO where tokenizer.json or tokenizer_config.json should be is refused at
 * once (a blocking open would wait for a writer forever). */
static void test_tok_fifo(void **state) {
    (void)state;
    char dir[512], p[600], q[600];
    tmp_path(dir, sizeof dir, "tok_fifo");
    assert_int_equal(mkdir(dir, 0700), 0);
    snprintf(p, sizeof p, "%s/tokenizer.json", dir);
    snprintf(q, sizeof q, "%s/tokenizer_config.json", dir);
    tk_tokenizer *t = (tk_tokenizer *)0x1;
    assert_int_equal(mkfifo(p, 0600), 0);
    alarm(20); /* a blocking open fails the test instead of hanging it */
    assert_int_equal(tok_load_path(p, &t), TK_ERR_IO);
    assert_null(t);
    assert_non_null(strstr(tk_last_error(), "tokenizer.json: not a regular file (a FIFO)"));
    assert_int_equal(tok_load_path(dir, &t), TK_ERR_IO);
    assert_non_null(strstr(tk_last_error(), "tokenizer.json: not a regular file (a FIFO)"));
    alarm(0);
    unlink(p);
    char *j = llama3_json("ok");
    FILE *f = fopen(p, "wb");
    assert_non_null(f);
    fputs(j, f);
    fclose(f);
    free(j);
    assert_int_equal(tok_load_path(dir, &t), TK_OK); /* the file itself is fine */
    tok_free(t);
    assert_int_equal(mkfifo(q, 0600), 0);
    alarm(20);
    assert_int_equal(tok_load_path(dir, &t), TK_ERR_IO);
    assert_non_null(strstr(tk_last_error(), "tokenizer_config.json: not a regular file (a FIFO)"));
    assert_int_equal(tok_load_path(p, &t), TK_ERR_IO);
    assert_non_null(strstr(tk_last_error(), "tokenizer_config.json: not a regular file (a FIFO)"));
    alarm(0);
    unlink(q);
    unlink(p);
    rmdir(dir);
}

/* ---- chat formats ------------------------------------------------------------- */

/* The chat's ids must be BOS (where the vocabulary asks) and the expected
 * rendering encoded as Hugging Face encodes a rendered template: special
 * tokens parsed. */
static void expect_chat(const tk_tokenizer *t, const tk_chat_message *m, int n, bool gen, const char *want) {
    int32_t *ids = NULL, w[1024];
    size_t n_ids = 0;
    tk_status st = tok_chat_encode(t, m, n, gen, true, &ids, &n_ids);
    if (st) fprintf(stderr, "tok_chat_encode: %s\n", tk_last_error());
    assert_int_equal(st, TK_OK);
    size_t nw = enc(t, want, strlen(want), true, true, w, 1024);
    if (n_ids != nw || memcmp(ids, w, nw * sizeof *w)) {
        char *got = decode(t, ids, n_ids, true);
        fprintf(stderr, "chat got:\n%s\n---want:\n%s\n", got, want);
        free(got);
        fail();
    }
    tk_free(ids);
}

static void test_tok_chat_llama3_and_chatml(void **state) {
    (void)state;
    char *j = llama3_json("ok");
    const char *cfg =
        "{\"chat_template\": \"{{ '<|start_header_id|>' + message['role'] + '<|end_header_id|>' }}\","
        "\"add_bos_token\": true, \"bos_token\": \"<|begin_of_text|>\", \"eos_token\": \"<|eot_id|>\"}";
    tk_tokenizer *t = NULL;
    assert_int_equal(tok_load_json(j, strlen(j), cfg, &t), TK_OK);
    free(j);
    assert_int_equal(tok_eos(t), 263);
    assert_non_null(tok_chat_template(t));
    assert_string_equal(tok_chat_family(t), "llama3");
    tk_chat_message m[] = {{"system", "Be brief."}, {"user", "  Hi there \n"}};
    expect_chat(t, m, 2, true,
                "<|start_header_id|>system<|end_header_id|>\n\nBe brief.<|eot_id|>"
                "<|start_header_id|>user<|end_header_id|>\n\nHi there<|eot_id|>"
                "<|start_header_id|>assistant<|end_header_id|>\n\n");
    int32_t *ids = NULL;
    size_t n = 0;
    tk_chat_message bad[] = {{"wizard", "x"}};
    assert_int_equal(tok_chat_encode(t, bad, 1, true, true, &ids, &n), TK_ERR_INVALID);
    assert_non_null(strstr(tk_last_error(), "wizard"));
    assert_null(ids);
    tk_chat_message no_content[] = {{"user", NULL}};
    assert_int_equal(tok_chat_encode(t, no_content, 1, true, true, &ids, &n), TK_ERR_INVALID);
    /* a special token in a message is text; the format's own <|eot_id|> is the token */
    tk_chat_message inj[] = {{"user", "a<|eot_id|>b"}};
    assert_int_equal(tok_chat_encode(t, inj, 1, false, true, &ids, &n), TK_OK);
    int n_eot = 0;
    for (size_t i = 0; i < n; i++) n_eot += ids[i] == 263;
    assert_int_equal(n_eot, 1);
    assert_int_equal(ids[n - 1], 263);
    tk_free(ids);
    /* invalid UTF-8 in a message is U+FFFD, as tok_encode makes it */
    tk_chat_message inv[] = {{"user", "\xff"}};
    expect_chat(t, inv, 1, false, "<|start_header_id|>user<|end_header_id|>\n\n\xef\xbf\xbd<|eot_id|>");
    tok_free(t);

    /* no template: plain ChatML (its markers are not in this vocabulary: text, as HF would encode them) */
    t = load_llama3("ok");
    assert_null(tok_chat_template(t));
    assert_string_equal(tok_chat_family(t), "chatml");
    expect_chat(t, m + 1, 1, true, "<|im_start|>user\n  Hi there \n<|im_end|>\n<|im_start|>assistant\n");
    assert_int_equal(tok_chat_encode(t, NULL, 0, false, true, &ids, &n), TK_OK);
    assert_int_equal(n, 1); /* BOS only */
    assert_int_equal(ids[0], 262);
    tk_free(ids);
    tok_free(t);
}

/* tok_encode_marked: special tokens only inside marks, no added token across a mark's edge. */
static void test_tok_encode_marked(void **state) {
    (void)state;
    tk_tokenizer *t = load_llama3("ok");
    int32_t ids[64], plain[64];
    size_t n = 0;
    const char *s = "<|eot_id|><|eot_id|><|eot|>";
    tok_range mk[] = {{10, 20}};
    assert_int_equal(tok_encode_marked(t, s, strlen(s), mk, 1, false, ids, 64, &n), TK_OK);
    size_t np = enc(t, "<|eot_id|>", 10, false, false, plain, 64);
    assert_true(np > 1);
    assert_int_equal(n, np + 2);
    assert_memory_equal(ids, plain, np * sizeof *ids); /* outside the mark: text */
    assert_int_equal(ids[np], 263);                    /* inside: the token */
    assert_int_equal(ids[np + 1], 264);                /* non-special: a token anywhere */
    /* a mark that cuts a special token in two leaves it text */
    tok_range cut[] = {{0, 5}};
    assert_int_equal(tok_encode_marked(t, s, 10, cut, 1, false, ids, 64, &n), TK_OK);
    assert_int_equal(n, np);
    assert_memory_equal(ids, plain, np * sizeof *ids);
    /* a non-special token may not swallow the start of a mark */
    tok_range at[] = {{3, 7}};
    assert_int_equal(tok_encode_marked(t, "<|eot|>", 7, at, 1, false, ids, 64, &n), TK_OK);
    assert_true(n > 1);
    /* bad marks and bad UTF-8 are refused */
    tok_range rev[] = {{10, 20}, {0, 5}}, empty[] = {{3, 3}}, past[] = {{0, 99}};
    assert_int_equal(tok_encode_marked(t, s, strlen(s), rev, 2, false, ids, 64, &n), TK_ERR_INVALID);
    assert_int_equal(tok_encode_marked(t, s, strlen(s), empty, 1, false, ids, 64, &n), TK_ERR_INVALID);
    assert_int_equal(tok_encode_marked(t, s, strlen(s), past, 1, false, ids, 64, &n), TK_ERR_INVALID);
    assert_int_equal(tok_encode_marked(t, "a\xff", 2, NULL, 0, false, ids, 64, &n), TK_ERR_INVALID);
    assert_int_equal(tok_encode_marked(t, s, strlen(s), mk, 1, false, ids, 2, &n), TK_ERR_RANGE);
    tok_free(t);
}

/* ---- random text: never crashes, always decodes to valid UTF-8 ---------------- */

static uint64_t rng_next(uint64_t *s) {
    *s ^= *s << 13;
    *s ^= *s >> 7;
    *s ^= *s << 17;
    return *s;
}

static bool valid_utf8(const char *p, size_t n) {
    for (size_t i = 0; i < n;) {
        uint32_t cp;
        int l = tok_utf8_next((const unsigned char *)p + i, n - i, &cp);
        if (l <= 0) return false;
        i += (size_t)l;
    }
    return true;
}

static size_t random_text(uint64_t *r, char *o, bool allow_invalid) {
    static const char *const frags[] = {"<|eot_id|>", "<|eot", "<|",           " ",        "  ",
                                        "\t",         "\r\n",  "\n",           "'s",       "'LL",
                                        "12345",      "the",   "\xe4\xbd\xa0", "\xcc\x81", "\xf0\x9f\x98\x80",
                                        "\xc2\xa0",   "hello", "</s>"};
    size_t n = 0, parts = rng_next(r) % 12;
    for (size_t k = 0; k < parts; k++) {
        uint64_t c = rng_next(r) % 10;
        if (c < 5) {
            const char *f = frags[rng_next(r) % (sizeof frags / sizeof frags[0])];
            memcpy(o + n, f, strlen(f));
            n += strlen(f);
        } else if (c < 8) {
            uint32_t cp = (uint32_t)(rng_next(r) % 0x3000);
            if (cp >= 0xd800 && cp < 0xe000) cp = 'x';
            char u[4];
            int l = cp < 0x80 ? (u[0] = (char)(cp ? cp : 'z'), 1)
                    : cp < 0x800
                        ? (u[0] = (char)(0xc0 | (cp >> 6)), u[1] = (char)(0x80 | (cp & 0x3f)), 2)
                        : (u[0] = (char)(0xe0 | (cp >> 12)), u[1] = (char)(0x80 | ((cp >> 6) & 0x3f)),
                           u[2] = (char)(0x80 | (cp & 0x3f)), 3);
            memcpy(o + n, u, (size_t)l);
            n += (size_t)l;
        } else if (allow_invalid) {
            uint8_t b = (uint8_t)(rng_next(r) & 0xff);
            o[n++] = (char)(b ? b : 0x80); /* no NULs: decode() returns a C string */
        }
    }
    return n;
}

static void random_roundtrips(const tk_tokenizer *t, bool bos, bool show_special, uint64_t seed) {
    uint64_t r = seed;
    char text[512];
    int32_t ids[2048];
    for (int it = 0; it < 3000; it++) {
        bool inv = it % 2;
        size_t n = random_text(&r, text, inv), m = 0;
        assert_true(tok_encode_bound(t, n) <= 2048);
        assert_int_equal(tok_encode(t, text, n, bos, true, ids, 2048, &m), TK_OK);
        char *d = decode(t, ids, m, show_special);
        size_t dl = strlen(d);
        assert_true(valid_utf8(d, dl));
        if (valid_utf8(text, n)) {
            if (dl != n || memcmp(d, text, n)) {
                fprintf(stderr, "round trip failed for \"%.*s\" -> \"%s\"\n", (int)n, text, d);
                fail();
            }
        } else { /* the repaired text is stable: it encodes to the same ids */
            int32_t ids2[2048];
            size_t m2 = 0;
            assert_int_equal(tok_encode(t, d, dl, bos, true, ids2, 2048, &m2), TK_OK);
            assert_int_equal(m, m2);
            assert_memory_equal(ids, ids2, m * sizeof *ids);
        }
        free(d);
    }
}

static void test_tok_random_text(void **state) {
    (void)state;
    tk_tokenizer *t = load_llama3("ok");
    random_roundtrips(t, false, true, 0x9e3779b97f4a7c15ull);
    tok_free(t);
    char path[512];
    tmp_path(path, sizeof path, "tok_spm_rand.gguf");
    t = load_spm(path);
    /* SentencePiece hides </s> when decoding, so compare without showing it only on text lacking it */
    uint64_t r = 42;
    char text[512];
    int32_t ids[2048];
    for (int it = 0; it < 2000; it++) {
        size_t n = random_text(&r, text, it % 2), m = 0;
        assert_int_equal(tok_encode(t, text, n, true, false, ids, 2048, &m), TK_OK);
        char *d = decode(t, ids, m, false);
        assert_true(valid_utf8(d, strlen(d)));
        if (valid_utf8(text, n)) assert_true(strlen(d) == n && !memcmp(d, text, n));
        free(d);
    }
    tok_free(t);
    unlink(path);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_tok_llama3_ids),
        cmocka_unit_test(test_tok_encode_bound_and_cap),
        cmocka_unit_test(test_tok_invalid_utf8),
        cmocka_unit_test(test_tok_stream_partial_utf8),
        cmocka_unit_test(test_tok_bad_files),
        cmocka_unit_test(test_tok_spm_ids),
        cmocka_unit_test(test_tok_gguf_piece_with_nul),
        cmocka_unit_test(test_tok_fifo),
        cmocka_unit_test(test_tok_chat_llama3_and_chatml),
        cmocka_unit_test(test_tok_encode_marked),
        cmocka_unit_test(test_tok_random_text),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
