/* buf.c - see buf.h. */
#include "core/buf.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int ac_buf_reserve(ac_buf *b, size_t n, size_t max) {
    if (n > (size_t)-1 / 4 - b->len) return -1;
    size_t need = b->len + n;
    if (need <= b->cap) return 0;
    size_t c = b->cap ? b->cap : 4096;
    while (c < need) c *= 2;
    if (max && c > max) return -1;
    char *q = realloc(b->data, c);
    if (!q) return -1;
    b->data = q;
    b->cap = c;
    return 0;
}

int ac_buf_append(ac_buf *b, const void *p, size_t n, size_t max) {
    if (ac_buf_reserve(b, n, max)) return -1;
    if (n) memcpy(b->data + b->len, p, n);
    b->len += n;
    return 0;
}

int ac_buf_vprintf(ac_buf *b, size_t max, const char *fmt, va_list ap) {
    va_list aq;
    va_copy(aq, ap);
    int n = vsnprintf(NULL, 0, fmt, aq);
    va_end(aq);
    if (n < 0 || ac_buf_reserve(b, (size_t)n + 1, max)) return -1;
    vsnprintf(b->data + b->len, (size_t)n + 1, fmt, ap);
    b->len += (size_t)n;
    return 0;
}

int ac_buf_printf(ac_buf *b, size_t max, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    int rc = ac_buf_vprintf(b, max, fmt, ap);
    va_end(ap);
    return rc;
}

void ac_buf_consume(ac_buf *b, size_t n) {
    if (n >= b->len) {
        b->len = 0;
        return;
    }
    memmove(b->data, b->data + n, b->len - n);
    b->len -= n;
}

void ac_buf_free(ac_buf *b) {
    free(b->data);
    b->data = NULL;
    b->len = b->cap = 0;
}
