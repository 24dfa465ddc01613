/*
 * fsafe.h - confined opening of the files a job names (model directories,
 * calibration text, tokenizer.json, shards): the one place the library opens
 * outside input.
 *
 * Rules, the same in the daemon at submit and in the worker:
 *  - paths are absolute, at most AC_FSAFE_PATH_MAX bytes, without "..";
 *  - with roots set (the daemon's model_roots), a path must lie under one
 *    of them and is resolved from the root's directory with openat2
 *    RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS: no symbolic link below a root
 *    is followed, no /proc magic link, nothing escapes;
 *  - without roots (the CLI), the path is opened as named, but never
 *    through a magic link and the last component never through a symlink;
 *  - never under /proc, /sys or /dev (by name, and by file system after
 *    opening: procfs and sysfs);
 *  - regular files only, opened O_NONBLOCK and checked with fstat (a FIFO or
 *    a device is refused without blocking), and a size cap per file kind;
 *  - error messages carry the caller's path and a reason, never the file's
 *    bytes, and a path outside the roots is refused from its name alone, so
 *    the answer does not tell whether it exists.
 * Roots are process-wide (set once at start, before threads read them).
 */
#ifndef AC_FSAFE_H
#define AC_FSAFE_H

#include <jansson.h>
#include <stddef.h>

#include "core/err.h"

#define AC_FSAFE_PATH_MAX 3072
#define AC_FSAFE_MAX_ROOTS 16

typedef enum {
    AC_FK_CONFIG,    /* config.json, 4 MiB */
    AC_FK_INDEX,     /* model.safetensors.index.json, 64 MiB */
    AC_FK_TOKENIZER, /* tokenizer.json, 128 MiB */
    AC_FK_TEXT,      /* calibration / held-out text, 1 GiB */
    AC_FK_WEIGHTS,   /* safetensors (mapped, not read), 2 TiB */
    AC_FK_TABLE,     /* cost table JSON, 16 MiB */
    AC_FK_NKINDS
} ac_fkind;

/* Set the roots (NULL / 0: none). Each must be an existing directory; it is
 * kept open (O_PATH) for the life of the process. */
int ac_fsafe_set_roots(const char *const *roots, int n, ac_err *e);
int ac_fsafe_nroots(void);
size_t ac_fsafe_cap(ac_fkind k);

/* Lexical checks only (absolute, length, no ".."); writes the path with
 * "//" and "/./" collapsed into out (AC_FSAFE_PATH_MAX bytes). */
int ac_fsafe_normalize(const char *path, char *out, ac_err *e);
/* Join dir and name into out (n bytes); an error instead of truncation. */
int ac_fsafe_join(const char *dir, const char *name, char *out, size_t n, ac_err *e);

/* Open a regular file for reading (O_RDONLY|O_NONBLOCK|O_CLOEXEC) under the
 * rules above; *size = its size. Returns the fd or -1. */
int ac_fsafe_open(const char *path, ac_fkind kind, size_t *size, ac_err *e);
/* Open a directory (O_PATH) under the same rules. Returns the fd or -1. */
int ac_fsafe_opendir(const char *path, ac_err *e);
/* 0 when path does not exist (ENOENT on the way), else 1: a present but
 * refused path (a symlink, outside the roots) counts as present, so that
 * opening it then fails with the reason. */
int ac_fsafe_present(const char *path);
/* Read a whole file (NUL-terminated; *len its size). */
char *ac_fsafe_read(const char *path, ac_fkind kind, size_t *len, ac_err *e);
/* Read and parse a JSON file (duplicate keys rejected); parse errors give
 * line and column only, never the text near the error. */
json_t *ac_fsafe_json(const char *path, ac_fkind kind, ac_err *e);

/* jansson's parse error without the text it quotes from the input
 * ("near '...'"), into buf (n bytes); returns buf. */
const char *ac_fsafe_json_why(const char *jansson_text, char *buf, size_t n);

/* A model directory: a directory holding a readable config.json. */
int ac_fsafe_check_model_dir(const char *model, ac_err *e);
/* An output directory: not the model directory `model` (may be NULL), not
 * inside `jobs_dir` (may be NULL), not a root itself, reached without
 * symbolic links, and not holding a model; a missing one is fine (the
 * export creates it). */
int ac_fsafe_check_outdir(const char *out, const char *model, const char *jobs_dir, ac_err *e);

/* 1 when the normalized path is /proc, /sys or /dev or below them: never
 * read nor written, with roots or without (a file reached there through a
 * symlink on the way is refused after opening, by its file system). */
int ac_fsafe_special(const char *norm);
/* For fsafe_write.c: the root holding the normalized path norm (its O_PATH
 * directory fd, *rel the part below it, "." for the root itself), or -1. */
int ac_fsafe_root_of(const char *norm, const char **rel);
/* openat2 with the given resolve flags; where the kernel has no openat2
 * (ENOSYS), the path is walked one component at a time with O_NOFOLLOW when
 * resolve has RESOLVE_NO_SYMLINKS (".." never occurs: normalized paths). */
int ac_fsafe_openat(int dirfd, const char *rel, int flags, unsigned long long resolve);
/* Name the first symbolic link on rel below dirfd into out ("" if none):
 * for messages after a refused open. */
void ac_fsafe_first_link(int dirfd, const char *rel, const char *shown_prefix, char *out, size_t n);

#endif
