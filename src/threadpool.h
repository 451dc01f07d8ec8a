/* A persistent pool of worker threads: no thread is created per op. Idle
 * workers spin for a short while before sleeping, so the many small jobs
 * of a decode step start within a microsecond or so. */
#ifndef LMX_THREADPOOL_H
#define LMX_THREADPOOL_H

typedef struct lmx_pool lmx_pool;

/* n_threads total workers including the caller; 0 = all online cores.
 * Returns NULL on failure. */
lmx_pool *lmx_pool_new(int n_threads);
void lmx_pool_free(lmx_pool *p);
int lmx_pool_threads(const lmx_pool *p);

/* Calls fn(ctx, task, worker) for every task in [0, n_tasks), spread over
 * the workers and the caller; worker in [0, lmx_pool_threads) names the
 * thread (0 = the caller), for per-thread scratch. Returns when all are
 * done. Calls from several threads at once are serialised. */
void lmx_pool_run(lmx_pool *p, int n_tasks, void (*fn)(void *ctx, int task, int worker), void *ctx);

#endif
