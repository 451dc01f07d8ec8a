/* Would a persistent decode kernel beat a chain of kernels? The bf16
 * products of a Qwen3-8B decode step (36 layers: q/k/v, o, gate/up with
 * the gated activation, down) and stand-ins for the short kernels between
 * them (attention: 8 blocks running a chain of dependent loads, then
 * writing the 4096 outputs; each norm: one block adding the residual and
 * normalizing), run two ways with the same device code for each phase:
 *
 *   chain:   a kernel a phase, launched with programmatic dependent launch
 *            from a CUDA graph (as lmx's decode step is);
 *   persist: one cooperative kernel, one block a multiprocessor, the
 *            phases separated by grid barriers; "stage" adds that every
 *            warp copies the first weights of its next product into
 *            shared memory (cp.async) before it waits at the barrier, so
 *            the weights stream while the short phases and the barrier
 *            hold the step.
 *
 * Each as the whole step and as its products alone. Every product splits
 * its rows' weights evenly over the blocks and, in a block, over the warps
 * (a warp's share may end inside a row: partial sums meet in shared
 * memory), so no block idles at a product's end. Prints each variant's
 * step time (best of 5) and bytes of weights read a second against the
 * device-to-device copy bandwidth, and checks that the variants agree on
 * the step's output.
 *
 *   persist_probe [layers] [attention rounds] */
#include <cooperative_groups.h>
#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include "cuda_check.h"

extern "C" {
#include "backend.h"
}

namespace {
#include "cuda_common.cuh" /* warp_sum, block_sum */
#include "cuda_gemv.cuh"   /* wvec: bf16 weights to float */
} // namespace

namespace cg = cooperative_groups;

/* Threads a block (one block a multiprocessor) and chunks a lane loads
 * while summing the previous ones: other values build as variants
 * (nvcc -DPERSIST_THREADS=1024 -DPERSIST_U=2). */
#ifndef PERSIST_THREADS
#define PERSIST_THREADS 512
#endif
#ifndef PERSIST_U
#define PERSIST_U 4
#endif
enum { THREADS = PERSIST_THREADS, WARPS = THREADS / 32, STAGE_PER_LANE = 8, MAX_ROWS = 256, ATTN_BLOCKS = 8 };
enum { HID = 4096, QKV = 6144, INTER = 12288 };
enum phase_kind { GEMV, GATED, ATTN, NORM };

struct phase {
    int kind;
    const uint4 *w, *w2; /* GATED: gate and up */
    const float *x;      /* GEMV/GATED input; ATTN: q/k/v; NORM: y */
    float *out;          /* GEMV/GATED/ATTN output; NORM: h */
    float *res;          /* NORM: the residual x, updated */
    int N, K;
};

/* The chunks of weights (16 bytes) a warp stages: its first STAGE_PER_LANE
 * a lane. */
__host__ __device__ constexpr size_t stage_bytes() { return (size_t)WARPS * 32 * STAGE_PER_LANE * 16; }

/* x by plain loads: it is rewritten between phases of one persistent
 * launch, which the read-only path (__ldg) would not see. */
__device__ __forceinline__ float dot8(uint4 u, const float *x)
{
    float4 a = ((const float4 *)x)[0], b = ((const float4 *)x)[1];
    float f[8];
    wvec<__nv_bfloat16>::cvt(u, f);
    return f[0] * a.x + f[1] * a.y + f[2] * a.z + f[3] * a.w + f[4] * b.x + f[5] * b.y + f[6] * b.z + f[7] * b.w;
}

/* A block's share of a product: rows [n0, n0 + rb) of w (and of w2 after
 * them when gated), rb * (1 or 2) * K / 8 chunks; warp w takes chunks
 * [s, e) of that range. */
struct share {
    int n0, rb, rows, nv, s, e;
};
__device__ __forceinline__ share share_of(const phase &p, int block, int warp)
{
    share h;
    h.n0 = (int)((long)block * p.N / gridDim.x);
    h.rb = (int)((long)(block + 1) * p.N / gridDim.x) - h.n0;
    h.rows = p.kind == GATED ? 2 * h.rb : h.rb;
    h.nv = p.K / 8;
    long total = (long)h.rows * h.nv;
    h.s = (int)(total * warp / WARPS);
    h.e = (int)(total * (warp + 1) / WARPS);
    return h;
}
/* Row r of the share's weights (of w2 past rb), and its chunk j's. */
__device__ __forceinline__ const uint4 *row_at(const phase &p, const share &h, int r)
{
    return r < h.rb ? p.w + (size_t)(h.n0 + r) * h.nv : p.w2 + (size_t)(h.n0 + r - h.rb) * h.nv;
}
__device__ __forceinline__ const uint4 *chunk_at(const phase &p, const share &h, int j)
{
    return row_at(p, h, j / h.nv) + j % h.nv;
}

/* This lane's first chunks of its warp's share of p, to shared memory. */
__device__ void stage(const phase &p, uint4 *st)
{
    if (p.kind != GEMV && p.kind != GATED)
        return;
    int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    share h = share_of(p, blockIdx.x, warp);
    uint4 *mine = st + (size_t)warp * 32 * STAGE_PER_LANE;
    for (int i = 0; i < STAGE_PER_LANE; i++) {
        int j = h.s + lane + 32 * i;
        if (j < h.e) {
            unsigned d = (unsigned)__cvta_generic_to_shared(mine + i * 32 + lane);
            asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"(d), "l"(chunk_at(p, h, j)) : "memory");
        }
    }
    asm volatile("cp.async.commit_group;" ::: "memory");
}

/* Where a lane is in its warp's share: chunk j (its i-th), row r of the
 * share and chunk c of that row, whose weights start at w. */
struct cursor {
    int j, i, r, c;
    const uint4 *w;
};

/* U chunks of weights a lane in flight while the previous U are summed. */
enum { U = PERSIST_U };
struct batch {
    uint4 u[U];
    int r[U], c[U], n;
};
__device__ __forceinline__ void load(batch &b, cursor &k, const phase &p, const share &h, const uint4 *mine,
                                     bool staged)
{
    b.n = 0;
#pragma unroll
    for (int q = 0; q < U; q++) {
        if (k.j >= h.e)
            break;
        int lane = threadIdx.x & 31;
        b.u[q] = staged && k.i < STAGE_PER_LANE ? mine[k.i * 32 + lane] : __ldcs(k.w + k.c);
        b.r[q] = k.r;
        b.c[q] = k.c;
        b.n++;
        k.j += 32;
        k.i++;
        k.c += 32;
        if (k.c >= h.nv) { /* rows have at least 32 chunks */
            k.c -= h.nv;
            k.r++;
            k.w = row_at(p, h, k.r);
        }
    }
}

/* The product; staged: this lane's first chunks are in st (stage()). */
__device__ void gemv(const phase &p, uint4 *st, float *acc, bool staged)
{
    int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    share h = share_of(p, blockIdx.x, warp);
    for (int r = threadIdx.x; r < h.rows; r += blockDim.x)
        acc[r] = 0;
    if (staged)
        asm volatile("cp.async.wait_all;" ::: "memory");
    __syncthreads();
    const uint4 *mine = st + (size_t)warp * 32 * STAGE_PER_LANE;
    cursor k;
    k.j = h.s + lane;
    k.i = 0;
    k.r = k.j / h.nv;
    k.c = k.j % h.nv;
    k.w = row_at(p, h, k.r);
    float sum = 0;
    int row = k.r;
    batch cur, next;
    load(cur, k, p, h, mine, staged);
    while (cur.n) {
        load(next, k, p, h, mine, staged);
#pragma unroll
        for (int q = 0; q < U; q++) {
            if (q >= cur.n)
                break;
            if (cur.r[q] != row) {
                atomicAdd(acc + row, sum);
                row = cur.r[q];
                sum = 0;
            }
            sum += dot8(cur.u[q], p.x + (size_t)cur.c[q] * 8);
        }
        cur = next;
    }
    if (k.j > h.s + lane) /* the lane had chunks */
        atomicAdd(acc + row, sum);
    __syncthreads();
    for (int r = threadIdx.x; r < h.rb; r += blockDim.x) {
        float v = acc[r];
        if (p.kind == GATED)
            v = v / (1.0f + __expf(-v)) * acc[h.rb + r]; /* SiLU(gate) * up */
        p.out[h.n0 + r] = v;
    }
}

/* Attention's stand-in: ATTN_BLOCKS blocks, `rounds` dependent loads from
 * the q/k/v just written, then each writes its 512 outputs. */
__device__ void attn(const phase &p, float *red, int rounds)
{
    if (blockIdx.x >= ATTN_BLOCKS)
        return;
    unsigned key = blockIdx.x;
    for (int r = 0; r < rounds; r++) {
        int i = (int)((key * 2654435761u + threadIdx.x * 7u) % QKV);
        float s = block_sum(p.x[i], red);
        key = key * 31u + (unsigned)(s != s) + r;
    }
    for (int i = threadIdx.x; i < HID / ATTN_BLOCKS; i += blockDim.x) {
        int o = blockIdx.x * (HID / ATTN_BLOCKS) + i;
        p.out[o] = p.x[o] + (float)(key & 1) * 1e-30f;
    }
}

/* A norm's stand-in: one block adds y into the residual and writes h. */
__device__ void norm(const phase &p, float *red)
{
    if (blockIdx.x != 0)
        return;
    float ss = 0;
    for (int i = threadIdx.x; i < HID; i += blockDim.x) {
        float v = p.res[i] + p.x[i];
        p.res[i] = v;
        ss += v * v;
    }
    float inv = rsqrtf(block_sum(ss, red) / HID + 1e-6f);
    for (int i = threadIdx.x; i < HID; i += blockDim.x)
        p.out[i] = p.res[i] * inv;
}

__device__ void run(const phase &p, uint4 *st, float *acc, bool staged, int rounds)
{
    if (p.kind == GEMV || p.kind == GATED)
        gemv(p, st, acc, staged);
    else if (p.kind == ATTN)
        attn(p, acc, rounds);
    else
        norm(p, acc);
}

/* The chain: one phase a launch. */
__global__ void __launch_bounds__(THREADS, 1) k_phase(phase p, int rounds)
{
    extern __shared__ uint4 smem[];
    asm volatile("griddepcontrol.wait;" ::: "memory");
    asm volatile("griddepcontrol.launch_dependents;" :::);
    run(p, smem, (float *)(smem + stage_bytes() / 16), false, rounds);
}

/* Every phase in one launch, a grid barrier between phases. */
__global__ void __launch_bounds__(THREADS, 1) k_persist(const phase *ph, int n, int staged, int rounds)
{
    extern __shared__ uint4 smem[];
    float *acc = (float *)(smem + stage_bytes() / 16);
    cg::grid_group grid = cg::this_grid();
    if (staged)
        stage(ph[0], smem);
    for (int i = 0; i < n; i++) {
        run(ph[i], smem, acc, staged && (ph[i].kind == GEMV || ph[i].kind == GATED), rounds);
        if (i + 1 < n) {
            if (staged) {
                __syncthreads(); /* every warp is done with its staged chunks */
                stage(ph[i + 1], smem);
            }
            grid.sync();
        }
    }
}

__global__ void k_fill(uint16_t *w, size_t n, unsigned seed)
{
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
        unsigned h = (unsigned)i * 2654435761u ^ seed;
        h ^= h >> 15;
        h *= 2246822519u;
        h ^= h >> 13;
        float v = ((float)(h & 0xffff) / 65536.0f - 0.5f) * 0.05f;
        w[i] = (uint16_t)(__float_as_uint(v) >> 16);
    }
}

static double now_ms(cudaEvent_t a, cudaEvent_t b)
{
    float ms;
    CK(cudaEventElapsedTime(&ms, a, b));
    return ms;
}

int main(int argc, char **argv)
{
    int layers = argc > 1 ? atoi(argv[1]) : 36, rounds = argc > 2 ? atoi(argv[2]) : 6;
    if (layers < 1 || layers > 64 || rounds < 0 || rounds > 10000) {
        fprintf(stderr, "usage: persist_probe [layers 1-64] [attention rounds 0-10000]\n");
        return 2;
    }
    cudaDeviceProp prop;
    CK(cudaGetDeviceProperties(&prop, 0));
    const int G = prop.multiProcessorCount;
    const size_t smem = stage_bytes() + MAX_ROWS * sizeof(float);
    CK(cudaFuncSetAttribute(k_phase, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem));
    CK(cudaFuncSetAttribute(k_persist, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem));
    int fit = 0;
    CK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&fit, k_persist, THREADS, smem));
    if (fit < 1 || 2 * (size_t)INTER / G + 2 > MAX_ROWS) {
        fprintf(stderr, "persist_probe: %d blocks of %d threads fit a multiprocessor; %d SMs\n", fit, THREADS, G);
        return 1;
    }

    /* weights, layer by layer: q/k/v, o, gate, up, down */
    const size_t per_layer = (size_t)QKV * HID + (size_t)HID * HID + 2 * (size_t)INTER * HID + (size_t)HID * INTER;
    uint16_t *w;
    CK(cudaMalloc(&w, per_layer * layers * 2));
    k_fill<<<4 * G, 256>>>(w, per_layer * layers, 7u);
    CK(cudaGetLastError());
    float *buf;
    enum { X, Y, H, QKVB, ATT, ACT, NBUF };
    const size_t off[NBUF + 1] = {0, HID, 2 * HID, 3 * HID, 3 * HID + QKV, 4 * HID + QKV, 4 * HID + QKV + INTER};
    CK(cudaMalloc(&buf, off[NBUF] * sizeof(float)));
    float *x0 = (float *)malloc(HID * sizeof(float));
    for (int i = 0; i < HID; i++)
        x0[i] = sinf(0.37f * i);

    phase all[64 * 7], prods[64 * 4];
    int n_all = 0, n_prods = 0;
    for (int l = 0; l < layers; l++) {
        const uint4 *base = (const uint4 *)(w + per_layer * l);
        const uint4 *qkv = base, *o = qkv + (size_t)QKV * HID / 8, *gate = o + (size_t)HID * HID / 8,
                    *up = gate + (size_t)INTER * HID / 8, *down = up + (size_t)INTER * HID / 8;
        phase pq = {GEMV, qkv, NULL, buf + off[H], buf + off[QKVB], NULL, QKV, HID};
        phase pa = {ATTN, NULL, NULL, buf + off[QKVB], buf + off[ATT], NULL, 0, 0};
        phase po = {GEMV, o, NULL, buf + off[ATT], buf + off[Y], NULL, HID, HID};
        phase pn = {NORM, NULL, NULL, buf + off[Y], buf + off[H], buf + off[X], 0, 0};
        phase pg = {GATED, gate, up, buf + off[H], buf + off[ACT], NULL, INTER, HID};
        phase pd = {GEMV, down, NULL, buf + off[ACT], buf + off[Y], NULL, HID, INTER};
        phase seq[7] = {pq, pa, po, pn, pg, pd, pn};
        for (int i = 0; i < 7; i++) {
            all[n_all++] = seq[i];
            if (seq[i].kind == GEMV || seq[i].kind == GATED)
                prods[n_prods++] = seq[i];
        }
    }
    phase *d_all, *d_prods;
    CK(cudaMalloc(&d_all, sizeof all));
    CK(cudaMalloc(&d_prods, sizeof prods));
    CK(cudaMemcpy(d_all, all, sizeof all, cudaMemcpyHostToDevice));
    CK(cudaMemcpy(d_prods, prods, sizeof prods, cudaMemcpyHostToDevice));

    cudaStream_t st;
    CK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
    cudaEvent_t e0, e1;
    CK(cudaEventCreate(&e0));
    CK(cudaEventCreate(&e1));

    /* copy bandwidth (bytes read + written), as gpu_bench measures it */
    size_t half = per_layer; /* bytes: half the first layer's weights */
    CK(cudaMemcpyAsync((char *)w + half, w, half, cudaMemcpyDeviceToDevice, st));
    CK(cudaEventRecord(e0, st));
    for (int i = 0; i < 4; i++)
        CK(cudaMemcpyAsync((char *)w + half, w, half, cudaMemcpyDeviceToDevice, st));
    CK(cudaEventRecord(e1, st));
    CK(cudaEventSynchronize(e1));
    double copy = 2.0 * 4 * half / (now_ms(e0, e1) * 1e6);
    k_fill<<<4 * G, 256>>>(w, per_layer * layers, 7u); /* the copies overwrote part of layer 0 */
    CK(cudaDeviceSynchronize());
    double bytes = (double)per_layer * 2 * layers;
    printf("%s, %d SMs; copy %.0f GB/s; %d layers, %.2f GB of weights a step; attention stand-in %d rounds; "
           "%d threads a block, %d loads a lane\n", prop.name, G, copy, layers, bytes / 1e9, rounds, THREADS, U);

    /* the chain's graphs: all phases, and the products alone */
    cudaGraphExec_t chain[2];
    for (int v = 0; v < 2; v++) {
        const phase *ps = v ? prods : all;
        int n = v ? n_prods : n_all;
        cudaGraph_t g;
        CK(cudaStreamBeginCapture(st, cudaStreamCaptureModeGlobal));
        for (int i = 0; i < n; i++) {
            cudaLaunchConfig_t cfg = {};
            cudaLaunchAttribute at[1];
            at[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
            at[0].val.programmaticStreamSerializationAllowed = 1;
            cfg.gridDim = ps[i].kind == ATTN ? ATTN_BLOCKS : ps[i].kind == NORM ? 1 : G;
            cfg.blockDim = THREADS;
            cfg.dynamicSmemBytes = smem;
            cfg.stream = st;
            cfg.attrs = at;
            cfg.numAttrs = 1;
            CK(cudaLaunchKernelEx(&cfg, k_phase, ps[i], rounds));
        }
        CK(cudaStreamEndCapture(st, &g));
        CK(cudaGraphInstantiate(&chain[v], g, 0));
        CK(cudaGraphDestroy(g));
    }

    struct variant {
        const char *name;
        int persist, staged, prods_only;
    } vs[] = {{"chain", 0, 0, 0},         {"persist", 1, 0, 0},        {"persist+stage", 1, 1, 0},
              {"chain (products)", 0, 0, 1}, {"persist (products)", 1, 0, 1}, {"persist+stage (products)", 1, 1, 1}};
    float out[6][HID];
    for (int v = 0; v < 6; v++) {
        double best = 1e30;
        for (int rep = 0; rep < 6; rep++) {
            CK(cudaMemsetAsync(buf, 0, off[NBUF] * sizeof(float), st));
            CK(cudaMemcpyAsync(buf + off[X], x0, HID * sizeof(float), cudaMemcpyHostToDevice, st));
            CK(cudaMemcpyAsync(buf + off[H], x0, HID * sizeof(float), cudaMemcpyHostToDevice, st));
            CK(cudaEventRecord(e0, st));
            if (vs[v].persist) {
                const phase *ps = vs[v].prods_only ? d_prods : d_all;
                int n = vs[v].prods_only ? n_prods : n_all, staged = vs[v].staged;
                void *args[] = {(void *)&ps, &n, &staged, &rounds};
                CK(cudaLaunchCooperativeKernel((const void *)k_persist, G, THREADS, args, smem, st));
            } else {
                CK(cudaGraphLaunch(chain[vs[v].prods_only], st));
            }
            CK(cudaEventRecord(e1, st));
            CK(cudaEventSynchronize(e1));
            double ms = now_ms(e0, e1);
            if (rep > 0 && ms < best) /* the first is a warm-up */
                best = ms;
        }
        CK(cudaMemcpy(out[v], buf + (vs[v].prods_only ? off[Y] : off[X]), HID * sizeof(float),
                      cudaMemcpyDeviceToHost));
        int ref = vs[v].prods_only ? 3 : 0;
        double err = 0, mag = 0;
        for (int i = 0; i < HID; i++) {
            err = fmax(err, fabs((double)out[v][i] - out[ref][i]));
            mag = fmax(mag, fabs((double)out[ref][i]));
        }
        printf("%-26s %8.1f us a step, %5.0f GB/s of weights = %5.1f%% of copy; output vs %s: max diff %.2e of %.2e\n",
               vs[v].name, best * 1e3, bytes / (best * 1e6), 100 * bytes / (best * 1e6) / copy, vs[ref].name, err,
               mag);
    }
    return 0;
}
