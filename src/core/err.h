/*
 * err.h - the one error convention of the AutoCompress library.
 *
 * Every fallible library call returns int: 0 on success, -1 on failure, and
 * on failure fills the caller's ac_err with a one-line human message. The
 * library never prints and never exits; the daemon and CLI decide what to do
 * with the message (log it, put it in an HTTP body, fail a job with it).
 */
#ifndef AC_ERR_H
#define AC_ERR_H

#include <stddef.h>

typedef struct ac_err {
    char msg[512];
} ac_err;

/* Format a message into e (if not NULL) and return -1, so error paths read
 * `return ac_errf(e, "bad thing %d", x);`. */
int ac_errf(ac_err *e, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* Prefix an existing message: "ctx: old message". Returns -1. */
int ac_errctx(ac_err *e, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* Read a whole file into a NUL-terminated heap buffer; *len gets its size. */
char *ac_read_file(const char *path, size_t max_len, size_t *len, ac_err *e);

/* Monotonic clock in seconds. */
double ac_now(void);

#endif
