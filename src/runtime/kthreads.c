/* kthreads.c - see kthreads_int.h. */
#include "kthreads_int.h"

#include <pthread.h>

int ac_kthreads_count(int threads, int shares) {
    int t = threads < 1 ? 1 : threads > AC_KTHREADS_MAX ? AC_KTHREADS_MAX : threads;
    return t > shares && shares > 0 ? shares : t;
}

static double gemm_min_macs = AC_KTHREADS_GEMM_MIN_MACS;

void ac_kthreads_set_gemm_min_macs(double m) { gemm_min_macs = m > 0 ? m : AC_KTHREADS_GEMM_MIN_MACS; }

int ac_kthreads_gemm(int threads, int shares, double macs) {
    double cap = macs / gemm_min_macs;
    int t = ac_kthreads_count(threads, shares);
    return cap < 1 ? 1 : cap < t ? (int)cap : t;
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
