/* The loadgen's stream reader: server-sent events cut at every byte, with LF,
 * CRLF and CR line ends, comments, multi-line data and overlong lines; and
 * what a completion frame says (text, chat deltas, usage, finish, errors). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "bench/loadgen.h"
#include "core/alloc.h"

typedef struct events {
    char got[16][64];
    int n;
    int stop_after; /* 0: never stop */
} events;

static bool collect(void *user, const char *data, size_t n) {
    events *e = user;
    assert_int_equal(strlen(data), n); /* NUL-terminated, no NUL inside here */
    if (e->n < 16) snprintf(e->got[e->n], sizeof e->got[0], "%s", data);
    e->n++;
    return !(e->stop_after && e->n >= e->stop_after);
}

static const char STREAM[] = ": keep-alive\n"
                             "data: {\"a\":1}\n\n"
                             "data:{\"b\":2}\r\n\r\n"
                             "event: x\rdata: one\rdata: two\r\r"
                             "id: 7\n"
                             "data\n\n"
                             "data: [DONE]\n\n"
                             "data: unfinished";

static void expect_stream(const events *e) {
    assert_int_equal(e->n, 5);
    assert_string_equal(e->got[0], "{\"a\":1}");
    assert_string_equal(e->got[1], "{\"b\":2}");
    assert_string_equal(e->got[2], "one\ntwo");
    assert_string_equal(e->got[3], ""); /* a bare "data" field dispatches empty data */
    assert_string_equal(e->got[4], "[DONE]");
}

static void test_sse_whole_and_split_at_every_byte(void **state) {
    (void)state;
    size_t n = sizeof STREAM - 1;
    for (size_t cut = 0; cut <= n; cut++) {
        lg_sse p = {0};
        events e = {.n = 0};
        assert_true(lg_sse_feed(&p, STREAM, cut, collect, &e));
        assert_true(lg_sse_feed(&p, STREAM + cut, n - cut, collect, &e));
        expect_stream(&e);
        lg_sse_free(&p);
    }
    /* One byte at a time. */
    lg_sse p = {0};
    events e = {.n = 0};
    for (size_t i = 0; i < n; i++) assert_true(lg_sse_feed(&p, STREAM + i, 1, collect, &e));
    expect_stream(&e);
    lg_sse_free(&p);
}

static void test_sse_crlf_split_between_cr_and_lf(void **state) {
    (void)state;
    /* "\r" ends the line; the "\n" arriving in the next read belongs to it. */
    lg_sse p = {0};
    events e = {.n = 0};
    assert_true(lg_sse_feed(&p, "data: x\r", 8, collect, &e));
    assert_true(lg_sse_feed(&p, "\n\r", 2, collect, &e));
    assert_true(lg_sse_feed(&p, "\n", 1, collect, &e));
    assert_int_equal(e.n, 1);
    assert_string_equal(e.got[0], "x");
    lg_sse_free(&p);
}

static void test_sse_stop_and_overlong(void **state) {
    (void)state;
    lg_sse p = {0};
    events e = {.stop_after = 1};
    assert_false(lg_sse_feed(&p, "data: a\n\ndata: b\n\n", 18, collect, &e));
    assert_int_equal(e.n, 1);
    lg_sse_free(&p);
    /* A line past the limit fails, also when it arrives in pieces. */
    size_t big = LG_SSE_MAX_LINE / 4 + 1;
    char *chunk = tk_malloc(big);
    assert_non_null(chunk);
    memset(chunk, 'x', big);
    lg_sse q = {0};
    events f = {.n = 0};
    bool ok = true;
    for (int i = 0; i < 5 && ok; i++) ok = lg_sse_feed(&q, chunk, big, collect, &f);
    assert_false(ok);
    assert_int_equal(f.n, 0);
    lg_sse_free(&q);
    /* Many data lines that add up past the limit fail too. */
    lg_sse r = {0};
    memcpy(chunk, "data: ", 6);
    chunk[big - 1] = '\n';
    ok = true;
    for (int i = 0; i < 5 && ok; i++) ok = lg_sse_feed(&r, chunk, big, collect, &f);
    assert_false(ok);
    lg_sse_free(&r);
    tk_free(chunk);
}

static void test_frame_parse(void **state) {
    (void)state;
    lg_frame f;
    const char *t = "{\"choices\":[{\"index\":0,\"text\":\"Hi\",\"finish_reason\":null}]}";
    lg_frame_parse(t, strlen(t), &f);
    assert_true(f.json_ok && f.has_text && !f.done);
    assert_int_equal(f.finish, TK_FINISH_NONE);
    assert_int_equal(f.completion_tokens, -1);
    t = "{\"choices\":[{\"text\":\"\",\"finish_reason\":\"length\"}],\"usage\":{\"prompt_tokens\":24,"
        "\"completion_tokens\":6}}";
    lg_frame_parse(t, strlen(t), &f);
    assert_false(f.has_text);
    assert_int_equal(f.finish, TK_FINISH_LENGTH);
    assert_int_equal(f.prompt_tokens, 24);
    assert_int_equal(f.completion_tokens, 6);
    t = "{\"choices\":[{\"delta\":{\"reasoning_content\":\"hmm\"}}]}";
    lg_frame_parse(t, strlen(t), &f);
    assert_true(f.has_text);
    t = "{\"choices\":[{\"delta\":{\"role\":\"assistant\",\"content\":\"\"}}]}";
    lg_frame_parse(t, strlen(t), &f);
    assert_false(f.has_text);
    t = "{\"choices\":[],\"usage\":{\"completion_tokens\":-3}}"; /* nonsense counts are unknown */
    lg_frame_parse(t, strlen(t), &f);
    assert_int_equal(f.completion_tokens, -1);
    t = "{\"error\":{\"message\":\"generation failed\",\"type\":\"server_error\"}}";
    lg_frame_parse(t, strlen(t), &f);
    assert_string_equal(f.error, "generation failed");
    lg_frame_parse("[DONE]", 6, &f);
    assert_true(f.done);
    lg_frame_parse("not json", 8, &f);
    assert_false(f.json_ok);
    lg_frame_parse("[1,2]", 5, &f);
    assert_false(f.json_ok);
    t = "{\"choices\":[{\"text\":\"x\",\"finish_reason\":\"stop\"}]}";
    lg_frame_parse(t, strlen(t), &f);
    assert_int_equal(f.finish, TK_FINISH_STOP);
}

static void test_error_kinds(void **state) {
    (void)state;
    bench_errors e = {0};
    bench_errors_add(&e, 429, "queue full");
    bench_errors_add(&e, 429, "later message is not kept");
    bench_errors_add(&e, BENCH_ERR_TRANSPORT, "Couldn't connect");
    assert_int_equal(e.total, 3);
    assert_int_equal(e.n_kinds, 2);
    assert_int_equal(e.kind[0].count, 2);
    assert_string_equal(e.kind[0].message, "queue full");
    for (int s = 500; s < 520; s++) bench_errors_add(&e, s, "x");
    assert_int_equal(e.n_kinds, BENCH_MAX_ERR_KINDS);
    assert_int_equal(e.kind[BENCH_MAX_ERR_KINDS - 1].status, BENCH_ERR_OTHER);
    int sum = 0;
    for (int i = 0; i < e.n_kinds; i++) sum += e.kind[i].count;
    assert_int_equal(sum, e.total);
    char buf[16];
    assert_string_equal(bench_error_kind_name(401, buf, sizeof buf), "401");
    assert_string_equal(bench_error_kind_name(BENCH_ERR_STREAM, buf, sizeof buf), "stream");
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_sse_whole_and_split_at_every_byte),
        cmocka_unit_test(test_sse_crlf_split_between_cr_and_lf),
        cmocka_unit_test(test_sse_stop_and_overlong),
        cmocka_unit_test(test_frame_parse),
        cmocka_unit_test(test_error_kinds),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
