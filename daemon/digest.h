/*
 * digest.h - the daemon's one SHA-256, through GnuTLS (which libmicrohttpd's
 * TLS already brings): API tokens are stored as it (auth.c), per-job secrets
 * too (jobsecret.c), and stage checkpoints are keyed by the spec's
 * (worker.c). Digests are compared in constant time.
 */
#ifndef AC_DIGEST_H
#define AC_DIGEST_H

#include <stddef.h>

#include "autocompress.h"

#define DIGEST_HEX_LEN 64 /* a SHA-256 as lowercase hex */

/* The SHA-256 of the n bytes at data as lowercase hex and a NUL. */
int digest_sha256_hex(const void *data, size_t n, char hex[DIGEST_HEX_LEN + 1], ac_err *e);
/* 1 when the n bytes at a and b are equal, in a time that depends on n only. */
int digest_equal(const void *a, const void *b, size_t n);

#endif
