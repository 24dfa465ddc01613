/*
 * model.h - the architecture description (uniform or heterogeneous per
 * layer), Hugging Face config.json parsing, and the fp32 weights of a model.
 *
 * Supported configs: llama, mistral, qwen2 (q/k/v biases), qwen3 (a
 * per-head RMSNorm of q and k before RoPE, head_dim free of hidden/heads),
 * the mixture-of-experts qwen3_moe (softmax router, top-k, optional
 * renormalisation, dense layers mixed in by decoder_sparse_step and
 * mlp_only_layers) and mixtral (every layer MoE, top-k renormalised), and the
 * DeciLM / nemotron-nas form AutoCompress exports for heterogeneous results
 * (block_configs, plus explicit per-block head and width fields it writes),
 * and the hybrid Mamba-Transformer nemotron_h (hybrid_override_pattern:
 * Mamba-2, attention and squared-ReLU MLP layers; docs/hybrid.md).
 *
 * Ownership: ac_arch owns its layers array (ac_arch_free). ac_model owns its
 * arch and every weight buffer (ac_model_free); a model loaded resident
 * (ac_model_load_resident) owns the mapping of its safetensors files instead
 * of its matrices, which stay in the file's dtype (wdt). A layer with n_heads == 0 has
 * no attention sub-block; ffn == 0 means no FFN sub-block.
 */
#ifndef AC_MODEL_H
#define AC_MODEL_H

#include <jansson.h>

#include "core/err.h"

typedef struct {
    int n_heads;    /* query heads; 0 = attention removed */
    int n_kv_heads; /* KV heads; n_heads % n_kv_heads == 0 */
    int ffn;        /* dense FFN (intermediate) width; 0 = no dense FFN */
    int n_experts;  /* routed experts of a mixture-of-experts FFN; 0 = none (then ffn says the FFN) */
    int expert_ffn; /* each expert's SwiGLU width (n_experts > 0) */
    int ssm_heads;  /* Mamba-2 mixer heads (nemotron_h `M` layers); 0 = none */
} ac_layer_arch;

typedef struct {
    char model_type[32]; /* "llama", "mistral", "qwen2", "qwen3", "nemotron-nas" */
    int vocab, hidden, head_dim, n_layers, max_pos;
    float eps, rope_theta;
    int rope_llama3; /* llama3 frequency scaling */
    float rs_factor, rs_low, rs_high;
    int rs_orig;
    int tie_embeddings;
    int qkv_bias;
    int qk_norm;           /* qwen3: q and k RMS-normed per head (weights q_norm, k_norm [head_dim]) before RoPE */
    int top_k;             /* MoE: experts each token is routed to (1 <= top_k <= every MoE layer's n_experts) */
    int norm_topk;         /* MoE: the top_k routing weights divided by their sum */
    int sliding_window;    /* mistral / qwen2: a query sees this many keys (itself included); 0 = all */
    /* nemotron_h (hybrid): each layer one mixer after one RMSNorm: Mamba-2
     * (ssm_heads > 0), attention without RoPE (n_heads > 0, no FFN) or an
     * MLP down(relu(up x)^2) (ffn > 0, no gate matrix). The Mamba-2 shapes
     * are model-wide: ssm_head_dim P, ssm_state N, ssm_groups G (B and C
     * shared by ssm_heads/G heads), ssm_conv K (depthwise causal conv). */
    int hybrid;
    int ssm_head_dim, ssm_state, ssm_groups, ssm_conv;
    int ssm_conv_bias; /* the conv has a bias (use_conv_bias) */
    /* nemotron_h MoE layers (`E`: n_experts > 0): experts down(relu(up x)^2)
     * without a gate, a shared expert of that form (shared_ffn), and the
     * sigmoid router: top_k chosen on sigmoid(logit) + the score-correction
     * bias, weighted by the sigmoid alone, divided by their sum when
     * norm_topk, then multiplied by routed_scale. shared_ffn: the shared
     * expert's width, one for every MoE layer (as the config holds it).
     * moe_latent > 0: the routed experts work in that latent width, between
     * a down projection of the normed input and an up projection back (the
     * router and the shared expert stay on the hidden width). */
    int router_sigmoid;
    float routed_scale;
    int shared_ffn;
    int moe_latent; /* LatentMoE (Nemotron 3 Super): the experts' width in and out (moe_latent_size); 0 = hidden */
    /* nemotron_h multi-token prediction (num_nextn_predict_layers): its
     * layers' block types, one character each as the main pattern's
     * (mtp_hybrid_override_pattern or mtp_layers_block_type; "" unnamed).
     * Never loaded, priced or exported (docs/hybrid.md); ac_arch_mtp_params
     * says what it would weigh. */
    int mtp_layers;
    char mtp_pattern[16];
    int bos_id, eos_id;    /* -1 when absent */
    ac_layer_arch *layers; /* n_layers entries, owned */
} ac_arch;

int ac_arch_from_config(const json_t *cfg, ac_arch *a, ac_err *e);
int ac_arch_load(const char *model_dir, ac_arch *a, ac_err *e);
int ac_arch_copy(ac_arch *dst, const ac_arch *src, ac_err *e);
void ac_arch_free(ac_arch *a);
/* True when every layer has the same shape and nothing is removed. */
int ac_arch_is_uniform(const ac_arch *a);
/* True when some layer has a mixture-of-experts FFN. */
int ac_arch_has_moe(const ac_arch *a);
/* True for a hybrid Mamba-Transformer (nemotron_h). */
int ac_arch_is_hybrid(const ac_arch *a);
/* Mamba-2 widths of layer l (0 without a Mamba mixer): d_inner = heads * P,
 * the conv channels d_inner + 2GN (x, B, C) and in_proj's rows
 * 2 d_inner + 2GN + heads (z, xBC, dt). */
int ac_ssm_inner(const ac_arch *a, int l);
int ac_ssm_conv_dim(const ac_arch *a, int l);
int ac_ssm_in_dim(const ac_arch *a, int l);
/* A layer's weight matrices, for code that changes one in place. */
typedef enum {
    AC_W_Q,
    AC_W_K,
    AC_W_V,
    AC_W_O,
    AC_W_G,
    AC_W_U,
    AC_W_D,
    AC_W_SSM_IN,
    AC_W_SSM_OUT,
    AC_W_SH_U, /* nemotron_h MoE: the shared expert's up [shared_ffn, H] and down [H, shared_ffn] */
    AC_W_SH_D,
    AC_W_LAT_DOWN, /* LatentMoE: fc1_latent_proj [moe_latent, H] and fc2_latent_proj [H, moe_latent] */
    AC_W_LAT_UP
} ac_wmat;

/* Parameter count (embeddings and head included). */
double ac_arch_params(const ac_arch *a);
/* Layer l's own parameters (every expert counted; embedding, head and final norm not). */
double ac_arch_layer_params(const ac_arch *a, int l);
/* The multi-token-prediction layers' own parameters (each: its blocks, at
 * the shape of the model's first layer of each type, plus the projection of
 * [embedding; hidden] to hidden and three RMSNorms; the embedding and head
 * are the model's): 0 without MTP layers, -1 when a block type is unknown
 * or the model has no layer of that type to take its shape from. */
double ac_arch_mtp_params(const ac_arch *a);
/* {"hidden":..,"layers":[{"heads":..,"kv_heads":..,"ffn":..},..]} */
json_t *ac_arch_to_json(const ac_arch *a);
/* Apply a JSON of that shape (as produced above) on top of a base arch. */
int ac_arch_from_json(const json_t *j, const ac_arch *base, ac_arch *out, ac_err *e);
/* HF config.json for this arch: plain LlamaForCausalLM (Qwen2, Qwen3,
 * Mistral as the arch says) when uniform, a DeciLM / nemotron-nas config
 * with block_configs otherwise (with "qk_norm": true for a heterogeneous
 * Qwen3, a form only AutoCompress reads: no deci loader has QK-norm). */
json_t *ac_arch_to_config(const ac_arch *a);

typedef struct {
    float *in_norm;           /* [H] */
    float *wq, *wk, *wv, *wo; /* [nH*hd,H] [nKV*hd,H] [nKV*hd,H] [H,nH*hd] */
    float *bq, *bk, *bv;      /* biases (qwen2) or NULL */
    float *q_norm, *k_norm;   /* [hd] per-head RMSNorm weights (qk_norm) or NULL */
    float *post_norm;         /* [H] */
    float *wg, *wu, *wd;      /* [F,H] [F,H] [H,F] */
    /* Mixture of experts (n_experts E > 0): the router [E,H] and each
     * expert's gate, up [Fe,H] and down [H,Fe] matrices (the arrays of E
     * pointers owned; the matrices stored as the other matrices are). */
    float *router;
    float **eg, **eu, **ed; /* eg NULL in nemotron_h's experts (no gate) */
    /* nemotron_h MoE: the router's score-correction bias [E] (fp32, used
     * to choose the experts only) and the shared expert's up [Fs,H] and
     * down [H,Fs] matrices (stored as the other matrices are). */
    float *router_bias;
    float *sh_u, *sh_d;
    /* LatentMoE: the latent down [Lt,H] and up [H,Lt] projections around
     * the routed experts (whose matrices are then [Fe,Lt] and [Lt,Fe]). */
    float *lat_down, *lat_up;
    /* Mamba-2 mixer (ssm_heads > 0; its block norm is in_norm): in_proj
     * [2*di+2GN+nh, H] and out_proj [H, di] stored as the other matrices;
     * fp32: the depthwise conv [C][K] and its bias [C] (C = di + 2GN), per
     * head dt_bias, A_log and D [nh], the gated RMSNorm's weight [di]. */
    float *ssm_in, *ssm_out;
    float *conv_w, *conv_b, *dt_bias, *a_log, *ssm_d, *ssm_norm;
} ac_layer_w;

typedef struct {
    ac_arch a;
    float *embed;      /* [V,H] */
    float *final_norm; /* [H] */
    float *lm_head;    /* [V,H]; == embed when tied (not separately owned) */
    ac_layer_w *L;     /* n_layers */
    /* dtype (st_dtype) of embed, lm_head and the seven layer matrices:
     * ST_F32 (0 in a zeroed model means the same) for fp32 weights, or
     * ST_BF16 / ST_F16 for a resident model, whose matrix pointers then hold
     * uint16_t values of that dtype inside the mapped file (read-only; read
     * them through ac_model_wdt and the engine's kernels, never as float),
     * or ST_BF16 with wown for BF16 matrices the model owns
     * (ac_model_to_bf16, ac_model_make_bf16).
     * Norms and biases are always fp32. */
    int wdt;
    int wown;   /* 16-bit matrices owned by the model (ac_model_to_bf16, ac_model_make_bf16,
                 * ac_model_alloc_bf16), in no mapping */
    void *wmap; /* the st_set kept mapped (resident models), owned */
} ac_model;

/* The dtype of the model's matrices: ST_F32 for fp32 weights. */
int ac_model_wdt(const ac_model *m);
/* A whole fp32 copy of src (resident or not) into dst, for what needs
 * fp32 weights of the whole model (a resident base's latency measured in
 * the fp32 CPU table's dtype, ac_measure_latency_in: an F16 checkpoint, or
 * a spec naming fp32; a BF16 base is timed on its mapping by default): the
 * one fp32 copy of the base a pipeline stage may hold; and a BF16 student's
 * fp32 master weights while it is distilled (distill.c). The
 * gate trainers read resident weights in place (the CPU one with
 * ac_trainer_init_frozen, the CUDA plugin converting each tensor on the
 * device); trained weights are fp32. */
int ac_model_to_f32(const ac_model *src, ac_model *dst, ac_err *e);
/* A whole BF16 copy of src into dst, owning its matrices (wown, allocated
 * as BF16: no fp32 buffers on the way): copied
 * from BF16, rounded to nearest even from fp32 (as ac_model_save's BF16
 * export), widened then rounded from F16; norms and biases fp32. What a
 * model is timed on in the BF16 CPU cost table's dtype (measure.c) and the
 * BF16 table's decode probes (costmeasure.c) run on: the engine reads it
 * as it reads a resident BF16 model. */
int ac_model_to_bf16(const ac_model *src, ac_model *dst, ac_err *e);
/* An owned fp32 model's matrices turned to BF16 (wown) in place, one at a
 * time (a BF16 buffer, then the fp32 one freed: at most one matrix more),
 * for a model timed in BF16 and then freed (Minitron's student in
 * measure.c's caller). A BF16 model is left as it is; a resident one is
 * refused. Out of memory: m is freed (zeroed), and -1. */
int ac_model_make_bf16(ac_model *m, ac_err *e);
/* Every norm, bias, conv and per-head vector of m (fp32 in memory)
 * replaced, in place, by the value ac_model_save writes for it in dtype
 * (ST_BF16 or ST_F16: rounded to nearest even and widened back; any other
 * dtype: nothing changes): the final and block norms, the attention biases
 * and QK norms, a Mamba layer's conv weights and bias, dt_bias, A_log, D
 * and gated-norm weight. nemotron_h's router correction bias is left as it
 * is (the export keeps it fp32). Matrices are untouched. A job's students
 * are rounded so when they are finished (pruned, distilled): what the job
 * evaluates and reports is then the model its BF16 export holds. */
void ac_model_round_vectors(ac_model *m, int dtype);
/* A resident model: let the kernel drop the mapped pages from this
 * process's memory now (clean file pages: they are read back from the page
 * cache on the next access), e.g. while a stage works on an fp32 copy. */
void ac_model_drop_pages(const ac_model *m);

/* Load config.json and safetensors weights (any of F32/F16/BF16) as fp32;
 * a path ending in .gguf is read as a GGUF file (gguf.h). */
int ac_model_load(const char *model_dir, ac_model *m, ac_err *e);
/* Load weights resident in their file dtype: when every matrix of the
 * checkpoint is BF16 (or every one F16) and suitably aligned, the matrices
 * stay in the mmap'd safetensors (nothing copied, pages read on demand; norms
 * and biases converted to fp32); otherwise (F32, mixed dtypes, GGUF) the same
 * as ac_model_load. The mapping is read-only: what reads weights as float
 * converts per row or tile (the engine, ac_prune, the CUDA upload, export),
 * what changes them works on activations (masks), on private buffers or on
 * an fp32 copy (ac_model_to_f32; students are trained in fp32). */
int ac_model_load_resident(const char *model_dir, ac_model *m, ac_err *e);
/* The dtype ac_model_load_resident would keep a checkpoint's matrices in
 * (ST_BF16, ST_F16, else ST_F32: also for GGUF and unreadable ones), from
 * the safetensors headers alone. */
int ac_model_checkpoint_wdt(const char *model_dir);
/* Allocate zeroed weights for an arch (for random init and pruning). */
int ac_model_alloc(ac_model *m, const ac_arch *a, ac_err *e);
/* The same with the matrices BF16, owned (wown); norms and biases fp32
 * (ac_prune_bf16's students). */
int ac_model_alloc_bf16(ac_model *m, const ac_arch *a, ac_err *e);
void ac_model_free(ac_model *m);
/* Write config.json + safetensors (dtype F32/F16/BF16) into dir (resident
 * models too: their matrices are converted from wdt). */
int ac_model_save(const ac_model *m, const char *dir, int dtype, ac_err *e);
/* Matrix `which` of layer l and its element count (*n), or NULL when the
 * layer has none (attention or FFN removed). Stored in ac_model_wdt(m):
 * read it as float only when that is ST_F32. */
float *ac_layer_matrix(const ac_model *m, int l, ac_wmat which, size_t *n);

#endif
