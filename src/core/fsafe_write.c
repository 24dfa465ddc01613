/* fsafe_write.c - see fsafe_write.h. */
#include "core/fsafe_write.h"

#include <errno.h>
#include <fcntl.h>
#include <linux/openat2.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define CONFINED (RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS | RESOLVE_NO_MAGICLINKS)

/* Where path lives: the base directory fd (a root's, or AT_FDCWD), the
 * path relative to it, and whether symlinks are refused. */
typedef struct {
    int base;
    const char *rel;
    int confined;
    char root_shown[AC_FSAFE_PATH_MAX]; /* the named path's prefix up to the root, for messages */
    char norm[AC_FSAFE_PATH_MAX];
} place;

static int locate(const char *path, place *pl, ac_err *e) {
    char n2[AC_FSAFE_PATH_MAX];
    if (path && path[0] == '/' && ac_fsafe_normalize(path, n2, NULL) == 0 && ac_fsafe_special(n2))
        return ac_errf(e, "%.300s: nothing is written under /proc, /sys or /dev", path);
    if (ac_fsafe_nroots()) {
        if (ac_fsafe_normalize(path, pl->norm, e)) return ac_errctx(e, "%.300s", path);
        pl->base = ac_fsafe_root_of(pl->norm, &pl->rel);
        if (pl->base < 0) return ac_errf(e, "%.300s is outside the allowed model_roots", path);
        size_t pre = strcmp(pl->rel, ".") ? (size_t)(pl->rel - pl->norm) : strlen(pl->norm) + 1;
        snprintf(pl->root_shown, sizeof pl->root_shown, "%.*s", (int)(pre ? pre - 1 : 0), pl->norm);
        pl->confined = 1;
        return 0;
    }
    if (!path || !path[0] || strnlen(path, AC_FSAFE_PATH_MAX) >= AC_FSAFE_PATH_MAX - 64)
        return ac_errf(e, "bad path");

    snprintf(pl->norm, sizeof pl->norm, "%s", path);
    pl->base = AT_FDCWD;
    pl->rel = pl->norm;
    pl->root_shown[0] = 0;
    pl->confined = 0;
    return 0;
}

/* The message for a refused open of rel (errno err) below pl. */
static int refused(const place *pl, const char *rel, const char *path, int err, ac_err *e) {
    if (err == ELOOP || err == EXDEV) {
        char link[AC_FSAFE_PATH_MAX + 8];
        ac_fsafe_first_link(pl->base, rel, pl->root_shown, link, sizeof link);
        if (link[0]) return ac_errf(e, "%.300s: %.300s is a symbolic link; it is not followed", path, link);
        return ac_errf(e, "%.300s: a symbolic link on the way is not followed", path);
    }
    if (err == ENOENT) return ac_errf(e, "%.300s: its directory does not exist", path);
    if (err == ENOTDIR) return ac_errf(e, "%.300s: a component of its directory is not a directory", path);
    return ac_errf(e, "cannot open the directory of %.300s: %s", path, strerror(err));
}

int ac_fsafe_mkdirs(const char *path, ac_err *e) {
    place pl;
    if (locate(path, &pl, e)) return -1;
    char buf[AC_FSAFE_PATH_MAX];
    snprintf(buf, sizeof buf, "%s", pl.rel);
    char *p = buf;
    int cur = pl.base, nofollow = pl.confined ? O_NOFOLLOW : 0;
    if (*p == '/') {
        if ((cur = open("/", O_PATH | O_DIRECTORY | O_CLOEXEC)) < 0)
            return ac_errf(e, "cannot open /: %s", strerror(errno));
        while (*p == '/') p++;
    }
    int rc = 0;
    while (*p && strcmp(p, ".")) {
        char *slash = strchr(p, '/');
        if (slash) *slash = 0;
        if (mkdirat(cur, p, 0755) && errno != EEXIST) {
            rc = ac_errf(e, "cannot create %.300s (at %.200s): %s", path, p, strerror(errno));
            break;
        }
        int fd = openat(cur, p, O_PATH | O_DIRECTORY | O_CLOEXEC | nofollow), err = errno;
        struct stat sb;
        int is_link = nofollow && fstatat(cur, p, &sb, AT_SYMLINK_NOFOLLOW) == 0 && S_ISLNK(sb.st_mode);
        if (fd >= 0 && is_link) { /* O_PATH|O_NOFOLLOW may open the link itself */
            close(fd);
            fd = -1;
        }
        if (fd < 0) {
            char sofar[AC_FSAFE_PATH_MAX];
            snprintf(sofar, sizeof sofar, "%.*s", (int)((size_t)(p - buf) + strlen(p)), pl.rel);
            if (is_link)
                rc = ac_errf(e, "cannot create %.300s: %.300s%s%.300s is a symbolic link; it is not followed", path,
                             pl.root_shown, sofar[0] == '/' || !pl.root_shown[0] ? "" : "/", sofar);
            else if (err == ENOTDIR)
                rc = ac_errf(e, "cannot create %.300s: %.300s is not a directory", path, sofar);
            else
                rc = ac_errf(e, "cannot create %.300s: %s", path, strerror(err));
            break;
        }
        if (cur != pl.base) close(cur);
        cur = fd;
        if (!slash) break;
        p = slash + 1;
    }
    if (cur != pl.base) close(cur);
    return rc;
}

int ac_fsafe_create(const char *path, ac_wfile *w, ac_err *e) {
    memset(w, 0, sizeof *w);
    w->dirfd = -1;
    place pl;
    if (locate(path, &pl, e)) return -1;
    snprintf(w->path, sizeof w->path, "%s", path);
    const char *slash = strrchr(pl.rel, '/');
    const char *name = slash ? slash + 1 : pl.rel;
    if (!name[0] || !strcmp(name, ".") || strlen(name) >= sizeof w->name)
        return ac_errf(e, "%.300s: not a file name", path);
    snprintf(w->name, sizeof w->name, "%s", name);
    char dir[AC_FSAFE_PATH_MAX];
    if (!slash)
        snprintf(dir, sizeof dir, ".");
    else if (slash == pl.rel)
        snprintf(dir, sizeof dir, "/");
    else
        snprintf(dir, sizeof dir, "%.*s", (int)(slash - pl.rel), pl.rel);
    w->dirfd = ac_fsafe_openat(pl.base, dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC,
                               pl.confined ? CONFINED : RESOLVE_NO_MAGICLINKS);
    if (w->dirfd < 0) return refused(&pl, dir, path, errno, e);
    for (unsigned i = 0; i < 100; i++) {
        snprintf(w->tmp, sizeof w->tmp, ".%.200s.%d.%u.tmp", name, (int)getpid(), i);
        int fd = openat(w->dirfd, w->tmp, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0644);
        if (fd < 0 && errno == EEXIST) continue;
        if (fd < 0) break;
        if (!(w->f = fdopen(fd, "wb"))) {
            close(fd);
            unlinkat(w->dirfd, w->tmp, 0);
            break;
        }
        return 0;
    }
    int err = errno;
    close(w->dirfd);
    w->dirfd = -1;
    return ac_errf(e, "cannot create %.300s: %s", path, strerror(err));
}

void ac_fsafe_discard(ac_wfile *w) {
    if (w->f) {
        fclose(w->f);
        unlinkat(w->dirfd, w->tmp, 0);
    }
    if (w->dirfd >= 0) close(w->dirfd);
    w->f = NULL;
    w->dirfd = -1;
}

int ac_fsafe_commit(ac_wfile *w, ac_err *e) {
    if (!w->f) return ac_errf(e, "%.300s: not open", w->path);
    int ok = fflush(w->f) == 0 && fsync(fileno(w->f)) == 0, err = errno;
    if (fclose(w->f) != 0 && ok) ok = 0, err = errno;
    w->f = NULL;
    int rc = 0;
    struct stat sb;
    if (!ok)
        rc = ac_errf(e, "cannot write %.300s: %s", w->path, strerror(err));
    else if (fstatat(w->dirfd, w->name, &sb, AT_SYMLINK_NOFOLLOW) == 0 && S_ISLNK(sb.st_mode))
        rc = ac_errf(e, "%.300s is a symbolic link; it is not followed nor replaced", w->path);
    else if (renameat(w->dirfd, w->tmp, w->dirfd, w->name))
        rc = ac_errf(e, "cannot write %.300s: %s", w->path, strerror(errno));
    else
        fsync(w->dirfd); /* the new name on disk; a failure here loses nothing written */
    if (rc) unlinkat(w->dirfd, w->tmp, 0);
    close(w->dirfd);
    w->dirfd = -1;
    return rc;
}

int ac_fsafe_write(const char *path, const void *data, size_t n, ac_err *e) {
    ac_wfile w;
    if (ac_fsafe_create(path, &w, e)) return -1;
    if (n && fwrite(data, 1, n, w.f) != n) {
        int err = errno;
        ac_fsafe_discard(&w);
        return ac_errf(e, "cannot write %.300s: %s", path, strerror(err));
    }
    return ac_fsafe_commit(&w, e);
}

int ac_fsafe_write_json(const char *path, const json_t *j, size_t flags, ac_err *e) {
    ac_wfile w;
    if (ac_fsafe_create(path, &w, e)) return -1;
    if (json_dumpf(j, w.f, flags) || fputc('\n', w.f) == EOF) {
        ac_fsafe_discard(&w);
        return ac_errf(e, "cannot write %.300s", path);
    }
    return ac_fsafe_commit(&w, e);
}
