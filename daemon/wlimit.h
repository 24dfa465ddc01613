/*
 * wlimit.h - each local worker's memory limit (the config's worker_memory_mib)
 * and how a worker's OOM end is told.
 *
 * Two ways, chosen once at start:
 *   cgroup  the daemon runs in a cgroup v2 subtree it may write (systemd's
 *           Delegate=yes): it moves itself into a leaf "daemon" cgroup,
 *           enables the memory controller for the subtree, and each worker
 *           gets its own child cgroup "job-ID" with memory.max (swap off),
 *           entered before the worker is given its job. An OOM kill is read
 *           from the child's memory.events (oom_kill), the peak from
 *           memory.peak.
 *   resident  otherwise: the worker watches its own resident memory
 *           (VmRSS, every 0.1 s, from its heartbeat thread: worker.c
 *           --memory-mib) and, past the limit, says so in an "oom" event and
 *           kills itself; the daemon checks the same each second in case the
 *           worker cannot. A hard RLIMIT_DATA / RLIMIT_AS is not used: when
 *           OpenBLAS cannot map its buffer it spins forever instead of failing
 *           (seen: a worker under a 200 MiB RLIMIT_DATA hung in
 *           blas_memory_alloc), and RLIMIT_AS counts the model's file mappings.
 * A limit of 0 turns both off (the cgroup is still made, for the OOM
 * report). With the test hooks on (AUTOCOMPRESSD_TEST_HOOKS=1),
 * AC_TEST_CGROUP_DIR names a directory used as the delegated subtree.
 */
#ifndef AC_WLIMIT_H
#define AC_WLIMIT_H

#include <stddef.h>

typedef enum { WLIMIT_NONE, WLIMIT_CGROUP, WLIMIT_RESIDENT } wlimit_mode;

typedef struct {
    wlimit_mode mode;
    long mib;        /* the limit per worker; 0: none */
    char base[1024]; /* the delegated cgroup (cgroup mode) */
} wlimit_base;

/* One worker's limit. */
typedef struct {
    char cg[1100]; /* its cgroup directory, "" when none */
} wlimit;

/* Choose the mode for limit mib (< 0: 90% of the host's memory); logs
 * which it chose and why into note. Never fails: without a writable
 * cgroup it falls back to the resident watch. */
void wlimit_init(wlimit_base *b, long mib, char *note, size_t n);
const char *wlimit_mode_name(wlimit_mode m);

/* Before the worker for job starts: make its cgroup (cgroup mode). 0, or
 * -1 with why. */
int wlimit_prepare(const wlimit_base *b, long job, wlimit *w, char *why, size_t n);
/* After it started (before it is given its job): put pid in its cgroup. 0,
 * or -1 with why. */
int wlimit_apply(wlimit *w, int pid, char *why, size_t n);
/* The limit the worker watches itself (--memory-mib): mib in resident
 * mode, else 0. */
long wlimit_self_mib(const wlimit_base *b);
/* After it ended: 1 when its cgroup saw an OOM kill (*peak_mib: the
 * cgroup's peak, when known, else left as it is), 0 otherwise. */
int wlimit_oom_killed(const wlimit *w, long *peak_mib);
/* Remove its cgroup (empty once the worker is gone). */
void wlimit_release(wlimit *w);

#endif
