/*
 * jobtasks_int.h - a job's eval.tasks (jobspec.h): each task file tokenised once
 * for the base model, then scored on any model of the job (the base, the
 * pruned and the distilled arms; they share the base's tokenizer) as
 * lm-evaluation-harness scores multiple choice (runtime/tasks.h).
 *
 * Ownership: ac_job_tasks_load fills *out, freed by ac_job_tasks_free;
 * ac_job_tasks_score returns a new JSON object the caller owns.
 */
#ifndef AC_JOBTASKS_H
#define AC_JOBTASKS_H

#include <jansson.h>

#include "pipeline/jobspec.h"
#include "runtime/tasks.h"

typedef struct {
    int n;
    const char *names[AC_MAX_TASKS]; /* borrowed from the spec */
    ac_mc_task t[AC_MAX_TASKS];
} ac_job_tasks;

/* Every eval.tasks file of ev for the model in model_dir (its tokenizer,
 * BOS/EOS and vocabulary from a); an error names the task's field. */
int ac_job_tasks_load(const ac_eval_spec *ev, const char *model_dir, const ac_arch *a, ac_job_tasks *out, ac_err *e);
/* {"NAME": {"acc", "acc_norm", "n", "stderr", "acc_norm_stderr", "seconds"}, ...} of m; NULL with e set on failure. */
json_t *ac_job_tasks_score(const ac_job_tasks *jt, const ac_model *m, ac_err *e);
void ac_job_tasks_free(ac_job_tasks *jt);

#endif
