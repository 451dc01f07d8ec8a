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

/* One block per dim-long vector; with q.xq (vectors that are whole rows)
 * the output is also quantized for the q8/q4 GEMV that reads it. */
__global__ void k_rmsnorm(float *out, const float *x, const void *w, int dt, int dim, float eps, int plus_one,
                          xquant q)
{
    prefetch_norm(w, dt, dim);
    pdl_trigger();
    pdl_wait();
    __shared__ float red[32];
    const float *src = x + (size_t)blockIdx.x * dim;
    float *dst = out + (size_t)blockIdx.x * dim;
    float ss = 0;
    for (int j = threadIdx.x; j < dim; j += blockDim.x)
        ss += src[j] * src[j];
    float r = 1.0f / sqrtf(block_sum(ss, red) / dim + eps);
    for (int j = threadIdx.x; j < dim; j += blockDim.x)
        dst[j] = src[j] * r * norm_w(w, dt, j, plus_one);
    if (q.xq)
        quant_row(q, dst, dim, blockIdx.x);
}

/* A residual connection and the next norm, one block per row of dim:
 * y' = post ? rmsnorm(y, post) : y; x += y'; h = rmsnorm(x, next); h also
 * quantized with q.xq, as k_rmsnorm. */
__global__ void k_residual_norm(float *__restrict__ x, float *__restrict__ h, const float *__restrict__ y,
                                const void *post, int dt_post, const void *next, int dt_next, int dim, float eps,
                                int plus_one, xquant q)
{
    prefetch_norm(post, dt_post, dim);
    prefetch_norm(next, dt_next, dim);
    pdl_trigger();
    pdl_wait();
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
    if (q.xq)
        quant_row(q, hr, dim, blockIdx.x);
}

__global__ void k_to_bf16(__nv_bfloat16 *dst, const float *src, size_t n)
{
    pdl_trigger();
    pdl_wait();
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
        dst[i] = __float2bfloat16_rn(src[i]);
}

/* Attention's inputs, one block per (head, row); heads [0, Hq) are q's,
 * [Hq, Hq + Hk) k's. Each head: RMSNorm over head_dim, rotate-half RoPE
 * (inv: the float32 inverse frequencies computed on the host as the CPU
 * backend does); q's heads back in place, k's to the cache with v's head
 * of the same number, both rounded to bf16 (the cache's precision).
 * blockDim: head_dim rounded up to 32. */
__global__ void k_qk_prepare(float *q, const float *k, const float *v, const void *qn, int dt_q, const void *kn,
                             int dt_k, __nv_bfloat16 *kc, __nv_bfloat16 *vc, const float *inv, int hd, int Hq,
                             int Hk, int slots, const int *dpos, int pos0, float eps, int plus_one)
{
    prefetch_norm(blockIdx.x < Hq ? qn : kn, blockIdx.x < Hq ? dt_q : dt_k, hd);
    pdl_trigger();
    pdl_wait();
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
    kc[slot] = __float2bfloat16_rn(out);
    vc[slot] = __float2bfloat16_rn(v[at + t]);
}

__global__ void k_gated_act(float *g, const float *u, size_t n, int gelu)
{
    pdl_trigger();
    pdl_wait();
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
        g[i] = act_fn(g[i], gelu) * u[i];
}

__global__ void k_softcap(float *x, size_t n, float cap)
{
    pdl_trigger();
    pdl_wait();
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
        x[i] = cap * tanhf(x[i] / cap);
}
