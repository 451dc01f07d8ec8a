/* Large zeroed buffers for activations, KV caches and scratch: anonymous
 * mappings aligned to 2 MB and advised to use transparent huge pages, so
 * that touching them first costs a page fault every 2 MB rather than every
 * 4 KB (where the kernel grants huge pages: THP "always" or "madvise").
 * Smaller requests, or where mapping fails, come from calloc. */
#ifndef LMX_BIGBUF_H
#define LMX_BIGBUF_H

#include <stddef.h>

typedef struct lmx_bigbuf {
    void *data;  /* zeroed, 64-byte aligned at least; NULL when out of memory */
    void *map;   /* the mapping to unmap; NULL: data came from calloc */
    size_t bytes; /* of map */
} lmx_bigbuf;

lmx_bigbuf lmx_bigbuf_alloc(size_t bytes);
void lmx_bigbuf_free(lmx_bigbuf *b);

/* 1 when the kernel grants transparent huge pages to mappings that ask
 * (THP mode "always" or "madvise"), 0 when it does not or cannot say. */
int lmx_bigbuf_huge_pages(void);

#endif
