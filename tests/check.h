/*
 * check.h - the tiny test harness of the C tests. A test is a function; it
 * passes when none of its CHECKs fail. Each binary ends with a line
 * "RESULT <passed> <failed> <skipped>" that tests/run_all.sh adds up; each
 * test's line gives its wall-clock seconds (where the suite's time goes).
 * A test that fails a CHECK is FAIL even when it then SKIPs (a part that
 * could not run does not hide one that failed). AC_TEST_ONLY=NAME runs only
 * the tests whose function name contains NAME (the others are not counted).
 */
#ifndef AC_CHECK_H
#define AC_CHECK_H

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static int ck_failed_now, ck_pass, ck_fail, ck_skip, ck_skipped_now;

#define CHECK(cond, ...)                                                                                               \
    do {                                                                                                               \
        if (!(cond)) {                                                                                                 \
            ck_failed_now = 1;                                                                                         \
            fprintf(stderr, "  check failed %s:%d: %s: ", __FILE__, __LINE__, #cond);                                  \
            fprintf(stderr, __VA_ARGS__);                                                                              \
            fputc('\n', stderr);                                                                                       \
        }                                                                                                              \
    } while (0)

#define SKIP(...)                                                                                                      \
    do {                                                                                                               \
        ck_skipped_now = 1;                                                                                            \
        fprintf(stderr, "  skip: ");                                                                                   \
        fprintf(stderr, __VA_ARGS__);                                                                                  \
        fputc('\n', stderr);                                                                                           \
        return;                                                                                                        \
    } while (0)

static inline double ck_now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

#define RUN(fn)                                                                                                        \
    do {                                                                                                               \
        const char *ck_only = getenv("AC_TEST_ONLY");                                                                  \
        if (ck_only && *ck_only && !strstr(#fn, ck_only)) break;                                                       \
        ck_failed_now = ck_skipped_now = 0;                                                                            \
        double ck_t0 = ck_now();                                                                                       \
        fn();                                                                                                          \
        double ck_s = ck_now() - ck_t0;                                                                                \
        if (ck_failed_now) {                                                                                           \
            ck_fail++;                                                                                                 \
            printf("FAIL %s (%.1f s)\n", #fn, ck_s);                                                                   \
        } else if (ck_skipped_now) {                                                                                   \
            ck_skip++;                                                                                                 \
            printf("SKIP %s\n", #fn);                                                                                  \
        } else {                                                                                                       \
            ck_pass++;                                                                                                 \
            printf("ok   %s (%.1f s)\n", #fn, ck_s);                                                                   \
        }                                                                                                              \
        fflush(stdout);                                                                                                \
    } while (0)

/* The CPU threads of a test's engine and jobs: $AC_TEST_THREADS, else 2.
 * tests/run_all.sh sets 1 while its lanes run side by side (a lane, a
 * core: two threads each would contend for the two cores). */
static inline int ck_threads(void) {
    const char *t = getenv("AC_TEST_THREADS");
    int n = t && *t ? atoi(t) : 0;
    return n > 0 ? n : 2;
}

/* buf = $AC_BUILD/rel (build/rel when unset): where fixtures and models are. */
static inline void ck_build_path(char *buf, size_t n, const char *rel) {
    const char *b = getenv("AC_BUILD");
    snprintf(buf, n, "%s/%s", b ? b : "build", rel);
}

static inline int ck_exists(const char *path) {
    FILE *f = fopen(path, "r");
    if (f) fclose(f);
    return f != NULL;
}

/* rm -rf dir (a test's mkdtemp directory); 0 when done. */
static inline int ck_rmtree(const char *dir) {
    char cmd[1200];
    if (snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir) >= (int)sizeof cmd || strchr(dir, '\'')) return -1;
    return system(cmd);
}

#define DONE() (printf("RESULT %d %d %d\n", ck_pass, ck_fail, ck_skip), ck_fail ? 1 : 0)

#endif
