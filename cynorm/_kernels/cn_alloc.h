/* A NumPy memory handler (NEP 49) that keeps a few freed large blocks.
 *
 * A fresh large output costs a page fault per 4 KiB page the first time it
 * is written, which on big shapes costs more than the kernel.  Blocks freed
 * through this handler are kept (up to `limit` bytes in CN_CACHE_SLOTS
 * slots) and handed back to the next request of the same size, pages already
 * mapped.  Only arrays that cynorm allocates use this handler; everything
 * else in the process keeps NumPy's default.
 *
 * Every block starts CN_STAGGER bytes into a page.  An output that starts at
 * (almost) the same offset as its input modulo a large power of two makes the
 * two streams fight over the same cache sets (benchmarks/MEASUREMENTS.md),
 * and glibc places a fresh block right after the previous one.
 * Large NumPy arrays start 16 bytes into a page, so a half-page stagger keeps
 * outputs 2 KiB away from them in every such modulus.
 *
 * Under AddressSanitizer (CYNORM_SANITIZE=address, setup.py) the padding
 * around each block and the blocks the cache keeps are poisoned, so that an
 * access before or past an output, or to one already freed into the cache,
 * is reported as it is for malloc's own blocks (the padding would otherwise
 * hide up to a page of overrun, and the cache every use after free).
 */
#ifndef CN_ALLOC_H
#define CN_ALLOC_H

#include <Python.h>
#include <stdlib.h>
#include <string.h>
#include <stdint.h>
#if defined(__linux__)
#include <sys/mman.h>
#endif

#if defined(__SANITIZE_ADDRESS__)
#define CN_ASAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define CN_ASAN 1
#endif
#endif
#if defined(CN_ASAN)
#include <sanitizer/asan_interface.h>
#define CN_POISON(p, n) ASAN_POISON_MEMORY_REGION((p), (n))
#define CN_UNPOISON(p, n) ASAN_UNPOISON_MEMORY_REGION((p), (n))
#else
#define CN_POISON(p, n) ((void)(p), (void)(n))
#define CN_UNPOISON(p, n) ((void)(p), (void)(n))
#endif

#define CN_CACHE_SLOTS 8
#define CN_STAGGER 2048

/* The raw malloc block and the size asked for, kept just before the pointer
 * handed out (every block of this handler has one). */
typedef struct {
    void *raw;
    size_t size;
} cn_header;

/* the bytes each block takes beyond its size */
#define CN_PAD (4096 + CN_STAGGER + sizeof(cn_header))

static void *cn_raw_alloc(size_t size) {
    size_t pad = CN_PAD;
    char *raw, *user;
    if (size > SIZE_MAX - pad) return NULL;
    raw = (char *)malloc(size + pad);
    if (raw == NULL) return NULL;
    user = (char *)((((uintptr_t)raw + sizeof(cn_header) + 4095u) & ~(uintptr_t)4095u)
                    + CN_STAGGER);
    ((cn_header *)user)[-1].raw = raw;
    ((cn_header *)user)[-1].size = size;
    CN_POISON(raw, (size_t)(user - raw));                      /* header included */
    CN_POISON(user + size, (size_t)(raw + pad - user));
    return user;
}

static cn_header cn_header_of(void *user) {
    cn_header h, *p = (cn_header *)user - 1;
    CN_UNPOISON(p, sizeof *p);
    h = *p;
    CN_POISON(p, sizeof *p);
    return h;
}

static void cn_raw_free(void *user) {
    if (user) {
        cn_header h = cn_header_of(user);
        CN_UNPOISON(h.raw, h.size + CN_PAD);
        free(h.raw);
    }
}

typedef struct {
    void *ptr;
    size_t size;
} cn_block;

typedef struct {
    PyThread_type_lock lock;
    cn_block slots[CN_CACHE_SLOTS];
    size_t held;                 /* bytes currently kept */
    size_t limit;                /* most bytes kept; 0 turns the cache off */
    size_t min_size;             /* smaller blocks bypass the cache */
    unsigned long long hits, misses;
} cn_cache_t;

static cn_cache_t cn_cache = {NULL, {{NULL, 0}}, 0, 0, 1u << 20, 0, 0};

/* Calls under way on this thread whose outputs stay out of the cache
 * (_alloc.OutsideCache: cynorm.torch's, whose outputs become PyTorch
 * tensors).  Per thread: another thread's calls keep the cache meanwhile. */
#if defined(_MSC_VER)
static __declspec(thread) int cn_outside_cache = 0;
#else
static _Thread_local int cn_outside_cache = 0;
#endif

static int cn_cache_init(size_t limit, size_t min_size) {
    cn_cache.lock = PyThread_allocate_lock();
    if (cn_cache.lock == NULL) return -1;
    cn_cache.limit = limit;
    cn_cache.min_size = min_size;
    return 0;
}

static void cn_lock(void) { PyThread_acquire_lock(cn_cache.lock, WAIT_LOCK); }
static void cn_unlock(void) { PyThread_release_lock(cn_cache.lock); }

static void cn_advise_huge(void *p, size_t size) {
#if defined(__linux__) && defined(MADV_HUGEPAGE)
    /* Transparent huge pages cut the faults of a first touch 512-fold. */
    if (size >= ((size_t)4 << 20)) {
        uintptr_t start = ((uintptr_t)p + 4095u) & ~(uintptr_t)4095u;
        size_t len = size - (size_t)(start - (uintptr_t)p);
        madvise((void *)start, len & ~(size_t)4095u, MADV_HUGEPAGE);
    }
#else
    (void)p; (void)size;
#endif
}

static void *cn_malloc(void *ctx, size_t size) {
    void *p = NULL;
    int i;
    (void)ctx;
    if (size >= cn_cache.min_size && cn_cache.limit) {
        cn_lock();
        for (i = 0; i < CN_CACHE_SLOTS; i++) {
            if (cn_cache.slots[i].ptr && cn_cache.slots[i].size == size) {
                p = cn_cache.slots[i].ptr;
                CN_UNPOISON(p, size);
                cn_cache.slots[i].ptr = NULL;
                cn_cache.held -= size;
                cn_cache.hits++;
                break;
            }
        }
        if (!p) cn_cache.misses++;
        cn_unlock();
        if (p) return p;
    }
    p = cn_raw_alloc(size ? size : 1);
    if (p && size >= cn_cache.min_size) cn_advise_huge(p, size);
    return p;
}

static void *cn_calloc(void *ctx, size_t nelem, size_t elsize) {
    void *p;
    (void)ctx;
    if (elsize && nelem > SIZE_MAX / elsize) return NULL;
    p = cn_raw_alloc(nelem && elsize ? nelem * elsize : 1);
    if (p) memset(p, 0, nelem * elsize);
    return p;
}

static void *cn_realloc(void *ctx, void *ptr, size_t new_size) {
    void *p;
    size_t old;
    (void)ctx;
    if (ptr == NULL) return cn_raw_alloc(new_size ? new_size : 1);
    old = cn_header_of(ptr).size;
    p = cn_raw_alloc(new_size ? new_size : 1);
    if (p == NULL) return NULL;      /* the old block stays valid, as realloc's does */
    memcpy(p, ptr, old < new_size ? old : new_size);
    cn_raw_free(ptr);
    return p;
}

static void cn_free(void *ctx, void *ptr, size_t size) {
    int i;
    (void)ctx;
    if (ptr == NULL) return;
    if (size >= cn_cache.min_size && cn_cache.limit) {
        cn_lock();
        if (cn_cache.held + size <= cn_cache.limit) {
            for (i = 0; i < CN_CACHE_SLOTS; i++) {
                if (cn_cache.slots[i].ptr == NULL) {
                    CN_POISON(ptr, size);
                    cn_cache.slots[i].ptr = ptr;
                    cn_cache.slots[i].size = size;
                    cn_cache.held += size;
                    ptr = NULL;
                    break;
                }
            }
        }
        cn_unlock();
        if (ptr == NULL) return;
    }
    cn_raw_free(ptr);
}

/* Returns the blocks kept beyond `limit` bytes to the system. */
static void cn_cache_trim(size_t limit) {
    int i;
    cn_lock();
    for (i = 0; i < CN_CACHE_SLOTS && cn_cache.held > limit; i++) {
        if (cn_cache.slots[i].ptr) {
            cn_raw_free(cn_cache.slots[i].ptr);
            cn_cache.held -= cn_cache.slots[i].size;
            cn_cache.slots[i].ptr = NULL;
        }
    }
    cn_unlock();
}

static void cn_cache_set_limit(size_t limit) {
    cn_lock();
    cn_cache.limit = limit;
    cn_unlock();
    cn_cache_trim(limit);
}

static int cn_cache_blocks(void) {
    int i, n = 0;
    cn_lock();
    for (i = 0; i < CN_CACHE_SLOTS; i++) n += cn_cache.slots[i].ptr != NULL;
    cn_unlock();
    return n;
}

static PyDataMem_Handler cn_handler = {
    "cynorm_block_cache",
    1,
    {NULL, cn_malloc, cn_calloc, cn_realloc, cn_free},
};

#endif
