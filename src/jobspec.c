/*
 * jobspec.c - validation of job specs (the rules of proto/job.schema.json,
 * written as a small table so every error names its field). Unknown fields
 * are errors, as the design asks.
 */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "job.h"

typedef enum { T_STR, T_INT, T_NUM, T_BOOL, T_OBJ } ftype;
typedef struct field {
    const char *name;
    ftype type;
    int required;
    double lo, hi;            /* numeric range (inclusive) */
    const char *const *enums; /* allowed strings, NULL-terminated */
    const struct field *sub;  /* object members */
} field;

static const char *const METHODS[] = {"autocompress", "minitron", NULL};
static const char *const DTYPES[] = {"bf16", "fp16", "fp32", "fp8", NULL};
static const char *const EXPORTS[] = {"deci", "llama", "gguf", "gguf-deci", NULL}; /* gguf-deci: the old name of gguf */

static const field ENGINE[] = {
    {"weights_dtype", T_STR, 0, 0, 0, DTYPES, NULL},
    {"kv_dtype", T_STR, 0, 0, 0, DTYPES, NULL},
    {"block_size", T_INT, 0, 1, 1024, NULL, NULL},
    {"gpu_memory_utilization", T_NUM, 0, 0.05, 1, NULL, NULL},
    {"overhead_ms", T_NUM, 0, 0, 1e4, NULL, NULL},
    {"overhead_gib", T_NUM, 0, 0, 1e4, NULL, NULL},
    {"name", T_STR, 0, 0, 0, NULL, NULL},
    {NULL, 0, 0, 0, 0, NULL, NULL}};
static const field WORKLOAD[] = {
    {"batch", T_INT, 0, 1, 65536, NULL, NULL},
    {"prompt_len", T_INT, 0, 1, 1 << 22, NULL, NULL},
    {"gen_len", T_INT, 0, 1, 1 << 22, NULL, NULL},
    {NULL, 0, 0, 0, 0, NULL, NULL}};
static const field TARGET[] = {
    {"device", T_STR, 1, 0, 0, NULL, NULL},
    {"engine", T_OBJ, 0, 0, 0, NULL, ENGINE},
    {"workload", T_OBJ, 0, 0, 0, NULL, WORKLOAD},
    {NULL, 0, 0, 0, 0, NULL, NULL}};
static const field CONSTRAINTS[] = {
    {"max_ttft_ms", T_NUM, 0, 1e-6, 1e9, NULL, NULL},
    {"max_tpot_ms", T_NUM, 0, 1e-6, 1e9, NULL, NULL},
    {"min_tokens_per_s", T_NUM, 0, 1e-6, 1e12, NULL, NULL},
    {"max_memory_gib", T_NUM, 0, 1e-9, 1e6, NULL, NULL},
    {"max_params", T_NUM, 0, 1, 1e15, NULL, NULL},
    {NULL, 0, 0, 0, 0, NULL, NULL}};
static const field SEARCH[] = {
    {"steps", T_INT, 0, 1, 100000, NULL, NULL},
    {"seed", T_INT, 0, 0, 2147483647, NULL, NULL},
    {"lr", T_NUM, 0, 1e-6, 10, NULL, NULL},
    {"export_target", T_STR, 0, 0, 0, EXPORTS, NULL},
    {"ffn_multiple", T_INT, 0, 1, 4096, NULL, NULL},
    {"hidden_multiple", T_INT, 0, 1, 4096, NULL, NULL},
    {"prune_hidden", T_BOOL, 0, 0, 0, NULL, NULL},
    {"gguf", T_BOOL, 0, 0, 0, NULL, NULL},
    {NULL, 0, 0, 0, 0, NULL, NULL}};
static const field EVAL[] = {
    {"ctx", T_INT, 0, 8, 1 << 16, NULL, NULL},
    {"windows", T_INT, 0, 0, 1 << 20, NULL, NULL},
    {NULL, 0, 0, 0, 0, NULL, NULL}};
static const field SPEC[] = {
    {"name", T_STR, 0, 0, 0, NULL, NULL},
    {"model", T_STR, 1, 0, 0, NULL, NULL},
    {"calibration", T_STR, 1, 0, 0, NULL, NULL},
    {"heldout", T_STR, 0, 0, 0, NULL, NULL},
    {"output", T_STR, 0, 0, 0, NULL, NULL},
    {"target", T_OBJ, 1, 0, 0, NULL, TARGET},
    {"constraints", T_OBJ, 1, 0, 0, NULL, CONSTRAINTS},
    {"method", T_STR, 0, 0, 0, METHODS, NULL},
    {"search", T_OBJ, 0, 0, 0, NULL, SEARCH},
    {"eval", T_OBJ, 0, 0, 0, NULL, EVAL},
    {"repair", T_BOOL, 0, 0, 0, NULL, NULL},
    {"calibration_tokens", T_INT, 0, 256, 1 << 24, NULL, NULL},
    {"priority", T_INT, 0, -1000, 1000, NULL, NULL},
    {NULL, 0, 0, 0, 0, NULL, NULL}};

static char field_buf[256];

static int check_obj(const json_t *o, const field *fs, const char *prefix, const char **fieldp, ac_err *e) {
    const char *k;
    json_t *v;
    json_object_foreach((json_t *)o, k, v) {
        const field *f = fs;
        while (f->name && strcmp(f->name, k)) f++;
        snprintf(field_buf, sizeof field_buf, "%.120s%.120s", prefix, k);
        if (!f->name) { *fieldp = field_buf; return ac_errf(e, "unknown field %s", field_buf); }
        int ok = 1;
        switch (f->type) {
        case T_STR: ok = json_is_string(v) && json_string_length(v) > 0 && json_string_length(v) < 4096; break;
        case T_INT: ok = json_is_integer(v); break;
        case T_NUM: ok = json_is_number(v) && isfinite(json_number_value(v)); break;
        case T_BOOL: ok = json_is_boolean(v); break;
        case T_OBJ: ok = json_is_object(v); break;
        }
        static const char *tn[] = {"a non-empty string", "an integer", "a number", "a boolean", "an object"};
        if (!ok) { *fieldp = field_buf; return ac_errf(e, "%s must be %s", field_buf, tn[f->type]); }
        if ((f->type == T_INT || f->type == T_NUM) && (f->lo != 0 || f->hi != 0)) {
            double x = json_number_value(v);
            if (x < f->lo || x > f->hi) { *fieldp = field_buf; return ac_errf(e, "%s=%g is outside [%g, %g]", field_buf, x, f->lo, f->hi); }
        }
        if (f->enums) {
            const char *const *en = f->enums;
            while (*en && strcmp(*en, json_string_value(v))) en++;
            if (!*en) { *fieldp = field_buf; return ac_errf(e, "%s=\"%s\" is not one of the allowed values", field_buf, json_string_value(v)); }
        }
        if (f->sub) {
            char pre[300];
            snprintf(pre, sizeof pre, "%.250s.", field_buf);
            if (check_obj(v, f->sub, pre, fieldp, e)) return -1;
        }
    }
    for (const field *f = fs; f->name; f++)
        if (f->required && !json_object_get(o, f->name)) {
            snprintf(field_buf, sizeof field_buf, "%.120s%.120s", prefix, f->name);
            *fieldp = field_buf;
            return ac_errf(e, "missing required field %s", field_buf);
        }
    return 0;
}

int ac_job_validate_field(const json_t *spec, const char **fieldp, ac_err *e) {
    const char *dummy;
    if (!fieldp) fieldp = &dummy;
    *fieldp = "";
    if (!json_is_object(spec)) return ac_errf(e, "job spec must be a JSON object");
    if (check_obj(spec, SPEC, "", fieldp, e)) return -1;
    if (json_object_size(json_object_get(spec, "constraints")) == 0) {
        *fieldp = "constraints";
        return ac_errf(e, "constraints must name at least one limit (max_ttft_ms, max_tpot_ms, min_tokens_per_s, max_memory_gib, max_params)");
    }
    return 0;
}

int ac_job_validate(const json_t *spec, ac_err *e) { return ac_job_validate_field(spec, NULL, e); }

const char *ac_job_path(const json_t *spec, const char *which) {
    return json_string_value(json_object_get(spec, which));
}
