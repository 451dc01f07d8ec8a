/* Matrix-vector kernels (decode): weights streamed once with 16-byte
 * loads, float32 accumulation. */
#pragma once

/* 16 bytes of weights -> float. */
template <typename W> struct wvec;
template <> struct wvec<__nv_bfloat16> {
    enum { N = 8 };
    static __device__ __forceinline__ void cvt(uint4 u, float *f)
    {
        unsigned v[4] = {u.x, u.y, u.z, u.w};
#pragma unroll
        for (int i = 0; i < 4; i++) {
            f[2 * i] = __uint_as_float(v[i] << 16);
            f[2 * i + 1] = __uint_as_float(v[i] & 0xffff0000u);
        }
    }
};
template <> struct wvec<__half> {
    enum { N = 8 };
    static __device__ __forceinline__ void cvt(uint4 u, float *f)
    {
        unsigned v[4] = {u.x, u.y, u.z, u.w};
#pragma unroll
        for (int i = 0; i < 4; i++) {
            float2 p = __half22float2(*(const __half2 *)&v[i]);
            f[2 * i] = p.x;
            f[2 * i + 1] = p.y;
        }
    }
};
template <> struct wvec<float> {
    enum { N = 4 };
    static __device__ __forceinline__ void cvt(uint4 u, float *f)
    {
        f[0] = __uint_as_float(u.x);
        f[1] = __uint_as_float(u.y);
        f[2] = __uint_as_float(u.z);
        f[3] = __uint_as_float(u.w);
    }
};

/* GEMV shape; bench/gemv_variants.sh builds other values to compare
 * (2026-12-02, Qwen3-8B decode on the H200: 8 or 2 warps the same, 4-deep
 * unrolling 1.5% slower, 8-deep 14% slower, L1-allocating loads 10%
 * slower: bench/RESULTS.md). */
#ifndef LMX_GEMV_WARPS
#define LMX_GEMV_WARPS 4
#endif
#ifndef LMX_GEMV_UNROLL
#define LMX_GEMV_UNROLL 2
#endif
enum { GEMV_WARPS = LMX_GEMV_WARPS, GEMV_UNROLL = LMX_GEMV_UNROLL };

/* acc[m][r] += this lane's share of x[r, :] . wr[m] for r < nr, m < M
 * weight rows: GEMV_UNROLL 16-byte loads per lane and row in flight while
 * the previous batch is summed, weights streamed past L1 (x stays
 * cached). The first batch is loaded before waiting on the previous kernel
 * (weights never change); the wait comes after. */
template <typename W, int R, int M>
__device__ __forceinline__ void dot_rows(float (&acc)[M][R], const uint4 *const (&wr)[M], const float *__restrict__ x,
                                         int K, int nr, int lane)
{
    constexpr int V = wvec<W>::N, U = GEMV_UNROLL;
    int nv = K / V;
    uint4 u[M][U];
#pragma unroll
    for (int j = 0; j < U; j++)
#pragma unroll
        for (int m = 0; m < M; m++)
            if (lane + 32 * j < nv)
                u[m][j] = __ldcs(wr[m] + lane + 32 * j);
    pdl_wait();
    pdl_trigger();
    for (int i = lane; i < nv; i += 32 * U) {
        uint4 cur[M][U];
#pragma unroll
        for (int j = 0; j < U; j++)
#pragma unroll
            for (int m = 0; m < M; m++) {
                cur[m][j] = u[m][j];
                if (i + 32 * (U + j) < nv)
                    u[m][j] = __ldcs(wr[m] + i + 32 * (U + j));
            }
#pragma unroll
        for (int j = 0; j < U; j++) {
            if (i + 32 * j >= nv)
                break;
            int k = (i + 32 * j) * V;
#pragma unroll
            for (int m = 0; m < M; m++) {
                float f[V];
                wvec<W>::cvt(cur[m][j], f);
#pragma unroll
                for (int r = 0; r < R; r++) {
                    if (r < nr) {
                        const float4 *xr = (const float4 *)(x + (size_t)r * K + k);
#pragma unroll
                        for (int q = 0; q < V / 4; q++) {
                            float4 xv = __ldg(xr + q);
                            acc[m][r] += f[4 * q] * xv.x + f[4 * q + 1] * xv.y + f[4 * q + 2] * xv.z +
                                         f[4 * q + 3] * xv.w;
                        }
                    }
                }
            }
        }
    }
}

/* Weights of one dtype and K multiplied by one x in one launch: their rows
 * are numbered one after another (end: cumulative row counts). */
struct gemv_set {
    const void *w[LMX_MAX_MULTI];
    float *out[LMX_MAX_MULTI];
    int end[LMX_MAX_MULTI];
    int n;
};

/* out[r, n] = x[r, :] . w[n, :] for r < nr <= R, one warp per weight row,
 * float32 accumulation; needs K % wvec<W>::N == 0. GATED: s holds gate and
 * up, and each warp computes out[0] = act(x . gate) * (x . up) for one row
 * of both. */
template <typename W, int R, bool GATED>
__global__ void __launch_bounds__(GEMV_WARPS * 32)
    k_gemv(gemv_set s, const float *__restrict__ x, int K, int nr, int gelu)
{
    constexpr int M = GATED ? 2 : 1;
    int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    int n = blockIdx.x * GEMV_WARPS + warp;
    if (n >= s.end[GATED ? 0 : s.n - 1])
        return;
    /* which weight row n is (constant indices keep s out of local memory) */
    const W *w = (const W *)s.w[0];
    float *out = s.out[0];
    int row = n, N = s.end[0];
#pragma unroll
    for (int j = 1; j < LMX_MAX_MULTI; j++)
        if (!GATED && j < s.n && n >= s.end[j - 1]) {
            w = (const W *)s.w[j];
            out = s.out[j];
            row = n - s.end[j - 1];
            N = s.end[j] - s.end[j - 1];
        }
    const uint4 *wr[M];
    wr[0] = (const uint4 *)(w + (size_t)row * K);
    if (GATED)
        wr[M - 1] = (const uint4 *)((const W *)s.w[1] + (size_t)row * K);
    float acc[M][R];
#pragma unroll
    for (int m = 0; m < M; m++)
#pragma unroll
        for (int r = 0; r < R; r++)
            acc[m][r] = 0;
    dot_rows<W, R, M>(acc, wr, x, K, nr, lane);
#pragma unroll
    for (int r = 0; r < R; r++) {
        float v = warp_sum(acc[0][r]);
        if (GATED)
            v = act_fn(v, gelu) * warp_sum(acc[M - 1][r]);
        if (lane == 0 && r < nr)
            out[(size_t)r * N + row] = v;
    }
}

/* Any K, any alignment: one warp per (row of x, weight row). */
__global__ void k_gemv_any(float *out, const float *x, const void *w, int dt, int N, int K)
{
    pdl_wait();
    pdl_trigger();
    int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    int n = blockIdx.x * GEMV_WARPS + warp, r = blockIdx.y;
    if (n >= N)
        return;
    float acc = 0;
    for (int k = lane; k < K; k += 32)
        acc += load_w(w, dt, (size_t)n * K + k) * x[(size_t)r * K + k];
    acc = warp_sum(acc);
    if (lane == 0)
        out[(size_t)r * N + n] = acc;
}
