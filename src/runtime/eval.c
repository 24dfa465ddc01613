/* eval.c - see eval.h. */
#include "core/dtype.h"
#include "runtime/eval.h"
#include "core/fsafe.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend_int.h"
#include "format/gguf.h"
#include "format/tokenizer.h"

/* The engine that scores windows and times steps, on the backend chosen
 * once at open (backend_int.h). */
struct ac_scorer {
    const ac_model *m;
    int B, ctx;
    const ac_backend *be;
    ac_backend_engine *en;
};

int ac_scorer_open(const ac_model *m, int batch, int ctx, int cuda, const ac_engine_hooks *hooks, ac_scorer **out,
                   ac_err *e) {
    *out = NULL;
    if (batch < 1 || ctx < 2) return ac_errf(e, "scorer: batch must be >= 1 and ctx >= 2");
    const ac_backend *be = ac_backend_get(cuda, e);
    if (!be) return -1;
    ac_scorer *sc = calloc(1, sizeof *sc);
    if (!sc) return ac_errf(e, "out of memory");
    *sc = (ac_scorer){.m = m, .B = batch, .ctx = ctx, .be = be};
    if (be->open(m, batch, ctx, hooks, &sc->en, e)) {
        free(sc);
        return -1;
    }
    *out = sc;
    return 0;
}

void ac_scorer_close(ac_scorer *sc) {
    if (!sc) return;
    sc->be->close(sc->en);
    free(sc);
}

int ac_scorer_weights_changed(ac_scorer *sc, int layer, ac_wmat which, ac_err *e) {
    return sc->be->weights_changed(sc->en, layer, which, e);
}

int ac_scorer_step(ac_scorer *sc, const int *tok, int B, int n, int pos0, ac_err *e) {
    return sc->be->step(sc->en, tok, B, n, pos0, e);
}

/* Checks the protocol; *nwin and *B: windows to score, windows per forward. */
static int ppl_plan(const ac_ppl_opts *o, size_t n, long *nwin, int *B, ac_err *e) {
    int ctx = o->ctx;
    if (ctx < 2) return ac_errf(e, "perplexity: context must be at least 2 tokens");
    if (o->stride < 0 || o->stride > ctx) return ac_errf(e, "perplexity: stride must be in [1, ctx]");
    if (n < (size_t)ctx) return ac_errf(e, "perplexity: text has %zu tokens, fewer than one window of %d", n, ctx);
    *nwin = o->stride ? (long)((n - ctx) / o->stride + 1) : (long)(n / ctx);
    if (o->max_windows > 0 && *nwin > o->max_windows) *nwin = o->max_windows;
    *B = o->stride ? 1 : (o->batch > 0 ? o->batch : 1);
    if (*B > *nwin) *B = (int)*nwin;
    return 0;
}

int ac_scorer_perplexity(ac_scorer *sc, const int *ids, size_t n, const ac_ppl_opts *o,
                         void (*progress)(void *ud, double frac), void *ud, ac_ppl_result *r, ac_err *e) {
    memset(r, 0, sizeof *r);
    long nwin;
    int B, ctx = o->ctx;
    if (ppl_plan(o, n, &nwin, &B, e)) return -1;
    if (ctx != sc->ctx) return ac_errf(e, "perplexity: context %d but the scorer was opened for %d", ctx, sc->ctx);
    if (B > sc->B) B = sc->B;
    r->engine = sc->be->name;
    double t0 = ac_now(), total = 0;
    long prev_end = 1; /* targets at positions < prev_end are already scored */
    for (long w = 0; w < nwin; w += B) {
        int nb = (int)(nwin - w < B ? nwin - w : B);
        long start = o->stride ? w * o->stride : w * ctx;
        const int *tok = ids + start; /* windows are contiguous in ids */
        int from = 0;
        if (o->stride) {
            from = (int)(prev_end - 1 - start);
            if (from < 0) from = 0;
        }
        double sum = 0;
        long cnt = 0;
        if (sc->be->window_nll(sc->en, tok, nb, ctx, from, &sum, &cnt, e)) return -1;
        total += sum;
        r->scored += cnt;
        r->processed += (long)nb * ctx;
        r->windows += nb;
        prev_end = start + ctx;
        if (progress) progress(ud, (double)(w + nb) / nwin);
    }
    r->seconds = ac_now() - t0;
    r->nll = r->scored ? total / r->scored : 0;
    r->ppl = exp(r->nll);
    r->tok_per_s = r->seconds > 0 ? r->processed / r->seconds : 0;
    return 0;
}

int ac_perplexity(const ac_model *m, const int *ids, size_t n, const ac_ppl_opts *o, const ac_engine_hooks *hooks,
                  void (*progress)(void *ud, double frac), void *ud, ac_ppl_result *r, ac_err *e) {
    memset(r, 0, sizeof *r);
    long nwin;
    int B;
    if (ppl_plan(o, n, &nwin, &B, e)) return -1;
    ac_scorer *sc;
    if (ac_scorer_open(m, B, o->ctx, o->cuda, hooks, &sc, e)) return -1;
    int rc = ac_scorer_perplexity(sc, ids, n, o, progress, ud, r, e);
    ac_scorer_close(sc);
    return rc;
}

int ac_load_text_ids(const char *model_dir, const char *text_path, int **ids, size_t *n, int vocab, ac_err *e) {
    char path[4096];
    if (ac_fsafe_join(model_dir, "tokenizer.json", path, sizeof path, e)) return -1;
    ac_tokenizer *t;
    if (ac_gguf_is_path(model_dir)) { /* the tokenizer is in the GGUF metadata */
        snprintf(path, sizeof path, "%s", model_dir);
        if (ac_gguf_tokenizer(model_dir, &t, e)) return -1;
    } else if (ac_tok_load(path, &t, e))
        return -1;
    if (vocab > 0 && ac_tok_vocab_size(t) > vocab) {
        int tv = ac_tok_vocab_size(t);
        ac_tok_free(t);
        return ac_errf(e, "%s has %d tokens but the model's vocabulary has %d", path, tv, vocab);
    }
    size_t len;
    char *text = ac_fsafe_read(text_path, AC_FK_TEXT, &len, e);
    int rc = !text || ac_tok_encode(t, text, len, ids, n, e);
    free(text);
    ac_tok_free(t);
    if (rc) return -1;
    for (size_t i = 0; vocab > 0 && i < *n; i++)
        if ((*ids)[i] >= vocab) {
            int bad = (*ids)[i];
            free(*ids);
            *ids = NULL;
            return ac_errf(e, "%s: tokenizer produced id %d but the model has %d tokens", path, bad, vocab);
        }
    return 0;
}
