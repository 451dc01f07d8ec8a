/* Small kernels: embedding lookup, norms, q/k preparation (norm, RoPE,
 * cache store), conversion to bf16, activations. */
#pragma once

/* Rows of ids outside [first_id, first_id + rows) are zero. */
__global__ void k_embed(float *out, wview table, int rows, const int *ids, int first_id, float scale)
{
    pdl_trigger();
    pdl_wait();
    int i = blockIdx.y, id = ids[i] - first_id, cols = table.cols;
    bool mine = id >= 0 && id < rows;
    for (int c = blockIdx.x * blockDim.x + threadIdx.x; c < cols; c += gridDim.x * blockDim.x)
        out[(size_t)i * cols + c] = mine ? wview_at(table, (size_t)id, c) * scale : 0.0f;
}

/* Norm kernels: one block per row of dim, the row in registers, V float4s
 * a thread (element e = 4 * (thread + i * blockDim.x) of chunk i), so that
 * every load of a row is in flight at once and the row is read once. */
__device__ __forceinline__ int chunk_at(int i) { return 4 * (threadIdx.x + i * blockDim.x); }

/* Four bf16 (packed, the first in the low half of v.x) as float. */
__device__ __forceinline__ float4 bf16x4(uint2 v)
{
    return make_float4(__uint_as_float(v.x << 16), __uint_as_float(v.x & 0xffff0000u), __uint_as_float(v.y << 16),
                       __uint_as_float(v.y & 0xffff0000u));
}

/* Four elements [4i, 4i + 4) of p as float. */
__device__ __forceinline__ float4 load4_at(const float *p, size_t i) { return ((const float4 *)p)[i]; }
__device__ __forceinline__ float4 load4_at(const __nv_bfloat16 *p, size_t i) { return bf16x4(((const uint2 *)p)[i]); }

/* Elements [e, e + 4) of a row of dim floats at p, zero past its end.
 * A: dim is a multiple of 4 (and the norm weights are bf16), known to the
 * compiler, which then leaves out the element-wise paths: less code for a
 * decode step's norms to fetch. */
template <bool A> __device__ __forceinline__ float4 load4(const float *p, int e, int dim)
{
    if (A)
        return e < dim ? *(const float4 *)(p + e) : make_float4(0, 0, 0, 0);
    if ((dim & 3) == 0 && e < dim)
        return *(const float4 *)(p + e);
    float v[4];
    for (int i = 0; i < 4; i++)
        v[i] = e + i < dim ? p[e + i] : 0.0f;
    return make_float4(v[0], v[1], v[2], v[3]);
}

/* Elements [e, e + 4) of a row of dim, as float or rounded to bf16. */
template <bool A, typename T> __device__ __forceinline__ void store4(T *p, int e, int dim, float4 v)
{
    if (A && e >= dim)
        return;
    if (A || ((dim & 3) == 0 && e < dim)) {
        if constexpr (sizeof(T) == 4)
            *(float4 *)(p + e) = v;
        else
            *(uint2 *)(p + e) = make_uint2(pack_bf16(v.x, v.y), pack_bf16(v.z, v.w));
        return;
    }
    float f[4] = {v.x, v.y, v.z, v.w};
    for (int i = 0; i < 4; i++)
        if (e + i < dim)
            p[e + i] = T(f[i]);
}

/* A norm weight's elements of this thread (no kernel writes weights: read
 * before waiting on the previous kernel); A: bf16 weights, dim a multiple
 * of 4. */
template <bool A, int V>
__device__ __forceinline__ void load_norm(float4 (&w)[V], const void *p, int dt, int dim, int plus_one)
{
#pragma unroll
    for (int i = 0; i < V; i++) {
        int e = chunk_at(i);
        float f[4];
        if (A) {
            float4 v = bf16x4(e < dim ? *(const uint2 *)((const __nv_bfloat16 *)p + e) : make_uint2(0, 0));
            float b[4] = {v.x, v.y, v.z, v.w};
            for (int k = 0; k < 4; k++)
                f[k] = plus_one && e < dim ? 1.0f + b[k] : b[k];
        } else {
            for (int k = 0; k < 4; k++)
                f[k] = e + k < dim ? norm_w(p, dt, e + k, plus_one) : 0.0f;
        }
        w[i] = make_float4(f[0], f[1], f[2], f[3]);
    }
}

template <int V> __device__ __forceinline__ float sum_squares(const float4 (&v)[V], int dim, float *red)
{
    float ss = 0;
#pragma unroll
    for (int i = 0; i < V; i++)
        ss += v[i].x * v[i].x + v[i].y * v[i].y + v[i].z * v[i].z + v[i].w * v[i].w;
    return block_sum(ss, red);
}

__device__ __forceinline__ float4 scale4(float4 v, float r, float4 w)
{
    return make_float4(v.x * r * w.x, v.y * r * w.y, v.z * r * w.z, v.w * r * w.w);
}

/* Row `row` of out = rmsnorm(v) * w, also quantized with q.xq (whole rows
 * only; the groups then divide dim) and in bf16 with ob (prefill). */
template <bool A, int V>
__device__ __forceinline__ void norm_store(const float4 (&v)[V], const float4 (&w)[V], float *out,
                                           __nv_bfloat16 *ob, int row, int dim, float eps, float *red,
                                           const xquant &q)
{
    float r = 1.0f / sqrtf(sum_squares(v, dim, red) / dim + eps);
#pragma unroll
    for (int i = 0; i < V; i++) {
        int e = chunk_at(i);
        float4 h = scale4(v[i], r, w[i]);
        if (out)
            store4<A>(out + (size_t)row * dim, e, dim, h);
        if (q.xq)
            quant4(q, h, row, e, dim, e < dim);
        if (ob)
            store4<A>(ob + (size_t)row * dim, e, dim, h);
    }
}

/* One block per dim-long vector; with q.xq (vectors that are whole rows)
 * the output is also quantized for the q8/q4 GEMV that reads it, with ob
 * written in bf16 for the tensor cores. */
template <int V, bool A>
__global__ void __launch_bounds__(1024) k_rmsnorm(float *out, __nv_bfloat16 *ob, const float *x, const void *w,
                                                  int dt, int dim, float eps, int plus_one, xquant q)
{
    float4 wv[V], v[V];
    load_norm<A>(wv, w, dt, dim, plus_one);
    pdl_trigger();
    pdl_wait();
    __shared__ float red[32];
#pragma unroll
    for (int i = 0; i < V; i++)
        v[i] = load4<A>(x + (size_t)blockIdx.x * dim, chunk_at(i), dim);
    norm_store<A>(v, wv, out, ob, blockIdx.x, dim, eps, red, q);
}

/* A residual connection and the next norm, one block per row of dim:
 * y' = post ? rmsnorm(y, post) : y; x += y'; h = rmsnorm(x, next); h also
 * quantized with q.xq or in bf16 with hb, as k_rmsnorm. */
template <int V, bool A>
__global__ void __launch_bounds__(1024)
    k_residual_norm(float *__restrict__ x, float *__restrict__ h, __nv_bfloat16 *hb, const float *__restrict__ y,
                    const void *post, int dt_post, const void *next, int dt_next, int dim, float eps, int plus_one,
                    xquant q)
{
    float4 wp[V], wn[V], xv[V], yv[V];
    if (post)
        load_norm<A>(wp, post, dt_post, dim, plus_one);
    load_norm<A>(wn, next, dt_next, dim, plus_one);
    pdl_trigger();
    pdl_wait();
    __shared__ float red[32];
    size_t row = (size_t)blockIdx.x * dim;
#pragma unroll
    for (int i = 0; i < V; i++) {
        xv[i] = load4<A>(x + row, chunk_at(i), dim);
        yv[i] = load4<A>(y + row, chunk_at(i), dim);
    }
    float rp = post ? 1.0f / sqrtf(sum_squares(yv, dim, red) / dim + eps) : 1.0f;
#pragma unroll
    for (int i = 0; i < V; i++) {
        float4 d = post ? scale4(yv[i], rp, wp[i]) : yv[i];
        xv[i] = make_float4(xv[i].x + d.x, xv[i].y + d.y, xv[i].z + d.z, xv[i].w + d.w);
        store4<A>(x + row, chunk_at(i), dim, xv[i]);
    }
    norm_store<A>(xv, wn, h, hb, blockIdx.x, dim, eps, red, q);
}

/* n floats to bf16, eight a thread at a time (16-byte stores). */
__global__ void k_to_bf16(__nv_bfloat16 *dst, const float *src, size_t n)
{
    pdl_trigger();
    pdl_wait();
    size_t stride = (size_t)gridDim.x * blockDim.x, first = blockIdx.x * (size_t)blockDim.x + threadIdx.x;
    for (size_t i = first; i < n / 8; i += stride) {
        float4 a = ((const float4 *)src)[2 * i], c = ((const float4 *)src)[2 * i + 1];
        ((uint4 *)dst)[i] =
            make_uint4(pack_bf16(a.x, a.y), pack_bf16(a.z, a.w), pack_bf16(c.x, c.y), pack_bf16(c.z, c.w));
    }
    for (size_t i = n / 8 * 8 + first; i < n; i += stride)
        dst[i] = __float2bfloat16_rn(src[i]);
}

/* n bf16 back to float32, four a thread at a time (need_f32). */
__global__ void k_from_bf16(float *dst, const __nv_bfloat16 *src, size_t n)
{
    pdl_trigger();
    pdl_wait();
    size_t stride = (size_t)gridDim.x * blockDim.x, first = blockIdx.x * (size_t)blockDim.x + threadIdx.x;
    for (size_t i = first; i < n / 4; i += stride)
        ((float4 *)dst)[i] = load4_at(src, i);
    for (size_t i = n / 4 * 4 + first; i < n; i += stride)
        dst[i] = __bfloat162float(src[i]);
}

enum { QK_WARPS = 4, QK_ROWS = 4 };

/* A head's norm weights and RoPE inverse frequencies at the rotation pairs
 * a lane holds (p = lane + 32 j, j < P: elements p and p + hd / 2, which
 * share one angle); zeros past the head or when !live. Weights and
 * frequencies never change: read before the wait. */
template <int P> struct head_pairs {
    float w0[P], w1[P], f[P];
};
template <int P>
__device__ __forceinline__ void load_pairs(head_pairs<P> &h, const void *nw, int dt, const float *inv, int hd,
                                           int plus_one, bool live)
{
    int lane = threadIdx.x & 31, half = hd / 2;
#pragma unroll
    for (int j = 0; j < P; j++) {
        int p = lane + 32 * j;
        bool in = live && p < half;
        h.w0[j] = in ? norm_w(nw, dt, p, plus_one) : 0.0f;
        h.w1[j] = in ? norm_w(nw, dt, p + half, plus_one) : 0.0f;
        h.f[j] = in ? inv[p] : 0.0f;
    }
}

/* RoPE's cosines and sines at position pos for the pairs a lane holds. */
template <int P> struct rope_angles {
    float c[P], s[P];
};
template <int P> __device__ __forceinline__ rope_angles<P> angles_at(const head_pairs<P> &h, int pos)
{
    rope_angles<P> a;
#pragma unroll
    for (int j = 0; j < P; j++)
        sincosf((float)pos * h.f[j], &a.s[j], &a.c[j]);
    return a;
}

/* One head row held by a warp in pairs (every lane calls it): RMSNorm over
 * hd, then rotate-half RoPE by the angles of its position, in place. */
template <int P>
__device__ __forceinline__ void norm_rotate(float (&x0)[P], float (&x1)[P], const head_pairs<P> &h, int hd, float eps,
                                           const rope_angles<P> &r)
{
    float ss = 0;
#pragma unroll
    for (int j = 0; j < P; j++)
        ss += x0[j] * x0[j] + x1[j] * x1[j];
    float rs = 1.0f / sqrtf(warp_sum(ss) / hd + eps);
#pragma unroll
    for (int j = 0; j < P; j++) {
        float a = x0[j] * rs * h.w0[j], b = x1[j] * rs * h.w1[j];
        x0[j] = a * r.c[j] - b * r.s[j];
        x1[j] = b * r.c[j] + a * r.s[j];
    }
}

/* norm_rotate at position pos (one sincos a pair). */
template <int P>
__device__ __forceinline__ void norm_rope(float (&x0)[P], float (&x1)[P], const head_pairs<P> &h, int hd, float eps,
                                          int pos)
{
    norm_rotate(x0, x1, h, hd, eps, angles_at(h, pos));
}

/* A head row's pairs from src, float or bf16 (zeros past the head or when
 * !in). */
template <int P, typename T>
__device__ __forceinline__ void load_head(float (&x0)[P], float (&x1)[P], const T *src, int hd, bool in)
{
    int lane = threadIdx.x & 31, half = hd / 2;
#pragma unroll
    for (int j = 0; j < P; j++) {
        int p = lane + 32 * j;
        x0[j] = in && p < half ? (float)src[p] : 0.0f;
        x1[j] = in && p < half ? (float)src[p + half] : 0.0f;
    }
}

/* A head row held by a warp in pairs (load_head) to dst, as T (float, or
 * bf16 rounded to nearest). */
template <typename T, int P>
__device__ __forceinline__ void store_head(T *dst, const float (&x0)[P], const float (&x1)[P], int hd)
{
    int lane = threadIdx.x & 31, half = hd / 2;
#pragma unroll
    for (int j = 0; j < P; j++) {
        int p = lane + 32 * j;
        if (p < half) {
            dst[p] = T(x0[j]);
            dst[p + half] = T(x1[j]);
        }
    }
}

/* Attention's inputs, one warp per (head, QK_ROWS rows), QK_WARPS heads a
 * block; heads [0, Hq) are q's, [Hq, Hq + Hk) k's. Each head: RMSNorm over
 * head_dim, rotate-half RoPE (inv: the float32 inverse frequencies computed
 * on the host as the CPU backend does); q's heads back in place, k's to the
 * cache with v's head of the same number, both rounded to bf16 (the
 * cache's precision). Lane l holds the rotation pairs of head_pairs (head_dim
 * up to 64 P). Its norm weights and frequencies are read before the wait,
 * then every row's elements in one round of loads (one row a warp moved 2
 * TB/s; four rows a warp took Qwen3-0.6B's 4096-token prefill from 246.8k
 * to 252.8k tok/s, bench/RESULTS.md). q, k and v are T: float32, or bf16
 * (a prefill's products packed them, bf16_rows). Decode steps fold this
 * into the attention kernel instead (k_attn_dec's qk_fuse). */
template <int P, typename T>
__global__ void __launch_bounds__(QK_WARPS * 32)
    k_qk_prepare(T *q, const T *k, const T *v, const void *qn, int dt_q, const void *kn, int dt_k,
                 __nv_bfloat16 *kc, __nv_bfloat16 *vc, const float *inv, int hd, int Hq, int Hk, int slots,
                 const int *dpos, int pos0, int n_rows, float eps, int plus_one)
{
    int warp = threadIdx.x >> 5, h = blockIdx.x * QK_WARPS + warp;
    int i0 = blockIdx.y * QK_ROWS, nr = min(QK_ROWS, n_rows - i0);
    bool is_q = h < Hq, live = h < Hq + Hk;
    head_pairs<P> hp;
    load_pairs(hp, is_q ? qn : kn, is_q ? dt_q : dt_k, inv, hd, plus_one, live);
    pdl_trigger();
    pdl_wait();
    if (!live)
        return;
    int hh = is_q ? h : h - Hq, cols = (is_q ? Hq : Hk) * hd;
    const T *src = is_q ? q : k;
    float x0[QK_ROWS][P], x1[QK_ROWS][P], v0[QK_ROWS][P], v1[QK_ROWS][P];
#pragma unroll
    for (int r = 0; r < QK_ROWS; r++) {
        size_t at = (size_t)(i0 + r) * cols + (size_t)hh * hd;
        load_head(x0[r], x1[r], src + at, hd, r < nr);
        load_head(v0[r], v1[r], v + at, hd, r < nr && !is_q);
    }
    int pos0r = (dpos ? *dpos : pos0) + i0;
#pragma unroll
    for (int r = 0; r < QK_ROWS; r++) {
        if (r >= nr)
            break;
        int pos = pos0r + r;
        norm_rope(x0[r], x1[r], hp, hd, eps, pos);
        size_t at = (size_t)(i0 + r) * cols + (size_t)hh * hd, slot = (size_t)(pos % slots) * cols + (size_t)hh * hd;
        if (is_q) {
            store_head(q + at, x0[r], x1[r], hd);
        } else {
            store_head(kc + slot, x0[r], x1[r], hd);
            store_head(vc + slot, v0[r], v1[r], hd);
        }
    }
}

/* Pointers for a batched cuBLAS product, to device memory (kernel
 * arguments are copied at launch: nothing on the host must outlive it). */
struct ptr_set {
    const void *p[3 * LMX_MAX_MULTI];
};
__global__ void k_set_ptrs(const void **dst, ptr_set s)
{
    pdl_trigger();
    pdl_wait(); /* the previous product may still read them */
    if (threadIdx.x < 3 * LMX_MAX_MULTI)
        dst[threadIdx.x] = s.p[threadIdx.x];
}

/* act(g) * u over n elements, four a thread, into out (float32; may be g)
 * and, with ob (prefill), in bf16 for the next product; T: float32 g and
 * u, or bf16 ones (the products wrote them so: matmuls' lean gated
 * prefill). */
template <typename T>
__global__ void k_gated_act(float *out, __nv_bfloat16 *ob, const T *g, const T *u, size_t n, int gelu)
{
    pdl_trigger();
    pdl_wait();
    size_t stride = (size_t)gridDim.x * blockDim.x, first = blockIdx.x * (size_t)blockDim.x + threadIdx.x;
    uintptr_t at = (uintptr_t)out | (uintptr_t)ob | (uintptr_t)g | (uintptr_t)u;
    size_t n4 = at % 16 == 0 ? n / 4 : 0; /* row slices: any offset */
    for (size_t i = first; i < n4; i += stride) {
        float4 a = load4_at(g, i), b = load4_at(u, i);
        a = make_float4(act_fn(a.x, gelu) * b.x, act_fn(a.y, gelu) * b.y, act_fn(a.z, gelu) * b.z,
                        act_fn(a.w, gelu) * b.w);
        if (out)
            ((float4 *)out)[i] = a;
        if (ob)
            ((uint2 *)ob)[i] = make_uint2(pack_bf16(a.x, a.y), pack_bf16(a.z, a.w));
    }
    for (size_t i = n4 * 4 + first; i < n; i += stride) {
        float a = act_fn((float)g[i], gelu) * (float)u[i];
        if (out)
            out[i] = a;
        if (ob)
            ob[i] = __float2bfloat16_rn(a);
    }
}

__global__ void k_softcap(float *x, size_t n, float cap)
{
    pdl_trigger();
    pdl_wait();
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
        x[i] = cap * tanhf(x[i] / cap);
}

/* read_argmax: each block the best (score, column) of its share of a row,
 * by src/argmax.h's rule; the host merges the blocks' results. An empty
 * share gives (NaN, INT32_MAX), which every element beats. */
enum { ARGMAX_BLOCKS = 128 };

__device__ __forceinline__ void take_better(lmx_scored &t, float s, int32_t c)
{
    if (lmx_argmax_beats(s, c, t.score, t.col))
        t = lmx_scored{s, c};
}

__global__ void __launch_bounds__(256) k_argmax(lmx_scored *part, const float *x, int n)
{
    __shared__ lmx_scored warps[8];
    pdl_trigger();
    pdl_wait();
    lmx_scored t = {__int_as_float(0x7fc00000), INT32_MAX};
    for (int i = blockIdx.x * 256 + threadIdx.x; i < n; i += gridDim.x * 256) /* ascending: ties keep the first */
        take_better(t, x[i], i);
    for (int o = 16; o; o >>= 1)
        take_better(t, __shfl_down_sync(~0u, t.score, o), __shfl_down_sync(~0u, t.col, o));
    if ((threadIdx.x & 31) == 0)
        warps[threadIdx.x >> 5] = t;
    __syncthreads();
    if (threadIdx.x == 0) {
        for (int w = 1; w < 8; w++)
            take_better(t, warps[w].score, warps[w].col);
        part[blockIdx.x] = t;
    }
}

/* read_topk: block b keeps the k best of its slice of a row, [b n / G,
 * (b + 1) n / G) for G blocks, in src/topk.h's rank order: tiles of the
 * slice, each behind the k best so far, sorted by a key that orders as the
 * rank does (bitonic sort in shared memory). Qwen3's and Gemma3's slices
 * fit one tile. */
enum { TOPK_TILE = 4096, TOPK_THREADS = 1024 };

/* Larger key, better rank: the score's bits made to order as unsigned
 * numbers (-0 as +0, NaN lowest), then the column inverted (lower first).
 * Key 0 is padding and decodes to column -1. */
__device__ __forceinline__ unsigned long long rank_key(float s, int col)
{
    unsigned u = __float_as_uint(s == 0.0f ? 0.0f : s);
    u = s != s ? 0u : (u & 0x80000000u) ? ~u : u | 0x80000000u;
    return (unsigned long long)u << 32 | (unsigned)~col;
}

__device__ __forceinline__ lmx_scored from_key(unsigned long long key)
{
    unsigned u = (unsigned)(key >> 32);
    float s = u == 0 ? __int_as_float(0x7fc00000) : __uint_as_float(u & 0x80000000u ? u & 0x7fffffffu : ~u);
    return lmx_scored{s, (int32_t)~(unsigned)key};
}

/* t[0, size) in descending order; size a power of two. */
__device__ void bitonic_descending(unsigned long long *t, int size)
{
    for (int len = 2; len <= size; len <<= 1)
        for (int stride = len >> 1; stride > 0; stride >>= 1) {
            for (int p = threadIdx.x; p < size / 2; p += blockDim.x) {
                int i = 2 * p - (p & (stride - 1)), j = i + stride;
                unsigned long long a = t[i], b = t[j];
                if ((a < b) == ((i & len) == 0)) {
                    t[i] = b;
                    t[j] = a;
                }
            }
            __syncthreads();
        }
}

__global__ void __launch_bounds__(TOPK_THREADS) k_topk(lmx_scored *out, const float *x, int n, int k)
{
    __shared__ unsigned long long t[TOPK_TILE];
    pdl_trigger();
    pdl_wait();
    int lo = (int)((long long)blockIdx.x * n / gridDim.x), hi = (int)((long long)(blockIdx.x + 1) * n / gridDim.x);
    for (int i = threadIdx.x; i < k; i += blockDim.x)
        t[i] = 0;
    for (int at = lo; at < hi;) {
        int take = min(hi - at, TOPK_TILE - k), size = 2;
        while (size < k + take)
            size <<= 1;
        for (int i = k + threadIdx.x; i < size; i += blockDim.x)
            t[i] = i - k < take ? rank_key(x[at + i - k], at + i - k) : 0ull;
        __syncthreads();
        bitonic_descending(t, size);
        at += take;
    }
    __syncthreads();
    for (int i = threadIdx.x; i < k; i += blockDim.x)
        out[(size_t)blockIdx.x * k + i] = from_key(t[i]);
}
