/*
 * checkpoint_int.h - a job's finished stages kept on disk, so that a job run
 * again from the start (a Slurm batch job requeued after a node was lost or
 * preempted, a local job re-queued after its daemon's restart or crash)
 * resumes after its last finished stage instead of computing it
 * all again (job.c, ac_job_ctx.checkpoint_dir).
 *
 * What is kept, one file per stage in the directory (STAGE.ckpt, written
 * to a temporary name, synced, then renamed), for every model family
 * (dense, mixture-of-experts, hybrid Mamba-Transformer):
 *   calibrate  the importance (every order, score and loss curve: KV
 *              groups, FFN channels, hidden channels, Minitron's heads and
 *              channels, each MoE layer's experts and each expert's
 *              channels, each Mamba layer's heads by group and its x
 *              channels' scores (which rank a narrower head dim));
 *   profile    the cost table and whether it came from the cache;
 *   search     both arms' results (architecture, predicted cost, loss,
 *              feasibility, steps, the method's report fields) and the
 *              DNAS gate-score orders (the same fields as calibrate's);
 *              not with search.keep_weights, whose result holds the
 *              co-trained weights (job.c runs it again).
 * and, within the distill stage, each arm once distilled (candidates.c):
 *   distill.ARM       its report fields and the student's structure, and
 *   distill.ARM.model/ the distilled student (ac_model_save, fp32 so that
 *                      norms and biases are kept as trained; BF16 matrices
 *                      widen exactly and are narrowed back on reading), the
 *                      directory written first, the .ckpt committing it.
 * load is cheap and run again (the model is mapped, the texts read); prune
 * runs again from the restored search (its students are sliced, not
 * trained), and an arm whose checkpoint is usable is not distilled again;
 * puzzle, evaluate and export run again.
 *
 * A file holds a header (format version, the stage, the caller's key, the
 * base model's shape and architecture, the sizes of the structs written as
 * bytes) checked on reading: a file from another job, another spec,
 * another model or another build of this program is not used (the stage
 * runs), nor one of another format version (an older build's files lack
 * the expert and Mamba rows: version 01 is never read as 02). Each array
 * holds its count, checked against the base architecture, and the file
 * ends with the magic again: a cut file is not used either. The files are
 * for the same program on the same kind of machine (doubles and structs
 * as bytes). A field added to ac_importance must be added to
 * checkpoint.c's IMP_ROW_FIELDS or IMP_FLAT_FIELDS.
 *
 * Private to the pipeline (job_state_int.h).
 */
#ifndef AC_CHECKPOINT_H
#define AC_CHECKPOINT_H

#include "core/err.h"
#include "job_state_int.h"

/* 1 when stage is one this module keeps. */
int ac_ckpt_stage(const char *stage);
/* Write stage's outputs (from s) and its run time to DIR/STAGE.ckpt. */
int ac_ckpt_save(const job_state *s, const char *dir, const char *key, const char *stage, double seconds, ac_err *e);
/* Restore stage's outputs into s from DIR/STAGE.ckpt: 1 restored (*seconds:
 * the stage's first run time), 0 none usable (why says why when there was a
 * file; s is then unchanged). */
int ac_ckpt_load(job_state *s, const char *dir, const char *key, const char *stage, double *seconds, char *why,
                 size_t n);
/* A distilled arm: its student m and its report fields (borrowed) to
 * DIR/distill.ARM.ckpt and DIR/distill.ARM.model/. */
int ac_ckpt_save_arm(const job_state *s, const char *dir, const char *key, const char *arm, const ac_model *m,
                     const json_t *report, ac_err *e);
/* Restore arm's distilled student into m, which holds the student pruned
 * in this run (it must have the same structure and dtype; it is freed and
 * replaced), and its report fields into *report (owned): 1 restored, 0 not
 * (why says why when there was a file; m unchanged). */
int ac_ckpt_load_arm(const job_state *s, const char *dir, const char *key, const char *arm, ac_model *m,
                     json_t **report, char *why, size_t n);
/* Remove DIR's distilled arms (their .ckpt first, then the students). */
void ac_ckpt_release_arms(const char *dir);
/* Remove every checkpoint in DIR: the stages' files, then the arms. */
void ac_ckpt_clear(const char *dir);

#endif
