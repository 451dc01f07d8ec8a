/* Device helpers shared by the CUDA kernels; included by backend_cuda.cu
 * inside its anonymous namespace, like the other cuda_*.cuh files. */
#pragma once

/* Programmatic dependent launch: every kernel is launched allowed to start
 * before its predecessor ends (hiding launch gaps, in graphs too). It waits
 * for its predecessor's results with pdl_wait() before touching any memory
 * that kernels write (only immutable data, weights, may be read before),
 * then lets its own successor launch. Triggering before the wait instead
 * (LMX_PDL_EARLY=1) measured 11% slower on Qwen3-8B decode (178 against
 * 200 tok/s, bench/decode_variants.sh, 2026-12-03). */
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
 * (bits 8 or 4; docs/quantization.md) with a float16 (scale, bias) pair a
 * group of `group` elements. */
struct wview {
    const void *data;
    const __half2 *sb;
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
    float2 sb = __half22float2(w.sb[g]);
    return sb.x * (float)v + sb.y;
}

__device__ __forceinline__ float warp_sum(float v)
{
#pragma unroll
    for (int o = 16; o; o >>= 1)
        v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

__device__ __forceinline__ float warp_max(float v)
{
#pragma unroll
    for (int o = 16; o; o >>= 1)
        v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
    return v;
}

/* The sum (or the maximum) of v over the block (blockDim.x a multiple of
 * 32); red holds 32 floats of shared memory. Every thread gets the result. */
template <bool MAX> __device__ float block_reduce(float v, float *red)
{
    int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, nw = blockDim.x >> 5;
    v = MAX ? warp_max(v) : warp_sum(v);
    __syncthreads(); /* red may still be read from an earlier call */
    if (lane == 0)
        red[warp] = v;
    __syncthreads();
    v = lane < nw ? red[lane] : MAX ? -INFINITY : 0.0f;
    return MAX ? warp_max(v) : warp_sum(v);
}
__device__ float block_sum(float v, float *red) { return block_reduce<false>(v, red); }

/* Two floats as a pair of bf16, lo in the low half. */
__device__ __forceinline__ unsigned pack_bf16(float lo, float hi)
{
    __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
    return *(unsigned *)&v;
}

__device__ __forceinline__ float norm_w(const void *w, int dt, int j, int plus_one)
{
    float wj = load_w(w, dt, j);
    return plus_one ? 1.0f + wj : wj;
}

/* Rows of K floats quantized per weight group of G (32 or 64) for the
 * q8/q4 GEMV: xq [rows, K], and per group the pair xds = (step xd,
 * xs = xd * the sum of the group's xq), ng = K / G a row (one 8-byte load
 * for the GEMV). q4order: every run of 8 values stored evens, then odds,
 * as the nibbles of a weight word pair them. */
struct xquant {
    int8_t *xq;
    float2 *xds;
    int G, q4order;
};

/* Four floats h, elements [e, e + 4) of row r (K a row), quantized; the
 * G / 4 lanes holding a group's elements (consecutive lanes, consecutive
 * elements) find its step together: xd = max|x| / 127, xq = round(x / xd)
 * (half away from zero, as the CPU's quant_x). Every lane of the warp
 * calls it; only `valid` ones write. */
__device__ __forceinline__ void quant4(const xquant &q, float4 h, int r, int e, int K, bool valid)
{
    float v[4] = {h.x, h.y, h.z, h.w};
    float mx = fmaxf(fmaxf(fabsf(v[0]), fabsf(v[1])), fmaxf(fabsf(v[2]), fabsf(v[3])));
    for (int o = 1; o < q.G / 4; o <<= 1)
        mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, o));
    float inv = mx > 0 ? 127.0f / mx : 0.0f;
    int8_t *dst = q.xq + (size_t)r * K;
    int sum = 0;
#pragma unroll
    for (int i = 0; i < 4; i++) {
        int v8 = (int)roundf(fminf(fmaxf(v[i] * inv, -127.0f), 127.0f)), k = e + i;
        sum += v8;
        if (valid)
            dst[q.q4order ? (k & ~7) + (k & 1) * 4 + ((k & 7) >> 1) : k] = (int8_t)v8;
    }
    for (int o = 1; o < q.G / 4; o <<= 1)
        sum += __shfl_xor_sync(0xffffffffu, sum, o);
    if (valid && e % q.G == 0) {
        size_t g = (size_t)r * (K / q.G) + e / q.G;
        q.xds[g] = make_float2(mx / 127.0f, mx / 127.0f * (float)sum);
    }
}

__device__ __forceinline__ float act_fn(float x, int gelu)
{
    const float k = 0.7978845608028654f; /* sqrt(2/pi) */
    return gelu ? 0.5f * x * (1.0f + tanhf(k * (x + 0.044715f * x * x * x))) : x / (1.0f + expf(-x));
}
