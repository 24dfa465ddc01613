/*
 * imp_compare.h - for the tests: two calibrations (ac_importance) of the
 * same architecture compared value by value.
 */
#ifndef AC_IMP_COMPARE_H
#define AC_IMP_COMPARE_H

#include <math.h>
#include <string.h>

#include "search/importance.h"
#include "format/model.h"

/* How many of a's curve points (attention, FFN, KV merges, hidden) differ
 * from b's by more than abs_tol + rel_tol x |b|, plus the layers whose KV
 * group or FFN channel orders differ; *n: how many were compared. */
static inline int imp_differences(const ac_importance *a, const ac_importance *b, const ac_arch *arch, double abs_tol,
                                  double rel_tol, int *n) {
#define IMP_FAR(x, y) (!(fabs((x) - (y)) <= abs_tol + rel_tol * fabs(y))) /* NaN: far */
    int bad = 0;
    *n = 0;
    for (int l = 0; l < arch->n_layers; l++) {
        const ac_layer_arch *la = &arch->layers[l];
        bad += la->n_heads && memcmp(a->kv_order[l], b->kv_order[l], sizeof(int) * la->n_kv_heads);
        bad += la->ffn && memcmp(a->ffn_order[l], b->ffn_order[l], sizeof(int) * la->ffn);
        for (int p = 1; p < AC_SENS_POINTS; p++, *n += 2)
            bad += IMP_FAR(a->attn_sens[l][p], b->attn_sens[l][p]) + IMP_FAR(a->ffn_sens[l][p], b->ffn_sens[l][p]);
        bad += a->merge_n[l] != b->merge_n[l];
        for (int k = 0; k < a->merge_n[l] && k < b->merge_n[l]; k++, (*n)++)
            bad += IMP_FAR(a->merge_sens[l][k], b->merge_sens[l][k]);
    }
    for (int i = 0; i < 4; i++, (*n)++) bad += IMP_FAR(a->hid_sens[i], b->hid_sens[i]);
#undef IMP_FAR
    return bad;
}

#endif
