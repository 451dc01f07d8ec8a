/* Every SIMD path the CPU can run, checked two ways: its kernels against
 * the scalar reference on random data (every weight kind, decode and
 * prefill shapes, odd sizes), and the full fixture test (logits against
 * transformers, same tolerances) re-run with LMX_CPU_PATH forcing the path.
 * (The default path's fixture run is test_model_fixtures itself.) Paths
 * this CPU or build lacks are reported as skipped, with the reason. */
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cpu_attention.h"
#include "cpu_kernels.h"
#include "cpu_matmul.h"
#include "dtype.h"
#include "lmx.h"
#include "quant.h"
#include "testutil.h"

static uint64_t rng = 88172645463325252ull;
static float frand(void)
{
    rng ^= rng << 13;
    rng ^= rng >> 7;
    rng ^= rng << 17;
    return (float)(rng >> 40) * (1.0f / 16777216.0f) * 2.0f - 1.0f;
}

/* A random N x K weight of the given kind; buffers are malloc'd into *keep. */
static lmx_cpu_weight make_weight(lmx_wkind kind, int N, int K, void **keep)
{
    size_t n = (size_t)N * K;
    float *f = malloc(n * sizeof *f);
    for (size_t i = 0; i < n; i++)
        f[i] = frand() * 0.5f;
    lmx_cpu_weight w = {LMX_WK_F32, N, K, f, NULL, NULL, 0};
    if (kind == LMX_WK_F32) {
        *keep = f;
        return w;
    }
    if (kind == LMX_WK_BF16 || kind == LMX_WK_F16) {
        uint16_t *h = malloc(n * sizeof *h);
        for (size_t i = 0; i < n; i++)
            h[i] = kind == LMX_WK_BF16 ? lmx_f32_to_bf16(f[i]) : lmx_f32_to_f16(f[i]);
        free(f);
        *keep = h;
        return (lmx_cpu_weight){kind, N, K, h, NULL, NULL, 0};
    }
    int bits = kind == LMX_WK_Q8 ? 8 : 4, G = lmx_quant_group(K);
    size_t qb = (size_t)N * lmx_quant_row_bytes(K, bits), ng = n / (size_t)G;
    uint8_t *buf = malloc(qb + 2 * ng * sizeof(uint16_t));
    lmx_cpu_weight q = {kind, N, K, buf, (uint16_t *)(buf + qb), (uint16_t *)(buf + qb) + ng, G};
    lmx_quant_rows(&w, &q, 0, N);
    free(f);
    *keep = buf;
    return q;
}

static const char *const kind_names[] = {"f32", "f16", "bf16", "q8", "q4"};

/* src quantized by qr into one malloc'd buffer of *bytes (data, scales, biases). */
static uint8_t *quant_bytes(void (*qr)(const lmx_cpu_weight *, const lmx_cpu_weight *, int, int),
                            const lmx_cpu_weight *src, lmx_wkind kind, size_t *bytes)
{
    int N = src->rows, K = src->cols, G = lmx_quant_group(K);
    size_t qb = (size_t)N * lmx_quant_row_bytes(K, kind == LMX_WK_Q8 ? 8 : 4), ng = (size_t)N * (K / G);
    *bytes = qb + 2 * ng * sizeof(uint16_t);
    uint8_t *buf = calloc(1, *bytes);
    lmx_cpu_weight q = {kind, N, K, buf, (uint16_t *)(buf + qb), (uint16_t *)(buf + qb) + ng, G};
    qr(src, &q, 0, N);
    return buf;
}

/* The path's on-load quantizer gives the portable one's bytes. */
static void check_quant(const lmx_cpu_kernels *k)
{
    const int Ks[] = {64, 96, 1024};
    for (int src_kind = LMX_WK_F32; src_kind <= LMX_WK_BF16; src_kind++)
        for (int kind = LMX_WK_Q8; kind <= LMX_WK_Q4; kind++)
            for (int ki = 0; ki < 3; ki++) {
                void *keep;
                lmx_cpu_weight src = make_weight((lmx_wkind)src_kind, 37, Ks[ki], &keep);
                size_t n1, n2;
                uint8_t *a = quant_bytes(k->quant_rows, &src, (lmx_wkind)kind, &n1);
                uint8_t *b = quant_bytes(lmx_quant_rows, &src, (lmx_wkind)kind, &n2);
                CHECK(!memcmp(a, b, n1), "%s quantize %s to %s, K %d", lmx_cpu_path_name(k->path),
                      kind_names[src_kind], kind_names[kind], Ks[ki]);
                free(a), free(b), free(keep);
            }
}

/* The path's attention kernels over a float16 cache against the scalar
 * float32 ones on the same values widened: both sum in float32, so they
 * differ by rounding only, relative to the largest result. */
static void check_attn_f16(const lmx_cpu_kernels *k, const lmx_cpu_kernels *ref)
{
    enum { NB = 37, STRIDE = 512 + 16 };
    static uint16_t kvh[NB * STRIDE];
    static float kvf[NB * STRIDE], q[256], pr[NB], s1[NB], s2[NB], acc1[256], acc2[256];
    for (int i = 0; i < NB * STRIDE; i++)
        kvh[i] = lmx_f32_to_f16(frand() * 4), kvf[i] = lmx_f16_to_f32(kvh[i]);
    for (int i = 0; i < 256; i++)
        q[i] = frand();
    for (int b = 0; b < NB; b++)
        pr[b] = fabsf(frand());
    const int hds[] = {64, 72, 128, 256}; /* 72: vector tails */
    for (int h = 0; h < 4; h++) {
        int hd = hds[h];
        for (int i = 0; i < hd; i++)
            acc1[i] = acc2[i] = frand();
        k->attn_scores_f16(q, kvh, STRIDE, NB, hd, s1);
        ref->attn_scores(q, kvf, STRIDE, NB, hd, s2);
        k->attn_accum_f16(acc1, kvh, STRIDE, pr, NB, hd);
        ref->attn_accum(acc2, kvf, STRIDE, pr, NB, hd);
        float ws = 0, wa = 0, ms = test_max_abs(s2, NB), ma = test_max_abs(acc2, (size_t)hd);
        for (int b = 0; b < NB; b++)
            ws = fmaxf(ws, fabsf(s1[b] - s2[b]) / ms);
        for (int i = 0; i < hd; i++)
            wa = fmaxf(wa, fabsf(acc1[i] - acc2[i]) / ma);
        CHECK(ws < 1e-5f && wa < 1e-5f, "%s f16 attention hd %d: relative scores %g, accum %g",
              lmx_cpu_path_name(k->path), hd, ws, wa);
    }
}

/* The scalar matvec, 4 rows a call: for q8/q4 weights x is rounded to 8
 * bits per weight group, as the integer GEMM tile (qgemm) rounds it; for
 * float weights a reference that shares nothing with the tile driver. */
static void ref_matvec(lmx_cpu_mm *mr, float *out, const float *x, int n, const lmx_cpu_weight *w)
{
    for (int i = 0; i < n; i += 4)
        lmx_cpu_mm_run(mr, out + (size_t)i * w->rows, x + (size_t)i * w->cols, n - i < 4 ? n - i : 4, w);
}

/* The path's matmul against the scalar one, and its decode and vector ops. */
static void check_kernels(const lmx_cpu_kernels *k, const lmx_cpu_kernels *ref, lmx_pool *pool)
{
    lmx_cpu_mm *mm = lmx_cpu_mm_new(k, pool, 0), *mr = lmx_cpu_mm_new(ref, pool, 0);
    /* N = 64 and K a multiple of 32 take the AMX tiles on that path; K =
     * 192 leaves q4's AVX-512 matvec an odd group after its pairs; K = 96
     * is three groups of 32 (the rest have groups of 64). N = 37 and n = 5,
     * 17, 40 leave the qgemm tile (32 rows by 6 rows of x) ragged ends; N =
     * 200 is several blocks of float tiles and a short last one; K = 2112
     * makes those blocks shorter than 64 rows. */
    const int Ks[] = {64, 96, 192, 200, 1024, 2112}, Ns[] = {37, 64, 200}, ns[] = {1, 2, 3, 4, 5, 6, 17, 40};
    const int n_Ns = sizeof Ns / sizeof *Ns;
    CHECK(mm && mr && !lmx_cpu_mm_reserve(mm, 2112) && !lmx_cpu_mm_reserve(mr, 2112), "scratch");
    for (int kind = LMX_WK_F32; kind <= LMX_WK_Q4; kind++)
        for (size_t ki = 0; ki < sizeof Ks / sizeof *Ks * n_Ns; ki++) {
            int K = Ks[ki / n_Ns], N = Ns[ki % n_Ns];
            if (kind >= LMX_WK_Q8 && !lmx_quant_group(K))
                continue;
            void *keep;
            lmx_cpu_weight w = make_weight((lmx_wkind)kind, N, K, &keep);
            float *x = malloc((size_t)40 * K * sizeof *x), *a = malloc((size_t)40 * N * sizeof *a),
                  *b = malloc((size_t)40 * N * sizeof *b), *row = malloc((size_t)K * sizeof *row),
                  *rrow = malloc((size_t)K * sizeof *rrow);
            for (int i = 0; i < 40 * K; i++)
                x[i] = frand();
            /* q8/q4 prefill on the AMX tiles keeps x in float32 where every
             * other path rounds it to 8 bits, and rounds q4 weights to bf16
             * (docs/quantization.md): its reference is the scalar product on
             * the decoded weights (q8) or those rounded to bf16 (q4) */
            int amx_q = k->amx_gemm && kind >= LMX_WK_Q8 && N % 32 == 0 && K % 32 == 0;
            float *wd = amx_q ? malloc((size_t)N * K * sizeof *wd) : NULL;
            for (int r = 0; wd && r < N; r++) {
                ref->decode(&w, r, wd + (size_t)r * K);
                for (int c = 0; c < K && kind == LMX_WK_Q4; c++)
                    wd[(size_t)r * K + c] = lmx_bf16_to_f32(lmx_f32_to_bf16(wd[(size_t)r * K + c]));
            }
            lmx_cpu_weight wr = {LMX_WK_F32, N, K, wd, NULL, NULL, 0};
            /* qgemm rounds x to 8 bits for q4 as the matvec does: the same
             * integer dot products, so only float32 rounding differs. For q8
             * it keeps ~15 bits of x: against float32 x, x's rounding (at
             * most 1/256 of a step of 1/127) adds ~1e-4 at K = 1024 */
            int qgemm = k->qgemm && kind == LMX_WK_Q4, by_matvec = qgemm || kind < LMX_WK_Q8;
            for (size_t ni = 0; ni < sizeof ns / sizeof *ns; ni++) {
                int n = ns[ni];
                lmx_cpu_mm_run(mm, a, x, n, &w);
                if (by_matvec)
                    ref_matvec(mr, b, x, n, &w);
                else
                    lmx_cpu_mm_run(mr, b, x, n, amx_q && n > 4 ? &wr : &w);
                float worst = 0;
                for (int i = 0; i < n * N; i++)
                    worst = fmaxf(worst, fabsf(a[i] - b[i]));
                /* |w| <= 0.5, |x| <= 1: sums of K terms, float32 rounding;
                 * qgemm's differ only in the order of the K / G group terms
                 * (seen: <= 1e-6), far inside 1e-6 * K, while x in float32
                 * would be off by ~x's rounding (0.02-0.08 here; q8 with
                 * x rounded to 8 bits too) */
                float bound = (qgemm ? 1e-6f : 1e-5f) * K;
                CHECK(worst <= bound, "%s matmul %s K %d n %d: max diff %g", lmx_cpu_path_name(k->path),
                      kind_names[kind], K, n, worst);
            }
            k->decode(&w, N - 1, row);
            ref->decode(&w, N - 1, rrow);
            CHECK(!memcmp(row, rrow, (size_t)K * sizeof *row), "%s decode %s K %d",
                  lmx_cpu_path_name(k->path), kind_names[kind], K);
            free(x), free(a), free(b), free(row), free(rrow), free(keep), free(wd);
        }
    float u[77], v[77], y[77], z[77];
    for (int i = 0; i < 77; i++)
        u[i] = frand(), v[i] = frand(), y[i] = z[i] = frand();
    CHECK(fabsf(k->dot(u, v, 77) - ref->dot(u, v, 77)) < 1e-5f, "%s dot", lmx_cpu_path_name(k->path));
    k->axpy(y, 0.3f, u, 77);
    ref->axpy(z, 0.3f, u, 77);
    k->scale(y, 1.7f, 77);
    ref->scale(z, 1.7f, 77);
    float worst = 0;
    for (int i = 0; i < 77; i++)
        worst = fmaxf(worst, fabsf(y[i] - z[i]));
    CHECK(worst < 1e-6f, "%s axpy/scale: %g", lmx_cpu_path_name(k->path), worst);
    /* the gated activations against libm's, over the range where they bend */
    for (int gelu = 0; gelu < 2; gelu++) {
        enum { NA = 301 };
        static float g[NA], up[NA];
        float wa = 0;
        for (int i = 0; i < NA; i++)
            g[i] = (float)(i - NA / 2) / 10.0f, up[i] = frand();
        k->gated_act(g, up, NA, gelu);
        for (int i = 0; i < NA; i++) {
            float x = (float)(i - NA / 2) / 10.0f;
            float a = gelu ? 0.5f * x * (1.0f + tanhf(0.7978845608028654f * (x + 0.044715f * x * x * x)))
                           : x / (1.0f + expf(-x));
            wa = fmaxf(wa, fabsf(g[i] - a * up[i]) / (fabsf(x) + 1e-3f));
        }
        CHECK(wa < 1e-6f, "%s %s: relative error %g", lmx_cpu_path_name(k->path), gelu ? "gelu" : "silu", wa);
    }
    /* attention blocks, for the head sizes with register-resident kernels */
    enum { NB = 37, STRIDE = 512 + 16 };
    static float q[256], kv[NB * STRIDE], pr[NB], s1[NB], s2[NB], acc1[256], acc2[256];
    for (int i = 0; i < NB * STRIDE; i++)
        kv[i] = frand();
    for (int i = 0; i < 256; i++)
        q[i] = frand(), acc1[i] = acc2[i] = frand();
    for (int b = 0; b < NB; b++)
        pr[b] = fabsf(frand());
    const int hds[] = {64, 128, 256};
    for (int h = 0; h < 3; h++) {
        int hd = hds[h];
        k->attn_scores(q, kv, STRIDE, NB, hd, s1);
        ref->attn_scores(q, kv, STRIDE, NB, hd, s2);
        k->attn_accum(acc1, kv, STRIDE, pr, NB, hd);
        ref->attn_accum(acc2, kv, STRIDE, pr, NB, hd);
        float ws = 0, wa = 0;
        for (int b = 0; b < NB; b++)
            ws = fmaxf(ws, fabsf(s1[b] - s2[b]));
        for (int i = 0; i < hd; i++)
            wa = fmaxf(wa, fabsf(acc1[i] - acc2[i]));
        CHECK(ws < 1e-4f && wa < 1e-4f, "%s attention hd %d: scores %g, accum %g", lmx_cpu_path_name(k->path),
              hd, ws, wa);
    }
    lmx_cpu_mm_free(mm);
    lmx_cpu_mm_free(mr);
}

/* The bf16 tile (lmx_load_options.prefill_bf16) against the scalar matvec
 * on x rounded to bf16 beforehand: products of bf16 values are exact in
 * float32, so only the float32 rounding of the sums differs (relative to
 * the largest result, ~1e-6), whether the tile gets x rounded already or
 * rounds it itself; x left unrounded, or a misplaced pair of k, would be
 * off by ~1e-3. Odd K and K not a multiple of 32 take the padding; N = 37
 * and n = 5, 13, 40 leave ragged tiles and panels, N = 200 several blocks.
 * Weights of other kinds keep float32 x: the same bits as without. */
static void check_bf16_tile(const lmx_cpu_kernels *k, const lmx_cpu_kernels *ref, lmx_pool *pool)
{
    const char *why = NULL, *name = lmx_cpu_path_name(k->path);
    if (!k->bf16_tile)
        return;
    if (!lmx_cpu_avx512_bf16(&why)) {
        printf("SKIPPED path %s, bf16 tile: %s\n", name, why);
        return;
    }
    lmx_cpu_mm *mm = lmx_cpu_mm_new(k, pool, 1), *mf = lmx_cpu_mm_new(k, pool, 0), *mr = lmx_cpu_mm_new(ref, pool, 0);
    CHECK(mm && mf && mr && !lmx_cpu_mm_reserve(mm, 2112) && !lmx_cpu_mm_reserve(mf, 2112) &&
              !lmx_cpu_mm_reserve(mr, 2112) && lmx_cpu_mm_bf16_x(mm) && !lmx_cpu_mm_bf16_x(mf),
          "%s bf16 scratch", name);
    const int Ks[] = {16, 37, 64, 200, 1024, 2112}, Ns[] = {37, 64, 200}, ns[] = {5, 12, 13, 40};
    float worst = 0;
    for (int ki = 0; ki < 6; ki++)
        for (int ni = 0; ni < 3; ni++) {
            int K = Ks[ki], N = Ns[ni];
            void *keep;
            lmx_cpu_weight w = make_weight(LMX_WK_BF16, N, K, &keep);
            float *x = malloc((size_t)40 * K * sizeof *x), *xr = malloc((size_t)40 * K * sizeof *xr),
                  *a = malloc((size_t)40 * N * sizeof *a), *b = malloc((size_t)40 * N * sizeof *b);
            for (int i = 0; i < 40 * K; i++)
                x[i] = frand(), xr[i] = lmx_bf16_to_f32(lmx_f32_to_bf16(x[i]));
            for (int pre = 0; pre < 2; pre++)
                for (int j = 0; j < 4; j++) {
                    int n = ns[j];
                    lmx_cpu_mm_run(mm, a, pre ? xr : x, n, &w);
                    ref_matvec(mr, b, xr, n, &w);
                    float d = 0, m = test_max_abs(b, (size_t)n * N);
                    for (int i = 0; i < n * N; i++)
                        d = fmaxf(d, fabsf(a[i] - b[i]) / m);
                    worst = fmaxf(worst, d);
                    CHECK(d < 1e-5f, "%s bf16 tile K %d N %d n %d, x %s: relative diff %g", name, K, N, n,
                          pre ? "rounded" : "float32", d);
                }
            free(keep), free(x), free(xr), free(a), free(b);
        }
    printf("path %s, bf16 tile: worst relative diff %g against the scalar matvec on x rounded to bf16\n", name,
           worst);
    void *keep;
    lmx_cpu_weight w = make_weight(LMX_WK_F32, 64, 200, &keep);
    float *x = malloc((size_t)40 * 200 * sizeof *x), *a = malloc((size_t)40 * 64 * sizeof *a),
          *b = malloc((size_t)40 * 64 * sizeof *b);
    for (int i = 0; i < 40 * 200; i++)
        x[i] = frand();
    lmx_cpu_mm_run(mm, a, x, 40, &w);
    lmx_cpu_mm_run(mf, b, x, 40, &w);
    CHECK(!memcmp(a, b, (size_t)40 * 64 * sizeof *a), "%s bf16 x: f32 weights changed", name);
    free(keep), free(x), free(a), free(b);
    lmx_cpu_mm_free(mm);
    lmx_cpu_mm_free(mf);
    lmx_cpu_mm_free(mr);
}

/* Prefill attention (many query rows: the GEMM-tile way) against the same
 * queries one row at a time (decode's way), on a path: GQA, head sizes
 * with and without a whole tile of columns, a sliding window, softcap,
 * a ring cache that has wrapped, float32 and float16 caches. */
static void check_attn_prefill(const lmx_cpu_kernels *k, lmx_pool *pool)
{
    enum { H = 6, KVH = 2, CAP = 100, ROWS = 45 };
    const int hds[] = {8, 72, 128};
    for (int h = 0; h < 3; h++)
        for (int f16 = 0; f16 < 2; f16++)
            for (int variant = 0; variant < 2; variant++) {
                int hd = hds[h], cols = KVH * hd;
                size_t nc = (size_t)CAP * cols + lmx_cpu_attention_slack(k, cols);
                float *q = malloc((size_t)ROWS * H * hd * sizeof *q), *kc = calloc(nc, sizeof *kc),
                      *vc = calloc(nc, sizeof *vc), *o1 = malloc((size_t)ROWS * H * hd * sizeof *o1),
                      *o2 = malloc((size_t)ROWS * H * hd * sizeof *o2);
                uint16_t *kh = calloc(nc, sizeof *kh), *vh = calloc(nc, sizeof *vh);
                for (size_t i = 0; i < (size_t)ROWS * H * hd; i++)
                    q[i] = frand();
                for (size_t i = 0; i < (size_t)CAP * cols; i++) {
                    kc[i] = frand(), vc[i] = frand();
                    kh[i] = lmx_f32_to_f16(kc[i]), vh[i] = lmx_f32_to_f16(vc[i]);
                }
                const void *kp = f16 ? (const void *)kh : (const void *)kc;
                const void *vp = f16 ? (const void *)vh : (const void *)vc;
                /* with the window, positions 95..139: the ring has wrapped */
                lmx_attn_params p = {ROWS, variant ? 95 : 40, H, KVH, hd, variant ? 50 : 0, 1.0f / sqrtf((float)hd),
                                     variant ? 3.0f : 0.0f};
                lmx_cpu_attention(k, pool, o1, q, kp, vp, f16, CAP, &p);
                for (int r = 0; r < ROWS; r++) {
                    lmx_attn_params p1 = p;
                    p1.n_rows = 1, p1.pos0 = p.pos0 + r;
                    lmx_cpu_attention(k, pool, o2 + (size_t)r * H * hd, q + (size_t)r * H * hd, kp, vp, f16, CAP,
                                      &p1);
                }
                float worst = 0;
                for (size_t i = 0; i < (size_t)ROWS * H * hd; i++)
                    worst = fmaxf(worst, fabsf(o1[i] - o2[i]));
                CHECK(worst < 1e-5f, "%s prefill attention hd %d %s%s: max |diff| %g against one row at a time",
                      lmx_cpu_path_name(k->path), hd, f16 ? "f16" : "f32", variant ? " window softcap" : "", worst);
                free(q), free(kc), free(vc), free(o1), free(o2), free(kh), free(vh);
            }
}

/* Decode past 128 tokens cuts each query's keys into parts when there are
 * fewer KV heads than two a thread (both fixtures here), and merges them:
 * the logits of token-by-token decode match those of one prefill of the
 * same tokens. With the cache in float16, float32 rounding differences
 * between the two can round a key or value to neighbouring float16 values:
 * the float16 fixture tolerance (testutil.h) applies. */
static void check_decode_split(const char *name, int kv_f16)
{
    enum { N = 200, FROM = 130 };
    char dir[600];
    snprintf(dir, sizeof dir, "%s/%s", LMX_TEST_DATA, name);
    lmx_load_options o = lmx_load_defaults();
    o.n_threads = 2;
    o.kv_f16 = kv_f16;
    lmx_error err = {0};
    lmx_model *m = lmx_load(dir, &o, &err);
    CHECK(m != NULL, "load %s: %s", name, err.message);
    if (!m)
        return;
    int V = lmx_model_vocab_size(m);
    int32_t ids[N];
    test_fixed_ids(ids, N, V);
    float *pre = malloc((size_t)N * V * sizeof *pre), *dec = malloc((size_t)V * sizeof *dec);
    lmx_context *a = lmx_context_new(m, N, &err), *b = lmx_context_new(m, N, &err);
    CHECK(pre && dec && a && b && lmx_context_eval(a, ids, N, pre, 1, &err) == LMX_OK, "prefill: %s", err.message);
    float worst = 0, tol = kv_f16 ? TEST_KV_F16_TOL : 1e-3f; /* f16: relative to max(1, max |logit|) */
    for (int i = 0; pre && dec && b && i < N; i++) {
        CHECK(lmx_context_eval(b, ids + i, 1, dec, 0, &err) == LMX_OK, "decode: %s", err.message);
        const float *want = pre + (size_t)i * V;
        float scale = kv_f16 ? fmaxf(1.0f, test_max_abs(want, (size_t)V)) : 1.0f;
        for (int v = 0; i >= FROM && v < V; v++)
            worst = fmaxf(worst, fabsf(dec[v] - want[v]) / scale);
    }
    const char *kv = kv_f16 ? "f16 (relative)" : "f32";
    printf("%s, kv %s: decode (split keys) against prefill, positions %d-%d: max logit diff %g\n", name, kv, FROM,
           N - 1, worst);
    CHECK(worst < tol, "%s, kv %s: decode against prefill: %g", name, kv, worst);
    lmx_context_free(a);
    lmx_context_free(b);
    free(pre), free(dec);
    lmx_close(m);
}

/* The fixture test binary sits next to this one. */
static int run_fixtures(const char *path)
{
    char self[1024], cmd[1200];
    ssize_t n = readlink("/proc/self/exe", self, sizeof self - 1);
    if (n <= 0)
        return -1;
    self[n] = 0;
    char *slash = strrchr(self, '/');
    if (!slash)
        return -1;
    *slash = 0;
    snprintf(cmd, sizeof cmd, "LMX_CPU_PATH=%s '%s/test_model_fixtures' >/dev/null", path, self);
    return test_run(cmd, NULL);
}

int main(void)
{
    const lmx_cpu_kernels *ref = lmx_cpu_kernels_scalar();
    lmx_pool *pool = lmx_pool_new(2);
    CHECK(pool != NULL, "pool");
    int ran = 0;
    for (int p = 0; p < LMX_CPU_PATH_COUNT; p++) {
        const char *why = NULL, *name = lmx_cpu_path_name((lmx_cpu_path)p);
        if (!lmx_cpu_path_supported((lmx_cpu_path)p, &why)) {
            printf("SKIPPED path %s: %s\n", name, why);
            continue;
        }
        const lmx_cpu_kernels *k = lmx_cpu_kernels_for((lmx_cpu_path)p);
        CHECK(k && k->path == (lmx_cpu_path)p, "kernels for %s", name);
        if (k && pool) {
            check_kernels(k, ref, pool);
            check_bf16_tile(k, ref, pool);
            check_attn_f16(k, ref);
            check_attn_prefill(k, pool);
            check_quant(k);
        }
        /* the default path's fixtures are test_model_fixtures' own run */
        lmx_cpu_path best;
        if (lmx_cpu_path_select(&best, NULL) == LMX_OK && best == (lmx_cpu_path)p) {
            printf("path %s: kernels checked; fixtures: test_model_fixtures (the default path)\n", name);
            ran++;
            continue;
        }
        int rc = run_fixtures(name);
        CHECK(rc == 0, "fixtures under LMX_CPU_PATH=%s: exit %d", name, rc);
        printf("path %s: kernels and fixtures %s\n", name, rc == 0 ? "pass" : "FAIL");
        ran++;
    }
    CHECK(ran >= 1, "no path ran");
    for (int kv_f16 = 0; kv_f16 < 2; kv_f16++) {
        check_decode_split("qwen3-small", kv_f16);
        check_decode_split("gemma3-small", kv_f16);
    }
    /* a bad or unsupported forced path is an error value, not a crash */
    setenv("LMX_CPU_PATH", "sse9", 1);
    lmx_error err = {0};
    char dir[600];
    snprintf(dir, sizeof dir, "%s/qwen3-tiny", LMX_TEST_DATA);
    lmx_model *m = lmx_load(dir, NULL, &err);
    CHECK(!m && err.code == LMX_ERR_ARG && strstr(err.message, "LMX_CPU_PATH"), "bad path: %s", err.message);
    lmx_close(m);
    unsetenv("LMX_CPU_PATH");
    lmx_pool_free(pool);
    return test_finish();
}
