#include "clock.h"

#include <time.h>

#include "tokamak.h"

uint64_t tk_now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

double tk_now_s(void) { return (double)tk_now_ns() * 1e-9; }
