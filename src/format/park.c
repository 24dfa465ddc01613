/* park.c - see park.h. The file holds the matrices in ac_model_each_matrix's
 * order, raw BF16, each at a multiple of PARK_ALIGN bytes; the model's
 * wmap is an st_set of one st_file with no tensor table, so that
 * ac_model_drop_pages and ac_model_free treat it as they treat a resident
 * model's safetensors. */
#include "format/park.h"

#include <errno.h>
#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "core/dtype.h"
#include "core/fsafe_write.h"
#include "format/safetensors.h"
#include "model_int.h"

#define PARK_ALIGN 64

static uint64_t pad_of(uint64_t off) { return (PARK_ALIGN - off % PARK_ALIGN) % PARK_ALIGN; }

typedef struct {
    FILE *f;
    uint64_t off;
} park_writer;

static int write_fn(void *ud, float **p, size_t n) {
    static const char zeros[PARK_ALIGN];
    park_writer *w = ud;
    uint64_t pad = pad_of(w->off);
    if ((pad && fwrite(zeros, 1, pad, w->f) != pad) || fwrite(*p, 2, n, w->f) != n) return -1;
    w->off += pad + 2 * (uint64_t)n;
    return 0;
}

typedef struct {
    char *base;
    uint64_t off;
} park_pointer;

static int point_fn(void *ud, float **p, size_t n) {
    park_pointer *r = ud;
    r->off += pad_of(r->off);
    free(*p);
    *p = (float *)(r->base + r->off);
    r->off += 2 * (uint64_t)n;
    return 0;
}

/* The file to write: where the directory's filesystem has them, an unnamed
 * one beside path (O_TMPFILE: nothing is left if the process dies while it
 * writes; the named temporary ac_fsafe_create made goes at once), else that
 * temporary. *rfd: a descriptor to map it by (-1: open the temporary's
 * name). */
static FILE *park_file(ac_wfile *w, int *rfd) {
    *rfd = -1;
    int fd = openat(w->dirfd, ".", O_TMPFILE | O_RDWR | O_CLOEXEC, 0600);
    FILE *f = fd >= 0 ? fdopen(fd, "wb") : NULL;
    if (!f) {
        if (fd >= 0) close(fd);
        return w->f;
    }
    *rfd = fd;
    ac_fsafe_discard(w);
    return f;
}

int ac_model_park(ac_model *m, const char *path, ac_err *e) {
    if (ac_model_wdt(m) != ST_BF16 || !m->wown || m->wmap)
        return ac_errf(e, "parking %s: an owned BF16 model only", path);
    ac_wfile w;
    if (ac_fsafe_create(path, &w, e)) return -1;
    int fd;
    FILE *out = park_file(&w, &fd);
    park_writer pw = {out, 0};
    int err = 0;
    if (ac_model_each_matrix(m, write_fn, &pw) || fflush(out)) err = errno ? errno : EIO;
    void *map = MAP_FAILED;
    size_t len = (size_t)pw.off;
    if (!err && len) {
        /* the named temporary is write-only: mapped through a read-only descriptor of it */
        int rd = fd >= 0 ? fd : openat(w.dirfd, w.tmp, O_RDONLY | O_NOFOLLOW | O_CLOEXEC);
        if (rd < 0 || (map = mmap(NULL, len, PROT_READ, MAP_SHARED, rd, 0)) == MAP_FAILED) err = errno;
        if (rd >= 0 && rd != fd) close(rd);
    }
    if (fd >= 0)
        fclose(out);
    else
        ac_fsafe_discard(&w); /* the name goes; the mapping keeps the data */
    st_set *set = map != MAP_FAILED ? calloc(1, sizeof *set) : NULL;
    st_file *f = set ? calloc(1, sizeof *f) : NULL;
    if (!f) {
        if (map != MAP_FAILED) munmap(map, len);
        free(set);
        if (!err && !len) return ac_errf(e, "parking %s: the model has no matrices", path);
        return ac_errf(e, "cannot park the model in %s: %s", path, err ? strerror(err) : "out of memory");
    }
    f->map = map;
    f->map_len = len;
    set->n = 1;
    set->files = f;
    park_pointer pr = {map, 0};
    ac_model_each_matrix(m, point_fn, &pr); /* cannot fail: every matrix to its place, its heap copy freed */
    m->wown = 0;
    m->wmap = set;
    return 0;
}
