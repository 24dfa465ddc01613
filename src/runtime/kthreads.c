/* kthreads.c - see kthreads.h. */
#include "kthreads.h"

#include <pthread.h>

int ac_kthreads_count(int threads, int shares) {
    int t = threads < 1 ? 1 : threads > AC_KTHREADS_MAX ? AC_KTHREADS_MAX : threads;
    return t > shares && shares > 0 ? shares : t;
}

void ac_kthreads_run(void *(*fn)(void *), void *jobs, size_t size, int n) {
    pthread_t th[AC_KTHREADS_MAX];
    int started[AC_KTHREADS_MAX] = {0};
    char *j = jobs;
    if (n > AC_KTHREADS_MAX) n = AC_KTHREADS_MAX;
    for (int t = 1; t < n; t++) started[t] = pthread_create(&th[t], NULL, fn, j + (size_t)t * size) == 0;
    if (n > 0) fn(j);
    for (int t = 1; t < n; t++) {
        if (started[t])
            pthread_join(th[t], NULL);
        else
            fn(j + (size_t)t * size); /* no thread: do its share here */
    }
}
