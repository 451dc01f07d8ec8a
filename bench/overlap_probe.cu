/* Can a decode step stream weights while its latency-bound kernels run?
 * A persistent decode kernel (docs/cuda.md, "Not done yet") would load the
 * next product's weights while attention and the norms, chains of
 * dependent loads on a few multiprocessors, hold the step. That pays only
 * if those chains do not slow down when the rest of the GPU saturates the
 * memory bus. This probe measures it: a chain kernel (CHAIN_BLOCKS blocks
 * of 128 threads; each round every thread loads 16 bytes whose address
 * depends on the previous round's block-wide sum, as a tile of attention
 * depends on the one before) runs alone and beside a stream kernel that
 * reads a 2 GiB buffer on every multiprocessor, in three ways: 16-byte
 * loads into registers (as lmx's GEMVs read weights), cp.async copies into
 * shared memory (as a persistent kernel would stage them) and L2 prefetches
 * (as a side branch of the graph could). The chain reads either a 4 MiB
 * buffer (L2 hits, as attention reads the q/k/v just written) or a 1 GiB
 * one (DRAM, as it reads a long KV cache).
 *
 *   overlap_probe [rounds] [stream blocks]
 *
 * (the stream's blocks, 512 threads each, default two a multiprocessor:
 * fewer read less than the memory can give, to see how a gentler stream
 * slows the chain)
 * Prints the chain's nanoseconds a round (median block) and the stream's
 * GB/s, each alone and together, and the device-to-device copy bandwidth
 * (bytes read + written) as gpu_bench measures it. */
#include <cuda_runtime.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include "cuda_check.h"

enum { CHAIN_BLOCKS = 8, CHAIN_THREADS = 128, STREAM_THREADS = 512, STAGE = 4 };
enum stream_mode { LOADS, CP_ASYNC, PREFETCH, N_MODES };
static const char *mode_name[N_MODES] = {"loads", "cp.async", "L2 prefetch"};

__device__ __forceinline__ unsigned long long now_ns()
{
    unsigned long long t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
    return t;
}

/* rounds of dependent loads: the next address is a hash of the block's
 * sum, so no load can be issued before the previous round completes. */
__global__ void k_chain(const uint4 *buf, size_t n16, int rounds, unsigned long long *span, unsigned *sink)
{
    __shared__ unsigned sum[CHAIN_THREADS / 32];
    unsigned p = blockIdx.x * 7919u, acc = 0;
    unsigned long long t0 = now_ns();
    for (int r = 0; r < rounds; r++) {
        size_t i = ((size_t)p * 2654435761u + threadIdx.x * 8) & (n16 - 1); /* n16: a power of 2 */
        uint4 v = __ldcg(buf + i);
        unsigned x = v.x ^ v.y ^ v.z ^ v.w;
        for (int o = 16; o; o >>= 1)
            x += __shfl_xor_sync(0xffffffffu, x, o);
        if ((threadIdx.x & 31) == 0)
            sum[threadIdx.x >> 5] = x;
        __syncthreads();
        p = p * 31u + sum[0] + sum[1] + sum[2] + sum[3] + r;
        acc ^= p;
        __syncthreads();
    }
    if (threadIdx.x == 0) {
        span[blockIdx.x] = now_ns() - t0;
        sink[blockIdx.x] = acc;
    }
}

/* Every block reads its share of buf `passes` times; span[block] = its
 * first and last time stamps. */
__global__ void k_stream(const uint4 *buf, size_t n16, int passes, int mode, unsigned long long *span, unsigned *sink)
{
    extern __shared__ uint4 stage[]; /* STAGE rounds of one 16-byte piece a thread */
    unsigned long long t0 = now_ns();
    size_t step = (size_t)gridDim.x * blockDim.x, first = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    unsigned acc = 0;
    for (int pass = 0; pass < passes; pass++) {
        if (mode == LOADS) {
            size_t i = first;
            for (; i + 3 * step < n16; i += 4 * step) {
                uint4 a = __ldcs(buf + i), b = __ldcs(buf + i + step), c = __ldcs(buf + i + 2 * step),
                      d = __ldcs(buf + i + 3 * step);
                acc ^= a.x ^ b.y ^ c.z ^ d.w;
            }
            for (; i < n16; i += step)
                acc ^= __ldcs(buf + i).x;
        } else if (mode == CP_ASYNC) {
            int k = 0;
            for (size_t i = first; i < n16; i += step, k++) {
                uint4 *dst = stage + (k % STAGE) * blockDim.x + threadIdx.x;
                unsigned d = (unsigned)__cvta_generic_to_shared(dst);
                asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"(d), "l"(buf + i) : "memory");
                asm volatile("cp.async.commit_group;" ::: "memory");
                if (k >= STAGE - 1) { /* the oldest of STAGE copies in flight has landed: use it */
                    asm volatile("cp.async.wait_group %0;" ::"n"(STAGE - 1) : "memory");
                    acc ^= stage[((k + 1) % STAGE) * blockDim.x + threadIdx.x].x;
                }
            }
            asm volatile("cp.async.wait_all;" ::: "memory");
        } else {
            for (size_t i = first * 8; i < n16; i += step * 8) /* one 128-byte line a thread */
                asm volatile("prefetch.global.L2 [%0];" ::"l"(buf + i));
        }
    }
    __syncthreads();
    if (threadIdx.x == 0) {
        span[2 * blockIdx.x] = t0;
        span[2 * blockIdx.x + 1] = now_ns();
    }
    if (acc == 0x12345678u)
        sink[0] = acc;
}

static int cmp_u64(const void *a, const void *b)
{
    unsigned long long x = *(const unsigned long long *)a, y = *(const unsigned long long *)b;
    return x < y ? -1 : x > y;
}

struct probe {
    int sms, rounds, stream_blocks;
    uint4 *big, *chain_l2, *chain_dram;
    size_t big16, l2_16, dram16;
    unsigned long long *chain_span, *stream_span;
    unsigned *sink;
    cudaStream_t a, b;
};

/* The chain's median ns a round. */
static double chain_ns(const probe &p)
{
    unsigned long long s[CHAIN_BLOCKS];
    CK(cudaMemcpy(s, p.chain_span, sizeof s, cudaMemcpyDeviceToHost));
    qsort(s, CHAIN_BLOCKS, sizeof s[0], cmp_u64);
    return (double)s[CHAIN_BLOCKS / 2] / p.rounds;
}

/* The stream's GB/s: bytes over the span from its first block's start to
 * its last block's end. */
static double stream_gbs(const probe &p, int passes)
{
    size_t n = 2 * (size_t)p.stream_blocks;
    unsigned long long *s = (unsigned long long *)malloc(n * sizeof *s), lo = ~0ull, hi = 0;
    CK(cudaMemcpy(s, p.stream_span, n * sizeof *s, cudaMemcpyDeviceToHost));
    for (size_t i = 0; i < n; i += 2) {
        lo = s[i] < lo ? s[i] : lo;
        hi = s[i + 1] > hi ? s[i + 1] : hi;
    }
    free(s);
    return (double)p.big16 * 16 * passes / (double)(hi - lo);
}

static void run_chain(const probe &p, const uint4 *buf, size_t n16, cudaStream_t st)
{
    k_chain<<<CHAIN_BLOCKS, CHAIN_THREADS, 0, st>>>(buf, n16, p.rounds, p.chain_span, p.sink);
    CK(cudaGetLastError());
}

static void run_stream(const probe &p, int mode, int passes, cudaStream_t st)
{
    k_stream<<<p.stream_blocks, STREAM_THREADS, STAGE * STREAM_THREADS * 16, st>>>(p.big, p.big16, passes, mode,
                                                                                  p.stream_span, p.sink);
    CK(cudaGetLastError());
}

int main(int argc, char **argv)
{
    probe p = {};
    p.rounds = argc > 1 ? atoi(argv[1]) : 5000;
    cudaDeviceProp prop;
    CK(cudaGetDeviceProperties(&prop, 0));
    p.sms = prop.multiProcessorCount;
    p.stream_blocks = argc > 2 ? atoi(argv[2]) : 2 * p.sms;
    if (p.rounds < 1 || p.rounds > 10000000 || p.stream_blocks < 1 || p.stream_blocks > 2 * p.sms) {
        fprintf(stderr, "usage: overlap_probe [rounds 1-10000000] [stream blocks 1-%d]\n", 2 * p.sms);
        return 2;
    }
    p.big16 = ((size_t)2 << 30) / 16;
    p.l2_16 = ((size_t)4 << 20) / 16;
    p.dram16 = ((size_t)1 << 30) / 16;
    CK(cudaMalloc(&p.big, p.big16 * 16));
    CK(cudaMalloc(&p.chain_l2, p.l2_16 * 16));
    CK(cudaMalloc(&p.chain_dram, p.dram16 * 16));
    CK(cudaMemset(p.big, 1, p.big16 * 16));
    CK(cudaMemset(p.chain_l2, 2, p.l2_16 * 16));
    CK(cudaMemset(p.chain_dram, 3, p.dram16 * 16));
    CK(cudaMalloc(&p.chain_span, CHAIN_BLOCKS * sizeof *p.chain_span));
    CK(cudaMalloc(&p.stream_span, 2 * (size_t)p.stream_blocks * sizeof *p.stream_span));
    CK(cudaMalloc(&p.sink, CHAIN_BLOCKS * sizeof *p.sink));
    CK(cudaStreamCreateWithFlags(&p.a, cudaStreamNonBlocking));
    CK(cudaStreamCreateWithFlags(&p.b, cudaStreamNonBlocking));

    /* copy bandwidth, as gpu_bench measures it */
    cudaEvent_t e0, e1;
    CK(cudaEventCreate(&e0));
    CK(cudaEventCreate(&e1));
    size_t half = p.big16 * 8;
    CK(cudaMemcpy((char *)p.big + half, p.big, half, cudaMemcpyDeviceToDevice));
    CK(cudaEventRecord(e0));
    CK(cudaMemcpy((char *)p.big + half, p.big, half, cudaMemcpyDeviceToDevice));
    CK(cudaEventRecord(e1));
    CK(cudaEventSynchronize(e1));
    float ms;
    CK(cudaEventElapsedTime(&ms, e0, e1));
    printf("%s, %d SMs; copy %.0f GB/s (read + written); chain %d blocks x %d rounds; stream %d blocks\n",
           prop.name, p.sms, 2.0 * half / (ms * 1e6), CHAIN_BLOCKS, p.rounds, p.stream_blocks);

    const char *chain_name[2] = {"L2 (4 MiB)", "DRAM (1 GiB)"};
    const uint4 *chain_buf[2] = {p.chain_l2, p.chain_dram};
    size_t chain_n[2] = {p.l2_16, p.dram16};
    double alone[2];
    for (int c = 0; c < 2; c++) {
        run_chain(p, chain_buf[c], chain_n[c], p.a); /* warm-up */
        run_chain(p, chain_buf[c], chain_n[c], p.a);
        CK(cudaStreamSynchronize(p.a));
        alone[c] = chain_ns(p);
    }
    for (int m = 0; m < N_MODES; m++) {
        run_stream(p, m, 1, p.a); /* warm-up */
        run_stream(p, m, 1, p.a);
        CK(cudaStreamSynchronize(p.a));
        double gbs = stream_gbs(p, 1);
        for (int c = 0; c < 2; c++) {
            /* the stream, long enough to cover the chain, starts first */
            int passes = 1;
            while (passes < 256 && (double)p.big16 * 16 * passes / gbs < 3.0 * alone[c] * p.rounds)
                passes *= 2;
            run_stream(p, m, passes, p.a);
            run_chain(p, chain_buf[c], chain_n[c], p.b);
            CK(cudaDeviceSynchronize());
            double together = chain_ns(p);
            printf("stream %-11s chain %-12s | chain alone %6.0f ns/round, beside the stream %6.0f (x%.2f) | "
                   "stream alone %5.0f GB/s, beside the chain %5.0f\n",
                   mode_name[m], chain_name[c], alone[c], together, together / alone[c], gbs,
                   stream_gbs(p, passes));
        }
    }
    return 0;
}
