/*
 * jobspec.h - the typed job spec, parsed once at the edge (HTTP, CLI,
 * worker) from JSON through ONE field table: name, type, range, default and
 * offset of every field. That table is the single source of validation,
 * defaults, the `field` an error names and proto/job.schema.json
 * (ac_job_spec_schema generates it; tests/test_jobspec.c checks the file).
 *
 * Adding a section: a struct in ac_job_spec, a field array in jobspec.c,
 * one F_OBJ line in SPEC[] - nothing else parses it.
 */
#ifndef AC_JOBSPEC_H
#define AC_JOBSPEC_H

#include <jansson.h>

#include "cost/costmodel.h"
#include "core/err.h"
#include "search/search.h"
#include "cost/target.h"

#define AC_SPEC_STR 4096 /* strings in a spec are shorter than this */

typedef enum { AC_METHOD_AUTOCOMPRESS, AC_METHOD_MINITRON } ac_method;

/* target.engine as written; -1 or NAN = not given (the default comes from the engine and the device class). */
typedef struct {
    int engine;                  /* index into ac_engine_names (engines.h) */
    int weights_dtype, kv_dtype; /* index into bf16, fp16, fp32, fp8 */
    int block_size;
    double mem_util, overhead_ms, seq_overhead_us, overhead_gib;
    int max_batched_tokens, max_seqs, graph_max;
} ac_engine_in;

/* target: where the result will run and how it will be served. */
typedef struct {
    char device[AC_SPEC_STR]; /* as written */
    ac_target dev;            /* resolved (ac_target_resolve) */
    ac_workload workload;
    ac_engine_profile engine; /* device-class defaults, then the spec's engine overrides */
    ac_engine_in engine_in;
    int tp;   /* tensor-parallel size */
    int link; /* -1: the device's; 0 nvlink, 1 pcie */
} ac_target_spec;

#define AC_MAX_TASKS 8 /* eval.tasks entries */

/* eval.tasks[i]: a multiple-choice task file (JSONL, src/runtime/tasks.h). */
typedef struct {
    char name[64]; /* [A-Za-z0-9_.-]+, unique: the report's key */
    char path[AC_SPEC_STR];
} ac_eval_task;

typedef struct {
    int ctx, windows;
    int ntasks;
    ac_eval_task tasks[AC_MAX_TASKS];
} ac_eval_spec;

/* distill: knowledge distillation of every reported arm from the unpruned
 * model, between prune and evaluate (src/compress/distill.c; tokens = 0 is
 * off). tokens is each arm's total training budget (pipeline/candidates.c). */
typedef struct {
    long tokens;
    char text[AC_SPEC_STR]; /* training text ("" = the whole calibration file) */
    double lr;
    int seq_len, batch;
    double temperature;
    double ce_weight; /* loss = (1 - ce_weight) KL + ce_weight CE */
    int seed;         /* window sampling */
    /* the autocompress arm's KD-aware choice (candidates.c; docs/search.md) */
    int candidates;      /* structures ranked (1, the default: none) */
    int candidate_steps; /* steps of each one's short distillation */
    long ranking_tokens; /* the ranking's share of tokens (0: tokens / 4) */
} ac_distill_spec;

/* minitron: the Minitron arm's search (search.h, ac_minitron_opts; every
 * default Model-Optimizer's) and how it scores its top-k candidates. */
typedef struct {
    ac_minitron_opts opts;
    int score;      /* 0: calibration loss; 1: a task of eval.tasks */
    char task[64];  /* with score task: its name ("" = the first of eval.tasks) */
    int task_index; /* resolved: the eval.tasks index scored (-1: loss) */
} ac_minitron_spec;

/* puzzle: the opt-in third arm, Puzzle's block library scored by
 * block-local distillation and chosen by a mixed-integer program
 * (src/search/puzzle.h; docs/puzzle.md), then distilled as the others. */
typedef struct {
    int enabled;
    int steps;   /* BLD steps per trained variant */
    int windows; /* calibration windows of eval.ctx for BLD (a quarter held out for the scores) */
    int batch;   /* windows per BLD step */
    double lr;
} ac_puzzle_spec;

typedef struct {
    char name[AC_SPEC_STR];
    char model[AC_SPEC_STR], calibration[AC_SPEC_STR], heldout[AC_SPEC_STR], output[AC_SPEC_STR];
    ac_target_spec target;
    ac_constraints limits; /* 0 = no such limit */
    ac_method method;
    ac_search_opts search;
    ac_eval_spec eval;
    int repair;
    int calibration_tokens;
    int calibration_method; /* AC_CALIB_AUTO / EXACT / STREAMED (importance.h) */
    int priority;
    ac_distill_spec distill;
    ac_minitron_spec minitron;
    ac_puzzle_spec puzzle;
} ac_job_spec;

/* ---------------------------------------------------------------- the field table */

typedef enum {
    AC_F_STR,
    AC_F_INT,
    AC_F_NUM,
    AC_F_BOOL,
    AC_F_ENUM,
    AC_F_OBJ,
    AC_F_ARR /* an array of objects: up to hi items of item_size bytes from off, their count at count_off */
} ac_ftype; /* AC_F_INT: int or int64 by size */

enum {
    AC_F_REQUIRED = 1,
    AC_F_NONEMPTY = 2,  /* object: at least one member */
    AC_F_PATH_DIR = 4,  /* path of an existing directory (daemon path policy) */
    AC_F_PATH_FILE = 8, /* path of an existing file */
    AC_F_PATH_OUT = 16, /* path that will be created */
    AC_F_NODEFAULT = 32 /* the default depends on other fields (documented in doc) */
};

typedef struct ac_field {
    const char *name;
    ac_ftype type;
    int flags;
    double lo, hi;              /* numeric range, inclusive */
    double def;                 /* default: number, bool 0/1, enum index (-1: unset) */
    const char *const *enums;   /* AC_F_ENUM: allowed strings, NULL-terminated */
    const char *const *aliases; /* AC_F_ENUM: old names still accepted, pairs {old, current}, NULL-terminated */
    size_t off, size;           /* where the value goes in the section's struct */
    const struct ac_field *sub; /* AC_F_OBJ: the section's fields (offsets relative to off); AC_F_ARR: an item's */
    size_t count_off, item_size; /* AC_F_ARR: where the item count (int) goes; one item's size */
    const char *doc;
} ac_field;

/* The top-level table (terminated by a NULL name) and the target section's. */
const ac_field *ac_job_spec_fields(void);
const ac_field *ac_target_spec_fields(void);

/* Fill *s from JSON: defaults, then the values given; unknown fields, wrong
 * types and out-of-range values are errors naming the field in *field (a
 * thread-local string; may be NULL). Resolves target.device and the engine
 * profile; heldout defaults to calibration. */
int ac_job_spec_parse(const json_t *j, ac_job_spec *s, const char **field, ac_err *e);
/* The same for a target object alone (POST /v1/estimate); prefix names it in errors. */
int ac_target_spec_parse(const json_t *j, ac_target_spec *t, const char *prefix, const char **field, ac_err *e);
/* ---------------------------------------------------------------- validation */

/* An unreachable limit (ac_job_check_reachable, jobcheck.h): its spec name
 * ("max_tpot_ms"; NULL: none), the predicted figure it bounds ("tpot_ms")
 * and its unit, the limit given, and the best figure any structure of the
 * model reaches (the reachable bound). */
typedef struct {
    const char *constraint, *metric, *unit;
    int ge; /* 1: a lower bound (min_...), the reachable figure the highest any structure reaches */
    double limit, reachable;
} ac_limit_bound;

/* What a spec is checked against beyond its own fields. */
typedef struct {
    const char *jobs_dir; /* the daemon's data_dir/jobs, where outputs may not point (NULL: no such rule) */
    int need_output;      /* output must be given (the CLI; the daemon gives a job a default output) */
    /* The caller's own rules on the parsed spec (the daemon's caps and devices), run after parsing and before any
     * file is looked at: 0, or -1 having answered (the verdict is then AC_SPEC_REFUSED). May be NULL. */
    int (*rules)(void *ud, const ac_job_spec *s);
    void *ud;
    ac_limit_bound *bound; /* may be NULL: set when a limit is refused as unreachable (its constraint non-NULL) */
} ac_job_check_opts;

typedef enum {
    AC_SPEC_OK,      /* the job can start */
    AC_SPEC_INVALID, /* a field's value or a rule across fields ("invalid_spec") */
    AC_SPEC_BAD_PATH, /* a path the spec names, under the file policy (fsafe.h; "invalid_path") */
    AC_SPEC_REFUSED  /* opts->rules refused it */
} ac_spec_verdict;

/* THE validation of a job spec: what the daemon's submit (POST /v1/jobs),
 * POST /v1/validate and the CLI (validate, compress) check before a job
 * starts. In order: the fields (ac_job_spec_parse), output given when
 * opts->need_output, opts->rules, the paths (ac_job_check_paths), then the
 * base model against the export target (ac_deci_validate_model: a deci
 * export of a model nemotron-nas cannot express; ac_gguf_check_spec: a
 * GGUF export llama.cpp cannot run). *s gets the parsed spec; *field (may
 * be NULL) names the offending field ("" or NULL when none). opts may be NULL. */
ac_spec_verdict ac_job_spec_check(const json_t *j, ac_job_spec *s, const ac_job_check_opts *opts, const char **field,
                                  ac_err *e);

/* The engine profile predictions for t use on a checkpoint whose matrices
 * are in checkpoint_wdt (st_dtype; ac_model_wdt, ac_model_checkpoint_wdt):
 * t's, except that a CPU target whose spec names no weights dtype takes a
 * BF16 checkpoint's (its BF16 cost table: the CPU engine runs a BF16
 * checkpoint, and the BF16 export, on its BF16 kernels). */
void ac_target_engine_for(const ac_target_spec *t, int checkpoint_wdt, ac_engine_profile *out);
/* The weights' dtype those predictions are for ("bf16", "fp16", "fp32",
 * "fp8"): the spec's engine.weights_dtype; unnamed, on a CPU target the
 * checkpoint's (bf16 for a BF16 one, else fp32), elsewhere bf16. A CPU
 * target's table is ac_cost_cpu_table_dtype of it (fp16 and fp8: fp32). */
const char *ac_target_weights_dtype(const ac_target_spec *t, int checkpoint_wdt);
/* The dtype of t's cost table on that checkpoint (ac_cost_table_for's):
 * a CPU target's ac_cost_cpu_table_dtype of the weights' dtype ("bf16" or
 * "fp32"), else the profile's (ac_engine_profile_dtype). */
const char *ac_target_table_dtype(const ac_target_spec *t, int checkpoint_wdt);

/* "autocompress" / "minitron". */
const char *ac_method_name(ac_method m);
/* The limits given, as the spec names them ({"max_tpot_ms": 5}). */
json_t *ac_constraints_json(const ac_constraints *l);

/* The JSON schema of the table (proto/job.schema.json). */
json_t *ac_job_spec_schema(void);

/* The i-th path field of the spec (i = 0, 1, ...) for the daemon's path
 * policy: its name ("distill.text"), value ("" when not given) and
 * AC_F_PATH_* flags. Returns 0 past the last one. */
int ac_job_spec_path(const ac_job_spec *s, int i, const char **field, const char **path, int *flags);

#endif
