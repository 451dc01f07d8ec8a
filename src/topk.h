/* The best scores of a row, in src/argmax.h's rank order (larger first,
 * lower column among equal ones, NaN last): what a sampler with top-k needs
 * of the logits, so that only a few thousand of them leave a GPU. */
#ifndef LMX_TOPK_H
#define LMX_TOPK_H

#include <stdint.h>

typedef struct lmx_scored {
    float score;
    int32_t col; /* -1: padding, past the end of a short row */
} lmx_scored;

/* The most entries a group of a backend's read_topk may be asked for, and
 * the most groups it writes. */
enum { LMX_TOPK_MAX = 128, LMX_TOPK_GROUPS = 128 };

/* out[0, k) = the k entries of x[0, n) that rank first, in rank order;
 * entries past n are padding. 0 < k <= LMX_TOPK_MAX. Reads each element
 * once and most of them only through 64-wide block maxima. */
void lmx_top_scores(const float *x, int32_t n, int k, lmx_scored *out);

#endif
