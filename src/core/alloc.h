/* Counted allocation: every heap byte the library holds goes through here, so
 * the KV pool, arenas and tests can report budgets and leaks. */
#ifndef TK_CORE_ALLOC_H
#define TK_CORE_ALLOC_H

#include <stddef.h>
#include <stdint.h>

/* Return NULL on failure (and on n == 0 for tk_malloc). tk_free(NULL) is a no-op. */
void *tk_malloc(size_t n);
void *tk_calloc(size_t count, size_t size); /* checks count*size for overflow */
void *tk_realloc(void *p, size_t n);
char *tk_strdup(const char *s);
char *tk_strndup(const char *s, size_t n);
void tk_free(void *p);

/* 64-byte (or larger power-of-two) aligned, zeroed; free with tk_free_aligned. */
void *tk_alloc_aligned(size_t n, size_t align);
/* As tk_alloc_aligned, not zeroed: for a buffer its caller writes whole before
 * reading it, so no pass zeroes it first (a large one's pages are then faulted
 * in by the threads that write them). */
void *tk_alloc_aligned_raw(size_t n, size_t align);
void tk_free_aligned(void *p);

/* Zeroed, on 2 MiB boundaries, advised for transparent huge pages before any
 * page is touched (advice given after the first touch leaves 4 KiB pages, whose
 * TLB misses every pass over the memory pays). With touch, every page is
 * faulted in now, so the memory is committed and no later pass takes a fault.
 * n is rounded up to whole huge pages; free with tk_free_huge and the same n. */
void *tk_alloc_huge(size_t n, int touch);
void tk_free_huge(void *p, size_t n);

/* Bytes currently held through the wrappers above (all threads). */
uint64_t tk_alloc_live_bytes(void);

#endif
