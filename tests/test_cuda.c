/* The CUDA backend, on a GPU: each op against the CPU backend on random
 * data at real model sizes (long K, split-K decode attention over a
 * wrapped cache), then every fixture's logits against transformers'
 * references, prefilled whole, token by token (CUDA graph replay) and in
 * chunks. Tolerances and their measurements: docs/cuda.md. Exits 77
 * (CTest: skipped) when lmx was built without CUDA or no GPU is present. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "argmax.h"
#include "backend_cpu.h"
#include "backend_cuda.h"
#include "context.h"
#include "lmx.h"
#include "safetensors.h"
#include "sampler.h"
#include "testutil.h"

#ifdef LMX_HAVE_CUDA
#include <cuda_runtime_api.h>
#endif

/* Logits: max |ours - ref| over a row, relative to max(1, max |ref|). */
#define LOGIT_TOL 3e-2f

static unsigned long long rng = 88172645463325252ull;
static float frand(void)
{
    rng ^= rng << 13;
    rng ^= rng >> 7;
    rng ^= rng << 17;
    return (float)((double)(rng >> 11) * (1.0 / 9007199254740992.0)) * 2 - 1;
}

/* Op checks: the same op on both backends ------------------------------------ */

typedef struct pair {
    lmx_backend *cpu, *gpu;
} pair;

/* One tensor on both backends. */
typedef struct both {
    lmx_tensor *c, *g;
    int rows, cols;
    void *host;
} both;

/* Random [rows, cols] data of dtype dt (read-only input, bound as a weight). */
static both input(pair *p, int rows, int cols, lmx_dtype dt, float amp)
{
    size_t n = (size_t)rows * cols;
    both b = {NULL, NULL, rows, cols, malloc(n * 4)};
    for (size_t i = 0; i < n; i++) {
        float v = frand() * amp;
        if (dt == LMX_DT_BF16)
            ((uint16_t *)b.host)[i] = lmx_f32_to_bf16(v);
        else if (dt == LMX_DT_F16)
            ((uint16_t *)b.host)[i] = lmx_f32_to_f16(v);
        else
            ((float *)b.host)[i] = v;
    }
    lmx_st_tensor t = {.name = "t", .dtype = dt, .ndim = 2, .shape = {rows, cols}, .data = b.host,
                       .nbytes = n * lmx_dtype_size(dt), .file = "test"};
    lmx_error err = {0};
    /* the GPU first: a quantizing CPU backend drops the source pages */
    b.g = p->gpu->ops->weight(p->gpu, &t, NULL, 0, &err);
    b.c = p->cpu->ops->weight(p->cpu, &t, NULL, 0, &err);
    CHECK(b.c && b.g, "weight: %s", err.message);
    return b;
}

static both output(pair *p, int rows, int cols)
{
    lmx_error err = {0};
    both b = {p->cpu->ops->alloc(p->cpu, rows, cols, &err), p->gpu->ops->alloc(p->gpu, rows, cols, &err), rows,
              cols, NULL};
    CHECK(b.c && b.g, "alloc: %s", err.message);
    return b;
}

static void drop(pair *p, both *b)
{
    p->cpu->ops->free(p->cpu, b->c);
    p->gpu->ops->free(p->gpu, b->g);
    free(b->host);
}

/* The three weights and outputs of a q, k, v check. */
static void drop_qkv(pair *p, both *w, both *o)
{
    for (int i = 0; i < 3; i++) {
        drop(p, &w[i]);
        drop(p, &o[i]);
    }
}

/* Rows [0, n) agree within tol x max(1, max |cpu|); returns that error. */
static float same(pair *p, const both *b, int n, float tol, const char *what)
{
    size_t len = (size_t)n * b->cols;
    float *c = malloc(len * 4), *g = malloc(len * 4);
    p->cpu->ops->read(p->cpu, c, (size_t)b->cols, b->c, 0, n);
    p->gpu->ops->read(p->gpu, g, (size_t)b->cols, b->g, 0, n);
    float worst = 0;
    int finite = 1;
    for (size_t i = 0; i < len; i++) {
        finite &= isfinite(g[i]);
        worst = fmaxf(worst, fabsf(c[i] - g[i]));
    }
    float rel = worst / fmaxf(1.0f, test_max_abs(c, len));
    CHECK(finite && rel <= tol, "%s: relative error %g > %g (or not finite)", what, rel, tol);
    free(c);
    free(g);
    return rel;
}

/* Float32 rows [rows, cols] copied into activation t of backend be, one
 * row at a time (a one-row weight stays float on a quantizing backend).
 * Each row goes through a scratch copy: the CPU backend gives a weight's
 * source pages back once it has copied them (drop_pages), which zeroes
 * heap memory, and the checks read data afterwards. */
static void copy_in(lmx_backend *be, lmx_tensor *t, const float *data, int rows, int cols)
{
    lmx_error err = {0};
    lmx_tensor *w = NULL;
    float *scratch = malloc((size_t)cols * 4);
    for (int r = 0; r < rows && scratch; r++) {
        memcpy(scratch, data + (size_t)r * cols, (size_t)cols * 4);
        lmx_st_tensor row = {.name = "t", .dtype = LMX_DT_F32, .ndim = 2, .shape = {1, cols},
                             .data = scratch, .nbytes = (size_t)cols * 4, .file = "test"};
        if (!(w = be->ops->weight(be, &row, NULL, 0, &err)))
            break;
        be->ops->copy_rows(be, t, r, w, 0, 1);
        be->ops->free(be, w);
    }
    free(scratch);
    CHECK(rows == 0 || w != NULL, "weight: %s", err.message); /* one check a tensor */
}

/* Given float32 data (taken over: freed by drop), activations on both
 * backends. */
static both bound(pair *p, int rows, int cols, float *data)
{
    both b = output(p, rows, cols);
    b.host = data;
    copy_in(p->gpu, b.g, data, rows, cols);
    copy_in(p->cpu, b.c, data, rows, cols);
    return b;
}

/* Random float32 activations [rows, cols]. */
static both activations(pair *p, int rows, int cols, float amp)
{
    float *data = malloc((size_t)rows * cols * 4);
    for (size_t i = 0; i < (size_t)rows * cols; i++)
        data[i] = frand() * amp;
    return bound(p, rows, cols, data);
}

static void check_matmul(pair *p)
{
    const lmx_dtype dts[] = {LMX_DT_BF16, LMX_DT_F16, LMX_DT_F32};
    const int rows[] = {1, 3, 8, 9, 64};
    const int Ks[][2] = {{4096, 1000}, {1000, 515}, {12, 7}}; /* {K, N}: vector path, odd K, tiny */
    for (int d = 0; d < 3; d++)
        for (int k = 0; k < 3; k++) {
            int K = Ks[k][0], N = Ks[k][1];
            both w = input(p, N, K, dts[d], 0.05f), x = input(p, 64, K, LMX_DT_F32, 1.0f), o = output(p, 64, N);
            for (int r = 0; r < 5; r++) {
                p->cpu->ops->matmul(p->cpu, o.c, x.c, w.c, rows[r]);
                p->gpu->ops->matmul(p->gpu, o.g, x.g, w.g, rows[r]);
                /* > 8 rows of bf16 weights: tensor cores on bf16-rounded activations */
                float tol = rows[r] > 8 && dts[d] == LMX_DT_BF16 ? 1e-2f : 1e-4f;
                char what[96];
                snprintf(what, sizeof what, "matmul %s K %d N %d rows %d", lmx_dtype_name(dts[d]), K, N, rows[r]);
                float e = same(p, &o, rows[r], tol, what);
                if (rows[r] == 64 && k == 0)
                    printf("%s: relative error %.2e\n", what, e);
            }
            drop(p, &w);
            drop(p, &x);
            drop(p, &o);
        }
}

/* matmul_multi (q, k, v of differing widths, fused into one launch when
 * decoding; and with k, v of one width, one batched product in prefill)
 * and gated_mlp (both activations), decode and prefill rows. */
static void check_fused_matmuls(pair *p)
{
    const lmx_dtype dts[] = {LMX_DT_BF16, LMX_DT_F16, LMX_DT_F32};
    /* 4100 rows: one warp a weight row (fewer rows take two, as check_matmul's) */
    const int rows[] = {1, 5, 8, 64}, K = 1024, Ns[3] = {4100, 128, 135};
    for (int d = 0; d < 3; d++) {
        both x = input(p, 64, K, LMX_DT_F32, 1.0f), w[3], o[3];
        both w_up = input(p, Ns[0], K, dts[d], 0.05f), up = output(p, 64, Ns[0]);
        both w_v = input(p, Ns[1], K, dts[d], 0.05f), v = output(p, 64, Ns[1]);
        for (int i = 0; i < 3; i++) {
            w[i] = input(p, Ns[i], K, dts[d], 0.05f);
            o[i] = output(p, 64, Ns[i]);
        }
        lmx_tensor *oc[3] = {o[0].c, o[1].c, o[2].c}, *og[3] = {o[0].g, o[1].g, o[2].g};
        const lmx_tensor *wc[3] = {w[0].c, w[1].c, w[2].c}, *wg[3] = {w[0].g, w[1].g, w[2].g};
        for (int r = 0; r < 4; r++) {
            float tol = rows[r] > 8 && dts[d] == LMX_DT_BF16 ? 1e-2f : 1e-4f;
            char what[96];
            p->cpu->ops->matmul_multi(p->cpu, 3, oc, x.c, wc, rows[r]);
            p->gpu->ops->matmul_multi(p->gpu, 3, og, x.g, wg, rows[r]);
            for (int i = 0; i < 3; i++) {
                snprintf(what, sizeof what, "matmul_multi %s rows %d output %d", lmx_dtype_name(dts[d]), rows[r], i);
                same(p, &o[i], rows[r], tol, what);
            }
            lmx_tensor *oc_kv[3] = {o[0].c, o[1].c, v.c}, *og_kv[3] = {o[0].g, o[1].g, v.g};
            const lmx_tensor *wc_kv[3] = {w[0].c, w[1].c, w_v.c}, *wg_kv[3] = {w[0].g, w[1].g, w_v.g};
            p->cpu->ops->matmul_multi(p->cpu, 3, oc_kv, x.c, wc_kv, rows[r]);
            p->gpu->ops->matmul_multi(p->gpu, 3, og_kv, x.g, wg_kv, rows[r]);
            snprintf(what, sizeof what, "matmul_multi %s rows %d, k and v of one width", lmx_dtype_name(dts[d]),
                     rows[r]);
            same(p, &o[1], rows[r], tol, what);
            same(p, &v, rows[r], tol, what);
            for (int a = 0; a < 2; a++) {
                p->cpu->ops->gated_mlp(p->cpu, o[0].c, up.c, x.c, w[0].c, w_up.c, rows[r], (lmx_activation)a);
                p->gpu->ops->gated_mlp(p->gpu, o[0].g, up.g, x.g, w[0].g, w_up.g, rows[r], (lmx_activation)a);
                snprintf(what, sizeof what, "gated_mlp %s %s rows %d", a ? "gelu" : "silu", lmx_dtype_name(dts[d]),
                         rows[r]);
                same(p, &o[0], rows[r], tol, what);
            }
        }
        drop(p, &x);
        drop(p, &w_up);
        drop(p, &up);
        drop(p, &w_v);
        drop(p, &v);
        drop_qkv(p, w, o);
    }
}

/* One row of x against q, k and v of Ns rows (a matmul_multi), slots
 * taking `slot` rows as the comment of check_slot_rows says. */
static void check_qkv_rows(pair *p, const both *x, const int *Ns, float tol, const char *name, const char *slot)
{
    const int K = x->cols;
    both w[3], o[3];
    for (int i = 0; i < 3; i++) {
        w[i] = input(p, Ns[i], K, LMX_DT_BF16, 0.05f);
        o[i] = output(p, 1, Ns[i]);
    }
    lmx_tensor *oc[3] = {o[0].c, o[1].c, o[2].c}, *og[3] = {o[0].g, o[1].g, o[2].g};
    const lmx_tensor *wc[3] = {w[0].c, w[1].c, w[2].c}, *wg[3] = {w[0].g, w[1].g, w[2].g};
    char what[128];
    p->cpu->ops->matmul_multi(p->cpu, 3, oc, x->c, wc, 1);
    p->gpu->ops->matmul_multi(p->gpu, 3, og, x->g, wg, 1);
    for (int i = 0; i < 3; i++) {
        snprintf(what, sizeof what, "%s matmul_multi of %d/%d/%d rows, %s, output %d", name, Ns[0], Ns[1], Ns[2],
                 slot, i);
        same(p, &o[i], 1, tol, what);
    }
    drop_qkv(p, w, o);
}

/* One row of x against the GEMV's slots of several weight rows
 * (slot_rows in src/backend_cuda.cu): q, k and v of 2048, 512 and 512 rows
 * take 4 rows a slot, their slots crossing from matrix to matrix; of 4096,
 * 2048 and 2048 rows (Gemma3-12B's) bf16 takes 2 rows a slot on a GPU of
 * 132 multiprocessors (one a slot would spill past one wave), q8/q4 4 in
 * blocks of one warp a slot; 16392 rows take 2. tol: 1e-4 for float
 * weights, 1e-2 for q8/q4 (as the other checks of each). */
static void check_slot_rows(pair *p, float tol, const char *name)
{
    const int K = 256, Ns[3] = {2048, 512, 512}, Ns_wave[3] = {4096, 2048, 2048}, N_head = 16392;
    both x = activations(p, 1, K, 1.0f);
    check_qkv_rows(p, &x, Ns, tol, name, "4 rows a slot");
    check_qkv_rows(p, &x, Ns_wave, tol, name, "rows a slot by the wave");
    both wh = input(p, N_head, K, LMX_DT_BF16, 0.05f), oh = output(p, 1, N_head);
    char what[96];
    p->cpu->ops->matmul(p->cpu, oh.c, x.c, wh.c, 1);
    p->gpu->ops->matmul(p->gpu, oh.g, x.g, wh.g, 1);
    snprintf(what, sizeof what, "%s matmul of %d rows, 2 rows a slot", name, N_head);
    same(p, &oh, 1, tol, what);
    drop(p, &x);
    drop(p, &wh);
    drop(p, &oh);
}

/* A gated prefill keeps its output in bf16 only (docs/cuda.md): read
 * while that copy lasts, it comes back as float32 (check_fused_matmuls);
 * read after another op replaced the copy, the step fails saying so. */
static void check_stale_gate(pair *p)
{
    const int rows = 64, K = 256, N = 512;
    both x = input(p, rows, K, LMX_DT_F32, 1.0f), wg = input(p, N, K, LMX_DT_BF16, 0.05f);
    both wu = input(p, N, K, LMX_DT_BF16, 0.05f), wn = input(p, 1, K, LMX_DT_BF16, 1.0f);
    both g = output(p, rows, N), u = output(p, rows, N), h = output(p, rows, K);
    int32_t ids[64] = {0};
    lmx_backend *be = p->gpu;
    lmx_error err = {0};
    be->ops->step_begin(be, &err, 0, ids, rows, 0, NULL);
    be->ops->gated_mlp(be, g.g, u.g, x.g, wg.g, wu.g, rows, LMX_ACT_SILU);
    be->ops->rmsnorm(be, h.g, x.g, wn.g, rows, 1e-6f, 0); /* its bf16 copy replaces the gate's */
    float *out = malloc((size_t)rows * N * 4);
    be->ops->read(be, out, N, g.g, 0, rows);
    lmx_status st = be->ops->step_end(be, &err);
    CHECK(st == LMX_ERR_INTERNAL && strstr(err.message, "kept only in bf16"),
          "reading a replaced bf16-only activation: status %d, '%s'", (int)st, err.message);
    free(out);
    both *all[] = {&x, &wg, &wu, &wn, &g, &u, &h};
    for (int i = 0; i < 7; i++)
        drop(p, all[i]);
}

/* A prefill residual_norm whose h only products read keeps h in bf16
 * only, the products' copy (docs/cuda.md): read back, it is the float32
 * result rounded to bf16 (2^-9 of a value). It keeps float32 when h is
 * read otherwise, and while a float32 weight matrix is held (its products
 * read float32); x, the residual stream, always. */
static void check_lean_norms(pair *p)
{
    const int n = 64, D = 1024;
    both x = activations(p, n, D, 3.0f), y = activations(p, n, D, 2.0f), h = output(p, n, D);
    both w = input(p, 1, D, LMX_DT_BF16, 1.0f);
    for (int mode = 0; mode < 3; mode++) { /* h for others; for products beside a float32 matrix; lean */
        int lean = mode == 2;
        both wf = {0};
        if (mode == 1)
            wf = input(p, 16, D, LMX_DT_F32, 1.0f);
        /* a post-norm last: it leaves y scratch (the CPU normalizes it in place) */
        p->cpu->ops->residual_norm(p->cpu, x.c, h.c, y.c, lean ? w.c : NULL, w.c, n, 1e-6f, 0, mode > 0);
        p->gpu->ops->residual_norm(p->gpu, x.g, h.g, y.g, lean ? w.g : NULL, w.g, n, 1e-6f, 0, mode > 0);
        same(p, &x, n, 1e-5f, "prefill residual_norm: x");
        float e = same(p, &h, n, lean ? 0x1p-8f : 1e-5f, lean ? "prefill residual_norm: h in bf16" : "h in float32");
        CHECK(!lean || e > 1e-5f, "prefill residual_norm for products: h read back within %g, not rounded", e);
        if (mode == 1)
            drop(p, &wf);
    }
    both *all[] = {&x, &y, &w, &h};
    for (int i = 0; i < 4; i++)
        drop(p, all[i]);
}

/* rmsnorm (both styles, per head), residual_norm (with and without a
 * norm of y first), softcap, embed, copy_rows; rows of D elements: the
 * norms' lean instances (D a multiple of 4, bf16 weights; one, two or
 * eight float4s of a row a thread: D up to 4096, 8192, beyond), their
 * generic one (D odd; per head: float32 weights). */
static void check_elementwise(pair *p, int D, int hd)
{
    const int n = 5;
    both x = input(p, n, D, LMX_DT_F32, 3.0f), w = input(p, 1, D, LMX_DT_BF16, 1.0f);
    both wh = input(p, 1, hd, LMX_DT_F32, 1.0f), o = output(p, n, D), u = input(p, n, D, LMX_DT_F32, 2.0f);
    both w2 = input(p, 1, D, LMX_DT_BF16, 1.0f), h = output(p, n, D);
    for (int p1 = 0; p1 < 2; p1++) {
        p->cpu->ops->rmsnorm(p->cpu, o.c, x.c, w.c, n, 1e-6f, p1);
        p->gpu->ops->rmsnorm(p->gpu, o.g, x.g, w.g, n, 1e-6f, p1);
        same(p, &o, n, 1e-5f, p1 ? "rmsnorm (1 + w)" : "rmsnorm");
    }
    p->cpu->ops->rmsnorm(p->cpu, o.c, x.c, wh.c, n, 1e-6f, 0);
    p->gpu->ops->rmsnorm(p->gpu, o.g, x.g, wh.g, n, 1e-6f, 0);
    same(p, &o, n, 1e-5f, "rmsnorm per head");
    printf("norms of %d elements (heads of %d) checked\n", D, hd);
    for (int post = 0; post < 2; post++) {
        /* y = o (scratch afterwards), x = u: both rewritten on both sides alike */
        p->cpu->ops->residual_norm(p->cpu, u.c, h.c, o.c, post ? w2.c : NULL, w.c, n, 1e-6f, post, 0);
        p->gpu->ops->residual_norm(p->gpu, u.g, h.g, o.g, post ? w2.g : NULL, w.g, n, 1e-6f, post, 0);
        same(p, &u, n, 1e-5f, post ? "residual_norm: x (post-norm)" : "residual_norm: x");
        same(p, &h, n, 1e-5f, post ? "residual_norm: h (post-norm)" : "residual_norm: h");
        p->cpu->ops->rmsnorm(p->cpu, o.c, x.c, w.c, n, 1e-6f, 0);
        p->gpu->ops->rmsnorm(p->gpu, o.g, x.g, w.g, n, 1e-6f, 0);
    }
    p->cpu->ops->softcap(p->cpu, o.c, n, 3.0f);
    p->gpu->ops->softcap(p->gpu, o.g, n, 3.0f);
    same(p, &o, n, 1e-5f, "softcap");
    const int32_t ids[5] = {4, 0, 4, 1, 2};
    p->cpu->ops->embed(p->cpu, o.c, x.c, ids, n, 1.5f, 1); /* id 0: a zero row */
    p->gpu->ops->embed(p->gpu, o.g, x.g, ids, n, 1.5f, 1);
    p->cpu->ops->copy_rows(p->cpu, o.c, 3, x.c, 1, 2);
    p->gpu->ops->copy_rows(p->gpu, o.g, 3, x.g, 1, 2);
    same(p, &o, n, 0, "embed, copy_rows");
    drop(p, &x);
    drop(p, &w);
    drop(p, &wh);
    drop(p, &o);
    drop(p, &u);
    drop(p, &w2);
    drop(p, &h);
}

/* Backends that quantize (q8 or q4) on both sides: the same packed weights
 * (one quantizer). Decode rows: both quantize x to 8 bits per group alike;
 * prefill rows: the GPU runs bf16 activations against the weights
 * dequantized to bf16, the CPU float32 ones. 1e-2 is the bf16 bound of
 * check_matmul; a packing or scale error is of the order of the result. */
static void check_quantized(pair *p, int bits)
{
    const int rows[] = {1, 3, 8, 9, 64}, K = 1024, Ns[3] = {4100, 128, 135}; /* w[0]: one warp a row */
    both x = activations(p, 64, K, 1.0f), w[3], o[3];
    for (int i = 0; i < 3; i++) {
        w[i] = input(p, Ns[i], K, i == 2 ? LMX_DT_F16 : LMX_DT_BF16, 0.05f);
        o[i] = output(p, 64, Ns[i]);
    }
    both up = output(p, 64, Ns[0]), w_up = input(p, Ns[0], K, LMX_DT_BF16, 0.05f), e = output(p, 5, K);
    lmx_tensor *oc[3] = {o[0].c, o[1].c, o[2].c}, *og[3] = {o[0].g, o[1].g, o[2].g};
    const lmx_tensor *wc[3] = {w[0].c, w[1].c, w[2].c}, *wg[3] = {w[0].g, w[1].g, w[2].g};
    char what[96];
    for (int r = 0; r < 5; r++) {
        p->cpu->ops->matmul_multi(p->cpu, 3, oc, x.c, wc, rows[r]);
        p->gpu->ops->matmul_multi(p->gpu, 3, og, x.g, wg, rows[r]);
        for (int i = 0; i < 3; i++) {
            snprintf(what, sizeof what, "q%d matmul_multi rows %d output %d", bits, rows[r], i);
            same(p, &o[i], rows[r], 1e-2f, what);
        }
        p->cpu->ops->gated_mlp(p->cpu, o[0].c, up.c, x.c, w[0].c, w_up.c, rows[r], LMX_ACT_SILU);
        p->gpu->ops->gated_mlp(p->gpu, o[0].g, up.g, x.g, w[0].g, w_up.g, rows[r], LMX_ACT_SILU);
        /* act(gate) * up carries two products' differences (the CPU's int8
         * activations, the GPU's bf16 ones and bf16 output): 1.09e-2 on
         * one draw of 64 rows (session 29, H100), so twice the 1e-2 each
         * product is held to */
        snprintf(what, sizeof what, "q%d gated_mlp rows %d", bits, rows[r]);
        same(p, &o[0], rows[r], 2e-2f, what);
    }
    /* a weight larger than prefill's dequantizing scratch (32 M elements):
     * dequantized and multiplied 8192 rows at a time, then the last 256 */
    both big = input(p, 8448, 4096, LMX_DT_BF16, 0.05f), xb = activations(p, 64, 4096, 1.0f),
         ob = output(p, 64, 8448);
    for (int r = 3; r < 5; r++) {
        p->cpu->ops->matmul(p->cpu, ob.c, xb.c, big.c, rows[r]);
        p->gpu->ops->matmul(p->gpu, ob.g, xb.g, big.g, rows[r]);
        snprintf(what, sizeof what, "q%d matmul rows %d of an 8448 x 4096 weight (stepped)", bits, rows[r]);
        same(p, &ob, rows[r], 1e-2f, what);
    }
    drop(p, &big);
    drop(p, &xb);
    drop(p, &ob);
    /* decode rows from a norm: the GEMV takes x as the norm quantized it */
    both nw = input(p, 1, K, LMX_DT_F32, 1.0f), h = output(p, 8, K), u = activations(p, 8, K, 1.0f);
    for (int r = 0; r < 3; r++) {
        for (int residual = 0; residual < 2; residual++) {
            if (residual) { /* u += x, h = norm(u) */
                p->cpu->ops->residual_norm(p->cpu, u.c, h.c, x.c, NULL, nw.c, rows[r], 1e-6f, 0, 1);
                p->gpu->ops->residual_norm(p->gpu, u.g, h.g, x.g, NULL, nw.g, rows[r], 1e-6f, 0, 1);
            } else {
                p->cpu->ops->rmsnorm(p->cpu, h.c, x.c, nw.c, rows[r], 1e-6f, 0);
                p->gpu->ops->rmsnorm(p->gpu, h.g, x.g, nw.g, rows[r], 1e-6f, 0);
            }
            for (int i = 0; i < 2; i++) { /* one warp a weight row, two */
                p->cpu->ops->matmul(p->cpu, o[i].c, h.c, w[i].c, rows[r]);
                p->gpu->ops->matmul(p->gpu, o[i].g, h.g, w[i].g, rows[r]);
                snprintf(what, sizeof what, "q%d matmul of a %s rows %d, %d weight rows", bits,
                         residual ? "residual_norm" : "rmsnorm", rows[r], Ns[i]);
                same(p, &o[i], rows[r], 1e-2f, what);
            }
        }
    }
    drop(p, &nw);
    drop(p, &h);
    drop(p, &u);
    const int32_t ids[5] = {4, 0, 511, 1, 2};
    p->cpu->ops->embed(p->cpu, e.c, w[0].c, ids, 5, 1.5f, 1); /* rows of the quantized table; id 0: zero */
    p->gpu->ops->embed(p->gpu, e.g, w[0].g, ids, 5, 1.5f, 1);
    snprintf(what, sizeof what, "q%d embed", bits);
    same(p, &e, 5, 1e-6f, what);
    drop(p, &x);
    drop(p, &up);
    drop(p, &w_up);
    drop(p, &e);
    drop_qkv(p, w, o);
}

/* The first rows of a CPU tensor, rounded to bf16 values (as float32). */
static float *cpu_rounded(pair *p, const lmx_tensor *t, int rows, int cols)
{
    float *h = malloc((size_t)rows * cols * 4);
    p->cpu->ops->read(p->cpu, h, (size_t)cols, t, 0, rows);
    for (size_t i = 0; i < (size_t)rows * cols; i++)
        h[i] = lmx_bf16_to_f32(lmx_f32_to_bf16(h[i]));
    return h;
}

/* The CPU's float32 cache rounded to bf16 in place, so that both backends
 * attend over the same keys and values. */
static void round_cpu_cache(pair *p, lmx_tensor *cache, int rows, int cols)
{
    float *h = cpu_rounded(p, cache, rows, cols);
    copy_in(p->cpu, cache, h, rows, cols);
    free(h);
}

/* Positions 0 .. fill - 1 of both backends' caches written by qk_prepare
 * (q/k norms, RoPE with two settings, q's rows rewritten in place), then
 * the CPU's float32 cache rounded to bf16 as the GPU's holds it. */
static void fill_caches(pair *p, both *q, both *kc, both *vc, int hd, int fill, int plus_one)
{
    const lmx_rope ropes[] = {{1e6f, 1.0f}, {1e4f, 8.0f}};
    int kv = kc->cols;
    both qn = input(p, 1, hd, LMX_DT_BF16, 1.0f), kn = input(p, 1, hd, LMX_DT_BF16, 1.0f);
    for (int pos = 0; pos < fill; pos += 100) {
        both k = activations(p, 100, kv, 1.0f), v = activations(p, 100, kv, 1.0f);
        lmx_rope rope = ropes[pos / 100 % 2];
        p->cpu->ops->qk_prepare(p->cpu, q->c, k.c, v.c, qn.c, kn.c, kc->c, vc->c, 100, hd, pos, rope, 1e-6f, plus_one);
        p->gpu->ops->qk_prepare(p->gpu, q->g, k.g, v.g, qn.g, kn.g, kc->g, vc->g, 100, hd, pos, rope, 1e-6f, plus_one);
        same(p, q, 100, 1e-5f, "qk_prepare: q");
        drop(p, &k);
        drop(p, &v);
    }
    round_cpu_cache(p, kc->c, kc->rows, kv);
    round_cpu_cache(p, vc->c, vc->rows, kv);
    drop(p, &qn);
    drop(p, &kn);
}

/* A prefill's q, k and v products on bf16 weights stay packed in bf16
 * (docs/cuda.md): qk_prepare and flash attention read them so, and q
 * read back is widened. Against the CPU's float32 chain: the products'
 * bf16 bound (1e-2), carried through the norms and the attention. */
static void check_packed_qkv(pair *p)
{
    const int n = 64, K = 256, hd = 128, H = 4, KVH = 2, slots = 128;
    const lmx_rope rope = {1e6f, 1.0f};
    lmx_error err = {0};
    both x = activations(p, n, K, 1.0f), q = output(p, n, H * hd), k = output(p, n, KVH * hd);
    both v = output(p, n, KVH * hd), o = output(p, n, H * hd);
    both wq = input(p, H * hd, K, LMX_DT_BF16, 0.1f), wk = input(p, KVH * hd, K, LMX_DT_BF16, 0.1f);
    both wv = input(p, KVH * hd, K, LMX_DT_BF16, 0.1f);
    both qn = input(p, 1, hd, LMX_DT_BF16, 1.0f), kn = input(p, 1, hd, LMX_DT_BF16, 1.0f);
    both kc = {p->cpu->ops->alloc_cache(p->cpu, slots, KVH * hd, &err),
               p->gpu->ops->alloc_cache(p->gpu, slots, KVH * hd, &err), slots, KVH * hd, NULL};
    both vc = {p->cpu->ops->alloc_cache(p->cpu, slots, KVH * hd, &err),
               p->gpu->ops->alloc_cache(p->gpu, slots, KVH * hd, &err), slots, KVH * hd, NULL};
    CHECK(kc.c && kc.g && vc.c && vc.g, "caches: %s", err.message);
    lmx_attn_params ap = {n, 0, H, KVH, hd, 0, 1.0f / sqrtf((float)hd), 0};
    lmx_backend *bes[2] = {p->cpu, p->gpu};
    for (int s = 0; s < 2; s++) {
        lmx_backend *be = bes[s];
        lmx_tensor *outs[3] = {s ? q.g : q.c, s ? k.g : k.c, s ? v.g : v.c};
        const lmx_tensor *ws[3] = {s ? wq.g : wq.c, s ? wk.g : wk.c, s ? wv.g : wv.c};
        be->ops->matmul_multi(be, 3, outs, s ? x.g : x.c, ws, n);
        be->ops->qk_prepare(be, outs[0], outs[1], outs[2], s ? qn.g : qn.c, s ? kn.g : kn.c, s ? kc.g : kc.c,
                            s ? vc.g : vc.c, n, hd, 0, rope, 1e-6f, 0);
        be->ops->attention(be, s ? o.g : o.c, outs[0], s ? kc.g : kc.c, s ? vc.g : vc.c, &ap);
    }
    same(p, &o, n, 2e-2f, "attention after packed q, k, v products");
    same(p, &q, n, 2e-2f, "packed q after qk_prepare, widened");
    size_t len = (size_t)n * H * hd, wide = 0; /* packed: every value of q a bf16 one */
    float *g = malloc(len * 4);
    p->gpu->ops->read(p->gpu, g, (size_t)H * hd, q.g, 0, n);
    for (size_t i = 0; i < len; i++) {
        uint32_t u;
        memcpy(&u, &g[i], 4);
        wide += (u & 0xffffu) != 0;
    }
    CHECK(wide == 0, "q after a packed prefill: %zu of %zu values are not bf16 ones", wide, len);
    free(g);
    both *all[] = {&x, &q, &k, &v, &o, &wq, &wk, &wv, &qn, &kn, &kc, &vc};
    for (int i = 0; i < 12; i++)
        drop(p, all[i]);
}

/* Random float32 data [rows, cols] bound on both backends, twice. */
static void twins(pair *p, int rows, int cols, both *a, both *b)
{
    size_t n = (size_t)rows * cols;
    float *d = malloc(n * 4), *e = malloc(n * 4);
    for (size_t i = 0; i < n; i++)
        d[i] = frand();
    memcpy(e, d, n * 4);
    *a = bound(p, rows, cols, d);
    *b = bound(p, rows, cols, e);
}

/* Decode steps at the cache's next positions, whose qk_prepare the GPU
 * folds into the attention kernel (the step's keys written there, q
 * normalized and rotated as it is staged): the same step once folded and
 * once with a read of q between the two ops, which makes the prepare run
 * as its own launch. That read checks q against the CPU. Both runs
 * compute q and the keys by the same code (norm_rope) and round them to
 * bf16; a contraction into FMA that differs between the two kernels can
 * move a value to the neighbouring bf16, far less than check_attention's
 * tolerance, which also stands here. */
static void check_folded_decode(pair *p, both *kc, both *vc, int H, int hd, int pos, int plus_one)
{
    const lmx_rope rope = {1e6f, 1.0f};
    int kv = kc->cols, ns[] = {1, 3, 8};
    both qn = input(p, 1, hd, LMX_DT_BF16, 1.0f), kn = input(p, 1, hd, LMX_DT_BF16, 1.0f);
    for (int i = 0; i < 3; i++) {
        int n = ns[i];
        both q1, q2, k1, k2, v = activations(p, n, kv, 1.0f), o1 = output(p, n, H * hd), o2 = output(p, n, H * hd);
        twins(p, n, H * hd, &q1, &q2);
        twins(p, n, kv, &k1, &k2);
        /* a wrapped cache: a window that keeps the keys read in distinct
         * slots, as lmx_model_cache_slots sizes the ring */
        int window = pos + 8 > kc->rows ? kc->rows - 7 : 0;
        lmx_attn_params ap = {n, pos, H, kv / hd, hd, window, 1.0f / sqrtf((float)hd), 0};
        lmx_backend *g = p->gpu;
        g->ops->qk_prepare(g, q1.g, k1.g, v.g, qn.g, kn.g, kc->g, vc->g, n, hd, pos, rope, 1e-6f, plus_one);
        g->ops->attention(g, o1.g, q1.g, kc->g, vc->g, &ap);
        g->ops->qk_prepare(g, q2.g, k2.g, v.g, qn.g, kn.g, kc->g, vc->g, n, hd, pos, rope, 1e-6f, plus_one);
        p->cpu->ops->qk_prepare(p->cpu, q2.c, k2.c, v.c, qn.c, kn.c, kc->c, vc->c, n, hd, pos, rope, 1e-6f,
                                plus_one);
        char what[96];
        snprintf(what, sizeof what, "qk_prepare hd %d, %d decode rows at %d: q", hd, n, pos);
        same(p, &q2, n, 1e-5f, what);
        g->ops->attention(g, o2.g, q2.g, kc->g, vc->g, &ap);
        size_t len = (size_t)n * H * hd;
        float *a = malloc(len * 4), *b = malloc(len * 4), worst = 0;
        g->ops->read(g, a, (size_t)H * hd, o1.g, 0, n);
        g->ops->read(g, b, (size_t)H * hd, o2.g, 0, n);
        for (size_t j = 0; j < len; j++)
            worst = isfinite(a[j]) ? fmaxf(worst, fabsf(a[j] - b[j])) : INFINITY;
        CHECK(worst <= (0x1p-9f + 2e-5f) * fmaxf(1.0f, test_max_abs(b, len)),
              "attention hd %d, %d decode rows at %d, qk_prepare folded in: %g from the unfolded step", hd, n, pos,
              (double)worst);
        free(a);
        free(b);
        both *all[] = {&q1, &q2, &k1, &k2, &v, &o1, &o2};
        for (int j = 0; j < 7; j++)
            drop(p, all[j]);
    }
    drop(p, &qn);
    drop(p, &kn);
}

/* Attention over a cache filled by qk_prepare (q/k norms, RoPE at large
 * positions with two RoPE settings), the GPU's in bf16 (alloc_cache), the
 * CPU's float32 one rounded to bf16 afterwards, and q rounded to bf16 on
 * both: the GPU's tensor-core kernels round q, k, v and p to bf16, and
 * only p's rounding is left to tell the two apart. Rounding p (float32,
 * relative error at most 2^-9 in round-to-nearest) moves each output
 * element o = sum p v / sum p by at most 2^-9 max |v|; k, computed in
 * float32 by both backends (within ~1e-6), can round to neighbouring bf16
 * values now and then, a score change of ~scale * 2^-8 |q k| on one key of
 * many, and the float32 sums differ by ~1e-6: 2e-5 covers both. The SIMT
 * prefill kernel keeps q and p in float32: 2e-4. Caches: a ring that
 * wrapped (positions 0 .. 1599 in 1100 slots), deep ones (5000 positions:
 * decode spans many splits); GQA ratios 1, 2, 4, 8; head_dim 64, 128,
 * 256, and 96 (a head_dim below the decode kernel's tile: its generic
 * instance); decode of 1 to 8 rows at depths from 0 to 5000 (the keys past them
 * in the cache masked), prefill sizes that are no multiple of the tiles,
 * sliding windows, softcap. */
static void check_attention(pair *p)
{
    const struct {
        int hd, H, KVH, slots, fill;
    } cfgs[] = {{128, 8, 2, 1100, 1600}, {256, 8, 2, 1100, 1600}, {64, 4, 4, 5100, 5000}, {128, 8, 4, 5100, 5000},
                {256, 4, 1, 5100, 5000}, {128, 16, 2, 600, 600}, {96, 4, 2, 600, 600}};
    const struct {
        int n, pos0, window; /* pos0 < 0: that far back from the last position written */
        float softcap;
    } cases[] = {{1, -1, 1000, 0}, {2, -2, 1000, 0}, {5, -5, 512, 0}, {8, -8, 0, 0},  {1, -1, 7, 50},
                 {3, -3, 100, 30}, {1, 0, 0, 0},     {6, 0, 0, 0},    {1, 300, 0, 0}, {4, 296, 0, 0},
                 {7, 400, 50, 0},  {9, 0, 0, 0},     {130, 0, 0, 0},  {64, -64, 1000, 0}, {64, -64, 300, 30},
                 {77, -77, 0, 0},  {300, -300, 800, 0}};
    const int n_cases = (int)(sizeof cases / sizeof *cases), n_q = 300;
    for (int c = 0; c < (int)(sizeof cfgs / sizeof *cfgs); c++) {
        int hd = cfgs[c].hd, H = cfgs[c].H, KVH = cfgs[c].KVH, slots = cfgs[c].slots, fill = cfgs[c].fill;
        int kv = KVH * hd;
        lmx_error err = {0};
        both kc = {p->cpu->ops->alloc_cache(p->cpu, slots, kv, &err), p->gpu->ops->alloc_cache(p->gpu, slots, kv, &err),
                   slots, kv, NULL};
        both vc = {p->cpu->ops->alloc_cache(p->cpu, slots, kv, &err), p->gpu->ops->alloc_cache(p->gpu, slots, kv, &err),
                   slots, kv, NULL};
        CHECK(kc.c && kc.g && vc.c && vc.g, "caches: %s", err.message);
        both o = output(p, n_q, H * hd), q = input(p, n_q, H * hd, LMX_DT_F32, 1.0f);
        fill_caches(p, &q, &kc, &vc, hd, fill, c & 1);
        both qr = bound(p, n_q, H * hd, cpu_rounded(p, q.c, n_q, H * hd));
        drop(p, &q); /* a float32 matrix held would keep the prefill output in float32 */
        float worst[2] = {0, 0}; /* decode, prefill */
        for (int k = 0; k < n_cases; k++) {
            int n = cases[k].n, pos0 = cases[k].pos0 < 0 ? fill + cases[k].pos0 : cases[k].pos0;
            lmx_attn_params ap = {n, pos0, H, KVH, hd, cases[k].window, 1.0f / sqrtf((float)hd), cases[k].softcap};
            p->cpu->ops->attention(p->cpu, o.c, qr.c, kc.c, vc.c, &ap);
            p->gpu->ops->attention(p->gpu, o.g, qr.g, kc.g, vc.g, &ap);
            char what[128];
            snprintf(what, sizeof what, "attention hd %d heads %d/%d rows %d at %d window %d softcap %g", hd, H, KVH, n,
                     pos0, cases[k].window, (double)cases[k].softcap);
            /* tensor cores for decode, and for prefill with head_dim 64, 128 or 256
             * (unless LMX_CUDA_ATTN=simt), whose output is kept in bf16 only (one
             * more rounding of 2^-9) */
            const char *attn = getenv("LMX_CUDA_ATTN");
            int tc = n <= 8 || ((hd == 64 || hd == 128 || hd == 256) && !(attn && !strcmp(attn, "simt")));
            float tol = !tc ? 2e-4f : n <= 8 ? 0x1p-9f + 2e-5f : 0x1p-8f + 2e-5f;
            float e = same(p, &o, n, tol, what); /* max |v| <= 1 */
            worst[n > 8] = fmaxf(worst[n > 8], e);
        }
        check_folded_decode(p, &kc, &vc, H, hd, fill, c & 1);
        printf("attention hd %d heads %d/%d, %d positions in %d slots: worst relative error decode %.2e, prefill "
               "%.2e\n",
               hd, H, KVH, fill, slots, (double)worst[0], (double)worst[1]);
        drop(p, &kc);
        drop(p, &vc);
        drop(p, &o);
        drop(p, &qr);
    }
}

/* Decode rows from attention into a q8/q4 GEMV: the attention kernels
 * hand the GEMV its input quantized (one split writing the output, and
 * several merged), as check_quantized's norms do. */
static void check_attention_quantized(pair *p, int bits)
{
    const int hd = 128, H = 8, KVH = 2, slots = 600, kv = KVH * hd, N = 256;
    const int cases[][2] = {{1, 599}, {3, 597}, {1, 5}}; /* rows, first position: merged splits, merged, one */
    lmx_error err = {0};
    both kc = {p->cpu->ops->alloc_cache(p->cpu, slots, kv, &err), p->gpu->ops->alloc_cache(p->gpu, slots, kv, &err),
               slots, kv, NULL};
    both vc = {p->cpu->ops->alloc_cache(p->cpu, slots, kv, &err), p->gpu->ops->alloc_cache(p->gpu, slots, kv, &err),
               slots, kv, NULL};
    CHECK(kc.c && kc.g && vc.c && vc.g, "caches: %s", err.message);
    both q = activations(p, 100, H * hd, 1.0f), a = output(p, 8, H * hd), y = output(p, 8, N);
    both w = input(p, N, H * hd, LMX_DT_BF16, 0.05f);
    fill_caches(p, &q, &kc, &vc, hd, slots, 0);
    both qr = bound(p, 100, H * hd, cpu_rounded(p, q.c, 100, H * hd));
    for (int k = 0; k < 3; k++) {
        lmx_attn_params ap = {cases[k][0], cases[k][1], H, KVH, hd, 0, 1.0f / sqrtf((float)hd), 0};
        p->cpu->ops->attention(p->cpu, a.c, qr.c, kc.c, vc.c, &ap);
        p->gpu->ops->attention(p->gpu, a.g, qr.g, kc.g, vc.g, &ap);
        p->cpu->ops->matmul(p->cpu, y.c, a.c, w.c, ap.n_rows);
        p->gpu->ops->matmul(p->gpu, y.g, a.g, w.g, ap.n_rows);
        char what[96];
        snprintf(what, sizeof what, "q%d matmul of attention rows %d at %d", bits, ap.n_rows, ap.pos0);
        same(p, &y, ap.n_rows, 1e-2f, what);
    }
    drop(p, &kc);
    drop(p, &vc);
    drop(p, &q);
    drop(p, &qr);
    drop(p, &a);
    drop(p, &y);
    drop(p, &w);
}

/* Fixtures: logits against transformers -------------------------------------- */

static float worst_seen[5]; /* per way of running the prompt */
static int mode_now;

/* One row: `n` reference logits `want` at ids (NULL: all V). The top-1 must
 * agree where the reference's margin exceeds twice the tolerance. */
static void check_row(const char *tag, int pos, const float *ours, const float *want, const int32_t *ids, int n, int V)
{
    float scale = fmaxf(1.0f, test_max_abs(want, (size_t)n)), worst = 0;
    int best = 0;
    for (int j = 0; j < n; j++) {
        float o = ours[ids ? ids[j] : j];
        worst = fmaxf(worst, isfinite(o) ? fabsf(o - want[j]) : INFINITY);
        best = want[j] > want[best] ? j : best;
    }
    worst /= scale;
    worst_seen[mode_now] = fmaxf(worst_seen[mode_now], worst);
    CHECK(worst <= LOGIT_TOL, "%s pos %d: relative error %g > %g", tag, pos, worst, LOGIT_TOL);
    float second = -INFINITY;
    for (int j = 0; j < n; j++)
        if (j != best && want[j] > second)
            second = want[j];
    int top = ids ? ids[best] : best;
    if (want[best] - second > fmaxf(0.05f, 2 * LOGIT_TOL * scale))
        CHECK(test_argmax(ours, V) == top, "%s pos %d: top-1 %d, want %d", tag, pos, test_argmax(ours, V), top);
}

/* The top-1 margin under which a greedy step may pick another id. */
static float greedy_margin(const float *last, int V)
{
    (void)last, (void)V;
    return 0.05f;
}

static void check_prompt(lmx_model *m, lmx_st_set *r, int k, int chunk, int rows, const char *name)
{
    const lmx_st_tensor *ids_t = test_ref(r, k, "ids");
    int L = (int)ids_t->shape[0], V = lmx_model_vocab_size(m);
    const int32_t *ids = ids_t->data;
    float *logits = malloc((size_t)L * V * sizeof(float));
    lmx_context *c = test_eval_prompt(m, ids, L, chunk, rows, logits);
    if (!c) {
        free(logits);
        return;
    }
    char tag[96];
    snprintf(tag, sizeof tag, "cuda %s p%d chunk %d rows %d", name, k, chunk, rows);
    const lmx_st_tensor *full = test_ref(r, k, "logits");
    for (int p = 0; p < L; p++) {
        const float *ours = logits + (size_t)p * V;
        if (full)
            check_row(tag, p, ours, (const float *)full->data + (size_t)p * V, NULL, V, V);
        else
            check_row(tag, p, ours, (const float *)test_ref(r, k, "top_vals")->data + p * 8,
                      (const int32_t *)test_ref(r, k, "top_ids")->data + p * 8, 8, V);
    }
    if (!full)
        check_row(tag, L - 1, logits + (size_t)(L - 1) * V, test_ref(r, k, "logits_last")->data, NULL, V, V);
    if (chunk == 0) { /* greedy continuation: one-token steps, recorded and replayed */
        test_greedy(m, c, rows, ids, L, logits + (size_t)(L - 1) * V, V, test_ref(r, k, "greedy"),
                    test_ref(r, k, "margin")->data, greedy_margin, tag);
        test_sampled(m, rows, ids, L, 6, tag);
        CHECK(test_drawn(m, rows, ids, L, 6, tag) == 18, "%s: not every draw was made on the GPU", tag);
    }
    lmx_context_free(c);
    free(logits);
}

static void check_fixture(const char *name)
{
    char dir[512], path[600];
    snprintf(dir, sizeof dir, "%s/%s", LMX_TEST_DATA, name);
    snprintf(path, sizeof path, "%s/refs.safetensors", dir);
    lmx_error err = {0};
    lmx_load_options o = lmx_load_defaults();
    o.device = LMX_DEVICE_CUDA;
    lmx_model *m = lmx_load(dir, &o, &err);
    CHECK(m != NULL, "load %s on cuda: %s", name, err.message);
    lmx_st_set *r = NULL;
    CHECK(lmx_st_open_file(path, &r, &err) == LMX_OK, "refs %s: %s", name, err.message);
    const int modes[5][2] = {{0, 64}, {1, 64}, {5, 64}, {0, 3}, {5, 2}}; /* {call chunk, context rows} */
    memset(worst_seen, 0, sizeof worst_seen);
    for (int k = 0; m && r && test_ref(r, k, "ids"); k++)
        for (mode_now = 0; mode_now < 5; mode_now++)
            check_prompt(m, r, k, modes[mode_now][0], modes[mode_now][1], name);
    printf("%s: worst relative logit error (tolerance %.0e): whole %.2e, token by token %.2e, chunks of 5 "
           "%.2e, 3-row chunks %.2e, 5 in 2-row chunks %.2e\n",
           name, (double)LOGIT_TOL, (double)worst_seen[0], (double)worst_seen[1], (double)worst_seen[2],
           (double)worst_seen[3], (double)worst_seen[4]);
    lmx_st_close(r);
    lmx_close(m);
}

/* Logits at L positions of a fixed prompt: whole (prefill) or token by
 * token (decode, graph replay). */
enum { QL = 20 };
static float *quant_logits(const char *dir, int device, int bits, int one, int *V)
{
    lmx_load_options o = lmx_load_defaults();
    o.device = device;
    o.quant = bits;
    lmx_error err = {0};
    lmx_model *m = lmx_load(dir, &o, &err);
    CHECK(m != NULL, "load %s q%d: %s", dir, bits, err.message);
    if (!m)
        return NULL;
    *V = lmx_model_vocab_size(m);
    int32_t ids[QL];
    test_fixed_ids(ids, QL, *V);
    float *lg = malloc((size_t)QL * *V * sizeof(float));
    lmx_context *c = lmx_context_new(m, 64, &err);
    CHECK(c && lg, "context: %s", err.message);
    for (int i = 0; c && lg && i < (one ? QL : 1); i++)
        CHECK(lmx_context_eval(c, ids + i, one ? 1 : QL, lg + (size_t)i * *V, 1, &err) == LMX_OK, "eval: %s",
              err.message);
    lmx_context_free(c);
    lmx_close(m);
    return lg;
}

/* Worst over the positions of max |a - b| relative to max(1, max |b|). */
static float logit_error(const float *a, const float *b, int V)
{
    float worst = 0;
    for (int p = 0; p < QL; p++) {
        const float *x = a + (size_t)p * V, *y = b + (size_t)p * V;
        float e = 0;
        for (int i = 0; i < V; i++)
            e = fmaxf(e, isfinite(x[i]) ? fabsf(x[i] - y[i]) : INFINITY);
        worst = fmaxf(worst, e / fmaxf(1.0f, test_max_abs(y, (size_t)V)));
    }
    return worst;
}

/* A fixture quantized on load on both devices, against the unquantized
 * model on the CPU: the CUDA model's error must be about the CPU model's.
 * (Their distance from each other is printed, not bounded: it adds two
 * independent errors, the CPU's SIMD paths differ among themselves by a
 * few percent in q8 decode as x's 8-bit steps flip differently, and the
 * GPU's attention rounds q, k, v and p to bf16.) */
static void check_fixture_quantized(const char *name, int bits)
{
    char dir[512];
    snprintf(dir, sizeof dir, "%s/%s", LMX_TEST_DATA, name);
    for (int one = 0; one < 2; one++) {
        int V = 0;
        float *ref = quant_logits(dir, LMX_DEVICE_CPU, 0, one, &V), *c = quant_logits(dir, LMX_DEVICE_CPU, bits, one, &V);
        float *g = quant_logits(dir, LMX_DEVICE_CUDA, bits, one, &V);
        if (ref && c && g) {
            float ec = logit_error(c, ref, V), eg = logit_error(g, ref, V), d = logit_error(g, c, V);
            const char *how = one ? "token by token" : "whole";
            printf("cuda %s q%d %s: relative error against unquantized %.2e (cpu %.2e), against the cpu %.2e\n",
                   name, bits, how, eg, ec, d);
            CHECK(eg <= 1.5f * ec + 5e-3f, "cuda %s q%d %s: error %g, the cpu's %g", name, bits, how, eg, ec);
        }
        free(ref);
        free(c);
        free(g);
    }
}

/* read_argmax on rows of Qwen3's vocabulary size: random; a largest value
 * planted in three blocks' shares (the first wins); NaN at the front and
 * scattered; all -inf; all NaN; NaN but for the last element. Both
 * backends must give exactly src/argmax.h's choice and its score. */
static void check_argmax(pair *p)
{
    enum { ROWS = 6, V = 151936 };
    float *d = malloc((size_t)ROWS * V * 4), nan = NAN;
    for (size_t i = 0; i < (size_t)ROWS * V; i++)
        d[i] = frand() * 20;
    float *r = d + V;
    r[70001] = r[129999] = r[150000] = 25;
    r = d + 2 * V;
    for (int i = 0; i < V; i += 97)
        r[i] = nan;
    r = d + 3 * V;
    for (int i = 0; i < V; i++)
        r[i] = -INFINITY;
    r = d + 4 * V;
    for (int i = 0; i < V; i++)
        r[i] = nan;
    r = d + 5 * V;
    for (int i = 0; i < V; i++)
        r[i] = i + 1 < V ? nan : -3.0f;
    both b = bound(p, ROWS, V, d);
    for (int row = 0; row < ROWS; row++) {
        int32_t want = lmx_argmax(d + (size_t)row * V, V), cc = -1, gc = -1;
        float ws = d[(size_t)row * V + want], cs = 0, gs = 0;
        p->cpu->ops->read_argmax(p->cpu, &cs, &cc, b.c, row);
        p->gpu->ops->read_argmax(p->gpu, &gs, &gc, b.g, row);
        int same_score = (gs == ws) || (gs != gs && ws != ws);
        CHECK(gc == want && same_score, "argmax row %d: gpu %d (%g), want %d (%g)", row, gc, gs, want, ws);
        CHECK(cc == want, "argmax row %d: cpu %d, want %d", row, cc, want);
    }
    CHECK(lmx_argmax(d + V, V) == 70001, "planted tie: %d", lmx_argmax(d + V, V));
    drop(p, &b);
}

/* read_topk: each GPU group must be exactly lmx_top_scores of its slice
 * (the split backend.h names), on rows of Qwen3's and Gemma3's vocabulary
 * sizes and a short one: random; few distinct values (ties everywhere,
 * zeros of both signs); NaN scattered; all -inf; all NaN; NaN but one. */
static void check_topk(pair *p)
{
    enum { ROWS = 7, MAXV = 262144 };
    const int sizes[] = {151936, 262144, 1000};
    const float pool[] = {0.0f, -0.0f, 1, -1, 2.5f};
    float *d = malloc((size_t)ROWS * MAXV * 4), nan = NAN;
    lmx_scored *got = malloc((size_t)LMX_TOPK_GROUPS * LMX_TOPK_MAX * sizeof *got), want[LMX_TOPK_MAX];
    for (int vs = 0; vs < 3 && d && got; vs++) {
        int V = sizes[vs];
        for (int row = 0; row < ROWS; row++)
            for (int i = 0; i < V; i++) {
                float *x = d + (size_t)row * V + i;
                *x = row == 1 ? pool[(unsigned)(frand() * 1e6f) % 5]
                   : row == 2 && i % 97 == 0 ? nan
                   : row == 3 ? -INFINITY
                   : row == 4 || (row == 5 && i != V / 3) ? nan
                   : row == 6 ? (float)(i % 50) : frand() * 20;
            }
        both b = bound(p, ROWS, V, d);
        for (int row = 0; row < ROWS; row++)
            for (int k = 1; k <= LMX_TOPK_MAX; k = k * 4 + 1) { /* 1, 5, 21, 85 */
                int groups = p->gpu->ops->read_topk(p->gpu, got, k, b.g, row), bad = 0;
                CHECK(groups == LMX_TOPK_GROUPS, "topk: %d groups", groups);
                for (int g = 0; g < groups && !bad; g++) {
                    int lo = (int)((long)g * V / groups), hi = (int)((long)(g + 1) * V / groups);
                    lmx_top_scores(d + (size_t)row * V + lo, hi - lo, k, want);
                    for (int j = 0; j < k && !bad; j++) {
                        lmx_scored w = want[j], o = got[(size_t)g * k + j];
                        w.col = w.col >= 0 ? w.col + lo : -1;
                        bad = o.col != w.col || !(o.score == w.score || (o.score != o.score && w.score != w.score));
                        CHECK(!bad, "topk V %d row %d k %d group %d entry %d: %g @%d, want %g @%d", V, row, k, g, j,
                              o.score, o.col, w.score, w.col);
                    }
                }
            }
        b.host = NULL; /* d is refilled for the next size, freed below */
        drop(p, &b);
    }
    free(d);
    free(got);
}

/* read_draw: the GPU draws the token the host sampler draws from the same
 * row with the same uniform number (two samplers of one seed), for a
 * temperature alone and with min-p, on rows of Qwen3's and Gemma3's
 * vocabulary sizes and of sizes that leave a short last block and a tail
 * past its last 8 tokens: random; NaN scattered and +inf twice (they share
 * the mass); all -inf; all NaN; one finite score. The first step of each
 * row runs eagerly, the second is recorded, the rest replay the
 * recording with new draws. */
static void check_draw(pair *p)
{
    enum { ROWS = 5, MAXV = 262144, DRAWS = 40 };
    const int sizes[] = {151936, 262144, 70003, 1001};
    const float temps[] = {1.0f, 0.7f, 1.6f}, min_ps[] = {0, 0.05f, 0.5f};
    float *d = malloc((size_t)ROWS * MAXV * 4), *row = malloc((size_t)MAXV * 4), nan = NAN;
    lmx_backend *be = p->gpu;
    int32_t ids[1] = {0};
    for (int vs = 0; vs < 4 && d && row; vs++) {
        int V = sizes[vs];
        for (int r = 0; r < ROWS; r++)
            for (int i = 0; i < V; i++)
                d[(size_t)r * V + i] = r == 1 ? (i % 89 == 0 ? nan : i == V / 2 || i == V - 1 ? INFINITY : frand() * 8)
                                     : r == 2 ? -INFINITY
                                     : r == 3 ? nan
                                     : r == 4 ? (i == V - 3 ? 1.5f : -INFINITY)
                                              : frand() * 8;
        both b = bound(p, ROWS, V, d);
        for (int r = 0; r < ROWS; r++)
            for (int c = 0; c < 9; c++) {
                lmx_sampler_params sp = {temps[c % 3], 0, 1, min_ps[c / 3], 1, (uint64_t)(1000 * vs + 10 * r + c)};
                lmx_sampler *host = NULL, *gpu = NULL;
                lmx_error err = {0};
                lmx_sampler_new(&sp, V, &host, &err);
                lmx_sampler_new(&sp, V, &gpu, &err);
                CHECK(host && gpu && lmx_sampler_draws_dense(gpu), "draw: sampler: %s", err.message);
                int bad = 0;
                for (int k = 0; k < DRAWS && host && gpu && !bad; k++) {
                    memcpy(row, d + (size_t)r * V, (size_t)V * 4);
                    int32_t want = lmx_sampler_sample(host, row, NULL, 0), got = -1;
                    lmx_draw dr = lmx_sampler_next_draw(gpu);
                    be->ops->step_begin(be, d + (size_t)r * V, 4, ids, 1, 0, &dr); /* one recording a row */
                    be->ops->read_draw(be, &got, b.g, r);
                    lmx_status st = be->ops->step_end(be, &err);
                    bad = st != LMX_OK || got != want;
                    CHECK(!bad, "draw V %d row %d T %g min-p %g draw %d: gpu %d (%s), host %d", V, r,
                          sp.temperature, sp.min_p, k, got, st ? err.message : "ok", want);
                }
                lmx_sampler_free(host);
                lmx_sampler_free(gpu);
            }
        b.host = NULL; /* d is refilled for the next size, freed below */
        drop(p, &b);
    }
    free(d);
    free(row);
}

#ifdef LMX_HAVE_CUDA
/* Out of GPU memory. A hog takes every byte it can get (one block as large
 * as will go, then halves down to 64 KiB), so lmx's next allocation fails. */
typedef struct hog {
    void *p[256];
    int n;
} hog;

static size_t gpu_free(void)
{
    size_t free_b = 0, total_b = 0;
    cudaMemGetInfo(&free_b, &total_b);
    return free_b;
}

static void hog_fill(hog *h)
{
    h->n = 0;
    for (size_t size = gpu_free(); size >= (64u << 10) && h->n < 256;) {
        if (cudaMalloc(&h->p[h->n], size) == cudaSuccess) {
            h->n++;
        } else {
            cudaGetLastError(); /* ours, not lmx's to see */
            size /= 2;
        }
    }
}

static void hog_free(hog *h)
{
    while (h->n)
        cudaFree(h->p[--h->n]);
}

/* Prefill of the first QL - 3 ids, then three one-token steps (eager,
 * recorded, replayed): the last step's logits into `out`. With a hog
 * given, the GPU is filled before each call; a call that fails must say
 * why (LMX_ERR_NOMEM) and leave the context as it was, and is retried once
 * the hog is gone. Returns the number of calls that failed. */
static int steps_while_full(lmx_context *c, const int32_t *ids, float *out, hog *h)
{
    int failed = 0;
    for (int at = 0; at < QL;) {
        int n = at ? 1 : QL - 3, len = lmx_context_length(c);
        lmx_error err = {0};
        if (h)
            hog_fill(h);
        lmx_status st = lmx_context_eval(c, ids + at, n, out, 0, &err);
        if (h)
            hog_free(h);
        if (st != LMX_OK) {
            failed++;
            CHECK(h && st == LMX_ERR_NOMEM && err.message[0], "eval at %d: status %d: %s", at, st, err.message);
            CHECK(lmx_context_length(c) == len, "a failed eval moved the context from %d to %d", len,
                  lmx_context_length(c));
            printf("cuda out of memory: eval of %d at %d: %s\n", n, at, err.message);
            if (!h)
                return failed;
            st = lmx_context_eval(c, ids + at, n, out, 0, &err);
            CHECK(st == LMX_OK, "eval at %d after the memory came back: %s", at, err.message);
        }
        at += n;
    }
    return failed;
}

/* Weights larger than the GPU's memory (a sparse checkpoint): loading
 * fails before it uploads any, saying what they take and what to do; and
 * so does a context whose KV cache is larger, before allocating any. */
static void check_too_large(void)
{
    size_t free_b = 0, total_b = 0;
    cudaMemGetInfo(&free_b, &total_b);
    char dir[600];
    snprintf(dir, sizeof dir, "%s/too-large", test_tmpdir());
    size_t bytes = test_write_sparse_model(dir, total_b * 3 / 2);
    CHECK(bytes > total_b, "sparse checkpoint in %s: %zu bytes", dir, bytes);
    lmx_load_options o = lmx_load_defaults();
    o.device = LMX_DEVICE_CUDA;
    lmx_error err = {0};
    lmx_model *m = lmx_load(dir, &o, &err);
    CHECK(!m && err.code == LMX_ERR_NOMEM && strstr(err.message, "GB on GPU 0") && strstr(err.message, "--quant"),
          "%zu bytes of weights on the GPU: %s", bytes, m ? "loaded" : err.message);
    printf("cuda too large: %s\n", err.message);
    lmx_close(m);
    CHECK(gpu_free() >= free_b, "a refused load kept %lld bytes", (long long)free_b - (long long)gpu_free());
    /* one layer of it fits; its KV cache for every position does not */
    snprintf(dir, sizeof dir, "%s/one-layer", test_tmpdir());
    CHECK(test_write_sparse_model(dir, 0) > 0, "sparse checkpoint in %s", dir);
    m = lmx_load(dir, &o, &err);
    CHECK(m != NULL, "load %s: %s", dir, err.message);
    lmx_context *c = m ? lmx_context_new(m, TEST_SPARSE_POSITIONS, &err) : NULL;
    CHECK(!c && err.code == LMX_ERR_NOMEM && strstr(err.message, "KV cache of") && strstr(err.message, "GPU 0"),
          "a context of %d positions: %s", TEST_SPARSE_POSITIONS, c ? "made" : err.message);
    printf("cuda too large: %s\n", err.message);
    lmx_context_free(c);
    lmx_close(m);
}

/* With the GPU full: loading a model and making a context fail with
 * LMX_ERR_NOMEM and an error naming the allocation; steps of a context
 * fail the same way or succeed, and once the memory is back the context
 * computes what a context never short of memory does. Everything is given
 * back: the free memory after is no less than before. */
static void check_out_of_memory(void)
{
    char dir[512];
    snprintf(dir, sizeof dir, "%s/qwen3-tiny", LMX_TEST_DATA);
    lmx_load_options o = lmx_load_defaults();
    o.device = LMX_DEVICE_CUDA;
    lmx_error err = {0};
    /* the reference; it also makes the driver's one-time allocations */
    lmx_model *m = lmx_load(dir, &o, &err);
    CHECK(m != NULL, "load %s: %s", dir, err.message);
    if (!m)
        return;
    int V = lmx_model_vocab_size(m);
    int32_t ids[QL];
    test_fixed_ids(ids, QL, V);
    float *want = malloc((size_t)V * sizeof *want), *got = malloc((size_t)V * sizeof *got);
    lmx_context *c = lmx_context_new(m, 64, &err);
    CHECK(c && steps_while_full(c, ids, want, NULL) == 0, "reference steps: %s", err.message);
    lmx_context_free(c);
    lmx_close(m);
    size_t free0 = gpu_free();

    hog h;
    hog_fill(&h);
    m = lmx_load(dir, &o, &err);
    hog_free(&h);
    CHECK(!m && err.code == LMX_ERR_NOMEM, "load with the GPU full: %s", m ? "loaded" : err.message);
    printf("cuda out of memory: load: %s\n", err.message);
    lmx_close(m);
    CHECK(gpu_free() >= free0, "a failed load kept %lld bytes", (long long)free0 - (long long)gpu_free());

    m = lmx_load(dir, &o, &err);
    CHECK(m != NULL, "load %s: %s", dir, err.message);
    hog_fill(&h);
    c = lmx_context_new(m, 64, &err);
    hog_free(&h);
    CHECK(!c && err.code == LMX_ERR_NOMEM, "context with the GPU full: %s", c ? "made" : err.message);
    printf("cuda out of memory: context: %s\n", err.message);
    lmx_context_free(c);
    c = lmx_context_new(m, 64, &err);
    CHECK(c != NULL, "context: %s", err.message);
    if (c && want && got) {
        int failed = steps_while_full(c, ids, got, &h);
        float e = 0;
        for (int i = 0; i < V; i++)
            e = fmaxf(e, fabsf(got[i] - want[i]));
        e /= fmaxf(1.0f, test_max_abs(want, (size_t)V));
        printf("cuda out of memory: %d of 4 evals failed; logits after against the reference: %.2e\n", failed, e);
        CHECK(failed >= 1, "no eval ran short of memory, so none was retried"); /* 2 on an H100 */
        CHECK(e <= 1e-5f, "logits after running out of memory: relative error %g", e);
    }
    lmx_context_free(c);
    lmx_close(m);
    CHECK(gpu_free() >= free0, "running out of memory kept %lld bytes", (long long)free0 - (long long)gpu_free());
    free(want);
    free(got);
}
#endif

int main(void)
{
    if (!lmx_backend_cuda_available()) {
#ifdef LMX_HAVE_CUDA
        printf("skipped: no CUDA device\n");
#else
        printf("skipped: lmx was built without CUDA\n");
#endif
        return 77;
    }
    lmx_error err = {0};
    lmx_load_options cpu_opts = lmx_load_defaults();
    pair p = {lmx_backend_cpu_new(&cpu_opts, &err), NULL};
    if (p.cpu)
        p.gpu = lmx_backend_cuda_new(0, 0, &err);
    CHECK(p.cpu && p.gpu, "backends: %s", err.message);
    if (p.cpu && p.gpu) {
        check_matmul(&p);
        check_fused_matmuls(&p);
        check_slot_rows(&p, 1e-4f, "bf16");
        check_stale_gate(&p);
        check_lean_norms(&p);
        check_packed_qkv(&p);
        check_elementwise(&p, 2048, 128);
        check_elementwise(&p, 6000, 128);
        check_elementwise(&p, 1001, 7);
        check_elementwise(&p, 12000, 96);
        check_attention(&p);
        check_argmax(&p);
        check_topk(&p);
        check_draw(&p);
    }
    if (p.gpu)
        p.gpu->ops->destroy(p.gpu);
    if (p.cpu)
        p.cpu->ops->destroy(p.cpu);
    for (int bits = 8; bits >= 4; bits -= 4) {
        cpu_opts.quant = bits;
        pair q = {lmx_backend_cpu_new(&cpu_opts, &err), NULL};
        if (q.cpu)
            q.gpu = lmx_backend_cuda_new(0, bits, &err);
        CHECK(q.cpu && q.gpu, "quantizing backends: %s", err.message);
        if (q.cpu && q.gpu) {
            check_quantized(&q, bits);
            check_slot_rows(&q, 1e-2f, bits == 8 ? "q8" : "q4");
            check_attention_quantized(&q, bits);
        }
        if (q.gpu)
            q.gpu->ops->destroy(q.gpu);
        if (q.cpu)
            q.cpu->ops->destroy(q.cpu);
        check_fixture_quantized("qwen3-small", bits);
        check_fixture_quantized("gemma3-small", bits);
    }
    check_fixture("qwen3-small");
    check_fixture("gemma3-small");
    check_fixture("qwen3-tiny");
    check_fixture("gemma3-tiny");
#ifdef LMX_HAVE_CUDA
    check_out_of_memory();
    check_too_large();
#endif
    return test_finish();
}
