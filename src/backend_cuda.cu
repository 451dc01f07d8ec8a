/* The CUDA backend: every op of backend.h on one stream of one device.
 *
 * Weights keep their stored dtype (bf16/f16/f32); activations and the KV
 * cache are float32. Matmuls of up to GEMV_ROWS rows (decode) run a
 * bandwidth-bound kernel that streams the weights once with 16-byte loads
 * and accumulates in float32; larger ones (prefill) go to cuBLAS: bf16
 * weights on tensor cores (activations rounded to bf16, float32
 * accumulation), f32 weights in plain float32.
 *
 * Steps (backend.h step_begin/step_end): a one-token step is run eagerly
 * the first time its (key, flags) is seen, captured as a CUDA graph the
 * second time and replayed after that; positions and token ids live in
 * device memory, so the recorded kernels read them at replay. */
#include <cublas_v2.h>
#ifdef LMX_HAVE_NCCL
#include <nccl.h>
#endif
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <math.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

extern "C" {
#include "backend_cuda.h"
}

struct lmx_tensor {
    int rows, cols;
    lmx_dtype dtype; /* float32 for activations; the stored dtype for weights */
    void *data;      /* device memory, owned */
};

namespace {

enum { GEMV_ROWS = 8, MAX_IDS = 4096, SPLIT_KEYS = 64, MAX_GRAPHS = 16, MAX_ROPES = 8 };
enum step_mode { NO_STEP, EAGER, CAPTURE, REPLAY };

struct graph_entry {
    const void *key;
    int flags;
    int seen;               /* steps run with this key */
    cudaGraphExec_t exec;   /* NULL until captured */
    unsigned long long sig; /* hash of the recorded op sequence */
    unsigned long long used;
};

struct rope_table {
    int head_dim;
    float theta, factor;
    float *inv; /* device, head_dim / 2 */
};

struct pending_read {
    float *dst;
    size_t stride;          /* floats from one row of dst to the next */
    size_t off, row, rows;  /* in the pinned staging buffer: rows of row bytes at off */
};

struct cuda_backend {
    lmx_backend base;
    int device;
    cudaStream_t stream;
    cublasHandle_t blas;
    pthread_mutex_t lock; /* held from step_begin to step_end */

    /* First failure since the last step_end (sticky until reported). */
    lmx_status status;
    char msg[400];

    /* step state: position and ids in device memory, uploaded from pinned */
    int *h_step, *d_step; /* [0] = pos0, [1..] = ids */
    enum step_mode mode;
    int step_rows, step_pos0;
    graph_entry *cur;
    unsigned long long sig;
    graph_entry graphs[MAX_GRAPHS];
    unsigned long long clock;

    /* reads of one-token steps go through pinned staging, copied out in step_end */
    char *staging;
    size_t staging_cap, staging_used;
    pending_read *reads;
    int n_reads, reads_cap;

    /* scratch, grown outside graph capture only */
    __nv_bfloat16 *xbf;
    size_t xbf_cap;
    float *part;
    size_t part_cap;

    int simt_attn; /* LMX_CUDA_ATTN=simt: prefill attention without tensor cores */
#ifdef LMX_HAVE_NCCL
    ncclComm_t comm; /* tensor parallelism: this rank's communicator (NULL: alone) */
#endif
    rope_table ropes[MAX_ROPES];
    int n_ropes;
};

cuda_backend *cu(lmx_backend *be) { return (cuda_backend *)be; }

/* Records the first failure; later ones are consequences. */
void fail(cuda_backend *b, lmx_status code, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
void fail(cuda_backend *b, lmx_status code, const char *fmt, ...)
{
    if (b->status)
        return;
    b->status = code;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(b->msg, sizeof b->msg, fmt, ap);
    va_end(ap);
}

bool ok(cuda_backend *b, cudaError_t e, const char *what)
{
    if (e == cudaSuccess)
        return true;
    fail(b, e == cudaErrorMemoryAllocation ? LMX_ERR_NOMEM : LMX_ERR_INTERNAL, "cuda: %s: %s", what,
         cudaGetErrorString(e));
    return false;
}

/* After a launch: configuration errors show up here. */
void launched(cuda_backend *b, const char *what) { ok(b, cudaGetLastError(), what); }

bool blas_ok(cuda_backend *b, cublasStatus_t s, const char *what)
{
    if (s == CUBLAS_STATUS_SUCCESS)
        return true;
    fail(b, LMX_ERR_INTERNAL, "cublas: %s: %s", what, cublasGetStatusString(s));
    return false;
}

/* Replayed ops do nothing but fold their arguments into the step's
 * signature, which must match the recording. */
bool skip_op(cuda_backend *b, int op, const void *p0, const void *p1, const void *p2, long a, long c)
{
    if (b->mode == NO_STEP)
        return false;
    unsigned long long v[6] = {(unsigned long long)op, (unsigned long long)(uintptr_t)p0,
                               (unsigned long long)(uintptr_t)p1, (unsigned long long)(uintptr_t)p2,
                               (unsigned long long)a, (unsigned long long)c};
    for (int i = 0; i < 6; i++)
        b->sig = (b->sig ^ v[i]) * 0x100000001b3ull;
    return b->mode == REPLAY;
}

/* Position base for a kernel: from device memory inside a step (so that a
 * recording replays at any position), else the argument. */
const int *step_pos(cuda_backend *b, int pos0)
{
    if (b->mode == NO_STEP)
        return NULL;
    if (pos0 != b->step_pos0)
        fail(b, LMX_ERR_INTERNAL, "cuda: an op at position %d inside a step at %d", pos0, b->step_pos0);
    return b->d_step;
}

/* Recordings hold raw pointers: after a buffer moves or a tensor is freed
 * every step runs eagerly once more before it is recorded again. */
void drop_graphs(cuda_backend *b)
{
    for (int i = 0; i < MAX_GRAPHS; i++) {
        graph_entry *g = &b->graphs[i];
        if (g->exec)
            cudaGraphExecDestroy(g->exec);
        g->exec = NULL;
        g->seen = 0;
    }
}

/* Grows a device scratch buffer; never during capture (eager runs of the
 * same step come first and size it). */
template <typename T> bool grow(cuda_backend *b, T **buf, size_t *cap, size_t n, const char *what)
{
    if (n <= *cap)
        return true;
    if (b->mode == CAPTURE) {
        fail(b, LMX_ERR_INTERNAL, "cuda: %s scratch too small during graph capture", what);
        return false;
    }
    if (!ok(b, cudaStreamSynchronize(b->stream), what))
        return false;
    drop_graphs(b);
    cudaFree(*buf);
    *buf = NULL;
    *cap = 0;
    if (!ok(b, cudaMalloc((void **)buf, n * sizeof(T)), what))
        return false;
    *cap = n;
    return true;
}

/* Kernels ------------------------------------------------------------------ */

/* Programmatic dependent launch: every kernel is launched allowed to start
 * before its predecessor ends (hiding launch gaps, in graphs too), lets its
 * own successor start at once, and waits for its predecessors' results
 * with pdl_wait() before touching any memory they read or write. Only
 * immutable data (weights) may be read before the wait. */
__device__ __forceinline__ void pdl_wait() { asm volatile("griddepcontrol.wait;" ::: "memory"); }
__device__ __forceinline__ void pdl_trigger() { asm volatile("griddepcontrol.launch_dependents;" :::); }

template <typename... KArgs, typename... Args>
void launch(cuda_backend *b, void (*kernel)(KArgs...), dim3 grid, dim3 block, size_t shm, Args... args)
{
    cudaLaunchConfig_t cfg = {};
    cfg.gridDim = grid;
    cfg.blockDim = block;
    cfg.dynamicSmemBytes = shm;
    cfg.stream = b->stream;
    cudaLaunchAttribute attr[1];
    attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    attr[0].val.programmaticStreamSerializationAllowed = 1;
    cfg.attrs = attr;
    cfg.numAttrs = 1;
    ok(b, cudaLaunchKernelEx(&cfg, kernel, (KArgs)args...), "launch");
}

__device__ __forceinline__ float load_w(const void *w, int dt, size_t i)
{
    switch (dt) {
    case LMX_DT_BF16: return __bfloat162float(((const __nv_bfloat16 *)w)[i]);
    case LMX_DT_F16: return __half2float(((const __half *)w)[i]);
    default: return ((const float *)w)[i];
    }
}

__device__ __forceinline__ float warp_sum(float v)
{
#pragma unroll
    for (int o = 16; o; o >>= 1)
        v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

/* Rows of ids outside [first_id, first_id + rows) are zero. */
__global__ void k_embed(float *out, const void *table, int dt, int rows, const int *ids, int first_id, int cols,
                        float scale)
{
    pdl_wait();
    pdl_trigger();
    int i = blockIdx.y, id = ids[i] - first_id;
    bool mine = id >= 0 && id < rows;
    size_t row = mine ? (size_t)id * cols : 0;
    for (int c = blockIdx.x * blockDim.x + threadIdx.x; c < cols; c += gridDim.x * blockDim.x)
        out[(size_t)i * cols + c] = mine ? load_w(table, dt, row + c) * scale : 0.0f;
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

/* One block per dim-long vector. */
__global__ void k_rmsnorm(float *out, const float *x, const void *w, int dt, int dim, float eps, int plus_one)
{
    prefetch_norm(w, dt, dim);
    pdl_wait();
    pdl_trigger();
    __shared__ float red[32];
    const float *src = x + (size_t)blockIdx.x * dim;
    float *dst = out + (size_t)blockIdx.x * dim;
    float ss = 0;
    for (int j = threadIdx.x; j < dim; j += blockDim.x)
        ss += src[j] * src[j];
    float r = 1.0f / sqrtf(block_sum(ss, red) / dim + eps);
    for (int j = threadIdx.x; j < dim; j += blockDim.x)
        dst[j] = src[j] * r * norm_w(w, dt, j, plus_one);
}

/* A residual connection and the next norm, one block per row of dim:
 * y' = post ? rmsnorm(y, post) : y; x += y'; h = rmsnorm(x, next). */
__global__ void k_residual_norm(float *__restrict__ x, float *__restrict__ h, const float *__restrict__ y,
                                const void *post, int dt_post, const void *next, int dt_next, int dim, float eps,
                                int plus_one)
{
    prefetch_norm(post, dt_post, dim);
    prefetch_norm(next, dt_next, dim);
    pdl_wait();
    pdl_trigger();
    __shared__ float red[32];
    size_t row = (size_t)blockIdx.x * dim;
    float *xr = x + row, *hr = h + row;
    const float *yr = y + row;
    float rp = 1;
    if (post) {
        float ss = 0;
        for (int j = threadIdx.x; j < dim; j += blockDim.x)
            ss += yr[j] * yr[j];
        rp = 1.0f / sqrtf(block_sum(ss, red) / dim + eps);
    }
    float ss = 0;
#pragma unroll 4
    for (int j = threadIdx.x; j < dim; j += blockDim.x) {
        float v = post ? yr[j] * rp * norm_w(post, dt_post, j, plus_one) : yr[j];
        v += xr[j];
        xr[j] = v;
        ss += v * v;
    }
    float r = 1.0f / sqrtf(block_sum(ss, red) / dim + eps);
    for (int j = threadIdx.x; j < dim; j += blockDim.x)
        hr[j] = xr[j] * r * norm_w(next, dt_next, j, plus_one);
}

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

__device__ __forceinline__ float act_fn(float x, int gelu)
{
    const float k = 0.7978845608028654f; /* sqrt(2/pi) */
    return gelu ? 0.5f * x * (1.0f + tanhf(k * (x + 0.044715f * x * x * x))) : x / (1.0f + expf(-x));
}

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

__global__ void k_to_bf16(__nv_bfloat16 *dst, const float *src, size_t n)
{
    pdl_wait();
    pdl_trigger();
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
        dst[i] = __float2bfloat16_rn(src[i]);
}

/* Attention's inputs, one block per (head, row); heads [0, Hq) are q's,
 * [Hq, Hq + Hk) k's. Each head: RMSNorm over head_dim, rotate-half RoPE
 * (inv: the float32 inverse frequencies computed on the host as the CPU
 * backend does); q's heads back in place, k's to the cache with v's head
 * of the same number. blockDim: head_dim rounded up to 32. */
__global__ void k_qk_prepare(float *q, const float *k, const float *v, const void *qn, int dt_q, const void *kn,
                             int dt_k, float *kc, float *vc, const float *inv, int hd, int Hq, int Hk, int slots,
                             const int *dpos, int pos0, float eps, int plus_one)
{
    prefetch_norm(blockIdx.x < Hq ? qn : kn, blockIdx.x < Hq ? dt_q : dt_k, hd);
    pdl_wait();
    pdl_trigger();
    extern __shared__ float normed[]; /* hd */
    __shared__ float red[32];
    int h = blockIdx.x, i = blockIdx.y, t = threadIdx.x;
    bool is_q = h < Hq;
    int hh = is_q ? h : h - Hq, cols = (is_q ? Hq : Hk) * hd;
    size_t at = (size_t)i * cols + (size_t)hh * hd;
    float val = t < hd ? (is_q ? q : k)[at + t] : 0;
    float r = 1.0f / sqrtf(block_sum(val * val, red) / hd + eps);
    if (t < hd)
        normed[t] = val * r * norm_w(is_q ? qn : kn, is_q ? dt_q : dt_k, t, plus_one);
    __syncthreads();
    if (t >= hd)
        return;
    int half = hd / 2, base = dpos ? *dpos : pos0;
    float a = (float)(base + i) * inv[t < half ? t : t - half];
    float c = cosf(a), sn = sinf(a);
    float out = t < half ? normed[t] * c - normed[t + half] * sn : normed[t] * c + normed[t - half] * sn;
    if (is_q) {
        q[at + t] = out;
        return;
    }
    size_t slot = (size_t)((base + i) % slots) * cols + (size_t)hh * hd + t;
    kc[slot] = out;
    vc[slot] = v[at + t];
}

enum { ATTN_WARPS = 4 };

/* Causal attention, one block per (head, query row, split of the keys).
 * Each warp walks every ATTN_WARPS-th key with an online softmax; the
 * warps merge in shared memory. With one split the block writes the output,
 * else (m, l, acc) of its split for k_attn_merge (split-K flash decoding).
 * D = head_dim / 32 rounded up: each lane holds D dimensions. */
template <int D>
__global__ void __launch_bounds__(ATTN_WARPS * 32)
    k_attn(float *out, float *part, const float *q, const float *kc, const float *vc, int slots, int H, int KVH,
           int hd, int window, float scale, float softcap, const int *dpos, int pos0, int split_keys)
{
    pdl_wait();
    pdl_trigger();
    extern __shared__ float sh[]; /* ATTN_WARPS * (hd + 2) */
    int h = blockIdx.x, i = blockIdx.y, s = blockIdx.z, nsplit = gridDim.z;
    int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    int pos = (dpos ? *dpos : pos0) + i;
    int lo = window > 0 && pos - window + 1 > 0 ? pos - window + 1 : 0;
    int t0 = nsplit > 1 ? lo + s * split_keys : lo;
    int t1 = nsplit > 1 ? min(pos + 1, t0 + split_keys) : pos + 1;
    int kvh = h / (H / KVH);
    size_t kvs = (size_t)KVH * hd;
    const float *qr = q + ((size_t)i * H + h) * hd;
    float qv[D], acc[D];
#pragma unroll
    for (int j = 0; j < D; j++) {
        int d = lane + 32 * j;
        qv[j] = d < hd ? qr[d] : 0;
        acc[j] = 0;
    }
    float m = -INFINITY, l = 0;
    for (int t = t0 + warp; t < t1; t += ATTN_WARPS) {
        size_t off = (size_t)(t % slots) * kvs + (size_t)kvh * hd;
        const float *kr = kc + off, *vr = vc + off;
        float kv[D], vv[D]; /* both loads in flight before the reduction */
#pragma unroll
        for (int j = 0; j < D; j++) {
            int d = lane + 32 * j;
            kv[j] = d < hd ? kr[d] : 0;
            vv[j] = d < hd ? vr[d] : 0;
        }
        float dot = 0;
#pragma unroll
        for (int j = 0; j < D; j++)
            dot += qv[j] * kv[j];
        float sc = warp_sum(dot) * scale;
        if (softcap > 0)
            sc = softcap * tanhf(sc / softcap);
        if (sc > m) {
            float r = expf(m - sc);
            l *= r;
#pragma unroll
            for (int j = 0; j < D; j++)
                acc[j] *= r;
            m = sc;
        }
        float e = expf(sc - m);
        l += e;
#pragma unroll
        for (int j = 0; j < D; j++)
            acc[j] += e * vv[j];
    }
    float *mine = sh + warp * (hd + 2);
#pragma unroll
    for (int j = 0; j < D; j++) {
        int d = lane + 32 * j;
        if (d < hd)
            mine[d] = acc[j];
    }
    if (lane == 0) {
        mine[hd] = m;
        mine[hd + 1] = l;
    }
    __syncthreads();
    float M = -INFINITY;
    for (int w = 0; w < ATTN_WARPS; w++)
        M = fmaxf(M, sh[w * (hd + 2) + hd]);
    float L = 0, wt[ATTN_WARPS];
    for (int w = 0; w < ATTN_WARPS; w++) {
        float mw = sh[w * (hd + 2) + hd];
        wt[w] = mw == -INFINITY ? 0.0f : expf(mw - M);
        L += wt[w] * sh[w * (hd + 2) + hd + 1];
    }
    float *dst = nsplit > 1 ? part + (((size_t)i * H + h) * nsplit + s) * (hd + 2) : out + ((size_t)i * H + h) * hd;
    for (int d = threadIdx.x; d < hd; d += blockDim.x) {
        float a = 0;
        for (int w = 0; w < ATTN_WARPS; w++)
            a += wt[w] * sh[w * (hd + 2) + d];
        dst[d] = nsplit > 1 ? a : a / L;
    }
    if (nsplit > 1 && threadIdx.x == 0) {
        dst[hd] = M;
        dst[hd + 1] = L;
    }
}


enum { PF_ROWS = 32, PF_KEYS = 32, PF_WARPS = 4 };

/* Shared memory of k_attn_prefill: queries, then keys and values of one
 * tile, rows padded by 4 floats (16-byte loads, no bank conflicts). */
size_t prefill_shm(int hd) { return (size_t)(PF_ROWS + 2 * PF_KEYS) * (hd + 4) * sizeof(float); }

/* Causal attention for many query rows: one block per (head, PF_ROWS
 * queries), keys in PF_KEYS-long tiles staged in shared memory and shared
 * by every query of the block; each warp owns PF_ROWS / PF_WARPS queries,
 * each lane scores one key of the tile, then an online-softmax update of
 * the lane's D dimensions. */
template <int D>
__global__ void __launch_bounds__(PF_WARPS * 32)
    k_attn_prefill(float *out, const float *q, const float *kc, const float *vc, int slots, int H, int KVH, int hd,
                   int window, float scale, float softcap, const int *dpos, int pos0, int n_rows)
{
    pdl_wait();
    pdl_trigger();
    constexpr int RW = PF_ROWS / PF_WARPS;
    extern __shared__ float sh[];
    int ld = hd + 4;
    float *Qs = sh, *Ks = Qs + PF_ROWS * ld, *Vs = Ks + PF_KEYS * ld;
    int h = blockIdx.x, r0 = blockIdx.y * PF_ROWS, nr = min(PF_ROWS, n_rows - r0);
    int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    int base = (dpos ? *dpos : pos0) + r0;
    int kvh = h / (H / KVH);
    size_t kvs = (size_t)KVH * hd;
    for (int i = threadIdx.x; i < nr * hd; i += blockDim.x)
        Qs[(i / hd) * ld + i % hd] = q[((size_t)(r0 + i / hd) * H + h) * hd + i % hd];
    float m[RW], l[RW], acc[RW][D];
#pragma unroll
    for (int r = 0; r < RW; r++) {
        m[r] = -INFINITY;
        l[r] = 0;
#pragma unroll
        for (int j = 0; j < D; j++)
            acc[r][j] = 0;
    }
    int last = base + nr - 1;
    int lo = window > 0 && base - window + 1 > 0 ? base - window + 1 : 0;
    for (int t0 = lo; t0 <= last; t0 += PF_KEYS) {
        __syncthreads(); /* the previous tile is consumed (and Qs written) */
        /* 16-byte loads, four of each in flight per thread */
        int n4 = PF_KEYS * hd / 4, h4 = hd / 4;
        for (int i0 = threadIdx.x; i0 < n4; i0 += 4 * blockDim.x) {
            float4 kv[4], vv[4];
#pragma unroll
            for (int u = 0; u < 4; u++) {
                int i = i0 + u * blockDim.x, j = i / h4, t = t0 + j;
                float4 z = make_float4(0, 0, 0, 0);
                size_t off = ((size_t)(t % slots) * kvs + (size_t)kvh * hd) / 4 + i % h4;
                bool in = i < n4 && t <= last;
                kv[u] = in ? ((const float4 *)kc)[off] : z;
                vv[u] = in ? ((const float4 *)vc)[off] : z;
            }
#pragma unroll
            for (int u = 0; u < 4; u++) {
                int i = i0 + u * blockDim.x, j = i / h4;
                if (i < n4) {
                    *(float4 *)(Ks + j * ld + 4 * (i % h4)) = kv[u];
                    *(float4 *)(Vs + j * ld + 4 * (i % h4)) = vv[u];
                }
            }
        }
        __syncthreads();
        int t = t0 + lane;
#pragma unroll
        for (int rr = 0; rr < RW; rr++) {
            int r = warp * RW + rr;
            if (r >= nr)
                break;
            int pos = base + r, rlo = window > 0 && pos - window + 1 > 0 ? pos - window + 1 : 0;
            float s = -INFINITY;
            if (t <= pos && t >= rlo) {
                const float4 *qr = (const float4 *)(Qs + r * ld), *kr = (const float4 *)(Ks + lane * ld);
                float dot = 0;
                for (int d = 0; d < hd / 4; d++) {
                    float4 a = qr[d], b = kr[d];
                    dot += a.x * b.x + a.y * b.y + a.z * b.z + a.w * b.w;
                }
                s = dot * scale;
                if (softcap > 0)
                    s = softcap * tanhf(s / softcap);
            }
            float tmax = s;
#pragma unroll
            for (int o = 16; o; o >>= 1)
                tmax = fmaxf(tmax, __shfl_xor_sync(0xffffffffu, tmax, o));
            if (tmax == -INFINITY)
                continue; /* no key of this tile for this query */
            float mn = fmaxf(m[rr], tmax);
            float corr = m[rr] == -INFINITY ? 0.0f : expf(m[rr] - mn);
            float pj = s == -INFINITY ? 0.0f : expf(s - mn);
            l[rr] = l[rr] * corr + warp_sum(pj);
            m[rr] = mn;
#pragma unroll
            for (int j = 0; j < D; j++)
                acc[rr][j] *= corr;
            for (int k = 0; k < PF_KEYS; k++) {
                float p = __shfl_sync(0xffffffffu, pj, k);
#pragma unroll
                for (int j = 0; j < D; j++) {
                    int d = lane + 32 * j;
                    if (d < hd)
                        acc[rr][j] += p * Vs[k * ld + d];
                }
            }
        }
    }
#pragma unroll
    for (int rr = 0; rr < RW; rr++) {
        int r = warp * RW + rr;
        if (r >= nr)
            break;
#pragma unroll
        for (int j = 0; j < D; j++) {
            int d = lane + 32 * j;
            if (d < hd)
                out[((size_t)(r0 + r) * H + h) * hd + d] = acc[rr][j] / l[rr];
        }
    }
}

/* 128 queries a block (8 warps): each K/V tile staged in shared memory
 * serves twice the queries of 64 (Nsight Compute, Qwen3-8B prefill of 4096
 * tokens: 3.0 ms a layer with 64, bench/RESULTS.md). */
enum { FA_WARPS = 8, FA_Q = 16 * FA_WARPS, FA_K = 64 };

__device__ __forceinline__ unsigned pack_bf16(float lo, float hi)
{
    __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi); /* lo in the low half */
    return *(unsigned *)&v;
}

/* c += a . b on the tensor cores: a 16x16 bf16 (row), b 16x8 bf16 (col). */
__device__ __forceinline__ void mma_bf16(float *c, const unsigned *a, const unsigned *b)
{
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
                 "{%0,%1,%2,%3};"
                 : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}

/* Shared memory of k_attn_fa: queries and a key tile [rows][HD + 8], the
 * value tile transposed [HD][FA_K + 8], bf16 (padding: conflict-free
 * fragment reads). */
size_t fa_shm(int hd) { return ((size_t)(FA_Q + FA_K) * (hd + 8) + (size_t)hd * (FA_K + 8)) * 2; }

/* Prefill attention on the tensor cores (flash-attention style): one block
 * per (head, FA_Q queries), each warp 16 queries; per FA_K-key tile, S = Q.K^T
 * and O += P.V by mma.sync with Q, K, P, V rounded to bf16 and float32
 * accumulation; online softmax on the score fragments in registers. */
template <int HD>
__global__ void __launch_bounds__(FA_WARPS * 32)
    k_attn_fa(float *out, const float *q, const float *kc, const float *vc, int slots, int H, int KVH, int window,
              float scale, float softcap, const int *dpos, int pos0, int n_rows)
{
    pdl_wait();
    pdl_trigger();
    constexpr int LD = HD + 8, LDV = FA_K + 8;
    extern __shared__ __nv_bfloat16 fsh[];
    __nv_bfloat16 *Qs = fsh, *Ks = Qs + FA_Q * LD, *Vt = Ks + FA_K * LD;
    int h = blockIdx.x, r0 = blockIdx.y * FA_Q, nr = min(FA_Q, n_rows - r0);
    int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, tg = lane & 3;
    int base = (dpos ? *dpos : pos0) + r0;
    int kvh = h / (H / KVH);
    size_t kvs = (size_t)KVH * HD;
    for (int i = threadIdx.x; i < FA_Q * HD / 2; i += blockDim.x) {
        int row = i / (HD / 2), c2 = i % (HD / 2);
        float2 v = row < nr ? ((const float2 *)(q + ((size_t)(r0 + row) * H + h) * HD))[c2] : make_float2(0, 0);
        *(unsigned *)(Qs + row * LD + 2 * c2) = pack_bf16(v.x, v.y);
    }
    __syncthreads();
    unsigned qa[HD / 16][4];
    const __nv_bfloat16 *qrow = Qs + (warp * 16 + g) * LD + tg * 2;
#pragma unroll
    for (int kk = 0; kk < HD / 16; kk++) {
        qa[kk][0] = *(const unsigned *)(qrow + kk * 16);
        qa[kk][1] = *(const unsigned *)(qrow + 8 * LD + kk * 16);
        qa[kk][2] = *(const unsigned *)(qrow + kk * 16 + 8);
        qa[kk][3] = *(const unsigned *)(qrow + 8 * LD + kk * 16 + 8);
    }
    float o[HD / 8][4];
#pragma unroll
    for (int d = 0; d < HD / 8; d++)
        o[d][0] = o[d][1] = o[d][2] = o[d][3] = 0;
    float m[2] = {-INFINITY, -INFINITY}, l[2] = {0, 0};
    int pos[2] = {base + warp * 16 + g, base + warp * 16 + g + 8}, rlo[2];
    for (int r = 0; r < 2; r++)
        rlo[r] = window > 0 && pos[r] - window + 1 > 0 ? pos[r] - window + 1 : 0;
    int last = base + nr - 1;
    int lo = window > 0 && base - window + 1 > 0 ? base - window + 1 : 0;
    for (int t0 = lo; t0 <= last; t0 += FA_K) {
        __syncthreads(); /* the previous tile is consumed */
        for (int i = threadIdx.x; i < FA_K * HD / 4; i += blockDim.x) {
            /* K row-wise; V with consecutive threads on consecutive keys, so
             * that the transposed stores hit distinct banks */
            int j = i / (HD / 4), c4 = i % (HD / 4), t = t0 + j;
            float4 z = make_float4(0, 0, 0, 0);
            float4 kv = t <= last ? ((const float4 *)(kc + (size_t)(t % slots) * kvs + (size_t)kvh * HD))[c4] : z;
            *(uint2 *)(Ks + j * LD + 4 * c4) = make_uint2(pack_bf16(kv.x, kv.y), pack_bf16(kv.z, kv.w));
            int jv = i % FA_K, cv = i / FA_K, tv = t0 + jv;
            float4 vv = tv <= last ? ((const float4 *)(vc + (size_t)(tv % slots) * kvs + (size_t)kvh * HD))[cv] : z;
            Vt[(4 * cv + 0) * LDV + jv] = __float2bfloat16_rn(vv.x);
            Vt[(4 * cv + 1) * LDV + jv] = __float2bfloat16_rn(vv.y);
            Vt[(4 * cv + 2) * LDV + jv] = __float2bfloat16_rn(vv.z);
            Vt[(4 * cv + 3) * LDV + jv] = __float2bfloat16_rn(vv.w);
        }
        __syncthreads();
        float s[FA_K / 8][4];
#pragma unroll
        for (int nt = 0; nt < FA_K / 8; nt++) {
            s[nt][0] = s[nt][1] = s[nt][2] = s[nt][3] = 0;
            const __nv_bfloat16 *krow = Ks + (nt * 8 + g) * LD + tg * 2;
#pragma unroll
            for (int kk = 0; kk < HD / 16; kk++) {
                unsigned b[2] = {*(const unsigned *)(krow + kk * 16), *(const unsigned *)(krow + kk * 16 + 8)};
                mma_bf16(s[nt], qa[kk], b);
            }
        }
        float mx[2] = {-INFINITY, -INFINITY};
#pragma unroll
        for (int nt = 0; nt < FA_K / 8; nt++)
#pragma unroll
            for (int e = 0; e < 4; e++) {
                int r = e >> 1, t = t0 + nt * 8 + tg * 2 + (e & 1);
                float v = s[nt][e] * scale;
                if (softcap > 0)
                    v = softcap * tanhf(v / softcap);
                if (t > pos[r] || t < rlo[r])
                    v = -INFINITY;
                s[nt][e] = v;
                mx[r] = fmaxf(mx[r], v);
            }
        float corr[2];
#pragma unroll
        for (int r = 0; r < 2; r++) {
            mx[r] = fmaxf(mx[r], __shfl_xor_sync(0xffffffffu, mx[r], 1));
            mx[r] = fmaxf(mx[r], __shfl_xor_sync(0xffffffffu, mx[r], 2));
            float mn = fmaxf(m[r], mx[r]);
            corr[r] = mn == -INFINITY ? 1.0f : expf(m[r] - mn);
            m[r] = mn;
            l[r] *= corr[r];
        }
#pragma unroll
        for (int nt = 0; nt < FA_K / 8; nt++)
#pragma unroll
            for (int e = 0; e < 4; e++) {
                int r = e >> 1;
                float p = s[nt][e] == -INFINITY ? 0.0f : expf(s[nt][e] - m[r]);
                s[nt][e] = p;
                l[r] += p;
            }
#pragma unroll
        for (int d = 0; d < HD / 8; d++) {
            o[d][0] *= corr[0];
            o[d][1] *= corr[0];
            o[d][2] *= corr[1];
            o[d][3] *= corr[1];
        }
#pragma unroll
        for (int ks = 0; ks < FA_K / 16; ks++) {
            unsigned pa[4] = {pack_bf16(s[2 * ks][0], s[2 * ks][1]), pack_bf16(s[2 * ks][2], s[2 * ks][3]),
                              pack_bf16(s[2 * ks + 1][0], s[2 * ks + 1][1]),
                              pack_bf16(s[2 * ks + 1][2], s[2 * ks + 1][3])};
#pragma unroll
            for (int d = 0; d < HD / 8; d++) {
                const __nv_bfloat16 *vrow = Vt + (d * 8 + g) * LDV + ks * 16 + tg * 2;
                unsigned b[2] = {*(const unsigned *)vrow, *(const unsigned *)(vrow + 8)};
                mma_bf16(o[d], pa, b);
            }
        }
    }
#pragma unroll
    for (int r = 0; r < 2; r++) {
        l[r] += __shfl_xor_sync(0xffffffffu, l[r], 1);
        l[r] += __shfl_xor_sync(0xffffffffu, l[r], 2);
    }
#pragma unroll
    for (int r = 0; r < 2; r++) {
        int row = warp * 16 + g + 8 * r;
        if (row >= nr)
            continue;
        float *dst = out + ((size_t)(r0 + row) * H + h) * HD + tg * 2;
#pragma unroll
        for (int d = 0; d < HD / 8; d++)
            *(float2 *)(dst + d * 8) = make_float2(o[d][2 * r] / l[r], o[d][2 * r + 1] / l[r]);
    }
}

/* Merges the splits of k_attn: one block per (head, query row). The first
 * warp finds the splits' weights (split-strided, so their loads are in
 * flight together), then every thread sums its dimensions over the splits. */
__global__ void k_attn_merge(float *out, const float *part, int H, int hd, int nsplit)
{
    pdl_wait();
    pdl_trigger();
    extern __shared__ float wt[]; /* nsplit weights, then the normaliser */
    int h = blockIdx.x, i = blockIdx.y, lane = threadIdx.x & 31;
    const float *p = part + ((size_t)i * H + h) * nsplit * (hd + 2);
    if (threadIdx.x < 32) {
        float M = -INFINITY;
        for (int s = lane; s < nsplit; s += 32)
            M = fmaxf(M, p[s * (hd + 2) + hd]);
#pragma unroll
        for (int o = 16; o; o >>= 1)
            M = fmaxf(M, __shfl_xor_sync(0xffffffffu, M, o));
        float L = 0;
        for (int s = lane; s < nsplit; s += 32) {
            float ms = p[s * (hd + 2) + hd], w = ms == -INFINITY ? 0.0f : expf(ms - M);
            wt[s] = w;
            L += w * p[s * (hd + 2) + hd + 1];
        }
        L = warp_sum(L);
        if (lane == 0)
            wt[nsplit] = L;
    }
    __syncthreads();
    for (int d = threadIdx.x; d < hd; d += blockDim.x) {
        float a = 0;
#pragma unroll 8
        for (int s = 0; s < nsplit; s++)
            a += wt[s] * p[s * (hd + 2) + d];
        out[((size_t)i * H + h) * hd + d] = a / wt[nsplit];
    }
}

__global__ void k_gated_act(float *g, const float *u, size_t n, int gelu)
{
    pdl_wait();
    pdl_trigger();
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
        g[i] = act_fn(g[i], gelu) * u[i];
}

__global__ void k_softcap(float *x, size_t n, float cap)
{
    pdl_wait();
    pdl_trigger();
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
        x[i] = cap * tanhf(x[i] / cap);
}

/* Blocks for a grid-stride loop over n elements. */
unsigned blocks_for(size_t n, int threads)
{
    size_t b = (n + threads - 1) / threads;
    return b < 1 ? 1 : b > 65535 ? 65535 : (unsigned)b;
}

/* Tensors ------------------------------------------------------------------ */


lmx_tensor *cuda_weight(lmx_backend *be, const lmx_st_tensor *t, const lmx_slice *slice, lmx_error *err)
{
    cuda_backend *b = cu(be);
    int rows, cols;
    lmx_slice s;
    if (lmx_backend_weight_view(t, &rows, &cols, err) || lmx_backend_slice(t, slice, &s, err))
        return NULL;
    lmx_tensor *w = (lmx_tensor *)calloc(1, sizeof *w);
    if (!w) {
        lmx_fail(err, LMX_ERR_NOMEM, "out of memory");
        return NULL;
    }
    *w = lmx_tensor{s.rows, s.cols, t->dtype, NULL};
    size_t es = lmx_dtype_size(t->dtype), row = (size_t)s.cols * es, bytes = row * (size_t)s.rows;
    cudaError_t e = cudaSetDevice(b->device);
    if (e == cudaSuccess)
        e = cudaMalloc(&w->data, bytes ? bytes : 1);
    if (e == cudaSuccess && bytes) /* only the slice is read; on the backend's stream, before every kernel */
        e = cudaMemcpy2DAsync(w->data, row, (const char *)t->data + ((size_t)s.row0 * cols + s.col0) * es,
                              (size_t)cols * es, row, (size_t)s.rows, cudaMemcpyHostToDevice, b->stream);
    if (e == cudaSuccess)
        e = cudaStreamSynchronize(b->stream);
    if (e != cudaSuccess) {
        cudaFree(w->data);
        free(w);
        lmx_fail(err, e == cudaErrorMemoryAllocation ? LMX_ERR_NOMEM : LMX_ERR_INTERNAL,
                 "%s: cannot upload tensor '%s' (%zu bytes) to GPU %d: %s", t->file, t->name, bytes, b->device,
                 cudaGetErrorString(e));
        return NULL;
    }
    return w;
}

lmx_tensor *cuda_alloc(lmx_backend *be, int rows, int cols, lmx_error *err)
{
    lmx_tensor *t = (lmx_tensor *)calloc(1, sizeof *t);
    size_t bytes = (size_t)rows * (size_t)cols * sizeof(float);
    cudaError_t e = t ? cudaSetDevice(cu(be)->device) : cudaErrorMemoryAllocation;
    if (e == cudaSuccess)
        e = cudaMalloc(&t->data, bytes ? bytes : 1);
    if (e == cudaSuccess)
        e = cudaMemsetAsync(t->data, 0, bytes, cu(be)->stream);
    if (e != cudaSuccess) {
        if (t)
            cudaFree(t->data);
        free(t);
        lmx_fail(err, e == cudaErrorMemoryAllocation ? LMX_ERR_NOMEM : LMX_ERR_INTERNAL,
                 "cuda: cannot allocate a %d x %d activation tensor: %s", rows, cols, cudaGetErrorString(e));
        return NULL;
    }
    t->rows = rows;
    t->cols = cols;
    t->dtype = LMX_DT_F32;
    return t;
}

void cuda_free(lmx_backend *be, lmx_tensor *t)
{
    if (!t)
        return;
    pthread_mutex_lock(&cu(be)->lock);
    drop_graphs(cu(be));
    pthread_mutex_unlock(&cu(be)->lock);
    cudaSetDevice(cu(be)->device);
    cudaFree(t->data);
    free(t);
}

float *f32(const lmx_tensor *t) { return (float *)t->data; }

/* Ops ---------------------------------------------------------------------- */

enum { OP_EMBED = 1, OP_RMSNORM, OP_MATMUL, OP_QK, OP_ATTN, OP_MLP, OP_RESIDUAL, OP_CAP, OP_COPY, OP_READ, OP_REDUCE };

void cuda_embed(lmx_backend *be, lmx_tensor *out, const lmx_tensor *table, const int32_t *ids, int n_rows,
                float scale, int first_id)
{
    cuda_backend *b = cu(be);
    if (skip_op(b, OP_EMBED, out, table, NULL, n_rows, (long)(scale * 1e6f) + first_id))
        return;
    const int *d_ids = b->d_step + 1;
    if (b->mode == NO_STEP) { /* ids come with the step otherwise */
        if (n_rows > MAX_IDS) {
            fail(b, LMX_ERR_INTERNAL, "cuda: embed of %d rows (at most %d)", n_rows, MAX_IDS);
            return;
        }
        if (!ok(b, cudaMemcpyAsync(b->d_step + 1, ids, (size_t)n_rows * sizeof *ids, cudaMemcpyHostToDevice, b->stream),
                "embed ids"))
            return;
    }
    dim3 grid(blocks_for((size_t)out->cols, 256) < 64 ? blocks_for((size_t)out->cols, 256) : 64, n_rows);
    launch(b, k_embed, grid, 256, 0, f32(out), table->data, (int)table->dtype, table->rows, d_ids, first_id,
           out->cols, scale);
    launched(b, "embed");
}

void cuda_rmsnorm(lmx_backend *be, lmx_tensor *out, const lmx_tensor *x, const lmx_tensor *w, int n_rows, float eps,
                  int plus_one)
{
    cuda_backend *b = cu(be);
    if (skip_op(b, OP_RMSNORM, out, x, w, n_rows, plus_one))
        return;
    int dim = w->cols;
    size_t n_vec = (size_t)n_rows * (size_t)x->cols / (size_t)dim;
    if (!n_vec)
        return;
    int threads = dim >= 1024 ? 1024 : dim >= 256 ? 256 : dim > 64 ? 128 : 64;
    launch(b, k_rmsnorm, (unsigned)n_vec, threads, 0, f32(out), f32(x), w->data, w->dtype, dim, eps, plus_one);
    launched(b, "rmsnorm");
}

template <typename W, bool GATED>
void gemv_launch(cuda_backend *b, const gemv_set &s, const float *x, int K, int nr, int gelu)
{
    unsigned grid = (unsigned)((s.end[GATED ? 0 : s.n - 1] + GEMV_WARPS - 1) / GEMV_WARPS);
    int th = GEMV_WARPS * 32;
    if (nr <= 1)
        launch(b, k_gemv<W, 1, GATED>, grid, th, 0, s, x, K, nr, gelu);
    else if (nr <= 2)
        launch(b, k_gemv<W, 2, GATED>, grid, th, 0, s, x, K, nr, gelu);
    else if (nr <= 4)
        launch(b, k_gemv<W, 4, GATED>, grid, th, 0, s, x, K, nr, gelu);
    else
        launch(b, k_gemv<W, 8, GATED>, grid, th, 0, s, x, K, nr, gelu);
}

template <typename W> void gemv_gated(cuda_backend *b, const gemv_set &s, const float *x, int K, int nr, bool gated,
                                      int gelu)
{
    if (gated)
        gemv_launch<W, true>(b, s, x, K, nr, gelu);
    else
        gemv_launch<W, false>(b, s, x, K, nr, gelu);
}

void gemv_dtype(cuda_backend *b, lmx_dtype dt, const gemv_set &s, const float *x, int K, int nr, bool gated, int gelu)
{
    if (dt == LMX_DT_BF16)
        gemv_gated<__nv_bfloat16>(b, s, x, K, nr, gated, gelu);
    else if (dt == LMX_DT_F16)
        gemv_gated<__half>(b, s, x, K, nr, gated, gelu);
    else
        gemv_gated<float>(b, s, x, K, nr, gated, gelu);
}

void gated_act(cuda_backend *b, float *gate, const float *up, size_t n, int gelu)
{
    launch(b, k_gated_act, blocks_for(n, 256), 256, 0, gate, up, n, gelu);
    launched(b, "gated activation");
}

/* Up to GEMV_ROWS rows of x against the weights, bandwidth-bound: one launch
 * for all of them when they share a dtype and K fits the 16-byte loads. */
void gemv(cuda_backend *b, int n, lmx_tensor *const *outs, const float *x, const lmx_tensor *const *ws, size_t row0,
          int nr, bool gated, int gelu)
{
    int K = ws[0]->cols;
    lmx_dtype dt = ws[0]->dtype;
    bool fused = K % (dt == LMX_DT_F32 ? 4 : 8) == 0;
    gemv_set s = {};
    s.n = n;
    for (int i = 0; i < n; i++) {
        fused = fused && ws[i]->dtype == dt;
        s.w[i] = ws[i]->data;
        s.out[i] = f32(outs[i]) + row0 * outs[i]->cols;
        s.end[i] = (i ? s.end[i - 1] : 0) + ws[i]->rows;
    }
    if (fused)
        gemv_dtype(b, dt, s, x, K, nr, gated, gelu);
    for (int i = 0; !fused && i < n; i++) {
        dim3 grid((unsigned)((ws[i]->rows + GEMV_WARPS - 1) / GEMV_WARPS), nr);
        launch(b, k_gemv_any, grid, GEMV_WARPS * 32, 0, s.out[i], x, ws[i]->data, ws[i]->dtype, ws[i]->rows, K);
    }
    launched(b, "matmul (gemv)");
    if (!fused && gated)
        gated_act(b, s.out[0], s.out[1], (size_t)nr * ws[0]->rows, gelu);
}

/* outs[i] = x * ws[i]^T; gated (n = 2): outs[0] = act(x * ws[0]^T) * (x * ws[1]^T),
 * outs[1] scratch. */
void matmuls(cuda_backend *b, int n, lmx_tensor *const *outs, const lmx_tensor *x, const lmx_tensor *const *ws,
             int n_rows, bool gated, int gelu)
{
    int K = x->cols;
    bool any_f16 = false;
    for (int i = 0; i < n; i++) {
        if (ws[i]->cols != K || outs[i]->cols != ws[i]->rows || (gated && ws[i]->rows != ws[0]->rows)) {
            fail(b, LMX_ERR_INTERNAL, "cuda: matmul of [%d, %d] by [%d, %d]^T into %d columns", n_rows, K,
                 ws[i]->rows, ws[i]->cols, outs[i]->cols);
            return;
        }
        any_f16 = any_f16 || ws[i]->dtype == LMX_DT_F16;
    }
    if (n_rows <= GEMV_ROWS || any_f16) {
        /* f16 weights: no tensor-core path (float16 activations could
         * overflow), so GEMV_ROWS rows at a time */
        for (int r = 0; r < n_rows; r += GEMV_ROWS)
            gemv(b, n, outs, f32(x) + (size_t)r * K, ws, (size_t)r,
                 n_rows - r < GEMV_ROWS ? n_rows - r : GEMV_ROWS, gated, gelu);
        return;
    }
    if (!blas_ok(b, cublasSetStream(b->blas, b->stream), "set stream"))
        return;
    const float one = 1.0f, zero = 0.0f;
    bool have_bf16 = false;
    for (int i = 0; i < n; i++) {
        int N = ws[i]->rows;
        if (ws[i]->dtype == LMX_DT_F32) {
            blas_ok(b,
                    cublasSgemm(b->blas, CUBLAS_OP_T, CUBLAS_OP_N, N, n_rows, K, &one, f32(ws[i]), K, f32(x), K,
                                &zero, f32(outs[i]), N),
                    "sgemm");
            continue;
        }
        size_t nx = (size_t)n_rows * K;
        if (!have_bf16) { /* x rounded to bf16 once for all the weights */
            if (!grow(b, &b->xbf, &b->xbf_cap, nx, "bf16 activations"))
                return;
            launch(b, k_to_bf16, blocks_for(nx, 256), 256, 0, b->xbf, f32(x), nx);
            launched(b, "to bf16");
            have_bf16 = true;
        }
        /* column-major view: out^T [N, n] = W [K, N]^T . X^T [K, n] */
        blas_ok(b,
                cublasGemmEx(b->blas, CUBLAS_OP_T, CUBLAS_OP_N, N, n_rows, K, &one, ws[i]->data, CUDA_R_16BF, K,
                             b->xbf, CUDA_R_16BF, K, &zero, f32(outs[i]), CUDA_R_32F, N, CUBLAS_COMPUTE_32F,
                             CUBLAS_GEMM_DEFAULT),
                "gemm bf16");
    }
    if (gated)
        gated_act(b, f32(outs[0]), f32(outs[1]), (size_t)n_rows * ws[0]->rows, gelu);
}

/* Replayed steps fold every tensor of a multi-tensor op into the signature. */
bool skip_multi(cuda_backend *b, int op, int n, lmx_tensor *const *outs, const lmx_tensor *x,
                const lmx_tensor *const *ws, int n_rows)
{
    bool skip = skip_op(b, op, x, NULL, NULL, n_rows, n);
    for (int i = 0; i < n; i++)
        skip_op(b, op, outs[i], ws[i], NULL, i, 0);
    return skip;
}

void cuda_matmul_multi(lmx_backend *be, int n_out, lmx_tensor *const *outs, const lmx_tensor *x,
                       const lmx_tensor *const *ws, int n_rows)
{
    cuda_backend *b = cu(be);
    if (n_out < 1 || n_out > LMX_MAX_MULTI) {
        fail(b, LMX_ERR_INTERNAL, "cuda: matmul_multi of %d weights", n_out);
        return;
    }
    if (!skip_multi(b, OP_MATMUL, n_out, outs, x, ws, n_rows))
        matmuls(b, n_out, outs, x, ws, n_rows, false, 0);
}

void cuda_matmul(lmx_backend *be, lmx_tensor *out, const lmx_tensor *x, const lmx_tensor *w, int n_rows)
{
    cuda_matmul_multi(be, 1, &out, x, &w, n_rows);
}

void cuda_gated_mlp(lmx_backend *be, lmx_tensor *gate, lmx_tensor *up, const lmx_tensor *x, const lmx_tensor *w_gate,
                    const lmx_tensor *w_up, int n_rows, lmx_activation act)
{
    cuda_backend *b = cu(be);
    lmx_tensor *outs[] = {gate, up};
    const lmx_tensor *ws[] = {w_gate, w_up};
    bool skip = skip_multi(b, OP_MLP, 2, outs, x, ws, n_rows);
    skip_op(b, OP_MLP, NULL, NULL, NULL, act, 0);
    if (!skip)
        matmuls(b, 2, outs, x, ws, n_rows, true, act == LMX_ACT_GELU_TANH);
}

/* The inverse frequencies of (head_dim, rope), computed on the host exactly
 * as the CPU backend does, uploaded once. */
const float *rope_inv(cuda_backend *b, int head_dim, lmx_rope rope)
{
    for (int i = 0; i < b->n_ropes; i++) {
        rope_table *r = &b->ropes[i];
        if (r->head_dim == head_dim && r->theta == rope.theta && r->factor == rope.factor)
            return r->inv;
    }
    if (b->n_ropes == MAX_ROPES || b->mode == CAPTURE) {
        fail(b, LMX_ERR_INTERNAL, "cuda: no room for another RoPE table");
        return NULL;
    }
    int half = head_dim / 2;
    float inv[LMX_MAX_HEAD_DIM / 2];
    for (int i = 0; i < half; i++) {
        float e = (float)(2 * i) / (float)head_dim;
        inv[i] = 1.0f / powf(rope.theta, e);
        if (rope.factor != 1.0f)
            inv[i] /= rope.factor;
    }
    rope_table *r = &b->ropes[b->n_ropes];
    if (!ok(b, cudaMalloc((void **)&r->inv, (size_t)(half ? half : 1) * sizeof(float)), "rope table") ||
        !ok(b, cudaMemcpy(r->inv, inv, (size_t)half * sizeof(float), cudaMemcpyHostToDevice), "rope table"))
        return NULL;
    r->head_dim = head_dim;
    r->theta = rope.theta;
    r->factor = rope.factor;
    b->n_ropes++;
    return r->inv;
}

void cuda_qk_prepare(lmx_backend *be, lmx_tensor *q, lmx_tensor *k, const lmx_tensor *v, const lmx_tensor *q_norm,
                     const lmx_tensor *k_norm, lmx_tensor *kc, lmx_tensor *vc, int n_rows, int head_dim, int pos0,
                     lmx_rope rope, float eps, int plus_one)
{
    cuda_backend *b = cu(be);
    bool skip = skip_op(b, OP_QK, q, k, v, n_rows, head_dim);
    skip_op(b, OP_QK, q_norm, k_norm, kc, plus_one, (long)(uintptr_t)vc); /* same answer, folds the rest */
    if (skip)
        return;
    if (head_dim % 2 || head_dim > 1024 || q_norm->cols != head_dim || k_norm->cols != head_dim ||
        k->cols != v->cols || kc->cols != k->cols || vc->cols != k->cols) {
        fail(b, LMX_ERR_INTERNAL, "cuda: qk_prepare of head_dim %d, norms of %d and %d", head_dim, q_norm->cols,
             k_norm->cols);
        return;
    }
    const float *inv = rope_inv(b, head_dim, rope);
    if (!inv)
        return;
    dim3 grid((unsigned)(q->cols / head_dim + k->cols / head_dim), (unsigned)n_rows);
    launch(b, k_qk_prepare, grid, (head_dim + 31) / 32 * 32, (size_t)head_dim * sizeof(float), f32(q), f32(k),
           f32(v), q_norm->data, (int)q_norm->dtype, k_norm->data, (int)k_norm->dtype, f32(kc), f32(vc), inv,
           head_dim, q->cols / head_dim, k->cols / head_dim, kc->rows, step_pos(b, pos0), pos0, eps, plus_one);
    launched(b, "qk_prepare");
}

void cuda_attention(lmx_backend *be, lmx_tensor *out, const lmx_tensor *q, const lmx_tensor *kc,
                    const lmx_tensor *vc, const lmx_attn_params *p)
{
    cuda_backend *b = cu(be);
    if (skip_op(b, OP_ATTN, out, q, kc, p->n_rows, (long)(uintptr_t)vc))
        return;
    int hd = p->head_dim, D = (hd + 31) / 32;
    if (D > 32 || p->n_heads % p->n_kv_heads) {
        fail(b, LMX_ERR_UNSUPPORTED, "cuda: attention with head_dim %d, %d heads over %d", hd, p->n_heads,
             p->n_kv_heads);
        return;
    }
    const int *dpos = step_pos(b, p->pos0);
    if (p->n_rows > GEMV_ROWS && (hd == 64 || hd == 128) && !b->simt_attn) {
        size_t shm = fa_shm(hd);
        dim3 grid(p->n_heads, (p->n_rows + FA_Q - 1) / FA_Q);
        auto k = hd == 64 ? k_attn_fa<64> : k_attn_fa<128>;
        cudaFuncSetAttribute(k, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)shm);
        launch(b, k, grid, FA_WARPS * 32, shm, f32(out), f32(q), f32(kc), f32(vc), kc->rows, p->n_heads,
               p->n_kv_heads, p->window, p->scale, p->softcap, dpos, p->pos0, p->n_rows);
        return;
    }
    if (p->n_rows > GEMV_ROWS && D <= 8 && hd % 4 == 0) {
        size_t shm = prefill_shm(hd);
        dim3 grid(p->n_heads, (p->n_rows + PF_ROWS - 1) / PF_ROWS);
#define PREFILL(DD)                                                                                                \
    do {                                                                                                           \
        cudaFuncSetAttribute(k_attn_prefill<DD>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)shm);          \
        launch(b, k_attn_prefill<DD>, grid, PF_WARPS * 32, shm, f32(out), f32(q), f32(kc), f32(vc), kc->rows,  \
                                                                   p->n_heads, p->n_kv_heads, hd, p->window,       \
                                                                   p->scale, p->softcap, dpos, p->pos0, p->n_rows); \
    } while (0)
        if (D <= 2)
            PREFILL(2);
        else if (D <= 4)
            PREFILL(4);
        else
            PREFILL(8);
#undef PREFILL
        launched(b, "attention (prefill)");
        return;
    }
    /* Decode: the keys split in SPLIT_KEYS-long pieces, as many as the cache
     * could ever need, so the grid does not depend on the position. */
    int nsplit = p->n_rows <= GEMV_ROWS ? (kc->rows + SPLIT_KEYS - 1) / SPLIT_KEYS : 1;
    if (nsplit > 1 &&
        !grow(b, &b->part, &b->part_cap, (size_t)p->n_rows * p->n_heads * nsplit * (hd + 2), "attention splits"))
        return;
    dim3 grid(p->n_heads, p->n_rows, nsplit);
    size_t shm = (size_t)ATTN_WARPS * (hd + 2) * sizeof(float);
#define ATTN(DD)                                                                                                   \
    launch(b, k_attn<DD>, grid, ATTN_WARPS * 32, shm, f32(out), b->part, f32(q), f32(kc), f32(vc), kc->rows,    \
                                                          p->n_heads, p->n_kv_heads, hd, p->window, p->scale,       \
                                                          p->softcap, dpos, p->pos0, SPLIT_KEYS)
    if (D <= 2)
        ATTN(2);
    else if (D <= 4)
        ATTN(4);
    else if (D <= 8)
        ATTN(8);
    else if (D <= 16)
        ATTN(16);
    else
        ATTN(32);
#undef ATTN
    launched(b, "attention");
    if (nsplit > 1) {
        size_t wshm = (size_t)(nsplit + 1) * sizeof(float);
        if (wshm > 48 * 1024)
            cudaFuncSetAttribute(k_attn_merge, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)wshm);
        launch(b, k_attn_merge, dim3(p->n_heads, p->n_rows), hd < 1024 ? ((hd + 31) / 32) * 32 : 1024, wshm,
               f32(out), b->part, p->n_heads, hd, nsplit);
        launched(b, "attention merge");
    }
}

void cuda_residual_norm(lmx_backend *be, lmx_tensor *x, lmx_tensor *h, lmx_tensor *y, const lmx_tensor *post,
                        const lmx_tensor *next, int n_rows, float eps, int plus_one)
{
    cuda_backend *b = cu(be);
    bool skip = skip_op(b, OP_RESIDUAL, x, h, y, n_rows, plus_one);
    skip_op(b, OP_RESIDUAL, post, next, NULL, 0, 0);
    if (skip)
        return;
    int dim = x->cols;
    if (next->cols != dim || (post && post->cols != dim)) {
        fail(b, LMX_ERR_INTERNAL, "cuda: residual_norm of %d columns with norms of %d", dim, next->cols);
        return;
    }
    /* 256 threads: a few elements each, their loads in flight together */
    int threads = dim >= 256 ? 256 : dim > 64 ? 128 : 64;
    launch(b, k_residual_norm, (unsigned)n_rows, threads, 0, f32(x), f32(h), f32(y), post ? post->data : NULL,
           post ? (int)post->dtype : 0, next->data, (int)next->dtype, dim, eps, plus_one);
    launched(b, "residual_norm");
}

void cuda_softcap(lmx_backend *be, lmx_tensor *x, int n_rows, float cap)
{
    cuda_backend *b = cu(be);
    if (skip_op(b, OP_CAP, x, NULL, NULL, n_rows, (long)(cap * 1e6f)))
        return;
    size_t n = (size_t)n_rows * x->cols;
    launch(b, k_softcap, blocks_for(n, 256), 256, 0, f32(x), n, cap);
    launched(b, "softcap");
}

void cuda_copy_rows(lmx_backend *be, lmx_tensor *dst, int dst_row, const lmx_tensor *src, int src_row, int n_rows)
{
    cuda_backend *b = cu(be);
    if (skip_op(b, OP_COPY, dst, src, NULL, n_rows, (long)dst_row * 1000003 + src_row))
        return;
    ok(b,
       cudaMemcpyAsync(f32(dst) + (size_t)dst_row * dst->cols, f32(src) + (size_t)src_row * src->cols,
                       (size_t)n_rows * src->cols * sizeof(float), cudaMemcpyDeviceToDevice, b->stream),
       "copy_rows");
}

/* Inside a graphable step: into pinned staging now, out to dst in step_end.
 * Otherwise straight to dst. */
void cuda_read(lmx_backend *be, float *dst, size_t dst_stride, const lmx_tensor *src, int row0, int n_rows)
{
    cuda_backend *b = cu(be);
    size_t row = (size_t)src->cols * sizeof(float), bytes = (size_t)n_rows * row;
    const float *from = f32(src) + (size_t)row0 * src->cols;
    bool skip = skip_op(b, OP_READ, src, NULL, NULL, n_rows, row0);
    if (b->mode == NO_STEP || (b->mode == EAGER && !b->cur)) {
        ok(b, cudaMemcpy2DAsync(dst, dst_stride * sizeof(float), from, row, row, (size_t)n_rows,
                                cudaMemcpyDeviceToHost, b->stream),
           "read");
        ok(b, cudaStreamSynchronize(b->stream), "read");
        return;
    }
    if (b->staging_used + bytes > b->staging_cap) {
        if (b->mode != EAGER) {
            fail(b, LMX_ERR_INTERNAL, "cuda: read staging too small during a recorded step");
            return;
        }
        /* grow: earlier reads of this step are already staged, keep them */
        size_t cap = (b->staging_used + bytes) * 2;
        char *nb = NULL;
        if (!ok(b, cudaStreamSynchronize(b->stream), "read") || !ok(b, cudaMallocHost((void **)&nb, cap), "read staging"))
            return;
        if (b->staging_used)
            memcpy(nb, b->staging, b->staging_used);
        drop_graphs(b);
        cudaFreeHost(b->staging);
        b->staging = nb;
        b->staging_cap = cap;
    }
    if (b->n_reads == b->reads_cap) {
        int cap = b->reads_cap ? 2 * b->reads_cap : 8;
        pending_read *nr = (pending_read *)realloc(b->reads, (size_t)cap * sizeof *nr);
        if (!nr) {
            fail(b, LMX_ERR_NOMEM, "out of memory");
            return;
        }
        b->reads = nr;
        b->reads_cap = cap;
    }
    b->reads[b->n_reads++] = pending_read{dst, dst_stride, b->staging_used, row, (size_t)n_rows};
    size_t off = b->staging_used;
    b->staging_used += bytes;
    if (!skip)
        ok(b, cudaMemcpyAsync(b->staging + off, from, bytes, cudaMemcpyDeviceToHost, b->stream), "read");
}

/* Tensor parallelism: an in-place NCCL all-reduce on the rank's stream
 * (recorded into the step's graph like any kernel). */
void cuda_all_reduce(lmx_backend *be, lmx_tensor *x, int n_rows)
{
    cuda_backend *b = cu(be);
    if (skip_op(b, OP_REDUCE, x, NULL, NULL, n_rows, 0))
        return;
#ifdef LMX_HAVE_NCCL
    size_t n = (size_t)n_rows * x->cols;
    ncclResult_t r = b->comm ? ncclAllReduce(x->data, x->data, n, ncclFloat, ncclSum, b->comm, b->stream)
                             : ncclInvalidUsage;
    if (r != ncclSuccess)
        fail(b, LMX_ERR_INTERNAL, "nccl: all-reduce of %zu floats on GPU %d: %s", n, b->device,
             b->comm ? ncclGetErrorString(r) : "no communicator");
#else
    fail(b, LMX_ERR_UNSUPPORTED, "cuda: all-reduce: this lmx was built without NCCL");
#endif
}

/* Steps -------------------------------------------------------------------- */

graph_entry *find_graph(cuda_backend *b, const void *key, int flags)
{
    graph_entry *lru = &b->graphs[0];
    for (int i = 0; i < MAX_GRAPHS; i++) {
        graph_entry *g = &b->graphs[i];
        if (g->seen && g->key == key && g->flags == flags)
            return g;
        if (g->used < lru->used)
            lru = g;
    }
    if (lru->exec)
        cudaGraphExecDestroy(lru->exec);
    *lru = graph_entry{key, flags, 0, NULL, 0, 0};
    return lru;
}

void cuda_step_begin(lmx_backend *be, const void *key, int flags, const int32_t *ids, int n_rows, int pos0)
{
    cuda_backend *b = cu(be);
    pthread_mutex_lock(&b->lock);
    cudaSetDevice(b->device); /* per thread: streams may come from many threads */
    b->mode = EAGER;
    b->cur = NULL;
    b->sig = 0xcbf29ce484222325ull;
    b->step_rows = n_rows;
    b->step_pos0 = pos0;
    b->staging_used = 0;
    b->n_reads = 0;
    if (n_rows > MAX_IDS) {
        fail(b, LMX_ERR_INTERNAL, "cuda: a step of %d rows (at most %d)", n_rows, MAX_IDS);
        return;
    }
    /* The previous step ended with a synchronize, so h_step is free. */
    b->h_step[0] = pos0;
    memcpy(b->h_step + 1, ids, (size_t)n_rows * sizeof *ids);
    if (!ok(b, cudaMemcpyAsync(b->d_step, b->h_step, (size_t)(n_rows + 1) * sizeof(int), cudaMemcpyHostToDevice,
                               b->stream),
            "step upload"))
        return;
    if (n_rows != 1 || getenv("LMX_CUDA_NO_GRAPH"))
        return;
    graph_entry *g = find_graph(b, key, flags);
    g->used = ++b->clock;
    b->cur = g;
    if (g->exec)
        b->mode = REPLAY;
    else if (g->seen >= 1 && !b->status &&
             ok(b, cudaStreamBeginCapture(b->stream, cudaStreamCaptureModeThreadLocal), "begin capture"))
        b->mode = CAPTURE;
}

lmx_status cuda_step_end(lmx_backend *be, lmx_error *err)
{
    cuda_backend *b = cu(be);
    graph_entry *g = b->cur;
    if (b->mode == CAPTURE) {
        cudaGraph_t graph = NULL;
        if (ok(b, cudaStreamEndCapture(b->stream, &graph), "end capture") && !b->status &&
            ok(b, cudaGraphInstantiate(&g->exec, graph, 0), "instantiate graph"))
            g->sig = b->sig;
        if (graph)
            cudaGraphDestroy(graph);
    }
    if (b->mode == REPLAY && g->sig != b->sig)
        fail(b, LMX_ERR_INTERNAL, "cuda: a step differs from its recording");
    if ((b->mode == CAPTURE || b->mode == REPLAY) && !b->status)
        ok(b, cudaGraphLaunch(g->exec, b->stream), "graph launch");
    ok(b, cudaStreamSynchronize(b->stream), "step");
    if (!b->status)
        for (int i = 0; i < b->n_reads; i++) {
            const pending_read *r = &b->reads[i];
            for (size_t k = 0; k < r->rows; k++)
                memcpy(r->dst + k * r->stride, b->staging + r->off + k * r->row, r->row);
        }
    if (g && !b->status)
        g->seen++;
    if (g && b->status && g->exec) { /* never replay a recording that failed */
        cudaGraphExecDestroy(g->exec);
        g->exec = NULL;
    }
    b->mode = NO_STEP;
    b->cur = NULL;
    lmx_status st = b->status;
    if (st) {
        lmx_fail(err, st, "%s", b->msg);
        b->status = LMX_OK;
        b->msg[0] = 0;
    }
    pthread_mutex_unlock(&b->lock);
    return st;
}

void cuda_destroy(lmx_backend *be)
{
    cuda_backend *b = cu(be);
    if (!b)
        return;
    cudaSetDevice(b->device);
    drop_graphs(b);
#ifdef LMX_HAVE_NCCL
    if (b->comm)
        ncclCommDestroy(b->comm);
#endif
    for (int i = 0; i < b->n_ropes; i++)
        cudaFree(b->ropes[i].inv);
    cudaFree(b->xbf);
    cudaFree(b->part);
    cudaFree(b->d_step);
    cudaFreeHost(b->h_step);
    cudaFreeHost(b->staging);
    free(b->reads);
    if (b->blas)
        cublasDestroy(b->blas);
    if (b->stream)
        cudaStreamDestroy(b->stream);
    pthread_mutex_destroy(&b->lock);
    free(b);
}

const lmx_backend_ops cuda_ops = {
    "cuda",           cuda_destroy,       cuda_weight,    cuda_alloc,      cuda_free,
    cuda_embed,       cuda_rmsnorm,       cuda_matmul,    cuda_matmul_multi, cuda_qk_prepare,
    cuda_attention,   cuda_gated_mlp,     cuda_residual_norm, cuda_softcap, cuda_copy_rows,
    cuda_read,        cuda_all_reduce,    cuda_step_begin,    cuda_step_end,
    512, /* prefill rows: enough for the tensor cores, activations stay small */
};

} // namespace

static int have_driver(void) { return access("/dev/nvidiactl", F_OK) == 0 || access("/dev/dxg", F_OK) == 0; }

extern "C" int lmx_backend_cuda_available(void)
{
    if (!have_driver())
        return 0;
    int n = 0;
    return cudaGetDeviceCount(&n) == cudaSuccess && n > 0;
}

extern "C" lmx_backend *lmx_backend_cuda_new(int device, lmx_error *err)
{
    if (!have_driver()) {
        lmx_fail(err, LMX_ERR_UNSUPPORTED, "lmx_load: device cuda: no NVIDIA driver (no /dev/nvidiactl)");
        return NULL;
    }
    int n = 0;
    cudaError_t e = cudaGetDeviceCount(&n);
    if (e != cudaSuccess || n <= device) {
        lmx_fail(err, LMX_ERR_UNSUPPORTED, "lmx_load: device cuda: no usable CUDA device %d (%s)", device,
                 e != cudaSuccess ? cudaGetErrorString(e) : "not that many devices");
        return NULL;
    }
    cuda_backend *b = (cuda_backend *)calloc(1, sizeof *b);
    if (!b) {
        lmx_fail(err, LMX_ERR_NOMEM, "out of memory");
        return NULL;
    }
    b->base.ops = &cuda_ops;
    b->device = device;
    const char *attn = getenv("LMX_CUDA_ATTN");
    b->simt_attn = attn && !strcmp(attn, "simt");
    pthread_mutex_init(&b->lock, NULL);
    const char *what = "set device";
    e = cudaSetDevice(device);
    if (e == cudaSuccess && (what = "create stream", e = cudaStreamCreateWithFlags(&b->stream, cudaStreamNonBlocking)) == cudaSuccess &&
        (what = "step buffer", e = cudaMallocHost((void **)&b->h_step, (MAX_IDS + 1) * sizeof(int))) == cudaSuccess)
        what = "step buffer", e = cudaMalloc((void **)&b->d_step, (MAX_IDS + 1) * sizeof(int));
    if (e != cudaSuccess) {
        lmx_fail(err, LMX_ERR_UNSUPPORTED, "lmx_load: device cuda: %s: %s", what, cudaGetErrorString(e));
        cuda_destroy(&b->base);
        return NULL;
    }
    cublasStatus_t s = cublasCreate(&b->blas);
    if (s != CUBLAS_STATUS_SUCCESS) {
        b->blas = NULL;
        lmx_fail(err, LMX_ERR_UNSUPPORTED, "lmx_load: device cuda: cublasCreate: %s", cublasGetStatusString(s));
        cuda_destroy(&b->base);
        return NULL;
    }
    return &b->base;
}

extern "C" lmx_status lmx_backend_cuda_new_group(int n_ranks, lmx_backend **out, lmx_error *err)
{
#ifdef LMX_HAVE_NCCL
    int n = 0;
    if (!have_driver() || cudaGetDeviceCount(&n) != cudaSuccess || n < n_ranks)
        return lmx_fail(err, LMX_ERR_UNSUPPORTED, "lmx_load: %d GPUs asked for, %d present", n_ranks, n);
    for (int r = 0; r < n_ranks; r++)
        if (!(out[r] = lmx_backend_cuda_new(r, err))) {
            while (r--)
                cuda_destroy(out[r]);
            return err ? err->code : LMX_ERR_UNSUPPORTED;
        }
    /* NVLink multicast (NVLS) stays off unless the user asks for it: the
     * all-reduces here are small, and it can disturb GPUs shared with others */
    setenv("NCCL_NVLS_ENABLE", "0", 0);
    ncclComm_t comms[64];
    int devs[64];
    for (int r = 0; r < n_ranks; r++)
        devs[r] = r;
    ncclResult_t res = n_ranks <= 64 ? ncclCommInitAll(comms, n_ranks, devs) : ncclInvalidArgument;
    if (res != ncclSuccess) {
        for (int r = 0; r < n_ranks; r++)
            cuda_destroy(out[r]);
        return lmx_fail(err, LMX_ERR_UNSUPPORTED, "lmx_load: NCCL over %d GPUs: %s", n_ranks, ncclGetErrorString(res));
    }
    for (int r = 0; r < n_ranks; r++)
        cu(out[r])->comm = comms[r];
    return LMX_OK;
#else
    (void)out;
    return lmx_fail(err, LMX_ERR_UNSUPPORTED, "lmx_load: %d GPUs: this lmx was built without NCCL", n_ranks);
#endif
}
