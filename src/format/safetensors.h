/*
 * safetensors.h - read (mmap, fully validated) and write safetensors files,
 * single-file and sharded (model.safetensors.index.json).
 *
 * Ownership: an st_file owns its mapping and its tensor table; tensor data
 * pointers point into the mapping and live until st_close. An st_set owns
 * its st_files. Writers copy nothing: they stream the caller's buffers.
 */
#ifndef AC_SAFETENSORS_H
#define AC_SAFETENSORS_H

#include <stddef.h>
#include <stdint.h>

#include "core/dtype.h" /* st_dtype, ST_F32, ... */
#include "core/err.h"

#define ST_MAX_DIMS 8
#define ST_MAX_HEADER 100000000ULL

typedef struct {
    char *name;
    st_dtype dtype;
    int ndim;
    int64_t shape[ST_MAX_DIMS];
    uint64_t begin, end; /* offsets in the data buffer, end exclusive */
    const void *data;    /* points into the mapping (or parse buffer) */
} st_tensor;

typedef struct {
    void *map; /* NULL when parsed from a caller buffer */
    size_t map_len;
    int n;
    st_tensor *t;
    char *path;
} st_file;

/* Parse and validate a safetensors image held in memory (the fuzz entry).
 * Tensor data pointers point into buf, which must outlive f. */
int st_parse(const void *buf, size_t len, st_file *f, ac_err *e);
/* mmap a file and parse it. */
int st_open(const char *path, st_file *f, ac_err *e);
void st_close(st_file *f);
const st_tensor *st_find(const st_file *f, const char *name);
int64_t st_numel(const st_tensor *t);

/* All weights of a model directory: model.safetensors, or the shards named
 * by model.safetensors.index.json (every shard validated, every weight_map
 * entry present in its shard). */
typedef struct {
    int n;
    st_file *files;
} st_set;
int st_set_open(const char *dir, st_set *s, ac_err *e);
void st_set_close(st_set *s);
const st_tensor *st_set_find(const st_set *s, const char *name);

/* Writing. */
typedef struct {
    const char *name;
    st_dtype dtype;
    int ndim;
    int64_t shape[ST_MAX_DIMS];
    const void *data; /* numel * dtype size bytes */
} st_wtensor;

/* Write one file; tensors are packed in the given order, header padded
 * with spaces to a multiple of 8, metadata {"format":"pt"}. Written to a
 * temporary name and renamed, so a crash never leaves a half file. */
int st_write(const char *path, const st_wtensor *t, int n, ac_err *e);
/* Write shards of at most max_shard_bytes each plus the index file into dir
 * (a single model.safetensors when everything fits in one). */
int st_write_sharded(const char *dir, const st_wtensor *t, int n, uint64_t max_shard_bytes, ac_err *e);

#endif
