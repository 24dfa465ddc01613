/*
 * synth.h - models the C tests share (header-only, like check.h; include
 * it after check.h): a uniform Llama architecture of given sizes, for tests
 * that need an ac_arch without a checkpoint (the caller frees it with
 * ac_arch_free), and the tiny trained model with its calibration ids.
 */
#ifndef AC_TEST_SYNTH_H
#define AC_TEST_SYNTH_H

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "eval.h"
#include "model.h"

/* L layers of (heads, kv, ffn), hidden H, head size hd, vocab; layers NULL
 * when out of memory (the tests then fail on their first use). */
static inline ac_arch mk_arch(int L, int H, int hd, int heads, int kv, int ffn, int vocab) {
    ac_arch a;
    memset(&a, 0, sizeof a);
    snprintf(a.model_type, sizeof a.model_type, "llama");
    a.vocab = vocab;
    a.hidden = H;
    a.head_dim = hd;
    a.n_layers = L;
    a.max_pos = 4096;
    a.eps = 1e-5f;
    a.rope_theta = 10000;
    a.bos_id = a.eos_id = -1;
    a.layers = calloc(L, sizeof *a.layers);
    for (int l = 0; a.layers && l < L; l++) a.layers[l] = (ac_layer_arch){heads, kv, ffn};
    return a;
}

/* The tiny model (build/models/tiny) and at most max_ids ids of its
 * calibration text; 0, or -1 when they are not built (e carries why). */
static inline int ck_load_tiny(ac_model *m, int **ids, size_t *n, size_t max_ids, ac_err *e) {
    char tiny[1100], text[1200];
    ck_build_path(tiny, sizeof tiny, "models/tiny");
    ck_build_path(text, sizeof text, "data/calib.txt");
    if (ac_model_load(tiny, m, e)) return -1;
    if (ac_load_text_ids(tiny, text, ids, n, m->a.vocab, e)) {
        ac_model_free(m);
        return -1;
    }
    if (*n > max_ids) *n = max_ids;
    return 0;
}

#endif
