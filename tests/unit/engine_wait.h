/* Waiting on an engine from a test: sleeps, and "until n requests finished"
 * (failing the test after 400 s). Include after cmocka.h. */
#ifndef TK_TEST_ENGINE_WAIT_H
#define TK_TEST_ENGINE_WAIT_H

#include <stdint.h>
#include <time.h>

#include "tokamak.h"

static inline void sleep_us(long us) {
    struct timespec ts = {us / 1000000, (us % 1000000) * 1000L};
    nanosleep(&ts, NULL);
}

static inline void sleep_ms(int ms) { sleep_us(ms * 1000L); }

static inline void wait_finished(tk_engine *e, uint64_t n) {
    for (int i = 0; i < 2000000; i++) {
        tk_engine_stats s;
        tk_engine_stats_get(e, &s);
        if (s.requests_finished >= n) return;
        sleep_us(200);
    }
    fail_msg("engine did not finish %llu requests", (unsigned long long)n);
}

#endif
