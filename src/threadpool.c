#include "threadpool.h"

#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <time.h>
#include <unistd.h>

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define cpu_relax() _mm_pause()
#else
#define cpu_relax() ((void)0)
#endif

/* How long an idle worker spins before it sleeps: long enough to bridge
 * the gaps between the ops of one forward pass, short enough not to burn a
 * core between requests. */
enum { SPIN_NS = 50000 };

typedef struct worker_arg {
    struct lmx_pool *p;
    int index;
} worker_arg;

struct lmx_pool {
    int n_threads;
    pthread_t *workers;
    worker_arg *args;
    pthread_mutex_t run_lock; /* one job at a time */
    pthread_mutex_t lock;     /* guards sleeping */
    pthread_cond_t wake;
    /* the current job, published by the release store to gen */
    void (*fn)(void *ctx, int task, int worker);
    void *ctx;
    int n_tasks;
    atomic_int next_task;
    atomic_int busy;     /* workers still inside the current job */
    atomic_ulong gen;    /* job counter: workers wait for it to change */
    atomic_int sleepers; /* workers inside (or about to enter) cond_wait */
    atomic_int quit;
};

static long long now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (long long)ts.tv_sec * 1000000000LL + ts.tv_nsec;
}

static void drain(lmx_pool *p, int worker)
{
    int t;
    while ((t = atomic_fetch_add(&p->next_task, 1)) < p->n_tasks)
        p->fn(p->ctx, t, worker);
}

/* Waits until gen moves past seen (or quit): spins, then sleeps. */
static void wait_job(lmx_pool *p, unsigned long seen)
{
    long long until = 0;
    for (unsigned i = 0;; i++) {
        if (atomic_load(&p->gen) != seen || atomic_load(&p->quit))
            return;
        cpu_relax();
        if ((i & 255) != 255)
            continue;
        long long t = now_ns();
        if (!until)
            until = t + SPIN_NS;
        else if (t > until)
            break;
    }
    pthread_mutex_lock(&p->lock);
    atomic_fetch_add(&p->sleepers, 1);
    /* sleepers is raised before gen is re-read; the publisher bumps gen
     * before reading sleepers: one of the two sees the other. */
    while (atomic_load(&p->gen) == seen && !atomic_load(&p->quit))
        pthread_cond_wait(&p->wake, &p->lock);
    atomic_fetch_sub(&p->sleepers, 1);
    pthread_mutex_unlock(&p->lock);
}

static void *worker(void *arg)
{
    worker_arg *a = arg;
    lmx_pool *p = a->p;
    unsigned long seen = 0;
    for (;;) {
        wait_job(p, seen);
        if (atomic_load(&p->quit))
            break;
        seen = atomic_load(&p->gen);
        drain(p, a->index);
        atomic_fetch_sub(&p->busy, 1);
    }
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
    p->workers = calloc((size_t)n_threads, sizeof *p->workers);
    p->args = calloc((size_t)n_threads, sizeof *p->args);
    if (!p->workers || !p->args) {
        p->n_threads = 1;
        lmx_pool_free(p);
        return NULL;
    }
    for (int i = 1; i < n_threads; i++) {
        p->args[i] = (worker_arg){p, i};
        if (pthread_create(&p->workers[i], NULL, worker, &p->args[i]) != 0) {
            p->n_threads = i; /* the ones started so far get joined */
            lmx_pool_free(p);
            return NULL;
        }
    }
    return p;
}

void lmx_pool_free(lmx_pool *p)
{
    if (!p)
        return;
    pthread_mutex_lock(&p->lock);
    atomic_store(&p->quit, 1);
    pthread_cond_broadcast(&p->wake);
    pthread_mutex_unlock(&p->lock);
    for (int i = 1; p->workers && i < p->n_threads; i++)
        pthread_join(p->workers[i], NULL);
    free(p->workers);
    free(p->args);
    pthread_cond_destroy(&p->wake);
    pthread_mutex_destroy(&p->lock);
    pthread_mutex_destroy(&p->run_lock);
    free(p);
}

int lmx_pool_threads(const lmx_pool *p) { return p->n_threads; }

void lmx_pool_run(lmx_pool *p, int n_tasks, void (*fn)(void *ctx, int task, int worker), void *ctx)
{
    if (n_tasks <= 0)
        return;
    pthread_mutex_lock(&p->run_lock);
    if (p->n_threads == 1 || n_tasks == 1) {
        for (int t = 0; t < n_tasks; t++)
            fn(ctx, t, 0);
        pthread_mutex_unlock(&p->run_lock);
        return;
    }
    p->fn = fn;
    p->ctx = ctx;
    p->n_tasks = n_tasks;
    atomic_store(&p->next_task, 0);
    atomic_store(&p->busy, p->n_threads - 1);
    atomic_fetch_add(&p->gen, 1);
    if (atomic_load(&p->sleepers) > 0) {
        pthread_mutex_lock(&p->lock);
        pthread_cond_broadcast(&p->wake);
        pthread_mutex_unlock(&p->lock);
    }
    drain(p, 0);
    /* the workers finish their last task; yield if one is descheduled */
    for (unsigned i = 0; atomic_load(&p->busy) > 0; i++) {
        cpu_relax();
        if (i > 4096)
            sched_yield();
    }
    pthread_mutex_unlock(&p->run_lock);
}
