/* The thread pool: created once per engine, runs one function on every thread
 * (the caller is thread 0) and offers a barrier inside it. Kernels split their
 * own rows by (ith, nth); nothing here allocates after pool_init. */
#ifndef TK_CORE_POOL_H
#define TK_CORE_POOL_H

#include <stdbool.h>

#include "tokamak.h"

#include <sched.h>

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#endif

/* One turn of a spin-wait: the CPU's pause hint where it has one. */
static inline void pool_pause(void) {
#if defined(__x86_64__) || defined(__i386__)
    _mm_pause();
#endif
}

/* One turn of a wait on another pool thread (*spins counts the turns): a
 * pause, and every 4,096th turn the core given up, for when there are more
 * threads than cores (CI, tests) and the one waited on needs it. */
static inline void pool_spin(unsigned *spins) {
    pool_pause();
    if (++*spins % 4096 == 0) sched_yield();
}

typedef struct tk_pool tk_pool;
typedef void (*tk_pool_fn)(void *ctx, int ith, int nth);

/* n_threads >= 1 (0 = one per online core). pin: bind thread i to CPU i. */
tk_status pool_init(int n_threads, bool pin, tk_pool **out);
/* As pool_init, with thread i bound to cpus[i % n_cpus] (n_cpus > 0; the
 * caller is thread 0). A CPU the process may not run on is an error. */
tk_status pool_init_cpus(int n_threads, const int *cpus, int n_cpus, tk_pool **out);

/* A pool with a thread for each CPU this process may run on (its affinity
 * mask: the CPUs the user left it, taskset), at most max; NULL where that is
 * one thread or no pool can start (no error is left set): pool_run_here then
 * runs the work on the caller. For one-off work at load or in tools. */
tk_pool *pool_open_allowed(int max);
/* pool_run(p, fn, ctx), or fn(ctx, 0, 1) on the caller when p is NULL. */
void pool_run_here(tk_pool *p, tk_pool_fn fn, void *ctx);

/* Parse a CPU list ("0-3,8,10-11": ids and inclusive ranges, each CPU once)
 * into cpus[0, *n) in the order written; at most max. TK_ERR_INVALID with a
 * message naming the list on bad syntax, a repeat or more than max CPUs. */
tk_status pool_parse_cpus(const char *list, int *cpus, int max, int *n);
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
