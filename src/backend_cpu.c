#include "backend_cpu.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "error.h"
#include "threadpool.h"

struct lmx_tensor {
    int rows, cols;
    lmx_dtype dtype;
    void *data;
    int owned; /* data malloc'd here (activations), not a view of the mapping */
};

typedef struct cpu_backend {
    lmx_backend base;
    lmx_pool *pool;
} cpu_backend;

static lmx_pool *pool_of(lmx_backend *be) { return ((cpu_backend *)be)->pool; }

static float *f32(const lmx_tensor *t) { return (float *)t->data; }

/* Element access for weights in their stored dtype ------------------------ */

static float elem(const lmx_tensor *w, size_t i)
{
    switch (w->dtype) {
    case LMX_DT_BF16: return lmx_bf16_to_f32(((const uint16_t *)w->data)[i]);
    case LMX_DT_F16: return lmx_f16_to_f32(((const uint16_t *)w->data)[i]);
    default: return ((const float *)w->data)[i];
    }
}

/* Eight independent partial sums let the compiler vectorise the loop. */
static float dot_f32(const float *a, const float *b, int n)
{
    float acc[8] = {0};
    int i = 0;
    for (; i + 8 <= n; i += 8)
        for (int k = 0; k < 8; k++)
            acc[k] += a[i + k] * b[i + k];
    float s = 0;
    for (; i < n; i++)
        s += a[i] * b[i];
    for (int k = 0; k < 8; k++)
        s += acc[k];
    return s;
}

static float dot_bf16(const float *a, const uint16_t *b, int n)
{
    float acc[8] = {0};
    int i = 0;
    for (; i + 8 <= n; i += 8)
        for (int k = 0; k < 8; k++)
            acc[k] += a[i + k] * lmx_bf16_to_f32(b[i + k]);
    float s = 0;
    for (; i < n; i++)
        s += a[i] * lmx_bf16_to_f32(b[i]);
    for (int k = 0; k < 8; k++)
        s += acc[k];
    return s;
}

/* Tensors ----------------------------------------------------------------- */

static lmx_tensor *cpu_weight(lmx_backend *be, const lmx_st_tensor *t, lmx_error *err)
{
    if (t->dtype != LMX_DT_F32 && t->dtype != LMX_DT_BF16 && t->dtype != LMX_DT_F16) {
        lmx_fail(err, LMX_ERR_UNSUPPORTED, "%s: tensor '%s' has dtype %s; weights must be F32, F16 or BF16",
                 t->file, t->name, lmx_dtype_name(t->dtype));
        return NULL;
    }
    if ((uintptr_t)t->data % lmx_dtype_size(t->dtype)) {
        lmx_fail(err, LMX_ERR_UNSUPPORTED, "%s: tensor '%s' is not aligned to its %zu-byte elements",
                 t->file, t->name, lmx_dtype_size(t->dtype));
        return NULL;
    }
    int64_t rows = t->ndim >= 2 ? t->shape[0] : 1, cols = 1;
    for (int d = t->ndim >= 2 ? 1 : 0; d < t->ndim; d++)
        cols *= t->shape[d];
    if (rows > INT32_MAX || cols > INT32_MAX) {
        lmx_fail(err, LMX_ERR_UNSUPPORTED, "%s: tensor '%s' is too large", t->file, t->name);
        return NULL;
    }
    lmx_tensor *w = calloc(1, sizeof *w);
    if (!w) {
        lmx_fail(err, LMX_ERR_NOMEM, "out of memory");
        return NULL;
    }
    *w = (lmx_tensor){(int)rows, (int)cols, t->dtype, (void *)t->data, 0};
    return w;
}

static lmx_tensor *cpu_alloc(lmx_backend *be, int rows, int cols, lmx_error *err)
{
    lmx_tensor *t = calloc(1, sizeof *t);
    float *d = calloc((size_t)rows * (size_t)cols, sizeof(float));
    if (!t || !d) {
        free(t);
        free(d);
        lmx_fail(err, LMX_ERR_NOMEM, "cannot allocate a %d x %d activation tensor", rows, cols);
        return NULL;
    }
    *t = (lmx_tensor){rows, cols, LMX_DT_F32, d, 1};
    return t;
}

static void cpu_free(lmx_backend *be, lmx_tensor *t)
{
    if (!t)
        return;
    if (t->owned)
        free(t->data);
    free(t);
}

/* Ops ------------------------------------------------------------------- */

static void cpu_embed(lmx_backend *be, lmx_tensor *out, const lmx_tensor *table, const int32_t *ids,
                      int n_rows, float scale)
{
    for (int i = 0; i < n_rows; i++) {
        float *dst = f32(out) + (size_t)i * out->cols;
        size_t base = (size_t)ids[i] * table->cols;
        for (int j = 0; j < out->cols; j++)
            dst[j] = elem(table, base + j) * scale;
    }
}

static void cpu_rmsnorm(lmx_backend *be, lmx_tensor *out, const lmx_tensor *x, const lmx_tensor *w,
                        int n_rows, float eps, int plus_one)
{
    int dim = w->cols;
    size_t n_vec = (size_t)n_rows * (size_t)x->cols / (size_t)dim;
    for (size_t v = 0; v < n_vec; v++) {
        const float *src = f32(x) + v * dim;
        float *dst = f32(out) + v * dim;
        double ss = 0;
        for (int j = 0; j < dim; j++)
            ss += (double)src[j] * src[j];
        float r = 1.0f / sqrtf((float)(ss / dim) + eps);
        for (int j = 0; j < dim; j++)
            dst[j] = src[j] * r * (plus_one ? 1.0f + elem(w, (size_t)j) : elem(w, (size_t)j));
    }
}

typedef struct matmul_job {
    float *out;
    const float *x;
    const lmx_tensor *w;
    int n_rows;
} matmul_job;

enum { MATMUL_BLOCK = 16, MATMUL_TILE = 512 };

/* One task: MATMUL_BLOCK rows of w against every row of x. Weights stored
 * as 16-bit floats are widened a tile at a time into a stack buffer, so each
 * is converted once however many rows x has. */
static void matmul_task(void *ctx, int task)
{
    const matmul_job *j = ctx;
    const lmx_tensor *w = j->w;
    int K = w->cols, N = w->rows;
    int r0 = task * MATMUL_BLOCK, r1 = r0 + MATMUL_BLOCK < N ? r0 + MATMUL_BLOCK : N;
    float buf[MATMUL_TILE];
    for (int r = r0; r < r1; r++) {
        if (w->dtype == LMX_DT_BF16 && j->n_rows == 1) {
            j->out[r] = dot_bf16(j->x, (const uint16_t *)w->data + (size_t)r * K, K);
            continue;
        }
        if (w->dtype == LMX_DT_F32) {
            const float *wr = (const float *)w->data + (size_t)r * K;
            for (int i = 0; i < j->n_rows; i++)
                j->out[(size_t)i * N + r] = dot_f32(j->x + (size_t)i * K, wr, K);
            continue;
        }
        for (int i = 0; i < j->n_rows; i++)
            j->out[(size_t)i * N + r] = 0;
        for (int k0 = 0; k0 < K; k0 += MATMUL_TILE) {
            int len = K - k0 < MATMUL_TILE ? K - k0 : MATMUL_TILE;
            for (int k = 0; k < len; k++)
                buf[k] = elem(w, (size_t)r * K + k0 + k);
            for (int i = 0; i < j->n_rows; i++)
                j->out[(size_t)i * N + r] += dot_f32(j->x + (size_t)i * K + k0, buf, len);
        }
    }
}

static void cpu_matmul(lmx_backend *be, lmx_tensor *out, const lmx_tensor *x, const lmx_tensor *w,
                       int n_rows)
{
    matmul_job j = {f32(out), f32(x), w, n_rows};
    lmx_pool_run(pool_of(be), (w->rows + MATMUL_BLOCK - 1) / MATMUL_BLOCK, matmul_task, &j);
}

/* The inverse frequencies as transformers computes them, in float32:
 * 1 / theta^(2i/d), divided by the linear factor. */
static void rope_inv_freq(float *inv, int head_dim, lmx_rope rope)
{
    for (int i = 0; i < head_dim / 2; i++) {
        float e = (float)(2 * i) / (float)head_dim;
        inv[i] = 1.0f / powf(rope.theta, e);
        if (rope.factor != 1.0f)
            inv[i] /= rope.factor;
    }
}

static void cpu_rope(lmx_backend *be, lmx_tensor *x, int n_rows, int head_dim, int pos0, lmx_rope rope)
{
    int half = head_dim / 2, n_heads = x->cols / head_dim;
    float inv[half], c[half], s[half]; /* head_dim <= LMX_MAX_HEAD_DIM */
    rope_inv_freq(inv, head_dim, rope);
    for (int i = 0; i < n_rows; i++) {
        float pos = (float)(pos0 + i);
        for (int k = 0; k < half; k++) {
            float a = pos * inv[k];
            c[k] = cosf(a);
            s[k] = sinf(a);
        }
        for (int h = 0; h < n_heads; h++) {
            float *v = f32(x) + (size_t)i * x->cols + (size_t)h * head_dim;
            for (int k = 0; k < half; k++) {
                float a = v[k], b = v[k + half];
                v[k] = a * c[k] - b * s[k];
                v[k + half] = b * c[k] + a * s[k];
            }
        }
    }
}

static void cpu_kv_write(lmx_backend *be, lmx_tensor *kc, lmx_tensor *vc, const lmx_tensor *k,
                         const lmx_tensor *v, int n_rows, int pos0)
{
    size_t row = (size_t)k->cols * sizeof(float);
    for (int i = 0; i < n_rows; i++) {
        size_t slot = (size_t)((pos0 + i) % kc->rows);
        memcpy(f32(kc) + slot * kc->cols, f32(k) + (size_t)i * k->cols, row);
        memcpy(f32(vc) + slot * vc->cols, f32(v) + (size_t)i * v->cols, row);
    }
}

typedef struct attn_job {
    float *out;
    const float *q, *kc, *vc;
    int cap;
    const lmx_attn_params *p;
} attn_job;

/* One (query row, head): a single pass with an online softmax, so memory
 * stays constant whatever the context length. */
static void attn_task(void *ctx, int task)
{
    const attn_job *j = ctx;
    const lmx_attn_params *p = j->p;
    int i = task / p->n_heads, h = task % p->n_heads, hd = p->head_dim;
    int kvh = h / (p->n_heads / p->n_kv_heads);
    int pos = p->pos0 + i;
    int lo = p->window > 0 && pos - p->window + 1 > 0 ? pos - p->window + 1 : 0;
    const float *q = j->q + (size_t)i * p->n_heads * hd + (size_t)h * hd;
    size_t kv_stride = (size_t)p->n_kv_heads * hd;
    float acc[hd];
    memset(acc, 0, sizeof acc);
    float m = -INFINITY, l = 0;
    for (int t = lo; t <= pos; t++) {
        size_t slot = (size_t)(t % j->cap);
        const float *k = j->kc + slot * kv_stride + (size_t)kvh * hd;
        const float *v = j->vc + slot * kv_stride + (size_t)kvh * hd;
        float sc = dot_f32(q, k, hd) * p->scale;
        if (p->softcap > 0)
            sc = p->softcap * tanhf(sc / p->softcap);
        if (sc > m) {
            float r = expf(m - sc);
            l *= r;
            for (int d = 0; d < hd; d++)
                acc[d] *= r;
            m = sc;
        }
        float e = expf(sc - m);
        l += e;
        for (int d = 0; d < hd; d++)
            acc[d] += e * v[d];
    }
    float *o = j->out + (size_t)i * p->n_heads * hd + (size_t)h * hd;
    for (int d = 0; d < hd; d++)
        o[d] = acc[d] / l;
}

static void cpu_attention(lmx_backend *be, lmx_tensor *out, const lmx_tensor *q, const lmx_tensor *kc,
                          const lmx_tensor *vc, const lmx_attn_params *p)
{
    attn_job j = {f32(out), f32(q), f32(kc), f32(vc), kc->rows, p};
    lmx_pool_run(pool_of(be), p->n_rows * p->n_heads, attn_task, &j);
}

static void cpu_gated_act(lmx_backend *be, lmx_tensor *gate, const lmx_tensor *up, int n_rows,
                          lmx_activation act)
{
    size_t n = (size_t)n_rows * gate->cols;
    float *g = f32(gate);
    const float *u = f32(up);
    const float k = 0.7978845608028654f; /* sqrt(2/pi) */
    for (size_t i = 0; i < n; i++) {
        float x = g[i];
        float a = act == LMX_ACT_SILU ? x / (1.0f + expf(-x))
                                      : 0.5f * x * (1.0f + tanhf(k * (x + 0.044715f * x * x * x)));
        g[i] = a * u[i];
    }
}

static void cpu_add(lmx_backend *be, lmx_tensor *x, const lmx_tensor *y, int n_rows)
{
    size_t n = (size_t)n_rows * x->cols;
    for (size_t i = 0; i < n; i++)
        f32(x)[i] += f32(y)[i];
}

static void cpu_softcap(lmx_backend *be, lmx_tensor *x, int n_rows, float cap)
{
    size_t n = (size_t)n_rows * x->cols;
    for (size_t i = 0; i < n; i++)
        f32(x)[i] = cap * tanhf(f32(x)[i] / cap);
}

static void cpu_copy_rows(lmx_backend *be, lmx_tensor *dst, int dst_row, const lmx_tensor *src,
                          int src_row, int n_rows)
{
    memcpy(f32(dst) + (size_t)dst_row * dst->cols, f32(src) + (size_t)src_row * src->cols,
           (size_t)n_rows * src->cols * sizeof(float));
}

static void cpu_read(lmx_backend *be, float *dst, const lmx_tensor *src, int row0, int n_rows)
{
    memcpy(dst, f32(src) + (size_t)row0 * src->cols, (size_t)n_rows * src->cols * sizeof(float));
}

static void cpu_destroy(lmx_backend *be)
{
    if (!be)
        return;
    lmx_pool_free(pool_of(be));
    free(be);
}

static const lmx_backend_ops cpu_ops = {
    .name = "cpu",
    .destroy = cpu_destroy,
    .weight = cpu_weight,
    .alloc = cpu_alloc,
    .free = cpu_free,
    .embed = cpu_embed,
    .rmsnorm = cpu_rmsnorm,
    .matmul = cpu_matmul,
    .rope = cpu_rope,
    .kv_write = cpu_kv_write,
    .attention = cpu_attention,
    .gated_act = cpu_gated_act,
    .add = cpu_add,
    .softcap = cpu_softcap,
    .copy_rows = cpu_copy_rows,
    .read = cpu_read,
};

lmx_backend *lmx_backend_cpu_new(int n_threads, lmx_error *err)
{
    cpu_backend *b = calloc(1, sizeof *b);
    if (!b || !(b->pool = lmx_pool_new(n_threads))) {
        free(b);
        lmx_fail(err, LMX_ERR_NOMEM, "cannot start the CPU backend's thread pool");
        return NULL;
    }
    b->base.ops = &cpu_ops;
    return &b->base;
}
