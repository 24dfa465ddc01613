/* fsafe.c - see fsafe.h. */
#include "core/fsafe.h"

#include <errno.h>
#include <fcntl.h>
#include <linux/openat2.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <linux/magic.h>
#include <sys/stat.h>
#include <sys/statfs.h>
#include <sys/syscall.h>
#include <unistd.h>

typedef struct {
    char named[AC_FSAFE_PATH_MAX]; /* as configured, normalized */
    char real[AC_FSAFE_PATH_MAX];  /* realpath at start */
    int fd;                        /* O_PATH directory */
} root_t;

static root_t roots[AC_FSAFE_MAX_ROOTS];
static int nroots;

static const size_t caps[AC_FK_NKINDS] = {
    4u << 20, 64u << 20, 128u << 20, 1u << 30, (size_t)2 << 40, 16u << 20,
};
static const char *kind_names[AC_FK_NKINDS] = {"config", "index", "tokenizer", "text", "weights", "cost table"};

size_t ac_fsafe_cap(ac_fkind k) { return k < AC_FK_NKINDS ? caps[k] : 0; }
int ac_fsafe_nroots(void) { return nroots; }

int ac_fsafe_normalize(const char *path, char *out, ac_err *e) {
    if (!path || path[0] != '/') return ac_errf(e, "must be an absolute path");
    size_t n = strnlen(path, AC_FSAFE_PATH_MAX);
    if (n >= AC_FSAFE_PATH_MAX - 64) return ac_errf(e, "path is longer than %d bytes", AC_FSAFE_PATH_MAX - 64);
    size_t o = 0;
    const char *p = path;
    while (*p) {
        while (*p == '/') p++;
        const char *s = p;
        while (*p && *p != '/') p++;
        size_t cl = (size_t)(p - s);
        if (cl == 0 || (cl == 1 && s[0] == '.')) continue;
        if (cl == 2 && s[0] == '.' && s[1] == '.') return ac_errf(e, "must not contain '..'");
        out[o++] = '/';
        memcpy(out + o, s, cl);
        o += cl;
    }
    if (o == 0) out[o++] = '/';
    out[o] = 0;
    return 0;
}

int ac_fsafe_join(const char *dir, const char *name, char *out, size_t n, ac_err *e) {
    int w = snprintf(out, n, "%s/%s", dir, name);
    if (w < 0 || (size_t)w >= n) return ac_errf(e, "path %.60s.../%s is too long", dir, name);
    return 0;
}

int ac_fsafe_set_roots(const char *const *list, int n, ac_err *e) {
    for (int i = 0; i < nroots; i++) close(roots[i].fd);
    nroots = 0;
    if (n > AC_FSAFE_MAX_ROOTS) return ac_errf(e, "at most %d model roots", AC_FSAFE_MAX_ROOTS);
    for (int i = 0; i < n; i++) {
        root_t *r = &roots[nroots];
        if (ac_fsafe_normalize(list[i], r->named, e)) return ac_errctx(e, "model root %s", list[i]);
        char *rp = realpath(r->named, NULL);
        if (!rp) return ac_errf(e, "model root %s: %s", list[i], strerror(errno));
        snprintf(r->real, sizeof r->real, "%s", rp);
        free(rp);
        r->fd = open(r->real, O_PATH | O_DIRECTORY | O_CLOEXEC);
        if (r->fd < 0) return ac_errf(e, "model root %s: %s", list[i], strerror(errno));
        nroots++;
    }
    return 0;
}

/* The part of norm below prefix ("." for the prefix itself), or NULL. */
static const char *below(const char *norm, const char *prefix) {
    size_t pl = strlen(prefix);
    if (pl == 1) return norm[1] ? norm + 1 : "."; /* root "/" */
    if (strncmp(norm, prefix, pl) != 0) return NULL;
    if (norm[pl] == 0) return ".";
    return norm[pl] == '/' ? norm + pl + 1 : NULL;
}

/* Which root holds norm: index and the relative path, or -1. */
static int find_root(const char *norm, const char **rel) {
    for (int i = 0; i < nroots; i++) {
        const char *r = below(norm, roots[i].named);
        if (!r) r = below(norm, roots[i].real);
        if (r) {
            *rel = r;
            return i;
        }
    }
    return -1;
}

int ac_fsafe_root_of(const char *norm, const char **rel) {
    int r = find_root(norm, rel);
    return r < 0 ? -1 : roots[r].fd;
}

/* Test hook: AC_FSAFE_NO_OPENAT2=1 takes the per-component path as on a
 * kernel without openat2. */
static int no_openat2(void) {
    const char *s = getenv("AC_FSAFE_NO_OPENAT2");
    return s && s[0] == '1';
}

/* openat2's fallback: each directory component opened O_NOFOLLOW (when
 * symlinks are refused) relative to the one before; the last with flags. */
static int walk_open(int dirfd, const char *rel, int flags, unsigned long long resolve) {
    int nofollow = (resolve & RESOLVE_NO_SYMLINKS) ? O_NOFOLLOW : 0;
    if (!strcmp(rel, ".")) return openat(dirfd, ".", flags);
    char buf[AC_FSAFE_PATH_MAX];
    snprintf(buf, sizeof buf, "%s", rel);
    char *p = buf;
    int cur = dirfd, owned = 0;
    if (*p == '/') { /* absolute (no roots): start at "/" */
        if ((cur = open("/", O_PATH | O_DIRECTORY | O_CLOEXEC)) < 0) return -1;
        owned = 1;
        while (*p == '/') p++;
    }
    for (;;) {
        char *slash = strchr(p, '/');
        if (slash) *slash = 0;
        int last = !slash || !slash[1];
        int fd = *p ? openat(cur, p, last ? flags | nofollow : O_PATH | O_DIRECTORY | O_CLOEXEC | nofollow)
                    : openat(cur, ".", flags);
        int err = errno;
        struct stat lsb; /* O_NOFOLLOW|O_DIRECTORY on a link says ENOTDIR: say ELOOP, as openat2 does */
        if (fd < 0 && err == ENOTDIR && nofollow && *p && fstatat(cur, p, &lsb, AT_SYMLINK_NOFOLLOW) == 0 &&
            S_ISLNK(lsb.st_mode))
            err = ELOOP;
        if (owned) close(cur);
        if (fd < 0) {
            errno = err;
            return -1;
        }
        /* O_PATH|O_NOFOLLOW opens a symlink itself: refuse it here */
        struct stat sb;
        if (nofollow && fstat(fd, &sb) == 0 && S_ISLNK(sb.st_mode)) {
            close(fd);
            errno = ELOOP;
            return -1;
        }
        if (last) return fd;
        cur = fd;
        owned = 1;
        p = slash + 1;
    }
}

int ac_fsafe_openat(int dirfd, const char *p, int flags, unsigned long long resolve) {
    if (!no_openat2()) {
        struct open_how how;
        memset(&how, 0, sizeof how);
        how.flags = (unsigned long long)flags;
        how.resolve = resolve;
        int fd = (int)syscall(SYS_openat2, dirfd, p, &how, sizeof how);
        if (fd >= 0 || errno != ENOSYS) return fd;
    }
    return walk_open(dirfd, p, flags, resolve);
}
#define sys_openat2 ac_fsafe_openat

void ac_fsafe_first_link(int dirfd, const char *rel, const char *shown_prefix, char *out, size_t n) {
    out[0] = 0;
    char buf[AC_FSAFE_PATH_MAX];
    snprintf(buf, sizeof buf, "%s", rel);
    for (char *p = buf + (buf[0] == '/');; p++) {
        char c = *p;
        if (c == '/' || c == 0) {
            *p = 0;
            struct stat sb;
            if (buf[0] && fstatat(dirfd, buf, &sb, AT_SYMLINK_NOFOLLOW) == 0 && S_ISLNK(sb.st_mode)) {
                snprintf(out, n, "%s%s%.300s", shown_prefix, shown_prefix[0] && buf[0] != '/' ? "/" : "", buf);
                return;
            }
            *p = c;
            if (!c) return;
        }
    }
}

int ac_fsafe_special(const char *norm) {
    static const char *const tops[] = {"/proc", "/sys", "/dev"};
    for (size_t i = 0; i < sizeof tops / sizeof *tops; i++) {
        size_t l = strlen(tops[i]);
        if (!strncmp(norm, tops[i], l) && (norm[l] == 0 || norm[l] == '/')) return 1;
    }
    return 0;
}

/* An open file on procfs or sysfs (reached through a symlink on the way). */
static int on_special_fs(int fd) {
    struct statfs sf;
    return fstatfs(fd, &sf) == 0 && (sf.f_type == PROC_SUPER_MAGIC || sf.f_type == SYSFS_MAGIC);
}

/* Resolve and open under the rules. On failure: -1, a message, and errno
 * (EACCES for a path refused by name). */
static int open_confined(const char *path, int flags, const char *what, ac_err *e) {
    char norm[AC_FSAFE_PATH_MAX];
    if (ac_fsafe_normalize(path, norm, e)) {
        ac_errctx(e, "%s %.300s", what, path);
        errno = EACCES;
        return -1;
    }
    int fd;
    const char *rel = NULL;
    int r = nroots ? find_root(norm, &rel) : -1;
    if (nroots && r < 0) {
        ac_errf(e, "%s %.300s is outside the allowed model_roots", what, path);
        errno = EACCES;
        return -1;
    }
    if (ac_fsafe_special(norm)) {
        ac_errf(e, "%s %.300s: /proc, /sys and /dev are not read", what, path);
        errno = EACCES;
        return -1;
    }
    if (nroots) {
        fd = sys_openat2(roots[r].fd, rel, flags, RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS | RESOLVE_NO_MAGICLINKS);
    } else {
        fd = sys_openat2(AT_FDCWD, norm, flags | O_NOFOLLOW, RESOLVE_NO_MAGICLINKS);
    }
    if (fd >= 0 && on_special_fs(fd)) {
        close(fd);
        ac_errf(e, "%s %.300s: a link on the way leads into /proc or /sys, which are not read", what, path);
        errno = EACCES;
        return -1;
    }
    if (fd >= 0) return fd;
    int err = errno;
    if (err == ELOOP || err == EXDEV)
        ac_errf(e, "%s %.300s: a symbolic link on the way is not followed", what, path);
    else if (err == ENOENT)
        ac_errf(e, "%s %.300s does not exist", what, path);
    else if (err == ENOTDIR && (flags & O_DIRECTORY))
        ac_errf(e, "%s %.300s is not a directory", what, path);
    else
        ac_errf(e, "cannot open %s %.300s: %s", what, path, strerror(err));
    errno = err;
    return -1;
}

int ac_fsafe_open(const char *path, ac_fkind kind, size_t *size, ac_err *e) {
    if (kind >= AC_FK_NKINDS) return ac_errf(e, "bad file kind");
    int fd = open_confined(path, O_RDONLY | O_NONBLOCK | O_CLOEXEC, kind_names[kind], e);
    if (fd < 0) return -1;
    struct stat sb;
    if (fstat(fd, &sb) != 0 || !S_ISREG(sb.st_mode)) {
        close(fd);
        return ac_errf(e, "%s %.300s is not a regular file", kind_names[kind], path);
    }
    if ((unsigned long long)sb.st_size > (unsigned long long)caps[kind]) {
        close(fd);
        return ac_errf(e, "%s %.300s is larger than the %zu-byte cap for this kind of file", kind_names[kind], path,
                       caps[kind]);
    }
    /* Back to blocking reads: a regular file never blocks, and callers read
     * it to the end. */
    int fl = fcntl(fd, F_GETFL);
    if (fl >= 0) fcntl(fd, F_SETFL, fl & ~O_NONBLOCK);
    if (size) *size = (size_t)sb.st_size;
    return fd;
}

int ac_fsafe_present(const char *path) {
    ac_err e;
    int fd = open_confined(path, O_PATH | O_CLOEXEC, "file", &e);
    if (fd >= 0) {
        close(fd);
        return 1;
    }
    return errno != ENOENT;
}

int ac_fsafe_opendir(const char *path, ac_err *e) {
    return open_confined(path, O_PATH | O_DIRECTORY | O_CLOEXEC, "directory", e);
}

char *ac_fsafe_read(const char *path, ac_fkind kind, size_t *len, ac_err *e) {
    size_t size;
    int fd = ac_fsafe_open(path, kind, &size, e);
    if (fd < 0) return NULL;
    char *buf = malloc(size + 1);
    if (!buf) {
        close(fd);
        ac_errf(e, "out of memory reading %.300s", path);
        return NULL;
    }
    size_t n = 0;
    while (n < size) {
        ssize_t r = read(fd, buf + n, size - n);
        if (r < 0 && errno == EINTR) continue;
        if (r <= 0) break;
        n += (size_t)r;
    }
    close(fd);
    if (n != size) { /* shrank while read, or an I/O error */
        free(buf);
        ac_errf(e, "read error on %.300s", path);
        return NULL;
    }
    buf[n] = 0;
    if (len) *len = n;
    return buf;
}

json_t *ac_fsafe_json(const char *path, ac_fkind kind, ac_err *e) {
    size_t len;
    char *s = ac_fsafe_read(path, kind, &len, e);
    if (!s) return NULL;
    json_error_t je;
    json_t *j = json_loadb(s, len, JSON_REJECT_DUPLICATES, &je);
    free(s);
    if (!j) {
        char why[160];
        ac_errf(e, "%.300s: not valid JSON: %s (line %d, column %d)", path, ac_fsafe_json_why(je.text, why, sizeof why),
                je.line, je.column);
    }
    return j;
}

const char *ac_fsafe_json_why(const char *text, char *buf, size_t n) {
    /* jansson's text quotes the bytes near the error ("near '...'"): keep
     * only what precedes that, and nothing quoted at all. */
    snprintf(buf, n, "%s", text);
    char *near = strstr(buf, " near ");
    if (near) *near = 0;
    if (strchr(buf, '\'') || strchr(buf, '"')) snprintf(buf, n, "syntax error");
    return buf;
}

/* A directory holds a model when it has one of these. */
static int is_model_dir(int dirfd) {
    static const char *marks[] = {"config.json", "model.safetensors", "model.safetensors.index.json", "tokenizer.json"};
    for (size_t i = 0; i < sizeof marks / sizeof *marks; i++) {
        struct stat sb;
        if (fstatat(dirfd, marks[i], &sb, AT_SYMLINK_NOFOLLOW) == 0) return 1;
    }
    return 0;
}

int ac_fsafe_check_outdir(const char *out, const char *model, const char *jobs_dir, ac_err *e) {
    char norm[AC_FSAFE_PATH_MAX], mnorm[AC_FSAFE_PATH_MAX];
    if (ac_fsafe_normalize(out, norm, e)) return -1;
    const char *orel;
    if (nroots && find_root(norm, &orel) < 0) return ac_errf(e, "%.300s is outside the allowed model_roots", out);
    if (ac_fsafe_special(norm)) return ac_errf(e, "must not be under /proc, /sys or /dev");
    if (model && ac_fsafe_normalize(model, mnorm, e) == 0 && !strcmp(norm, mnorm))
        return ac_errf(e, "must not be the model directory");
    if (jobs_dir) {
        char jn[AC_FSAFE_PATH_MAX];
        if (ac_fsafe_normalize(jobs_dir, jn, e) == 0 && below(norm, jn))
            return ac_errf(e, "must not be inside the daemon's job directories");
    }
    int fd;
    if (nroots) {
        const char *rel;
        int r = find_root(norm, &rel);
        if (r < 0) return ac_errf(e, "%.300s is outside the allowed model_roots", out);
        if (!strcmp(rel, ".")) return ac_errf(e, "must not be a model root itself; name a directory below it");
        fd = sys_openat2(roots[r].fd, rel, O_PATH | O_DIRECTORY | O_CLOEXEC,
                         RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS | RESOLVE_NO_MAGICLINKS);
    } else {
        fd = sys_openat2(AT_FDCWD, norm, O_PATH | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC, RESOLVE_NO_MAGICLINKS);
    }
    if (fd < 0) {
        /* Missing directories are created by the export; anything else on
         * the way (a symlink, a file) is refused. */
        int err = errno;
        if (err == ENOENT) return 0;
        if (err == ELOOP || err == EXDEV) return ac_errf(e, "%.300s: a symbolic link on the way is not followed", out);
        if (err == ENOTDIR) return ac_errf(e, "%.300s is not a directory", out);
        return ac_errf(e, "%.300s: %s", out, strerror(err));
    }
    int model_dir = is_model_dir(fd);
    close(fd);
    if (model_dir)
        return ac_errf(e, "%.300s holds a model (config.json, weights or tokenizer); name a new directory", out);
    return 0;
}

int ac_fsafe_check_model_dir(const char *model, ac_err *e) {
    char cfg[AC_FSAFE_PATH_MAX + 16];
    int fd = ac_fsafe_opendir(model, e);
    if (fd < 0) return -1;
    close(fd);
    if (ac_fsafe_join(model, "config.json", cfg, sizeof cfg, e)) return -1;
    if ((fd = ac_fsafe_open(cfg, AC_FK_CONFIG, NULL, e)) < 0)
        return ac_errctx(e, "model directory needs a readable config.json");
    close(fd);
    return 0;
}
