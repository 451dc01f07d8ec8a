/* Greedy decoding's choice, torch.argmax's rule: the largest score, the
 * lowest index among equal ones, NaN never chosen while any score is not
 * NaN (all NaN: index 0). One definition for the sampler, the backends'
 * read_argmax and the merges of their partial results (host and CUDA). */
#ifndef LMX_ARGMAX_H
#define LMX_ARGMAX_H

#include <stdint.h>

#ifdef __CUDACC__
#define LMX_HOST_DEVICE __host__ __device__
#else
#define LMX_HOST_DEVICE
#endif

/* Whether score a at index ia is chosen over score b at index ib. */
static inline LMX_HOST_DEVICE int lmx_argmax_beats(float a, int32_t ia, float b, int32_t ib)
{
    if (a != a)
        return b != b && ia < ib;
    return b != b || a > b || (a == b && ia < ib);
}

static inline int32_t lmx_argmax(const float *x, int32_t n)
{
    int32_t best = 0;
    for (int32_t i = 1; i < n; i++)
        if (lmx_argmax_beats(x[i], i, x[best], best))
            best = i;
    return best;
}

#endif
