/* ssm_curves.c - see ssm_curves_int.h. */
#include "ssm_curves_int.h"

#include <math.h>
#include <stdlib.h>

int ac_ssm_engine_curves(const ac_arch *a, ac_pruned_increase_fn inc, void *ud, ac_importance *imp, ac_err *e) {
    int L = a->n_layers, G = a->ssm_groups > 0 ? a->ssm_groups : 1;
    if (!imp->ssm_head_order) return ac_errf(e, "Mamba-head curves: the heads are not ranked");
    free(imp->ssm_sens);
    imp->ssm_sens = calloc(L, sizeof *imp->ssm_sens);
    if (!imp->ssm_sens) return ac_errf(e, "out of memory");
    for (int l = 0; l < L; l++) {
        int nh = a->layers[l].ssm_heads, hpg = nh / G;
        double *c = imp->ssm_sens[l];
        for (int p = 1; nh && p < AC_SENS_POINTS; p++) {
            ac_arch t;
            if (ac_arch_copy(&t, a, e)) goto fail;
            t.layers[l].ssm_heads = nh - G * (int)lround((double)p / (AC_SENS_POINTS - 1) * hpg);
            int rc = t.layers[l].ssm_heads < nh ? inc(ud, &t, &c[p], e) : 0;
            ac_arch_free(&t);
            if (rc) goto fail;
            if (c[p] < c[p - 1]) c[p] = c[p - 1]; /* removing heads never helps, in the model */
        }
        c[0] = 0;
    }
    return 0;
fail:
    free(imp->ssm_sens);
    imp->ssm_sens = NULL;
    return -1;
}
