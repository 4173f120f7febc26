/* Shared by the int8 probe tests (test_probe*.c): one level's loop against
 * probe_int8_expect, at tiny counts and at the count probe_peak_gops_int8
 * runs, where every level's lanes or their sum wrap. */
#ifndef TK_TEST_PROBE_CHECK_H
#define TK_TEST_PROBE_CHECK_H

#include <stdio.h>

#include "bench/probe.h"
#include "core/cpu.h"

#define PROBE_PROD_ITERS 16000000L

static inline void probe_check_level(tk_isa isa) {
    for (long iters = 0; iters <= 3; iters++)
        assert_int_equal(probe_int8_pass(isa, iters), probe_int8_expect(isa, iters));
    assert_int_equal(probe_int8_pass(isa, PROBE_PROD_ITERS), probe_int8_expect(isa, PROBE_PROD_ITERS));
}

/* 77 (ctest's SKIP_RETURN_CODE) with a message when the CPU lacks isa, else 0. */
static inline int probe_skip_without(tk_isa isa) {
    tk_cpu c;
    cpu_detect(&c);
    if (cpu_has_isa(&c, isa)) return 0;
    fprintf(stderr, "SKIP: this CPU lacks %s, so its int8 probe loop cannot run here\n", cpu_isa_name(isa));
    return 77;
}

#endif
