/*
 * backend_cuda.c - the CUDA plugin's engine (src/cuda, loaded by
 * cuda_plugin.c) behind the backend interface (backend_int.h), on device 0 of
 * this process. The cross-entropy runs on the device: only one float per
 * position comes back. RoPE tables come from the host (rope.c).
 */
#include <stdio.h>
#include <stdlib.h>

#include "backend_int.h"
#include "runtime/cuda_plugin.h"
#include "runtime/rope.h"

struct ac_backend_engine {
    const ac_cuda_api *cu;
    const ac_model *m;
    acc_engine *gpu;
    int *targets;        /* [B*ctx] */
    float *nll, *logits; /* per-row NLL; last-position logits (host) */
};

static void cuda_close(ac_backend_engine *b) {
    if (!b) return;
    if (b->gpu) b->cu->engine_free(b->gpu);
    free(b->targets);
    free(b->nll);
    free(b->logits);
    free(b);
}

static int cuda_open(const ac_model *m, int max_batch, int max_ctx, const ac_engine_hooks *hooks,
                     ac_backend_engine **out, ac_err *e) {
    const char *why;
    if (hooks) return ac_errf(e, "perplexity: activation statistics are gathered on the CPU engine only");
    const ac_cuda_api *cu = ac_cuda(&why);
    if (!cu) return ac_errf(e, "perplexity on CUDA: %s", why);
    ac_backend_engine *b = calloc(1, sizeof *b);
    if (!b) return ac_errf(e, "out of memory");
    *b = (ac_backend_engine){.cu = cu, .m = m};
    size_t rope = (size_t)max_ctx * (m->a.head_dim / 2);
    float *cs = malloc(rope * sizeof *cs), *sn = malloc(rope * sizeof *sn);
    b->targets = malloc(sizeof(int) * max_batch * max_ctx);
    b->nll = malloc(sizeof(float) * max_batch * max_ctx);
    b->logits = malloc(sizeof(float) * max_batch * m->a.vocab);
    int rc = cs && sn && b->targets && b->nll && b->logits ? 0 : ac_errf(e, "out of memory");
    if (!rc) rc = ac_rope_tables(&m->a, max_ctx, cs, sn, e);
    char err[512] = "";
    if (!rc && cu->engine_create(0, m, max_batch, max_ctx, cs, sn, &b->gpu, err, sizeof err))
        rc = ac_errf(e, "perplexity on CUDA: %s", err);
    free(cs);
    free(sn);
    if (rc) {
        cuda_close(b);
        return -1;
    }
    *out = b;
    return 0;
}

static int cuda_step(ac_backend_engine *b, const int *tok, int B, int n, int pos0, ac_err *e) {
    char err[512] = "";
    if (b->cu->engine_forward(b->gpu, tok, B, n, pos0, 1, b->logits, err, sizeof err))
        return ac_errf(e, "CUDA engine: %s", err);
    return 0;
}

static int cuda_window_nll(ac_backend_engine *b, const int *tok, int nb, int ctx, int from, double *sum, long *count,
                           ac_err *e) {
    char err[512] = "";
    for (int w = 0; w < nb; w++)
        for (int t = 0; t < ctx; t++) b->targets[w * ctx + t] = t >= from && t + 1 < ctx ? tok[w * ctx + t + 1] : -1;
    if (b->cu->engine_nll(b->gpu, tok, b->targets, nb, ctx, 0, b->nll, err, sizeof err))
        return ac_errf(e, "perplexity on CUDA: %s", err);
    *sum = 0;
    *count = 0;
    for (int i = 0; i < nb * ctx; i++)
        if (b->targets[i] >= 0) {
            *sum += b->nll[i];
            ++*count;
        }
    return 0;
}

static int cuda_weights_changed(ac_backend_engine *b, int layer, ac_wmat which, ac_err *e) {
    if (layer < 0 || layer >= b->m->a.n_layers) return ac_errf(e, "CUDA weight update: no layer %d", layer);
    size_t n;
    const float *p = ac_layer_matrix(b->m, layer, which, &n); /* in its dtype: the plugin converts */
    char err[512] = "";
    int rc = !p || b->cu->engine_update(b->gpu, layer, which, p, ac_model_wdt(b->m), n, err, sizeof err);
    return rc ? ac_errf(e, "CUDA weight update: %s", p ? err : "no such matrix") : 0;
}

static const ac_backend cuda_backend = {"cuda",    cuda_open, cuda_step, cuda_window_nll, cuda_weights_changed,
                                        cuda_close};

const ac_backend *ac_backend_cuda(const char **why) { return ac_cuda(why) ? &cuda_backend : NULL; }

const ac_backend *ac_backend_get(int cuda, ac_err *e) {
    if (!cuda) return &ac_backend_cpu;
    const char *why;
    const ac_backend *b = ac_backend_cuda(&why);
    if (!b) ac_errf(e, "perplexity on CUDA: %s", why);
    return b;
}
