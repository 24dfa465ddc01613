/*
 * test_dnas_hybrid.c - the differentiable search on hybrid Mamba-Transformer
 * models (nemotron_h; issue 31, item 3), on the random-init fixtures
 * nemotronh_moe_bf16 (MEM*E: Mamba-2 with 2 groups of 3 heads, MoE of 6
 * experts top-2 through the sigmoid router with its correction bias,
 * renormalised and scaled by 2.5, attention) and nemotronh_moe_nonorm_f32
 * (E*E: 5 experts, top-3, no renormalisation).
 *
 * 1. Expert gates in {0,1} through the sigmoid router are the pruned
 *    model, bit for bit: the trainer with some expert gates at 0 gives the
 *    logits of ac_prune's model without those experts (their router rows
 *    and correction bias gone: the choice among the kept ones by s + bias,
 *    the weights s renormalised over the chosen). Depth gates at 0 (a
 *    Mamba, an MoE and the attention layer) are those layers removed.
 *    Width gates in {0,1} (each expert's channels, the shared expert's
 *    channels, Mamba heads and head dims inside the gated norm, LatentMoE's latent
 *    channels) are the model with the narrower moe_intermediate_size,
 *    moe_shared_expert_intermediate_size, mamba_head_dim and
 *    moe_latent_size that ac_prune makes.
 * 2. The trainer's gate gradients as the search reads them (dnas.c's
 *    layout: Mamba head slots summed over the groups, one depth gate per
 *    layer, KV groups, experts, expert-width, shared-width and (on
 *    nemotronh_latent_bf16) latent channel groups, Mamba head dims) equal
 *    central differences of the KD loss in the gate values, and every gate
 *    moves the loss.
 * 3. The limits' gradient of the hybrid expected cost (dnas_hybrid.c)
 *    equals central differences of the expected parameter count in every
 *    log_alpha (hidden gates included).
 * 4. ac_search_dnas (150 steps from Minitron's structure, as a job starts
 *    it) under a parameter limit that three experts per MoE layer meet
 *    reaches a feasible structure with one width per layer type (one
 *    expert count below the base's, at least top_k; the same Mamba heads in
 *    every group), its held-out KL to the unpruned model is below its
 *    start's (Minitron's structure pruned by Minitron's importance),
 *    and among every choice of that many experts in each MoE layer (on the
 *    structure it picked) the gates' choice is in the best fifth. Mutation
 *    check (as test_dnas_moe): with ac_dnas_opts.zero_task_grad the gates
 *    see only the limit's cost gradient and the claim fails (its gates
 *    stay at their start, Minitron's structure: no better than the start).
 * 5. Minitron's expert width on the hybrid (moe_ffn_hidden_size): needed
 *    to meet the limit, one width for every expert, each expert sliced to
 *    its own best channels by the expert-width score.
 * 6. The frozen trainer on a BF16 checkpoint held resident (each layer's
 *    matrices converted into the fp32 scratch as it is reached, the routed
 *    experts one expert at a time; issue 31, item 7) equals the trainer on
 *    its fp32 load bit for bit: logits, KD loss and every gate's gradient
 *    (Mamba heads, attention heads, MLP channels, experts, expert channels,
 *    hidden channels, depth gates) with every gate between 0.3 and 0.9, on
 *    nemotronh_bf16 (Mamba, MLP and attention layers), nemotronh_moe_bf16
 *    (Mamba, MoE with the sigmoid router and a shared expert, attention)
 *    and nemotronh_latent_bf16 (LatentMoE's projections).
 * 7. The gate search's training on the resident checkpoint (no fp32 copy of
 *    the model any more) equals the training on the fp32 load bit for bit:
 *    the log_alphas after 6 steps and the last step's task gradient.
 * 8. Minitron's arm on the hybrid scores minitron.top_k candidates.
 * 9. The gate training on the CUDA plugin's trainer (what a job with a
 *    local cuda target runs; tests/run_all.sh runs it on the CPU emulator
 *    with AC_DNAS_CUDA_ONLY) against the CPU's, on nemotronh_latent_bf16
 *    with every hybrid axis gated (depth, KV groups, experts, expert,
 *    shared-expert and latent channel groups, Mamba head slots and head
 *    dims, hidden channels): the first step's task gradient within 1e-3
 *    (relative) and the log_alphas after 3 steps within 1e-2, test_dnas_moe's
 *    tolerances.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "expert_search.h"
#include "core/dtype.h"
#include "cost/device.h"
#include "runtime/cuda_plugin.h"
#include "runtime/kernels_cpu.h"
#include "runtime/train.h"
#include "search/dnas.h"
#include "search/minitron.h"
#include "search/slice.h"

static void gates_equal_pruned(const char *name) {
    ac_model m, pm;
    ac_err e;
    if (es_load(name, &m)) SKIP("no fixture %s (make fixtures)", name);
    int B = 2, T = 24, L = m.a.n_layers, *tok = es_rand_ids((size_t)B * T, m.a.vocab, 11);
    float *gates[16] = {0};
    orders_t o;
    es_orders_init(&o, &m.a);
    ac_arch ta;
    ac_arch_copy(&ta, &m.a, &e);
    for (int l = 0; l < L; l++) { /* each MoE layer loses one expert (a different one per layer), or two */
        int E = m.a.layers[l].n_experts;
        if (!E) continue;
        unsigned mask = (1u << E) - 1;
        mask &= ~(1u << ((l + 1) % E));
        if (E - m.a.top_k >= 2) mask &= ~(1u << ((l + 3) % E));
        gates[l] = malloc(sizeof(float) * E);
        for (int x = 0; x < E; x++) gates[l][x] = (float)(mask >> x & 1);
        es_order_from_mask(o.ex[l], E, mask);
        ta.layers[l].n_experts = __builtin_popcount(mask);
    }
    float *full = es_logits(&m, tok, B, T, NULL), *gated = es_logits(&m, tok, B, T, (const float *const *)gates);
    CHECK(ac_prune(&m, &ta, &o.imp, &pm, &e) == 0, "prune: %s", e.msg);
    float *pruned = es_logits(&pm, tok, B, T, NULL);
    double md = 0, mr = 0, moved = 0;
    size_t n = (size_t)B * T * m.a.vocab, same = 0;
    for (size_t i = 0; full && gated && pruned && i < n; i++) {
        md = fmax(md, fabs(gated[i] - pruned[i]));
        same += gated[i] == pruned[i];
        mr = fmax(mr, fabs(pruned[i]));
        moved = fmax(moved, fabs(full[i] - pruned[i]));
    }
    printf("   %s: gated vs pruned max|diff| %.3g of max|logit| %.3g, %zu of %zu bit-identical (removing the experts "
           "moved them %.3g)\n",
           name, md, mr, same, n, moved);
    CHECK(md <= 2e-6 * mr, "%s: expert gates at 0 are not the pruned model (%.3g)", name, md);
    CHECK(moved > 1e3 * md && moved > 1e-3 * mr, "%s: removing the experts changed nothing measurable (%.3g)", name,
          moved);
    free(full), free(gated), free(pruned), free(tok);
    for (int l = 0; l < L; l++) free(gates[l]);
    es_orders_free(&o);
    ac_arch_free(&ta);
    ac_model_free(&pm);
    ac_model_free(&m);
}

/* Depth gates at 0 (one layer of each type but the first Mamba one) are the model with those layers removed. */
static void test_depth_gates_equal_removed_layers(void) {
    ac_model m, pm;
    ac_err e;
    if (es_load("nemotronh_moe_bf16", &m)) SKIP("no fixture nemotronh_moe_bf16 (make fixtures)");
    int B = 2, T = 24, L = m.a.n_layers, *tok = es_rand_ids((size_t)B * T, m.a.vocab, 12), seen[4] = {0};
    orders_t o;
    es_orders_init(&o, &m.a);
    ac_arch ta;
    ac_arch_copy(&ta, &m.a, &e);
    ac_trainer t;
    CHECK(ac_trainer_init_frozen(&t, &m, B, T, &e) == 0, "%s", e.msg);
    for (int l = 0; l < L; l++) { /* M E M * E: layers 1 (MoE), 2 (Mamba) and 3 (attention) go */
        const ac_layer_arch *a = &m.a.layers[l];
        int ty = a->ssm_heads ? 0 : a->n_heads ? 1 : a->n_experts ? 2 : 3;
        if (l == 0 || seen[ty]++) continue;
        t.gate.attn[l] = t.gate.mlp[l] = 0;
        ta.layers[l] = (ac_layer_arch){0};
    }
    float *gated = NULL, *pruned = NULL;
    if (ac_train_forward(&t, tok, B, T, &e) == 0 && (gated = malloc(sizeof(float) * B * T * m.a.vocab)))
        memcpy(gated, t.logits, sizeof(float) * B * T * m.a.vocab);
    CHECK(ac_prune(&m, &ta, &o.imp, &pm, &e) == 0, "prune: %s", e.msg);
    pruned = es_logits(&pm, tok, B, T, NULL);
    double md = 0, mr = 0;
    for (size_t i = 0; gated && pruned && i < (size_t)B * T * m.a.vocab; i++)
        md = fmax(md, fabs(gated[i] - pruned[i])), mr = fmax(mr, fabs(pruned[i]));
    printf("   depth gates at 0 vs layers 1-3 removed: max|diff| %.3g of max|logit| %.3g\n", md, mr);
    CHECK(gated && pruned && md <= 2e-6 * mr, "depth gates at 0 are not the layers removed (%.3g)", md);
    free(gated), free(pruned), free(tok);
    ac_trainer_free(&t);
    es_orders_free(&o);
    ac_arch_free(&ta);
    ac_model_free(&pm);
    ac_model_free(&m);
}

/* Width gates in {0,1} are the narrower model ac_prune makes: Mamba head gates (one head of each group off, a
 * different one per layer; inside the gated norm, whose group statistic then runs over the kept heads alone),
 * expert-channel gates (each expert of an MoE layer a
 * different set of channels off, the same count: one moe_intermediate_size), shared-expert channel gates (a
 * different set per MoE layer), LatentMoE's latent gates (a different set per layer) and Mamba head-dim gates (a different set of dims per Mamba layer, the same in every
 * head: one mamba_head_dim; inside the gated norm, whose group statistic then runs over the kept dims alone), with
 * the orders pointing ac_prune at the kept units. */
static void width_gates_equal_pruned(const char *name) {
    ac_model m, pm;
    ac_err e;
    memset(&pm, 0, sizeof pm);
    if (es_load(name, &m)) SKIP("no fixture %s (make fixtures)", name);
    int B = 2, T = 24, L = m.a.n_layers, P = m.a.ssm_head_dim, Fs = m.a.shared_ffn, Lt = m.a.moe_latent, cut_e = 5,
        cut_s = 7, cut_p = 2, cut_l = Lt ? 5 : 0;
    int *tok = es_rand_ids((size_t)B * T, m.a.vocab, 13), *sh[16] = {0}, *pd[16] = {0}, *lo[16] = {0}, *ho[16] = {0};
    int G = m.a.ssm_groups;
    orders_t o;
    es_orders_init(&o, &m.a);
    o.imp.sh_order = sh, o.imp.ssm_dim_order = pd, o.imp.lat_order = lo, o.imp.ssm_head_order = ho;
    ac_arch ta;
    ac_arch_copy(&ta, &m.a, &e);
    ta.shared_ffn = Fs - cut_s, ta.ssm_head_dim = P - cut_p, ta.moe_latent = Lt - cut_l;
    ac_trainer t;
    CHECK(ac_trainer_init_frozen(&t, &m, B, T, &e) == 0, "%s", e.msg);
    /* off: units (l, x, c) with (c + 3 l + x) % n < cut, the order the kept ones first */
    for (int l = 0; l < L && l < 16; l++) {
        const ac_layer_arch *a = &m.a.layers[l];
        if (a->n_experts) {
            int Fe = a->expert_ffn;
            ta.layers[l].expert_ffn = Fe - cut_e;
            for (int x = 0; x < a->n_experts; x++)
                for (int c = 0, k = 0, r = Fe - cut_e; c < Fe; c++) {
                    int off = (c + 3 * l + x) % Fe < cut_e;
                    t.gate.echan[l][x * Fe + c] = off ? 0.0f : 1.0f;
                    o.ch[l][x * Fe + (off ? r++ : k++)] = c;
                }
            sh[l] = malloc(sizeof(int) * Fs);
            for (int c = 0, k = 0, r = Fs - cut_s; c < Fs; c++) {
                int off = (c + 3 * l) % Fs < cut_s;
                t.gate.shared[l][c] = off ? 0.0f : 1.0f;
                sh[l][off ? r++ : k++] = c;
            }
            lo[l] = Lt ? malloc(sizeof(int) * Lt) : NULL;
            for (int c = 0, k = 0, r = Lt - cut_l; c < Lt; c++) {
                int off = (c + 5 * l) % Lt < cut_l;
                t.gate.latent[l][c] = off ? 0.0f : 1.0f;
                lo[l][off ? r++ : k++] = c;
            }
        }
        if (a->ssm_heads) { /* one head of each group off (its last but l), and cut_p dims */
            int nh = a->ssm_heads, hpg = nh / G;
            ta.layers[l].ssm_heads = nh - G;
            ho[l] = malloc(sizeof(int) * nh);
            for (int gr = 0; gr < G; gr++)
                for (int j = 0, k = 0; j < hpg; j++) {
                    int h = gr * hpg + j, off = j == (hpg - 1 + l) % hpg;
                    t.gate.ssm[l][h] = off ? 0.0f : 1.0f;
                    ho[l][gr * hpg + (off ? hpg - 1 : k++)] = h;
                }
            pd[l] = malloc(sizeof(int) * P);
            for (int d = 0, k = 0, r = P - cut_p; d < P; d++) {
                int off = (d + l) % P < cut_p;
                t.gate.ssm_dim[l][d] = off ? 0.0f : 1.0f;
                pd[l][off ? r++ : k++] = d;
            }
        }
    }
    float *full = es_logits(&m, tok, B, T, NULL), *gated = NULL, *pruned = NULL;
    if (ac_train_forward(&t, tok, B, T, &e) == 0 && (gated = malloc(sizeof(float) * B * T * m.a.vocab)))
        memcpy(gated, t.logits, sizeof(float) * B * T * m.a.vocab);
    CHECK(ac_prune(&m, &ta, &o.imp, &pm, &e) == 0, "prune: %s", e.msg);
    if (pm.L) pruned = es_logits(&pm, tok, B, T, NULL);
    double md = 0, mr = 0, moved = 0;
    for (size_t i = 0; full && gated && pruned && i < (size_t)B * T * m.a.vocab; i++) {
        md = fmax(md, fabs(gated[i] - pruned[i]));
        mr = fmax(mr, fabs(pruned[i]));
        moved = fmax(moved, fabs(full[i] - pruned[i]));
    }
    printf("   %s: Mamba heads %d -> %d, head dim %d -> %d, expert width %d -> %d, shared %d -> %d, latent %d -> %d: "
           "gated vs pruned max|diff| %.3g of max|logit| %.3g (the cut moved them %.3g)\n",
           name, m.a.layers[0].ssm_heads, ta.layers[0].ssm_heads, P, ta.ssm_head_dim, m.a.layers[1].expert_ffn,
           ta.layers[1].expert_ffn, Fs, ta.shared_ffn, Lt, ta.moe_latent, md, mr, moved);
    CHECK(gated && pruned && md <= 2e-6 * mr, "%s: width gates at 0 are not the pruned model (%.3g)", name, md);
    CHECK(moved > 1e3 * md && moved > 1e-3 * mr, "%s: the cut changed nothing measurable (%.3g)", name, moved);
    free(full), free(gated), free(pruned), free(tok);
    for (int l = 0; l < 16; l++) free(sh[l]), free(pd[l]), free(lo[l]), free(ho[l]);
    o.imp.sh_order = NULL, o.imp.ssm_dim_order = NULL, o.imp.lat_order = NULL, o.imp.ssm_head_order = NULL;
    ac_trainer_free(&t);
    es_orders_free(&o);
    ac_arch_free(&ta);
    if (pm.L) ac_model_free(&pm);
    ac_model_free(&m);
}

static void test_width_gates_equal_pruned(void) { width_gates_equal_pruned("nemotronh_moe_bf16"); }
static void test_width_gates_equal_pruned_latent(void) { width_gates_equal_pruned("nemotronh_latent_bf16"); }

static void test_sigmoid_expert_gates_equal_pruned(void) { gates_equal_pruned("nemotronh_moe_bf16"); }
static void test_sigmoid_expert_gates_equal_pruned_nonorm(void) { gates_equal_pruned("nemotronh_moe_nonorm_f32"); }

/* ---- the search's problem on nemotronh_moe_bf16 ---- */

static ac_model M;
static ac_importance IMP;
static int *IDS, *HIDS, HAVE;
static size_t NIDS, NH;
#define HB 8
#define HT 32

static int setup(void) {
    if (HAVE) return HAVE > 0;
    NH = HB * HT;
    HAVE = es_setup("nemotronh_moe_bf16", &M, &IMP, &IDS, &NIDS, &HIDS, NH) ? 1 : -1;
    return HAVE > 0;
}

static void make_problem(problem_t *P, int keep) { es_make_problem(P, &M, &IMP, IDS, NIDS, keep, 10, 8); }

/* Random log_alphas in [-2, 3). */
static void random_la(ac_dnas_gates *g, unsigned long long s) {
    for (int i = 0; i < g->np; i++) {
        s = s * 6364136223846793005ULL + 1442695040888963407ULL;
        g->la[i] = -2 + 5.0 * (s >> 11) / 9007199254740992.0;
    }
}

/* KD loss of the gated model (m, its importance imp) at gate values z against the teacher logits (the trainer's
 * forward), and, with dz, d loss / d z in dnas.c's layout. */
static double kd_loss(ac_trainer *t, const ac_dnas_gates *g, const double *z, const int *tok, int B, int T,
                      const float *teacher, const ac_importance *imp, double *dz) {
    ac_err e;
    ac_dnas_set_gates(g, z, &t->gate, &t->m->a, imp);
    ac_train_zero_grad(t);
    if (ac_train_forward(t, tok, B, T, &e)) {
        CHECK(0, "%s", e.msg);
        return NAN;
    }
    double loss = ac_train_loss(t, NULL, teacher, 1.0f, 1.0f, 1.0f, NULL, NULL);
    if (dz) {
        ac_train_backward(t);
        ac_dnas_gate_grads(g, t, imp, dz);
    }
    return loss;
}

/* The gate gradients of model m (its importance imp, the search options so) against central differences of the KD
 * loss, by kind of gate; every kind present checked, at least `want` kinds. */
static void check_gate_grads(ac_model *m, const ac_importance *imp, const ac_search_opts *so, const char *name,
                             int want) {
    ac_err e;
    ac_dnas_gates g;
    CHECK(ac_dnas_gates_init(&g, &m->a, so, &e) == 0, "%s", e.msg);
    int B = 2, T = 16, *tok = es_rand_ids((size_t)B * T, m->a.vocab, 21);
    float *teacher = es_logits(m, tok, B, T, NULL);
    ac_trainer t;
    CHECK(ac_trainer_init_frozen(&t, m, B, T, &e) == 0, "%s", e.msg);
    double *z = malloc(sizeof(double) * g.np), *dz = malloc(sizeof(double) * g.np);
    unsigned long long s = 7;
    for (int i = 0; i < g.np; i++) { /* gates in (0.3, 0.9): no expert's choice flips on a small step */
        s = s * 6364136223846793005ULL + 1442695040888963407ULL;
        z[i] = 0.3 + 0.6 * (s >> 11) / 9007199254740992.0;
    }
    kd_loss(&t, &g, z, tok, B, T, teacher, imp, dz);
    enum { NK = 8 };
    const char *kind[NK] = {"Mamba head slot", "depth",        "KV group",       "expert",
                            "expert width",    "shared width", "Mamba head dim", "latent width"};
    int nk[NK] = {0}, nz[NK] = {0}, kinds = 0;
    double worst[NK] = {0}, h = 1e-3;
    for (int i = 0; i < g.np; i++) {
        int k = -1;
        for (int l = 0; l < g.L; l++) {
            if (i >= g.sg_off[l] && i < g.sg_off[l] + g.nsg[l]) k = 0;
            if (i == g.attn_off + l) k = 1;
            if (i >= g.kv_off[l] && i < g.kv_off[l] + g.nkv[l]) k = 2;
            if (i >= g.ex_off[l] && i < g.ex_off[l] + g.nex[l]) k = 3;
            if (i >= g.xg_off[l] && i < g.xg_off[l] + g.nxg[l]) k = 4;
            if (i >= g.shg_off[l] && i < g.shg_off[l] + g.nshg[l]) k = 5;
            if (i >= g.pd_off[l] && i < g.pd_off[l] + g.npd[l]) k = 6;
            if (i >= g.ltg_off[l] && i < g.ltg_off[l] + g.nltg[l]) k = 7;
        }
        if (k < 0) continue;
        double o = z[i];
        z[i] = o + h;
        double a = kd_loss(&t, &g, z, tok, B, T, teacher, imp, NULL);
        z[i] = o - h;
        double b = kd_loss(&t, &g, z, tok, B, T, teacher, imp, NULL);
        z[i] = o;
        double fd = (a - b) / (2 * h), err = fabs(fd - dz[i]) / fmax(1e-3, fabs(fd));
        worst[k] = fmax(worst[k], err);
        nk[k]++;
        nz[k] += fabs(fd) > 1e-4; /* the gate moves the loss at all */
    }
    for (int k = 0; k < NK; k++) {
        if (!nk[k]) continue;
        kinds++;
        printf("   %s: %d %s gates (%d moving the loss): worst |grad - fd| / |fd| %.2e\n", name, nk[k], kind[k], nz[k],
               worst[k]);
        /* (an expert no row chose, a unit whose effect is below the step's resolution: most move it) */
        CHECK(nz[k] > 0 && 2 * nz[k] >= nk[k], "%s gates: %d of %d move the loss", kind[k], nz[k], nk[k]);
        CHECK(worst[k] <= 2e-2, "%s gates' gradient off by %.3g", kind[k], worst[k]);
    }
    CHECK(kinds >= want, "%s: %d kinds of gates, not %d", name, kinds, want);
    ac_trainer_free(&t);
    free(z), free(dz), free(tok), free(teacher);
    ac_dnas_gates_free(&g);
}

static void test_gate_gradients_in_dnas_layout(void) {
    if (!setup()) SKIP("no fixture nemotronh_moe_bf16 (make fixtures)");
    problem_t P;
    make_problem(&P, 3);
    P.p.opts.prune_expert_ffn = 1;
    check_gate_grads(&M, &IMP, &P.p.opts, "nemotronh_moe_bf16", 7);
}

/* LatentMoE's latent gates (and the rest) on nemotronh_latent_bf16, with identity orders. */
static void test_latent_gate_gradients(void) {
    ac_model m;
    if (es_load("nemotronh_latent_bf16", &m)) SKIP("no fixture nemotronh_latent_bf16 (make fixtures)");
    orders_t o;
    es_orders_init(&o, &m.a);
    ac_search_opts so;
    memset(&so, 0, sizeof so);
    so.prune_expert_ffn = 1, so.prune_experts = 1, so.ffn_multiple = 8, so.hidden_multiple = 8;
    so.target = AC_EXPORT_GGUF; /* KV groups gated */
    check_gate_grads(&m, &o.imp, &so, "nemotronh_latent_bf16", 8);
    es_orders_free(&o);
    ac_model_free(&m);
}

static void test_hybrid_cost_gradient(void) {
    if (!setup()) SKIP("no fixture nemotronh_moe_bf16 (make fixtures)");
    problem_t P;
    ac_err e;
    make_problem(&P, 3);
    P.p.opts.prune_hidden = 1;
    P.p.opts.prune_expert_ffn = 1; /* expert and shared-expert width gates (Mamba head dims always) */
    ac_dnas_gates g;
    CHECK(ac_dnas_gates_init(&g, &M.a, &P.p.opts, &e) == 0, "%s", e.msg);
    int nw = 0;
    for (int l = 0; l < g.L; l++) nw += !!g.nxg[l] + !!g.nshg[l] + !!g.npd[l];
    CHECK(g.hyb && g.nhg > 0 && nw >= 4, "not the hybrid gates with hidden and width gates");
    random_la(&g, 3);
    double *an = malloc(sizeof(double) * g.np), h = 1e-4, num = 0, den = 0;
    ac_dnas_expected_metric(&g, &P.p, AC_M_PARAMS, an);
    for (int i = 0; i < g.np; i++) {
        double o = g.la[i];
        g.la[i] = o + h;
        double a = ac_dnas_expected_metric(&g, &P.p, AC_M_PARAMS, NULL);
        g.la[i] = o - h;
        double b = ac_dnas_expected_metric(&g, &P.p, AC_M_PARAMS, NULL);
        g.la[i] = o;
        double fd = (a - b) / (2 * h);
        num = fmax(num, fabs(fd - an[i]));
        den = fmax(den, fabs(fd));
    }
    printf("   params: %d gates, max|grad - fd| / max|fd| %.2e (max|fd| %.3g)\n", g.np, num / den, den);
    CHECK(den > 0 && num <= 1e-8 * den, "the expected parameter count's gradient is off by %.3g", num / den);
    free(an);
    ac_dnas_gates_free(&g);
}

/* Feasible, one width per layer type, experts below the base's and at least top_k in every kept MoE layer, the
 * same Mamba heads in each group; 1 when so. */
static int structure_ok(const ac_search_result *r) {
    int ex = -1, ssm = -1, uniform = 1, fewer = 1, G = M.a.ssm_groups;
    for (int l = 0; l < M.a.n_layers; l++) {
        const ac_layer_arch *a = &r->arch.layers[l], *b = &M.a.layers[l];
        if (b->n_experts && a->n_experts) {
            uniform &= ex < 0 || a->n_experts == ex, ex = a->n_experts;
            fewer &= a->n_experts < b->n_experts && a->n_experts >= M.a.top_k;
        }
        if (b->ssm_heads && a->ssm_heads) {
            uniform &= (ssm < 0 || a->ssm_heads == ssm) && a->ssm_heads % G == 0, ssm = a->ssm_heads;
        }
        /* each layer its own mixer or removed */
        uniform &= !(a->n_heads + a->ffn + a->ssm_heads + a->n_experts) ||
                   (!!a->n_heads == !!b->n_heads && !!a->ssm_heads == !!b->ssm_heads && !!a->ffn == !!b->ffn &&
                    !!a->n_experts == !!b->n_experts);
    }
    return r->feasible && uniform && fewer && ex > 0;
}

/* The search (from Minitron's structure, as a job starts it); *frac, *kl, *best from es_rank_experts (the held-out KL
 * of the result and of the best expert choice), *start the held-out KL of its start (Minitron's structure pruned
 * by Minitron's importance). */
static int run_search(int zero_task, ac_search_result *r, ac_importance *ord, double *frac, double *kl, double *best,
                      double *start) {
    problem_t P;
    ac_err e;
    make_problem(&P, 3);
    ac_dnas_opts o;
    ac_dnas_defaults(&o);
    o.steps = 150;
    o.batch = 4;
    o.seq_len = 32;
    o.zero_task_grad = zero_task;
    P.p.model = &M; /* Minitron's start scores its candidates */
    double t0 = ac_now();
    if (ac_search_dnas(&P.p, &M, IDS, NIDS, &o, r, ord, &e)) {
        CHECK(0, "dnas: %s", e.msg);
        return -1;
    }
    json_t *aj = ac_arch_to_json(&r->arch);
    char *s = json_dumps(aj, JSON_COMPACT);
    printf("   %s (%.1f s): params %.0f (limit %.0f), feasible %d: %s\n", zero_task ? "zero task gradients" : "dnas",
           ac_now() - t0, r->cost.params, P.p.limits.max_params, r->feasible, s);
    free(s);
    json_decref(aj);
    float *teacher = es_logits(&M, HIDS, HB, HT, NULL);
    *frac = structure_ok(r) ? es_rank_experts(&M, &r->arch, ord, teacher, HIDS, HB, HT, kl, best) : 1;
    ac_search_result mr;
    if (ac_search_minitron(&P.p, &mr, &e) == 0) {
        ac_importance view;
        ac_minitron_importance_view(&IMP, &view);
        *start = es_heldout_kl(&M, &mr.arch, &view, teacher, HIDS, HB, HT);
        ac_search_result_free(&mr);
    } else
        CHECK(0, "minitron: %s", e.msg);
    free(teacher);
    return 0;
}

static void test_dnas_hybrid_removes_experts(void) {
    if (!setup()) SKIP("no fixture nemotronh_moe_bf16 (make fixtures)");
    for (int z = 0; z < 2; z++) {
        ac_search_result r;
        ac_importance ord;
        double frac = 1, kl = NAN, best = NAN, start = NAN;
        if (run_search(z, &r, &ord, &frac, &kl, &best, &start)) return;
        int ok = structure_ok(&r), claim = ok && frac <= 0.2 && kl < start;
        printf("   %s: structure ok %d; held-out KL %.5f (its start, Minitron's: %.5f), best expert choice of its "
               "count %.5f, %.0f%% of the choices better than the gates'\n",
               z ? "zero task gradients" : "dnas", ok, kl, start, best, 100 * frac);
        if (!z) {
            CHECK(ok, "not a feasible structure, one width per type, fewer experts (>= top_k)");
            CHECK(frac <= 0.2, "the gates' expert choice is not among the best fifth (%.0f%% better)", 100 * frac);
            CHECK(kl < start, "the search does not beat its start: KL %.5f vs %.5f", kl, start);
        } else
            CHECK(!claim, "without task gradients the claim still holds (it cannot fail)");
        ac_search_result_free(&r);
        ac_importance_free(&ord);
    }
}

/* Minitron's expert width on the hybrid (Model-Optimizer's moe_ffn_hidden_size, search.prune_expert_ffn; experts
 * not removed): under a parameter limit of 0.62 of the base (the grid reaches 0.646 at best without the axis: no point
 * meets the limit without it), the arm cuts every expert to one searched width, and the student keeps each kept
 * expert's best channels by the expert-width score (checked by sorting imp->echan_score here: the pruned up rows and
 * down columns are the source's at those channels). */
static void test_minitron_hybrid_expert_width(void) {
    if (!setup()) SKIP("no fixture nemotronh_moe_bf16 (make fixtures)");
    CHECK(IMP.echan_order && IMP.echan_score, "calibration gave no expert-channel ranking");
    if (!IMP.echan_order) return;
    problem_t P;
    ac_err e;
    make_problem(&P, 3);
    P.p.model = &M;
    P.p.opts.prune_experts = 0;
    P.p.opts.prune_expert_ffn = 1;
    P.p.limits.max_params = 0.62 * ac_arch_params(&M.a);
    ac_search_result r;
    CHECK(ac_search_minitron(&P.p, &r, &e) == 0, "minitron: %s", e.msg);
    json_t *ax = json_object_get(json_object_get(r.detail, "axes"), "moe_ffn_hidden_size");
    char *js = json_dumps(ax, JSON_COMPACT);
    json_t *aj = ac_arch_to_json(&r.arch);
    char *as = json_dumps(aj, JSON_COMPACT);
    printf("   minitron: params %.0f (limit %.0f), feasible %d; moe_ffn_hidden_size axis %s\n   %s\n", r.cost.params,
           P.p.limits.max_params, r.feasible, js ? js : "(none)", as);
    free(js), free(as);
    json_decref(aj);
    int w = -1, uniform = 1;
    for (int l = 0; l < M.a.n_layers; l++)
        if (M.a.layers[l].n_experts && r.arch.layers[l].n_experts)
            uniform &= w < 0 || r.arch.layers[l].expert_ffn == w, w = r.arch.layers[l].expert_ffn;
    CHECK(ax && r.feasible && uniform && w > 0 && w < 24, "expert width %d: not one searched width under 24", w);
    ac_search_result r0; /* without the axis, no point of the grid meets the limit */
    P.p.opts.prune_expert_ffn = 0;
    CHECK(ac_search_minitron(&P.p, &r0, &e) == 0, "minitron: %s", e.msg);
    printf("   without moe_ffn_hidden_size: feasible %d (params %.0f)\n", r0.feasible, r0.cost.params);
    CHECK(!r0.feasible, "the limit is met without cutting the expert width");
    ac_search_result_free(&r0);
    ac_importance view;
    ac_minitron_importance_view(&IMP, &view);
    ac_model pm;
    CHECK(ac_prune(&M, &r.arch, &view, &pm, &e) == 0, "prune: %s", e.msg);
    int checked, good = es_experts_hold_best_channels(&M, &pm, &r.arch, &IMP, w, &checked);
    printf("   %d experts checked channel by channel\n", checked);
    CHECK(good && checked > 0, "the student's experts are not the source's best-scored channels");
    if (pm.L) ac_model_free(&pm);
    ac_search_result_free(&r);
}

/* minitron.top_k on a hybrid: that many candidates scored (the report's top_k and calib_nll entries). */
static void test_minitron_hybrid_top_k(void) {
    if (!setup()) SKIP("no fixture nemotronh_moe_bf16 (make fixtures)");
    for (int k = 2; k <= 3; k++) {
        problem_t P;
        ac_err e;
        make_problem(&P, 3);
        P.p.model = &M;
        P.p.minitron.top_k = k;
        ac_search_result r;
        CHECK(ac_search_minitron(&P.p, &r, &e) == 0, "minitron: %s", e.msg);
        json_t *c = json_object_get(r.detail, "candidates");
        int scored = 0, said = (int)json_integer_value(json_object_get(r.detail, "top_k"));
        for (size_t i = 0; i < json_array_size(c); i++)
            scored += json_object_get(json_array_get(c, i), "calib_nll") != NULL;
        int nf = (int)json_integer_value(json_object_get(r.detail, "grid_feasible"));
        printf("   minitron.top_k %d: %d of %d feasible points scored (report's top_k %d)\n", k, scored, nf, said);
        CHECK(said == k && scored == (nf < k ? nf : k) && nf > k, "top_k %d: %d scored, report says %d", k, scored,
              said);
        ac_search_result_free(&r);
        ac_cost_table_free(&P.t);
    }
}

/* ---- the gates on a resident BF16 checkpoint equal those on its fp32 load ---- */

static float next_gate(unsigned long long *s) { /* in (0.3, 0.9) */
    *s = *s * 6364136223846793005ULL + 1442695040888963407ULL;
    return (float)(0.3 + 0.6 * (*s >> 11) / 9007199254740992.0);
}

/* Every gate of t from one pseudo-random sequence (the same for two trainers of one arch). */
static void set_gates(ac_trainer *t, const ac_arch *a) {
    unsigned long long s = 17;
    for (int c = 0; c < a->hidden; c++) t->gate.hidden[c] = next_gate(&s);
    for (int l = 0; l < a->n_layers; l++) {
        const ac_layer_arch *L = &a->layers[l];
        t->gate.attn[l] = next_gate(&s), t->gate.mlp[l] = next_gate(&s);
        for (int h = 0; h < L->n_heads; h++) t->gate.head[l][h] = next_gate(&s);
        for (int c = 0; c < L->ffn; c++) t->gate.ffn[l][c] = next_gate(&s);
        for (int x = 0; x < L->n_experts; x++) t->gate.expert[l][x] = next_gate(&s);
        for (int c = 0; c < L->n_experts * L->expert_ffn; c++) t->gate.echan[l][c] = next_gate(&s);
        for (int h = 0; h < L->ssm_heads; h++) t->gate.ssm[l][h] = next_gate(&s);
    }
}

/* n floats of a and b: *diff gets the count that differ, *nz the nonzero ones of a. */
static void cmp_floats(const float *a, const float *b, size_t n, size_t *diff, size_t *nz, size_t *tot) {
    for (size_t i = 0; i < n; i++) *diff += memcmp(&a[i], &b[i], sizeof(float)) != 0, *nz += a[i] != 0;
    *tot += n;
}

static void resident_trainer_equals_fp32(const char *name) {
    ac_model m[2]; /* the fp32 load, the resident one */
    ac_err e = {{0}};
    char fx[1024], dir[1200];
    if (es_load(name, &m[0])) SKIP("no fixture %s (make fixtures)", name);
    ck_build_path(fx, sizeof fx, "fixtures");
    snprintf(dir, sizeof dir, "%s/models/%s", fx, name);
    if (ac_model_load_resident(dir, &m[1], &e)) {
        CHECK(0, "%s resident: %s", name, e.msg);
        ac_model_free(&m[0]);
        return;
    }
    CHECK(ac_model_wdt(&m[1]) == ST_BF16, "%s is resident in BF16", name);
    const ac_arch *a = &m[0].a;
    int B = 2, T = 16, N = B * T, V = a->vocab, *tok = es_rand_ids((size_t)N, V, 31);
    float *teacher = malloc(sizeof(float) * N * V);
    unsigned long long s = 5;
    for (int i = 0; teacher && i < N * V; i++) teacher[i] = 4 * next_gate(&s); /* any logits */
    ac_trainer t[2];
    double loss[2] = {0};
    int ok = 1;
    for (int k = 0; k < 2; k++) {
        if (ac_trainer_init_frozen(&t[k], &m[k], B, T, &e)) {
            CHECK(0, "%s trainer on the %s model: %s", name, k ? "resident" : "fp32", e.msg);
            ok = 0;
            continue;
        }
        set_gates(&t[k], a);
        if (ac_train_forward(&t[k], tok, B, T, &e)) {
            CHECK(0, "%s: %s", name, e.msg);
            ok = 0;
            continue;
        }
        loss[k] = ac_train_loss(&t[k], NULL, teacher, 1.0f, 1.0f, 1.0f, NULL, NULL);
        ac_train_backward(&t[k]);
    }
    if (ok) {
        size_t dl = 0, nl = 0, tl = 0, dg = 0, ng = 0, tg = 0;
        int kinds[4] = {0}; /* Mamba, attention, MLP, MoE layers seen */
        cmp_floats(t[0].logits, t[1].logits, (size_t)N * V, &dl, &nl, &tl);
        cmp_floats(t[0].dgate.hidden, t[1].dgate.hidden, a->hidden, &dg, &ng, &tg);
        cmp_floats(t[0].dgate.attn, t[1].dgate.attn, a->n_layers, &dg, &ng, &tg);
        cmp_floats(t[0].dgate.mlp, t[1].dgate.mlp, a->n_layers, &dg, &ng, &tg);
        for (int l = 0; l < a->n_layers; l++) {
            const ac_layer_arch *L = &a->layers[l];
            kinds[L->ssm_heads ? 0 : L->n_heads ? 1 : L->n_experts ? 3 : 2]++;
            cmp_floats(t[0].dgate.head[l], t[1].dgate.head[l], L->n_heads, &dg, &ng, &tg);
            cmp_floats(t[0].dgate.ffn[l], t[1].dgate.ffn[l], L->ffn, &dg, &ng, &tg);
            cmp_floats(t[0].dgate.expert[l], t[1].dgate.expert[l], L->n_experts, &dg, &ng, &tg);
            cmp_floats(t[0].dgate.echan[l], t[1].dgate.echan[l], (size_t)L->n_experts * L->expert_ffn, &dg, &ng,
                       &tg);
            cmp_floats(t[0].dgate.ssm[l], t[1].dgate.ssm[l], L->ssm_heads, &dg, &ng, &tg);
        }
        printf("   %s (%d Mamba, %d attention, %d MLP, %d MoE layers): resident vs fp32: loss %.9g vs %.9g, %zu of "
               "%zu logits and %zu of %zu gate gradients (%zu nonzero) differ\n",
               name, kinds[0], kinds[1], kinds[2], kinds[3], loss[0], loss[1], dl, tl, dg, tg, ng);
        CHECK(loss[0] == loss[1] && dl == 0 && dg == 0, "%s: the resident trainer differs from the fp32 one", name);
        CHECK(ng > tg / 2 && nl == tl, "%s: the gradients are mostly zero (%zu of %zu)", name, ng, tg);
    }
    for (int k = 0; k < 2; k++)
        if (t[k].mem) ac_trainer_free(&t[k]);
    free(tok), free(teacher);
    ac_model_free(&m[0]), ac_model_free(&m[1]);
}

static void test_resident_trainer_mamba_mlp_attention(void) { resident_trainer_equals_fp32("nemotronh_bf16"); }
static void test_resident_trainer_moe(void) { resident_trainer_equals_fp32("nemotronh_moe_bf16"); }
static void test_resident_trainer_latent_moe(void) { resident_trainer_equals_fp32("nemotronh_latent_bf16"); }

/* ac_dnas_train_gates on the resident checkpoint and on the fp32 load (setup's M): the same log_alphas and task
 * gradient, bit for bit. */
static void test_resident_gate_search_equals_fp32(void) {
    if (!setup()) SKIP("no fixture nemotronh_moe_bf16 (make fixtures)");
    char fx[1024], dir[1200];
    ac_err e = {{0}};
    ac_model R;
    ck_build_path(fx, sizeof fx, "fixtures");
    snprintf(dir, sizeof dir, "%s/models/nemotronh_moe_bf16", fx);
    if (ac_model_load_resident(dir, &R, &e)) {
        CHECK(0, "resident: %s", e.msg);
        return;
    }
    ac_model *ms[2] = {&R, &M};
    ac_dnas_gates g[2];
    double *tg[2] = {calloc(4096, sizeof(double)), calloc(4096, sizeof(double))};
    int ok = tg[0] && tg[1];
    for (int k = 0; k < 2 && ok; k++) {
        problem_t P;
        make_problem(&P, 3);
        ac_dnas_opts o;
        ac_dnas_defaults(&o);
        o.steps = 6, o.batch = 2, o.seq_len = 32, o.init_surrogate = 0;
        ok = ac_dnas_train_gates(&P.p, ms[k], IDS, NIDS, &o, &g[k], tg[k], &e) == 0;
        CHECK(ok && g[k].np <= 4096, "%s gate training: %s", k ? "fp32" : "resident", e.msg);
        ac_cost_table_free(&P.t);
    }
    es_check_same_training(g, tg, ok, 6);
    for (int k = 0; ok && k < 2; k++) ac_dnas_gates_free(&g[k]);
    free(tg[0]), free(tg[1]);
    ac_model_free(&R);
}

/* The latent fixture's gate training for es_cuda_vs_cpu: every axis gated, identity orders. */
typedef struct {
    ac_model m;
    orders_t o;
    int *ids;
    size_t n;
} latent_run;

static int latent_train(void *ud, int steps, int cuda, ac_dnas_gates *g, double *tg) {
    latent_run *r = ud;
    problem_t P;
    ac_err e = {{0}};
    es_make_problem(&P, &r->m, &r->o.imp, r->ids, r->n, 3, 8, 8);
    P.p.opts.prune_expert_ffn = 1, P.p.opts.prune_hidden = 1;
    P.p.opts.target = AC_EXPORT_GGUF; /* KV groups gated */
    ac_dnas_opts o;
    ac_dnas_defaults(&o);
    o.steps = steps, o.batch = 2, o.seq_len = 16, o.init_surrogate = 0, o.cuda = cuda;
    int rc = ac_dnas_train_gates(&P.p, &r->m, r->ids, r->n, &o, g, tg, &e);
    CHECK(rc == 0 && g->np <= 4096, "%s gate training: %s", cuda ? "CUDA" : "CPU", e.msg);
    ac_cost_table_free(&P.t);
    return rc;
}

static void test_cuda_gate_training_matches_cpu(void) {
    const char *why;
    if (!ac_cuda(&why)) SKIP("no CUDA: %s", why);
    latent_run r;
    if (es_load("nemotronh_latent_bf16", &r.m)) SKIP("no fixture nemotronh_latent_bf16 (make fixtures)");
    es_orders_init(&r.o, &r.m.a);
    r.n = 8 * 16;
    r.ids = es_rand_ids(r.n, r.m.a.vocab, 7);
    double rel = 1, gn = 0, dla = 1;
    int np = 0, ok = !es_cuda_vs_cpu(latent_train, &r, 3, &rel, &gn, &dla, &np);
    printf("   nemotronh_latent_bf16, %d gates: first-step task gradient CUDA vs CPU relative diff %.2e (|grad| %.3g); "
           "log_alpha after 3 steps max |diff| %.2e\n",
           np, rel, gn, dla);
    CHECK(ok && rel < 1e-3, "first-step gradients differ by %g", rel);
    CHECK(ok && dla < 1e-2, "log_alphas after 3 steps differ by %g", dla);
    free(r.ids);
    es_orders_free(&r.o);
    ac_model_free(&r.m);
}

int main(void) {
    ac_set_threads(ck_threads());
    if (getenv("AC_DNAS_CUDA_ONLY")) { /* tests/run_all.sh: the gate training on the emulated plugin */
        RUN(test_cuda_gate_training_matches_cpu);
        return DONE();
    }
    RUN(test_sigmoid_expert_gates_equal_pruned);
    RUN(test_sigmoid_expert_gates_equal_pruned_nonorm);
    RUN(test_depth_gates_equal_removed_layers);
    RUN(test_width_gates_equal_pruned);
    RUN(test_width_gates_equal_pruned_latent);
    RUN(test_gate_gradients_in_dnas_layout);
    RUN(test_latent_gate_gradients);
    RUN(test_hybrid_cost_gradient);
    RUN(test_dnas_hybrid_removes_experts);
    RUN(test_minitron_hybrid_expert_width);
    RUN(test_minitron_hybrid_top_k);
    RUN(test_resident_trainer_mamba_mlp_attention);
    RUN(test_resident_trainer_moe);
    RUN(test_resident_trainer_latent_moe);
    RUN(test_resident_gate_search_equals_fp32);
    RUN(test_cuda_gate_training_matches_cpu);
    if (HAVE > 0) {
        ac_importance_free(&IMP);
        ac_model_free(&M);
    }
    free(IDS);
    free(HIDS);
    return DONE();
}
