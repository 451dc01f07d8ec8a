#include "threadpool.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <unistd.h>

struct lmx_pool {
    int n_threads;
    pthread_t *workers;
    pthread_mutex_t run_lock; /* one job at a time */
    pthread_mutex_t lock;
    pthread_cond_t wake, done;
    /* the current job */
    void (*fn)(void *ctx, int task);
    void *ctx;
    int n_tasks;
    atomic_int next_task;
    int busy;          /* workers still inside the current job */
    unsigned long gen; /* job counter: workers wait for it to change */
    int quit;
};

static void drain(lmx_pool *p)
{
    int t;
    while ((t = atomic_fetch_add(&p->next_task, 1)) < p->n_tasks)
        p->fn(p->ctx, t);
}

static void *worker(void *arg)
{
    lmx_pool *p = arg;
    unsigned long seen = 0;
    pthread_mutex_lock(&p->lock);
    for (;;) {
        while (!p->quit && p->gen == seen)
            pthread_cond_wait(&p->wake, &p->lock);
        if (p->quit)
            break;
        seen = p->gen;
        pthread_mutex_unlock(&p->lock);
        drain(p);
        pthread_mutex_lock(&p->lock);
        if (--p->busy == 0)
            pthread_cond_signal(&p->done);
    }
    pthread_mutex_unlock(&p->lock);
    return NULL;
}

lmx_pool *lmx_pool_new(int n_threads)
{
    if (n_threads <= 0) {
        long n = sysconf(_SC_NPROCESSORS_ONLN);
        n_threads = n > 0 ? (int)n : 1;
    }
    lmx_pool *p = calloc(1, sizeof *p);
    if (!p)
        return NULL;
    p->n_threads = n_threads;
    pthread_mutex_init(&p->run_lock, NULL);
    pthread_mutex_init(&p->lock, NULL);
    pthread_cond_init(&p->wake, NULL);
    pthread_cond_init(&p->done, NULL);
    p->workers = calloc((size_t)n_threads, sizeof *p->workers);
    if (!p->workers) {
        lmx_pool_free(p);
        return NULL;
    }
    for (int i = 1; i < n_threads; i++)
        if (pthread_create(&p->workers[i], NULL, worker, p) != 0) {
            p->n_threads = i; /* the ones started so far get joined */
            lmx_pool_free(p);
            return NULL;
        }
    return p;
}

void lmx_pool_free(lmx_pool *p)
{
    if (!p)
        return;
    pthread_mutex_lock(&p->lock);
    p->quit = 1;
    pthread_cond_broadcast(&p->wake);
    pthread_mutex_unlock(&p->lock);
    for (int i = 1; p->workers && i < p->n_threads; i++)
        pthread_join(p->workers[i], NULL);
    free(p->workers);
    pthread_cond_destroy(&p->wake);
    pthread_cond_destroy(&p->done);
    pthread_mutex_destroy(&p->lock);
    pthread_mutex_destroy(&p->run_lock);
    free(p);
}

int lmx_pool_threads(const lmx_pool *p) { return p->n_threads; }

void lmx_pool_run(lmx_pool *p, int n_tasks, void (*fn)(void *ctx, int task), void *ctx)
{
    if (n_tasks <= 0)
        return;
    pthread_mutex_lock(&p->run_lock);
    if (p->n_threads == 1 || n_tasks == 1) {
        for (int t = 0; t < n_tasks; t++)
            fn(ctx, t);
        pthread_mutex_unlock(&p->run_lock);
        return;
    }
    pthread_mutex_lock(&p->lock);
    p->fn = fn;
    p->ctx = ctx;
    p->n_tasks = n_tasks;
    atomic_store(&p->next_task, 0);
    p->busy = p->n_threads - 1;
    p->gen++;
    pthread_cond_broadcast(&p->wake);
    pthread_mutex_unlock(&p->lock);
    drain(p);
    pthread_mutex_lock(&p->lock);
    while (p->busy > 0)
        pthread_cond_wait(&p->done, &p->lock);
    pthread_mutex_unlock(&p->lock);
    pthread_mutex_unlock(&p->run_lock);
}
