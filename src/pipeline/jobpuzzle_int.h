/*
 * jobpuzzle_int.h - the job's puzzle stage (jobpuzzle.c): the opt-in third
 * arm (spec puzzle.enabled), run after distill and before evaluate. Private
 * to the pipeline folder.
 */
#ifndef AC_JOBPUZZLE_INT_H
#define AC_JOBPUZZLE_INT_H

#include "core/err.h"
#include "job_state_int.h"

/* Build the block library by block-local distillation (search/puzzle.h),
 * choose one block per layer under the job's limits, prune the base to it
 * with the trained blocks put in, distil it with distill.tokens less the
 * block-local distillation's tokens, and measure its held-out perplexity
 * (and eval.tasks) into s->rz, s->pz, s->pzr, s->distill["puzzle"],
 * s->tasks_pruned / s->task_scores ["puzzle"] and s->puzzle_extra. */
int ac_job_stage_puzzle(job_state *s, ac_err *e);
int ac_job_want_puzzle(const job_state *s);
/* What state_free frees of the stage's. */
void ac_job_puzzle_free(job_state *s);

#endif
