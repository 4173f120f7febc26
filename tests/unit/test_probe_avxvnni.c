/* The int8 peak probe's AVX-VNNI loop (VEX vpdpbusd) and its lane reduction at the production
 * iteration count (the lanes' sum wraps) against scalar arithmetic. Exit 77
 * (skipped by ctest) on a CPU without AVX2 and AVX-VNNI. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h> /* after the headers it needs */

#include "bench/probe.h" /* links tokamak_tools */
#include "unit/probe_check.h"

static void test_probe_int8_avxvnni(void **state) {
    (void)state;
    /* 12 accumulators of 8 lanes, 4 products of 3 * -2 per lane (one vpdpbusd each) */
    assert_int_equal(probe_int8_expect(TK_ISA_AVXVNNI, 1), (uint32_t)(12 * 8 * -24));
    probe_check_level(TK_ISA_AVXVNNI);
}

int main(void) {
    int skip = probe_skip_without(TK_ISA_AVXVNNI);
    if (skip) return skip;
    const struct CMUnitTest tests[] = {cmocka_unit_test(test_probe_int8_avxvnni)};
    return cmocka_run_group_tests(tests, NULL, NULL);
}
