/* NUMA placement with libnuma (see numa.h); without it, every call is inert. */
#include "core/numa.h"

#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "core/error.h"

#if defined(TK_HAVE_NUMA)
#include <numa.h>
#include <numaif.h>
#endif

static void say(char *why, size_t n, const char *msg) {
    if (why && n) snprintf(why, n, "%s", msg);
}

tk_status tk_numa_init(const int *cpus, int n_cpus, tk_numa *out, char *why, size_t why_len) {
    memset(out, 0, sizeof *out);
    say(why, why_len, "");
#if defined(TK_HAVE_NUMA)
    if (numa_available() < 0) {
        say(why, why_len, "the kernel has no NUMA support");
        return TK_OK;
    }
    if (numa_num_configured_nodes() < 2) {
        say(why, why_len, "one NUMA node");
        out->n_nodes = 1;
        return TK_OK;
    }
    struct bitmask *bm = numa_allocate_nodemask();
    if (!bm) return tk_fail(TK_ERR_NOMEM, "numa: out of memory");
    if (!cpus) {
        copy_bitmask_to_bitmask(numa_all_nodes_ptr, bm);
    } else {
        for (int i = 0; i < n_cpus; i++) {
            int node = numa_node_of_cpu(cpus[i]);
            if (node < 0) {
                numa_free_nodemask(bm);
                return tk_fail(TK_ERR_INVALID, "numa: cpu %d has no NUMA node", cpus[i]);
            }
            numa_bitmask_setbit(bm, (unsigned)node);
        }
    }
    out->n_nodes = (int)numa_bitmask_weight(bm);
    if (out->n_nodes < 2) { /* the threads sit on one node: bind there */
        say(why, why_len, "the threads run on one node: memory bound to it");
    }
    out->nodes = bm;
    out->active = true;
    return TK_OK;
#else
    (void)cpus;
    (void)n_cpus;
    say(why, why_len, "built without libnuma");
    return TK_OK;
#endif
}

void tk_numa_free(tk_numa *nm) {
    if (!nm) return;
#if defined(TK_HAVE_NUMA)
    if (nm->nodes) numa_free_nodemask(nm->nodes);
#endif
    memset(nm, 0, sizeof *nm);
}

void tk_numa_interleave_begin(const tk_numa *nm) {
#if defined(TK_HAVE_NUMA)
    if (nm && nm->active) numa_set_interleave_mask(nm->nodes);
#else
    (void)nm;
#endif
}

void tk_numa_interleave_end(const tk_numa *nm) {
#if defined(TK_HAVE_NUMA)
    if (nm && nm->active) numa_set_localalloc();
#else
    (void)nm;
#endif
}

tk_status tk_numa_move(const tk_numa *nm, void *p, size_t n) {
#if defined(TK_HAVE_NUMA)
    if (!nm || !nm->active || !p || n == 0) return TK_OK;
    long pg = sysconf(_SC_PAGESIZE);
    uintptr_t a = (uintptr_t)p & ~((uintptr_t)pg - 1), e = (uintptr_t)p + n;
    const struct bitmask *bm = nm->nodes;
    if (mbind((void *)a, e - a, MPOL_INTERLEAVE, bm->maskp, bm->size + 1, MPOL_MF_MOVE) != 0)
        return tk_fail(TK_ERR_IO, "numa: moving %zu bytes of weights failed", n);
    return TK_OK;
#else
    (void)nm;
    (void)p;
    (void)n;
    return TK_OK;
#endif
}
