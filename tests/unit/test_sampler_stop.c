/* Stop strings over streamed text: matches across pushes, held-back text,
 * nothing of the stop string or after it ever emitted. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include <cmocka.h>

#include "engine/stop.h"

/* Push pieces one by one; return the concatenated output and whether it stopped. */
static bool run(const char *const *stops, int n, const char *const *pieces, char *out) {
    stop_matcher *m;
    assert_int_equal(stop_init(stops, n, 32, &m), TK_OK);
    size_t o = 0;
    bool hit = false;
    char buf[128];
    for (int i = 0; pieces[i]; i++) {
        size_t k;
        assert_true(stop_out_bound(m) <= sizeof buf);
        hit = stop_push(m, pieces[i], strlen(pieces[i]), buf, &k);
        memcpy(out + o, buf, k);
        o += k;
        if (hit) break;
    }
    if (!hit) o += stop_flush(m, out + o);
    out[o] = 0;
    stop_free(m);
    return hit;
}

static void test_sampler_stop_spans_tokens(void **state) {
    (void)state;
    char out[256];
    const char *st[] = {"</end>", "STOP"};
    const char *p1[] = {"hello <", "/e", "nd> more", NULL};
    assert_true(run(st, 2, p1, out));
    assert_string_equal(out, "hello ");
    const char *p2[] = {"ST", "O", "P", NULL};
    assert_true(run(st, 2, p2, out));
    assert_string_equal(out, "");
    /* A false start is released once it cannot match any more. */
    const char *p3[] = {"a </e", "x", "yz", NULL};
    assert_false(run(st, 2, p3, out));
    assert_string_equal(out, "a </exyz");
    /* Held text at the end is flushed. */
    const char *p4[] = {"abc S", "TO", NULL};
    assert_false(run(st, 2, p4, out));
    assert_string_equal(out, "abc STO");
    /* The earliest match wins among several stop strings. */
    const char *p5[] = {"xSTOP</end>", NULL};
    assert_true(run(st, 2, p5, out));
    assert_string_equal(out, "x");
    /* No stop strings: passthrough. */
    const char *p6[] = {"a", "b", NULL};
    assert_false(run(NULL, 0, p6, out));
    assert_string_equal(out, "ab");
}

static void test_sampler_stop_holds_exactly_prefix(void **state) {
    (void)state;
    stop_matcher *m;
    const char *st[] = {"abcab"};
    assert_int_equal(stop_init(st, 1, 8, &m), TK_OK);
    char buf[32];
    size_t k;
    assert_false(stop_push(m, "xxabca", 6, buf, &k));
    assert_int_equal(k, 2); /* "abca" could still become "abcab" */
    assert_false(stop_push(m, "xy", 2, buf, &k));
    assert_int_equal(k, 6); /* "abcaxy" cannot match any more */
    assert_false(stop_push(m, "yabc", 4, buf, &k));
    assert_int_equal(k, 1);
    assert_true(stop_push(m, "abq", 3, buf, &k)); /* "abcabq": matched across pushes */
    assert_int_equal(k, 0);
    assert_true(stop_push(m, "zz", 2, buf, &k)); /* stays stopped */
    assert_int_equal(k, 0);
    stop_free(m);
    const char *bad[] = {""};
    assert_int_equal(stop_init(bad, 1, 8, &m), TK_ERR_INVALID);
    stop_free(NULL);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_sampler_stop_spans_tokens),
        cmocka_unit_test(test_sampler_stop_holds_exactly_prefix),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
