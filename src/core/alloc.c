#include "alloc.h"

#include <stdatomic.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

/* A process-wide counter is the one global we keep: it only observes, and an
 * atomic makes it safe for many engines. A 16-byte header records the size so
 * tk_free can subtract it and the payload stays 16-byte aligned. */
static _Atomic uint64_t live_bytes;

#define HDR 16

void *tk_malloc(size_t n) {
    if (n == 0 || n > SIZE_MAX - HDR) return NULL;
    unsigned char *p = malloc(n + HDR);
    if (!p) return NULL;
    memcpy(p, &n, sizeof n);
    atomic_fetch_add(&live_bytes, n);
    return p + HDR;
}

void *tk_calloc(size_t count, size_t size) {
    size_t n;
    if (__builtin_mul_overflow(count, size, &n) || n == 0) return NULL;
    void *p = tk_malloc(n);
    if (p) memset(p, 0, n);
    return p;
}

void *tk_realloc(void *p, size_t n) {
    if (!p) return tk_malloc(n);
    if (n == 0 || n > SIZE_MAX - HDR) return NULL;
    unsigned char *base = (unsigned char *)p - HDR;
    size_t old;
    memcpy(&old, base, sizeof old);
    unsigned char *q = realloc(base, n + HDR);
    if (!q) return NULL;
    memcpy(q, &n, sizeof n);
    atomic_fetch_add(&live_bytes, n);
    atomic_fetch_sub(&live_bytes, old);
    return q + HDR;
}

char *tk_strndup(const char *s, size_t n) {
    char *d = tk_malloc(n + 1);
    if (!d) return NULL;
    memcpy(d, s, n);
    d[n] = 0;
    return d;
}

char *tk_strdup(const char *s) { return tk_strndup(s, strlen(s)); }

void tk_free(void *p) {
    if (!p) return;
    unsigned char *base = (unsigned char *)p - HDR;
    size_t n;
    memcpy(&n, base, sizeof n);
    atomic_fetch_sub(&live_bytes, n);
    free(base);
}

static void *alloc_aligned(size_t n, size_t align, bool zero) {
    if (align < 64) align = 64;
    if (n == 0 || (align & (align - 1)) || n > SIZE_MAX - 2 * align) return NULL;
    size_t total = (n + align - 1) / align * align;
    /* The size lives in the align bytes before the payload. */
    unsigned char *p = aligned_alloc(align, total + align);
    if (!p) return NULL;
    if (zero) memset(p + align, 0, total);
    memcpy(p, &total, sizeof total);
    memcpy(p + sizeof total, &align, sizeof align);
    memcpy(p + align - sizeof align, &align, sizeof align);
    atomic_fetch_add(&live_bytes, total);
    return p + align;
}

void *tk_alloc_aligned(size_t n, size_t align) { return alloc_aligned(n, align, true); }
void *tk_alloc_aligned_raw(size_t n, size_t align) { return alloc_aligned(n, align, false); }

void tk_free_aligned(void *p) {
    if (!p) return;
    size_t align, total;
    memcpy(&align, (unsigned char *)p - sizeof align, sizeof align);
    unsigned char *base = (unsigned char *)p - align;
    memcpy(&total, base, sizeof total);
    atomic_fetch_sub(&live_bytes, total);
    free(base);
}

#define HUGE_PAGE ((size_t)2 << 20)

static size_t huge_round(size_t n) { return (n + HUGE_PAGE - 1) / HUGE_PAGE * HUGE_PAGE; }

/* Under AddressSanitizer the heap keeps its redzones around the region. */
#if defined(__SANITIZE_ADDRESS__)
#define HUGE_ON_HEAP 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define HUGE_ON_HEAP 1
#endif
#endif

void *tk_alloc_huge(size_t n, int touch) {
    if (n == 0 || n > SIZE_MAX - 2 * HUGE_PAGE) return NULL;
#ifdef HUGE_ON_HEAP
    (void)touch;
    return tk_alloc_aligned(huge_round(n), HUGE_PAGE);
#else
    size_t size = huge_round(n), map = size + HUGE_PAGE;
    unsigned char *p = mmap(NULL, map, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) return NULL;
    /* Trim to a huge-page-aligned region. */
    size_t lead = (HUGE_PAGE - (uintptr_t)p % HUGE_PAGE) % HUGE_PAGE;
    if (lead) munmap(p, lead);
    if (map - lead > size) munmap(p + lead + size, map - lead - size);
    p += lead;
    madvise(p, size, MADV_HUGEPAGE);
    if (touch) /* one write per 4 KiB page, in case the kernel gives small pages */
        for (size_t off = 0; off < size; off += 4096) ((volatile unsigned char *)p)[off] = 0;
    atomic_fetch_add(&live_bytes, size);
    return p;
#endif
}

void tk_free_huge(void *p, size_t n) {
    if (!p) return;
#ifdef HUGE_ON_HEAP
    mprotect(p, huge_round(n), PROT_READ | PROT_WRITE); /* the caller may have made it read-only */
    tk_free_aligned(p);
#else
    size_t size = huge_round(n);
    munmap(p, size);
    atomic_fetch_sub(&live_bytes, size);
#endif
}

uint64_t tk_alloc_live_bytes(void) { return atomic_load(&live_bytes); }
