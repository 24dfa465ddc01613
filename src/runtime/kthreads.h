/*
 * kthreads.h - fork/join of a kernel's shares over pthreads: the BF16 GEMMs
 * (kernels_amx.c, kernels_avx512bf16.c) split their output columns into
 * `n` jobs and run job 0 on the calling thread, the others on threads
 * created for the call. Owns nothing; the jobs are the caller's.
 */
#ifndef AC_KTHREADS_H
#define AC_KTHREADS_H

#include <stddef.h>

#define AC_KTHREADS_MAX 16

/* How many jobs to split `shares` units of work over with up to `threads`
 * threads: at least 1, at most AC_KTHREADS_MAX and at most shares. */
int ac_kthreads_count(int threads, int shares);
/* Run fn on jobs[0 .. n) (`size` bytes each), n <= AC_KTHREADS_MAX, and
 * return when all are done; a job whose thread cannot be created runs on
 * the calling thread. */
void ac_kthreads_run(void *(*fn)(void *), void *jobs, size_t size, int n);

#endif
