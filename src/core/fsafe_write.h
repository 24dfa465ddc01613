/*
 * fsafe_write.h - confined creation of the files and directories a job
 * writes (the export: weights, config.json, model.gguf, tokenizer.json,
 * report.json): the one place the library creates files for its callers.
 *
 * Rules (roots as in fsafe.h, process-wide):
 *  - with roots set, a path must be absolute and under a root; its directory
 *    is resolved from the root's directory handle with openat2
 *    RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS (per-component O_NOFOLLOW where
 *    the kernel has no openat2), and directories are created one component
 *    at a time with mkdirat and reopened O_NOFOLLOW: a symbolic link
 *    anywhere below the root, planted before the job or while it runs, makes
 *    the write fail with a message naming the link, and nothing outside the
 *    root is created or changed;
 *  - without roots (the CLI), directories are resolved as named (never
 *    through a /proc magic link);
 *  - in both, a file is written to a fresh temporary name in its directory
 *    (O_CREAT | O_EXCL | O_NOFOLLOW), flushed, fsynced and renamed over its
 *    name relative to the same directory handle; a symbolic link at the name
 *    itself is refused, never followed nor replaced. A failed write leaves
 *    no temporary behind.
 */
#ifndef AC_FSAFE_WRITE_H
#define AC_FSAFE_WRITE_H

#include <jansson.h>
#include <stdio.h>

#include "core/err.h"
#include "core/fsafe.h"

typedef struct {
    FILE *f;       /* write the contents here */
    int dirfd;     /* the directory, resolved once */
    char tmp[300]; /* the temporary's name in it */
    char name[256];
    char path[AC_FSAFE_PATH_MAX]; /* as the caller named it, for messages */
} ac_wfile;

/* Create path's directory and its missing parents (0755), confined. */
int ac_fsafe_mkdirs(const char *path, ac_err *e);
/* Start writing path: w->f is open on a new temporary beside it. */
int ac_fsafe_create(const char *path, ac_wfile *w, ac_err *e);
/* Flush, fsync and rename the temporary into place; the temporary is
 * removed on failure. Closes w either way. */
int ac_fsafe_commit(ac_wfile *w, ac_err *e);
/* Drop a file being written (no-op on a closed w). */
void ac_fsafe_discard(ac_wfile *w);
/* Whole files: n bytes of data, or a JSON document (json_dumpf flags). */
int ac_fsafe_write(const char *path, const void *data, size_t n, ac_err *e);
int ac_fsafe_write_json(const char *path, const json_t *j, size_t flags, ac_err *e);

#endif
