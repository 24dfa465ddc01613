/*
 * surrogate_hybrid.c - the surrogate search (search.method surrogate) on a
 * hybrid Mamba-Transformer (nemotron_h) and the predicted loss of a hybrid
 * structure from the calibration's loss curves (search.h, "Hybrid
 * Mamba-Transformer models"). The moves and the repair are the gate
 * search's per-type discretisation (dnas_hybrid.c), priced here by the
 * curves instead of gate mass.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "search/constraints.h"
#include "dnas_int.h"
#include "search_int.h"

/* An MoE layer keeping `cap` expert channels of capacity (kept experts x their width x the kept latent share, plus
 * the shared expert's width): the experts curve (ffn_sens, over the E - top_k experts that can go) at the share
 * r = (E Fe + S - cap) / ((E - top_k) Fe) of that removable capacity removed; past r = 1 (fewer than top_k experts'
 * worth, down to the layer removed) the curve's last point r1 times r (no calibration point removes more). */
static double moe_loss(const ac_importance *imp, const ac_arch *b, int l, double cap) {
    const ac_layer_arch *bl = &b->layers[l];
    int E = bl->n_experts, k = b->top_k, Fe = bl->expert_ffn;
    if (E <= k || Fe <= 0) return 0;
    double r = ((double)E * Fe + b->shared_ffn - cap) / ((double)(E - k) * Fe);
    if (r <= 1) return ac_sens_experts(imp, b, l, E - (r > 0 ? r : 0) * (E - k));
    return imp->ffn_sens[l][AC_SENS_POINTS - 1] * r;
}

static double ratio(int a, int b) { return b > 0 ? (double)a / b : 1; }

double ac_search_hyb_pred_loss(const ac_search_problem *p, const ac_arch *a) {
    const ac_arch *b = p->base;
    const ac_importance *imp = p->imp;
    if (!imp || !imp->attn_sens || !imp->ffn_sens) return 0;
    double q = 0;
    for (int l = 0; l < b->n_layers; l++) {
        const ac_layer_arch *bl = &b->layers[l], *al = &a->layers[l];
        if (bl->ssm_heads) /* heads and head dims: the share of the layer's x channels kept, on its head curve */
            q += ac_sens_ssm(imp, l, 1 - ratio(al->ssm_heads, bl->ssm_heads) * ratio(a->ssm_head_dim, b->ssm_head_dim));
        else if (bl->n_heads)
            q += ac_sens_attn(imp, l, 1 - ratio(al->n_kv_heads, bl->n_kv_heads));
        else if (bl->n_experts) /* experts, expert width, latent and shared width as expert capacity */
            q += moe_loss(imp, b, l,
                          al->n_experts ? (double)al->n_experts * al->expert_ffn * ratio(a->moe_latent, b->moe_latent) +
                                              a->shared_ffn
                                        : 0);
        else if (bl->ffn)
            q += ac_sens_ffn(imp, l, 1 - fmin(al->ffn, bl->ffn) / bl->ffn);
    }
    return q + ac_sens_hidden(imp, 1 - ratio(a->hidden, b->hidden));
}

int ac_search_hyb_surrogate(const ac_search_problem *p, ac_search_result *r, ac_err *e) {
    memset(r, 0, sizeof *r);
    const ac_arch *b = p->base;
    if (!p->imp || !p->imp->ssm_sens)
        return ac_errf(e, "search.method surrogate: the hybrid (nemotron_h) model's calibration measured no loss "
                          "curves (every calibration method measures them, on the CPU and on a CUDA target; a calibration "
                          "checkpoint of an older build may hold none: docs/hybrid.md)");
    int nc = 0;
    for (const ac_constraint *t = ac_constraint_table(); t < ac_constraint_table() + AC_NCONSTRAINTS; t++)
        nc += ac_constraint_limit(t, &p->limits) > 0;
    if (!nc) return ac_errf(e, "search: no constraints given");
    ac_dnas_gates g;
    if (ac_dnas_gates_init(&g, b, &p->opts, e)) return -1;
    ac_arch t;
    if (ac_arch_copy(&t, b, e)) {
        ac_dnas_gates_free(&g);
        return -1;
    }
    /* each type's layers removed in the order of their curves' loss with the layer gone (least first) */
    json_t *rl = json_array();
    for (int l = 0; l < b->n_layers; l++) {
        ac_layer_arch keep = t.layers[l];
        t.layers[l] = (ac_layer_arch){0};
        double loss = ac_search_hyb_pred_loss(p, &t);
        t.layers[l] = keep;
        g.la[g.attn_off + l] = loss; /* (the gate search removes the lowest log_alpha first) */
        json_array_append_new(rl, json_real(loss));
    }
    ac_arch_free(&t);
    if (ac_arch_copy(&r->arch, b, e)) {
        json_decref(rl);
        ac_dnas_gates_free(&g);
        return -1;
    }
    ac_dnas_hyb_greedy_curves(&g, p, r);
    ac_dnas_gates_free(&g);
    r->pred_loss = ac_search_hyb_pred_loss(p, &r->arch);
    r->detail = json_pack("{s:s,s:o}", "hybrid", "per-type greedy priced by the loss curves", "layer_removal_loss", rl);
    if (p->emit) {
        json_t *ev = json_pack("{s:s,s:i,s:i,s:f,s:o,s:o}", "phase", "autocompress", "step", 1, "steps", 1,
                               "quality_loss", r->pred_loss, "metrics", ac_constraints_report(&p->limits, &r->cost),
                               "predicted", ac_cost_to_json(&r->cost));
        p->emit(p->ud, ev);
        json_decref(ev);
    }
    return 0;
}
