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

/* GEMV shape; bench/decode_variants.sh builds other values to compare
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

/* One weight row as a GEMV streams it: 16-byte chunks, and for q8/q4 the
 * row's group (scale, bias) pairs. */
struct wrow {
    const uint4 *w;
    const __half2 *sb;
};

/* What a GEMV multiplies: nr rows of K floats and, for q8/q4 weights, the
 * same rows quantized (xquant) with groups of 1 << gshift, ng a row. */
struct xin {
    const float *x;
    const int8_t *xq;
    const float2 *xds;
    int K, gshift, ng;
};

/* Float weights stored as W: a chunk is wvec<W>::N elements. dot adds
 * chunk c of M weight rows (u) times x's rows to acc: each piece of x is
 * loaded once for the M rows. */
template <typename W> struct fmt_float {
    enum { N = wvec<W>::N, QUANT = 0 };
    template <int R, int M>
    static __device__ __forceinline__ void dot(float (&acc)[M][R], const uint4 (&u)[M], const wrow (&)[M],
                                               const xin &x, int c, int nr)
    {
        float f[M][N];
#pragma unroll
        for (int m = 0; m < M; m++)
            wvec<W>::cvt(u[m], f[m]);
#pragma unroll
        for (int r = 0; r < R; r++) {
            if (r < nr) {
                const float4 *xr = (const float4 *)(x.x + (size_t)r * x.K + (size_t)c * N);
#pragma unroll
                for (int q = 0; q < N / 4; q++) {
                    float4 xv = __ldg(xr + q);
#pragma unroll
                    for (int m = 0; m < M; m++)
                        acc[m][r] += f[m][4 * q] * xv.x + f[m][4 * q + 1] * xv.y + f[m][4 * q + 2] * xv.z +
                                     f[m][4 * q + 3] * xv.w;
                }
            }
        }
    }
};

/* d = a . b + c over 4 byte pairs, a's bytes unsigned and b's signed. */
__device__ __forceinline__ int dp4a_us(unsigned a, int b, int c)
{
    int d;
    asm("dp4a.u32.s32 %0, %1, %2, %3;" : "=r"(d) : "r"(a), "r"(b), "r"(c));
    return d;
}

/* q8/q4 weights (docs/quantization.md): a chunk is 16 or 32 elements of one
 * group. The group's sum is xd * (s * (q . xq) + b * sum(xq)) as on the
 * CPU: an exact integer dot product, then the scale; the bias term once per
 * group, from its first chunk. q4: a 32-bit word holds 8 elements, the low
 * nibbles the even ones; k_quant_x stores x's runs of 8 evens first to
 * match. */
template <int BITS> struct fmt_quant {
    enum { N = 128 / BITS, QUANT = 1 };
    template <int R, int M>
    static __device__ __forceinline__ void dot(float (&acc)[M][R], const uint4 (&u)[M], const wrow (&w)[M],
                                               const xin &x, int c, int nr)
    {
        int k = c * N, g = k >> x.gshift;
        bool first = (k & ((1 << x.gshift) - 1)) == 0;
        float s[M], b[M];
#pragma unroll
        for (int m = 0; m < M; m++) {
            float2 sb = __half22float2(w[m].sb[g]);
            s[m] = sb.x;
            b[m] = first ? sb.y : 0.0f;
        }
        const unsigned msk = 0x0f0f0f0fu;
#pragma unroll
        for (int r = 0; r < R; r++) {
            if (r < nr) {
                const int4 *xq = (const int4 *)(x.xq + (size_t)r * x.K + k);
                int4 a = __ldg(xq), a2 = BITS == 8 ? a : __ldg(xq + 1);
                float2 xds = __ldg(x.xds + (size_t)r * x.ng + g);
#pragma unroll
                for (int m = 0; m < M; m++) {
                    const uint4 v = u[m];
                    int d;
                    if (BITS == 8) {
                        d = dp4a_us(v.w, a.w, dp4a_us(v.z, a.z, dp4a_us(v.y, a.y, dp4a_us(v.x, a.x, 0))));
                    } else {
                        d = dp4a_us(v.x & msk, a.x, 0);
                        d = dp4a_us((v.x >> 4) & msk, a.y, d);
                        d = dp4a_us(v.y & msk, a.z, d);
                        d = dp4a_us((v.y >> 4) & msk, a.w, d);
                        d = dp4a_us(v.z & msk, a2.x, d);
                        d = dp4a_us((v.z >> 4) & msk, a2.y, d);
                        d = dp4a_us(v.w & msk, a2.z, d);
                        d = dp4a_us((v.w >> 4) & msk, a2.w, d);
                    }
                    acc[m][r] += xds.x * (s[m] * (float)d) + b[m] * xds.y;
                }
            }
        }
    }
};

/* acc[m][r] += this thread's share of x[r, :] . wr[m] for r < nr, m < M
 * weight rows of nv chunks, T threads a row (t: this one's index among
 * them): U 16-byte loads per thread and row in flight while the previous
 * batch is summed, weights streamed past L1 (x stays cached). The first
 * batch is loaded before waiting on the previous kernel (weights never
 * change); the wait comes after. */
template <typename F, int R, int M, int U, int T>
__device__ __forceinline__ void dot_rows(float (&acc)[M][R], const wrow (&wr)[M], const xin &x, int nv, int nr, int t)
{
    uint4 u[M][U];
#pragma unroll
    for (int j = 0; j < U; j++)
#pragma unroll
        for (int m = 0; m < M; m++)
            if (t + T * j < nv)
                u[m][j] = __ldcs(wr[m].w + t + T * j);
    pdl_trigger();
    pdl_wait();
    for (int i = t; i < nv; i += T * U) {
        uint4 cur[M][U];
#pragma unroll
        for (int j = 0; j < U; j++)
#pragma unroll
            for (int m = 0; m < M; m++) {
                cur[m][j] = u[m][j];
                if (i + T * (U + j) < nv)
                    u[m][j] = __ldcs(wr[m].w + i + T * (U + j));
            }
#pragma unroll
        for (int j = 0; j < U; j++) {
            if (i + T * j >= nv)
                break;
            uint4 c[M];
#pragma unroll
            for (int m = 0; m < M; m++)
                c[m] = cur[m][j];
            F::template dot<R, M>(acc, c, wr, x, i + T * j, nr);
        }
    }
}

/* Weights of one format and K multiplied by one x in one launch: their rows
 * are numbered one after another (end: cumulative row counts); sb: q8/q4
 * (scale, bias) pairs. */
struct gemv_set {
    const void *w[LMX_MAX_MULTI];
    const __half2 *sb[LMX_MAX_MULTI];
    float *out[LMX_MAX_MULTI];
    int end[LMX_MAX_MULTI];
    int n;
};

/* Row `row` of weight w (nv chunks a row) and of its (scale, bias) pairs
 * (ng a row; NULL for float weights). */
__device__ __forceinline__ wrow row_of(const void *w, const __half2 *sb, int row, int nv, int ng)
{
    return wrow{(const uint4 *)w + (size_t)row * nv, sb ? sb + (size_t)row * ng : NULL};
}

/* Where set row n lies: its weight row, its output and its row there. */
struct slot_row {
    wrow w;
    float *out;
    int row, N;
};
__device__ __forceinline__ slot_row locate(const gemv_set &s, int n, int nv, int ng)
{
    const void *w = s.w[0];
    const __half2 *sb = s.sb[0];
    float *out = s.out[0];
    int row = n, N = s.end[0];
#pragma unroll
    for (int i = 1; i < LMX_MAX_MULTI; i++) /* constant indices keep s out of local memory */
        if (i < s.n && n >= s.end[i - 1]) {
            w = s.w[i];
            sb = s.sb[i];
            out = s.out[i];
            row = n - s.end[i - 1];
            N = s.end[i] - s.end[i - 1];
        }
    return slot_row{row_of(w, sb, row, nv, ng), out, row, N};
}

/* out[r, n] = x[r, :] . w[n, :] for r < nr <= R, float32 accumulation;
 * needs K % F::N == 0. A block holds GEMV_WARPS / WPR row slots of WPR
 * warps each: the warps of a slot sum slices of its weight rows and add
 * them up through shared memory (WPR = 2 for matrices of few rows, whose
 * one-warp grid would leave the multiprocessors short of loads in
 * flight). A slot takes RPS consecutive rows of the set (RPS divides every
 * matrix's rows): each piece of x it loads serves all of them. U: loads in
 * flight per thread and row. GATED: s holds gate and up, and a slot
 * computes out[0] = act(x . gate) * (x . up) for RPS rows of both. */
template <typename F, int R, bool GATED, int U, int WPR, int RPS = 1>
__global__ void __launch_bounds__(GEMV_WARPS * 32) k_gemv(gemv_set s, xin x, int nr, int gelu)
{
    constexpr int M = GATED ? 2 * RPS : RPS, SLOTS = GEMV_WARPS / WPR;
    __shared__ float part[GEMV_WARPS][M][R];
    int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, slot = warp / WPR, t = (warp % WPR) * 32 + lane;
    int n = (blockIdx.x * SLOTS + slot) * RPS, total = s.end[0];
#pragma unroll
    for (int i = 1; i < LMX_MAX_MULTI; i++) /* constant indices keep s out of local memory */
        if (!GATED && i < s.n)
            total = s.end[i];
    if (n >= total) /* the slot's warps leave together */
        return;
    int nv = x.K / F::N;
    slot_row g[M];
    if constexpr (GATED) {
#pragma unroll
        for (int m = 0; m < RPS; m++) {
            g[m] = slot_row{row_of(s.w[0], s.sb[0], n + m, nv, x.ng), s.out[0], n + m, s.end[0]};
            g[RPS + m] = slot_row{row_of(s.w[1], s.sb[1], n + m, nv, x.ng), NULL, n + m, 0};
        }
    } else {
#pragma unroll
        for (int m = 0; m < M; m++)
            g[m] = locate(s, n + m, nv, x.ng);
    }
    wrow wr[M];
#pragma unroll
    for (int m = 0; m < M; m++)
        wr[m] = g[m].w;
    float acc[M][R];
#pragma unroll
    for (int m = 0; m < M; m++)
#pragma unroll
        for (int r = 0; r < R; r++)
            acc[m][r] = 0;
    dot_rows<F, R, M, U, 32 * WPR>(acc, wr, x, nv, nr, t);
#pragma unroll
    for (int m = 0; m < M; m++)
#pragma unroll
        for (int r = 0; r < R; r++)
            acc[m][r] = warp_sum(acc[m][r]);
    if (WPR > 1) { /* the slot's first warp adds the others' sums (a barrier per slot) */
        if (lane == 0)
#pragma unroll
            for (int m = 0; m < M; m++)
#pragma unroll
                for (int r = 0; r < R; r++)
                    part[warp][m][r] = acc[m][r];
        asm volatile("bar.sync %0, %1;" ::"r"(slot + 1), "r"(WPR * 32) : "memory");
#pragma unroll
        for (int m = 0; m < M; m++)
#pragma unroll
            for (int r = 0; r < R; r++)
#pragma unroll
                for (int k = 1; k < WPR; k++)
                    acc[m][r] += part[slot * WPR + k][m][r];
    }
    if (t != 0)
        return;
    if constexpr (GATED) {
#pragma unroll
        for (int m = 0; m < RPS; m++)
#pragma unroll
            for (int r = 0; r < R; r++)
                if (r < nr)
                    g[m].out[(size_t)r * g[m].N + g[m].row] = act_fn(acc[m][r], gelu) * acc[RPS + m][r];
    } else {
#pragma unroll
        for (int m = 0; m < M; m++)
#pragma unroll
            for (int r = 0; r < R; r++)
                if (r < nr)
                    g[m].out[(size_t)r * g[m].N + g[m].row] = acc[m][r];
    }
}

/* x quantized for the q8/q4 GEMV (xquant), four elements a thread. */
__global__ void k_quant_x(xquant q, const float *x, int K, int nr)
{
    pdl_trigger();
    pdl_wait();
    size_t t = blockIdx.x * (size_t)blockDim.x + threadIdx.x, n4 = (size_t)nr * K / 4;
    bool valid = t < n4;
    int r = valid ? (int)(t / (K / 4)) : 0, e = valid ? (int)(t % (K / 4)) * 4 : 0;
    float4 h = valid ? *(const float4 *)(x + (size_t)r * K + e) : make_float4(0, 0, 0, 0);
    quant4(q, h, r, e, K, valid);
}

/* Rows of up to LMX_MAX_MULTI q8/q4 weights of one width, stacked: entry
 * i's rows from[i] on fill the stack's rows up to end[i] (unused entries:
 * end INT_MAX). */
struct wstack {
    wview w[LMX_MAX_MULTI];
    int from[LMX_MAX_MULTI], end[LMX_MAX_MULTI];
};

/* The stack's first `elems` elements (cols K, a multiple of 16) as bf16
 * (prefill: the tensor cores take them from there), 16 of one group a
 * thread: all rows of all its weights in one launch, every thread busy
 * whatever K; one division a thread, one load of weights and one of
 * (scale, bias), both before the wait (weights never change). */
__global__ void k_dequant(__nv_bfloat16 *dst, wstack s, int K, size_t elems)
{
    size_t e = ((size_t)blockIdx.x * blockDim.x + threadIdx.x) * 16;
    bool in = e < elems;
    int R = (int)((unsigned)e / (unsigned)K), c = (int)((unsigned)e - (unsigned)R * K); /* elems < 2^32 */
    wview w = s.w[0];
    size_t r = (size_t)R + s.from[0];
#pragma unroll
    for (int k = 1; k < LMX_MAX_MULTI; k++) /* constant indices: the entries stay in parameter space */
        if (R >= s.end[k - 1]) {
            w = s.w[k];
            r = (size_t)(R - s.end[k - 1]) + s.from[k];
        }
    const uint8_t *row = (const uint8_t *)w.data + r * w.cols * w.bits / 8;
    uint4 v = make_uint4(0, 0, 0, 0);
    float2 sb = make_float2(0, 0);
    if (in) {
        sb = __half22float2(w.sb[r * (w.cols / w.group) + c / w.group]);
        if (w.bits == 8) {
            v = *(const uint4 *)(row + c);
        } else {
            uint2 h = *(const uint2 *)(row + c / 2);
            v = make_uint4(h.x, h.y, 0, 0);
        }
    }
    pdl_trigger();
    pdl_wait(); /* dst may still be read by the previous product */
    if (!in)
        return;
    unsigned q[4] = {v.x, v.y, v.z, v.w}, out[8];
#pragma unroll
    for (int k = 0; k < 8; k++) { /* elements 2k, 2k + 1 */
        unsigned e0, e1;
        if (w.bits == 8) {
            e0 = (q[k >> 1] >> (16 * (k & 1))) & 255;
            e1 = (q[k >> 1] >> (16 * (k & 1) + 8)) & 255;
        } else {
            e0 = (q[k >> 2] >> (8 * (k & 3))) & 15;
            e1 = (q[k >> 2] >> (8 * (k & 3) + 4)) & 15;
        }
        out[k] = pack_bf16(sb.x * (float)e0 + sb.y, sb.x * (float)e1 + sb.y);
    }
    uint4 *d = (uint4 *)(dst + e);
    d[0] = make_uint4(out[0], out[1], out[2], out[3]);
    d[1] = make_uint4(out[4], out[5], out[6], out[7]);
}

/* Any K, any alignment: one warp per (row of x, weight row). */
__global__ void k_gemv_any(float *out, const float *x, const void *w, int dt, int N, int K)
{
    pdl_trigger();
    pdl_wait();
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
