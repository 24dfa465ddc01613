/*
 * dtype.h - the element types a stored tensor may have (the safetensors
 * names: F32, F16, BF16, ...), their sizes and names. Every layer speaks of
 * dtypes (the formats read and write them, the runtime and the CUDA plugin
 * compute in them, the job spec names them), so they live in core.
 */
#ifndef AC_DTYPE_H
#define AC_DTYPE_H

#include <stddef.h>

typedef enum {
    ST_BOOL,
    ST_U8,
    ST_I8,
    ST_F8_E5M2,
    ST_F8_E4M3,
    ST_I16,
    ST_U16,
    ST_F16,
    ST_BF16,
    ST_I32,
    ST_U32,
    ST_F32,
    ST_F64,
    ST_I64,
    ST_U64,
    ST_NDTYPES
} st_dtype;

/* Bytes per element; 0 for an out-of-range value. */
size_t st_dtype_size(st_dtype d);
/* The safetensors name ("BF16"); "?" for an out-of-range value. */
const char *st_dtype_name(st_dtype d);
/* The dtype named s; -1 when s names none. */
int st_dtype_parse(const char *s, st_dtype *out);

#endif
