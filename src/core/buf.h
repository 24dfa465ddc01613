/*
 * buf.h - the growing byte buffer (the one such type in the library and the
 * daemon): GGUF metadata, HTTP request bodies, SSE streams, worker output.
 */
#ifndef AC_BUF_H
#define AC_BUF_H

#include <stdarg.h>
#include <stddef.h>

typedef struct {
    char *data; /* malloc'd, or NULL while empty */
    size_t len, cap;
} ac_buf;

/* Room for n more bytes: cap doubles from 4096 until len + n fits. A cap
 * past max (0: no limit) or a failed realloc leaves b as it was: -1. */
int ac_buf_reserve(ac_buf *b, size_t n, size_t max);
/* n bytes at the end (ac_buf_reserve, then copied): 0 or -1. */
int ac_buf_append(ac_buf *b, const void *p, size_t n, size_t max);
/* printf at the end (kept NUL-terminated, the NUL not counted in len): 0, or
 * -1 (out of memory, or past max) with b as it was. */
int ac_buf_printf(ac_buf *b, size_t max, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
int ac_buf_vprintf(ac_buf *b, size_t max, const char *fmt, va_list ap) __attribute__((format(printf, 3, 0)));
/* Drop the first n bytes (memmove of the rest to the front). */
void ac_buf_consume(ac_buf *b, size_t n);
/* Free the bytes; b is empty again. */
void ac_buf_free(ac_buf *b);

#endif
