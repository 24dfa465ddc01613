/*
 * pool.h - a few threads for the HTTP front's blocking work. The HTTP
 * server has one polling thread; any handler that touches the file system
 * (job path checks, estimates that read config.json, job logs, static
 * files) suspends its connection, runs here, and resumes it with the reply
 * ready. The queue is bounded: a full queue is an immediate 503.
 */
#ifndef AC_POOL_H
#define AC_POOL_H

typedef struct pool pool;
typedef void (*pool_fn)(void *arg);

/* NULL when threads cannot be started. */
pool *pool_new(int nthreads, int max_queue);
/* 0 queued, -1 the queue is full or the pool is stopping. */
int pool_submit(pool *p, pool_fn fn, void *arg);
/* Run what is queued, then join the threads and free the pool. */
void pool_free(pool *p);

#endif
