/* Attention kernels over the bf16 KV cache: decode (up to GEMV_ROWS query
 * rows) split over the keys on the tensor cores, with the merge of its
 * splits; prefill on the tensor cores (flash-attention style, head_dim 64,
 * 128 and 256) and in float32 (SIMT, other head sizes). */
#pragma once

typedef __nv_bfloat16 bf16;

/* 2^x in one instruction (0 for -inf; subnormal results flush to 0, far
 * below what a probability summed in float32 can notice). */
__device__ __forceinline__ float fast_exp2(float x)
{
    float y;
    asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
    return y;
}

/* c += a . b on the tensor cores: a 16x16 bf16 (row), b 16x8 bf16 (col). */
__device__ __forceinline__ void mma_bf16(float *c, const unsigned *a, const unsigned *b)
{
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
                 "{%0,%1,%2,%3};"
                 : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}

/* 16 bytes from global to shared memory without passing through registers;
 * zeros (nothing read) when !in. */
__device__ __forceinline__ void cp_async16(void *dst, const void *src, bool in)
{
    unsigned s = (unsigned)__cvta_generic_to_shared(dst);
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;" ::"r"(s), "l"(src), "r"(in ? 16 : 0) : "memory");
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;" ::: "memory"); }
/* Waits until at most N of this thread's copy groups are in flight. */
template <int N> __device__ __forceinline__ void cp_async_wait()
{
    asm volatile("cp.async.wait_group %0;" ::"n"(N) : "memory");
}

/* Four 8x8 bf16 matrices from shared memory: lanes 8m..8m+7 give the row
 * addresses of matrix m; r[m] gets its row lane/4, columns 2(lane%4) and
 * +1 (with trans: of the transposed matrix). */
__device__ __forceinline__ void ldsm_x4(unsigned *r, const bf16 *p)
{
    unsigned s = (unsigned)__cvta_generic_to_shared(p);
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(s)
                 : "memory");
}
__device__ __forceinline__ void ldsm_x4_trans(unsigned *r, const bf16 *p)
{
    unsigned s = (unsigned)__cvta_generic_to_shared(p);
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(s)
                 : "memory");
}

/* One warp's online-softmax state for 16 query rows in mma fragment
 * layout: lane holds rows lane/4 and lane/4 + 8, output columns
 * 8j + 2(lane%4) and +1 of o[j]. */
template <int HD> struct attn_acc {
    float o[HD / 8][4];
    float m[2], l[2];
};

template <int HD> __device__ __forceinline__ void acc_init(attn_acc<HD> &a)
{
#pragma unroll
    for (int j = 0; j < HD / 8; j++)
        a.o[j][0] = a.o[j][1] = a.o[j][2] = a.o[j][3] = 0;
    a.m[0] = a.m[1] = -INFINITY;
    a.l[0] = a.l[1] = 0;
}

/* Whether every row of the warp (MT x 16 rows, lane rows' keys lo .. hi)
 * sees all the keys t0 .. t0 + NK - 1, as most tiles of a long causal
 * prefill do: then no key needs masking. */
template <int NK, int MT> __device__ __forceinline__ bool tile_whole(int t0, const int (*lo)[2], const int (*hi)[2])
{
    bool whole = true;
#pragma unroll
    for (int m = 0; m < MT; m++)
#pragma unroll
        for (int r = 0; r < 2; r++)
            whole = whole && lo[m][r] <= t0 && t0 + NK - 1 <= hi[m][r];
    return __all_sync(0xffffffffu, whole);
}

/* The online softmax of one tile of scores s (a warp's MT x 16 query rows
 * by NK keys t0, t0 + 1, ..., in mma accumulator layout), which become the
 * tile's probabilities P: scale, softcap, the mask (tile m's lane row r
 * sees keys lo[m][r] .. hi[m][r]; skipped when `whole`, tile_whole), and
 * a's running maximum and sum moved on; corr: the factor for its output
 * (rescale_o). Scores and the running maximum m are kept in base-2 units
 * (log2(e) folded into the scale), so each exponential is one ex2. */
template <int HD, int NK, int MT>
__device__ __forceinline__ void tile_softmax(attn_acc<HD> *a, float (&s)[MT][NK / 8][4], float (&corr)[MT][2], int t0,
                                             const int (*lo)[2], const int (*hi)[2], bool whole, float scale,
                                             float softcap)
{
    int tg = threadIdx.x & 3;
    const float L2E = 1.4426950408889634f;
    /* Scores u in units whose product with c is base 2: raw (c folds the
     * scale and log2 e, so each probability is one FFMA and one ex2) or,
     * with softcap, already capped in base 2 (c = 1). */
    float c = scale * L2E;
    if (softcap > 0) {
        float cap = softcap * L2E, inv_cap = 1.0f / cap;
#pragma unroll
        for (int m = 0; m < MT; m++)
#pragma unroll
            for (int n = 0; n < NK / 8; n++)
#pragma unroll
                for (int e = 0; e < 4; e++)
                    s[m][n][e] = cap * tanhf(s[m][n][e] * c * inv_cap);
        c = 1.0f;
    }
    if (!whole) /* only tiles some of whose keys a row does not see */
#pragma unroll
        for (int m = 0; m < MT; m++)
#pragma unroll
            for (int n = 0; n < NK / 8; n++)
#pragma unroll
                for (int e = 0; e < 4; e++) {
                    int r = e >> 1, t = t0 + n * 8 + tg * 2 + (e & 1);
                    if (t < lo[m][r] || t > hi[m][r])
                        s[m][n][e] = -INFINITY;
                }
#pragma unroll
    for (int m = 0; m < MT; m++) {
        float mx[2] = {-INFINITY, -INFINITY};
#pragma unroll
        for (int n = 0; n < NK / 8; n++)
#pragma unroll
            for (int e = 0; e < 4; e++)
                mx[e >> 1] = fmaxf(mx[e >> 1], s[m][n][e]);
        float mc[2];
#pragma unroll
        for (int r = 0; r < 2; r++) { /* the four lanes of a row hold its keys */
            mx[r] = fmaxf(mx[r], __shfl_xor_sync(0xffffffffu, mx[r], 1));
            mx[r] = fmaxf(mx[r], __shfl_xor_sync(0xffffffffu, mx[r], 2));
            float mn = fmaxf(a[m].m[r], mx[r] * c);
            corr[m][r] = mn == -INFINITY ? 1.0f : fast_exp2(a[m].m[r] - mn);
            a[m].m[r] = mn;
            a[m].l[r] *= corr[m][r];
            mc[r] = mn == -INFINITY ? 0.0f : mn; /* a row that sees nothing yet: every p = ex2(-inf) = 0 */
        }
#pragma unroll
        for (int n = 0; n < NK / 8; n++)
#pragma unroll
            for (int e = 0; e < 4; e++) {
                float p = fast_exp2(fmaf(s[m][n][e], c, -mc[e >> 1]));
                s[m][n][e] = p;
                a[m].l[e >> 1] += p;
            }
    }
}

/* The output rescaled to the running maximum tile_softmax moved to (o *=
 * corr); once every row's maximum holds still (most tiles after the first
 * few), nothing to do. */
template <int HD> __device__ __forceinline__ void rescale_o(attn_acc<HD> &a, const float (&corr)[2])
{
    if (__any_sync(0xffffffffu, corr[0] != 1.0f || corr[1] != 1.0f))
#pragma unroll
        for (int j = 0; j < HD / 8; j++) {
            a.o[j][0] *= corr[0];
            a.o[j][1] *= corr[0];
            a.o[j][2] *= corr[1];
            a.o[j][3] *= corr[1];
        }
}

/* The A fragment of P for 16 keys from the scores' accumulators of its
 * two key octets (the layouts of mma.sync and wgmma alike): rows g and
 * g + 8, keys 2(lane%4), +1, then the second octet's. */
__device__ __forceinline__ void p_frag(unsigned *pa, const float (&lo)[4], const float (&hi)[4])
{
    pa[0] = pack_bf16(lo[0], lo[1]);
    pa[1] = pack_bf16(lo[2], lo[3]);
    pa[2] = pack_bf16(hi[0], hi[1]);
    pa[3] = pack_bf16(hi[2], hi[3]);
}

/* One tile of NK keys (t0, t0 + 1, ...) for a warp's MT x 16 queries (a[m]:
 * rows 16m .. 16m + 15), all in shared memory as bf16 with a row pitch of
 * ld elements: Q [16 MT][hd], K and V [NK][hd]. S = Q.K^T on the tensor
 * cores (fragments by ldmatrix; each K and V fragment serves all MT row
 * tiles, so shared-memory reads per product fall with MT), the softmax
 * (tile_softmax), O += P.V (V's fragments by ldmatrix.trans). HD is the
 * compile-time maximum of hd, a multiple of 16. */
template <int HD, int NK, int MT>
__device__ __forceinline__ void attn_tile(attn_acc<HD> *a, const bf16 *Qs, const bf16 *Ks, const bf16 *Vs, int ld,
                                          int hd, int t0, const int (*lo)[2], const int (*hi)[2], float scale,
                                          float softcap)
{
    int lane = threadIdx.x & 31, lr = lane & 7, mi = lane >> 3;
    bool whole = tile_whole<NK, MT>(t0, lo, hi);
    float s[MT][NK / 8][4];
#pragma unroll
    for (int m = 0; m < MT; m++)
#pragma unroll
        for (int n = 0; n < NK / 8; n++)
            s[m][n][0] = s[m][n][1] = s[m][n][2] = s[m][n][3] = 0;
#pragma unroll
    for (int kk = 0; kk < HD / 16; kk++) {
        if (kk * 16 >= hd)
            break;
        /* Q's A fragments: matrices (rows 0-7 | 8-15) x (columns 0-7 | 8-15) */
        unsigned qa[MT][4];
#pragma unroll
        for (int m = 0; m < MT; m++)
            ldsm_x4(qa[m], Qs + (16 * m + lr + (mi & 1) * 8) * ld + kk * 16 + (mi >> 1) * 8);
#pragma unroll
        for (int n = 0; n < NK / 16; n++) {
            /* K rows are S's columns: b[0..1] for keys 16n..+7, b[2..3] for the next 8 */
            unsigned b[4];
            ldsm_x4(b, Ks + (16 * n + lr + (mi >> 1) * 8) * ld + kk * 16 + (mi & 1) * 8);
#pragma unroll
            for (int m = 0; m < MT; m++) {
                mma_bf16(s[m][2 * n], qa[m], b);
                mma_bf16(s[m][2 * n + 1], qa[m], b + 2);
            }
        }
    }
    float corr[MT][2];
    tile_softmax<HD, NK, MT>(a, s, corr, t0, lo, hi, whole, scale, softcap);
#pragma unroll
    for (int m = 0; m < MT; m++)
        rescale_o(a[m], corr[m]);
#pragma unroll
    for (int ks = 0; ks < NK / 16; ks++) {
        unsigned pa[MT][4];
#pragma unroll
        for (int m = 0; m < MT; m++)
            p_frag(pa[m], s[m][2 * ks], s[m][2 * ks + 1]);
#pragma unroll
        for (int d = 0; d < HD / 16; d++) {
            if (d * 16 >= hd)
                break;
            /* V [key][dim] is B row-major: transposed loads, (keys 0-7 | 8-15) x (dims 0-7 | 8-15) */
            unsigned b[4];
            ldsm_x4_trans(b, Vs + (16 * ks + lr + (mi & 1) * 8) * ld + d * 16 + (mi >> 1) * 8);
#pragma unroll
            for (int m = 0; m < MT; m++) {
                mma_bf16(a[m].o[2 * d], pa[m], b);
                mma_bf16(a[m].o[2 * d + 1], pa[m], b + 2);
            }
        }
    }
}

/* Four elements of a query row, float32 or bf16, as bf16 into shared
 * memory (zeros when !in). */
__device__ __forceinline__ void stage_q4(bf16 *dst, const float *src, bool in)
{
    float4 v = in ? *(const float4 *)src : make_float4(0, 0, 0, 0);
    *(uint2 *)dst = make_uint2(pack_bf16(v.x, v.y), pack_bf16(v.z, v.w));
}
__device__ __forceinline__ void stage_q4(bf16 *dst, const bf16 *src, bool in)
{
    *(uint2 *)dst = in ? *(const uint2 *)src : make_uint2(0, 0);
}

/* Shared-memory layouts of a tile of rows of bf16: the element offset of
 * (row r, column c). pitched: rows ld apart (padded for conflict-free
 * ldmatrix). swizzled: wgmma's canonical 128-byte-swizzled layout (for K-
 * and MN-major operands alike), [columns / 64][rows][64], 16-byte chunk j
 * of a 128-byte row r stored at chunk j ^ (r % 8), from a 1024-byte
 * aligned base. */
struct pitched {
    int ld;
    __device__ __forceinline__ int operator()(int r, int c) const { return r * ld + c; }
};
struct swizzled {
    int rows;
    __device__ __forceinline__ int operator()(int r, int c) const
    {
        return (c >> 6) * rows * 64 + r * 64 + ((((c >> 3) ^ r) & 7) << 3) + (c & 7);
    }
};

/* The K and V rows of keys t0 .. t0 + n - 1 of one head (kh, vh: its first
 * column in the cache; key t in slot t % slots) into Kd, Vd laid out by
 * `at`, by 16-byte asynchronous copies of `threads` threads from `tid`, one
 * commit group; keys past `last` become zeros, keys from `own` to `last`
 * are left alone (the caller writes them; own > last: none). Each thread
 * copies one 16-byte column of every step-th row, its slot advanced
 * without a division; threads past the last whole row of a step idle (hd /
 * 8 <= threads). */
template <typename At>
__device__ __forceinline__ void stage_kv(bf16 *Kd, bf16 *Vd, At at, const bf16 *kh, const bf16 *vh, size_t kvs,
                                         int slots, int hd, int t0, int n, int last, int own, int tid, int threads)
{
    int h8 = hd / 8, step = threads / h8, r = tid / h8, c = tid % h8 * 8;
    int slot = (t0 + r) % slots, sstep = step % slots;
    for (; r < n && tid < step * h8; r += step) {
        size_t off = (size_t)slot * kvs + c;
        if (t0 + r < own || t0 + r > last) {
            cp_async16(Kd + at(r, c), kh + off, t0 + r <= last);
            cp_async16(Vd + at(r, c), vh + off, t0 + r <= last);
        }
        slot += sstep;
        slot -= slot >= slots ? slots : 0;
    }
    cp_async_commit();
}

/* Decode ------------------------------------------------------------------ */

/* qk_prepare folded into decode attention (k NULL: not): the step's raw k
 * and v rows, the q and k norms, RoPE's inverse frequencies and the cache
 * to write the step's keys to. */
struct qk_fuse {
    const float *k, *v;
    const void *qn, *kn;
    int dt_q, dt_k, plus_one;
    const float *inv;
    float eps;
    bf16 *kc, *vc;
};

/* A decode block: DEC_WARPS warps, each taking DEC_KEYS-key chunks of the
 * keys in turn, double-buffered; the cache is cut into splits of at least
 * DEC_SPLIT_CHUNKS chunks a warp (2 rather than 1: fewer blocks and
 * partial results to merge, decode at depth 4096 4.5-5% faster on
 * Qwen3-8B and Qwen3-0.6B in q4, 4 no better; bench/RESULTS.md). Other
 * values build as variants to compare (bench/decode_variants.sh). 32-key
 * chunks were tried: they need more shared memory than a block may have. */
#ifndef LMX_DEC_SPLIT_CHUNKS
#define LMX_DEC_SPLIT_CHUNKS 2
#endif
enum { DEC_WARPS = 4, DEC_KEYS = 16, DEC_SPLIT_CHUNKS = LMX_DEC_SPLIT_CHUNKS };

/* Splits of the keys that hold a chunk: the blocks and the merge agree on
 * it, so empty splits are skipped by both. */
__device__ __forceinline__ int dec_active(int base, int n_rows, int window, int nsplit, int *lo)
{
    *lo = window > 0 && base - window + 1 > 0 ? base - window + 1 : 0;
    int chunks = (base + n_rows - 1 - *lo) / DEC_KEYS + 1;
    return min(nsplit, (chunks + DEC_WARPS - 1) / DEC_WARPS);
}

/* Shared memory of k_attn_dec: Q [16][ld], then per warp two buffers of K
 * and V [DEC_KEYS][ld] (ld = HD + 8: conflict-free ldmatrix rows); the
 * warps' merge reuses the buffers. */
size_t dec_shm(int HD) { return (size_t)(16 + DEC_WARPS * 4 * DEC_KEYS) * (HD + 8) * 2; }

/* Decode attention, GQA-aware: one block per (KV head, tile of 16 query
 * rows of its group, split of the keys). The tile's rows are the group's
 * H / KVH query heads times the n_rows rows (row f: query row f / G,
 * head kvh * G + f % G), so each K/V row is read once for all of them.
 * Chunk c of DEC_KEYS keys (counted from the first row's lowest key) goes
 * to split (c / DEC_WARPS) % nsplit, warp c % DEC_WARPS: the grid does not
 * depend on the position (graph replay) and every split gets an even share
 * at any depth, while splits without a chunk return at once. Each warp
 * streams its chunks with asynchronous copies, two in flight, and keeps an
 * online softmax on the tensor cores (attn_tile); the warps merge in
 * shared memory, then the block writes the output (when one split holds
 * every key; with oq.xq also quantized for a q8/q4 GEMV, by quant4) or its
 * (acc, m, l) for k_attn_merge. With f.k (qk_fuse) q is raw and each
 * query row is normalized and rotated as it is staged, and the warp whose
 * chunk holds a key of this step first writes that key and value to the
 * cache (blocks of other query tiles of the head write the same bytes).
 * STEP: one query row, hd == HD, qk_prepare folded in (fz.k) and no
 * softcap (a decode step), known to the compiler, which then leaves out
 * the checks and divisions by hd and G and the paths for the rest (less
 * code to fetch each layer: 1-11% faster decode with the q/k/v carveout,
 * bench/RESULTS.md session 31). */
template <int HD, bool STEP>
__global__ void __launch_bounds__(DEC_WARPS * 32)
    k_attn_dec(float *out, xquant oq, float *part, const float *q, const bf16 *kc, const bf16 *vc, int slots, int H,
               int KVH, int head_dim, int window, float scale, float softcap, const int *dpos, int pos0, int n_rows,
               qk_fuse fz)
{
    const int hd = STEP ? HD : head_dim;
    const bool fused = STEP || fz.k; /* qk_prepare folded in */
    if (STEP)
        n_rows = 1;
    constexpr int P = HD / 64;
    head_pairs<P> hq, hk;
    const int LD = HD + 8;
    extern __shared__ __align__(16) bf16 dsh[];
    bf16 *Qs = dsh;
    int G = H / KVH, nq = G * n_rows, qtiles = (nq + 15) / 16;
    int kvh = blockIdx.x / qtiles, f0 = blockIdx.x % qtiles * 16, s = blockIdx.y, nsplit = gridDim.y;
    auto qrow = [&](int f) { return STEP ? 0 : f / G; }; /* f < nq: query row f / G, head f % G */
    auto qindex = [&](int f) { return (size_t)qrow(f) * H + kvh * G + (STEP ? f : f % G); }; /* (row, head) */
    int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, tg = lane & 3;
    /* Before the wait, off the path from the q/k/v product: the position
     * (the host wrote dpos before the step's first kernel), RoPE's angles
     * at it (q and k share the frequencies) and, with fz.k, the first
     * chunk's keys of earlier steps (this step's keys are the kernel's to
     * write). */
    int base = dpos ? *dpos : pos0, last = base + n_rows - 1, lo;
    int active = dec_active(base, n_rows, window, nsplit, &lo);
    if (s >= active)
        return;
    int chunks = (last - lo) / DEC_KEYS + 1, stride = nsplit * DEC_WARPS;
    size_t kvs = (size_t)KVH * hd;
    const bf16 *kh = kc + (size_t)kvh * hd, *vh = vc + (size_t)kvh * hd;
    bf16 *Kw = Qs + 16 * LD + warp * 4 * DEC_KEYS * LD; /* buffer b: K at Kw + 2b DEC_KEYS ld, V after */
    int c = s * DEC_WARPS + warp;
    /* Chunk cn into the buffer at Kb (K, then V): the keys in the cache,
     * then (fz.k) the step's keys in it (at most two chunks hold any),
     * computed here, to the cache for later steps and straight into the
     * buffer, whose rows for them stage_kv leaves alone. */
    auto stage_cache = [&](int cn, bf16 *Kb) {
        stage_kv(Kb, Kb + DEC_KEYS * LD, pitched{LD}, kh, vh, kvs, slots, hd, lo + cn * DEC_KEYS, DEC_KEYS, last,
                 fused ? base : last + 1, lane, 32);
    };
    rope_angles<P> at_base = {};
    if (fused) {
        load_pairs(hq, fz.qn, fz.dt_q, fz.inv, hd, fz.plus_one, true);
        load_pairs(hk, fz.kn, fz.dt_k, fz.inv, hd, fz.plus_one, true);
        at_base = angles_at(hq, base);
        if (c < chunks)
            stage_cache(c, Kw);
    }
    pdl_trigger();
    pdl_wait();
    auto angles = [&](const head_pairs<P> &h, int pos) { /* at_base's at the step's position (STEP: its only one) */
        if (STEP || pos == base)
            return at_base;
        return angles_at(h, pos);
    };
    auto stage_step = [&](int cn, bf16 *Kb) {
        int t0 = lo + cn * DEC_KEYS;
        for (int t = max(base, t0); fused && t <= min(last, t0 + DEC_KEYS - 1); t++) {
            size_t at = (size_t)(t - base) * kvs + (size_t)kvh * hd, slot = (size_t)(t % slots) * kvs + kvh * hd;
            float k0[P], k1[P], v0[P], v1[P];
            load_head(k0, k1, fz.k + at, hd, true);
            load_head(v0, v1, fz.v + at, hd, true);
            norm_rotate(k0, k1, hk, hd, fz.eps, angles(hk, t));
            store_head(fz.kc + slot, k0, k1, hd);
            store_head(fz.vc + slot, v0, v1, hd);
            store_head(Kb + (t - t0) * LD, k0, k1, hd);
            store_head(Kb + (DEC_KEYS + t - t0) * LD, v0, v1, hd);
        }
    };
    /* With fz.k: the warp's rows of Q (row warp + DEC_WARPS i) loaded
     * first, so that their loads and those of the step's keys in the first
     * chunk are in flight together; then normalized and rotated, rows
     * past the group's zero */
    constexpr int QR = 16 / DEC_WARPS;
    float x0[QR][P], x1[QR][P];
#pragma unroll
    for (int i = 0; i < QR; i++) {
        int r = warp + DEC_WARPS * i, f = min(f0 + r, nq - 1);
        load_head(x0[i], x1[i], q + qindex(f) * hd, hd, fused && f0 + r < nq);
    }
    if (c < chunks) {
        if (!fused) /* the step's keys are in the cache: read after the wait */
            stage_cache(c, Kw);
        stage_step(c, Kw);
    }
    if (fused) {
#pragma unroll
        for (int i = 0; i < QR; i++) {
            int r = warp + DEC_WARPS * i;
            if (f0 + r < nq) /* warp-uniform */
                norm_rotate(x0[i], x1[i], hq, hd, fz.eps, angles(hq, base + qrow(f0 + r)));
            store_head(Qs + r * LD, x0[i], x1[i], hd);
        }
    } else {
        for (int i = threadIdx.x; i < 16 * hd / 4; i += blockDim.x) { /* Q, rows past the group's zero */
            int r = i / (hd / 4), col = i % (hd / 4) * 4, f = min(f0 + r, nq - 1);
            stage_q4(Qs + r * LD + col, q + qindex(f) * hd + col, f0 + r < nq);
        }
    }
    int lo_r[2], hi_r[2];
    for (int r = 0; r < 2; r++) {
        int f = f0 + g + 8 * r;
        hi_r[r] = f < nq ? base + qrow(f) : -1; /* rows past the group's see nothing */
        lo_r[r] = window > 0 && hi_r[r] - window + 1 > 0 ? hi_r[r] - window + 1 : 0;
    }
    __syncthreads(); /* Qs */
    attn_acc<HD> a;
    acc_init(a);
    for (int k = 0; c < chunks; c += stride, k++) {
        bf16 *Kb = Kw + (k & 1) * 2 * DEC_KEYS * LD;
        if (c + stride < chunks) {
            stage_cache(c + stride, Kw + ((k + 1) & 1) * 2 * DEC_KEYS * LD);
            stage_step(c + stride, Kw + ((k + 1) & 1) * 2 * DEC_KEYS * LD);
            cp_async_wait<1>();
        } else {
            cp_async_wait<0>();
        }
        __syncwarp(); /* the chunk's copies by every lane are visible */
        attn_tile<HD, DEC_KEYS, 1>(&a, Qs, Kb, Kb + DEC_KEYS * LD, LD, hd, lo + c * DEC_KEYS, &lo_r, &hi_r, scale,
                                   STEP ? 0.0f : softcap);
        __syncwarp(); /* before the buffer is refilled */
    }
    /* the warps' (o, m, l) to shared memory, [warp][row][hd + 2] */
    __syncthreads();
    float *ws = (float *)(Qs + 16 * LD);
    int ldw = hd + 2;
#pragma unroll
    for (int r = 0; r < 2; r++) {
        a.l[r] += __shfl_xor_sync(0xffffffffu, a.l[r], 1);
        a.l[r] += __shfl_xor_sync(0xffffffffu, a.l[r], 2);
        float *row = ws + (warp * 16 + g + 8 * r) * ldw;
        if (f0 + g + 8 * r >= nq) /* rows past the group's are never read */
            continue;
#pragma unroll
        for (int j = 0; j < HD / 8; j++)
            if (j * 8 < hd)
                *(float2 *)(row + j * 8 + tg * 2) = make_float2(a.o[j][2 * r], a.o[j][2 * r + 1]);
        if (tg == 0) {
            row[hd] = a.m[r];
            row[hd + 1] = a.l[r];
        }
    }
    __syncthreads();
    /* four dimensions of a row a thread (a warp covers whole quantization
     * groups); rows past the group's are left out, but when quantizing a
     * warp that holds a row of it goes on whole: its other rows compute
     * nothing but take part in quant4's shuffles */
    int items = min(16, nq - f0) * (hd / 4);
    if (oq.xq)
        items = (items + 31) / 32 * 32;
    for (int i = threadIdx.x; i < items; i += blockDim.x) {
        int r = i / (hd / 4), d = i % (hd / 4) * 4, f = f0 + r;
        bool valid = f < nq;
        float M = -INFINITY, L = 1, A[4] = {0, 0, 0, 0};
        if (valid) {
            L = 0;
            for (int w = 0; w < DEC_WARPS; w++)
                M = fmaxf(M, ws[(w * 16 + r) * ldw + hd]);
            for (int w = 0; w < DEC_WARPS; w++) {
                const float *row = ws + (w * 16 + r) * ldw;
                float wt = row[hd] == -INFINITY ? 0.0f : exp2f(row[hd] - M);
                L += wt * row[hd + 1];
#pragma unroll
                for (int j = 0; j < 4; j++)
                    A[j] += wt * row[d + j];
            }
        }
        size_t qi = valid ? qindex(f) : 0;
        if (active == 1) { /* no merge needed */
            float il = 1.0f / L;
            float4 o = make_float4(A[0] * il, A[1] * il, A[2] * il, A[3] * il);
            if (valid)
                *(float4 *)(out + qi * hd + d) = o;
            if (oq.xq)
                quant4(oq, o, (int)(qi / H), (int)(qi % H) * hd + d, H * hd, valid);
            continue;
        }
        /* a split that saw no key of this row: M = -inf, L = A = 0 */
        if (valid) {
            *(float4 *)(part + (qi * nsplit + s) * hd + d) = make_float4(A[0], A[1], A[2], A[3]);
            if (d == 0)
                ((float2 *)(part + (size_t)n_rows * H * nsplit * hd))[qi * nsplit + s] = make_float2(M, L);
        }
    }
}

/* Merges the active splits of k_attn_dec: one block of MERGE_THREADS per
 * (head, query row). The splits' (m, l) pairs give their weights; then
 * each thread sums four dimensions over every few splits (all its loads
 * in flight together) and the block adds those partial sums (oq.xq: the
 * output quantized too). part holds every split's output
 * [row][head][split][hd], then their (m, l) pairs. */
enum { MERGE_THREADS = 256 };
size_t merge_shm(int nsplit) { return (nsplit + 32 + MERGE_THREADS * 4) * sizeof(float); }

__global__ void __launch_bounds__(MERGE_THREADS) k_attn_merge(float *out, xquant oq, const float *part, int H,
                                                               int hd, int nsplit, int window, const int *dpos,
                                                               int pos0, int n_rows)
{
    /* the position before the wait, as in k_attn_dec */
    int lo, ns = dec_active(dpos ? *dpos : pos0, n_rows, window, nsplit, &lo);
    pdl_trigger();
    pdl_wait(); /* even with nothing to merge: the kernel after waits on this one */
    if (ns == 1) /* k_attn_dec wrote the output */
        return;
    extern __shared__ __align__(16) float msh[];
    float *sums = msh, *red = sums + 4 * MERGE_THREADS, *wt = red + 32;
    size_t qi = (size_t)blockIdx.y * H + blockIdx.x;
    const float4 *acc = (const float4 *)(part + qi * nsplit * hd);
    const float2 *ml = (const float2 *)(part + (size_t)n_rows * H * nsplit * hd) + qi * nsplit;
    float M = -INFINITY;
    for (int s = threadIdx.x; s < ns; s += blockDim.x)
        M = fmaxf(M, __ldg(&ml[s].x));
    M = block_reduce<true>(M, red);
    float L = 0;
    for (int s = threadIdx.x; s < ns; s += blockDim.x) {
        float2 p = __ldg(&ml[s]);
        float w = p.x == -INFINITY ? 0.0f : exp2f(p.x - M); /* m in base-2 units */
        wt[s] = w;
        L += w * p.y;
    }
    L = block_sum(L, red); /* its barriers publish wt too */
    int c4 = hd / 4, col = threadIdx.x % c4, g = threadIdx.x / c4, groups = blockDim.x / c4;
    float4 a = make_float4(0, 0, 0, 0);
    if (g < groups) {
#pragma unroll 4
        for (int s = g; s < ns; s += groups) {
            float4 v = __ldg(acc + (size_t)s * c4 + col);
            float w = wt[s];
            a.x += w * v.x;
            a.y += w * v.y;
            a.z += w * v.z;
            a.w += w * v.w;
        }
        ((float4 *)sums)[threadIdx.x] = a;
    }
    __syncthreads();
    if (g == 0) {
        for (int k = 1; k < groups; k++) {
            float4 v = ((const float4 *)sums)[k * c4 + col];
            a.x += v.x;
            a.y += v.y;
            a.z += v.z;
            a.w += v.w;
        }
        float inv = 1.0f / L;
        a = make_float4(a.x * inv, a.y * inv, a.z * inv, a.w * inv);
        ((float4 *)(out + qi * hd))[col] = a;
    }
    if (oq.xq && threadIdx.x < (c4 + 31) / 32 * 32) /* whole warps: quant4 shuffles */
        quant4(oq, a, blockIdx.y, blockIdx.x * hd + col * 4, H * hd, g == 0);
}

/* Prefill, tensor cores ----------------------------------------------------- */


/* Flash-attention block shape by head size: 4 warps of MT x 16 queries
 * and K-key tiles, two blocks a multiprocessor. Up to head_dim 128 each
 * warp takes 32 queries and 64-key tiles (255 registers, no spills; 8
 * warps of 16 queries, capped at 128 registers, prefilled 4096 tokens
 * 1.5% (Qwen3-8B) and 3% (Qwen3-0.6B) slower, bench/RESULTS.md); at 256,
 * where a lane's share of 16 output rows alone takes 128 registers, 16
 * queries and 32-key tiles. */
template <int HD> struct fa_shape {
    enum { WARPS = 4, MT = HD > 128 ? 1 : 2, Q = 16 * MT * WARPS, K = HD > 128 ? 32 : 64 };
};

/* Shared memory of k_attn_fa: Q [Q][HD + 8], then two stages of K and V
 * [K][HD + 8], bf16 (padding: conflict-free ldmatrix rows). */
template <int HD> size_t fa_shm() { return (size_t)(fa_shape<HD>::Q + 4 * fa_shape<HD>::K) * (HD + 8) * 2; }

/* The keys the lane's two rows of a warp's 16 query rows (the first at
 * position p0) see: lo[r] .. hi[r], causal and within the window. */
__device__ __forceinline__ void row_keys(int p0, int window, int (&lo)[2], int (&hi)[2])
{
    int g = (threadIdx.x & 31) >> 2;
    for (int r = 0; r < 2; r++) {
        hi[r] = p0 + g + 8 * r;
        lo[r] = window > 0 && hi[r] - window + 1 > 0 ? hi[r] - window + 1 : 0;
    }
}

/* A warp's 16 finished query rows (block rows w0 .. w0 + 15 of r0's
 * block, head h) divided by their sums, to out (float32) and/or ob (bf16);
 * rows from nr on are not written. */
template <int HD>
__device__ __forceinline__ void store_rows(const attn_acc<HD> &a, float *out, bf16 *ob, int r0, int w0, int nr, int H,
                                           int h)
{
    int lane = threadIdx.x & 31, g = lane >> 2, tg = lane & 3;
#pragma unroll
    for (int r = 0; r < 2; r++) {
        float l = a.l[r];
        l += __shfl_xor_sync(0xffffffffu, l, 1);
        l += __shfl_xor_sync(0xffffffffu, l, 2);
        l = 1.0f / l;
        int row = w0 + g + 8 * r;
        if (row >= nr)
            continue;
        size_t at = ((size_t)(r0 + row) * H + h) * HD + tg * 2;
#pragma unroll
        for (int d = 0; d < HD / 8; d++) {
            float2 v = make_float2(a.o[d][2 * r] * l, a.o[d][2 * r + 1] * l);
            if (out)
                *(float2 *)(out + at + d * 8) = v;
            if (ob)
                *(unsigned *)(ob + at + d * 8) = pack_bf16(v.x, v.y);
        }
    }
}

/* Prefill attention on the tensor cores (flash-attention style): one block
 * per (head, fa_shape::Q queries), longest blocks first; each warp MT x 16
 * queries. K/V tiles stream into shared memory by asynchronous copies, the
 * next tile in flight while the current one is computed (attn_tile: Q, K,
 * P, V in bf16, float32 accumulation). Warps whose queries see none of a
 * tile's keys (causal, window) skip it. q float32 or bf16 (QT); the output
 * in float32 (out) and/or bf16 (ob). */
template <int HD, typename QT>
__global__ void __launch_bounds__(fa_shape<HD>::WARPS * 32, 2)
    k_attn_fa(float *out, bf16 *ob, const QT *q, const bf16 *kc, const bf16 *vc, int slots, int H, int KVH,
              int window, float scale, float softcap, const int *dpos, int pos0, int n_rows)
{
    pdl_trigger();
    pdl_wait();
    constexpr int LD = HD + 8, FA_Q = fa_shape<HD>::Q, FA_K = fa_shape<HD>::K, MT = fa_shape<HD>::MT;
    extern __shared__ __align__(16) bf16 fsh[];
    bf16 *Qs = fsh, *KV = Qs + FA_Q * LD; /* stage b: K at KV + 2b FA_K LD, V after */
    int h = blockIdx.x, r0 = (gridDim.y - 1 - blockIdx.y) * FA_Q, nr = min(FA_Q, n_rows - r0);
    int w0 = (threadIdx.x >> 5) * 16 * MT;
    int base = (dpos ? *dpos : pos0) + r0, last = base + nr - 1;
    int lo = window > 0 && base - window + 1 > 0 ? base - window + 1 : 0;
    int kvh = h / (H / KVH), ntiles = (last - lo) / FA_K + 1;
    size_t kvs = (size_t)KVH * HD;
    const bf16 *kh = kc + (size_t)kvh * HD, *vh = vc + (size_t)kvh * HD;
    stage_kv(KV, KV + FA_K * LD, pitched{LD}, kh, vh, kvs, slots, HD, lo, FA_K, last, last + 1, threadIdx.x,
             blockDim.x);
    for (int i = threadIdx.x; i < FA_Q * HD / 4; i += blockDim.x) { /* Q, rows past n_rows zero */
        int r = i / (HD / 4), c = i % (HD / 4) * 4;
        stage_q4(Qs + r * LD + c, q + ((size_t)(r0 + min(r, nr - 1)) * H + h) * HD + c, r < nr);
    }
    attn_acc<HD> a[MT];
    int lo_r[MT][2], hi_r[MT][2];
#pragma unroll
    for (int m = 0; m < MT; m++) {
        acc_init(a[m]);
        row_keys(base + w0 + 16 * m, window, lo_r[m], hi_r[m]);
    }
    int wfirst = base + w0, wlast = min(wfirst + 16 * MT - 1, last);
    int wlo = window > 0 && wfirst - window + 1 > 0 ? wfirst - window + 1 : 0;
    for (int j = 0; j < ntiles; j++) {
        if (j + 1 < ntiles) {
            bf16 *Kn = KV + ((j + 1) & 1) * 2 * FA_K * LD;
            stage_kv(Kn, Kn + FA_K * LD, pitched{LD}, kh, vh, kvs, slots, HD, lo + (j + 1) * FA_K, FA_K, last,
                     last + 1, threadIdx.x, blockDim.x);
            cp_async_wait<1>();
        } else {
            cp_async_wait<0>();
        }
        __syncthreads(); /* tile j (and Qs) visible to every warp */
        int t0 = lo + j * FA_K;
        const bf16 *Kb = KV + (j & 1) * 2 * FA_K * LD;
        if (w0 < nr && t0 <= wlast && t0 + FA_K - 1 >= wlo)
            attn_tile<HD, FA_K, MT>(a, Qs + w0 * LD, Kb, Kb + FA_K * LD, LD, HD, t0, lo_r, hi_r, scale, softcap);
        __syncthreads(); /* tile j consumed before its stage is refilled */
    }
#pragma unroll
    for (int m = 0; m < MT; m++)
        store_rows(a[m], out, ob, r0, w0 + 16 * m, nr, H, h);
}

/* Prefill, SIMT ----------------------------------------------------------- */

enum { PF_ROWS = 32, PF_KEYS = 32, PF_WARPS = 4 };

/* Shared memory of k_attn_prefill: queries, then keys and values of one
 * tile in float32, rows padded by 4 floats (16-byte accesses, no bank
 * conflicts). */
size_t prefill_shm(int hd) { return (size_t)(PF_ROWS + 2 * PF_KEYS) * (hd + 4) * sizeof(float); }

/* Eight bf16 (one 16-byte load) to float32 at dst (16-byte aligned). */
__device__ __forceinline__ void bf16x8_store(float *dst, uint4 v)
{
    const __nv_bfloat162 *p = (const __nv_bfloat162 *)&v;
    float2 a = __bfloat1622float2(p[0]), b = __bfloat1622float2(p[1]), c = __bfloat1622float2(p[2]),
           d = __bfloat1622float2(p[3]);
    *(float4 *)dst = make_float4(a.x, a.y, b.x, b.y);
    *(float4 *)(dst + 4) = make_float4(c.x, c.y, d.x, d.y);
}

/* Causal attention for many query rows in float32 (head sizes without a
 * tensor-core kernel, or LMX_CUDA_ATTN=simt): one block per (head,
 * PF_ROWS queries), keys in PF_KEYS-long tiles staged in shared memory
 * and shared by every query of the block; each warp owns PF_ROWS /
 * PF_WARPS queries, each lane scores one key of the tile, then an
 * online-softmax update of the lane's D dimensions. hd % 8 == 0. */
template <int D>
__global__ void __launch_bounds__(PF_WARPS * 32)
    k_attn_prefill(float *out, const float *q, const bf16 *kc, const bf16 *vc, int slots, int H, int KVH, int hd,
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
        /* 16-byte loads of 8 bf16, two of K and two of V in flight per thread */
        int n8 = PF_KEYS * hd / 8, h8 = hd / 8;
        for (int i0 = threadIdx.x; i0 < n8; i0 += 2 * blockDim.x) {
            uint4 kv[2], vv[2];
#pragma unroll
            for (int u = 0; u < 2; u++) {
                int i = i0 + u * blockDim.x, j = i / h8, t = t0 + j;
                uint4 z = make_uint4(0, 0, 0, 0);
                size_t off = ((size_t)(t % slots) * kvs + (size_t)kvh * hd) / 8 + i % h8;
                bool in = i < n8 && t <= last;
                kv[u] = in ? ((const uint4 *)kc)[off] : z;
                vv[u] = in ? ((const uint4 *)vc)[off] : z;
            }
#pragma unroll
            for (int u = 0; u < 2; u++) {
                int i = i0 + u * blockDim.x, j = i / h8;
                if (i < n8) {
                    bf16x8_store(Ks + j * ld + 8 * (i % h8), kv[u]);
                    bf16x8_store(Vs + j * ld + 8 * (i % h8), vv[u]);
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
