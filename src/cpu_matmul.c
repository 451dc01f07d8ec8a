#include "cpu_matmul.h"

#include <pthread.h>
#include <stdlib.h>
#include <stdint.h>
#include <string.h>

#include "bigbuf.h"

/* Up to this many rows of x, the matrix-vector kernel (which reads every
 * weight once per MV_ROWS rows of x) beats decoding weights into tiles. */
enum { MV_ROWS = 4, MIN_GROUP = 32 };

/* Decoded weight rows are padded by a cache line so that the tile's row
 * streams do not fall into the same L1 sets when K is a multiple of 1024. */
static int wt_stride(int cols) { return cols + 16; }

/* bf16 rows repacked for the bf16 tile: pairs of k, one uint32 (a float's room) each. */
static int pairs(int cols) { return (cols + 1) / 2; }

/* Weight rows a tile task decodes and keeps: a whole number of tiles of mr
 * rows (of row_floats each), at most 64 and BLOCK_FLOATS, so that each
 * panel of x meets all of them while it is in L2 instead of being read
 * again for every tile (a 512-row x of 1024 columns is 2 MB, past L2). */
enum { BLOCK_FLOATS = 96 << 10 };

static int block_rows(int mr, int row_floats)
{
    int mb = BLOCK_FLOATS / row_floats / mr * mr;
    return mb < mr ? mr : mb > 64 ? 64 / mr * mr : mb;
}

struct lmx_cpu_mm {
    const lmx_cpu_kernels *k;
    lmx_pool *pool;
    pthread_mutex_t lock; /* the scratch below serves one product at a time */
    int bf16_x;           /* bf16 weights meet x rounded to bf16 (bf16_tile) in products of many rows */
    int cols;             /* capacity, in columns of weights */
    int8_t *xq;           /* MV_ROWS rows of x quantized (lmx_cpu_x) */
    float *xd;            /* MV_ROWS rows of per-group steps and sums */
    int32_t *xqsum;
    float **wt;           /* per thread, 64-byte aligned: tile_mr decoded weight rows (AMX:
                           * amx_gemm_task; qgemm: its scratch, and a row of x in qpack_task) */
    float *xt;            /* x packed k-major for the tiles; grows (xt_buf) */
    lmx_bigbuf xt_buf;
    size_t xt_cap;
};

lmx_cpu_mm *lmx_cpu_mm_new(const lmx_cpu_kernels *k, lmx_pool *pool, int bf16_x)
{
    lmx_cpu_mm *mm = calloc(1, sizeof *mm);
    if (!mm)
        return NULL;
    mm->k = k;
    mm->pool = pool;
    mm->bf16_x = bf16_x && k->bf16_tile && lmx_cpu_avx512_bf16(NULL);
    pthread_mutex_init(&mm->lock, NULL);
    mm->wt = calloc((size_t)lmx_pool_threads(pool), sizeof *mm->wt);
    if (!mm->wt) {
        lmx_cpu_mm_free(mm);
        return NULL;
    }
    return mm;
}

int lmx_cpu_mm_bf16_x(const lmx_cpu_mm *mm) { return mm->bf16_x; }

void lmx_cpu_mm_free(lmx_cpu_mm *mm)
{
    if (!mm)
        return;
    for (int t = 0; mm->wt && t < lmx_pool_threads(mm->pool); t++)
        free(mm->wt[t]);
    free(mm->wt);
    free(mm->xq);
    free(mm->xd);
    free(mm->xqsum);
    lmx_bigbuf_free(&mm->xt_buf);
    pthread_mutex_destroy(&mm->lock);
    free(mm);
}

/* Floats of each thread's wt for weights of cols columns: the most any of
 * the tasks below needs (the AMX path also runs tile_task, for weights it
 * does not take). */
static size_t wt_floats(const lmx_cpu_kernels *k, int cols)
{
    size_t c = (size_t)cols;
    size_t amx = k->amx_gemm ? c * 33 : 0; /* a decoded row, then 32 rows of bf16 hi and lo parts */
    /* block_rows for any K up to cols */
    size_t tile = (size_t)k->tile_mr * (size_t)wt_stride(cols), bf16 = (size_t)k->bf16_mr * (size_t)pairs(cols);
    tile = tile > bf16 ? tile : bf16;
    tile = tile > BLOCK_FLOATS ? tile : BLOCK_FLOATS;
    /* lmx_cpu_kernels.qgemm; qpack_task's row: xd, xqsum, xq, xr */
    size_t q = ((size_t)k->qgemm_mr * (c + 8 * (c / MIN_GROUP + 1)) + 2 * c) / sizeof(float) + 1;
    size_t most = tile > q ? tile : q;
    return most > amx ? most : amx;
}

int lmx_cpu_mm_reserve(lmx_cpu_mm *mm, int cols)
{
    if (cols <= mm->cols)
        return 0;
    size_t c = (size_t)cols, ng = MV_ROWS * (c / MIN_GROUP + 1);
    int8_t *xq = malloc(MV_ROWS * c);
    float *xd = malloc(ng * sizeof(float));
    int32_t *xqsum = malloc(ng * sizeof(int32_t));
    if (!xq || !xd || !xqsum) {
        free(xq), free(xd), free(xqsum);
        return -1;
    }
    free(mm->xq), free(mm->xd), free(mm->xqsum);
    mm->xq = xq;
    mm->xd = xd;
    mm->xqsum = xqsum;
    size_t bytes = (wt_floats(mm->k, cols) * sizeof(float) + 63) / 64 * 64;
    for (int t = 0; t < lmx_pool_threads(mm->pool); t++) {
        float *w = aligned_alloc(64, bytes);
        if (!w)
            return -1; /* the smaller buffers stay valid for the old cols */
        memset(w, 0, bytes);
        free(mm->wt[t]);
        mm->wt[t] = w;
    }
    mm->cols = cols;
    return 0;
}

/* Matrix-vector ---------------------------------------------------------- */

typedef struct mv_job {
    const lmx_cpu_kernels *k;
    const lmx_cpu_weight *w;
    lmx_cpu_x x;
    int n, rows_per_task;
    float *out;
} mv_job;

static void mv_task(void *ctx, int task, int worker)
{
    const mv_job *j = ctx;
    int r0 = task * j->rows_per_task, r1 = r0 + j->rows_per_task;
    if (r1 > j->w->rows)
        r1 = j->w->rows;
    j->k->matvec(j->w, r0, r1, &j->x, j->n, j->out, j->w->rows);
}

/* x quantized per weight group (lmx_cpu_x); q4 reordered in runs of
 * q4_chunk (with group 32, of at most a group), natural order being runs
 * of 2. */
static void prep_quant(lmx_cpu_mm *mm, const lmx_cpu_weight *w, const float *x, int n, lmx_cpu_x *xp)
{
    int K = w->cols, G = w->group, ng = K / G, C = mm->k->q4_chunk;
    if (G < 64 && C > G)
        C = G;
    for (int i = 0; i < n; i++) {
        size_t o = (size_t)i * ng;
        mm->k->quant_x(x + (size_t)i * K, K, G, w->kind == LMX_WK_Q4 ? C : 0, mm->xq + (size_t)i * K,
                       mm->xd + o, mm->xqsum + o);
    }
    *xp = (lmx_cpu_x){x, mm->xq, mm->xd, mm->xqsum};
}

enum { MV_TASKS = 2 };

static void run_matvec(lmx_cpu_mm *mm, float *out, const float *x, int n, const lmx_cpu_weight *w)
{
    int T = lmx_pool_threads(mm->pool), N = w->rows;
    /* MV_TASKS tasks a thread, whole multiples of 16 rows: each of a
     * decode task's four row streams (GEN_*_MATVEC) starts cold (the
     * AVX-512 kernels prefetch 1-2 KiB ahead of where they read; the
     * hardware prefetcher has to find the stream), so streams must be
     * long: eight tasks a thread made Qwen3-0.6B q8/q4 decode on two
     * threads 15-25% slower (bench/RESULTS.md); a second task still lets
     * a thread that finishes early take work */
    int per = (N + T * MV_TASKS - 1) / (T * MV_TASKS);
    per = (per + 15) / 16 * 16;
    for (int i0 = 0; i0 < n; i0 += MV_ROWS) {
        int m = n - i0 < MV_ROWS ? n - i0 : MV_ROWS;
        mv_job j = {mm->k, w, {x + (size_t)i0 * w->cols, NULL, NULL, NULL}, m, per, out + (size_t)i0 * N};
        if (w->kind == LMX_WK_Q8 || w->kind == LMX_WK_Q4)
            prep_quant(mm, w, j.x.x, m, &j.x);
        lmx_pool_run(mm->pool, (N + per - 1) / per, mv_task, &j);
    }
}

/* Matrix-matrix ---------------------------------------------------------- */

typedef struct mm_job {
    lmx_cpu_mm *mm;
    const lmx_cpu_weight *w;
    const float *x;
    int n, ldx;
    float *out;
    int bf16; /* the bf16 tile (bf16_x, bf16 weights) */
} mm_job;

enum { PACK_COLS = 64 };

/* x packed k-major in panels of tile_nx rows, each panel contiguous:
 * xt[(p * K + k) * NX + i] = x[(p * NX + i) * K + k] for a block of k;
 * rows n..ldx zero. A tile call then reads its panel as one sequential
 * stream; one k-major array of all rows had it read NX floats every ldx
 * (1 KB apart at 256 rows), which fell into a few L1 sets: a 3072 x 256
 * product by 256 rows ran at 64 GFLOP/s on one core of the AMD machine. */
static void pack_task(void *ctx, int task, int worker)
{
    const mm_job *j = ctx;
    int K = j->w->cols, NX = j->mm->k->tile_nx, k0 = task * PACK_COLS, k1 = k0 + PACK_COLS < K ? k0 + PACK_COLS : K;
    for (int p = 0; p < j->ldx / NX; p++) {
        float *panel = j->mm->xt + (size_t)p * K * NX;
        for (int k = k0; k < k1; k++)
            for (int i = 0; i < NX; i++) {
                int r = p * NX + i;
                panel[(size_t)k * NX + i] = r < j->n ? j->x[(size_t)r * K + k] : 0.0f;
            }
    }
}

/* bf16 x (the bf16 tile): one panel of bf16_nx rows a task, rounded to
 * bf16 and packed by the kernels, panel p at xt + p * bf16_nx * pairs(K). */
static void bf16_pack_task(void *ctx, int task, int worker)
{
    const mm_job *j = ctx;
    int K = j->w->cols, NX = j->mm->k->bf16_nx, i0 = task * NX, rows = j->n - i0 < NX ? j->n - i0 : NX;
    j->mm->k->bf16_pack_x(j->x + (size_t)i0 * K, K, rows, (uint32_t *)j->mm->xt + (size_t)i0 * pairs(K));
}

/* A tile's shape, and the room of a weight row in the worker's wt. */
static int tile_mr(const mm_job *j) { return j->bf16 ? j->mm->k->bf16_mr : j->mm->k->tile_mr; }
static int tile_nx(const mm_job *j) { return j->bf16 ? j->mm->k->bf16_nx : j->mm->k->tile_nx; }
static int row_floats(const mm_job *j) { return j->bf16 ? pairs(j->w->cols) : wt_stride(j->w->cols); }

/* Weight rows r0 .. r0 + mr into wt: decoded to float32, or repacked
 * (bf16_pack_w) for the bf16 tile. */
static void load_tile(const mm_job *j, int r0, int mr, float *wt)
{
    const lmx_cpu_kernels *k = j->mm->k;
    int K = j->w->cols;
    if (j->bf16) {
        k->bf16_pack_w((const uint16_t *)j->w->data + (size_t)r0 * K, K, mr, (uint32_t *)wt);
        return;
    }
    for (int r = 0; r < mr; r++)
        k->decode(j->w, r0 + r, wt + (size_t)r * wt_stride(K));
}

/* A tile of mr rows loaded at wt against the panel of x at row i0. */
static void run_tile(const mm_job *j, const float *wt, int mr, int i0, int nx, float *out)
{
    const lmx_cpu_kernels *k = j->mm->k;
    int K = j->w->cols, N = j->w->rows;
    if (j->bf16)
        k->bf16_tile((const uint32_t *)wt, mr, K, (const uint32_t *)j->mm->xt + (size_t)i0 * pairs(K), nx, out, N);
    else
        k->tile(wt, wt_stride(K), mr, K, j->mm->xt + (size_t)i0 * K, k->tile_nx, nx, out, N);
}

/* One block of weight rows (block_rows), loaded once, against all of x:
 * panel by panel, every tile of the block. */
static void tile_task(void *ctx, int task, int worker)
{
    const mm_job *j = ctx;
    int N = j->w->rows, MR = tile_mr(j), NX = tile_nx(j), mb = block_rows(MR, row_floats(j)), r0 = task * mb;
    int rows = N - r0 < mb ? N - r0 : mb;
    size_t ldt = (size_t)MR * (size_t)row_floats(j); /* from one tile to the next in wt */
    float *wt = j->mm->wt[worker];
    for (int t = 0; t < rows; t += MR)
        load_tile(j, r0 + t, rows - t < MR ? rows - t : MR, wt + t / MR * ldt);
    for (int i0 = 0; i0 < j->n; i0 += NX) {
        int nx = j->n - i0 < NX ? j->n - i0 : NX;
        for (int t = 0; t < rows; t += MR)
            run_tile(j, wt + t / MR * ldt, rows - t < MR ? rows - t : MR, i0, nx, j->out + (size_t)i0 * N + r0 + t);
    }
}

/* AMX (bf16 weights): x packed as bf16 hi and lo parts in blocks of 16
 * rows, then bands of 32 weight rows against all of it. */
static void amx_pack_task(void *ctx, int task, int worker)
{
    const mm_job *j = ctx;
    int K = j->w->cols, i0 = task * 16, rows = j->n - i0 < 16 ? j->n - i0 : 16;
    uint16_t *hi = (uint16_t *)j->mm->xt, *lo = hi + (size_t)j->ldx * K;
    if (rows < 0) /* a block of padding */
        rows = 0, i0 = j->n;
    j->mm->k->amx_pack_x(j->x + (size_t)i0 * K, K, rows, hi + (size_t)task * 16 * K, lo + (size_t)task * 16 * K);
}

/* Weights other than bf16 are decoded and split into bf16 hi and lo parts
 * first, into the worker's buffer. q4 keeps only hi: rounding a q4 weight
 * to bf16 moves it ~1/30 as far as quantizing it did (docs/quantization.md),
 * and it saves the third tile product. */
static void amx_gemm_task(void *ctx, int task, int worker)
{
    const mm_job *j = ctx;
    const lmx_cpu_kernels *k = j->mm->k;
    int K = j->w->cols, r0 = task * 32, keep_lo = j->w->kind != LMX_WK_Q4;
    uint16_t *hi = (uint16_t *)j->mm->xt, *lo = hi + (size_t)j->ldx * K;
    const uint16_t *w = (const uint16_t *)j->w->data + (size_t)r0 * K, *wlo = NULL;
    if (j->w->kind != LMX_WK_BF16) {
        float *row = j->mm->wt[worker];
        uint16_t *wh = (uint16_t *)(row + K), *wl = wh + (size_t)32 * K;
        for (int r = 0; r < 32; r++) {
            k->decode(j->w, r0 + r, row);
            k->amx_split(row, K, wh + (size_t)r * K, keep_lo ? wl + (size_t)r * K : NULL);
        }
        w = wh;
        wlo = keep_lo ? wl : NULL;
    }
    k->amx_gemm(w, wlo, K, hi, lo, j->n, j->out + r0, j->w->rows);
}

/* Integer GEMM tiles (q8/q4 where the path has qgemm) -------------------- */

/* The panels' arrays (lmx_cpu_xpanels) in xt, for ldx rows of x; lo
 * (x's residual) for q8 only. */
typedef struct qpanels {
    int32_t *q, *lo;
    float *d, *b;
} qpanels;

static qpanels qpanel_arrays(const mm_job *j)
{
    size_t K = (size_t)j->w->cols, ng = K / (size_t)j->w->group, ldx = (size_t)j->ldx;
    qpanels p = {(int32_t *)j->mm->xt, NULL, NULL, NULL};
    p.d = (float *)(p.q + ldx * K / 4);
    if (j->w->kind == LMX_WK_Q8)
        p.lo = (int32_t *)p.d, p.d += ldx * K / 4;
    p.b = p.d + ldx * ng;
    return p;
}

static size_t qpanel_floats(const lmx_cpu_weight *w, int ldx)
{
    int quads = w->cols / 4 * (w->kind == LMX_WK_Q8 ? 2 : 1);
    return (size_t)ldx * (size_t)(quads + 2 * (w->cols / w->group));
}

/* x's bytes 4c .. 4c + 3 to q[c * NX] (a panel's column of a row). */
static void scatter_quads(int32_t *q, const int8_t *x, int K, int NX)
{
    for (int c = 0; c < K / 4; c++)
        memcpy(q + (size_t)c * NX, x + 4 * c, 4);
}

/* One panel of x rows quantized (q4: as decode's, in natural order; q8:
 * finer, quant_x_fine) and scattered into the panels, a row at a time
 * through the worker's wt. */
static void qpack_task(void *ctx, int task, int worker)
{
    const mm_job *j = ctx;
    const lmx_cpu_kernels *k = j->mm->k;
    int K = j->w->cols, G = j->w->group, ng = K / G, NX = k->qgemm_nx;
    qpanels p = qpanel_arrays(j);
    size_t qo = (size_t)task * NX * K / 4, go = (size_t)task * NX * ng;
    float *xd = (float *)j->mm->wt[worker];
    int32_t *xqsum = (int32_t *)(xd + ng);
    int8_t *xq = (int8_t *)(xqsum + ng), *xr = xq + K;
    for (int i = 0; i < NX; i++) {
        int r = task * NX + i;
        if (r >= j->n) /* padding: zero rows add nothing */
            memset(xd, 0, (size_t)ng * (sizeof *xd + sizeof *xqsum) + 2 * (size_t)K);
        else if (p.lo)
            k->quant_x_fine(j->x + (size_t)r * K, K, G, xq, xr, xd, xqsum);
        else
            k->quant_x(j->x + (size_t)r * K, K, G, 0, xq, xd, xqsum);
        scatter_quads(p.q + qo + i, xq, K, NX);
        if (p.lo)
            scatter_quads(p.lo + qo + i, xr, K, NX);
        for (int g = 0; g < ng; g++)
            p.d[go + g * NX + i] = xd[g], p.b[go + g * NX + i] = xd[g] * (float)xqsum[g];
    }
}

static void qgemm_task(void *ctx, int task, int worker)
{
    const mm_job *j = ctx;
    qpanels p = qpanel_arrays(j);
    lmx_cpu_xpanels xp = {p.q, p.lo, p.d, p.b};
    int r0 = task * j->mm->k->qgemm_mr;
    j->mm->k->qgemm(j->w, r0, &xp, j->n, j->out + r0, j->w->rows, j->mm->wt[worker]);
}

static int ensure_xt(lmx_cpu_mm *mm, size_t need)
{
    if (need <= mm->xt_cap)
        return 0;
    lmx_bigbuf b = need <= SIZE_MAX / sizeof(float) ? lmx_bigbuf_alloc(need * sizeof(float)) : (lmx_bigbuf){0};
    if (!b.data)
        return -1;
    lmx_bigbuf_free(&mm->xt_buf);
    mm->xt_buf = b;
    mm->xt = b.data;
    mm->xt_cap = need;
    return 0;
}

void lmx_cpu_mm_run(lmx_cpu_mm *mm, float *out, const float *x, int n, const lmx_cpu_weight *w)
{
    pthread_mutex_lock(&mm->lock);
    const lmx_cpu_kernels *k = mm->k;
    int amx = k->amx_gemm && w->rows % 32 == 0 && w->cols % 32 == 0;
    int qgemm = k->qgemm && (w->kind == LMX_WK_Q8 || w->kind == LMX_WK_Q4);
    int bf16 = mm->bf16_x && w->kind == LMX_WK_BF16 && !amx;
    int nx = amx ? 32 : qgemm ? k->qgemm_nx : bf16 ? k->bf16_nx : k->tile_nx;
    int ldx = (n + nx - 1) / nx * nx;
    /* AMX: hi and lo, uint16 each, in the room of one float per element */
    size_t need = qgemm ? qpanel_floats(w, ldx) : (size_t)ldx * (size_t)(bf16 ? pairs(w->cols) : w->cols);
    /* q4 without AMX or qgemm: the integer matvec kernels on x rounded to
     * 8 bits (as decode), MV_ROWS rows a pass, beat decoding q4 weights to
     * float32 tiles; q8's decode is cheaper and its tiles win there
     * (docs/quantization.md) */
    mm_job j = {mm, w, x, n, ldx, out, bf16};
    if (n <= MV_ROWS || (w->kind == LMX_WK_Q4 && !amx && !qgemm) || ensure_xt(mm, need)) {
        run_matvec(mm, out, x, n, w); /* also the fallback when memory is short */
    } else if (amx) {
        lmx_pool_run(mm->pool, ldx / 16, amx_pack_task, &j);
        lmx_pool_run(mm->pool, w->rows / 32, amx_gemm_task, &j);
    } else if (qgemm) {
        lmx_pool_run(mm->pool, ldx / nx, qpack_task, &j);
        lmx_pool_run(mm->pool, (w->rows + k->qgemm_mr - 1) / k->qgemm_mr, qgemm_task, &j);
    } else {
        if (bf16)
            lmx_pool_run(mm->pool, ldx / nx, bf16_pack_task, &j);
        else
            lmx_pool_run(mm->pool, (w->cols + PACK_COLS - 1) / PACK_COLS, pack_task, &j);
        int mb = block_rows(tile_mr(&j), row_floats(&j));
        lmx_pool_run(mm->pool, (w->rows + mb - 1) / mb, tile_task, &j);
    }
    pthread_mutex_unlock(&mm->lock);
}
