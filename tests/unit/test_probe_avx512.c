/* The int8 peak probe's AVX-512 VNNI loop and its lane reduction at the production
 * iteration count (the lanes' sum wraps) against scalar arithmetic. Exit 77
 * (skipped by ctest) on a CPU without AVX-512 VNNI. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h> /* after the headers it needs */

#include "bench/probe.h" /* links tokamak_tools */
#include "unit/probe_check.h"

static void test_probe_int8_avx512(void **state) {
    (void)state;
    /* 12 accumulators of 16 lanes, 4 products of 3 * -2 per lane (vpdpbusd) */
    assert_int_equal(probe_int8_expect(TK_ISA_AVX512, 1), (uint32_t)(12 * 16 * -24));
    probe_check_level(TK_ISA_AVX512);
}

int main(void) {
    int skip = probe_skip_without(TK_ISA_AVX512);
    if (skip) return skip;
    const struct CMUnitTest tests[] = {cmocka_unit_test(test_probe_int8_avx512)};
    return cmocka_run_group_tests(tests, NULL, NULL);
}
