/* read_draw (backend.h): the host sampler's draw over the whole row with a
 * temperature and min_p (sampler.c, the dense layout), repeated step for
 * step with sample_math.h's arithmetic, so that the same uniform number
 * picks the same token. The draw's parameters come with the step (d_step),
 * so that one recording serves any. Three launches: each block of LMX_SAMPLE_BLOCK
 * tokens' largest warped score; each block's weight; then the walk to the
 * token. A warp a block of tokens. */
#include "sample_math.h"

enum { DRAW_THREADS = 256, DRAW_WARPS = DRAW_THREADS / 32 };

/* A token's weight: exp(x - smax) of its warped score, 0 where min_p (0:
 * off) removes it, below min_p times the top token's weight (1). sampler.c
 * decides the same on the bits, which order as these floats do. */
__device__ __forceinline__ float dense_weight(float x, const lmx_draw &d, float smax)
{
    float e = lmx_exp_nonpos(__fsub_rn(lmx_warped(x, d.temperature), smax));
    return d.min_p > 0 && !(e >= d.min_p) ? 0.0f : e;
}

/* bmax[b]: the largest warped score of block b of x[0, n) (warped scores
 * hold no NaN). */
__global__ void __launch_bounds__(DRAW_THREADS) k_draw_maxima(float *bmax, const float *x, int n, const lmx_draw *dr)
{
    pdl_trigger();
    pdl_wait();
    const float t = dr->temperature;
    int b = blockIdx.x * DRAW_WARPS + (threadIdx.x >> 5), lane = threadIdx.x & 31, lo = b * LMX_SAMPLE_BLOCK;
    if (lo >= n)
        return;
    float m = -INFINITY;
    for (int i = lo + lane; i < min(n, lo + (int)LMX_SAMPLE_BLOCK); i += 32)
        m = fmaxf(m, lmx_warped(x[i], t));
    m = warp_max(m);
    if (lane == 0)
        bmax[b] = m;
}

/* bsum[b]: block b's weight, summed as sampler.c's sum_block does
 * (partial j: the block's tokens j, j + 8, ... in order, those past the
 * last whole 8 to partial 0; then lmx_sum8); bmax[nb] (block 0): the
 * row's largest warped score, which every block takes from bmax[0, nb). */
__global__ void __launch_bounds__(DRAW_THREADS) k_draw_sums(double *bsum, float *bmax, int nb, const float *x, int n,
                                                            const lmx_draw *dr)
{
    __shared__ float red[32];
    __shared__ float e[DRAW_WARPS][LMX_SAMPLE_BLOCK];
    pdl_trigger();
    pdl_wait();
    const lmx_draw d = *dr;
    float m = -INFINITY;
    for (int i = threadIdx.x; i < nb; i += blockDim.x)
        m = fmaxf(m, bmax[i]);
    const float smax = block_reduce<true>(m, red);
    if (blockIdx.x == 0 && threadIdx.x == 0)
        bmax[nb] = smax;
    int w = threadIdx.x >> 5, lane = threadIdx.x & 31, b = blockIdx.x * DRAW_WARPS + w, lo = b * LMX_SAMPLE_BLOCK;
    if (lo >= n)
        return;
    int len = min(n - lo, (int)LMX_SAMPLE_BLOCK), whole = len / 8 * 8;
    for (int i = lane; i < len; i += 32)
        e[w][i] = dense_weight(x[lo + i], d, smax);
    __syncwarp();
    double part = 0;
    if (lane < 8) {
        for (int i = lane; i < whole; i += 8)
            part += e[w][i];
        for (int i = whole; lane == 0 && i < len; i++)
            part += e[w][i];
    }
    double parts[8];
#pragma unroll
    for (int j = 0; j < 8; j++)
        parts[j] = __shfl_sync(0xffffffffu, part, j);
    if (lane == 0)
        bsum[b] = lmx_sum8(parts);
}

/* *id: sampler.c's draw. One thread turns the blocks' weights into running
 * sums in block order (the host's total and walk add the same numbers in
 * the same order), the first block whose running sum passes the target
 * (u times the total; the last block takes any rounding) is found by all,
 * and one thread walks its tokens. Nothing drawable (every score -inf or
 * NaN): token 0, as the host. */
__global__ void __launch_bounds__(DRAW_THREADS) k_draw_pick(int32_t *id, double *bsum, const float *bmax, int nb,
                                                            const float *x, int n, const lmx_draw *dr)
{
    __shared__ float e[LMX_SAMPLE_BLOCK];
    __shared__ int chosen;
    pdl_trigger();
    pdl_wait();
    const lmx_draw d = *dr;
    const float smax = bmax[nb];
    if (!(smax > -INFINITY)) {
        if (threadIdx.x == 0)
            *id = 0;
        return;
    }
    if (threadIdx.x == 0) {
        double acc = 0;
        for (int b = 0; b < nb; b++) {
            acc += bsum[b];
            bsum[b] = acc;
        }
        chosen = nb - 1;
    }
    __syncthreads();
    const double target = __dmul_rn(d.u, bsum[nb - 1]);
    for (int b = threadIdx.x; b < nb - 1; b += blockDim.x)
        if (target < bsum[b]) {
            atomicMin(&chosen, b);
            break;
        }
    __syncthreads();
    int b = chosen, lo = b * LMX_SAMPLE_BLOCK, len = min(n - lo, (int)LMX_SAMPLE_BLOCK);
    for (int i = threadIdx.x; i < len; i += blockDim.x)
        e[i] = dense_weight(x[lo + i], d, smax);
    __syncthreads();
    if (threadIdx.x != 0)
        return;
    double acc = b ? bsum[b - 1] : 0.0;
    int last = lo; /* the block's last drawable token, for rounding */
    for (int i = 0; i < len; i++) {
        if (e[i] > 0)
            last = lo + i;
        acc += e[i];
        if (target < acc) {
            *id = lo + i;
            return;
        }
    }
    *id = last;
}
