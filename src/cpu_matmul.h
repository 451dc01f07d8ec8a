/* out[n, N] = x[n, K] * w[N, K]^T on the thread pool: a matrix-vector
 * kernel that streams each weight once for a few rows of x (decode), a
 * tiled matrix-matrix kernel for many (prefill). */
#ifndef LMX_CPU_MATMUL_H
#define LMX_CPU_MATMUL_H

#include "cpu_kernels.h"
#include "threadpool.h"

typedef struct lmx_cpu_mm lmx_cpu_mm;

/* Scratch for a pool of n_threads; NULL on allocation failure. bf16_x: 1 =
 * in products of more than a few rows of x with bf16 weights, x rounded to
 * bf16 for the kernels' bf16 tile (lmx_load_options.prefill_bf16), where
 * the path has one and the CPU runs it; else float32 x. */
lmx_cpu_mm *lmx_cpu_mm_new(const lmx_cpu_kernels *k, lmx_pool *pool, int bf16_x);
/* 1 if mm rounds x to bf16 as above (bf16_x asked for and granted). */
int lmx_cpu_mm_bf16_x(const lmx_cpu_mm *mm);
void lmx_cpu_mm_free(lmx_cpu_mm *mm);
/* Makes room for weights of up to cols columns (called as weights are
 * bound, so that running never fails); -1 on allocation failure. */
int lmx_cpu_mm_reserve(lmx_cpu_mm *mm, int cols);
/* Runs the product; calls from several threads are serialised. */
void lmx_cpu_mm_run(lmx_cpu_mm *mm, float *out, const float *x, int n, const lmx_cpu_weight *w);

#endif
