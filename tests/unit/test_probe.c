/* The int8 peak probe's lane reduction and loops: the portable fold against a
 * 64-bit reference on extreme lane values, and the scalar loop at the
 * production iteration count (its lanes wrap) against the result scalar
 * arithmetic predicts. The SIMD loops have one test per level
 * (test_probe_avx2, test_probe_avx512), which ctest reports as skipped on a
 * CPU without that level. And the real-time throttle check, in and out of
 * a real-time class. */
#include <pthread.h>
#include <sched.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include <cmocka.h> /* after the headers it needs */

#include "bench/probe.h"
#include "core/cpu.h"

/* The sum modulo 2^32 through 64-bit integers (no lane count here can overflow them). */
static uint32_t fold_ref(const int32_t *lanes, int n) {
    int64_t s = 0;
    for (int k = 0; k < n; k++) s += lanes[k];
    return (uint32_t)((uint64_t)s & 0xffffffffu);
}

static void test_probe_lanes_sum_extremes(void **state) {
    (void)state;
    int32_t lanes[16];
    const int32_t fills[] = {INT32_MAX, INT32_MIN, -1, 1, 0, INT32_MAX - 7, INT32_MIN + 3};
    for (size_t f = 0; f < sizeof fills / sizeof fills[0]; f++) {
        for (int k = 0; k < 16; k++) lanes[k] = fills[f];
        for (int n = 0; n <= 16; n++) assert_int_equal(probe_lanes_sum(lanes, n), fold_ref(lanes, n));
    }
    for (int k = 0; k < 16; k++)
        lanes[k] = k % 2 ? INT32_MIN : INT32_MAX; /* alternating: sums cross both ends */
    assert_int_equal(probe_lanes_sum(lanes, 16), fold_ref(lanes, 16));
    assert_int_equal(probe_lanes_sum(lanes, 15), fold_ref(lanes, 15));
    uint64_t x = 0x9e3779b97f4a7c15ull; /* pseudo-random lanes */
    for (int rep = 0; rep < 1000; rep++) {
        for (int k = 0; k < 16; k++) {
            x ^= x << 13, x ^= x >> 7, x ^= x << 17;
            lanes[k] = (int32_t)(uint32_t)x;
        }
        assert_int_equal(probe_lanes_sum(lanes, 16), fold_ref(lanes, 16));
    }
    /* The AVX-512 loop's lanes after the production run: 12 accumulators of
     * -24 * 16e6 each, summed: far past INT32_MIN. */
    for (int k = 0; k < 16; k++) lanes[k] = (int32_t)(uint32_t)(12LL * -24 * 16000000LL);
    assert_int_equal(probe_lanes_sum(lanes, 16), fold_ref(lanes, 16));
}

#include "unit/probe_check.h"

static void test_probe_int8_scalar(void **state) {
    (void)state;
    assert_int_equal(probe_int8_expect(TK_ISA_SCALAR, 1), (uint32_t)-952); /* sum (k+1)(3-k), k < 16 */
    probe_check_level(TK_ISA_SCALAR);
}

/* The BF16 dot peak: probed where the kernels' level is avx512 and the CPU
 * has AVX512-BF16 (a positive rate), 0 elsewhere (TOKAMAK_ISA below avx512
 * included), never a guess. */
static void test_probe_bf16_where_present(void **state) {
    (void)state;
    tk_cpu c;
    cpu_detect(&c);
    const double g = probe_peak_gflops_bf16(1);
    if (c.avx512bf16 && cpu_isa_from_env(&c) == TK_ISA_AVX512)
        assert_true(g > 0);
    else
        assert_true(g == 0);
    print_message("bf16 dot peak, one thread: %.0f GFLOP/s\n", g);
}

/* The integer in a /proc file, or -2 when it cannot be read. */
static long proc_value(const char *path) {
    FILE *f = fopen(path, "r");
    long v = -2;
    if (f) {
        if (fscanf(f, "%ld", &v) != 1) v = -2;
        fclose(f);
    }
    return v;
}

/* probe_rt_throttled: false and zeros at normal priority; in SCHED_FIFO
 * (where this process may enter it) exactly the kernel's throttle, or false
 * when the kernel runs real-time threads unthrottled (runtime -1). */
static void test_probe_rt_throttle(void **state) {
    (void)state;
    int rt = 7, per = 7;
    assert_false(probe_rt_throttled(&rt, &per));
    assert_int_equal(rt, 0);
    assert_int_equal(per, 0);
    struct sched_param sp;
    memset(&sp, 0, sizeof sp);
    sp.sched_priority = 1;
    if (pthread_setschedparam(pthread_self(), SCHED_FIFO, &sp) != 0) {
        print_message("real-time class not permitted here: its half not run\n");
        return;
    }
    const bool on = probe_rt_throttled(&rt, &per);
    sp.sched_priority = 0;
    assert_int_equal(pthread_setschedparam(pthread_self(), SCHED_OTHER, &sp), 0);
    const long krt = proc_value("/proc/sys/kernel/sched_rt_runtime_us");
    const long kper = proc_value("/proc/sys/kernel/sched_rt_period_us");
    print_message("SCHED_FIFO: throttled %d (%d of %d us; kernel %ld of %ld)\n", on, rt, per, krt, kper);
    if (krt >= 0 && kper > 0 && krt < kper) {
        assert_true(on);
        assert_int_equal(rt, krt);
        assert_int_equal(per, kper);
    } else {
        assert_false(on);
        assert_int_equal(rt, 0);
    }
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_probe_lanes_sum_extremes),
        cmocka_unit_test(test_probe_int8_scalar),
        cmocka_unit_test(test_probe_bf16_where_present),
        cmocka_unit_test(test_probe_rt_throttle),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
