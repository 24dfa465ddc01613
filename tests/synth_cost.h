/* synth_cost.h - a synthetic measured cost table for the cost-model tests
 * (test_costsearch, test_costattn): GEMMs 1 + m*n*k*1e-5 us and one
 * attention head 0.5 + q*(q+s-1)*hd*1e-6 us on log grids, elementwise ops
 * 0.5 ns. The caller owns the table (ac_cost_table_free). */
#ifndef AC_TESTS_SYNTH_COST_H
#define AC_TESTS_SYNTH_COST_H

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cost/costmodel.h"

static void synth_table(ac_cost_table *t) {
    memset(t, 0, sizeof *t);
    snprintf(t->key, sizeof t->key, "synthetic|fp32|test|v%d", AC_CT_VERSION);
    snprintf(t->device, sizeof t->device, "synthetic");
    snprintf(t->dtype, sizeof t->dtype, "fp32");
    snprintf(t->engine, sizeof t->engine, "test");
    snprintf(t->source, sizeof t->source, "measured");
    t->version = AC_CT_VERSION;
    t->mem_gib = 16;
    double g[] = {1, 4, 16, 64, 256, 1024};
    t->nm = t->nn = t->nk = 6;
    memcpy(t->gm, g, sizeof g);
    memcpy(t->gn, g, sizeof g);
    memcpy(t->gk, g, sizeof g);
    t->gemm_us = malloc(sizeof(double) * 216);
    for (int a = 0; a < 6; a++)
        for (int b = 0; b < 6; b++)
            for (int c = 0; c < 6; c++) t->gemm_us[(a * 6 + b) * 6 + c] = 1 + g[a] * g[b] * g[c] * 1e-5;
    t->nhd = 2;
    t->naq = 3;
    t->nas = 3;
    double hd[] = {32, 128}, q[] = {1, 16, 256}, s[] = {1, 64, 4096};
    memcpy(t->ahd, hd, sizeof hd);
    memcpy(t->aq, q, sizeof q);
    memcpy(t->as, s, sizeof s);
    t->attn_us = malloc(sizeof(double) * 18);
    for (int h = 0; h < 2; h++)
        for (int a = 0; a < 3; a++)
            for (int b = 0; b < 3; b++) t->attn_us[(h * 3 + a) * 3 + b] = 0.5 + q[a] * (q[a] + s[b] - 1) * hd[h] * 1e-6;
    t->elem_ns = 0.5;
}

#endif
