/*
 * check.h - the tiny test harness of the C tests. A test is a function; it
 * passes when none of its CHECKs fail. Each binary ends with a line
 * "RESULT <passed> <failed> <skipped>" that tests/run_all.sh adds up.
 */
#ifndef AC_CHECK_H
#define AC_CHECK_H

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

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

#define RUN(fn)                                                                                                        \
    do {                                                                                                               \
        ck_failed_now = ck_skipped_now = 0;                                                                            \
        fn();                                                                                                          \
        if (ck_skipped_now) {                                                                                          \
            ck_skip++;                                                                                                 \
            printf("SKIP %s\n", #fn);                                                                                  \
        } else if (ck_failed_now) {                                                                                    \
            ck_fail++;                                                                                                 \
            printf("FAIL %s\n", #fn);                                                                                  \
        } else {                                                                                                       \
            ck_pass++;                                                                                                 \
            printf("ok   %s\n", #fn);                                                                                  \
        }                                                                                                              \
        fflush(stdout);                                                                                                \
    } while (0)

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

#define DONE() (printf("RESULT %d %d %d\n", ck_pass, ck_fail, ck_skip), ck_fail ? 1 : 0)

#endif
