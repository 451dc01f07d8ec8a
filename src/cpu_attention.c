/* Attention on the CPU (cpu_attention.h). Decode (one query row) scores
 * and accumulates key by key with the path's dot and axpy kernels, its
 * keys cut into parts when there are few KV heads; prefill runs each block
 * of keys against a block of queries as two small matrix products on the
 * path's GEMM tile. */
#include "cpu_attention.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

typedef struct attn_job {
    const lmx_cpu_kernels *k;
    float *out;
    const float *q;
    const void *kc, *vc; /* float32, or float16 with f16 */
    int f16, cap, split; /* split: parts each query's keys are cut into */
    const lmx_attn_params *p;
    float *part;    /* split > 1: per task and query, m, l and the unscaled sum */
    float *scratch; /* prefill: tile_floats() per worker */
} attn_job;

/* Keys a block; queries a task in decode (ATTN_ROWS) and prefill
 * (TILE_ROWS: as many as the widest GEMM tile takes at once). */
enum { ATTN_BLOCK = 64, ATTN_ROWS = 16, TILE_ROWS = 32 };

/* Query qi of KV head kvh (rows, then the heads of the group): its row, and
 * where it sits in q and out. */
static int attn_query(const lmx_attn_params *p, int kvh, int qi, size_t *at)
{
    int G = p->n_heads / p->n_kv_heads, row = qi / G, h = kvh * G + qi % G;
    *at = (size_t)row * p->n_heads * p->head_dim + (size_t)h * p->head_dim;
    return row;
}

/* The task's queries q0 .. q0 + nr - 1 of KV head kvh: each one's position,
 * first visible key, place in q and out, and an empty softmax (m, l). */
static void task_queries(const lmx_attn_params *p, int kvh, int q0, int nr, int *pos, int *lo, size_t *at,
                         float *m, float *l)
{
    for (int r = 0; r < nr; r++) {
        pos[r] = p->pos0 + attn_query(p, kvh, q0 + r, &at[r]);
        lo[r] = p->window > 0 && pos[r] - p->window + 1 > 0 ? pos[r] - p->window + 1 : 0;
        m[r] = -INFINITY;
        l[r] = 0;
    }
}

/* The block of keys from t0 (before end): up to ATTN_BLOCK consecutive
 * cache slots, ending at the ring's end; *blk: its first element in
 * kv head kvh's cache. */
static int key_block(const attn_job *j, int kvh, int t0, int end, size_t *blk)
{
    int slot0 = t0 % j->cap, nb = end - t0;
    nb = nb < ATTN_BLOCK ? nb : ATTN_BLOCK;
    nb = nb < j->cap - slot0 ? nb : j->cap - slot0;
    *blk = ((size_t)kvh * j->cap + (size_t)slot0) * j->p->head_dim;
    return nb;
}

/* The keys [*b0, *b1) of a block of nb from t0 that a query at pos, seeing
 * keys from lo, sees (empty when *b0 >= *b1). */
static void visible(int lo, int pos, int t0, int nb, int *b0, int *b1)
{
    *b0 = lo > t0 ? lo - t0 : 0;
    *b1 = pos + 1 - t0 < nb ? pos + 1 - t0 : nb;
}

/* s[b] = q . (key b) for nb keys from element `at` of the cache. */
static void attn_scores(const attn_job *j, const float *q, size_t at, int nb, float *s)
{
    int hd = j->p->head_dim;
    if (j->f16)
        j->k->attn_scores_f16(q, (const uint16_t *)j->kc + at, hd, nb, hd, s);
    else
        j->k->attn_scores(q, (const float *)j->kc + at, hd, nb, hd, s);
}

/* acc += sum_b p[b] (value b) for nb values from element `at` of the cache. */
static void attn_accum(const attn_job *j, float *acc, size_t at, int nb, const float *p)
{
    int hd = j->p->head_dim;
    if (j->f16)
        j->k->attn_accum_f16(acc, (const uint16_t *)j->vc + at, hd, p, nb, hd);
    else
        j->k->attn_accum(acc, (const float *)j->vc + at, hd, p, nb, hd);
}

/* One query's online-softmax step over a block of n scores (scaled; keys
 * it must not see at -inf, which stay so): the softcap, the block's
 * maximum, the running maximum m and sum l brought up to date, the scores
 * replaced by their exponentials. Returns the factor by which the running
 * output sums are to be rescaled (1: none). */
static float softmax_step(const lmx_cpu_kernels *k, float *s, int n, float softcap, float *m, float *l)
{
    float bm = -INFINITY, corr = 1; /* loops of their own: the maximum and the exponentials vectorise */
    if (softcap > 0)
        for (int b = 0; b < n; b++)
            if (s[b] > -INFINITY)
                s[b] = softcap * tanhf(s[b] / softcap);
    for (int b = 0; b < n; b++)
        bm = s[b] > bm ? s[b] : bm;
    if (bm > *m) {
        corr = expf(*m - bm);
        *l *= corr;
        *m = bm;
    }
    *l += k->softmax_exp(s, *m, n); /* no visible key yet: m = -inf, every exponential 0 */
    return corr;
}

/* One KV head for a block of up to ATTN_ROWS queries, taken row by row
 * and, within a row, over the query heads that share the KV head (GQA), so
 * that each key and value is read once per block of queries, not once per
 * query head. Keys come in blocks of ATTN_BLOCK consecutive cache slots,
 * each scored and accumulated by every query of the task while it is in
 * cache, with an online softmax (one rescale per query and block); memory
 * stays constant whatever the context length. A query sees keys [lo, pos],
 * a contiguous part of each block. With a split (decode), the task takes
 * one part of the key range and leaves its partial softmax for the merge. */
static void attn_task(void *ctx, int task, int worker)
{
    const attn_job *j = ctx;
    const lmx_cpu_kernels *kern = j->k;
    const lmx_attn_params *p = j->p;
    int hd = p->head_dim, nq = p->n_rows * (p->n_heads / p->n_kv_heads), part = task % j->split;
    int kvh = task / j->split % p->n_kv_heads, q0 = task / j->split / p->n_kv_heads * ATTN_ROWS;
    int nr = nq - q0 < ATTN_ROWS ? nq - q0 : ATTN_ROWS;
    float acc[ATTN_ROWS][hd], sc[ATTN_BLOCK], m[ATTN_ROWS], l[ATTN_ROWS];
    int lo[ATTN_ROWS] = {0}, pos[ATTN_ROWS] = {0}; /* nr >= 1; the zeroes keep -Wmaybe-uninitialized quiet */
    size_t at[ATTN_ROWS];                         /* where query r sits in q and out */
    task_queries(p, kvh, q0, nr, pos, lo, at, m, l);
    memset(acc, 0, sizeof acc);
    int span = pos[nr - 1] + 1 - lo[0], end = lo[0] + (int)((long)span * (part + 1) / j->split);
    for (int t0 = lo[0] + (int)((long)span * part / j->split); t0 < end;) {
        size_t blk;
        int nb = key_block(j, kvh, t0, end, &blk);
        for (int r = 0; r < nr; r++) {
            int b0, b1;
            visible(lo[r], pos[r], t0, nb, &b0, &b1);
            if (b0 >= b1)
                continue;
            attn_scores(j, j->q + at[r], blk + (size_t)b0 * hd, b1 - b0, sc);
            int n = b1 - b0;
            for (int b = 0; b < n; b++)
                sc[b] *= p->scale;
            float f = softmax_step(kern, sc, n, p->softcap, &m[r], &l[r]);
            if (f != 1)
                kern->scale(acc[r], f, hd);
            attn_accum(j, acc[r], blk + (size_t)b0 * hd, b1 - b0, sc);
        }
        t0 += nb;
    }
    for (int r = 0; r < nr; r++) {
        if (j->split > 1) {
            float *o = j->part + ((size_t)task * ATTN_ROWS + r) * (hd + 2);
            o[0] = m[r], o[1] = l[r];
            memcpy(o + 2, acc[r], sizeof acc[r]);
        } else {
            for (int d = 0; d < hd; d++)
                j->out[at[r] + d] = acc[r][d] / l[r];
        }
    }
}

/* Decode's parts of each query's keys, combined: each part's sums scaled
 * by e^(its max - the overall max). */
static void attn_merge(const attn_job *j, int n_tasks)
{
    const lmx_attn_params *p = j->p;
    int hd = p->head_dim, nq = p->n_rows * (p->n_heads / p->n_kv_heads);
    for (int t = 0; t < n_tasks; t += j->split) {
        int kvh = t / j->split % p->n_kv_heads, q0 = t / j->split / p->n_kv_heads * ATTN_ROWS;
        for (int r = 0; r < ATTN_ROWS && q0 + r < nq; r++) {
            size_t at, stride = (size_t)ATTN_ROWS * (hd + 2);
            attn_query(p, kvh, q0 + r, &at);
            const float *o = j->part + ((size_t)t * ATTN_ROWS + r) * (hd + 2);
            float mx = -INFINITY, l = 0, *dst = j->out + at;
            for (int s = 0; s < j->split; s++)
                mx = o[s * stride] > mx ? o[s * stride] : mx;
            memset(dst, 0, (size_t)hd * sizeof *dst);
            for (int s = 0; s < j->split; s++) {
                const float *ps = o + s * stride;
                float f = ps[1] > 0 ? expf(ps[0] - mx) : 0; /* a part may hold no key of this query */
                l += f * ps[1];
                j->k->axpy(dst, f, ps + 2, hd);
            }
            j->k->scale(dst, 1.0f / l, hd);
        }
    }
}


/* Prefill ------------------------------------------------------------------ */

static int round_up(int n, int m) { return (n + m - 1) / m * m; }

/* Per-worker scratch of the tiled prefill, in floats: a block of keys and
 * one of values converted from float16 (plus what the tile reads past
 * them: tile_mr key rows, tile_nx value columns), the task's queries transposed
 * [hd][ldq], the scores [TILE_ROWS rounded to tile_mr][ATTN_BLOCK], one
 * block's P.V transposed and the running sums transposed, [hd][ldq]. */
static int tile_ldq(const lmx_cpu_kernels *k) { return round_up(TILE_ROWS, k->tile_nx); }
static size_t tile_floats(const lmx_cpu_kernels *k, int hd)
{
    size_t ldq = (size_t)tile_ldq(k);
    return (size_t)(ATTN_BLOCK + k->tile_mr) * hd + (size_t)ATTN_BLOCK * hd + (size_t)k->tile_nx +
           3 * (size_t)hd * ldq + (size_t)round_up(TILE_ROWS, k->tile_mr) * ATTN_BLOCK;
}

size_t lmx_cpu_attention_slack(const lmx_cpu_kernels *k, int cols)
{
    return (size_t)k->tile_mr * cols + (size_t)k->tile_nx;
}

/* nb rows of a cache from element `at` as float32: in place for a float32
 * cache (the tiles' reads past them stay inside the cache's slack), else
 * converted into dst by the path's row decoder. */
static const float *block_f32(const attn_job *j, const void *cache, size_t at, int nb, float *dst)
{
    if (!j->f16)
        return (const float *)cache + at;
    int hd = j->p->head_dim;
    lmx_cpu_weight w = {.kind = LMX_WK_F16, .rows = nb, .cols = hd, .data = (const uint16_t *)cache + at};
    for (int b = 0; b < nb; b++)
        j->k->decode(&w, b, dst + (size_t)b * hd);
    return dst;
}

/* One KV head for up to TILE_ROWS queries (as attn_task), each block of
 * keys as two products on the GEMM tile: scores S = Q.K^T (the keys as the
 * tile's weight rows, the queries, scaled, packed dimension-major), an
 * online softmax over S's rows, then (P.V)^T (P's rows as weight rows, the
 * values as the packed side), added into the running sums. */
static void tile_task(void *ctx, int task, int worker)
{
    const attn_job *j = ctx;
    const lmx_cpu_kernels *k = j->k;
    const lmx_attn_params *p = j->p;
    int hd = p->head_dim, nq = p->n_rows * (p->n_heads / p->n_kv_heads), ldq = tile_ldq(k);
    int kvh = task % p->n_kv_heads, q0 = task / p->n_kv_heads * TILE_ROWS;
    int nr = nq - q0 < TILE_ROWS ? nq - q0 : TILE_ROWS;
    float *kbuf = j->scratch + (size_t)worker * tile_floats(k, hd);
    float *vbuf = kbuf + (size_t)(ATTN_BLOCK + k->tile_mr) * hd;
    float *qt = vbuf + (size_t)ATTN_BLOCK * hd + k->tile_nx, *pv = qt + (size_t)hd * ldq, *acc = pv + (size_t)hd * ldq;
    float *s = acc + (size_t)hd * ldq, m[TILE_ROWS], l[TILE_ROWS], corr[TILE_ROWS];
    int lo[TILE_ROWS] = {0}, pos[TILE_ROWS] = {0}; /* nr >= 1; the zeroes keep -Wmaybe-uninitialized quiet */
    size_t at[TILE_ROWS];
    task_queries(p, kvh, q0, nr, pos, lo, at, m, l);
    for (int r = 0; r < nr; r++)
        for (int d = 0; d < hd; d++)
            qt[(size_t)d * ldq + r] = j->q[at[r] + d] * p->scale;
    memset(acc, 0, (size_t)hd * ldq * sizeof *acc);
    for (int t0 = lo[0]; t0 <= pos[nr - 1];) {
        size_t blk;
        int nb = key_block(j, kvh, t0, pos[nr - 1] + 1, &blk);
        const float *kb = block_f32(j, j->kc, blk, nb, kbuf), *vb = block_f32(j, j->vc, blk, nb, vbuf);
        for (int b0 = 0; b0 < nb; b0 += k->tile_mr)
            for (int i0 = 0; i0 < nr; i0 += k->tile_nx)
                k->tile(kb + (size_t)b0 * hd, hd, nb - b0 < k->tile_mr ? nb - b0 : k->tile_mr, hd, qt + i0, ldq,
                        nr - i0 < k->tile_nx ? nr - i0 : k->tile_nx, s + (size_t)i0 * ATTN_BLOCK + b0, ATTN_BLOCK);
        for (int r = 0; r < nr; r++) { /* query r sees the block's keys [b0, b1) */
            float *sr = s + (size_t)r * ATTN_BLOCK;
            int b0, b1;
            visible(lo[r], pos[r], t0, nb, &b0, &b1);
            for (int b = 0; b < nb; b++)
                if (b < b0 || b >= b1)
                    sr[b] = -INFINITY;
            corr[r] = softmax_step(k, sr, nb, p->softcap, &m[r], &l[r]);
        }
        for (int r0 = 0; r0 < nr; r0 += k->tile_mr)
            for (int d0 = 0; d0 < hd; d0 += k->tile_nx)
                k->tile(s + (size_t)r0 * ATTN_BLOCK, ATTN_BLOCK, nr - r0 < k->tile_mr ? nr - r0 : k->tile_mr, nb,
                        vb + d0, hd, hd - d0 < k->tile_nx ? hd - d0 : k->tile_nx, pv + (size_t)d0 * ldq + r0, ldq);
        for (int d = 0; d < hd; d++) {
            float *a = acc + (size_t)d * ldq, *v = pv + (size_t)d * ldq;
            for (int r = 0; r < nr; r++)
                a[r] = a[r] * corr[r] + v[r];
        }
        t0 += nb;
    }
    for (int r = 0; r < nr; r++)
        for (int d = 0; d < hd; d++)
            j->out[at[r] + d] = acc[(size_t)d * ldq + r] / l[r];
}

void lmx_cpu_attention(const lmx_cpu_kernels *k, lmx_pool *pool, float *out, const float *q, const void *kc,
                       const void *vc, int f16, int cap, const lmx_attn_params *p)
{
    attn_job j = {k, out, q, kc, vc, f16, cap, 1, p, NULL, NULL};
    int nq = p->n_rows * (p->n_heads / p->n_kv_heads), threads = lmx_pool_threads(pool);
    /* without memory for the tiles' scratch, prefill takes decode's way */
    if (p->n_rows > 1 && (j.scratch = calloc((size_t)threads * tile_floats(k, p->head_dim), sizeof(float)))) {
        lmx_pool_run(pool, (nq + TILE_ROWS - 1) / TILE_ROWS * p->n_kv_heads, tile_task, &j);
        free(j.scratch);
        return;
    }
    int tasks = (nq + ATTN_ROWS - 1) / ATTN_ROWS * p->n_kv_heads;
    /* decode with fewer KV heads than 2 tasks a thread (Gemma3-1B has one):
     * the keys cut into parts of at least a block, so that every thread works */
    int want = 2 * threads, keys = p->pos0 + 1 < cap ? p->pos0 + 1 : cap;
    if (p->n_rows == 1 && tasks < want) {
        int split = (want + tasks - 1) / tasks;
        split = split < keys / ATTN_BLOCK ? split : keys / ATTN_BLOCK;
        if (split > 1 && (j.part = malloc((size_t)tasks * split * ATTN_ROWS * (p->head_dim + 2) * sizeof(float))))
            j.split = split;
    }
    lmx_pool_run(pool, tasks * j.split, attn_task, &j);
    if (j.split > 1)
        attn_merge(&j, tasks * j.split);
    free(j.part);
}
