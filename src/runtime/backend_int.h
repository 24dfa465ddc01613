/*
 * backend_int.h - the one compute-backend interface: an engine over a model
 * that runs forward passes through a KV cache, for timed steps and for
 * scoring windows. Implemented by the CPU engine (backend_cpu.c over
 * engine.c) and by the CUDA plugin (backend_cuda.c over the table the
 * plugin's acc_api returns). Chosen once, by whoever opens an engine
 * (ac_backend_get); the perplexity and latency code only calls through it.
 */
#ifndef AC_BACKEND_H
#define AC_BACKEND_H

#include "runtime/engine.h"
#include "core/err.h"
#include "format/model.h"

typedef struct ac_backend_engine ac_backend_engine;

typedef struct ac_backend {
    const char *name; /* "cpu", "cuda" (static) */
    /* An engine for up to max_batch sequences of max_ctx tokens. The model
     * must outlive it. hooks (observers of the activations, engine.h; the
     * search's statistics fill them: ac_stats_hooks) may be non-NULL only
     * for the CPU backend; they are copied, their ud must outlive the engine. */
    int (*open)(const ac_model *m, int max_batch, int max_ctx, const ac_engine_hooks *hooks, ac_backend_engine **out,
                ac_err *e);
    /* Forward tok[B][n] at position pos0 through the KV cache, only the last
     * position's logits kept: the prefill and decode steps latency times. */
    int (*step)(ac_backend_engine *en, const int *tok, int B, int n, int pos0, ac_err *e);
    /* nb windows tok[nb][ctx] from position 0: the sum and the count of the
     * NLL of tok[b][t + 1] for t in [from, ctx - 1). */
    int (*window_nll)(ac_backend_engine *en, const int *tok, int nb, int ctx, int from, double *sum, long *count,
                      ac_err *e);
    /* The model's matrix `which` of `layer` was changed in place. */
    int (*weights_changed)(ac_backend_engine *en, int layer, ac_wmat which, ac_err *e);
    void (*close)(ac_backend_engine *en);
} ac_backend;

extern const ac_backend ac_backend_cpu;

/* The CUDA backend (device 0 of this process) when the plugin, the driver
 * and a device are there; else NULL and *why says what is missing. */
const ac_backend *ac_backend_cuda(const char **why);

/* cuda ? ac_backend_cuda : the CPU backend; NULL with e set when CUDA is
 * asked for and absent. */
const ac_backend *ac_backend_get(int cuda, ac_err *e);

#endif
