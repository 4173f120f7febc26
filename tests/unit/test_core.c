/* Core utilities: dtype conversions, checked arithmetic, the pool and its barrier. */
#include <math.h>
#include <sched.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include <cmocka.h>

#include "core/alloc.h"
#include "core/checked.h"
#include "core/dtype.h"
#include "core/error.h"
#include "core/pool.h"

static void test_core_f16_roundtrip(void **state) {
    (void)state;
    /* Every finite half converts to float and back exactly. */
    for (uint32_t h = 0; h < 0x10000; h++) {
        if ((h & 0x7c00) == 0x7c00) continue;
        float f = tk_f16_to_f32((tk_f16)h);
        assert_int_equal(tk_f32_to_f16(f), h);
    }
    assert_true(tk_f16_to_f32(tk_f32_to_f16(1.0f)) == 1.0f);
    assert_true(tk_f16_to_f32(tk_f32_to_f16(65520.0f)) == INFINITY);
    assert_int_equal(tk_f32_to_f16(1.0f + 1.0f / 2048), 0x3c00); /* tie to even */
}

static void test_core_bf16_rounding(void **state) {
    (void)state;
    assert_int_equal(tk_f32_to_bf16(1.0f), 0x3f80);
    assert_true(tk_bf16_to_f32(tk_f32_to_bf16(3.140625f)) == 3.140625f);
    assert_true(isnan(tk_bf16_to_f32(tk_f32_to_bf16(NAN))));
}

static void test_core_dtype_rows(void **state) {
    (void)state;
    uint64_t b;
    assert_true(dtype_row_bytes(TK_DTYPE_Q8_0, 64, &b));
    assert_int_equal(b, 68);
    assert_false(dtype_row_bytes(TK_DTYPE_Q8_0, 33, &b));
    assert_false(dtype_row_bytes(TK_DTYPE_F32, UINT64_MAX / 2, &b));
    assert_false(dtype_row_bytes((tk_dtype)99, 32, &b));
    assert_int_equal(dtype_from_name("q4_k"), TK_DTYPE_Q4_K);
    assert_int_equal(dtype_from_name("q5_0"), -1);
    assert_true(dtype_known(13) && !dtype_supported(13));
}

static void test_core_checked(void **state) {
    (void)state;
    uint64_t r;
    assert_false(tk_mul_u64(UINT64_MAX, 2, &r));
    assert_true(tk_add_u64(1, 2, &r) && r == 3);
    assert_true(tk_range_ok(10, 0, 10));
    assert_false(tk_range_ok(11, 0, 10));
    assert_false(tk_range_ok(5, UINT64_MAX, 10));
}

typedef struct {
    tk_pool *p;
    long sum[8];
    int rounds;
} pool_ctx;

static void pool_fn(void *arg, int ith, int nth) {
    pool_ctx *c = arg;
    for (int r = 0; r < c->rounds; r++) {
        c->sum[ith] += r;
        pool_barrier(c->p);
        /* after the barrier every thread sees every other's write */
        long total = 0;
        for (int i = 0; i < nth; i++) total += c->sum[i];
        assert_int_equal(total, (long)nth * (r * (r + 1) / 2));
        pool_barrier(c->p);
    }
}

static void test_core_pool_barrier(void **state) {
    (void)state;
    for (int n = 1; n <= 4; n++) {
        tk_pool *p;
        assert_int_equal(pool_init(n, false, &p), TK_OK);
        for (int rep = 0; rep < 3; rep++) {
            pool_ctx c = {.p = p, .rounds = 200};
            pool_run(p, pool_fn, &c);
        }
        pool_free(p);
    }
}

/* pool_open_allowed: a thread per CPU the process may use, at most max; NULL
 * (no error left) for one, and pool_run_here then runs on the caller. */
static void count_fn(void *arg, int ith, int nth) {
    int *seen = arg; /* seen[0]: threads; seen[1 + ith]: ith ran */
    seen[1 + ith] = nth;
    if (ith == 0) seen[0] = nth;
}
static void test_core_pool_open_allowed(void **state) {
    (void)state;
    cpu_set_t all, one;
    assert_int_equal(sched_getaffinity(0, sizeof all, &all), 0);
    tk_error_clear();
    int seen[1 + 16] = {0};
    tk_pool *p = pool_open_allowed(1);
    assert_null(p);
    pool_run_here(p, count_fn, seen);
    assert_int_equal(seen[0], 1);
    CPU_ZERO(&one);
    for (int c = 0; c < CPU_SETSIZE; c++)
        if (CPU_ISSET(c, &all)) {
            CPU_SET(c, &one);
            break;
        }
    assert_int_equal(sched_setaffinity(0, sizeof one, &one), 0);
    p = pool_open_allowed(16);
    assert_int_equal(sched_setaffinity(0, sizeof all, &all), 0);
    assert_null(p);
    assert_string_equal(tk_last_error(), "");
    const int n = CPU_COUNT(&all) < 3 ? CPU_COUNT(&all) : 3;
    p = pool_open_allowed(3);
    if (n < 2) {
        assert_null(p);
        return;
    }
    assert_non_null(p);
    memset(seen, 0, sizeof seen);
    pool_run_here(p, count_fn, seen);
    assert_int_equal(seen[0], n);
    for (int i = 0; i < n; i++) assert_int_equal(seen[1 + i], n);
    pool_free(p);
}

/* Where each thread of a pool_init_cpus pool runs. */
typedef struct cpu_ctx {
    int cpu[8];
} cpu_ctx;

static void where_fn(void *ctx, int ith, int nth) {
    (void)nth;
    ((cpu_ctx *)ctx)->cpu[ith] = sched_getcpu();
}

static void test_core_pool_cpus(void **state) {
    (void)state;
    int cpus[16], n = 0;
    assert_int_equal(pool_parse_cpus("0-3,8,10-11", cpus, 16, &n), TK_OK);
    int want[] = {0, 1, 2, 3, 8, 10, 11};
    assert_int_equal(n, 7);
    assert_memory_equal(cpus, want, sizeof want);
    assert_int_equal(pool_parse_cpus("5", cpus, 16, &n), TK_OK);
    assert_int_equal(n, 1);
    assert_int_equal(cpus[0], 5);
    const char *bad[] = {"", "x", "1,", ",1", "3-1", "1-", "1,1", "0-2,2", "1 2", "99999", "0-20"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        assert_int_equal(pool_parse_cpus(bad[i], cpus, 16, &n), TK_ERR_INVALID);
        assert_non_null(strstr(tk_last_error(), "cpus"));
    }
    /* the CPUs this process may use: every thread lands on its listed CPU */
    cpu_set_t mine;
    assert_int_equal(sched_getaffinity(0, sizeof mine, &mine), 0);
    int allowed[8], na = 0, not_allowed = -1;
    for (int c = 0; c < CPU_SETSIZE; c++) {
        if (CPU_ISSET(c, &mine) && na < 8) allowed[na++] = c;
        if (!CPU_ISSET(c, &mine) && not_allowed < 0) not_allowed = c;
    }
    assert_true(na >= 1);
    int list[2] = {allowed[na - 1], allowed[0]};
    tk_pool *p;
    assert_int_equal(pool_init_cpus(3, list, 2, &p), TK_OK);
    cpu_ctx c = {{-1, -1, -1}};
    pool_run(p, where_fn, &c);
    pool_free(p);
    assert_int_equal(c.cpu[0], list[0]);
    assert_int_equal(c.cpu[1], list[1]);
    assert_int_equal(c.cpu[2], list[0]);                           /* cycling */
    assert_int_equal(sched_setaffinity(0, sizeof mine, &mine), 0); /* thread 0 was the caller */
    if (not_allowed >= 0) {
        int bad_cpu[1] = {not_allowed};
        assert_int_equal(pool_init_cpus(2, bad_cpu, 1, &p), TK_ERR_INVALID);
        assert_non_null(strstr(tk_last_error(), "cpu"));
        assert_int_equal(sched_setaffinity(0, sizeof mine, &mine), 0);
    }
    assert_int_equal(pool_init_cpus(2, NULL, 0, &p), TK_ERR_INVALID);
}

static void test_core_split(void **state) {
    (void)state;
    long covered = 0, prev = 0;
    for (int i = 0; i < 3; i++) {
        long lo, hi;
        pool_split(100, i, 3, 8, &lo, &hi);
        assert_int_equal(lo, prev);
        assert_true(lo % 8 == 0);
        covered += hi - lo;
        prev = hi;
    }
    assert_int_equal(covered, 100);
}

static void test_core_alloc_counts(void **state) {
    (void)state;
    uint64_t before = tk_alloc_live_bytes();
    void *a = tk_malloc(1000), *b = tk_alloc_aligned(5000, 64);
    unsigned char *c = tk_alloc_aligned_raw(70000, 256);
    assert_non_null(a);
    assert_non_null(b);
    assert_non_null(c);
    assert_true(((uintptr_t)b & 63) == 0);
    assert_true(((uintptr_t)c & 255) == 0);
    for (size_t i = 0; i < 5000; i++) assert_int_equal(((unsigned char *)b)[i], 0);
    memset(c, 0x5a, 70000); /* the raw buffer's whole length is writable */
    assert_true(tk_alloc_live_bytes() >= before + 76000);
    tk_free(a);
    tk_free_aligned(b);
    tk_free_aligned(c);
    assert_int_equal(tk_alloc_live_bytes(), before);
    assert_null(tk_alloc_aligned_raw(0, 64));
    assert_null(tk_alloc_aligned_raw(64, 96)); /* not a power of two */
    assert_null(tk_calloc(SIZE_MAX / 2, 4));
}

/* Huge-page regions: 2 MiB aligned, zeroed, writable to the rounded-up end,
 * counted while held, with and without touching every page up front. */
static void test_core_alloc_huge(void **state) {
    (void)state;
    const size_t mib2 = (size_t)2 << 20;
    uint64_t before = tk_alloc_live_bytes();
    for (int touch = 0; touch <= 1; touch++) {
        size_t n = 3 * mib2 + 1000;
        unsigned char *p = tk_alloc_huge(n, touch);
        assert_non_null(p);
        assert_true((uintptr_t)p % mib2 == 0);
        assert_int_equal(tk_alloc_live_bytes(), before + 4 * mib2);
        for (size_t i = 0; i < 4 * mib2; i += 4093) assert_int_equal(p[i], 0);
        p[4 * mib2 - 1] = 7;
        tk_free_huge(p, n);
        assert_int_equal(tk_alloc_live_bytes(), before);
    }
    assert_null(tk_alloc_huge(0, 1));
    assert_null(tk_alloc_huge(SIZE_MAX, 0));
    tk_free_huge(NULL, 5);
}

static void test_core_error_message(void **state) {
    (void)state;
    assert_int_equal(tk_fail(TK_ERR_FORMAT, "field %s = %d", "x", 5), TK_ERR_FORMAT);
    tk_error_prefix("file.gguf");
    assert_string_equal(tk_last_error(), "file.gguf: field x = 5");
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_core_f16_roundtrip), cmocka_unit_test(test_core_bf16_rounding),
        cmocka_unit_test(test_core_dtype_rows),    cmocka_unit_test(test_core_checked),
        cmocka_unit_test(test_core_pool_barrier),  cmocka_unit_test(test_core_split),
        cmocka_unit_test(test_core_pool_cpus),     cmocka_unit_test(test_core_pool_open_allowed),
        cmocka_unit_test(test_core_alloc_counts),  cmocka_unit_test(test_core_alloc_huge),
        cmocka_unit_test(test_core_error_message),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
