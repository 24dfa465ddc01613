/*
 * dnas.h - differentiable architecture search through the network
 * (search.method "dnas"): learnable hard-concrete gates on the model's
 * prunable units, trained by backprop (src/runtime/train.h) on calibration text
 * with the distillation KL to the unpruned model, plus the hardware limits
 * as an augmented Lagrangian on the cost model's prediction of the
 * EXPECTED architecture, then discretised by gate score and made exactly
 * feasible by search.c's repair.
 *
 * Gates (one log_alpha each, hard-concrete as in Louizos et al. 2018 and
 * Sheared-LLaMA's l0_module: z = clamp(sigmoid((logit u + log_alpha)/beta)
 * * (zeta - gamma) + gamma, 0, 1), beta 2/3, gamma -0.1, zeta 1.1):
 *   kv[l][g]   a KV group with its query heads (not on the deci target,
 *              where a layer keeps every query head and merges KV heads);
 *   mc[l][c]   deci only: the per-layer KV-merge choice, a categorical
 *              relaxation over the allowed KV counts (the divisors d of the
 *              layer's n_kv_heads, i.e. n_heads_in_group = n_heads / d):
 *              one logit theta_c per choice, P(c) = softmax(theta)_c, the
 *              expected KV count sum_c P(c) d_c; in the network a
 *              Gumbel-softmax sample q (temperature 2/3) mixes the merged
 *              K/V projections, W_kv = sum_c q_c M_c(W_kv), where M_c
 *              replaces each KV head by the mean of its merge group (the f =
 *              n_kv/d_c adjacent heads, as ac_prune merges). A one-hot q is
 *              exactly the merged model; the gradient d loss/d q_c =
 *              <dL/dW_kv, M_c(W_kv)> comes from the weight gradients;
 *   ffn[l][j]  a group of ffn_multiple FFN channels (the export grid;
 *              the last group is the remainder when the grid does not
 *              divide the width);
 *   hid[j]     a group of hidden_multiple hidden channels, shared by all
 *              layers (applied to every RMSNorm output; only when
 *              prune_hidden);
 *   ex[l][e]   a routed expert of a mixture-of-experts layer (softmax
 *              routers; when search.prune_experts): train.h's expert gate,
 *              on the expert's softmax numerator in the router, so a gate
 *              at 0 is the expert removed and the routing renormalised over
 *              the others exactly as the pruned model routes; the export
 *              targets hold one expert count for the model, so the
 *              discrete count is the mean over the MoE layers (at least
 *              top_k), each layer keeping its highest-scored experts;
 *   xw[l][j]   a group of xfm[l] channels of every expert of an MoE layer
 *              (with prune_expert_ffn; about 16 groups: xfm = round(expert_ffn / 16);
 *              softmax routers, and nemotron_h's sigmoid one):
 *              group j holds, in each expert e, the channels at ranks
 *              j*xfm .. of e's own ranking (imp->echan_order), through
 *              train.h's expert channel gates; one width for the model
 *              (the targets hold one moe_intermediate_size), the mean over
 *              the MoE layers' expected widths on the group grid;
 *   ssm[l][j]  nemotron_h: Mamba head slot j of layer l, the head at rank
 *              j of EVERY group (imp->ssm_head_order), through train.h's
 *              ssm gates: the gates keep the same number of heads in each
 *              group, as the group-aware pruning does (ssm_prune.h);
 *   pd[l][p]   nemotron_h: head dim p of every Mamba head of layer l
 *              (train.h's ssm_dim gates, inside the gated norm: gates in
 *              {0,1} are the narrower mamba_head_dim exactly), so every
 *              head keeps the same dims; one mamba_head_dim for the model
 *              (the config holds one), the mean over the Mamba layers'
 *              expected dims, each layer keeping its highest-scored dims
 *              (imp->ssm_dim_order of ac_dnas_orders);
 *   sh[l][j]   nemotron_h (with prune_expert_ffn): a group of shm
 *              shared-expert channels of MoE layer l (about 16 groups),
 *              group j the channels at ranks j*shm .. of imp->sh_order
 *              (train.h's shared gates); one
 *              moe_shared_expert_intermediate_size for the model, the mean
 *              over the MoE layers, on the group grid;
 *   lt[l][j]   LatentMoE (with prune_expert_ffn): a group of ltm latent
 *              channels of MoE layer l (about 16 groups, in index order:
 *              no statistic ranks them), train.h's latent gates on the
 *              experts' input and their weighted sum; one moe_latent_size
 *              for the model as above (imp->lat_order of ac_dnas_orders);
 *   attn[l], mlp[l]  the attention / FFN sub-block (depth); on the
 *              uniform llama target one gate per layer serves both (the
 *              whole layer kept or dropped, as Minitron's depth axis; the
 *              job compacts dropped layers out of the export).
 * P(z > 0) = sigmoid(log_alpha - beta log(-gamma/zeta)) is a unit's keep
 * probability; the expected architecture is the sum of those.
 *
 * Expected cost (first order in the sub-block indicators, which the cost
 * model charges in steps because of per-kernel launch overheads):
 *   E[m] = m(cbar) - sum_l (1 - pa_l) Da_l - sum_l (1 - pm_l) Dm_l
 * where cbar has every sub-block at its expected width given it is kept,
 * and Da_l = m(cbar) - m(cbar without layer l's attention) (Dm_l: FFN).
 *
 * Hybrid Mamba-Transformer models (nemotron_h, dnas_hybrid.c): every layer
 * holds one mixer, so one depth gate per layer (attn_off + l) removes a
 * Mamba, attention, MLP or MoE layer; the gates are the Mamba head slots
 * and head dims above, attention KV groups, MLP channel groups, MoE experts
 * (the sigmoid router: ac_moe_route_sigmoid's gates), expert-channel and
 * shared-expert channel groups, and hidden channels; the widths the config
 * holds once (expert, shared-expert, head dim) are the mean over their
 * layers, in the expected cost and at discretisation. The cost
 * model's carch holds Mamba heads per layer, so the expected cost is the
 * formula above with every layer one block: E[m] = m(cbar) - sum_l (1 - p_l)
 * D_l, width gradients p_l dm/dw_l by central differences on the cost
 * model. With init_surrogate the gates start from the surrogate search's
 * structure (search.h, "Hybrid Mamba-Transformer models") where the
 * calibration measured the loss curves (every method does, on either
 * target; ac_search_has_curves), else from Minitron's (ac_dnas_hyb_init: its
 * units at log_alpha 2, the others -3); the
 * discretisation is per layer type: the export holds one width per type
 * (mamba_num_heads, num_key_value_heads, intermediate_size,
 * n_routed_experts), so each type's mean expected width rounded, its
 * layers with depth keep probability under 0.5 removed (never a type's
 * last), then a greedy repair (cheapest gate mass per violation removed).
 * A 16-bit hybrid's gates train on the model in place, as a dense one's
 * (no fp32 copy): the frozen trainer converts one layer's matrices, and
 * the routed experts one expert at a time, into fp32 scratch (train.h).
 *
 * Deterministic for a seed (LCG noise, fixed batch order). Trains on the CPU
 * (train.c's frozen-weight trainer: m is read in its dtype, resident BF16/F16
 * too, one layer at a time, and never written; KV-merge mixtures go to
 * private fp32 K/V buffers), or with opts.cuda on the CUDA plugin's trainer
 * (ac_cuda_train_int.h: the same gates on the device; a local cuda target).
 */
#ifndef AC_DNAS_H
#define AC_DNAS_H

#include "search/search.h"
#include "runtime/train.h"

typedef struct {
    int steps;               /* gate-training steps */
    int batch, seq_len;      /* calibration windows per step, tokens per window */
    double lr;               /* Adam on log_alpha */
    double mu;               /* augmented-Lagrangian penalty weight */
    double rho;              /* dual ascent step */
    int cotrain;             /* 1: weights trained too (AdamW, on an fp32 copy of the model: 16 bytes per parameter
                              * with its gradients and two moments) */
    double w_lr;             /* weight learning rate when cotrain */
    int keep;                /* with cotrain: ac_search_dnas hands the co-trained copy over (r->trained: fp32, the
                              * base architecture, every unit; K/V of deci merge layers are the original ones, as
                              * ac_prune merges them), instead of discarding it; the weights then step from a
                              * second pass at the gates' rounded structure (dnas.c, hard_grads) */
    int init_surrogate;      /* 1: log_alpha initialised from the surrogate search's result (a calibration without curves:
                              * from Minitron's) */
    int teacher_cache_mib;   /* teacher logits cached up to this size, else recomputed each step */
    double mc_tau0, mc_tau1; /* deci merge choices: Gumbel-softmax temperature, first and last step (geometric) */
    double mc_hard_from;     /* straight-through from this fraction of the steps on (the network sees the one-hot
                              * argmax of the soft sample); 1: never */
    double mc_init_off;      /* initial logit of the merge choices the surrogate did not pick (its pick: 2) */
    int cuda;                /* 1: gate training on CUDA device 0 (the plugin's trainer); the job sets it
                            * when its target is a local cuda device (ac_search_problem.cuda) */
    int zero_task_grad;      /* test only (tests/test_dnas_gain.c's mutation check): the gates get no gradient from
                              * the network, only the limits' cost gradient; 0 in every job */
} ac_dnas_opts;

void ac_dnas_defaults(ac_dnas_opts *o);

/* Gate parameters over a base architecture. */
typedef struct {
    int L, H, hm, fm; /* layers, hidden, hidden/ffn group sizes */
    int gate_kv;      /* KV groups gated (not on deci) */
    int gate_depth;   /* attn/mlp gated */
    int tie_depth;    /* llama (uniform): one gate per layer for both sub-blocks (mlp_off == attn_off) */
    int gate_hid;
    int *nkv, *nfg; /* [L] gates per layer */
    int nhg;
    int np;     /* number of log_alphas */
    double *la; /* all log_alphas, laid out by the index helpers below */
    int *kv_off, *ffn_off, attn_off, mlp_off, hid_off;
    double *kv_on;     /* [L] deci: the KV count of a kept attention without merge choices */
    int *nmc, *mc_off; /* [L] deci: merge choices per layer (0: none), offset of their logits */
    int *mkv;          /* [np] the KV count of a merge-choice logit, 0 for every other log_alpha */
    int *nex, *ex_off; /* [L] expert gates per layer (0: none), offset of their log_alphas */
    int *nxg, *xg_off, *xfm; /* [L] expert-width groups per layer (0: none), their offset, channels per group */
    int hyb;                 /* nemotron_h (dnas_hybrid.c): one depth gate per layer (attn_off + l, whatever its
                              * mixer), Mamba head slots, one width per layer type at discretisation */
    int *nsg, *sg_off;       /* [L] Mamba head slots per layer (heads / groups; 0: none), their offset */
    int *npd, *pd_off;       /* [L] nemotron_h Mamba head dims per layer (ssm_head_dim; 0: none), their offset */
    int *nshg, *shg_off, shm; /* [L] nemotron_h shared-expert channel groups per MoE layer (0: none), their offset;
                               * channels per group */
    int *nltg, *ltg_off, ltm; /* [L] LatentMoE latent channel groups per MoE layer (0: none), their offset; channels
                               * per group */
} ac_dnas_gates;

int ac_dnas_gates_init(ac_dnas_gates *g, const ac_arch *base, const ac_search_opts *so, ac_err *e);
void ac_dnas_gates_free(ac_dnas_gates *g);
/* Keep probability P(z > 0) of a log_alpha. */
double ac_dnas_keep_prob(double la);
/* Hard-concrete sample for uniform noise u in (0,1) (u < 0: deterministic
 * test-time gate, clamp(sigmoid(la)*(zeta-gamma)+gamma)); *dz gets dz/dla. */
double ac_dnas_sample(double la, double u, double *dz);
/* Write gate values z[np] (one per log_alpha) into a trainer's gates,
 * expanded to query heads and channels. FFN group j of layer l holds the
 * channels imp->ffn_order[l][j*fm ..] of the importance ranking, hidden
 * group j the channels imp->hid_order[j*hm ..]: the gates choose how many
 * blocks of the ranking, and which, to keep. */
void ac_dnas_set_gates(const ac_dnas_gates *g, const double *z, ac_gates *tg, const ac_arch *base,
                       const ac_importance *imp);
/* d loss / d z for every log_alpha from a trainer's gate gradients. */
void ac_dnas_gate_grads(const ac_dnas_gates *g, const ac_trainer *t, const ac_importance *imp, double *dz);
/* The same from gate gradients dg in train.h's layout (arch b). */
void ac_dnas_gate_grads_of(const ac_dnas_gates *g, const ac_arch *b, const ac_gates *dg, const ac_importance *imp,
                           double *dz);
/* deci KV-merge mixture: dst's K/V projections (wk, wv, bk, bv) of every
 * layer with merge choices = sum_c z_c M_c(src's), z at the choices'
 * logits (mc_off); src and dst of the base architecture, distinct. */
void ac_dnas_apply_merge(const ac_dnas_gates *g, const double *z, const ac_model *src, ac_model *dst);
/* d loss / d z_c += <grad's K/V projections, M_c(src's)> for every merge
 * choice, grad the weight gradients of a forward through the mixture. */
void ac_dnas_merge_grads(const ac_dnas_gates *g, const ac_model *src, const ac_model *grad, double *dz);
/* Gumbel-softmax sample of layer l's merge choices from uniforms u[nmc]
 * at temperature tau (u == NULL: softmax(theta)) into q[mc_off..]; z[mc_off..]
 * gets q, or with hard the one-hot of its argmax (Gumbel-max: an exact
 * sample of the categorical softmax(theta), whatever tau). */
void ac_dnas_merge_sample(const ac_dnas_gates *g, int l, const double *u, double tau, int hard, double *q, double *z);

/* Expected value of metric m under the gates (formula above) and its
 * gradient d/d log_alpha into grad[np] (may be NULL). */
double ac_dnas_expected_metric(const ac_dnas_gates *g, const ac_search_problem *p, ac_metric m, double *grad);
/* The expected architecture as continuous widths (per layer: kv, heads,
 * ffn times keep probability of the sub-block). */
json_t *ac_dnas_expected_arch_json(const ac_dnas_gates *g, const ac_arch *base);

/* orders = a deep copy of imp whose KV-group order is by log_alpha and
 * whose FFN / hidden orders are the gate groups by log_alpha, each group's
 * units in importance order (what ac_prune keeps first). */
int ac_dnas_orders(const ac_dnas_gates *g, const ac_importance *imp, const ac_arch *base, ac_importance *orders,
                   ac_err *e);
/* Discretise: round expected counts to the export grid, keep the units
 * with the highest log_alpha, repair to feasibility (search.c; on llama,
 * when no uniform width is feasible, whole layers go, the lowest depth gate
 * first). orders
 * gets imp's arrays with kv/ffn/hidden orders by gate score (for ac_prune). */
int ac_dnas_discretise(const ac_dnas_gates *g, const ac_search_problem *p, ac_search_result *r, ac_importance *orders,
                       ac_err *e);

/* The whole search: surrogate initialisation, gate training on ids[n]
 * (calibration tokens) through model m (left unchanged), discretisation.
 * orders: a copy of p->imp whose unit orders follow the gate scores
 * (free with ac_importance_free). With o->cotrain and o->keep, r->trained
 * gets the weights trained with the gates (search.h). */
int ac_search_dnas(const ac_search_problem *p, ac_model *m, const int *ids, size_t n, const ac_dnas_opts *o,
                   ac_search_result *r, ac_importance *orders, ac_err *e);

/* The gate training alone (no discretisation; for tests and tools): g
 * gets the trained gates (free with ac_dnas_gates_free), task_grad[np]
 * (may be NULL) the last step's d task loss / d log_alpha. */
int ac_dnas_train_gates(const ac_search_problem *p, ac_model *m, const int *ids, size_t n, const ac_dnas_opts *o,
                        ac_dnas_gates *g, double *task_grad, ac_err *e);

/* search.method's name ("dnas", the spec default: docs/benchmarks.md,
 * bench_compress.py, gives the comparison it was chosen by; or "surrogate"). */
const char *ac_dnas_method(ac_search_method m);
/* Whether the gate trainer runs the search on model m for the job's
 * problem p: a dense model always; a mixture-of-experts one (expert and
 * expert-channel gates) when its router is a softmax, on the CPU (fp32 or
 * resident 16-bit weights: the frozen trainer converts each layer's
 * experts) or on CUDA (p->cuda: the CUDA trainer's MoE ops); a hybrid
 * (nemotron_h) always: its gates (the sigmoid router's experts among them)
 * train on the CUDA trainer with p->cuda (it has every hybrid layer kind
 * and gate), else on the CPU (on m in place when it is 16-bit). Otherwise
 * method dnas falls back to the surrogate search. */
int ac_dnas_gates_ok(const ac_search_problem *p, const ac_model *m);
/* The job's search stage for method autocompress: so->method AC_SEARCH_DNAS
 * (with so->dnas_steps, dnas_lr, dnas_batch, dnas_seq_len, cotrain,
 * keep_weights: r->trained) or
 * AC_SEARCH_SURROGATE (ac_search_autocompress; orders stays empty,
 * n_layers 0: prune with the importance orders); once per top-k choice
 * with so->min_top_k (topk.h). */
int ac_dnas_job_search(const ac_search_problem *p, ac_model *m, const ac_search_opts *so, const int *ids, size_t n,
                       ac_search_result *r, ac_importance *orders, ac_err *e);

#endif
