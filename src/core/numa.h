/* Memory placement on NUMA machines (--numa): the weights, the KV cache and
 * the step's buffers interleaved over the nodes the pool's threads run on, so
 * every thread's stream has memory on its own node and no node's memory
 * channel carries all of the traffic. Built on libnuma where the build found
 * it; on a machine with one node, without libnuma, or where the kernel has no
 * NUMA support, nothing is placed and tk_numa_init says why. */
#ifndef TK_CORE_NUMA_H
#define TK_CORE_NUMA_H

#include <stdbool.h>
#include <stddef.h>

#include "tokamak.h"

typedef struct tk_numa {
    bool active; /* more than one node to place on */
    int n_nodes; /* nodes of the threads' CPUs */
    void *nodes; /* libnuma's struct bitmask of them (NULL when inactive) */
} tk_numa;

/* The nodes of cpus[0, n_cpus) (NULL: every node, for unpinned threads).
 * Inactive with why filled ("one NUMA node", "built without libnuma", ...)
 * when there is nothing to place; fails only on a CPU libnuma does not know. */
tk_status tk_numa_init(const int *cpus, int n_cpus, tk_numa *out, char *why, size_t why_len);
void tk_numa_free(tk_numa *nm);

/* Allocations by this thread between begin and end interleave over the nodes
 * (pages are placed when first touched, and tk_alloc_aligned touches them). */
void tk_numa_interleave_begin(const tk_numa *nm);
void tk_numa_interleave_end(const tk_numa *nm);

/* Move the pages of [p, p + n) already placed, interleaving them over the
 * nodes (the weights, loaded before the threads' nodes were known). */
tk_status tk_numa_move(const tk_numa *nm, void *p, size_t n);

#endif
