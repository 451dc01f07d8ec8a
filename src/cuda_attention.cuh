/* Attention kernels: split-K decode with its merge, SIMT and tensor-core
 * (flash-attention style) prefill. */
#pragma once

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
    pdl_trigger();
    pdl_wait();
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
    pdl_trigger();
    pdl_wait();
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
    pdl_trigger();
    pdl_wait();
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
    pdl_trigger();
    pdl_wait();
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
