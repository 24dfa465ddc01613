/* dtype.c - see dtype.h. */
#include "core/dtype.h"

#include <string.h>

static const struct {
    const char *name;
    size_t size;
} dtypes[ST_NDTYPES] = {
    [ST_BOOL] = {"BOOL", 1},       [ST_U8] = {"U8", 1},   [ST_I8] = {"I8", 1},   [ST_F8_E5M2] = {"F8_E5M2", 1},
    [ST_F8_E4M3] = {"F8_E4M3", 1}, [ST_I16] = {"I16", 2}, [ST_U16] = {"U16", 2}, [ST_F16] = {"F16", 2},
    [ST_BF16] = {"BF16", 2},       [ST_I32] = {"I32", 4}, [ST_U32] = {"U32", 4}, [ST_F32] = {"F32", 4},
    [ST_F64] = {"F64", 8},         [ST_I64] = {"I64", 8}, [ST_U64] = {"U64", 8},
};

size_t st_dtype_size(st_dtype d) { return d < ST_NDTYPES ? dtypes[d].size : 0; }
const char *st_dtype_name(st_dtype d) { return d < ST_NDTYPES ? dtypes[d].name : "?"; }

int st_dtype_parse(const char *s, st_dtype *out) {
    for (int i = 0; i < ST_NDTYPES; i++)
        if (strcmp(s, dtypes[i].name) == 0) {
            *out = (st_dtype)i;
            return 0;
        }
    return -1;
}
