/* pool.c - see pool.h. A mutex, a condition variable and a ring of tasks. */
#include "pool.h"

#include <pthread.h>
#include <stdlib.h>

typedef struct {
    pool_fn fn;
    void *arg;
} task;

struct pool {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    task *ring;
    int cap, head, n, stopping, nthreads;
    pthread_t *threads;
};

static void *run(void *arg) {
    pool *p = arg;
    for (;;) {
        pthread_mutex_lock(&p->mu);
        while (p->n == 0 && !p->stopping) pthread_cond_wait(&p->cv, &p->mu);
        if (p->n == 0) {
            pthread_mutex_unlock(&p->mu);
            return NULL;
        }
        task t = p->ring[p->head];
        p->head = (p->head + 1) % p->cap;
        p->n--;
        pthread_mutex_unlock(&p->mu);
        t.fn(t.arg);
    }
}

pool *pool_new(int nthreads, int max_queue) {
    pool *p = calloc(1, sizeof *p);
    if (!p) return NULL;
    p->cap = max_queue > 0 ? max_queue : 64;
    p->ring = calloc((size_t)p->cap, sizeof *p->ring);
    p->threads = calloc((size_t)nthreads, sizeof *p->threads);
    if (!p->ring || !p->threads) {
        free(p->ring);
        free(p->threads);
        free(p);
        return NULL;
    }
    pthread_mutex_init(&p->mu, NULL);
    pthread_cond_init(&p->cv, NULL);
    for (int i = 0; i < nthreads; i++) {
        if (pthread_create(&p->threads[i], NULL, run, p)) break;
        p->nthreads++;
    }
    if (p->nthreads == 0) {
        pool_free(p);
        return NULL;
    }
    return p;
}

int pool_submit(pool *p, pool_fn fn, void *arg) {
    pthread_mutex_lock(&p->mu);
    int ok = !p->stopping && p->n < p->cap;
    if (ok) {
        p->ring[(p->head + p->n) % p->cap] = (task){fn, arg};
        p->n++;
        pthread_cond_signal(&p->cv);
    }
    pthread_mutex_unlock(&p->mu);
    return ok ? 0 : -1;
}

void pool_free(pool *p) {
    if (!p) return;
    pthread_mutex_lock(&p->mu);
    p->stopping = 1;
    pthread_cond_broadcast(&p->cv);
    pthread_mutex_unlock(&p->mu);
    for (int i = 0; i < p->nthreads; i++) pthread_join(p->threads[i], NULL);
    pthread_mutex_destroy(&p->mu);
    pthread_cond_destroy(&p->cv);
    free(p->ring);
    free(p->threads);
    free(p);
}
