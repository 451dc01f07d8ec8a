#include "backend_cpu.h"

#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "argmax.h"
#include "bigbuf.h"
#include "cpu_attention.h"
#include "cpu_kernels.h"
#include "cpu_matmul.h"
#include "error.h"
#include "quant.h"
#include "sysmem.h"
#include "threadpool.h"

struct lmx_tensor {
    int rows, cols;
    lmx_dtype dtype;  /* float32 for activations; the stored dtype for weights */
    void *data;       /* weights: their copy in buf, else a view of the mapping */
    lmx_bigbuf buf;   /* what this tensor owns: activations, caches, weights' float copies */
    lmx_cpu_weight w; /* weights: what the kernels read (maybe quantized) */
    void *qbuf;       /* quantized weights: the one allocation behind w (malloc: huge pages made q8
                         decode no faster, docs/cpu.md) */
};

/* Ranks of one tensor-parallel model on this CPU (shard.h): their
 * all-reduce meets at a barrier. */
typedef struct cpu_group {
    int n_ranks, alive; /* alive: backends not yet destroyed */
    pthread_mutex_t lock;
    pthread_barrier_t barrier;
    float **parts; /* each rank's tensor in the all-reduce under way */
} cpu_group;

typedef struct cpu_backend {
    lmx_backend base;
    lmx_pool *pool;
    const lmx_cpu_kernels *k;
    lmx_cpu_mm *mm;
    int quant; /* 0, 8 or 4 */
    int kv_f16; /* the KV cache in float16 */
    int huge_pages; /* float weight matrices are copied into huge pages (not mmap_weights, and granted) */
    cpu_group *group; /* NULL: a lone backend */
    int rank;
} cpu_backend;

static cpu_backend *cpu(lmx_backend *be) { return (cpu_backend *)be; }
static lmx_pool *pool_of(lmx_backend *be) { return cpu(be)->pool; }

static float *f32(const lmx_tensor *t) { return (float *)t->data; }

/* Element access for norm weights in their stored dtype. */
static float elem(const lmx_tensor *w, size_t i)
{
    switch (w->dtype) {
    case LMX_DT_BF16: return lmx_bf16_to_f32(((const uint16_t *)w->data)[i]);
    case LMX_DT_F16: return lmx_f16_to_f32(((const uint16_t *)w->data)[i]);
    default: return ((const float *)w->data)[i];
    }
}

/* Tensors ----------------------------------------------------------------- */

typedef struct quant_job {
    const lmx_cpu_kernels *k;
    const lmx_cpu_weight *src, *dst;
    int rows_per_task;
} quant_job;

static void quant_task(void *ctx, int task, int worker)
{
    const quant_job *j = ctx;
    int r0 = task * j->rows_per_task, r1 = r0 + j->rows_per_task;
    j->k->quant_rows(j->src, j->dst, r0, r1 < j->src->rows ? r1 : j->src->rows);
}

static void cpu_free(lmx_backend *be, lmx_tensor *t)
{
    if (!t)
        return;
    lmx_bigbuf_free(&t->buf);
    free(t->qbuf);
    free(t);
}

/* Replaces w->w (at least two rows, whose length has a group) by a
 * quantized copy. */
static int quantize(cpu_backend *b, lmx_tensor *w)
{
    int K = w->cols, G = lmx_quant_group(K), bits = b->quant;
    size_t qbytes = (size_t)w->rows * lmx_quant_row_bytes(K, bits);
    size_t ng = (size_t)w->rows * (size_t)(K / G);
    uint8_t *buf = w->qbuf = malloc(lmx_quant_matrix_bytes(w->rows, K, bits, G));
    if (!buf)
        return -1;
    lmx_cpu_weight q = {bits == 8 ? LMX_WK_Q8 : LMX_WK_Q4, w->rows, K, buf,
                        (const uint16_t *)(buf + qbytes), (const uint16_t *)(buf + qbytes) + ng, G};
    quant_job j = {b->k, &w->w, &q, 64};
    lmx_pool_run(b->pool, (w->rows + 63) / 64, quant_task, &j);
    w->w = q;
    return 0;
}

enum { COPY_ROWS = 256 }; /* rows a copy task takes */

typedef struct copy_job {
    const char *src; /* the slice's first element */
    char *dst;
    size_t src_row, dst_row; /* bytes */
    int rows_per_task, rows;
} copy_job;

static void copy_task(void *ctx, int task, int worker)
{
    const copy_job *j = ctx;
    int r1 = (task + 1) * j->rows_per_task < j->rows ? (task + 1) * j->rows_per_task : j->rows;
    for (int r = task * j->rows_per_task; r < r1; r++)
        memcpy(j->dst + (size_t)r * j->dst_row, j->src + (size_t)r * j->src_row, j->dst_row);
}

/* Copies the slice s of t (whose rows hold cols elements) into w->buf, by
 * the pool (huge pages where the kernel grants them, bigbuf.h), and points
 * w's data and kernel view at it. */
static int copy_slice(cpu_backend *b, lmx_tensor *w, const lmx_st_tensor *t, const lmx_slice *s, int cols)
{
    size_t es = lmx_dtype_size(t->dtype);
    w->buf = lmx_bigbuf_alloc((size_t)s->rows * s->cols * es);
    if (!w->buf.data)
        return -1;
    copy_job j = {(const char *)t->data + ((size_t)s->row0 * cols + s->col0) * es, w->buf.data, (size_t)cols * es,
                  (size_t)s->cols * es, COPY_ROWS, s->rows};
    lmx_pool_run(b->pool, (s->rows + COPY_ROWS - 1) / COPY_ROWS, copy_task, &j);
    w->data = w->buf.data;
    w->w.data = w->data;
    return 0;
}

/* Drops the pages of a view of the mapping from this process's resident
 * set once nothing reads them (they stay in the page cache). */
static void drop_pages(const void *p, size_t bytes)
{
    long page = sysconf(_SC_PAGESIZE);
    if (page <= 0)
        return;
    uintptr_t a = ((uintptr_t)p + (uintptr_t)page - 1) & ~((uintptr_t)page - 1);
    uintptr_t e = ((uintptr_t)p + bytes) & ~((uintptr_t)page - 1);
    if (e > a)
        madvise((void *)a, e - a, MADV_DONTNEED);
}

typedef enum { KEPT_IN_PLACE, KEPT_COPIED, KEPT_QUANTIZED } kept_as;

/* How load_matrix keeps the slice s of t (whose rows hold cols elements):
 * a slice of columns is always copied. */
static kept_as kept_of(const cpu_backend *b, const lmx_st_tensor *t, const lmx_slice *s, int cols, int lookup)
{
    if (b->quant && t->ndim >= 2 && s->rows >= 2 && lmx_quant_group(s->cols))
        return KEPT_QUANTIZED;
    int whole_rows = s->col0 == 0 && s->cols == cols;
    return !whole_rows || (t->ndim >= 2 && b->huge_pages && !lookup) ? KEPT_COPIED : KEPT_IN_PLACE;
}

/* A weight matrix is read from the mapping only while it loads: it is
 * quantized (--quant), or else copied into huge pages where the kernel
 * grants them (unless mmap_weights), with which bf16 decode on two threads
 * read 10-25% more of the machine's bandwidth than from the page cache's
 * 4 KB pages (docs/cpu.md). Vectors (norm weights) and tables only looked
 * up by rows (an untied embedding table) stay views. */
static int load_matrix(cpu_backend *b, lmx_tensor *w, const lmx_st_tensor *t, const lmx_slice *s, int cols,
                       int lookup)
{
    const char *view = (const char *)t->data + (size_t)s->row0 * cols * lmx_dtype_size(t->dtype);
    size_t view_bytes = (size_t)s->rows * cols * lmx_dtype_size(t->dtype);
    int whole_rows = s->col0 == 0 && s->cols == cols;
    kept_as kept = kept_of(b, t, s, cols, lookup);
    if (whole_rows)
        w->data = (void *)(w->w.data = view);
    else if (copy_slice(b, w, t, s, cols))
        return -1;
    if (kept == KEPT_QUANTIZED) {
        if (quantize(b, w))
            return -1;
        lmx_bigbuf_free(&w->buf); /* the float source is read no more (embed decodes w->w) */
        w->data = NULL;
        if (whole_rows)
            drop_pages(view, view_bytes);
        return 0;
    }
    if (whole_rows && kept == KEPT_COPIED) {
        if (copy_slice(b, w, t, s, cols))
            return -1;
        drop_pages(view, view_bytes);
    }
    return 0;
}

static lmx_tensor *cpu_weight(lmx_backend *be, const lmx_st_tensor *t, const lmx_slice *slice, int lookup,
                              lmx_error *err)
{
    int rows, cols;
    lmx_slice s;
    if (lmx_backend_weight_view(t, &rows, &cols, err) || lmx_backend_slice(t, slice, &s, err))
        return NULL;
    if ((uintptr_t)t->data % lmx_dtype_size(t->dtype)) { /* read in place: elements must be aligned */
        lmx_fail(err, LMX_ERR_UNSUPPORTED, "%s: tensor '%s' is not aligned to its %zu-byte elements",
                 t->file, t->name, lmx_dtype_size(t->dtype));
        return NULL;
    }
    lmx_tensor *w = calloc(1, sizeof *w);
    if (!w) {
        lmx_fail(err, LMX_ERR_NOMEM, "out of memory");
        return NULL;
    }
    lmx_wkind kind = t->dtype == LMX_DT_BF16 ? LMX_WK_BF16 : t->dtype == LMX_DT_F16 ? LMX_WK_F16 : LMX_WK_F32;
    *w = (lmx_tensor){.rows = s.rows, .cols = s.cols, .dtype = t->dtype};
    w->w = (lmx_cpu_weight){kind, s.rows, s.cols, NULL, NULL, NULL, 0};
    cpu_backend *b = cpu(be);
    if (lmx_cpu_mm_reserve(b->mm, s.cols) || load_matrix(b, w, t, &s, cols, lookup)) {
        cpu_free(be, w);
        lmx_fail(err, LMX_ERR_NOMEM, "%s: out of memory for tensor '%s'", t->file, t->name);
        return NULL;
    }
    return w;
}

static size_t cpu_weight_bytes(lmx_backend *be, const lmx_st_tensor *t, const lmx_slice *slice, int lookup)
{
    int rows, cols;
    lmx_slice s;
    if (lmx_backend_weight_view(t, &rows, &cols, NULL) || lmx_backend_slice(t, slice, &s, NULL))
        return 0; /* cpu_weight says what is wrong */
    const cpu_backend *b = cpu(be);
    switch (kept_of(b, t, &s, cols, lookup)) {
    case KEPT_QUANTIZED: return lmx_quant_matrix_bytes(s.rows, s.cols, b->quant, lmx_quant_group(s.cols));
    case KEPT_COPIED: return (size_t)s.rows * (size_t)s.cols * lmx_dtype_size(t->dtype);
    default: return 0;
    }
}

/* LMX_ERR_NOMEM when `bytes` of what (a subject and its verb) exceed the
 * memory available, kept as `how`, with what to do. */
static lmx_status fits_memory(size_t bytes, const char *what, const char *how, const char *hint, lmx_error *err)
{
    size_t avail = lmx_mem_available();
    if (bytes <= avail)
        return LMX_OK;
    return lmx_fail(err, LMX_ERR_NOMEM, "%s %.1f GB of memory %s, and %.1f GB is available: %s", what,
                    (double)bytes / 1e9, how, (double)avail / 1e9, hint);
}

/* The ranks of a group share the machine's memory: the total counts. */
static lmx_status cpu_check_room(lmx_backend *be, size_t share, size_t total, lmx_error *err)
{
    (void)share;
    const cpu_backend *b = cpu(be);
    const char *hint = b->quant == 4   ? "this machine has too little memory for this model"
                       : b->quant == 8 ? "quantize them to 4 bits (--quant q4)"
                                       : "quantize them (--quant q8 or q4) or read them in place from the "
                                         "checkpoint (--mmap)";
    return fits_memory(total, "the weights take", b->quant ? "once quantized" : "once copied", hint, err);
}

static lmx_status cpu_check_cache_room(lmx_backend *be, size_t share, size_t total, int n_ctx, lmx_error *err)
{
    (void)share;
    const cpu_backend *b = cpu(be);
    char what[64];
    snprintf(what, sizeof what, "the KV cache of %d positions takes", n_ctx);
    return fits_memory(total * (b->kv_f16 ? 2 : 4), what, b->kv_f16 ? "in float16" : "in float32",
                       b->kv_f16 ? "use a shorter context (--ctx)"
                                 : "use a shorter context (--ctx) or a float16 cache (--kv f16)",
                       err);
}

/* slack: zeroed elements allocated past the last row */
static lmx_tensor *alloc_dtype(int rows, int cols, lmx_dtype dtype, size_t slack, lmx_error *err)
{
    lmx_tensor *t = calloc(1, sizeof *t);
    size_t n = (size_t)rows * (size_t)cols + slack, es = lmx_dtype_size(dtype);
    lmx_bigbuf buf = n <= SIZE_MAX / es ? lmx_bigbuf_alloc(n * es) : (lmx_bigbuf){NULL, NULL, 0};
    void *d = buf.data;
    if (!t || !d) {
        free(t);
        lmx_bigbuf_free(&buf);
        lmx_fail(err, LMX_ERR_NOMEM, "cannot allocate a %d x %d %s tensor", rows, cols, lmx_dtype_name(dtype));
        return NULL;
    }
    *t = (lmx_tensor){.rows = rows, .cols = cols, .dtype = dtype, .data = d, .buf = buf};
    return t;
}

static lmx_tensor *cpu_alloc(lmx_backend *be, int rows, int cols, lmx_error *err)
{
    return alloc_dtype(rows, cols, LMX_DT_F32, 0, err);
}

static lmx_tensor *cpu_alloc_cache(lmx_backend *be, int rows, int cols, lmx_error *err)
{
    return alloc_dtype(rows, cols, cpu(be)->kv_f16 ? LMX_DT_F16 : LMX_DT_F32,
                       lmx_cpu_attention_slack(cpu(be)->k, cols), err);
}

/* Ops ------------------------------------------------------------------- */

static void cpu_embed(lmx_backend *be, lmx_tensor *out, const lmx_tensor *table, const int32_t *ids,
                      int n_rows, float scale, int first_id)
{
    const lmx_cpu_kernels *k = cpu(be)->k;
    for (int i = 0; i < n_rows; i++) {
        float *dst = f32(out) + (size_t)i * out->cols;
        int row = ids[i] - first_id;
        if (row < 0 || row >= table->rows) {
            memset(dst, 0, (size_t)out->cols * sizeof *dst);
            continue;
        }
        k->decode(&table->w, row, dst);
        k->scale(dst, scale, out->cols);
    }
}

static void cpu_rmsnorm(lmx_backend *be, lmx_tensor *out, const lmx_tensor *x, const lmx_tensor *w,
                        int n_rows, float eps, int plus_one)
{
    int dim = w->cols;
    size_t n_vec = (size_t)n_rows * (size_t)x->cols / (size_t)dim;
    float wf[dim];
    for (int j = 0; j < dim; j++)
        wf[j] = plus_one ? 1.0f + elem(w, (size_t)j) : elem(w, (size_t)j);
    for (size_t v = 0; v < n_vec; v++) {
        const float *src = f32(x) + v * dim;
        float *dst = f32(out) + v * dim;
        double ss = 0;
        for (int j = 0; j < dim; j++)
            ss += (double)src[j] * src[j];
        float r = 1.0f / sqrtf((float)(ss / dim) + eps);
        for (int j = 0; j < dim; j++)
            dst[j] = src[j] * r * wf[j];
    }
}

static void cpu_matmul(lmx_backend *be, lmx_tensor *out, const lmx_tensor *x, const lmx_tensor *w,
                       int n_rows)
{
    lmx_cpu_mm_run(cpu(be)->mm, f32(out), f32(x), n_rows, &w->w);
}

static void cpu_matmul_multi(lmx_backend *be, int n_out, lmx_tensor *const *outs, const lmx_tensor *x,
                             const lmx_tensor *const *ws, int n_rows)
{
    for (int i = 0; i < n_out; i++)
        cpu_matmul(be, outs[i], x, ws[i], n_rows);
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

/* n floats into a cache of c's dtype, at element `at`. */
static void cache_put(lmx_tensor *c, size_t at, const float *src, int n)
{
    if (c->dtype == LMX_DT_F16)
        for (int d = 0; d < n; d++)
            ((uint16_t *)c->data)[at + d] = lmx_f32_to_f16(src[d]);
    else
        memcpy(f32(c) + at, src, (size_t)n * sizeof(float));
}

/* The caches are head-major inside this backend, [kv head][slot][head_dim],
 * so that attention streams one head's keys and values contiguously. */
static void cpu_kv_write(lmx_tensor *kc, lmx_tensor *vc, const lmx_tensor *k, const lmx_tensor *v, int n_rows,
                         int pos0, int head_dim)
{
    size_t cap = (size_t)kc->rows;
    for (int i = 0; i < n_rows; i++) {
        size_t slot = (size_t)(pos0 + i) % cap;
        for (int h = 0; h < k->cols / head_dim; h++) {
            size_t at = ((size_t)h * cap + slot) * head_dim, from = (size_t)i * k->cols + (size_t)h * head_dim;
            cache_put(kc, at, f32(k) + from, head_dim);
            cache_put(vc, at, f32(v) + from, head_dim);
        }
    }
}

static void cpu_qk_prepare(lmx_backend *be, lmx_tensor *q, lmx_tensor *k, const lmx_tensor *v,
                           const lmx_tensor *q_norm, const lmx_tensor *k_norm, lmx_tensor *kc, lmx_tensor *vc,
                           int n_rows, int head_dim, int pos0, lmx_rope rope, float eps, int plus_one)
{
    cpu_rmsnorm(be, q, q, q_norm, n_rows, eps, plus_one);
    cpu_rmsnorm(be, k, k, k_norm, n_rows, eps, plus_one);
    cpu_rope(be, q, n_rows, head_dim, pos0, rope);
    cpu_rope(be, k, n_rows, head_dim, pos0, rope);
    cpu_kv_write(kc, vc, k, v, n_rows, pos0, head_dim);
}

static void cpu_attention(lmx_backend *be, lmx_tensor *out, const lmx_tensor *q, const lmx_tensor *kc,
                          const lmx_tensor *vc, const lmx_attn_params *p)
{
    lmx_cpu_attention(cpu(be)->k, pool_of(be), f32(out), f32(q), kc->data, vc->data, kc->dtype == LMX_DT_F16,
                      kc->rows, p);
}

typedef struct act_job {
    const lmx_cpu_kernels *k;
    float *g;
    const float *u;
    size_t n;
    lmx_activation act;
} act_job;

enum { ACT_CHUNK = 4096 };

static void act_task(void *ctx, int task, int worker)
{
    const act_job *j = ctx;
    size_t i0 = (size_t)task * ACT_CHUNK, n = i0 + ACT_CHUNK < j->n ? ACT_CHUNK : j->n - i0;
    j->k->gated_act(j->g + i0, j->u + i0, n, j->act != LMX_ACT_SILU);
}

static void cpu_gated_act(lmx_backend *be, lmx_tensor *gate, const lmx_tensor *up, int n_rows,
                          lmx_activation act)
{
    act_job j = {cpu(be)->k, f32(gate), f32(up), (size_t)n_rows * gate->cols, act};
    lmx_pool_run(pool_of(be), (int)((j.n + ACT_CHUNK - 1) / ACT_CHUNK), act_task, &j);
}

static void cpu_gated_mlp(lmx_backend *be, lmx_tensor *gate, lmx_tensor *up, const lmx_tensor *x,
                          const lmx_tensor *w_gate, const lmx_tensor *w_up, int n_rows, lmx_activation act)
{
    cpu_matmul(be, gate, x, w_gate, n_rows);
    cpu_matmul(be, up, x, w_up, n_rows);
    cpu_gated_act(be, gate, up, n_rows, act);
}

static void cpu_residual_norm(lmx_backend *be, lmx_tensor *x, lmx_tensor *h, lmx_tensor *y,
                              const lmx_tensor *post, const lmx_tensor *next, int n_rows, float eps,
                              int plus_one, int for_products)
{
    if (post)
        cpu_rmsnorm(be, y, y, post, n_rows, eps, plus_one);
    size_t n = (size_t)n_rows * x->cols;
    for (size_t i = 0; i < n; i++)
        f32(x)[i] += f32(y)[i];
    cpu_rmsnorm(be, h, x, next, n_rows, eps, plus_one);
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

static void cpu_read(lmx_backend *be, float *dst, size_t dst_stride, const lmx_tensor *src, int row0,
                     int n_rows)
{
    for (int i = 0; i < n_rows; i++)
        memcpy(dst + (size_t)i * dst_stride, f32(src) + (size_t)(row0 + i) * src->cols,
               (size_t)src->cols * sizeof(float));
}

static int cpu_read_topk(lmx_backend *be, lmx_scored *out, int k, const lmx_tensor *src, int row)
{
    (void)be;
    lmx_top_scores(f32(src) + (size_t)row * src->cols, src->cols, k, out);
    return 1; /* one group: the row's own best */
}

static void cpu_read_argmax(lmx_backend *be, float *best, int32_t *col, const lmx_tensor *src, int row)
{
    const float *x = f32(src) + (size_t)row * src->cols;
    *col = lmx_argmax(x, src->cols);
    *best = x[*col];
}

/* Every rank sums its share of the elements over the ranks, in rank order,
 * into rank 0's tensor; the others then copy the result. */
static void cpu_all_reduce(lmx_backend *be, lmx_tensor *x, int n_rows)
{
    cpu_group *g = cpu(be)->group;
    int r = cpu(be)->rank, n = g->n_ranks;
    size_t len = (size_t)n_rows * x->cols, i0 = len * r / n, i1 = len * (r + 1) / n;
    g->parts[r] = f32(x);
    pthread_barrier_wait(&g->barrier);
    for (size_t i = i0; i < i1; i++) {
        float sum = g->parts[0][i];
        for (int k = 1; k < n; k++)
            sum += g->parts[k][i];
        g->parts[0][i] = sum;
    }
    pthread_barrier_wait(&g->barrier);
    if (r)
        memcpy(f32(x), g->parts[0], len * sizeof(float));
    pthread_barrier_wait(&g->barrier); /* rank 0's tensor stays put until all have copied */
}

static void group_leave(cpu_group *g)
{
    pthread_mutex_lock(&g->lock);
    int last = --g->alive == 0;
    pthread_mutex_unlock(&g->lock);
    if (!last)
        return;
    pthread_barrier_destroy(&g->barrier);
    pthread_mutex_destroy(&g->lock);
    free(g->parts);
    free(g);
}

static void cpu_destroy(lmx_backend *be)
{
    if (!be)
        return;
    lmx_cpu_mm_free(cpu(be)->mm);
    lmx_pool_free(pool_of(be));
    if (cpu(be)->group)
        group_leave(cpu(be)->group);
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
    .matmul_multi = cpu_matmul_multi,
    .qk_prepare = cpu_qk_prepare,
    .attention = cpu_attention,
    .gated_mlp = cpu_gated_mlp,
    .residual_norm = cpu_residual_norm,
    .softcap = cpu_softcap,
    .copy_rows = cpu_copy_rows,
    .read = cpu_read,
    .read_argmax = cpu_read_argmax,
    .read_topk = cpu_read_topk,
    .all_reduce = cpu_all_reduce,
    .alloc_cache = cpu_alloc_cache,
    .weight_bytes = cpu_weight_bytes,
    .check_room = cpu_check_room,
    .check_cache_room = cpu_check_cache_room,
};

lmx_backend *lmx_backend_cpu_new(const lmx_load_options *o, lmx_error *err)
{
    lmx_cpu_path path;
    if (o->quant != 0 && o->quant != 8 && o->quant != 4) {
        lmx_fail(err, LMX_ERR_ARG, "lmx_load: quant = %d; want 0 (none), 8 or 4", o->quant);
        return NULL;
    }
    const struct {
        const char *name, *meaning; /* of 0, then of 1 */
        int value;
    } flags[] = {{"kv_f16", "0 (float32 cache) or 1 (float16)", o->kv_f16},
                 {"mmap_weights", "0 (copy into huge pages) or 1 (read in place)", o->mmap_weights},
                 {"prefill_bf16", "0 (float32 x) or 1 (bf16 x)", o->prefill_bf16}};
    for (size_t i = 0; i < sizeof flags / sizeof *flags; i++)
        if (flags[i].value != 0 && flags[i].value != 1) {
            lmx_fail(err, LMX_ERR_ARG, "lmx_load: %s = %d; want %s", flags[i].name, flags[i].value, flags[i].meaning);
            return NULL;
        }
    if (lmx_cpu_path_select(&path, err))
        return NULL;
    cpu_backend *b = calloc(1, sizeof *b);
    if (!b || !(b->pool = lmx_pool_new(o->n_threads))) {
        free(b);
        lmx_fail(err, LMX_ERR_NOMEM, "cannot start the CPU backend's thread pool");
        return NULL;
    }
    b->base.ops = &cpu_ops;
    b->k = lmx_cpu_kernels_for(path);
    b->quant = o->quant;
    b->kv_f16 = o->kv_f16;
    b->huge_pages = !o->mmap_weights && lmx_bigbuf_huge_pages();
    if (!(b->mm = lmx_cpu_mm_new(b->k, b->pool, o->prefill_bf16))) {
        cpu_destroy(&b->base);
        lmx_fail(err, LMX_ERR_NOMEM, "cannot allocate the CPU backend's scratch");
        return NULL;
    }
    return &b->base;
}

lmx_status lmx_backend_cpu_new_group(int n_ranks, const lmx_load_options *o, lmx_backend **out, lmx_error *err)
{
    cpu_group *g = calloc(1, sizeof *g);
    float **parts = calloc((size_t)n_ranks, sizeof *parts);
    if (!g || !parts || pthread_barrier_init(&g->barrier, NULL, (unsigned)n_ranks)) {
        free(g);
        free(parts);
        return lmx_fail(err, LMX_ERR_NOMEM, "cannot set up %d CPU ranks", n_ranks);
    }
    pthread_mutex_init(&g->lock, NULL);
    g->n_ranks = n_ranks;
    g->parts = parts;
    for (int r = 0; r < n_ranks; r++) {
        if (!(out[r] = lmx_backend_cpu_new(o, err))) {
            while (r--)
                out[r]->ops->destroy(out[r]);
            pthread_barrier_destroy(&g->barrier);
            pthread_mutex_destroy(&g->lock);
            free(parts);
            free(g);
            return err ? err->code : LMX_ERR_NOMEM;
        }
        cpu(out[r])->group = g;
        cpu(out[r])->rank = r;
        g->alive++;
    }
    return LMX_OK;
}

size_t lmx_backend_cpu_bytes(const lmx_tensor *t)
{
    const lmx_cpu_weight *w = &t->w;
    size_t n = (size_t)w->rows * (size_t)w->cols;
    switch (w->kind) {
    case LMX_WK_Q8:
    case LMX_WK_Q4:
        return lmx_quant_matrix_bytes(w->rows, w->cols, w->kind == LMX_WK_Q8 ? 8 : 4, w->group);
    case LMX_WK_F32: return n * 4;
    default: return n * 2;
    }
}

const char *lmx_backend_cpu_weights(const lmx_backend *be)
{
    const cpu_backend *b = (const cpu_backend *)be;
    return b->quant ? "quantized" : b->huge_pages ? "huge pages" : "mapped";
}

const char *lmx_backend_cpu_prefill_x(const lmx_backend *be)
{
    return lmx_cpu_mm_bf16_x(((const cpu_backend *)be)->mm) ? "bf16" : "f32";
}

const char *lmx_backend_cpu_path(const lmx_backend *be)
{
    return lmx_cpu_path_name(((const cpu_backend *)be)->k->path);
}

int lmx_backend_cpu_threads(const lmx_backend *be) { return lmx_pool_threads(((const cpu_backend *)be)->pool); }
