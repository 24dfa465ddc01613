/*
 * jobcheck.h - the job's checks against the files and formats it names,
 * at submission (the daemon), in the CLI and at job start (the worker):
 * its paths under the file policy (fsafe.h), and the export targets' rules
 * (GGUF, deci) on the typed spec. The formats below (gguf.h, deci.h) know
 * files and architectures; what a job spec's fields mean for them is
 * written here, in the pipeline, where the spec is known (the GGUF and
 * deci hooks keep their format's name prefix).
 */
#ifndef AC_JOBCHECK_H
#define AC_JOBCHECK_H

#include <jansson.h>

#include "core/err.h"
#include "pipeline/jobspec.h"
#include "format/model.h"

/* A job's paths (every path field of the typed spec, ac_job_spec_path),
 * checked the same way at submit (daemon, in its work pool) and in the
 * worker: the model directory (AC_F_PATH_DIR) with a config.json, the text
 * files (AC_F_PATH_FILE: calibration, heldout, distill.text), and the output
 * directory (AC_F_PATH_OUT: missing, or empty, or holding only names an
 * export writes; a model there is refused too). Empty fields (not given)
 * are skipped.
 * `jobs_dir` (may be NULL) is the daemon's data_dir/jobs, where outputs may
 * not point. `field` gets the offending spec field. */
int ac_job_check_paths(const ac_job_spec *s, const char *jobs_dir, const char **field, ac_err *e);

/* Limits no structure of the model a reaches, refused before the job runs.
 * Every structure keeps the embeddings (and an untied output head) at a
 * hidden size no smaller than the search allows (search.hidden_multiple
 * with prune_hidden, else the base's): that structure with every layer
 * removed is the floor. Checked against it:
 *  - constraints.max_params, always (a count);
 *  - on a spec-profile target (a roofline table, monotone in every width)
 *    and a static-batch workload, every other limit: the floor's predicted
 *    TTFT, TPOT, memory and throughput are the best any structure reaches.
 *    A measured table (the local CPU or GPU) is not read at submit, and a
 *    served workload's scheduler can trade one figure for another: the
 *    search reports those (the job's infeasible event).
 * 0, or -1 with *field ("constraints.NAME"), e and *bound (may be NULL). */
int ac_job_check_reachable(const ac_job_spec *s, const ac_arch *a, const char **field, ac_limit_bound *bound,
                           ac_err *e);

/* 0 when the pipeline can compress s's model with s's options (or the
 * model does not load: its own error comes later); -1 with *field and the
 * reason: a mixture-of-experts model to the deci target (its loaders know
 * dense layers only) or the gguf target (llama.cpp's MoE architectures are
 * uniform: llama with search.gguf writes the GGUF); a mixture-of-experts option (search.prune_experts)
 * named in j, the spec's JSON, for a dense model. */
int ac_model_check_compressible(const ac_job_spec *s, const json_t *j, const char **field, ac_err *e);

/* GGUF job hooks, on the typed spec's search section (jobspec.h). A job asks
 * for GGUF with search.export_target "gguf" (its old name "gguf-deci" parses
 * to the same) or with search.gguf true next to export_target "llama".
 * check_spec (at submission and job start): the combination is valid and
 * the model's config and tokenizer can be expressed (*field names the
 * culprit; model_dir NULL: the combination only); export_job (stage
 * export): writes OUT_DIR/model.gguf (BF16) when asked. */
int ac_gguf_check_spec(const ac_search_opts *o, const char *model_dir, const char **field, ac_err *e);
int ac_gguf_export_job(const ac_search_opts *o, const ac_model *m, const char *model_dir, const char *out_dir,
                       ac_err *e);
/* Adds {"gguf": {"file", "architecture", "serve"}} to the report's export object when a GGUF was written. */
void ac_gguf_report(const ac_search_opts *o, const ac_arch *a, const char *out_dir, json_t *export_obj);

/* Deci: submit-time checks of a job spec whose search.export_target is deci (the
 * default; `deci` says whether it is). Pure spec rules (no file access):
 * search.ffn_multiple must sit on the loaders' grid. *field names the
 * offending field. */
int ac_deci_validate_spec(int deci, int ffn_multiple, const char **field, ac_err *e);
/* Checks against the base model's architecture: features the target cannot
 * express in a heterogeneous result (sliding window, per-layer query heads).
 * minitron: the job's method is minitron (a uniform base stays uniform). */
int ac_deci_validate_base(int deci, int minitron, const ac_arch *base, const char **field, ac_err *e);
/* The same, loading model_dir/config.json (for the daemon's submit). */
int ac_deci_validate_model(int deci, int minitron, const char *model_dir, const char **field, ac_err *e);

/* Tensor parallelism (target.tp > 1): every layer of the base model splits
 * tp ways: query heads and FFN widths divisible by tp, KV heads divisible
 * by tp or dividing it (then replicated, one a GPU). tp <= 1: no rule.
 * *field is "target.tp". _model loads model_dir/config.json (a model that
 * cannot be read is left to the load's own message). */
int ac_job_check_tp(int tp, const ac_arch *base, const char **field, ac_err *e);
int ac_job_check_tp_model(int tp, const char *model_dir, const char **field, ac_err *e);

#endif
