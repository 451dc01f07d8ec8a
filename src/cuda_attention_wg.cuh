/* Prefill attention on warpgroup MMA (wgmma, sm_90a: H100 and H200), for
 * head_dim 128 (Qwen3) while no key has wrapped around the cache:
 * FlashAttention-3's arithmetic and ping-pong without its producer warp. A
 * block holds WG_Q = 128 queries of one head, 64 for each of its two
 * warpgroups; K/V tiles of WG_K = 128 keys stream into shared memory by the
 * tensor copy engine (one thread issues a tile, an mbarrier says when it
 * landed), all in wgmma's 128-byte-swizzled layout (swizzled). Per tile a
 * warpgroup computes S = Q.K^T by wgmma from shared memory (Q and K both
 * K-major), runs the online softmax of the mma.sync kernel on it
 * (tile_softmax: S's accumulators have mma.sync's layout, a warp 16 rows),
 * and O += P.V by wgmma with P from registers and V read N-major
 * (transposed) from shared memory: no ldmatrix, and 16 times fewer MMA
 * instructions than k_attn_fa. 64-key tiles were 1-1.5% slower
 * (bench/RESULTS.md). Built only for sm_90a (the probe k_wgmma_built says
 * whether it was); elsewhere, with LMX_CUDA_ATTN=mma, and for wrapped
 * keys, k_attn_fa. */
#pragma once

enum { WG_Q = 128, WG_K = 128, WG_HD = 128, WG_STAGES = 3 };

/* Shared memory of k_attn_wg: Q [WG_Q][128], then WG_STAGES stages of K
 * and V [WG_K][128], bf16, and room to align the start to 1024 bytes (the
 * swizzle's period). */
size_t wg_shm() { return (size_t)(WG_Q + 2 * WG_STAGES * WG_K) * WG_HD * 2 + 1024 + WG_STAGES * 8; }

/* mbarriers in shared memory: a stage's tensor copies arrive on one. */
__device__ __forceinline__ unsigned smem_at(const void *p) { return (unsigned)__cvta_generic_to_shared(p); }
__device__ __forceinline__ void mbar_init(uint64_t *bar, unsigned count)
{
    asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"(smem_at(bar)), "r"(count) : "memory");
}
/* One arrival that also expects `bytes` of copies to land on bar. */
__device__ __forceinline__ void mbar_expect(uint64_t *bar, unsigned bytes)
{
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(smem_at(bar)), "r"(bytes) : "memory");
}
/* Waits until bar's phase of the given parity has completed. */
__device__ __forceinline__ void mbar_wait(uint64_t *bar, unsigned parity)
{
    asm volatile("{\n.reg .pred done;\nwait_%=:\n"
                 "mbarrier.try_wait.parity.shared::cta.b64 done, [%0], %1;\n"
                 "@!done bra wait_%=;\n}\n" ::"r"(smem_at(bar)),
                 "r"(parity)
                 : "memory");
}
/* A box of the 3-D tensor map (coordinates innermost first) into shared
 * memory by the tensor copy engine, completing on bar. */
__device__ __forceinline__ void tma_load(void *dst, const CUtensorMap *map, uint64_t *bar, int c0, int c1, int c2)
{
    asm volatile("cp.async.bulk.tensor.3d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3, %4}], "
                 "[%5];" ::"r"(smem_at(dst)),
                 "l"(map), "r"(c0), "r"(c1), "r"(c2), "r"(smem_at(bar))
                 : "memory");
}

/* A wgmma shared-memory matrix descriptor, 128-byte swizzle: the start
 * address, the leading and stride byte offsets (all in 16-byte units). */
__device__ __forceinline__ uint64_t wg_desc(const bf16 *p, unsigned lead, unsigned stride)
{
    uint64_t a = (unsigned)__cvta_generic_to_shared(p);
    return ((a & 0x3ffff) >> 4) | (uint64_t)(lead >> 4) << 16 | (uint64_t)(stride >> 4) << 32 | 1ull << 62;
}

__device__ __forceinline__ void wg_fence() { asm volatile("wgmma.fence.sync.aligned;" ::: "memory"); }
__device__ __forceinline__ void wg_commit() { asm volatile("wgmma.commit_group.sync.aligned;" ::: "memory"); }
/* Waits until at most N of the warpgroup's wgmma groups are in flight. */
template <int N> __device__ __forceinline__ void wg_wait()
{
    asm volatile("wgmma.wait_group.sync.aligned %0;" ::"n"(N) : "memory");
}
/* Shared memory written by threads (cp.async, stores) made visible to
 * wgmma, which reads it through the async proxy. */
__device__ __forceinline__ void fence_async_smem() { asm volatile("fence.proxy.async.shared::cta;" ::: "memory"); }
/* Registers wgmma writes asynchronously: the compiler must not read them
 * before wg_wait (nor move writes past wg_fence). */
template <int N> __device__ __forceinline__ void wg_hold(float (&v)[N][4])
{
#pragma unroll
    for (int j = 0; j < N; j++)
        asm volatile("" : "+f"(v[j][0]), "+f"(v[j][1]), "+f"(v[j][2]), "+f"(v[j][3])::"memory");
}

#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
/* The 64 float32 accumulators a thread holds of a 64 x 128 wgmma result:
 * the operand list (x: float[16][4]) and its registers %0-%63. */
#define WG_ACC_OPS(x)                                                                              \
    WG_ACC4(x, 0), WG_ACC4(x, 1), WG_ACC4(x, 2), WG_ACC4(x, 3), WG_ACC4(x, 4), WG_ACC4(x, 5),    \
        WG_ACC4(x, 6), WG_ACC4(x, 7), WG_ACC4(x, 8), WG_ACC4(x, 9), WG_ACC4(x, 10), WG_ACC4(x, 11), \
        WG_ACC4(x, 12), WG_ACC4(x, 13), WG_ACC4(x, 14), WG_ACC4(x, 15)
#define WG_ACC4(x, i) "+f"(x[i][0]), "+f"(x[i][1]), "+f"(x[i][2]), "+f"(x[i][3])
#define WG_ACC_REGS                                                                                \
    "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, "                      \
    "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, "            \
    "%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, "            \
    "%48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63"

/* s (64 x 128, float32) = or += A . B^T over 16 columns, A and B K-major
 * in shared memory. */
__device__ __forceinline__ void wg_mma_ss(float (&s)[16][4], uint64_t a, uint64_t b, int accumulate)
{
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %66, 0;\n"
                 "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 {"
                 WG_ACC_REGS
                 "}, %64, %65, p, 1, 1, 0, 0;\n}\n"
                 : WG_ACC_OPS(s)
                 : "l"(a), "l"(b), "r"(accumulate));
}

/* o (64 x 128, float32) += A . B over 16 keys, A (P) in registers, B (V)
 * N-major in shared memory. */
__device__ __forceinline__ void wg_mma_rs(float (&o)[16][4], const unsigned (&a)[4], uint64_t b)
{
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %69, 0;\n"
                 "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 {"
                 WG_ACC_REGS
                 "}, {%64, %65, %66, %67}, %68, p, 1, 1, 1;\n}\n"
                 : WG_ACC_OPS(o)
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b), "r"(1));
}
#endif

/* Writes 1 to *built when this binary holds k_attn_wg's code (sm_90a). */
__global__ void k_wgmma_built(int *built)
{
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
    *built = 1;
#else
    *built = 0;
#endif
}

/* One block per (head, WG_Q queries), longest blocks first; q float32 or
 * bf16 (QT); the output in float32 (out) and/or bf16 (ob). The two
 * warpgroups take turns on the tensor cores (FlashAttention-3's ping-pong,
 * by a fixed lag rather than named barriers): per tile j the leading one
 * issues S_j = Q.K_j^T and O += P_(j-1).V_(j-1) together, runs tile j's
 * softmax while its P.V is still on the tensor cores, then rescales O; the
 * lagging one meanwhile finishes tile j - 1 (waits for its products,
 * softmax, rescale) and issues its S_j and P_(j-1).V_(j-1) last, so that
 * they run during the leader's softmax, and the leader's next products
 * during its own. Three stages of K/V: tile j's keys, tile j - 1's values
 * and tile j + 1's copies are in use; the lagging warpgroup issues the
 * copies once its products of tile j - 2 are done. */
template <typename QT>
__global__ void __launch_bounds__(256, 1)
    k_attn_wg(float *out, bf16 *ob, const QT *q, const __grid_constant__ CUtensorMap kmap,
              const __grid_constant__ CUtensorMap vmap, int H, int KVH, int window, float scale, float softcap,
              const int *dpos, int pos0, int n_rows)
{
    pdl_trigger();
    pdl_wait();
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
    extern __shared__ unsigned char wsh[];
    bf16 *Qs = (bf16 *)(((uintptr_t)wsh + 1023) & ~(uintptr_t)1023), *KV = Qs + WG_Q * WG_HD;
    const int STAGE = 2 * WG_K * WG_HD; /* stage b: K at KV + b STAGE, V WG_K rows after */
    int h = blockIdx.x, r0 = (gridDim.y - 1 - blockIdx.y) * WG_Q, nr = min(WG_Q, n_rows - r0);
    int warp = threadIdx.x >> 5, w0 = warp * 16, g0 = (warp >> 2) * 64; /* the warp's and warpgroup's rows */
    /* the warpgroup from a shuffle: ptxas then sees a warp-uniform branch,
     * not a divergent one around wgmma (which it would serialize) */
    bool lead = __shfl_sync(0xffffffffu, threadIdx.x >> 7, 0) == 0;
    int base = (dpos ? *dpos : pos0) + r0, last = base + nr - 1;
    int lo = window > 0 && base - window + 1 > 0 ? base - window + 1 : 0;
    int kvh = h / (H / KVH), ntiles = (last - lo) / WG_K + 1;
    uint64_t *full = (uint64_t *)(KV + WG_STAGES * STAGE); /* full[b]: stage b's copies landed */
    auto stage = [&](int j) { /* one thread: tile j's keys and values into stage j % WG_STAGES */
        bf16 *Kd = KV + j % WG_STAGES * STAGE;
        uint64_t *bar = full + j % WG_STAGES;
        mbar_expect(bar, STAGE * 2);
        for (int half = 0; half < 2; half++) { /* 64 columns: 128-byte rows, the swizzle's width */
            tma_load(Kd + half * WG_K * 64, &kmap, bar, half * 64, kvh, lo + j * WG_K);
            tma_load(Kd + WG_K * WG_HD + half * WG_K * 64, &vmap, bar, half * 64, kvh, lo + j * WG_K);
        }
    };
    if (threadIdx.x == 0) {
        for (int b = 0; b < WG_STAGES; b++)
            mbar_init(full + b, 1);
        asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
        stage(0);
    }
    __syncthreads(); /* the barriers initialized before anyone waits on them */
    for (int i = threadIdx.x; i < WG_Q * WG_HD / 4; i += blockDim.x) { /* Q, rows past n_rows zero */
        int r = i / (WG_HD / 4), c = i % (WG_HD / 4) * 4;
        stage_q4(Qs + swizzled{WG_Q}(r, c), q + ((size_t)(r0 + min(r, nr - 1)) * H + h) * WG_HD + c, r < nr);
    }
    attn_acc<WG_HD> a;
    acc_init(a);
    int lo_r[1][2], hi_r[1][2];
    row_keys(base + w0, window, lo_r[0], hi_r[0]);
    float s[1][WG_K / 8][4], corr[1][2];
    unsigned pa[WG_K / 16][4]; /* P of tile j - 1 for its P.V */
    /* Every warpgroup takes every tile of the block (the mask zeroes what
     * its rows do not see): wgmma issued under a condition would be
     * serialized by the compiler. */
    auto pv = [&](int j) { /* issues O += P.V of tile j (P in pa) */
        const bf16 *Vb = KV + j % WG_STAGES * STAGE + WG_K * WG_HD;
#pragma unroll
        for (int ks = 0; ks < WG_K / 16; ks++) /* 16 keys: two 8-row groups, 2048 bytes */
            wg_mma_rs(a.o, pa[ks], wg_desc(Vb + ks * 16 * 64, WG_K * 128, 1024));
    };
    auto issue = [&](int j) { /* S_j = Q.K_j^T, then O += P_(j-1).V_(j-1): two commit groups */
        wg_hold(a.o);
        wg_fence();
        const bf16 *Kb = KV + j % WG_STAGES * STAGE;
#pragma unroll
        for (int kk = 0; kk < WG_HD / 16; kk++) { /* a 16-column step: 32 bytes within a 128-byte row */
            int half = kk >> 2, col = (kk & 3) * 16;
            wg_mma_ss(s[0], wg_desc(Qs + half * WG_Q * 64 + g0 * 64 + col, 16, 1024),
                      wg_desc(Kb + half * WG_K * 64 + col, 16, 1024), kk > 0);
        }
        wg_commit();
        if (j > 0)
            pv(j - 1);
        wg_commit(); /* P.V's group, empty for tile 0 */
    };
    auto softmax = [&](int j) { /* tile j's scores in s become P; corr for O */
        int t0 = lo + j * WG_K;
        tile_softmax<WG_HD, WG_K, 1>(&a, s, corr, t0, lo_r, hi_r, tile_whole<WG_K, 1>(t0, lo_r, hi_r), scale,
                                     softcap);
    };
    auto finish = [&]() { /* O rescaled (its products done), P packed for the next P.V */
        rescale_o(a, corr[0]);
#pragma unroll
        for (int ks = 0; ks < WG_K / 16; ks++)
            p_frag(pa[ks], s[0][2 * ks], s[0][2 * ks + 1]);
    };
    /* Tile j in; the lagging warpgroup's products of tile j - 2 done. The
     * cache's rows past `last` (the block's last tile) hold zeros or what a
     * longer earlier sequence left, an overflow's Inf or NaN too, which
     * P = 0 would not cancel: V's are zeroed. */
    auto tile_in = [&](int j) {
        mbar_wait(full + j % WG_STAGES, j / WG_STAGES & 1);
        int t0 = lo + j * WG_K;
        if (t0 + WG_K - 1 > last) {
            bf16 *Vd = KV + j % WG_STAGES * STAGE + WG_K * WG_HD;
            for (int i = threadIdx.x; i < WG_K * WG_HD / 8; i += blockDim.x) {
                int r = i / (WG_HD / 8), c = i % (WG_HD / 8) * 8;
                if (t0 + r > last)
                    *(uint4 *)(Vd + swizzled{WG_K}(r, c)) = make_uint4(0, 0, 0, 0);
            }
        }
        fence_async_smem(); /* these stores (and Q's) visible to wgmma's reads */
        /* both warpgroups, from their own loops: a named barrier, which
         * counts arrivals wherever in the code they come from */
        asm volatile("bar.sync 1, 256;" ::: "memory");
    };
    /* One loop for each warpgroup: a path from one's products to the
     * other's use of their registers would make ptxas serialize wgmma. */
    if (lead) {
        for (int j = 0; j < ntiles; j++) {
            tile_in(j);
            issue(j);
            wg_wait<1>(); /* S_j; P.V may still run */
            wg_hold(s[0]);
            softmax(j);
            wg_wait<0>(); /* P.V done: its output and P's registers free */
            wg_hold(a.o);
            finish();
        }
    } else {
        tile_in(0);
        if (ntiles > 1 && threadIdx.x == 128)
            stage(1);
        issue(0);
        for (int j = 1; j < ntiles; j++) {
            tile_in(j);
            wg_wait<0>(); /* S_(j-1) and P_(j-2).V_(j-2) */
            wg_hold(s[0]);
            wg_hold(a.o);
            if (j + 1 < ntiles && threadIdx.x == 128) /* into tile j - 2's stage, which nobody reads now */
                stage(j + 1);
            softmax(j - 1);
            finish();
            issue(j);
        }
        wg_wait<0>();
        wg_hold(s[0]);
        wg_hold(a.o);
        softmax(ntiles - 1);
        finish();
    }
    wg_hold(a.o);
    wg_fence();
    pv(ntiles - 1);
    wg_commit();
    wg_wait<0>();
    wg_hold(a.o);
    store_rows(a, out, ob, r0, w0, nr, H, h);
#endif
}
