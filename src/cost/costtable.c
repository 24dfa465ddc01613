/*
 * costtable.c - a cost table's operator lookups: log-log interpolation
 * between the measured grid points (linear in the size beyond either end)
 * for GEMMs, one attention head and elementwise passes. Roofline tables
 * are answered by costroofline.c. See costmodel.h.
 */
#include <assert.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "cost_int.h"
#include "cost/costmodel.h"

void ac_cost_table_free(ac_cost_table *t) {
    free(t->gemm_us);
    free(t->gemm_warm_us);
    free(t->attn_us);
    free(t->expert_us);
    free(t->expert_warm_us);
    t->gemm_us = t->gemm_warm_us = t->attn_us = t->expert_us = t->expert_warm_us = NULL;
    t->nre = 0;
}

/* ---------------------------------------------------------------- lookup */

/* Position of x on a log grid: cell index and fraction; *scale handles
 * points outside the grid (linear in x beyond either end). */
static void locate(const double *g, int n, double x, int *i, double *u, double *scale) {
    assert(n >= 1 && g[0] > 0);
    *scale = 1;
    if (n == 1) {
        *i = 0;
        *u = 0;
        *scale = x / g[0];
        return;
    }
    if (x <= g[0]) {
        *i = 0;
        *u = 0;
        *scale = x / g[0];
        return;
    }
    if (x >= g[n - 1]) {
        *i = n - 2;
        *u = 1;
        *scale = x / g[n - 1];
        return;
    }
    int k = 0;
    while (k < n - 2 && x > g[k + 1]) k++;
    *i = k;
    *u = (log(x) - log(g[k])) / (log(g[k + 1]) - log(g[k]));
}

static double lerp(double a, double b, double u) { return a + (b - a) * u; }

/* A grid of ni x nj x nk points (row-major) at (x, y, z): log-log
 * trilinear between the points, linear in each size beyond the grid. */
static double grid3(const double *gi, int ni, const double *gj, int nj, const double *gk, int nk, const double *grid,
                    double x, double y, double z) {
    int i, j, k;
    double ui, uj, uk, si, sj, sk;
    locate(gi, ni, x, &i, &ui, &si);
    locate(gj, nj, y, &j, &uj, &sj);
    locate(gk, nk, z, &k, &uk, &sk);
    /* a grid of one point on an axis: that axis's second index is its first */
    int i1 = ni > 1 ? i + 1 : i, j1 = nj > 1 ? j + 1 : j, k1 = nk > 1 ? k + 1 : k;
#define G(a, b, c) log(grid[((size_t)(a)*nj + (b)) * nk + (c)])
    double c00 = lerp(G(i, j, k), G(i, j, k1), uk), c01 = lerp(G(i, j1, k), G(i, j1, k1), uk);
    double c10 = lerp(G(i1, j, k), G(i1, j, k1), uk), c11 = lerp(G(i1, j1, k), G(i1, j1, k1), uk);
#undef G
    double v = exp(lerp(lerp(c00, c01, uj), lerp(c10, c11, uj), ui));
    return v * si * sj * sk;
}

double ac_cost_gemm_lookup(const ac_cost_table *t, double m, double n, double k, int warm) {
    if (m <= 0 || n <= 0 || k <= 0) return 0;
    if (t->roofline) return ac_roofline_gemm_us(t, m, n, k);
    const double *grid = warm && t->gemm_warm_us ? t->gemm_warm_us : t->gemm_us;
    assert(grid); /* a measured table always has its cold grid */
    return grid3(t->gm, t->nm, t->gn, t->nn, t->gk, t->nk, grid, m, n, k);
}

double ac_cost_expert_us(const ac_cost_table *t, double m, double fe, double h, int warm) {
    if (m <= 0 || fe <= 0 || h <= 0 || t->nre <= 0 || !t->expert_us) return 0;
    const double *grid = warm && t->expert_warm_us ? t->expert_warm_us : t->expert_us;
    return grid3(t->erows, t->nre, t->effn, t->nfe, t->ehid, t->nhe, grid, m, fe, h);
}

double ac_cost_attn_us(const ac_cost_table *t, double heads, double kv_heads, double batch, double nq, double s,
                       int head_dim) {
    if (heads <= 0 || batch <= 0 || nq <= 0) return 0;
    if (s < nq) s = nq;
    if (t->roofline) return ac_roofline_attn_us(t, heads, kv_heads, batch, nq, s, head_dim);
    int iq, is, ih;
    double uq, us, sq, ss, uh, sh;
    locate(t->aq, t->naq, nq, &iq, &uq, &sq);
    locate(t->as, t->nas, s - nq + 1, &is, &us, &ss);
    /* head_dim: linear (not log) between measured head dims; softmax work
     * does not shrink with head_dim, so scaling by hd alone is wrong */
    if (t->nhd == 1) {
        ih = 0;
        uh = 0;
        sh = (double)head_dim / t->ahd[0];
    } else {
        ih = 0;
        while (ih < t->nhd - 2 && head_dim > t->ahd[ih + 1]) ih++;
        uh = (head_dim - t->ahd[ih]) / (t->ahd[ih + 1] - t->ahd[ih]);
        sh = 1;
        if (uh < 0) {
            sh = (double)head_dim / t->ahd[0];
            uh = 0;
        }
    }
#define A(h, a, b) log(t->attn_us[((size_t)(h)*t->naq + (a)) * t->nas + (b)])
#define AT(h) exp(lerp(lerp(A(h, iq, is), A(h, iq, is + 1), us), lerp(A(h, iq + 1, is), A(h, iq + 1, is + 1), us), uq))
    double v = t->nhd == 1 ? AT(0) : AT(ih) + (AT(ih + 1) - AT(ih)) * uh;
#undef AT
#undef A
    v *= sh;
    if (sq > 1) v *= sq; /* more queries than the grid: linear */
    if (ss > 1) v *= ss;
    if (sq < 1) v *= sq;
    return v * heads * batch;
}

double ac_cost_attn_kv_us(const ac_cost_table *t, double heads, double kv_heads, double batch, double nq, double s,
                          int head_dim, int kv_bytes) {
    if (heads <= 0 || batch <= 0 || nq <= 0) return 0;
    if (s < nq) s = nq;
    if (t->roofline) return ac_roofline_attn_kv_us(t, heads, kv_heads, batch, nq, s, head_dim, kv_bytes);
    return ac_cost_attn_us(t, heads, kv_heads, batch, nq, s, head_dim);
}

double ac_cost_elem_us(const ac_cost_table *t, double elements, int act_bytes) {
    if (t->roofline) return ac_roofline_elem_us(t, elements, act_bytes);
    return elements * t->elem_ns * 1e-3;
}

double ac_cost_gemm_us(const ac_cost_table *t, double m, double n, double k) {
    return ac_cost_gemm_lookup(t, m, n, k, 0);
}
