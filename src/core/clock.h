#ifndef TK_CORE_CLOCK_H
#define TK_CORE_CLOCK_H

#include <stdint.h>

/* Monotonic nanoseconds; tk_now_s() (public) is the same clock in seconds. */
uint64_t tk_now_ns(void);

#endif
