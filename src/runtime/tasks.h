/*
 * tasks.h - multiple-choice task accuracy, scored the way
 * lm-evaluation-harness scores a `multiple_choice` task (docs/tasks.md).
 *
 * A task file is JSONL, one question a line:
 *   {"context": "Question: ...\nAnswer:", "choices": ["a", "b", ...], "gold": 1}
 * or, for Winogrande's partial evaluation (one context per choice, one
 * shared continuation):
 *   {"contexts": ["... the trophy", "... the suitcase"], "continuation": "is too big.", "gold": 0}
 * and optionally "target_delimiter" (default " ", put between context and
 * continuation as the harness does).
 *
 * Each choice is one request (context, delimiter + choice), tokenised as the
 * harness's _encode_pair does: trailing whitespace of the context moves to
 * the continuation, the continuation's tokens are those of
 * tokenize(context + continuation) past tokenize(context), and an empty
 * context becomes the model's BOS token (else EOS). Its score is the sum of
 * log p(token) over the continuation's tokens given everything before
 * (inputs longer than the model's context keep their last tokens).
 * acc: argmax of the sums is gold; acc_norm: argmax of sum / the choice's
 * length in characters (Unicode code points, Python's len; for a
 * partial-evaluation line the choice is its context); ties go to the first.
 * stderr: the sample standard deviation of the per-question 0/1 over n - 1,
 * divided by sqrt(n) (the harness's mean_stderr).
 *
 * Ownership: ac_mc_load fills an ac_mc_task the caller frees with
 * ac_mc_free; the model and task outlive ac_mc_score.
 */
#ifndef AC_TASKS_H
#define AC_TASKS_H

#include <jansson.h>
#include <stddef.h>

#include "core/err.h"
#include "format/model.h"
#include "format/tokenizer.h"

#define AC_MC_MAX_CHOICES 64

typedef struct {
    int ndocs, nreq;
    int *gold;     /* [ndocs] */
    int *first;    /* [ndocs + 1]: question d's choices are requests first[d] .. first[d + 1] - 1 */
    int *tok;      /* every request's tokens, context then continuation, back to back */
    size_t *off;   /* [nreq + 1]: request r is tok[off[r] .. off[r + 1]) */
    int *ncont;    /* [nreq]: its last ncont[r] tokens are the continuation (>= 1) */
    double *chars; /* [nreq]: the choice's length in characters (acc_norm) */
} ac_mc_task;

/* The file's lines checked for shape only (no tokenizer): the error names
 * the line ("line 3: gold 4 is outside the 4 choices"). *ndocs may be NULL. */
int ac_mc_check_file(const char *path, int *ndocs, ac_err *e);

/* Parse and tokenise the file. prefix_id: the token an empty context
 * becomes (the model's BOS, else EOS; -1: an empty context is an error);
 * vocab > 0: every id must be below it. */
int ac_mc_load(const char *path, const ac_tokenizer *t, int prefix_id, int vocab, ac_mc_task *out, ac_err *e);
/* The same with MODEL_DIR's tokenizer.json (or a .gguf file's) and the
 * model's BOS / EOS from its config. */
int ac_mc_load_for(const char *model_dir, const ac_arch *a, const char *path, ac_mc_task *out, ac_err *e);
void ac_mc_free(ac_mc_task *t);

typedef struct {
    int n;                           /* questions */
    double acc, acc_norm;            /* fractions in [0, 1] */
    double acc_stderr, norm_stderr;  /* NAN when n < 2 */
    double seconds;
    long tokens;                     /* tokens run through the model */
} ac_mc_result;

/* Score every request on the CPU engine (engine.h) over m: requests sorted
 * by length, up to `batch` (>= 1) a forward (halved while a forward would
 * exceed 4096 tokens or 256 MiB of logits), right-padded (causal attention
 * leaves the real positions untouched). max_len: the longest input (0: the
 * model's max_position_embeddings, else 2048). lls (may be NULL) gets each
 * request's log-likelihood in nats [nreq]. */
int ac_mc_score(const ac_model *m, const ac_mc_task *t, int batch, int max_len, double *lls, ac_mc_result *r,
                ac_err *e);

/* {"acc", "acc_norm", "n", "stderr", "acc_norm_stderr", "seconds"} (the
 * stderrs null when n < 2); NULL when out of memory. */
json_t *ac_mc_result_json(const ac_mc_result *r);

#endif
