/* Device helpers shared by the CUDA kernels; included by backend_cuda.cu
 * inside its anonymous namespace, like the other cuda_*.cuh files. */
#pragma once

/* Programmatic dependent launch: every kernel is launched allowed to start
 * before its predecessor ends (hiding launch gaps, in graphs too). It waits
 * for its predecessor's results with pdl_wait() before touching any memory
 * that kernels write (only immutable data, weights, may be read before),
 * then lets its own successor launch. Triggering before the wait instead
 * (LMX_PDL_EARLY=1) measured 11% slower on Qwen3-8B decode (178 against
 * 200 tok/s, bench/gemv_variants.sh, 2026-12-03). */
#ifndef LMX_PDL_EARLY
#define LMX_PDL_EARLY 0
#endif
__device__ __forceinline__ void pdl_trigger()
{
    if (LMX_PDL_EARLY)
        asm volatile("griddepcontrol.launch_dependents;" :::);
}
__device__ __forceinline__ void pdl_wait()
{
    asm volatile("griddepcontrol.wait;" ::: "memory");
    if (!LMX_PDL_EARLY)
        asm volatile("griddepcontrol.launch_dependents;" :::);
}


__device__ __forceinline__ float load_w(const void *w, int dt, size_t i)
{
    switch (dt) {
    case LMX_DT_BF16: return __bfloat162float(((const __nv_bfloat16 *)w)[i]);
    case LMX_DT_F16: return __half2float(((const __half *)w)[i]);
    default: return ((const float *)w)[i];
    }
}

/* A weight matrix [rows, cols] as kernels see it: a float dtype, or q8/q4
 * (bits 8 or 4; docs/quantization.md) with float16 scales and biases a
 * group of `group` elements. */
struct wview {
    const void *data;
    const __half *scales, *biases;
    int dt, bits, group, cols;
};

/* Element (r, c) of w as float. */
__device__ __forceinline__ float wview_at(const wview &w, size_t r, int c)
{
    if (!w.bits)
        return load_w(w.data, w.dt, r * w.cols + c);
    const uint8_t *q = (const uint8_t *)w.data + r * (size_t)w.cols * w.bits / 8;
    int v = w.bits == 8 ? q[c] : (q[c / 2] >> (4 * (c & 1))) & 15;
    size_t g = r * (size_t)(w.cols / w.group) + c / w.group;
    return __half2float(w.scales[g]) * (float)v + __half2float(w.biases[g]);
}

__device__ __forceinline__ float warp_sum(float v)
{
#pragma unroll
    for (int o = 16; o; o >>= 1)
        v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

/* The sum of v over the block (blockDim.x a multiple of 32); red holds 32
 * floats of shared memory. Every thread gets the result. */
__device__ float block_sum(float v, float *red)
{
    int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, nw = blockDim.x >> 5;
    v = warp_sum(v);
    __syncthreads(); /* red may still be read from an earlier call */
    if (lane == 0)
        red[warp] = v;
    __syncthreads();
    v = lane < nw ? red[lane] : 0;
    return warp_sum(v);
}

/* Pulls a norm weight (dim elements of dtype dt) toward L2 while the
 * previous kernel finishes: only for data no kernel writes. */
__device__ __forceinline__ void prefetch_norm(const void *w, int dt, int dim)
{
    size_t bytes = (size_t)dim * (dt == LMX_DT_F32 ? 4 : 2);
    for (size_t o = (size_t)threadIdx.x * 128; w && o < bytes; o += (size_t)blockDim.x * 128)
        asm volatile("prefetch.global.L2 [%0];" ::"l"((const char *)w + o));
}

__device__ __forceinline__ float norm_w(const void *w, int dt, int j, int plus_one)
{
    float wj = load_w(w, dt, j);
    return plus_one ? 1.0f + wj : wj;
}

/* Rows of K floats quantized per weight group of G (32 or 64) for the
 * q8/q4 GEMV: xq [rows, K], and per group the step xd and xs = xd * (sum
 * of the group's xq), ng = K / G a row. q4order: every run of 8 values
 * stored evens, then odds, as the nibbles of a weight word pair them. */
struct xquant {
    int8_t *xq;
    float *xd, *xs;
    int G, q4order;
};

/* Group g of row r (its K floats at x) quantized by one warp: xd = max|x| /
 * 127, xq = round(x / xd) (half away from zero, as the CPU's quant_x). */
__device__ __forceinline__ void quant_group(const xquant &q, const float *x, int K, int r, int g, int lane)
{
    int G = q.G, ng = K / G;
    const float *xg = x + (size_t)g * G;
    float v[2] = {xg[lane], G > 32 ? xg[lane + 32] : 0.0f};
    float mx = fmaxf(fabsf(v[0]), fabsf(v[1]));
#pragma unroll
    for (int o = 16; o; o >>= 1)
        mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, o));
    float inv = mx > 0 ? 127.0f / mx : 0.0f;
    int8_t *dst = q.xq + (size_t)r * K + (size_t)g * G;
    int sum = 0;
#pragma unroll
    for (int h = 0; h < 2; h++) {
        if (h && G <= 32)
            break;
        int v8 = (int)roundf(fminf(fmaxf(v[h] * inv, -127.0f), 127.0f)), k = lane + 32 * h;
        sum += v8;
        dst[q.q4order ? (k & ~7) + (k & 1) * 4 + ((k & 7) >> 1) : k] = (int8_t)v8;
    }
#pragma unroll
    for (int o = 16; o; o >>= 1)
        sum += __shfl_xor_sync(0xffffffffu, sum, o);
    if (lane == 0) {
        q.xd[(size_t)r * ng + g] = mx / 127.0f;
        q.xs[(size_t)r * ng + g] = mx / 127.0f * (float)sum;
    }
}

/* The block's output row (K floats, written by it) quantized as well. */
__device__ __forceinline__ void quant_row(const xquant &q, const float *row, int K, int r)
{
    __syncthreads(); /* the row's writes are visible to the whole block */
    int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    for (int g = warp; g < K / q.G; g += blockDim.x >> 5)
        quant_group(q, row, K, r, g, lane);
}

__device__ __forceinline__ float act_fn(float x, int gelu)
{
    const float k = 0.7978845608028654f; /* sqrt(2/pi) */
    return gelu ? 0.5f * x * (1.0f + tanhf(k * (x + 0.044715f * x * x * x))) : x / (1.0f + expf(-x));
}
