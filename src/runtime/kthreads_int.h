/*
 * kthreads_int.h - fork/join of a kernel's shares over pthreads: the BF16 GEMMs
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

/* Multiply-adds a BF16 GEMM must give each thread before ac_kthreads_gemm
 * starts another: 2^24, about 110 us of one thread of the AVX512-BF16
 * kernel, where starting and joining a thread for a call cost about 100 us
 * on the project's AMD EPYC VM (pthread_create + join alone 48 us; the rest
 * the new thread's cold caches and first AVX-512 use). Below it a split
 * lost: 128 x 128 x 384 took 73 us on one thread and 154 us on two. */
#define AC_KTHREADS_GEMM_MIN_MACS (1 << 24)
/* ac_kthreads_count for a GEMM of `macs` multiply-adds: no more jobs than
 * macs / AC_KTHREADS_GEMM_MIN_MACS (at least 1). */
int ac_kthreads_gemm(int threads, int shares, double macs);
/* Replace AC_KTHREADS_GEMM_MIN_MACS (m <= 0: back to it), so that tests can
 * split small GEMMs over threads. Process-wide and not thread-safe. */
void ac_kthreads_set_gemm_min_macs(double m);
/* Run fn on jobs[0 .. n) (`size` bytes each), n <= AC_KTHREADS_MAX, and
 * return when all are done; a job whose thread cannot be created runs on
 * the calling thread. */
void ac_kthreads_run(void *(*fn)(void *), void *jobs, size_t size, int n);

#endif
