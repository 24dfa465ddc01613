/*
 * synth.h - models the C tests share (header-only, like check.h; include
 * it after check.h): a uniform Llama architecture of given sizes, for tests
 * that need an ac_arch without a checkpoint (the caller frees it with
 * ac_arch_free), the tiny trained model with its calibration ids, and a
 * check that a BF16 model is an fp32 one rounded (bf16_matches).
 */
#ifndef AC_TEST_SYNTH_H
#define AC_TEST_SYNTH_H

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "runtime/eval.h"
#include "format/model.h"
#include "core/tensor.h"

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
    for (int l = 0; a.layers && l < L; l++) a.layers[l] = (ac_layer_arch){heads, kv, ffn, 0, 0, 0};
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

/* b (BF16 matrices) is src32 (fp32) rounded to nearest even, matrix for
 * matrix (tied heads tied in both, removed parts removed in both), with
 * the same norms and biases (fp32). */
static inline int bf16_matches(const ac_model *b, const ac_model *src32) {
    size_t V = (size_t)b->a.vocab * b->a.hidden;
    const uint16_t *be = (const uint16_t *)b->embed;
    int ok = ac_model_wdt(b) == ST_BF16 && ac_model_wdt(src32) == ST_F32 && b->a.hidden == src32->a.hidden &&
             b->a.n_layers == src32->a.n_layers && !memcmp(b->final_norm, src32->final_norm, (size_t)b->a.hidden * 4);
    for (size_t i = 0; i < V && ok; i++) ok = be[i] == ac_f32_to_bf16(src32->embed[i]);
    if (src32->lm_head == src32->embed)
        ok = ok && b->lm_head == b->embed; /* tied: one matrix */
    else
        for (size_t i = 0; i < V && ok; i++)
            ok = b->lm_head != b->embed && ((const uint16_t *)b->lm_head)[i] == ac_f32_to_bf16(src32->lm_head[i]);
    for (int l = 0; ok && l < b->a.n_layers; l++)
        for (int w = AC_W_Q; ok && w <= AC_W_D; w++) {
            size_t k, k2;
            const uint16_t *p = (const uint16_t *)ac_layer_matrix(b, l, (ac_wmat)w, &k);
            const float *q = ac_layer_matrix(src32, l, (ac_wmat)w, &k2);
            ok = k == k2 && !p == !q;
            for (size_t i = 0; ok && i < k; i++) ok = p[i] == ac_f32_to_bf16(q[i]);
        }
    for (int l = 0; ok && l < b->a.n_layers; l++) {
        const ac_layer_arch *la = &b->a.layers[l];
        size_t H = b->a.hidden, Q = (size_t)la->n_heads * b->a.head_dim, KV = (size_t)la->n_kv_heads * b->a.head_dim;
        const float *v1[5] = {b->L[l].in_norm, b->L[l].post_norm, b->L[l].bq, b->L[l].bk, b->L[l].bv},
                    *v2[5] = {src32->L[l].in_norm, src32->L[l].post_norm, src32->L[l].bq, src32->L[l].bk,
                              src32->L[l].bv};
        size_t nv[5] = {H, H, Q, KV, KV};
        for (int i = 0; i < 5 && ok; i++)
            ok = v1[i] && v2[i] ? !memcmp(v1[i], v2[i], nv[i] * 4) : !v1[i] && !v2[i];
        /* mixture-of-experts layers: the router and every expert's matrices */
        size_t E = la->n_experts, ne = (size_t)la->expert_ffn * H;
        for (size_t i = 0; ok && E && i < E * H; i++)
            ok = ((const uint16_t *)b->L[l].router)[i] == ac_f32_to_bf16(src32->L[l].router[i]);
        for (size_t x = 0; ok && x < E; x++) {
            const float *m1[3] = {b->L[l].eg[x], b->L[l].eu[x], b->L[l].ed[x]},
                        *m2[3] = {src32->L[l].eg[x], src32->L[l].eu[x], src32->L[l].ed[x]};
            for (int k = 0; k < 3; k++)
                for (size_t i = 0; ok && i < ne; i++) ok = ((const uint16_t *)m1[k])[i] == ac_f32_to_bf16(m2[k][i]);
        }
    }
    return ok;
}

#endif
