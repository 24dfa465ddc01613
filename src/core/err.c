/* err.c - error formatting and small checked helpers (see err.h). */
#include "core/err.h"

#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

int ac_errf(ac_err *e, const char *fmt, ...) {
    if (e) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(e->msg, sizeof e->msg, fmt, ap);
        va_end(ap);
    }
    return -1;
}

int ac_errctx(ac_err *e, const char *fmt, ...) {
    if (e) {
        char prefix[256], old[sizeof e->msg];
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(prefix, sizeof prefix, fmt, ap);
        va_end(ap);
        memcpy(old, e->msg, sizeof old);
        size_t pl = strlen(prefix);
        if (pl > sizeof e->msg - 3) pl = sizeof e->msg - 3;
        memcpy(e->msg, prefix, pl);
        memcpy(e->msg + pl, ": ", 2);
        size_t room = sizeof e->msg - pl - 3, ol = strnlen(old, sizeof old);
        if (ol > room) ol = room;
        memcpy(e->msg + pl + 2, old, ol);
        e->msg[pl + 2 + ol] = 0;
    }
    return -1;
}

char *ac_read_file(const char *path, size_t max_len, size_t *len, ac_err *e) {
    /* O_NONBLOCK + fstat: a FIFO or a device is refused, never waited on. */
    int fd = open(path, O_RDONLY | O_NONBLOCK | O_CLOEXEC);
    struct stat sb;
    if (fd < 0 || fstat(fd, &sb) != 0 || !S_ISREG(sb.st_mode)) {
        if (fd >= 0) {
            close(fd);
            ac_errf(e, "%s is not a regular file", path);
        } else
            ac_errf(e, "cannot open %s: %s", path, strerror(errno));
        return NULL;
    }
    FILE *f = fdopen(fd, "rb");
    if (!f) {
        close(fd);
        ac_errf(e, "cannot open %s: %s", path, strerror(errno));
        return NULL;
    }
    size_t cap = 1 << 16, n = 0;
    char *buf = malloc(cap + 1);
    if (!buf) {
        fclose(f);
        ac_errf(e, "out of memory reading %s", path);
        return NULL;
    }
    for (;;) {
        if (n == cap) {
            if (cap >= max_len) {
                free(buf);
                fclose(f);
                ac_errf(e, "%s is larger than %zu bytes", path, max_len);
                return NULL;
            }
            cap *= 2;
            char *nb = realloc(buf, cap + 1);
            if (!nb) {
                free(buf);
                fclose(f);
                ac_errf(e, "out of memory reading %s", path);
                return NULL;
            }
            buf = nb;
        }
        size_t r = fread(buf + n, 1, cap - n, f);
        n += r;
        if (r == 0) break;
    }
    int bad = ferror(f);
    fclose(f);
    if (bad || n > max_len) {
        free(buf);
        ac_errf(e, bad ? "read error on %s" : "%s is larger than %zu bytes", path, max_len);
        return NULL;
    }
    buf[n] = 0;
    if (len) *len = n;
    return buf;
}

double ac_now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}
