/*
 * eval.h - perplexity of a model on token ids, with the protocol spelled out
 * in the result: non-overlapping windows of ctx tokens (every target inside
 * a window scored), or a sliding window with stride (each target scored once,
 * with up to ctx-1 tokens of left context, as Hugging Face's recipe).
 */
#ifndef AC_EVAL_H
#define AC_EVAL_H

#include <stddef.h>

#include "runtime/engine.h"

typedef struct {
    int ctx;         /* window length in tokens */
    int stride;      /* 0 = non-overlapping windows; else sliding stride */
    int max_windows; /* 0 = all */
    int batch;       /* windows per forward call (non-overlapping mode) */
    int cuda;        /* 1: forward and cross-entropy on CUDA device 0 through
                         the plugin (an error when it is absent); hooks must
                         then be NULL: they watch the CPU engine only */
} ac_ppl_opts;

typedef struct {
    double ppl, nll; /* exp(mean nll), mean nll in nats */
    long scored;     /* targets scored */
    long processed;  /* tokens run through the model */
    int windows;
    double seconds, tok_per_s;
    const char *engine; /* "cpu" or "cuda" (static string) */
} ac_ppl_result;

/* hooks may be NULL; when set, they watch every forward's activations (the
 * search's activation statistics fill them: ac_stats_hooks, stats.h).
 * progress (may be NULL) is called after each forward with the fraction done. */
int ac_perplexity(const ac_model *m, const int *ids, size_t n, const ac_ppl_opts *o, const ac_engine_hooks *hooks,
                  void (*progress)(void *ud, double frac), void *ud, ac_ppl_result *r, ac_err *e);

/* A scorer keeps one engine for one model across perplexity runs and
 * timed steps: the CPU engine, or with cuda the CUDA plugin's on device 0
 * (weights copied there once). batch: most windows per forward; ctx: the window length. hooks
 * (CPU only) may be NULL. The model must outlive the scorer. */
typedef struct ac_scorer ac_scorer;
int ac_scorer_open(const ac_model *m, int batch, int ctx, int cuda, const ac_engine_hooks *hooks, ac_scorer **out,
                   ac_err *e);
/* ac_perplexity on the scorer's engine (o->ctx must be its ctx; o->cuda is
 * ignored: the engine was chosen at open). */
int ac_scorer_perplexity(ac_scorer *sc, const int *ids, size_t n, const ac_ppl_opts *o,
                         void (*progress)(void *ud, double frac), void *ud, ac_ppl_result *r, ac_err *e);
/* The model's matrix `which` of `layer` was changed in place: the CUDA engine
 * copies it again (the CPU engine reads the model directly: nothing to do). */
int ac_scorer_weights_changed(ac_scorer *sc, int layer, ac_wmat which, ac_err *e);
/* One forward of B x n tokens at position pos0 through the KV cache, only
 * the last position's logits kept: the prefill and decode steps that
 * latency measurements time. */
int ac_scorer_step(ac_scorer *sc, const int *tok, int B, int n, int pos0, ac_err *e);
void ac_scorer_close(ac_scorer *sc);

/* Tokenize a UTF-8 text file with MODEL_DIR/tokenizer.json (or, for a
 * .gguf file, the tokenizer in its metadata). The ids are checked against
 * vocab (when > 0). *ids is malloc'd. */
int ac_load_text_ids(const char *model_dir, const char *text_path, int **ids, size_t *n, int vocab, ac_err *e);

#endif
