/*
 * students_int.h - the job's pruned students (s->pm, s->pa, and the ranked
 * winner of the KD-aware choice), never two of them in memory at once
 * (docs/architecture.md, "What each stage holds"):
 *
 *  - each arm is pruned and repaired on its own (ac_job_prune_arm), the
 *    first finished before the second is sliced; the repair of one arm
 *    reads only the model it was pruned from, so its own pass over the
 *    residual stream gives the numbers a joint pass gave;
 *  - in a two-arm job a finished student (pruned, or distilled and rounded
 *    back) is parked (ac_job_park: format/park.h, a file in the job's
 *    output directory, its name removed at once): its matrices leave the
 *    heap and stay only in the file's mapping;
 *  - a stage that reads a parked student (perplexity, tasks, distillation's
 *    fp32 copy) lets its pages go afterwards (ac_job_student_done), so the
 *    next student it reads is the only one resident.
 *
 * With one arm (method minitron) nothing is parked: there is no second
 * student. Private to the pipeline (job.c, candidates.c).
 */
#ifndef AC_STUDENTS_INT_H
#define AC_STUDENTS_INT_H

#include "core/err.h"
#include "job_state_int.h"

/* src pruned to arch by imp's unit orders into *out (BF16, owned), its
 * pruned FFN down projections refit to src's own layer outputs when the
 * spec asks for the repair (not on a hybrid model: the repair's layer
 * stream has no Mamba layers; *repaired: layers refit), and compacted
 * (removed layers out) when minitron_arm or when the export target is llama
 * or the model hybrid, as every arm of the job is; its norms, biases, conv
 * and per-head vectors rounded to the values the job's BF16 export writes
 * (ac_model_round_vectors), so what the job measures of it is the export. */
int ac_job_prune_arm(job_state *s, const ac_model *src, const ac_arch *arch, const ac_importance *imp,
                     int minitron_arm, ac_model *out, int *repaired, ac_err *e);
/* Park student m (arm: its name, for the file and messages) when the job
 * has two arms and m is an owned BF16 model; a failure (no room in the
 * output directory) is logged and m stays in memory: the job goes on. */
void ac_job_park(job_state *s, ac_model *m, const char *arm);
/* After a read of student m: a parked one's pages leave the process's
 * memory (an owned one is left as it is). */
void ac_job_student_done(const ac_model *m);

#endif
