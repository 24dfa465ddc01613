/* wlimit.c - see wlimit.h. */
#include "wlimit.h"

#include <dirent.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

const char *wlimit_mode_name(wlimit_mode m) {
    return m == WLIMIT_CGROUP ? "cgroup" : m == WLIMIT_RESIDENT ? "resident" : "none";
}

/* Write text to dir/file; 0 or -1 (errno set). */
static int put(const char *dir, const char *file, const char *text) {
    char p[1200];
    snprintf(p, sizeof p, "%s/%s", dir, file);
    FILE *f = fopen(p, "w");
    if (!f) return -1;
    int ok = fputs(text, f) >= 0;
    int saved = errno;
    if (fclose(f)) ok = 0; /* the cgroup file system answers the write at close */
    else errno = saved;
    return ok ? 0 : -1;
}

/* The first line of dir/file, or "" (returns 0 when read). */
static int get(const char *dir, const char *file, char *out, size_t n) {
    char p[1200];
    snprintf(p, sizeof p, "%s/%s", dir, file);
    out[0] = 0;
    FILE *f = fopen(p, "r");
    if (!f) return -1;
    int ok = fgets(out, (int)n, f) != NULL;
    fclose(f);
    out[strcspn(out, "\n")] = 0;
    return ok ? 0 : -1;
}

/* This process's cgroup v2 directory, or -1. */
static int own_cgroup(char *dir, size_t n) {
    const char *hooks = getenv("AUTOCOMPRESSD_TEST_HOOKS"), *alt = getenv("AC_TEST_CGROUP_DIR");
    if (hooks && !strcmp(hooks, "1") && alt && alt[0]) return (size_t)snprintf(dir, n, "%s", alt) < n ? 0 : -1;
    struct stat st;
    if (stat("/sys/fs/cgroup/cgroup.controllers", &st)) return -1; /* no unified hierarchy */
    FILE *f = fopen("/proc/self/cgroup", "r");
    if (!f) return -1;
    char line[1024];
    int found = -1;
    while (found && fgets(line, sizeof line, f))
        if (!strncmp(line, "0::", 3)) {
            line[strcspn(line, "\n")] = 0;
            found = (size_t)snprintf(dir, n, "/sys/fs/cgroup%s", strcmp(line + 3, "/") ? line + 3 : "") < n ? 0 : -1;
        }
    fclose(f);
    return found;
}

/* Leftover job cgroups of a daemon that died (empty: its workers died with it). */
static void sweep(const char *base) {
    DIR *dir = opendir(base);
    if (!dir) return;
    for (struct dirent *de; (de = readdir(dir));) {
        char p[1400];
        if (strncmp(de->d_name, "job-", 4)) continue;
        snprintf(p, sizeof p, "%s/%s", base, de->d_name);
        rmdir(p);
    }
    closedir(dir);
}

/* Move this process into base/daemon and enable the memory controller for
 * base's children (cgroup v2 lets a cgroup with processes of its own give
 * no controller to its children). 0, or -1 with why. */
static int take_subtree(const char *base, char *why, size_t n) {
    char ctl[256], leaf[1100], pid[32];
    if (get(base, "cgroup.controllers", ctl, sizeof ctl) || !strstr(ctl, "memory"))
        return snprintf(why, n, "%s: no memory controller delegated", base), -1;
    if (access(base, W_OK)) return snprintf(why, n, "%s: not writable (no Delegate=yes)", base), -1;
    snprintf(leaf, sizeof leaf, "%s/daemon", base);
    snprintf(pid, sizeof pid, "%d", (int)getpid());
    if ((mkdir(leaf, 0755) && errno != EEXIST) || put(leaf, "cgroup.procs", pid))
        return snprintf(why, n, "%s: %s", leaf, strerror(errno)), -1;
    if (put(base, "cgroup.subtree_control", "+memory"))
        return snprintf(why, n, "%s/cgroup.subtree_control: %s", base, strerror(errno)), -1;
    return 0;
}

void wlimit_init(wlimit_base *b, long mib, char *note, size_t n) {
    memset(b, 0, sizeof *b);
    if (mib < 0) {
        long pages = sysconf(_SC_PHYS_PAGES), psz = sysconf(_SC_PAGESIZE);
        mib = pages > 0 && psz > 0 ? (long)((double)pages * (double)psz * 0.9 / 1048576.0) : 0;
    }
    b->mib = mib;
    char why[1200] = "";
    if (own_cgroup(b->base, sizeof b->base) == 0 && take_subtree(b->base, why, sizeof why) == 0) {
        b->mode = WLIMIT_CGROUP;
        sweep(b->base);
        snprintf(note, n, "workers in cgroups under %s, memory.max %ld MiB each", b->base, mib);
        return;
    }
    b->base[0] = 0;
    b->mode = mib > 0 ? WLIMIT_RESIDENT : WLIMIT_NONE;
    if (mib > 0)
        snprintf(note, n, "no writable cgroup v2 subtree (%s); workers stopped past %ld MiB resident (watched)",
                 why[0] ? why : "not in a delegated cgroup v2", mib);
    else
        snprintf(note, n, "workers have no memory limit (worker_memory_mib=0)");
}

int wlimit_prepare(const wlimit_base *b, long job, wlimit *w, char *why, size_t n) {
    memset(w, 0, sizeof *w);
    if (b->mode != WLIMIT_CGROUP) return 0;
    snprintf(w->cg, sizeof w->cg, "%s/job-%ld", b->base, job);
    char max[32];
    snprintf(max, sizeof max, "%lld", (long long)b->mib << 20);
    if ((mkdir(w->cg, 0755) && errno != EEXIST) || (b->mib > 0 && put(w->cg, "memory.max", max))) {
        snprintf(why, n, "cannot make the worker's cgroup %s: %s", w->cg, strerror(errno));
        w->cg[0] = 0;
        return -1;
    }
    if (b->mib > 0) put(w->cg, "memory.swap.max", "0"); /* no swap controller: the limit still holds RAM */
    put(w->cg, "memory.oom.group", "1");                 /* the whole worker goes, not one thread's victim */
    return 0;
}

int wlimit_apply(wlimit *w, int pid, char *why, size_t n) {
    if (!w->cg[0]) return 0;
    char p[32];
    snprintf(p, sizeof p, "%d", pid);
    if (put(w->cg, "cgroup.procs", p)) return snprintf(why, n, "cannot enter %s: %s", w->cg, strerror(errno)), -1;
    return 0;
}

long wlimit_self_mib(const wlimit_base *b) { return b->mode == WLIMIT_RESIDENT ? b->mib : 0; }

int wlimit_oom_killed(const wlimit *w, long *peak_mib) {
    if (!w->cg[0]) return 0;
    char p[1200], line[128];
    snprintf(p, sizeof p, "%s/memory.events", w->cg);
    FILE *f = fopen(p, "r");
    unsigned long long kills = 0;
    while (f && fgets(line, sizeof line, f))
        if (sscanf(line, "oom_kill %llu", &kills) == 1) break;
    if (f) fclose(f);
    if (!kills) return 0;
    char peak[64];
    if (get(w->cg, "memory.peak", peak, sizeof peak) == 0 && atoll(peak) > 0)
        *peak_mib = (long)((atoll(peak) + (1 << 19)) >> 20);
    return 1;
}

void wlimit_release(wlimit *w) {
    if (w->cg[0]) rmdir(w->cg);
    w->cg[0] = 0;
}
