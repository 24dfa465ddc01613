/*
 * candidates_int.h - the distill stage's budget and the autocompress arm's
 * KD-aware choice of its structure (docs/search.md, "KD-aware choice").
 * Private to job.c (jobpuzzle.c shares the distillation options).
 *
 * Budget: spec distill.tokens is each arm's TOTAL training-token budget.
 * The autocompress arm spends it on
 *   ranking  the short distillations of its candidate structures,
 *   gates    the gate search's weight updates (search.cotrain: steps run x
 *            dnas_batch x dnas_seq_len; frozen-weight gates train no weight
 *            and count 0),
 *   final    the distillation of the chosen structure: the rest;
 * the minitron arm (Model-Optimizer's forward-only scoring of its top
 * candidates) all of it on its final distillation. ranking + gates + final
 * = total for each arm (the report's "budget").
 *
 * The choice: the search's structure (dnas, pruned in gate-score order),
 * the surrogate search's (importance order), the best uniform structure
 * (Minitron's pick projected to the export grid and repaired to the
 * limits), then the dnas search again under further seeds, the first
 * distill.candidates of those that are feasible and distinct; each is
 * pruned (and repaired), its loss measured on ranking windows (the
 * calibration file's tokens past calibration_tokens, which neither the
 * importance nor the gates saw; the first calibration windows when the file
 * has too few), distilled for a short run (candidate_steps steps, fewer
 * when ranking_tokens is smaller), measured again; the lowest loss after
 * the short run wins. The winner's short-distilled weights go on to the
 * final distillation; the report's perplexity_pruned and tasks_pruned are
 * of the winner before any distillation.
 */
#ifndef AC_CANDIDATES_INT_H
#define AC_CANDIDATES_INT_H

#include <jansson.h>

#include "compress/distill.h"
#include "job_state_int.h"

typedef struct {
    long ranking, gates, final, total; /* the autocompress arm's tokens (minitron: final = total) */
    json_t *candidates;                /* report entries (owned; NULL: no candidates were built) */
    json_t *protocol;                  /* how the ranking ran (owned; NULL: no ranking) */
    ac_model won;                      /* the winner after its short distillation (a.n_layers 0: none) */
} ac_kd_choice;

/* The job's distillation options (spec distill) with a budget of tokens;
 * on a local CUDA target it distils on the GPU (a mixture-of-experts model
 * on the CPU: the CUDA trainer has no MoE ops yet). Shared by every arm. */
void ac_job_distill_opts(const job_state *s, long tokens, ac_distill_opts *o);
/* The distill text: distill.text, default the whole calibration file (the
 * job keeps only its first calibration_tokens for calibration); NULL: the
 * calibration tokens. */
const char *ac_job_distill_text(const job_state *s);

/* Fewer steps per candidate than this (or than candidate_steps when it is
 * smaller) and there is no ranking: on the tiny model one step at the
 * distillation's peak rate raised every candidate's loss by 0.1 nats, more
 * than the candidates differ, and chose a worse structure (docs/benchmarks.md). */
#define AC_KD_MIN_STEPS 4

/* The index of the ranked[i] candidate with the lowest loss: after[] (by_after) or
 * before[] (the zero-shot ranking); the first on a tie; -1 when none is ranked. */
int ac_kd_pick(const double *before, const double *after, const int *ranked, int n, int by_after);

/* The candidate losses the choice ranks by: after (1, the job) or before
 * (0, the zero-shot ranking: tests' mutation check) the short distillation. */
extern int ac_kd_rank_after;

/* Budget of both arms and, for the autocompress arm when ranking applies
 * (two arms, distill.candidates > 1, a dense model, at least two feasible
 * distinct candidates), the ranking: s->ra, s->pa and s->rep_a become the
 * winner's (pa pruned, not distilled); c->won its short-distilled weights.
 * o: the job's distillation options (o->tokens the total); text: the
 * distill text (NULL: the calibration tokens). */
int ac_kd_choose(job_state *s, const ac_distill_opts *o, const char *text, ac_kd_choice *c, ac_err *e);
/* The final distillation of every arm with its budget (ac_distill_job),
 * into s->distill: each arm gets "budget", the autocompress arm
 * "candidates" and "ranking" too. */
int ac_kd_distill_arms(job_state *s, const ac_distill_opts *o, const char *text, const ac_ppl_opts *po,
                       ac_kd_choice *c, void (*emit)(void *ud, const char *kind, json_t *data), ac_err *e);
void ac_kd_choice_free(ac_kd_choice *c);

#endif
