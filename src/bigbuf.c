#include "bigbuf.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

enum { HUGE = 2 << 20, LINE = 64 };

lmx_bigbuf lmx_bigbuf_alloc(size_t bytes)
{
    lmx_bigbuf b = {NULL, NULL, 0};
    if (bytes >= HUGE && bytes <= SIZE_MAX - 2 * (size_t)HUGE) {
        size_t len = (bytes + HUGE - 1) / HUGE * HUGE + HUGE; /* room to align the start */
        void *m = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        if (m != MAP_FAILED) {
            uintptr_t at = ((uintptr_t)m + HUGE - 1) / HUGE * HUGE;
#ifdef MADV_HUGEPAGE
            /* whole huge pages only: a partly used last one would be resident in full */
            madvise((void *)at, bytes / HUGE * HUGE, MADV_HUGEPAGE); /* advice: failure is harmless */
#endif
            b.data = (void *)at;
            b.map = m;
            b.bytes = len;
            return b;
        }
    }
    if (bytes > SIZE_MAX - LINE)
        return b;
    size_t len = (bytes + LINE - 1) / LINE * LINE;
    if ((b.data = aligned_alloc(LINE, len ? len : LINE)))
        memset(b.data, 0, len);
    return b;
}

void lmx_bigbuf_free(lmx_bigbuf *b)
{
    if (b->map)
        munmap(b->map, b->bytes);
    else
        free(b->data);
    *b = (lmx_bigbuf){NULL, NULL, 0};
}

int lmx_bigbuf_huge_pages(void)
{
    FILE *f = fopen("/sys/kernel/mm/transparent_hugepage/enabled", "r");
    char mode[64] = "";
    if (!f)
        return 0;
    int ok = fgets(mode, sizeof mode, f) && !strstr(mode, "[never]");
    fclose(f);
    return ok;
}
