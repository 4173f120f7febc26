#include "pool.h"

#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdint.h>
#include <unistd.h>

#include "alloc.h"
#include "error.h"
#include "log.h"

/* Workers spin on `gen` for a while after each run (a decode step follows the
 * last one within microseconds), then sleep on the condition variable so an
 * idle engine costs no CPU. The barrier is a sense-reversing spin barrier. */
#define SPIN_BEFORE_SLEEP 200000

typedef struct worker {
    tk_pool *pool;
    int ith;
    pthread_t tid;
} worker;

struct tk_pool {
    int n;
    worker *workers;
    tk_pool_fn fn;
    void *ctx;
    _Atomic unsigned gen; /* bumped by pool_run to start a run */
    _Atomic int done;     /* workers finished with the current run */
    _Atomic int stop;
    _Atomic int sleepers;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    /* barrier */
    _Atomic int bar_count;
    _Atomic unsigned bar_sense;
    _Atomic unsigned long bar_passed;
};

/* Bind thread t to cpu; false when the system refuses. */
static bool pin_thread(pthread_t t, int cpu) {
    if (cpu < 0 || cpu >= CPU_SETSIZE) return false;
    cpu_set_t set;
    CPU_ZERO(&set);
    CPU_SET(cpu, &set);
    return pthread_setaffinity_np(t, sizeof set, &set) == 0;
}

static void *worker_main(void *arg) {
    worker *w = arg;
    tk_pool *p = w->pool;
    unsigned seen = 0;
    for (;;) {
        unsigned g;
        int spins = 0;
        while ((g = atomic_load_explicit(&p->gen, memory_order_acquire)) == seen && !atomic_load(&p->stop)) {
            if (++spins < SPIN_BEFORE_SLEEP) {
                pool_pause();
                continue;
            }
            pthread_mutex_lock(&p->mu);
            atomic_fetch_add(&p->sleepers, 1);
            while (atomic_load(&p->gen) == seen && !atomic_load(&p->stop)) pthread_cond_wait(&p->cv, &p->mu);
            atomic_fetch_sub(&p->sleepers, 1);
            pthread_mutex_unlock(&p->mu);
            spins = 0;
        }
        if (atomic_load(&p->stop)) break;
        seen = g;
        p->fn(p->ctx, w->ith, p->n);
        atomic_fetch_add_explicit(&p->done, 1, memory_order_release);
    }
    return NULL;
}

/* cpus: NULL (no pinning, or thread i on CPU i with pin) or n_cpus CPUs. */
static tk_status pool_start(int n_threads, bool pin, const int *cpus, int n_cpus, tk_pool **out) {
    *out = NULL;
    if (n_threads <= 0) {
        long c = sysconf(_SC_NPROCESSORS_ONLN);
        n_threads = c > 0 ? (int)c : 1;
    }
    if (n_threads > 1024) return tk_fail(TK_ERR_INVALID, "threads %d: at most 1024", n_threads);
    tk_pool *p = tk_calloc(1, sizeof *p);
    if (!p) return tk_fail(TK_ERR_NOMEM, "pool: out of memory");
    p->n = n_threads;
    pthread_mutex_init(&p->mu, NULL);
    pthread_cond_init(&p->cv, NULL);
    if (n_threads > 1) {
        p->workers = tk_calloc((size_t)n_threads, sizeof *p->workers);
        if (!p->workers) {
            pool_free(p);
            return tk_fail(TK_ERR_NOMEM, "pool: out of memory");
        }
    }
    if (cpus && !pin_thread(pthread_self(), cpus[0])) {
        pool_free(p);
        return tk_fail(TK_ERR_INVALID, "pool: cannot run a thread on cpu %d (not one this process may use)",
                       cpus[0]);
    }
    if (!cpus && pin && !pin_thread(pthread_self(), 0)) tk_log_warn("pool: could not pin a thread to cpu 0");
    for (int i = 1; i < n_threads; i++) {
        worker *w = &p->workers[i];
        w->pool = p;
        w->ith = i;
        if (pthread_create(&w->tid, NULL, worker_main, w) != 0) {
            p->n = i; /* stop what started */
            pool_free(p);
            return tk_fail(TK_ERR_NOMEM, "pool: cannot create thread %d", i);
        }
        if (cpus && !pin_thread(w->tid, cpus[i % n_cpus])) {
            p->n = i + 1;
            pool_free(p);
            return tk_fail(TK_ERR_INVALID,
                           "pool: cannot run a thread on cpu %d (not one this process may use)",
                           cpus[i % n_cpus]);
        }
        if (!cpus && pin) pin_thread(w->tid, i % CPU_SETSIZE);
    }
    *out = p;
    return TK_OK;
}

tk_status pool_init(int n_threads, bool pin, tk_pool **out) {
    return pool_start(n_threads, pin, NULL, 0, out);
}

tk_pool *pool_open_allowed(int max) {
    cpu_set_t set;
    int n = sched_getaffinity(0, sizeof set, &set) == 0 ? CPU_COUNT(&set) : 1;
    if (n > max) n = max;
    tk_pool *p = NULL;
    if (n <= 1) return NULL;
    if (pool_init(n, false, &p) != TK_OK) {
        tk_error_clear(); /* no pool: the caller does the work */
        return NULL;
    }
    return p;
}

void pool_run_here(tk_pool *p, tk_pool_fn fn, void *ctx) {
    if (p)
        pool_run(p, fn, ctx);
    else
        fn(ctx, 0, 1);
}

tk_status pool_init_cpus(int n_threads, const int *cpus, int n_cpus, tk_pool **out) {
    if (!cpus || n_cpus <= 0) return tk_fail(TK_ERR_INVALID, "pool: no CPUs to run on");
    return pool_start(n_threads, true, cpus, n_cpus, out);
}

static bool parse_id(const char **s, int *v) {
    const char *c = *s;
    long x = 0;
    if (*c < '0' || *c > '9') return false;
    while (*c >= '0' && *c <= '9') {
        x = x * 10 + (*c++ - '0');
        if (x >= CPU_SETSIZE) return false;
    }
    *v = (int)x;
    *s = c;
    return true;
}

tk_status pool_parse_cpus(const char *list, int *cpus, int max, int *n) {
    *n = 0;
    if (!list || !*list) return tk_fail(TK_ERR_INVALID, "cpus: empty list");
    cpu_set_t seen;
    CPU_ZERO(&seen);
    for (const char *c = list;;) {
        int a, b;
        if (!parse_id(&c, &a))
            return tk_fail(TK_ERR_INVALID, "cpus '%s': expected a CPU id below %d at '%s'", list, CPU_SETSIZE,
                           c);
        b = a;
        if (*c == '-') {
            c++;
            if (!parse_id(&c, &b) || b < a)
                return tk_fail(TK_ERR_INVALID, "cpus '%s': a range wants LO-HI with LO <= HI", list);
        }
        for (int x = a; x <= b; x++) {
            if (CPU_ISSET(x, &seen))
                return tk_fail(TK_ERR_INVALID, "cpus '%s': cpu %d listed twice", list, x);
            if (*n == max) return tk_fail(TK_ERR_INVALID, "cpus '%s': more than %d CPUs", list, max);
            CPU_SET(x, &seen);
            cpus[(*n)++] = x;
        }
        if (*c == 0) break;
        if (*c != ',') return tk_fail(TK_ERR_INVALID, "cpus '%s': unexpected '%c'", list, *c);
        c++;
    }
    return TK_OK;
}

void pool_free(tk_pool *p) {
    if (!p) return;
    atomic_store(&p->stop, 1);
    pthread_mutex_lock(&p->mu);
    pthread_cond_broadcast(&p->cv);
    pthread_mutex_unlock(&p->mu);
    for (int i = 1; i < p->n; i++) pthread_join(p->workers[i].tid, NULL);
    pthread_mutex_destroy(&p->mu);
    pthread_cond_destroy(&p->cv);
    tk_free(p->workers);
    tk_free(p);
}

int pool_size(const tk_pool *p) { return p->n; }

void pool_run(tk_pool *p, tk_pool_fn fn, void *ctx) {
    if (p->n == 1) {
        fn(ctx, 0, 1);
        return;
    }
    p->fn = fn;
    p->ctx = ctx;
    atomic_store_explicit(&p->done, 0, memory_order_relaxed);
    atomic_fetch_add_explicit(&p->gen, 1, memory_order_release);
    if (atomic_load(&p->sleepers) > 0) {
        pthread_mutex_lock(&p->mu);
        pthread_cond_broadcast(&p->cv);
        pthread_mutex_unlock(&p->mu);
    }
    fn(ctx, 0, p->n);
    while (atomic_load_explicit(&p->done, memory_order_acquire) != p->n - 1) pool_pause();
}

void pool_barrier(tk_pool *p) {
    if (p->n == 1) return;
    unsigned sense = atomic_load_explicit(&p->bar_sense, memory_order_relaxed);
    if (atomic_fetch_add_explicit(&p->bar_count, 1, memory_order_acq_rel) == p->n - 1) {
        atomic_store_explicit(&p->bar_count, 0, memory_order_relaxed);
        atomic_fetch_add_explicit(&p->bar_passed, 1, memory_order_relaxed);
        atomic_store_explicit(&p->bar_sense, sense + 1, memory_order_release);
    } else {
        unsigned spins = 0;
        while (atomic_load_explicit(&p->bar_sense, memory_order_acquire) == sense) pool_spin(&spins);
    }
}

unsigned long pool_barrier_count(const tk_pool *p) { return atomic_load(&p->bar_passed); }
