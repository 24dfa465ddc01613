/* eval.c - see eval.h. */
#include "eval.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tokenizer.h"

int ac_perplexity(const ac_model *m, const int *ids, size_t n, const ac_ppl_opts *o, ac_stats *stats,
                  void (*progress)(void *ud, double frac), void *ud, ac_ppl_result *r, ac_err *e) {
    memset(r, 0, sizeof *r);
    int ctx = o->ctx, B = o->stride ? 1 : (o->batch > 0 ? o->batch : 1);
    if (ctx < 2) return ac_errf(e, "perplexity: context must be at least 2 tokens");
    if (o->stride < 0 || o->stride > ctx) return ac_errf(e, "perplexity: stride must be in [1, ctx]");
    if (n < (size_t)ctx) return ac_errf(e, "perplexity: text has %zu tokens, fewer than one window of %d", n, ctx);
    long nwin = o->stride ? (long)((n - ctx) / o->stride + 1) : (long)(n / ctx);
    if (o->max_windows > 0 && nwin > o->max_windows) nwin = o->max_windows;
    if (B > nwin) B = (int)nwin;
    ac_engine en;
    if (ac_engine_init(&en, m, B, ctx, e)) return -1;
    en.stats = stats;
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
        if (ac_engine_forward(&en, tok, nb, ctx, 0, 0, e)) {
            ac_engine_free(&en);
            return -1;
        }
        long cnt;
        double mean = ac_engine_nll(&en, tok, nb, ctx, from, &cnt);
        total += mean * cnt;
        r->scored += cnt;
        r->processed += (long)nb * ctx;
        r->windows += nb;
        prev_end = start + ctx;
        if (progress) progress(ud, (double)(w + nb) / nwin);
    }
    ac_engine_free(&en);
    r->seconds = ac_now() - t0;
    r->nll = r->scored ? total / r->scored : 0;
    r->ppl = exp(r->nll);
    r->tok_per_s = r->seconds > 0 ? r->processed / r->seconds : 0;
    return 0;
}

int ac_load_text_ids(const char *model_dir, const char *text_path, int **ids, size_t *n, int vocab, ac_err *e) {
    char path[4096];
    snprintf(path, sizeof path, "%s/tokenizer.json", model_dir);
    ac_tokenizer *t;
    if (ac_tok_load(path, &t, e)) return -1;
    if (vocab > 0 && ac_tok_vocab_size(t) > vocab) {
        int tv = ac_tok_vocab_size(t);
        ac_tok_free(t);
        return ac_errf(e, "%s has %d tokens but the model's vocabulary has %d", path, tv, vocab);
    }
    size_t len;
    char *text = ac_read_file(text_path, 1u << 30, &len, e);
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
