/*
 * jobsecret.h - the per-job secret a worker on another host (a Slurm node)
 * posts its events with (executor_slurm.c): made from the kernel's random
 * source, handed to the worker in a mode-0600 file in the job's directory,
 * and kept by the daemon only as its SHA-256 (digest.h), so a copy of the
 * database (a backup, a leaked file) posts nothing. A presented secret is
 * checked by hashing it and comparing the digests in constant time.
 */
#ifndef AC_JOBSECRET_H
#define AC_JOBSECRET_H

#include <stddef.h>

#include "autocompress.h"

#define JOBSECRET_BYTES 32                       /* random bytes in a secret */
#define JOBSECRET_LEN (2 * JOBSECRET_BYTES)      /* its length as lowercase hex */
#define JOBSECRET_HASH_LEN 64                    /* a SHA-256 as lowercase hex */

/* A new secret: JOBSECRET_LEN hex digits and a NUL into out (n >= JOBSECRET_LEN + 1). */
int jobsecret_new(char *out, size_t n, ac_err *e);
/* The SHA-256 of secret as lowercase hex and a NUL into hash (JOBSECRET_HASH_LEN + 1 bytes). */
int jobsecret_hash(const char *secret, char hash[JOBSECRET_HASH_LEN + 1], ac_err *e);
/* 1 when secret (may be NULL) hashes to hash (a jobsecret_hash value), else 0.
 * The digests are compared in constant time; an empty hash matches nothing. */
int jobsecret_matches(const char *secret, const char *hash);

#endif
