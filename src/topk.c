/* Host top-k in rank order (topk.h): one pass over 64-wide blocks, each
 * skipped unless its largest number would enter the k best so far. */
#include "topk.h"

#include <math.h>

#include "argmax.h"

enum { BLOCK = 64 };

/* Whether a ranks after b: the heap's root is the entry that ranks last. */
static int after(lmx_scored a, lmx_scored b) { return lmx_argmax_beats(b.score, b.col, a.score, a.col); }

static void sift_down(lmx_scored *heap, int size, lmx_scored v)
{
    int at = 0;
    for (;;) {
        int child = 2 * at + 1;
        if (child >= size)
            break;
        if (child + 1 < size && after(heap[child + 1], heap[child]))
            child++;
        if (!after(heap[child], v))
            break;
        heap[at] = heap[child];
        at = child;
    }
    heap[at] = v;
}

static void offer(lmx_scored *heap, int *size, int k, lmx_scored v)
{
    if (*size == k) {
        if (after(heap[0], v))
            sift_down(heap, k, v);
        return;
    }
    int at = (*size)++;
    while (at > 0 && after(v, heap[(at - 1) / 2])) {
        heap[at] = heap[(at - 1) / 2];
        at = (at - 1) / 2;
    }
    heap[at] = v;
}

void lmx_top_scores(const float *x, int32_t n, int k, lmx_scored *out)
{
    lmx_scored heap[LMX_TOPK_MAX];
    int size = 0;
    for (int32_t b = 0; b < n; b += BLOCK) {
        int32_t len = n - b < BLOCK ? n - b : BLOCK;
        /* the block's columns come after every kept one, so an element
         * equal to the worst kept one ranks after it too */
        if (size == k && !isnan(heap[0].score) && !(lmx_largest(x + b, len) > heap[0].score))
            continue;
        for (int32_t i = b; i < b + len; i++)
            offer(heap, &size, k, (lmx_scored){x[i], i});
    }
    for (int i = size; i < k; i++)
        out[i] = (lmx_scored){NAN, -1};
    while (size > 0) { /* pop the last-ranked entry into the last free place */
        out[size - 1] = heap[0];
        size--;
        if (size > 0)
            sift_down(heap, size, heap[size]);
    }
}
