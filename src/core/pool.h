/* The thread pool: created once per engine, runs one function on every thread
 * (the caller is thread 0) and offers a barrier inside it. Kernels split their
 * own rows by (ith, nth); nothing here allocates after pool_init. */
#ifndef TK_CORE_POOL_H
#define TK_CORE_POOL_H

#include <stdbool.h>

#include "tokamak.h"

typedef struct tk_pool tk_pool;
typedef void (*tk_pool_fn)(void *ctx, int ith, int nth);

/* n_threads >= 1 (0 = one per online core). pin: bind thread i to CPU i. */
tk_status pool_init(int n_threads, bool pin, tk_pool **out);
void pool_free(tk_pool *p);
int pool_size(const tk_pool *p);
/* Run fn(ctx, ith, nth) on all threads; returns when every thread has returned.
 * Not re-entrant: one pool_run at a time per pool. */
void pool_run(tk_pool *p, tk_pool_fn fn, void *ctx);
/* Inside fn: wait until every thread of this run has arrived. */
void pool_barrier(tk_pool *p);
/* Barriers passed since pool_init (for profiling the plan). */
unsigned long pool_barrier_count(const tk_pool *p);

/* Split n items over nth threads: [*lo, *hi) for thread ith, in multiples of align. */
static inline void pool_split(long n, int ith, int nth, long align, long *lo, long *hi) {
    long chunks = (n + align - 1) / align;
    long a = chunks * ith / nth, b = chunks * (ith + 1) / nth;
    *lo = a * align < n ? a * align : n;
    *hi = b * align < n ? b * align : n;
}

#endif
