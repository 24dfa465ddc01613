/*
 * model.c - config.json parsing (HF llama / mistral / qwen2 / qwen3 and the
 * nemotron-nas heterogeneous form), architecture helpers, weight loading and
 * saving. See model.h for the contract.
 */
#include "format/model.h"
#include "core/fsafe.h"
#include "core/fsafe_write.h"

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>

#ifndef MADV_POPULATE_READ
#define MADV_POPULATE_READ 22 /* Linux 5.14 */
#endif

#include "format/deci.h"
#include "format/gguf.h"
#include "format/safetensors.h"
#include "core/tensor.h"
#include "model_int.h"

/* The largest value each config.json count may take, checked before
 * anything is sized by it (a hostile config must not make the daemon
 * allocate per layer or per head): well above any released model, and the
 * same bounds as ac_arch_from_json's. Keys not listed: 1 << 30. */
static const struct {
    const char *key;
    int max;
} INT_MAX_OF[] = {
    {"num_hidden_layers", 4096},
    {"hidden_size", 1 << 20},
    {"num_attention_heads", 4096},
    {"num_key_value_heads", 4096},
    {"head_dim", 4096},
    {"vocab_size", 1 << 22},
    {"intermediate_size", 1 << 20},
    {"n_heads_in_group", 4096},
    {"max_position_embeddings", 1 << 24},
    {"original_max_position_embeddings", 1 << 24},
    {"mamba_num_heads", 1 << 16},
    {"mamba_head_dim", 4096},
    {"ssm_state_size", 4096},
    {"n_groups", 4096},
    {"conv_kernel", 64},
};

/* The range of each real-valued config.json entry: (lo, hi], finite. */
static const struct {
    const char *key;
    double lo, hi;
} NUM_RANGE_OF[] = {
    {"rope_theta", 0, 1e12}, {"rms_norm_eps", 0, 1},           {"factor", 0, 1e4},
    {"low_freq_factor", 0, 1e4}, {"high_freq_factor", 0, 1e4}, {"ffn_mult", 0, 64},
    {"layer_norm_epsilon", 0, 1},
};

static int get_int(const json_t *o, const char *k, int def, int *out, ac_err *e) {
    json_t *v = json_object_get(o, k);
    if (!v || json_is_null(v)) {
        *out = def;
        return 0;
    }
    if (!json_is_integer(v)) return ac_errf(e, "config.json: %s must be an integer", k);
    json_int_t x = json_integer_value(v), max = 1 << 30;
    for (size_t i = 0; i < sizeof INT_MAX_OF / sizeof *INT_MAX_OF; i++)
        if (!strcmp(k, INT_MAX_OF[i].key)) max = INT_MAX_OF[i].max;
    if (x < 0 || x > max)
        return ac_errf(e, "config.json: %s=%lld is out of range (0 to %lld)", k, (long long)x, (long long)max);
    *out = (int)x;
    return 0;
}

static int get_num(const json_t *o, const char *k, double def, double *out, ac_err *e) {
    json_t *v = json_object_get(o, k);
    if (!v || json_is_null(v)) {
        *out = def;
        return 0;
    }
    if (!json_is_number(v)) return ac_errf(e, "config.json: %s must be a number", k);
    double x = json_number_value(v);
    for (size_t i = 0; i < sizeof NUM_RANGE_OF / sizeof *NUM_RANGE_OF; i++)
        if (!strcmp(k, NUM_RANGE_OF[i].key) && !(x > NUM_RANGE_OF[i].lo && x <= NUM_RANGE_OF[i].hi))
            return ac_errf(e, "config.json: %s=%g must be above %g and at most %g", k, x, NUM_RANGE_OF[i].lo,
                           NUM_RANGE_OF[i].hi);
    if (!isfinite(x)) return ac_errf(e, "config.json: %s must be a finite number", k);
    *out = x;
    return 0;
}

static int first_id(const json_t *v) {
    if (json_is_integer(v)) return (int)json_integer_value(v);
    if (json_is_array(v) && json_array_size(v) > 0 && json_is_integer(json_array_get(v, 0)))
        return (int)json_integer_value(json_array_get(v, 0));
    return -1;
}

static int parse_rope_scaling(const json_t *rs, ac_arch *a, ac_err *e) {
    if (!rs || json_is_null(rs)) return 0;
    if (!json_is_object(rs)) return ac_errf(e, "config.json: rope_scaling must be an object");
    json_t *t = json_object_get(rs, "rope_type");
    if (!t) t = json_object_get(rs, "type");
    const char *ty = json_string_value(t);
    if (!ty || strcmp(ty, "default") == 0) return 0;
    if (strcmp(ty, "llama3") != 0)
        return ac_errf(e, "config.json: rope_scaling type %s is not supported (llama3 or default)", ty);
    double f = 0, lo = 0, hi = 0;
    int orig = 0;
    if (get_num(rs, "factor", 8, &f, e) || get_num(rs, "low_freq_factor", 1, &lo, e) ||
        get_num(rs, "high_freq_factor", 4, &hi, e) || get_int(rs, "original_max_position_embeddings", 8192, &orig, e))
        return -1;
    if (f <= 0 || hi <= lo) return ac_errf(e, "config.json: bad llama3 rope_scaling values");
    a->rope_llama3 = 1;
    a->rs_factor = (float)f;
    a->rs_low = (float)lo;
    a->rs_high = (float)hi;
    a->rs_orig = orig;
    return 0;
}

/* One entry of a nemotron-nas block_configs into L (n_heads/n_kv_heads/ffn
 * preset to the model-wide values nh, nkv and ffn). */
static int deci_block(const json_t *b, int l, int nh, int hidden, ac_layer_arch *L, ac_err *e) {
    json_t *at = json_object_get(b, "attention"), *ff = json_object_get(b, "ffn");
    if (!json_is_object(at) || !json_is_object(ff))
        return ac_errf(e, "config.json: block_configs[%d] needs attention and ffn objects", l);
    if (json_is_true(json_object_get(at, "replace_with_linear")) ||
        json_is_true(json_object_get(ff, "replace_with_linear")))
        return ac_errf(e, "config.json: block_configs[%d]: replace_with_linear is not supported", l);
    if (json_is_true(json_object_get(at, "no_op")))
        L->n_heads = L->n_kv_heads = 0;
    else {
        int g = 0, h = 0;
        if (get_int(at, "n_heads_in_group", 1, &g, e) || get_int(at, "num_attention_heads", nh, &h, e)) return -1;
        if (g <= 0 || h % g)
            return ac_errf(e, "config.json: block_configs[%d]: heads %d not divisible by n_heads_in_group %d", l, h, g);
        L->n_heads = h;
        L->n_kv_heads = h / g;
    }
    if (json_is_true(json_object_get(ff, "no_op")))
        L->ffn = 0;
    else {
        json_t *is = json_object_get(ff, "intermediate_size");
        if (is && !json_is_null(is)) {
            if (get_int(ff, "intermediate_size", 0, &L->ffn, e)) return ac_errctx(e, "block_configs[%d]", l);
        } else {
            double m = 0;
            if (get_num(ff, "ffn_mult", 0, &m, e)) return -1;
            int w = (int)(2 * m * hidden / 3); /* m <= 64, hidden <= 2^20: fits */
            L->ffn = (w + 255) / 256 * 256;
            if (L->ffn > 1 << 20) return ac_errf(e, "config.json: block_configs[%d]: ffn_mult %g too large", l, m);
        }
    }
    return 0;
}

/* a->layers from the model-wide counts, or per layer from block_configs. */
static int config_layers(const json_t *cfg, const char *mt, int deci, int nh, int nkv, int ffn, ac_arch *a, ac_err *e) {
    a->layers = calloc(a->n_layers, sizeof *a->layers);
    if (!a->layers) return ac_errf(e, "out of memory");
    json_t *bc = json_object_get(cfg, "block_configs");
    if (deci && (!json_is_array(bc) || (int)json_array_size(bc) != a->n_layers))
        return ac_errf(e, "config.json: %s needs block_configs with one entry per layer", mt);
    for (int l = 0; l < a->n_layers; l++) {
        ac_layer_arch *L = &a->layers[l];
        *L = (ac_layer_arch){nh, nkv, ffn, 0, 0, 0};
        if (deci && deci_block(json_array_get(bc, l), l, nh, a->hidden, L, e)) return -1;
    }
    for (int l = 0; l < a->n_layers; l++) {
        const ac_layer_arch *L = &a->layers[l];
        if (L->n_heads && (L->n_kv_heads <= 0 || L->n_heads % L->n_kv_heads))
            return ac_errf(e, "config.json: layer %d: %d heads not divisible by %d KV heads", l, L->n_heads,
                           L->n_kv_heads);
        if (!deci && L->ffn <= 0) return ac_errf(e, "config.json: intermediate_size is required");
    }
    return 0;
}

/* Mixture-of-experts layers. qwen3_moe: layer l is MoE when it is not in
 * mlp_only_layers, num_experts > 0 and (l + 1) % decoder_sparse_step == 0
 * (else a dense SwiGLU of intermediate_size); each expert is a SwiGLU of
 * moe_intermediate_size; norm_topk_prob. mixtral: every layer MoE with
 * num_local_experts experts of intermediate_size, top-k always
 * renormalised. Both: num_experts_per_tok experts per token. */
static int config_moe(const json_t *cfg, const char *mt, ac_arch *a, ac_err *e) {
    int q3 = !strcmp(mt, "qwen3_moe"), mx = !strcmp(mt, "mixtral");
    if (!q3 && !mx) return 0;
    int E = 0, k = 0, fe = 0, step = 1;
    if (get_int(cfg, q3 ? "num_experts" : "num_local_experts", 0, &E, e) ||
        get_int(cfg, "num_experts_per_tok", 0, &k, e) ||
        get_int(cfg, q3 ? "moe_intermediate_size" : "intermediate_size", 0, &fe, e) ||
        (q3 && get_int(cfg, "decoder_sparse_step", 1, &step, e)))
        return -1;
    if (E <= 0 || E > 1 << 16) return ac_errf(e, "config.json: %s needs 1..65536 experts (got %d)", mt, E);
    if (k <= 0 || k > E) return ac_errf(e, "config.json: num_experts_per_tok %d must be 1..%d (the experts)", k, E);
    if (fe <= 0 || fe > 1 << 20) return ac_errf(e, "config.json: the expert width %d must be positive", fe);
    if (step <= 0) return ac_errf(e, "config.json: decoder_sparse_step must be positive");
    a->top_k = k;
    a->norm_topk = mx || json_is_true(json_object_get(cfg, "norm_topk_prob"));
    json_t *only = q3 ? json_object_get(cfg, "mlp_only_layers") : NULL;
    if (only && !json_is_null(only) && !json_is_array(only))
        return ac_errf(e, "config.json: mlp_only_layers must be a list of layer indices");
    for (int l = 0; l < a->n_layers; l++) {
        int dense = (l + 1) % step != 0;
        for (size_t i = 0; json_is_array(only) && i < json_array_size(only); i++)
            if (json_integer_value(json_array_get(only, i)) == l) dense = 1;
        if (dense) continue;
        a->layers[l].ffn = 0;
        a->layers[l].n_experts = E;
        a->layers[l].expert_ffn = fe;
    }
    return 0;
}

/* nemotron_h: the layer pattern (hybrid_override_pattern, one character a
 * layer: M Mamba-2, * attention, - MLP; or layers_block_type, a list of
 * "mamba" / "attention" / "mlp") and the Mamba-2 shapes. One mixer a
 * layer: a layer holds attention (heads), an MLP (ffn) or a Mamba-2 mixer
 * (ssm_heads), never two; E ("moe") a mixture of squared-ReLU experts with a
 * shared expert and the sigmoid router (config_hybrid_moe). Newer configs
 * name Mamba and attention layers linear_attention / full_attention. */
static int config_hybrid_moe(const json_t *cfg, ac_arch *a, int *E, int *fe, int *fs, ac_err *e);

/* A layers_block_type entry as the pattern's character ('?' unknown). */
static char block_char(const json_t *v) {
    static const char *names[] = {"mamba", "attention", "mlp", "moe", "linear_attention", "full_attention"},
                      ch[] = "M*-EM*";
    const char *k = json_string_value(v);
    for (int i = 0; k && i < 6; i++)
        if (!strcmp(k, names[i])) return ch[i];
    return '?';
}

/* The multi-token-prediction layers the config names: num_nextn_predict_layers
 * (1 when only a pattern is given) and their blocks, mtp_hybrid_override_pattern
 * or mtp_layers_block_type (left "" when absent or longer than 15). Recorded
 * for ac_arch_mtp_params; never loaded. */
static int config_hybrid_mtp(const json_t *cfg, ac_arch *a, ac_err *e) {
    json_t *mp = json_object_get(cfg, "mtp_hybrid_override_pattern"),
           *mb = json_object_get(cfg, "mtp_layers_block_type");
    int named = json_is_string(mp) || json_is_array(mb);
    if (get_int(cfg, "num_nextn_predict_layers", named, &a->mtp_layers, e)) return -1;
    if (a->mtp_layers > 64) return ac_errf(e, "config.json: num_nextn_predict_layers %d is above 64", a->mtp_layers);
    size_t cap = sizeof a->mtp_pattern - 1;
    if (json_is_string(mp) && strlen(json_string_value(mp)) <= cap)
        snprintf(a->mtp_pattern, sizeof a->mtp_pattern, "%s", json_string_value(mp));
    else if (json_is_array(mb) && json_array_size(mb) <= cap)
        for (size_t i = 0; i < json_array_size(mb); i++) a->mtp_pattern[i] = block_char(json_array_get(mb, i));
    return 0;
}

static int config_hybrid(const json_t *cfg, int nh, int nkv, int ffn, ac_arch *a, ac_err *e) {
    json_t *pat = json_object_get(cfg, "hybrid_override_pattern"), *lbt = json_object_get(cfg, "layers_block_type");
    int n = 0;
    char kinds[4097];
    if (json_is_string(pat)) {
        const char *p = json_string_value(pat);
        if (strlen(p) > 4096) return ac_errf(e, "config.json: hybrid_override_pattern is longer than 4096 layers");
        for (; p[n]; n++) kinds[n] = p[n];
    } else if (json_is_array(lbt) && json_array_size(lbt) <= 4096) {
        for (; n < (int)json_array_size(lbt); n++) kinds[n] = block_char(json_array_get(lbt, n));
    } else
        return ac_errf(e, "config.json: nemotron_h needs hybrid_override_pattern (a string) or layers_block_type");
    if (n == 0) return ac_errf(e, "config.json: nemotron_h's layer pattern is empty");
    if (json_is_integer(json_object_get(cfg, "num_hidden_layers")) && a->n_layers != n)
        return ac_errf(e, "config.json: hybrid_override_pattern has %d layers, num_hidden_layers says %d", n,
                       a->n_layers);
    a->n_layers = n;
    int P = 0, N = 0, G = 0, K = 0, mh = 0;
    json_t *ng = json_object_get(cfg, "n_groups"), *ck = json_object_get(cfg, "conv_kernel");
    if (get_int(cfg, "mamba_num_heads", 0, &mh, e) || get_int(cfg, "mamba_head_dim", 0, &P, e) ||
        get_int(cfg, "ssm_state_size", 0, &N, e) || get_int(cfg, ng ? "n_groups" : "mamba_n_groups", 1, &G, e) ||
        get_int(cfg, ck ? "conv_kernel" : "mamba_d_conv", 4, &K, e))
        return -1;
    const char *act = json_string_value(json_object_get(cfg, "mlp_hidden_act"));
    const char *mact = json_string_value(json_object_get(cfg, "mamba_hidden_act"));
    if (act && strcmp(act, "relu2"))
        return ac_errf(e, "config.json: nemotron_h mlp_hidden_act %s is not supported (relu2)", act);
    if (mact && strcmp(mact, "silu"))
        return ac_errf(e, "config.json: nemotron_h mamba_hidden_act %s is not supported (silu)", mact);
    if (json_is_true(json_object_get(cfg, "use_bias")) || json_is_true(json_object_get(cfg, "mamba_proj_bias")))
        return ac_errf(e, "config.json: nemotron_h in_proj/out_proj biases (use_bias) are not supported");
    int E = 0, fe = 0, fs = 0;
    if (memchr(kinds, 'E', (size_t)n) && config_hybrid_moe(cfg, a, &E, &fe, &fs, e)) return -1;
    if (config_hybrid_mtp(cfg, a, e)) return -1;
    a->layers = calloc(n, sizeof *a->layers);
    if (!a->layers) return ac_errf(e, "out of memory");
    for (int l = 0; l < n; l++) {
        ac_layer_arch *L = &a->layers[l];
        switch (kinds[l]) {
        case 'M': L->ssm_heads = mh; break;
        case '*': L->n_heads = nh, L->n_kv_heads = nkv; break;
        case '-': L->ffn = ffn; break;
        case 'E': L->n_experts = E, L->expert_ffn = fe; break;
        default: return ac_errf(e, "config.json: nemotron_h layer %d has an unknown type", l);
        }
        if (kinds[l] == 'M' && (mh <= 0 || P <= 0 || N <= 0 || G <= 0 || K <= 0 || mh % G))
            return ac_errf(e, "config.json: nemotron_h Mamba layers need mamba_num_heads, mamba_head_dim, "
                              "ssm_state_size > 0 and mamba_num_heads (%d) divisible by n_groups (%d)",
                           mh, G);
        if (kinds[l] == '*' && (nkv <= 0 || nh % nkv))
            return ac_errf(e, "config.json: nemotron_h attention: %d heads not divisible by %d KV heads", nh, nkv);
        if (kinds[l] == '-' && ffn <= 0) return ac_errf(e, "config.json: nemotron_h MLP layers need intermediate_size");
    }
    if (a->qkv_bias) return ac_errf(e, "config.json: nemotron_h attention biases are not supported");
    a->hybrid = 1;
    a->ssm_head_dim = P, a->ssm_state = N, a->ssm_groups = G, a->ssm_conv = K;
    a->ssm_conv_bias = !json_is_false(json_object_get(cfg, "use_conv_bias")) &&
                       !json_is_false(json_object_get(cfg, "mamba_conv_bias"));
    return 0;
}

/* nemotron_h's MoE keys (Hugging Face NemotronHConfig and its defaults):
 * n_routed_experts E, num_experts_per_tok, moe_intermediate_size (each
 * expert), moe_shared_expert_intermediate_size (the shared expert),
 * norm_topk_prob (true), routed_scaling_factor (1), moe_latent_size
 * (LatentMoE; null: none). Refused: group-limited routing (n_group > 1
 * with topk_group < n_group), more than one shared expert (readers
 * disagree on its width), a latent width above the hidden one. */
static int config_hybrid_moe(const json_t *cfg, ac_arch *a, int *E, int *fe, int *fs, ac_err *e) {
    int k = 0, ng = 1, tg = 1, ns = 1, lt = 0;
    double scale = 1;
    json_t *lat = json_object_get(cfg, "moe_latent_size"), *nt = json_object_get(cfg, "norm_topk_prob");
    if (get_int(cfg, "n_routed_experts", 0, E, e) || get_int(cfg, "num_experts_per_tok", 0, &k, e) ||
        get_int(cfg, "moe_intermediate_size", 0, fe, e) ||
        get_int(cfg, "moe_shared_expert_intermediate_size", 0, fs, e) || get_int(cfg, "n_group", 1, &ng, e) ||
        get_int(cfg, "topk_group", 1, &tg, e) || get_int(cfg, "n_shared_experts", 1, &ns, e) ||
        get_num(cfg, "routed_scaling_factor", 1, &scale, e) || get_int(cfg, "moe_latent_size", 0, &lt, e))
        return -1;
    if (*E <= 0 || *E > 1 << 16) return ac_errf(e, "config.json: nemotron_h MoE needs 1..65536 n_routed_experts");
    if (k <= 0 || k > *E)
        return ac_errf(e, "config.json: num_experts_per_tok %d must be 1..%d (n_routed_experts)", k, *E);
    if (*fe <= 0 || *fe > 1 << 20 || *fs <= 0 || *fs > 1 << 20)
        return ac_errf(e, "config.json: nemotron_h MoE needs moe_intermediate_size and "
                          "moe_shared_expert_intermediate_size > 0");
    if (lat && !json_is_null(lat) && (lt <= 0 || lt > a->hidden))
        return ac_errf(e, "config.json: moe_latent_size %d must be 1..hidden_size (%d)", lt, a->hidden);
    if (ng > 1 && tg < ng)
        return ac_errf(e, "config.json: n_group %d with topk_group %d: group-limited expert routing is not supported",
                       ng, tg);
    if (ns != 1) return ac_errf(e, "config.json: n_shared_experts %d: one shared expert is supported", ns);
    if (!(scale > 0)) return ac_errf(e, "config.json: routed_scaling_factor must be positive");
    a->top_k = k;
    a->norm_topk = !nt || json_is_null(nt) || json_is_true(nt);
    a->router_sigmoid = 1;
    a->routed_scale = (float)scale;
    a->shared_ffn = *fs;
    a->moe_latent = lt;
    return 0;
}

/* RoPE base and scaling, biases, the sliding window, BOS/EOS. */
static int config_extras(const json_t *cfg, const char *mt, ac_arch *a, ac_err *e) {
    double theta = 0;
    json_t *rp = json_object_get(cfg, "rope_parameters");
    const json_t *rope_src = json_is_object(rp) ? rp : cfg;
    if (get_num(rope_src, "rope_theta", 10000, &theta, e)) return -1;
    if (json_is_object(rp) && !json_object_get(rp, "rope_theta") && get_num(cfg, "rope_theta", 10000, &theta, e))
        return -1;
    a->rope_theta = (float)theta;
    if (parse_rope_scaling(json_is_object(rp) ? rp : json_object_get(cfg, "rope_scaling"), a, e)) return -1;
    a->tie_embeddings = json_is_true(json_object_get(cfg, "tie_word_embeddings"));
    int qwen3 = !strcmp(mt, "qwen3") || !strcmp(mt, "qwen3_moe"), qwen = qwen3 || !strcmp(mt, "qwen2");
    a->qk_norm = qwen3 || json_is_true(json_object_get(cfg, "qk_norm"));
    if (qwen3 && json_is_true(json_object_get(cfg, "attention_bias")))
        return ac_errf(e, "config.json: qwen3 attention_bias (an o_proj bias) is not supported");
    a->qkv_bias = strcmp(mt, "qwen2") == 0 || json_is_true(json_object_get(cfg, "attention_bias")) ||
                  json_is_true(json_object_get(cfg, "qkv_bias"));
    if (json_is_true(json_object_get(cfg, "mlp_bias"))) return ac_errf(e, "config.json: mlp_bias is not supported");
    json_t *sw = json_object_get(cfg, "sliding_window");
    int use_sw = !qwen ? 1 : json_is_true(json_object_get(cfg, "use_sliding_window"));
    if (sw && !json_is_null(sw) && use_sw) {
        if (!json_is_integer(sw) || json_integer_value(sw) <= 0)
            return ac_errf(e, "config.json: sliding_window must be a positive integer or null");
        a->sliding_window = json_integer_value(sw) > 1 << 30 ? 1 << 30 : (int)json_integer_value(sw);
        if (qwen && json_is_integer(json_object_get(cfg, "max_window_layers")))
            return ac_errf(e, "config.json: %s sliding window with max_window_layers is not supported", mt);
    }
    a->bos_id = first_id(json_object_get(cfg, "bos_token_id"));
    a->eos_id = first_id(json_object_get(cfg, "eos_token_id"));
    return 0;
}

int ac_arch_from_config(const json_t *cfg, ac_arch *a, ac_err *e) {
    memset(a, 0, sizeof *a);
    if (!json_is_object(cfg)) return ac_errf(e, "config.json is not a JSON object");
    const char *mt = json_string_value(json_object_get(cfg, "model_type"));
    if (!mt) return ac_errf(e, "config.json: missing model_type");
    int deci = strcmp(mt, "nemotron-nas") == 0 || strcmp(mt, "deci") == 0, hyb = strcmp(mt, "nemotron_h") == 0;
    if (!deci && !hyb && strcmp(mt, "llama") && strcmp(mt, "mistral") && strcmp(mt, "qwen2") && strcmp(mt, "qwen3") &&
        strcmp(mt, "qwen3_moe") && strcmp(mt, "mixtral"))
        return ac_errf(e,
                       "config.json: model_type %s is not supported (llama, mistral, qwen2, qwen3, qwen3_moe, "
                       "mixtral, nemotron-nas, nemotron_h)",
                       mt);
    snprintf(a->model_type, sizeof a->model_type, "%s", mt);
    int nh = 0, nkv = 0, ffn = 0;
    double eps = 0;
    if (get_int(cfg, "vocab_size", 0, &a->vocab, e) || get_int(cfg, "hidden_size", 0, &a->hidden, e) ||
        get_int(cfg, "num_hidden_layers", 0, &a->n_layers, e) || get_int(cfg, "num_attention_heads", 0, &nh, e) ||
        get_int(cfg, "num_key_value_heads", nh, &nkv, e) || get_int(cfg, "intermediate_size", 0, &ffn, e) ||
        get_int(cfg, "max_position_embeddings", 2048, &a->max_pos, e) ||
        get_num(cfg, hyb ? "layer_norm_epsilon" : "rms_norm_eps", 1e-6, &eps, e))
        return -1;
    if (hyb && !a->n_layers) a->n_layers = 1; /* the pattern's length (config_hybrid) */
    if (!a->vocab || !a->hidden || !a->n_layers || !nh)
        return ac_errf(e, "config.json: vocab_size, hidden_size, num_hidden_layers and num_attention_heads are "
                          "required and > 0");
    if (get_int(cfg, "head_dim", strncmp(mt, "qwen3", 5) ? a->hidden / nh : 128, &a->head_dim, e)) return -1;
    if (a->head_dim <= 0 || a->head_dim % 2)
        return ac_errf(e, "config.json: head_dim %d must be even and > 0", a->head_dim);
    a->eps = (float)eps;
    if (config_extras(cfg, mt, a, e)) return -1;
    if (hyb ? config_hybrid(cfg, nh, nkv, ffn, a, e)
            : (config_layers(cfg, mt, deci, nh, nkv, ffn, a, e) || config_moe(cfg, mt, a, e))) {
        ac_arch_free(a);
        return -1;
    }
    return 0;
}

int ac_arch_load(const char *model_dir, ac_arch *a, ac_err *e) {
    if (ac_gguf_is_path(model_dir)) return ac_gguf_arch(model_dir, a, e);
    char path[4096];
    if (ac_fsafe_join(model_dir, "config.json", path, sizeof path, e)) return -1;
    json_t *cfg = ac_fsafe_json(path, AC_FK_CONFIG, e); /* confined, no bytes echoed */
    if (!cfg) return -1;
    int rc = ac_arch_from_config(cfg, a, e);
    json_decref(cfg);
    return rc;
}

int ac_arch_copy(ac_arch *dst, const ac_arch *src, ac_err *e) {
    *dst = *src;
    dst->layers = malloc(sizeof *dst->layers * src->n_layers);
    if (!dst->layers) return ac_errf(e, "out of memory");
    memcpy(dst->layers, src->layers, sizeof *dst->layers * src->n_layers);
    return 0;
}

void ac_arch_free(ac_arch *a) {
    free(a->layers);
    a->layers = NULL;
}

int ac_arch_is_uniform(const ac_arch *a) {
    for (int l = 0; l < a->n_layers; l++) {
        const ac_layer_arch *L = &a->layers[l], *F = &a->layers[0];
        if (!L->n_heads || (!L->ffn && !L->n_experts) || L->n_heads != F->n_heads || L->n_kv_heads != F->n_kv_heads ||
            L->ffn != F->ffn || L->n_experts != F->n_experts || L->expert_ffn != F->expert_ffn)
            return 0;
    }
    return 1;
}

int ac_arch_is_hybrid(const ac_arch *a) { return a->hybrid != 0; }

int ac_ssm_inner(const ac_arch *a, int l) { return a->layers[l].ssm_heads * a->ssm_head_dim; }

int ac_ssm_conv_dim(const ac_arch *a, int l) {
    return a->layers[l].ssm_heads ? ac_ssm_inner(a, l) + 2 * a->ssm_groups * a->ssm_state : 0;
}

int ac_ssm_in_dim(const ac_arch *a, int l) {
    return a->layers[l].ssm_heads ? ac_ssm_inner(a, l) + ac_ssm_conv_dim(a, l) + a->layers[l].ssm_heads : 0;
}

int ac_arch_has_moe(const ac_arch *a) {
    for (int l = 0; l < a->n_layers; l++)
        if (a->layers[l].n_experts) return 1;
    return 0;
}

/* One layer's parameters (its norm included). */
double ac_arch_layer_params(const ac_arch *a, int l) {
    double H = a->hidden, hd = a->head_dim, p = 0;
    const ac_layer_arch *L = &a->layers[l];
    if (L->n_heads)
        p += H + 2 * H * L->n_heads * hd + 2 * H * L->n_kv_heads * hd +
             (a->qkv_bias ? (L->n_heads + 2 * L->n_kv_heads) * hd : 0) + (a->qk_norm ? 2 * hd : 0);
    if (L->ffn) p += H + (a->hybrid ? 2 : 3) * H * L->ffn; /* nemotron_h's MLP: up, down */
    if (L->ssm_heads) /* norm, in_proj, conv (+ bias), dt_bias, A_log, D, gated norm, out_proj */
        p += H + (double)ac_ssm_in_dim(a, l) * H +
             (double)ac_ssm_conv_dim(a, l) * (a->ssm_conv + (a->ssm_conv_bias ? 1 : 0)) + 3.0 * L->ssm_heads +
             ac_ssm_inner(a, l) + H * (double)ac_ssm_inner(a, l);
    if (L->n_experts) { /* norm, router, experts (nemotron_h: no gate, a correction bias, a shared expert, a
                         * latent projection down and up) */
        double Hin = a->hybrid && a->moe_latent ? a->moe_latent : H;
        p += H + (double)L->n_experts * (H + (a->hybrid ? 2 : 3) * Hin * L->expert_ffn) +
             (a->hybrid ? L->n_experts + 2 * H * a->shared_ffn + (a->moe_latent ? 2 * H * Hin : 0) : 0);
    }
    return p;
}

double ac_arch_params(const ac_arch *a) {
    double p = (double)a->vocab * a->hidden * (a->tie_embeddings ? 1 : 2) + a->hidden;
    for (int l = 0; l < a->n_layers; l++) p += ac_arch_layer_params(a, l);
    return p;
}

double ac_arch_mtp_params(const ac_arch *a) {
    if (!a->hybrid || a->mtp_layers <= 0) return 0;
    if (!a->mtp_pattern[0]) return -1;
    double H = a->hidden, p = 2 * H * H + 3 * H; /* eh_proj [H, 2H]; enorm, hnorm, the final norm */
    for (const char *c = a->mtp_pattern; *c; c++) {
        int l = 0;
        for (; l < a->n_layers; l++) {
            const ac_layer_arch *L = &a->layers[l];
            char t = L->ssm_heads ? 'M' : L->n_heads ? '*' : L->n_experts ? 'E' : L->ffn ? '-' : 0;
            if (t == *c) break;
        }
        if (l == a->n_layers) return -1;
        p += ac_arch_layer_params(a, l);
    }
    return p * a->mtp_layers;
}

json_t *ac_arch_to_json(const ac_arch *a) {
    json_t *layers = json_array();
    for (int l = 0; l < a->n_layers; l++) {
        const ac_layer_arch *L = &a->layers[l];
        json_t *o = json_pack("{s:i,s:i,s:i}", "heads", L->n_heads, "kv_heads", L->n_kv_heads, "ffn", L->ffn);
        if (L->n_experts) {
            json_object_set_new(o, "experts", json_integer(L->n_experts));
            json_object_set_new(o, "expert_ffn", json_integer(L->expert_ffn));
        }
        if (a->hybrid) {
            json_object_set_new(o, "type", json_string(L->ssm_heads     ? "mamba"
                                                       : L->n_heads   ? "attention"
                                                       : L->n_experts ? "moe"
                                                       : L->ffn       ? "mlp"
                                                                      : "removed"));
            if (L->ssm_heads) json_object_set_new(o, "ssm_heads", json_integer(L->ssm_heads));
            if (L->n_experts) json_object_set_new(o, "shared_ffn", json_integer(a->shared_ffn));
        }
        json_array_append_new(layers, o);
    }
    json_t *j = json_pack("{s:i,s:i,s:i,s:o,s:f}", "hidden", a->hidden, "head_dim", a->head_dim, "vocab", a->vocab,
                          "layers", layers, "params", ac_arch_params(a));
    if (ac_arch_has_moe(a)) json_object_set_new(j, "top_k", json_integer(a->top_k));
    if (a->hybrid) json_object_set_new(j, "ssm_head_dim", json_integer(a->ssm_head_dim)); /* model-wide */
    if (a->hybrid && a->moe_latent) json_object_set_new(j, "moe_latent", json_integer(a->moe_latent));
    return j;
}

int ac_arch_from_json(const json_t *j, const ac_arch *base, ac_arch *out, ac_err *e) {
    if (!json_is_object(j)) return ac_errf(e, "architecture must be an object");
    json_t *layers = json_object_get(j, "layers");
    if (!json_is_array(layers) || json_array_size(layers) == 0 || json_array_size(layers) > 4096)
        return ac_errf(e, "architecture.layers must be a non-empty array");
    *out = *base;
    out->n_layers = (int)json_array_size(layers);
    out->layers = calloc(out->n_layers, sizeof *out->layers);
    if (!out->layers) return ac_errf(e, "out of memory");
    json_t *h = json_object_get(j, "hidden"), *hd = json_object_get(j, "head_dim"), *v = json_object_get(j, "vocab");
    if (h) {
        if (!json_is_integer(h) || json_integer_value(h) <= 0 || json_integer_value(h) > 1 << 20) goto bad;
        out->hidden = (int)json_integer_value(h);
    }
    if (hd) {
        if (!json_is_integer(hd) || json_integer_value(hd) <= 0 || json_integer_value(hd) > 4096) goto bad;
        out->head_dim = (int)json_integer_value(hd);
    }
    if (v) {
        if (!json_is_integer(v) || json_integer_value(v) <= 0 || json_integer_value(v) > 1 << 22) goto bad;
        out->vocab = (int)json_integer_value(v);
    }
    json_t *sd = json_object_get(j, "ssm_head_dim"); /* nemotron_h: Mamba heads' width, model-wide */
    if (sd) {
        if (!json_is_integer(sd) || !base->hybrid || json_integer_value(sd) <= 0 || json_integer_value(sd) > 4096)
            goto bad;
        out->ssm_head_dim = (int)json_integer_value(sd);
    }
    json_t *ml = json_object_get(j, "moe_latent"); /* LatentMoE: the experts' latent width, model-wide */
    if (ml) {
        if (!json_is_integer(ml) || !base->moe_latent || json_integer_value(ml) <= 0 || json_integer_value(ml) > 1 << 20)
            goto bad;
        out->moe_latent = (int)json_integer_value(ml);
    }
    json_t *tk = json_object_get(j, "top_k"); /* experts each token is routed to (mixture-of-experts layers) */
    if (tk) {
        if (!json_is_integer(tk) || json_integer_value(tk) <= 0 || json_integer_value(tk) > 1 << 16) goto bad;
        out->top_k = (int)json_integer_value(tk);
    }
    int moe_base = ac_arch_has_moe(base), any_moe = 0, sh_seen = 0;
    for (int l = 0; l < out->n_layers; l++) {
        json_t *L = json_array_get(layers, l);
        json_t *a = json_object_get(L, "heads"), *k = json_object_get(L, "kv_heads"), *f = json_object_get(L, "ffn");
        if (!json_is_integer(a) || !json_is_integer(k) || !json_is_integer(f)) goto bad;
        json_int_t ai = json_integer_value(a), ki = json_integer_value(k), fi = json_integer_value(f);
        if (ai < 0 || ki < 0 || fi < 0 || ai > 4096 || fi > 1 << 20 || (ai && (ki == 0 || ai % ki))) goto bad;
        json_t *xe = json_object_get(L, "experts"), *xf = json_object_get(L, "expert_ffn");
        json_int_t ei = json_is_integer(xe) ? json_integer_value(xe) : 0,
                   ef = json_is_integer(xf) ? json_integer_value(xf) : 0;
        if (ei < 0 || ei > 1 << 16 || ef < 0 || ef > 1 << 20 || (ei && (!ef || ei < out->top_k || fi))) goto bad;
        json_t *xs = json_object_get(L, "ssm_heads");
        json_int_t si = json_is_integer(xs) ? json_integer_value(xs) : 0;
        if (si < 0 || si > 1 << 16 || (si && (!base->hybrid || si % base->ssm_groups))) goto bad;
        out->layers[l] = (ac_layer_arch){(int)ai, ai ? (int)ki : 0, (int)fi, (int)ei, ei ? (int)ef : 0, (int)si};
        json_t *xsf = json_object_get(L, "shared_ffn"); /* nemotron_h: the shared expert's width, model-wide */
        if (xsf && ei) {
            json_int_t sf = json_is_integer(xsf) ? json_integer_value(xsf) : -1;
            if (!base->hybrid || sf < 0 || sf > 1 << 20 || (sh_seen++ && sf != out->shared_ffn)) goto bad;
            out->shared_ffn = (int)sf;
        }
        any_moe |= ei > 0;
    }
    if (any_moe && base->n_layers > 0 && !moe_base) {
        free(out->layers);
        out->layers = NULL;
        return ac_errf(e, "architecture: experts named for a dense model (it has no mixture-of-experts layers)");
    }
    if (any_moe && out->top_k <= 0) goto bad;
    if (!any_moe) out->top_k = 0, out->norm_topk = 0;
    return 0;
bad:
    free(out->layers);
    out->layers = NULL;
    return ac_errf(e, "architecture: each layer needs integer heads, kv_heads, ffn >= 0 with heads divisible by "
                      "kv_heads (and, for a mixture of experts, top_k >= 1, experts >= top_k with expert_ffn > 0 and "
                      "ffn 0); hidden/head_dim/vocab positive; ssm_head_dim (nemotron_h only) positive; "
                      "shared_ffn (nemotron_h MoE layers) one value >= 0 for every MoE layer; moe_latent (LatentMoE "
                      "only) positive");
}

/* nemotron_h's config: the pattern from each layer's mixer, one width per
 * layer type (the first layer's of that type; ac_model_save refuses a
 * hybrid whose layers of one type differ). */
static json_t *hybrid_config(const ac_arch *a) {
    int nh = 0, nkv = 0, ffn = 0, mh = 0;
    const ac_layer_arch *moe = NULL;
    char *pat = malloc((size_t)a->n_layers + 1);
    for (int l = 0; pat && l < a->n_layers; l++) {
        const ac_layer_arch *L = &a->layers[l];
        pat[l] = L->ssm_heads ? 'M' : L->n_heads ? '*' : L->n_experts ? 'E' : '-';
        if (L->n_experts && !moe) moe = L;
        if (L->ssm_heads && !mh) mh = L->ssm_heads;
        if (L->n_heads && !nh) nh = L->n_heads, nkv = L->n_kv_heads;
        if (L->ffn && !ffn) ffn = L->ffn;
    }
    if (pat) pat[a->n_layers] = 0;
    json_t *c = json_object();
    json_object_set_new(c, "architectures", json_pack("[s]", "NemotronHForCausalLM"));
    json_object_set_new(c, "model_type", json_string("nemotron_h"));
    json_object_set_new(c, "vocab_size", json_integer(a->vocab));
    json_object_set_new(c, "hidden_size", json_integer(a->hidden));
    json_object_set_new(c, "num_hidden_layers", json_integer(a->n_layers));
    json_object_set_new(c, "hybrid_override_pattern", json_string(pat ? pat : ""));
    json_object_set_new(c, "num_attention_heads", json_integer(nh ? nh : 1));
    json_object_set_new(c, "num_key_value_heads", json_integer(nkv ? nkv : 1));
    json_object_set_new(c, "head_dim", json_integer(a->head_dim));
    json_object_set_new(c, "intermediate_size", json_integer(ffn));
    json_object_set_new(c, "mlp_hidden_act", json_string("relu2"));
    json_object_set_new(c, "mamba_hidden_act", json_string("silu"));
    json_object_set_new(c, "mamba_num_heads", json_integer(mh));
    json_object_set_new(c, "mamba_head_dim", json_integer(a->ssm_head_dim));
    json_object_set_new(c, "ssm_state_size", json_integer(a->ssm_state));
    json_object_set_new(c, "n_groups", json_integer(a->ssm_groups));
    json_object_set_new(c, "conv_kernel", json_integer(a->ssm_conv));
    json_object_set_new(c, "use_conv_bias", json_boolean(a->ssm_conv_bias));
    if (moe) { /* the MoE layers' one shape */
        json_object_set_new(c, "n_routed_experts", json_integer(moe->n_experts));
        json_object_set_new(c, "num_experts_per_tok", json_integer(a->top_k));
        json_object_set_new(c, "moe_intermediate_size", json_integer(moe->expert_ffn));
        json_object_set_new(c, "moe_shared_expert_intermediate_size", json_integer(a->shared_ffn));
        json_object_set_new(c, "n_shared_experts", json_integer(1));
        json_object_set_new(c, "norm_topk_prob", json_boolean(a->norm_topk));
        json_object_set_new(c, "routed_scaling_factor", json_real(a->routed_scale));
        json_object_set_new(c, "n_group", json_integer(1));
        json_object_set_new(c, "topk_group", json_integer(1));
        json_object_set_new(c, "moe_latent_size", a->moe_latent ? json_integer(a->moe_latent) : json_null());
    }
    json_object_set_new(c, "use_bias", json_false());
    json_object_set_new(c, "mlp_bias", json_false());
    json_object_set_new(c, "attention_bias", json_false());
    json_object_set_new(c, "layer_norm_epsilon", json_real(a->eps));
    json_object_set_new(c, "max_position_embeddings", json_integer(a->max_pos));
    json_object_set_new(c, "tie_word_embeddings", json_boolean(a->tie_embeddings));
    json_object_set_new(c, "torch_dtype", json_string("bfloat16"));
    if (a->bos_id >= 0) json_object_set_new(c, "bos_token_id", json_integer(a->bos_id));
    if (a->eos_id >= 0) json_object_set_new(c, "eos_token_id", json_integer(a->eos_id));
    free(pat);
    return c;
}

json_t *ac_arch_to_config(const ac_arch *a) {
    if (a->hybrid) return hybrid_config(a);
    int nh = 0, nkv = 0, ffn = 0;
    for (int l = 0; l < a->n_layers; l++) {
        if (a->layers[l].n_heads > nh) {
            nh = a->layers[l].n_heads;
            nkv = a->layers[l].n_kv_heads;
        }
        if (a->layers[l].ffn > ffn) ffn = a->layers[l].ffn;
    }
    int uni = ac_arch_is_uniform(a);
    json_t *c = json_object();
    /* a uniform model with a sliding window stays a Mistral: Llama has none */
    /* q/k/v biases without an o_proj bias are Qwen2's (Llama's attention_bias
     * also means an o_proj bias, which we do not have) */
    const char *arch_name = !uni                ? "DeciLMForCausalLM"
                            : a->qk_norm        ? "Qwen3ForCausalLM"
                            : a->qkv_bias       ? "Qwen2ForCausalLM"
                            : a->sliding_window ? "MistralForCausalLM"
                                                : "LlamaForCausalLM";
    const char *type = !uni                ? "nemotron-nas"
                       : a->qk_norm        ? "qwen3"
                       : a->qkv_bias       ? "qwen2"
                       : a->sliding_window ? "mistral"
                                           : "llama";
    int moe = ac_arch_has_moe(a), mixtral = moe && !a->qk_norm;
    if (moe) { /* the family's own config (one expert count and width, as its loaders read) */
        arch_name = mixtral ? "MixtralForCausalLM" : "Qwen3MoeForCausalLM";
        type = mixtral ? "mixtral" : "qwen3_moe";
    }
    json_object_set_new(c, "architectures", json_pack("[s]", arch_name));
    json_object_set_new(c, "model_type", json_string(type));
    json_object_set_new(c, "vocab_size", json_integer(a->vocab));
    json_object_set_new(c, "hidden_size", json_integer(a->hidden));
    json_object_set_new(c, "num_hidden_layers", json_integer(a->n_layers));
    json_object_set_new(c, "num_attention_heads", json_integer(nh ? nh : 1));
    json_object_set_new(c, "num_key_value_heads", json_integer(nkv ? nkv : 1));
    json_object_set_new(c, "head_dim", json_integer(a->head_dim));
    json_object_set_new(c, "intermediate_size", json_integer(ffn));
    json_object_set_new(c, "max_position_embeddings", json_integer(a->max_pos));
    json_object_set_new(c, "rms_norm_eps", json_real(a->eps));
    json_object_set_new(c, "rope_theta", json_real(a->rope_theta));
    if (a->rope_llama3)
        json_object_set_new(c, "rope_scaling",
                            json_pack("{s:s,s:f,s:f,s:f,s:i}", "rope_type", "llama3", "factor", (double)a->rs_factor,
                                      "low_freq_factor", (double)a->rs_low, "high_freq_factor", (double)a->rs_high,
                                      "original_max_position_embeddings", a->rs_orig));
    else
        json_object_set_new(c, "rope_scaling", json_null());
    json_object_set_new(c, "tie_word_embeddings", json_boolean(a->tie_embeddings));
    json_object_set_new(c, "attention_bias", json_boolean(a->qkv_bias));
    json_object_set_new(c, "mlp_bias", json_false());
    json_object_set_new(c, "hidden_act", json_string("silu"));
    json_object_set_new(c, "torch_dtype", json_string("bfloat16"));
    if (a->sliding_window) json_object_set_new(c, "sliding_window", json_integer(a->sliding_window));
    if (a->sliding_window && uni && (a->qkv_bias || a->qk_norm))
        json_object_set_new(c, "use_sliding_window", json_true());
    if (uni && a->qkv_bias) json_object_set_new(c, "attention_bias", json_false()); /* implied by qwen2 */
    if (!uni && a->qk_norm) json_object_set_new(c, "qk_norm", json_true());
    if (a->bos_id >= 0) json_object_set_new(c, "bos_token_id", json_integer(a->bos_id));
    if (a->eos_id >= 0) json_object_set_new(c, "eos_token_id", json_integer(a->eos_id));
    if (moe) {
        int E = 0, fe = 0;
        json_t *only = json_array();
        for (int l = 0; l < a->n_layers; l++)
            if (a->layers[l].n_experts && !E)
                E = a->layers[l].n_experts, fe = a->layers[l].expert_ffn;
            else if (!a->layers[l].n_experts)
                json_array_append_new(only, json_integer(l));
        json_object_set_new(c, "num_experts_per_tok", json_integer(a->top_k));
        if (mixtral) {
            json_object_set_new(c, "num_local_experts", json_integer(E));
            json_object_set_new(c, "intermediate_size", json_integer(fe));
            json_decref(only);
        } else {
            json_object_set_new(c, "num_experts", json_integer(E));
            json_object_set_new(c, "moe_intermediate_size", json_integer(fe));
            json_object_set_new(c, "norm_topk_prob", json_boolean(a->norm_topk));
            json_object_set_new(c, "decoder_sparse_step", json_integer(1));
            json_object_set_new(c, "mlp_only_layers", only);
            if (!ffn) json_object_set_new(c, "intermediate_size", json_integer(fe));
        }
        return c;
    }
    ac_err de;
    if (!uni && !a->qk_norm && ac_deci_fill_config(c, a, &de) == 0)
        return c; /* what vLLM / TRT-LLM / Transformers load */
    if (!uni) {   /* our own loader's form: per-block head counts and widths the deci loaders cannot read */
        json_t *bc = json_array();
        for (int l = 0; l < a->n_layers; l++) {
            const ac_layer_arch *L = &a->layers[l];
            json_t *at = L->n_heads
                             ? json_pack("{s:i,s:b,s:b,s:i}", "n_heads_in_group", L->n_heads / L->n_kv_heads, "no_op",
                                         0, "replace_with_linear", 0, "num_attention_heads", L->n_heads)
                             : json_pack("{s:n,s:b,s:b}", "n_heads_in_group", "no_op", 1, "replace_with_linear", 0);
            json_t *ff = L->ffn ? json_pack("{s:f,s:b,s:b,s:i}", "ffn_mult", 1.5 * L->ffn / a->hidden, "no_op", 0,
                                            "replace_with_linear", 0, "intermediate_size", L->ffn)
                                : json_pack("{s:n,s:b,s:b}", "ffn_mult", "no_op", 1, "replace_with_linear", 0);
            json_array_append_new(bc, json_pack("{s:o,s:o}", "attention", at, "ffn", ff));
        }
        json_object_set_new(c, "block_configs", bc);
    }
    return c;
}

/* ---- weights ---- */

/* Hugging Face names of a MoE layer's tensors (after "model.layers.N."):
 * the router, and the expert matrices as formats with the expert index. */
typedef struct {
    const char *router, *g, *u, *d;
} moe_names;
static moe_names moe_names_of(const ac_arch *a) {
    if (a->qk_norm) /* Qwen3-MoE */
        return (moe_names){"mlp.gate.weight", "mlp.experts.%d.gate_proj.weight", "mlp.experts.%d.up_proj.weight",
                           "mlp.experts.%d.down_proj.weight"};
    return (moe_names){"block_sparse_moe.gate.weight", "block_sparse_moe.experts.%d.w1.weight", /* Mixtral */
                       "block_sparse_moe.experts.%d.w3.weight", "block_sparse_moe.experts.%d.w2.weight"};
}

/* The dtype every 2-D tensor of the set shares when it is BF16 or F16 and
 * each is 2-byte aligned (matrices can then stay in the mapping); else F32. */
static int matrix_dtype(const st_set *s) {
    int dt = -1;
    for (int f = 0; f < s->n; f++)
        for (int i = 0; i < s->files[f].n; i++) {
            const st_tensor *t = &s->files[f].t[i];
            if (t->ndim != 2) continue;
            if ((dt >= 0 && (int)t->dtype != dt) || ((uintptr_t)t->data & 1)) return ST_F32;
            dt = (int)t->dtype;
        }
    return dt == ST_BF16 || dt == ST_F16 ? dt : ST_F32;
}

int ac_model_checkpoint_wdt(const char *model_dir) {
    st_set s;
    ac_err e;
    if (ac_gguf_is_path(model_dir) || st_set_open(model_dir, &s, &e)) return ST_F32;
    int dt = matrix_dtype(&s);
    st_set_close(&s);
    return dt;
}

/* A tensor of shape [d0] (d1 == 0) or [d0,d1] as fp32 (malloc'd), or, when
 * keep is BF16/F16 and the tensor is 2-D, the mapped data itself. */
static float *load_tensor(const st_set *s, const char *name, int64_t d0, int64_t d1, int keep, ac_err *e) {
    const st_tensor *t = st_set_find(s, name);
    if (!t) {
        ac_errf(e, "missing tensor %s", name);
        return NULL;
    }
    int64_t want = d1 ? d0 * d1 : d0;
    int ok = d1 ? (t->ndim == 2 && t->shape[0] == d0 && t->shape[1] == d1) : (t->ndim == 1 && t->shape[0] == d0);
    if (!ok) {
        ac_errf(e, "tensor %s has shape [%lld%s%lld], expected [%lld,%lld]", name,
                t->ndim ? (long long)t->shape[0] : 0LL, t->ndim > 1 ? "," : "",
                t->ndim > 1 ? (long long)t->shape[1] : 0LL, (long long)d0, (long long)d1);
        return NULL;
    }
    if (d1 && keep != ST_F32) return (float *)(uintptr_t)t->data; /* resident: stays in the mapping */
    float *p = malloc(sizeof(float) * (size_t)want);
    if (!p) {
        ac_errf(e, "out of memory loading %s", name);
        return NULL;
    }
    if (ac_to_f32(p, t->data, t->dtype, (size_t)want, e)) {
        free(p);
        ac_errctx(e, "%s", name);
        return NULL;
    }
    return p;
}

/* A depthwise conv's weight [C,1,K] (or [C,K]) as fp32 [C][K] (malloc'd). */
static float *load_conv(const st_set *s, const char *name, int64_t C, int64_t K, ac_err *e) {
    const st_tensor *t = st_set_find(s, name);
    if (!t) {
        ac_errf(e, "missing tensor %s", name);
        return NULL;
    }
    if (!((t->ndim == 3 && t->shape[0] == C && t->shape[1] == 1 && t->shape[2] == K) ||
          (t->ndim == 2 && t->shape[0] == C && t->shape[1] == K))) {
        ac_errf(e, "tensor %s must have shape [%lld,1,%lld]", name, (long long)C, (long long)K);
        return NULL;
    }
    float *p = malloc(sizeof(float) * (size_t)(C * K));
    if (!p) {
        ac_errf(e, "out of memory loading %s", name);
        return NULL;
    }
    if (ac_to_f32(p, t->data, t->dtype, (size_t)(C * K), e)) {
        free(p);
        ac_errctx(e, "%s", name);
        return NULL;
    }
    return p;
}

int ac_model_wdt(const ac_model *m) { return m->wdt == ST_BF16 || m->wdt == ST_F16 ? m->wdt : ST_F32; }

/* The seven matrix slots of a layer (q, k, v, o, g, u, d) and their sizes. */
static void layer_slots(const ac_arch *a, int l, ac_layer_w *w, float **ps[7], size_t n[7]) {
    const ac_layer_arch *L = &a->layers[l];
    size_t H = a->hidden, Q = (size_t)L->n_heads * a->head_dim, KV = (size_t)L->n_kv_heads * a->head_dim, F = L->ffn;
    float **p[7] = {&w->wq, &w->wk, &w->wv, &w->wo, &w->wg, &w->wu, &w->wd};
    size_t c[7] = {Q * H, KV * H, KV * H, H * Q, F * H, F * H, H * F};
    memcpy(ps, p, sizeof p);
    memcpy(n, c, sizeof c);
}

static int model_alloc(ac_model *m, const ac_arch *a, int bf16, ac_err *e);

/* A whole copy of src with its matrices in fp32 or (bf16) BF16, owned by
 * dst (allocated in that dtype: no fp32 buffers for a BF16 copy; BF16
 * copied, fp32 rounded to nearest even, F16 widened then rounded:
 * ac_convert); norms and biases fp32. */
static int model_copy(const ac_model *src, ac_model *dst, int bf16, ac_err *e) {
    const ac_arch *a = &src->a;
    if (model_alloc(dst, a, bf16, e)) return -1;
    size_t H = a->hidden, V = a->vocab;
    st_dtype wdt = (st_dtype)ac_model_wdt(src), ddt = bf16 ? ST_BF16 : ST_F32;
    const void *sm[2] = {src->embed, a->tie_embeddings ? NULL : src->lm_head};
    void *dm[2] = {dst->embed, dst->lm_head};
    for (int i = 0; i < 2; i++)
        if (sm[i]) ac_convert(dm[i], ddt, sm[i], wdt, V * H, NULL);
    memcpy(dst->final_norm, src->final_norm, H * sizeof(float));
    for (int l = 0; l < a->n_layers; l++) {
        const ac_layer_arch *L = &a->layers[l];
        ac_layer_w *s = (ac_layer_w *)&src->L[l], *d = &dst->L[l]; /* read only */
        size_t Q = (size_t)L->n_heads * a->head_dim, KV = (size_t)L->n_kv_heads * a->head_dim;
        float **ps[7], **pd[7];
        size_t n[7];
        layer_slots(a, l, s, ps, n);
        layer_slots(a, l, d, pd, n);
        for (int i = 0; i < 7; i++)
            if (*ps[i] && *pd[i] && n[i]) ac_convert(*pd[i], ddt, *ps[i], wdt, n[i], NULL);
        if (L->n_experts) { /* the router and every expert's matrices (LatentMoE: on the latent width) */
            size_t E = L->n_experts, Fe = L->expert_ffn, Hin = a->hybrid && a->moe_latent ? (size_t)a->moe_latent : H;
            ac_convert(d->router, ddt, s->router, wdt, E * H, NULL);
            for (size_t x = 0; x < E; x++) {
                if (s->eg[x]) ac_convert(d->eg[x], ddt, s->eg[x], wdt, Fe * H, NULL);
                ac_convert(d->eu[x], ddt, s->eu[x], wdt, Fe * Hin, NULL);
                ac_convert(d->ed[x], ddt, s->ed[x], wdt, Hin * Fe, NULL);
            }
            if (s->lat_down) {
                ac_convert(d->lat_down, ddt, s->lat_down, wdt, Hin * H, NULL);
                ac_convert(d->lat_up, ddt, s->lat_up, wdt, H * Hin, NULL);
            }
            if (s->router_bias) memcpy(d->router_bias, s->router_bias, E * sizeof(float));
            if (a->shared_ffn) { /* nemotron_h's shared expert */
                ac_convert(d->sh_u, ddt, s->sh_u, wdt, (size_t)a->shared_ffn * H, NULL);
                ac_convert(d->sh_d, ddt, s->sh_d, wdt, H * a->shared_ffn, NULL);
            }
        }
        if (L->ssm_heads) { /* Mamba-2: in_proj, out_proj; the fp32 conv and per-head vectors */
            size_t di = ac_ssm_inner(a, l), C = ac_ssm_conv_dim(a, l), nh = L->ssm_heads;
            ac_convert(d->ssm_in, ddt, s->ssm_in, wdt, (size_t)ac_ssm_in_dim(a, l) * H, NULL);
            ac_convert(d->ssm_out, ddt, s->ssm_out, wdt, H * di, NULL);
            const float *sm2[6] = {s->conv_w, s->conv_b, s->dt_bias, s->a_log, s->ssm_d, s->ssm_norm};
            float *dm2[6] = {d->conv_w, d->conv_b, d->dt_bias, d->a_log, d->ssm_d, d->ssm_norm};
            size_t nm2[6] = {C * a->ssm_conv, C, nh, nh, nh, di};
            for (int i = 0; i < 6; i++)
                if (sm2[i] && dm2[i]) memcpy(dm2[i], sm2[i], nm2[i] * sizeof(float));
        }
        const float *sv[7] = {s->in_norm, s->post_norm, s->bq, s->bk, s->bv, s->q_norm, s->k_norm};
        float *dv[7] = {d->in_norm, d->post_norm, d->bq, d->bk, d->bv, d->q_norm, d->k_norm};
        size_t nv[7] = {L->n_heads || L->ssm_heads ? H : 0, L->ffn || L->n_experts ? H : 0, Q, KV, KV,
                        (size_t)a->head_dim, (size_t)a->head_dim};
        for (int i = 0; i < 7; i++)
            if (sv[i] && dv[i]) memcpy(dv[i], sv[i], nv[i] * sizeof(float));
    }
    return 0;
}

/* *p (n floats, malloc'd) replaced by its BF16 rounding; 0 when out of memory (*p kept). */
static int to_bf16_slot(float **p, size_t n) {
    if (!*p || !n) return 1;
    uint16_t *b = malloc(n * 2);
    if (!b) return 0;
    ac_from_f32(b, *p, ST_BF16, n, NULL);
    free(*p);
    *p = (float *)b;
    return 1;
}

/* fn on one slot when it holds a matrix. */
static int visit(ac_matrix_fn fn, void *ud, float **slot, size_t n) { return *slot && n ? fn(ud, slot, n) : 0; }

int ac_model_each_matrix(ac_model *m, ac_matrix_fn fn, void *ud) {
    const ac_arch *a = &m->a;
    size_t H = a->hidden, V = a->vocab;
    int tied = m->lm_head == m->embed, rc = visit(fn, ud, &m->embed, V * H);
    if (tied) m->lm_head = m->embed;
    if (rc || (!tied && (rc = visit(fn, ud, &m->lm_head, V * H)))) return rc;
    for (int l = 0; l < a->n_layers; l++) {
        float **ps[7];
        ac_layer_w *w = &m->L[l];
        size_t Hin = a->hybrid && a->moe_latent ? (size_t)a->moe_latent : H, Fs = a->hybrid ? (size_t)a->shared_ffn : 0;
        size_t n[7], E = a->layers[l].n_experts, ne = (size_t)a->layers[l].expert_ffn * Hin;
        layer_slots(a, l, w, ps, n);
        for (int i = 0; i < 7; i++)
            if ((rc = visit(fn, ud, ps[i], n[i]))) return rc;
        if (E && (rc = visit(fn, ud, &w->router, E * H))) return rc; /* mixture of experts: router and experts */
        for (size_t x = 0; x < E; x++) /* (nemotron_h's have no gate: a NULL slot, passed over) */
            if ((rc = visit(fn, ud, &w->eg[x], ne)) || (rc = visit(fn, ud, &w->eu[x], ne)) ||
                (rc = visit(fn, ud, &w->ed[x], ne)))
                return rc;
        /* nemotron_h: the Mamba projections, the shared expert, LatentMoE's projections (the conv, the per-head
         * vectors and the correction bias stay fp32) */
        if (a->layers[l].ssm_heads && ((rc = visit(fn, ud, &w->ssm_in, (size_t)ac_ssm_in_dim(a, l) * H)) ||
                                       (rc = visit(fn, ud, &w->ssm_out, H * (size_t)ac_ssm_inner(a, l)))))
            return rc;
        if (E && a->hybrid &&
            ((rc = visit(fn, ud, &w->sh_u, Fs * H)) || (rc = visit(fn, ud, &w->sh_d, H * Fs)) ||
             (rc = visit(fn, ud, &w->lat_down, Hin * H)) || (rc = visit(fn, ud, &w->lat_up, H * Hin))))
            return rc;
    }
    return 0;
}

static int bf16_slot_fn(void *ud, float **p, size_t n) {
    (void)ud;
    return to_bf16_slot(p, n) ? 0 : -1;
}

int ac_model_make_bf16(ac_model *m, ac_err *e) {
    if (ac_model_wdt(m) == ST_BF16) return 0;
    if (ac_model_wdt(m) != ST_F32 || m->wmap) return ac_errf(e, "ac_model_make_bf16: an owned fp32 model only");
    /* every matrix in turn: a BF16 buffer, then the fp32 one freed; from the
     * first, the model owns 16-bit matrices (freeing frees either kind) */
    m->wdt = ST_BF16;
    m->wown = 1;
    if (ac_model_each_matrix(m, bf16_slot_fn, NULL) == 0) return 0;
    ac_model_free(m); /* fp32 and BF16 matrices mixed: nothing may read it */
    return ac_errf(e, "out of memory converting the model to BF16 (the model is freed)");
}

/* v[0..n) replaced by the values dtype (BF16 or F16) stores for them. */
static void round_vector(float *v, size_t n, int dtype) {
    for (size_t i = 0; v && i < n; i++)
        v[i] = dtype == ST_F16 ? ac_f16_to_f32(ac_f32_to_f16(v[i])) : ac_bf16_to_f32(ac_f32_to_bf16(v[i]));
}

void ac_model_round_vectors(ac_model *m, int dtype) {
    if (dtype != ST_BF16 && dtype != ST_F16) return;
    const ac_arch *a = &m->a;
    size_t H = a->hidden, hd = a->head_dim;
    round_vector(m->final_norm, H, dtype);
    for (int l = 0; m->L && l < a->n_layers; l++) {
        const ac_layer_arch *L = &a->layers[l];
        ac_layer_w *w = &m->L[l];
        size_t Q = (size_t)L->n_heads * hd, KV = (size_t)L->n_kv_heads * hd;
        /* the sizes model_copy copies (the correction bias, which the export keeps fp32, left out) */
        float *v[7] = {w->in_norm, w->post_norm, w->bq, w->bk, w->bv, w->q_norm, w->k_norm};
        size_t nv[7] = {L->n_heads || L->ssm_heads ? H : 0, L->ffn || L->n_experts ? H : 0, Q, KV, KV, hd, hd};
        for (int i = 0; i < 7; i++) round_vector(v[i], nv[i], dtype);
        if (L->ssm_heads) {
            size_t di = ac_ssm_inner(a, l), C = ac_ssm_conv_dim(a, l), nh = L->ssm_heads;
            float *s[6] = {w->conv_w, w->conv_b, w->dt_bias, w->a_log, w->ssm_d, w->ssm_norm};
            size_t ns[6] = {C * a->ssm_conv, C, nh, nh, nh, di};
            for (int i = 0; i < 6; i++) round_vector(s[i], ns[i], dtype);
        }
    }
}

int ac_model_to_f32(const ac_model *src, ac_model *dst, ac_err *e) { return model_copy(src, dst, 0, e); }

int ac_model_to_bf16(const ac_model *src, ac_model *dst, ac_err *e) { return model_copy(src, dst, 1, e); }

void ac_model_drop_pages(const ac_model *m) {
    st_set *s = m->wmap;
    for (int f = 0; s && f < s->n; f++)
        if (s->files[f].map) madvise(s->files[f].map, s->files[f].map_len, MADV_DONTNEED);
}

void ac_model_free(ac_model *m) {
    /* the model owns fp32 matrices, or 16-bit ones it made (wown); else they live in the mapping */
    int own = ac_model_wdt(m) == ST_F32 || m->wown;
    if (m->L) {
        for (int l = 0; l < m->a.n_layers; l++) {
            ac_layer_w *w = &m->L[l];
            free(w->in_norm), free(w->bq), free(w->bk), free(w->bv), free(w->post_norm);
            free(w->q_norm), free(w->k_norm);
            free(w->conv_w), free(w->conv_b), free(w->dt_bias), free(w->a_log), free(w->ssm_d), free(w->ssm_norm);
            free(w->router_bias);
            for (int x = 0; own && x < m->a.layers[l].n_experts; x++) {
                if (w->eg) free(w->eg[x]);
                if (w->eu) free(w->eu[x]);
                if (w->ed) free(w->ed[x]);
            }
            free(w->eg), free(w->eu), free(w->ed);
            if (!own) continue;
            float *ps[] = {w->wq,     w->wk,     w->wv,      w->wo,   w->wg,  w->wu,       w->wd,
                           w->router, w->ssm_in, w->ssm_out, w->sh_u, w->sh_d, w->lat_down, w->lat_up};
            for (size_t i = 0; i < sizeof ps / sizeof *ps; i++) free(ps[i]);
        }
    }
    free(m->L);
    if (own && m->lm_head != m->embed) free(m->lm_head);
    if (own) free(m->embed);
    if (m->wmap) {
        st_set_close(m->wmap);
        free(m->wmap);
    }
    free(m->final_norm);
    ac_arch_free(&m->a);
    memset(m, 0, sizeof *m);
}

static int load_impl(const char *model_dir, ac_model *m, int resident, ac_err *e) {
    if (ac_gguf_is_path(model_dir)) return ac_gguf_load(model_dir, m, e);
    memset(m, 0, sizeof *m);
    m->wdt = ST_F32;
    if (ac_arch_load(model_dir, &m->a, e)) return -1;
    st_set s;
    if (st_set_open(model_dir, &s, e)) {
        ac_arch_free(&m->a);
        return -1;
    }
    int keep = resident ? matrix_dtype(&s) : ST_F32;
    const ac_arch *a = &m->a;
    int64_t H = a->hidden, hd = a->head_dim, V = a->vocab;
    char n[256];
    m->L = calloc(a->n_layers, sizeof *m->L);
    if (!m->L) {
        ac_errf(e, "out of memory");
        goto fail;
    }
    m->wdt = keep; /* before any matrix lands: ac_model_free must know who owns them */
    /* nemotron_h checkpoints name the body backbone. (model. in newer transformers) */
    const char *pre = !a->hybrid ? "model." : st_set_find(&s, "backbone.embeddings.weight") ? "backbone." : "model.";
    snprintf(n, sizeof n, "%s%s", pre, a->hybrid ? "embeddings.weight" : "embed_tokens.weight");
    if (!(m->embed = load_tensor(&s, n, V, H, keep, e))) goto fail;
    snprintf(n, sizeof n, "%s%s", pre, a->hybrid ? "norm_f.weight" : "norm.weight");
    if (!(m->final_norm = load_tensor(&s, n, H, 0, keep, e))) goto fail;
    if (a->tie_embeddings && !st_set_find(&s, "lm_head.weight"))
        m->lm_head = m->embed;
    else if (!(m->lm_head = load_tensor(&s, "lm_head.weight", V, H, keep, e)))
        goto fail;
    for (int l = 0; l < a->n_layers; l++) {
        const ac_layer_arch *L = &a->layers[l];
        ac_layer_w *w = &m->L[l];
        int64_t q = L->n_heads * hd, kv = L->n_kv_heads * hd, F = L->ffn;
#define LD(field, suffix, d0, d1)                                                                                      \
    snprintf(n, sizeof n, "%slayers.%d.%s", pre, l, suffix);                                                           \
    if (!(w->field = load_tensor(&s, n, d0, d1, keep, e))) goto fail;
        if (a->hybrid) { /* one norm and one mixer (model.h) */
            int64_t di = ac_ssm_inner(a, l), C = ac_ssm_conv_dim(a, l), nh = L->ssm_heads;
            if (L->ffn) {
                LD(post_norm, "norm.weight", H, 0);
                LD(wu, "mixer.up_proj.weight", F, H);
                LD(wd, "mixer.down_proj.weight", H, F);
                continue;
            }
            if (L->n_experts) { /* MoE: router, correction bias, experts up/down, shared expert */
                int64_t E = L->n_experts, Fe = L->expert_ffn, Fs = a->shared_ffn, Hin = a->moe_latent ? a->moe_latent : H;
                LD(post_norm, "norm.weight", H, 0);
                if (a->moe_latent) {
                    LD(lat_down, "mixer.fc1_latent_proj.weight", Hin, H);
                    LD(lat_up, "mixer.fc2_latent_proj.weight", H, Hin);
                }
                LD(router, "mixer.gate.weight", E, H);
                LD(router_bias, "mixer.gate.e_score_correction_bias", E, 0);
                LD(sh_u, "mixer.shared_experts.up_proj.weight", Fs, H);
                LD(sh_d, "mixer.shared_experts.down_proj.weight", H, Fs);
                if (!(w->eg = calloc(E, sizeof *w->eg)) || !(w->eu = calloc(E, sizeof *w->eu)) ||
                    !(w->ed = calloc(E, sizeof *w->ed))) {
                    ac_errf(e, "out of memory");
                    goto fail;
                }
                for (int x = 0; x < E; x++) {
                    char sfx[96];
                    snprintf(sfx, sizeof sfx, "mixer.experts.%d.up_proj.weight", x);
                    LD(eu[x], sfx, Fe, Hin);
                    snprintf(sfx, sizeof sfx, "mixer.experts.%d.down_proj.weight", x);
                    LD(ed[x], sfx, Hin, Fe);
                }
                continue;
            }
            LD(in_norm, "norm.weight", H, 0);
            if (L->n_heads) {
                LD(wq, "mixer.q_proj.weight", q, H);
                LD(wk, "mixer.k_proj.weight", kv, H);
                LD(wv, "mixer.v_proj.weight", kv, H);
                LD(wo, "mixer.o_proj.weight", H, q);
                continue;
            }
            LD(ssm_in, "mixer.in_proj.weight", ac_ssm_in_dim(a, l), H);
            LD(ssm_out, "mixer.out_proj.weight", H, di);
            snprintf(n, sizeof n, "%slayers.%d.mixer.conv1d.weight", pre, l);
            if (!(w->conv_w = load_conv(&s, n, C, a->ssm_conv, e))) goto fail;
            if (a->ssm_conv_bias) {
                LD(conv_b, "mixer.conv1d.bias", C, 0);
            }
            LD(dt_bias, "mixer.dt_bias", nh, 0);
            LD(a_log, "mixer.A_log", nh, 0);
            LD(ssm_d, "mixer.D", nh, 0);
            LD(ssm_norm, "mixer.norm.weight", di, 0);
            continue;
        }
        if (L->n_heads) {
            LD(in_norm, "input_layernorm.weight", H, 0);
            LD(wq, "self_attn.q_proj.weight", q, H);
            LD(wk, "self_attn.k_proj.weight", kv, H);
            LD(wv, "self_attn.v_proj.weight", kv, H);
            LD(wo, "self_attn.o_proj.weight", H, q);
            if (a->qkv_bias) {
                LD(bq, "self_attn.q_proj.bias", q, 0);
                LD(bk, "self_attn.k_proj.bias", kv, 0);
                LD(bv, "self_attn.v_proj.bias", kv, 0);
            }
            if (a->qk_norm) {
                LD(q_norm, "self_attn.q_norm.weight", hd, 0);
                LD(k_norm, "self_attn.k_norm.weight", hd, 0);
            }
        }
        if (F) {
            LD(post_norm, "post_attention_layernorm.weight", H, 0);
            LD(wg, "mlp.gate_proj.weight", F, H);
            LD(wu, "mlp.up_proj.weight", F, H);
            LD(wd, "mlp.down_proj.weight", H, F);
        }
        if (L->n_experts) {
            int64_t E = L->n_experts, Fe = L->expert_ffn;
            moe_names mn = moe_names_of(a);
            LD(post_norm, "post_attention_layernorm.weight", H, 0);
            LD(router, mn.router, E, H);
            if (!(w->eg = calloc(E, sizeof *w->eg)) || !(w->eu = calloc(E, sizeof *w->eu)) ||
                !(w->ed = calloc(E, sizeof *w->ed))) {
                ac_errf(e, "out of memory");
                goto fail;
            }
            for (int x = 0; x < E; x++) {
                const char *fm[3] = {mn.g, mn.u, mn.d};
                float **dst[3] = {&w->eg[x], &w->eu[x], &w->ed[x]};
                for (int k = 0; k < 3; k++) {
                    char sfx[128];
                    snprintf(sfx, sizeof sfx, fm[k], x);
                    snprintf(n, sizeof n, "model.layers.%d.%s", l, sfx);
                    if (!(*dst[k] = load_tensor(&s, n, k == 2 ? H : Fe, k == 2 ? Fe : H, keep, e))) goto fail;
                }
            }
        }
#undef LD
    }
    if (keep != ST_F32) /* read the mapping in now, not during the first forward (best effort) */
        for (int f = 0; f < s.n; f++) madvise(s.files[f].map, s.files[f].map_len, MADV_POPULATE_READ);
    if (keep == ST_F32)
        st_set_close(&s);
    else if (!(m->wmap = malloc(sizeof s))) {
        ac_errf(e, "out of memory");
        goto fail;
    } else
        memcpy(m->wmap, &s, sizeof s);
    return 0;
fail:
    ac_errctx(e, "%s", model_dir);
    ac_model_free(m); /* matrices first: they may point into s */
    st_set_close(&s);
    return -1;
}

int ac_model_load(const char *model_dir, ac_model *m, ac_err *e) { return load_impl(model_dir, m, 0, e); }

int ac_model_load_resident(const char *model_dir, ac_model *m, ac_err *e) { return load_impl(model_dir, m, 1, e); }

int ac_model_alloc(ac_model *m, const ac_arch *a, ac_err *e) { return model_alloc(m, a, 0, e); }

int ac_model_alloc_bf16(ac_model *m, const ac_arch *a, ac_err *e) { return model_alloc(m, a, 1, e); }

/* Zeroed weights for a, the matrices fp32, or BF16 owned (wown) when bf16. */
static int model_alloc(ac_model *m, const ac_arch *a, int bf16, ac_err *e) {
    memset(m, 0, sizeof *m);
    m->wdt = bf16 ? ST_BF16 : ST_F32;
    m->wown = bf16;
    if (ac_arch_copy(&m->a, a, e)) return -1;
    size_t H = a->hidden, hd = a->head_dim, V = a->vocab, es = bf16 ? 2 : 4;
    m->L = calloc(a->n_layers, sizeof *m->L);
    m->embed = calloc(V * H, es);
    m->final_norm = calloc(H, 4);
    m->lm_head = a->tie_embeddings ? m->embed : calloc(V * H, es);
    int ok = m->L && m->embed && m->final_norm && m->lm_head;
    for (int l = 0; ok && l < a->n_layers; l++) {
        const ac_layer_arch *L = &a->layers[l];
        ac_layer_w *w = &m->L[l];
        size_t q = L->n_heads * hd, kv = L->n_kv_heads * hd, F = L->ffn;
        if (L->n_heads) {
            ok = (w->in_norm = calloc(H, 4)) && (w->wq = calloc(q * H, es)) && (w->wk = calloc(kv * H, es)) &&
                 (w->wv = calloc(kv * H, es)) && (w->wo = calloc(H * q, es));
            if (ok && a->qkv_bias) ok = (w->bq = calloc(q, 4)) && (w->bk = calloc(kv, 4)) && (w->bv = calloc(kv, 4));
            if (ok && a->qk_norm) ok = (w->q_norm = calloc(hd, 4)) && (w->k_norm = calloc(hd, 4));
        }
        if (ok && F)
            ok = (w->post_norm = calloc(H, 4)) && (a->hybrid || (w->wg = calloc(F * H, es))) &&
                 (w->wu = calloc(F * H, es)) && (w->wd = calloc(H * F, es));
        if (ok && L->ssm_heads) {
            size_t di = ac_ssm_inner(a, l), C = ac_ssm_conv_dim(a, l), nh = L->ssm_heads;
            ok = (w->in_norm = calloc(H, 4)) && (w->ssm_in = calloc((size_t)ac_ssm_in_dim(a, l) * H, es)) &&
                 (w->ssm_out = calloc(H * di, es)) && (w->conv_w = calloc(C * a->ssm_conv, 4)) &&
                 (!a->ssm_conv_bias || (w->conv_b = calloc(C, 4))) && (w->dt_bias = calloc(nh, 4)) &&
                 (w->a_log = calloc(nh, 4)) && (w->ssm_d = calloc(nh, 4)) && (w->ssm_norm = calloc(di, 4));
        }
        if (ok && L->n_experts) {
            size_t E = L->n_experts, Fe = L->expert_ffn, Hin = a->hybrid && a->moe_latent ? (size_t)a->moe_latent : H;
            ok = (w->post_norm = calloc(H, 4)) && (w->router = calloc(E * H, es)) &&
                 (w->eg = calloc(E, sizeof *w->eg)) && (w->eu = calloc(E, sizeof *w->eu)) &&
                 (w->ed = calloc(E, sizeof *w->ed));
            for (size_t x = 0; ok && x < E; x++) /* nemotron_h's experts have no gate */
                ok = (a->hybrid || (w->eg[x] = calloc(Fe * H, es))) && (w->eu[x] = calloc(Fe * Hin, es)) &&
                     (w->ed[x] = calloc(Hin * Fe, es));
            if (ok && a->hybrid) /* the correction bias and the shared expert */
                ok = (w->router_bias = calloc(E, 4)) && (w->sh_u = calloc((size_t)a->shared_ffn * H, es)) &&
                     (w->sh_d = calloc(H * a->shared_ffn, es));
            if (ok && a->hybrid && a->moe_latent) /* LatentMoE's projections */
                ok = (w->lat_down = calloc(Hin * H, es)) && (w->lat_up = calloc(H * Hin, es));
        }
    }
    if (!ok) {
        ac_model_free(m);
        return ac_errf(e, "out of memory allocating model weights");
    }
    return 0;
}

/* 0 when every layer of one type has the same width (what nemotron_h's
 * config.json can say), else -1 with the reason. */
static int hybrid_savable(const ac_arch *a, ac_err *e) {
    int nh = 0, nkv = 0, ffn = 0, mh = 0, ne = 0, fe = 0;
    for (int l = 0; l < a->n_layers; l++) {
        const ac_layer_arch *L = &a->layers[l];
        int *want[5] = {&nh, &ffn, &mh, &ne, &fe}, got[5] = {L->n_heads, L->ffn, L->ssm_heads, L->n_experts, L->expert_ffn};
        for (int k = 0; k < 5; k++) {
            if (got[k] && !*want[k]) *want[k] = got[k];
            if (got[k] && got[k] != *want[k])
                return ac_errf(e, "save: nemotron_h's config holds one width per layer type (layer %d differs)", l);
        }
        if (L->n_heads && !nkv) nkv = L->n_kv_heads;
        if (L->n_heads && L->n_kv_heads != nkv)
            return ac_errf(e, "save: nemotron_h's config holds one KV-head count (layer %d differs)", l);
        if (!L->n_heads + !L->ffn + !L->ssm_heads + !L->n_experts != 3)
            return ac_errf(e, "save: nemotron_h layer %d must hold exactly one mixer", l);
    }
    return 0;
}

int ac_model_save(const ac_model *m, const char *dir, int dtype, ac_err *e) {
    const ac_arch *a = &m->a;
    if (a->hybrid && hybrid_savable(a, e)) return -1;
    if (ac_fsafe_mkdirs(dir, e)) return -1;
    int cap = 3, n = 0;
    for (int l = 0; l < a->n_layers; l++) cap += 14 + 3 * a->layers[l].n_experts;
    st_wtensor *t = calloc(cap, sizeof *t);
    char **names = calloc(cap, sizeof *names);
    void **bufs = calloc(cap, sizeof *bufs);
    int rc = 0;
    if (!t || !names || !bufs) {
        rc = ac_errf(e, "out of memory");
        goto out;
    }
    int64_t H = a->hidden, hd = a->head_dim;
    st_dtype wdt = (st_dtype)ac_model_wdt(m); /* matrices (2-D) are in wdt (per layer), the rest fp32 */
    /* A tensor already in dtype is written from the model's own memory (no copy: exporting a BF16
     * student of a large model in BF16 would otherwise hold it twice); any other is converted into a
     * buffer. */
#define ADD(nm, ptr, d0, d1)                                                                                           \
    do {                                                                                                               \
        names[n] = strdup(nm);                                                                                         \
        size_t cnt = (size_t)(d0) * (size_t)((d1) ? (d1) : 1);                                                         \
        st_dtype sdt = (d1) ? wdt : ST_F32;                                                                            \
        bufs[n] = sdt == (st_dtype)dtype ? NULL : malloc(cnt * st_dtype_size((st_dtype)dtype));                        \
        if (!names[n] || (sdt != (st_dtype)dtype && !bufs[n])) {                                                       \
            n++;                                                                                                       \
            rc = ac_errf(e, "out of memory");                                                                          \
            goto out;                                                                                                  \
        }                                                                                                              \
        if (bufs[n] && ac_convert(bufs[n], (st_dtype)dtype, ptr, sdt, cnt, e)) {                                       \
            n++;                                                                                                       \
            rc = -1;                                                                                                   \
            goto out;                                                                                                  \
        }                                                                                                              \
        t[n] = (st_wtensor){names[n], (st_dtype)dtype, (d1) ? 2 : 1, {(d0), (d1)}, bufs[n] ? bufs[n] : (ptr)};         \
        n++;                                                                                                           \
    } while (0)
    /* an fp32 vector kept fp32 whatever dtype says (Hugging Face keeps nemotron_h's e_score_correction_bias fp32) */
#define ADD32(nm, ptr, d0)                                                                                             \
    do {                                                                                                               \
        names[n] = strdup(nm);                                                                                         \
        bufs[n] = malloc((size_t)(d0) * sizeof(float));                                                                \
        if (!names[n] || !bufs[n]) {                                                                                   \
            n++;                                                                                                       \
            rc = ac_errf(e, "out of memory");                                                                          \
            goto out;                                                                                                  \
        }                                                                                                              \
        memcpy(bufs[n], ptr, (size_t)(d0) * sizeof(float));                                                            \
        t[n] = (st_wtensor){names[n], ST_F32, 1, {(d0), 0}, bufs[n]};                                                  \
        n++;                                                                                                           \
    } while (0)
    const char *pre = a->hybrid ? "backbone." : "model.";
    char nm[256];
    snprintf(nm, sizeof nm, "%s%s", pre, a->hybrid ? "embeddings.weight" : "embed_tokens.weight");
    ADD(nm, m->embed, a->vocab, H);
    for (int l = 0; l < a->n_layers; l++) {
        const ac_layer_arch *L = &a->layers[l];
        const ac_layer_w *w = &m->L[l];
        int64_t q = L->n_heads * hd, kv = L->n_kv_heads * hd, F = L->ffn;
        wdt = (st_dtype)ac_model_wdt(m);
#define ADDL(suffix, ptr, d0, d1)                                                                                      \
    snprintf(nm, sizeof nm, "%slayers.%d.%s", pre, l, suffix);                                                         \
    ADD(nm, ptr, d0, d1)
#define ADDL32(suffix, ptr, d0)                                                                                        \
    snprintf(nm, sizeof nm, "%slayers.%d.%s", pre, l, suffix);                                                         \
    ADD32(nm, ptr, d0)
        if (a->hybrid) { /* nemotron_h: one norm and one mixer */
            int64_t di = ac_ssm_inner(a, l), C = ac_ssm_conv_dim(a, l), nh = L->ssm_heads;
            ADDL("norm.weight", L->ffn || L->n_experts ? w->post_norm : w->in_norm, H, 0);
            if (L->n_experts) { /* the router, its fp32 correction bias, the experts, the shared expert */
                int64_t Fe = L->expert_ffn, Fs = a->shared_ffn, Hin = a->moe_latent ? a->moe_latent : H;
                ADDL("mixer.gate.weight", w->router, L->n_experts, H);
                if (a->moe_latent) {
                    ADDL("mixer.fc1_latent_proj.weight", w->lat_down, Hin, H);
                    ADDL("mixer.fc2_latent_proj.weight", w->lat_up, H, Hin);
                }
                ADDL32("mixer.gate.e_score_correction_bias", w->router_bias, L->n_experts);
                for (int x = 0; x < L->n_experts; x++) {
                    char sfx[96];
                    snprintf(sfx, sizeof sfx, "mixer.experts.%d.up_proj.weight", x);
                    ADDL(sfx, w->eu[x], Fe, Hin);
                    snprintf(sfx, sizeof sfx, "mixer.experts.%d.down_proj.weight", x);
                    ADDL(sfx, w->ed[x], Hin, Fe);
                }
                ADDL("mixer.shared_experts.up_proj.weight", w->sh_u, Fs, H);
                ADDL("mixer.shared_experts.down_proj.weight", w->sh_d, H, Fs);
            } else if (L->ffn) {
                ADDL("mixer.up_proj.weight", w->wu, F, H);
                ADDL("mixer.down_proj.weight", w->wd, H, F);
            } else if (L->n_heads) {
                ADDL("mixer.q_proj.weight", w->wq, q, H);
                ADDL("mixer.k_proj.weight", w->wk, kv, H);
                ADDL("mixer.v_proj.weight", w->wv, kv, H);
                ADDL("mixer.o_proj.weight", w->wo, H, q);
            } else {
                ADDL("mixer.in_proj.weight", w->ssm_in, ac_ssm_in_dim(a, l), H);
                ADDL("mixer.conv1d.weight", w->conv_w, C * a->ssm_conv, 0); /* fp32 [C*K], then shaped [C,1,K] */
                t[n - 1].ndim = 3, t[n - 1].shape[0] = C, t[n - 1].shape[1] = 1, t[n - 1].shape[2] = a->ssm_conv;
                if (w->conv_b) {
                    ADDL("mixer.conv1d.bias", w->conv_b, C, 0);
                }
                ADDL("mixer.dt_bias", w->dt_bias, nh, 0);
                ADDL("mixer.A_log", w->a_log, nh, 0);
                ADDL("mixer.D", w->ssm_d, nh, 0);
                ADDL("mixer.norm.weight", w->ssm_norm, di, 0);
                ADDL("mixer.out_proj.weight", w->ssm_out, H, di);
            }
            continue;
        }
        if (L->n_heads) {
            ADDL("input_layernorm.weight", w->in_norm, H, 0);
            ADDL("self_attn.q_proj.weight", w->wq, q, H);
            ADDL("self_attn.k_proj.weight", w->wk, kv, H);
            ADDL("self_attn.v_proj.weight", w->wv, kv, H);
            ADDL("self_attn.o_proj.weight", w->wo, H, q);
            if (a->qkv_bias) {
                ADDL("self_attn.q_proj.bias", w->bq, q, 0);
                ADDL("self_attn.k_proj.bias", w->bk, kv, 0);
                ADDL("self_attn.v_proj.bias", w->bv, kv, 0);
            }
            if (a->qk_norm) {
                ADDL("self_attn.q_norm.weight", w->q_norm, hd, 0);
                ADDL("self_attn.k_norm.weight", w->k_norm, hd, 0);
            }
        }
        if (F) {
            ADDL("post_attention_layernorm.weight", w->post_norm, H, 0);
            ADDL("mlp.gate_proj.weight", w->wg, F, H);
            ADDL("mlp.up_proj.weight", w->wu, F, H);
            ADDL("mlp.down_proj.weight", w->wd, H, F);
        }
        if (L->n_experts) {
            moe_names mn = moe_names_of(a);
            int64_t Fe = L->expert_ffn;
            ADDL("post_attention_layernorm.weight", w->post_norm, H, 0);
            ADDL(mn.router, w->router, L->n_experts, H);
            for (int x = 0; x < L->n_experts; x++) {
                const char *fm[3] = {mn.g, mn.u, mn.d};
                const float *src[3] = {w->eg[x], w->eu[x], w->ed[x]};
                for (int k = 0; k < 3; k++) {
                    char sfx[128];
                    snprintf(sfx, sizeof sfx, fm[k], x);
                    ADDL(sfx, src[k], k == 2 ? H : Fe, k == 2 ? Fe : H);
                }
            }
        }
#undef ADDL
#undef ADDL32
    }
    wdt = (st_dtype)ac_model_wdt(m);
    snprintf(nm, sizeof nm, "%s%s", pre, a->hybrid ? "norm_f.weight" : "norm.weight");
    ADD(nm, m->final_norm, H, 0);
    if (!a->tie_embeddings) ADD("lm_head.weight", m->lm_head, a->vocab, H);
#undef ADD
#undef ADD32
    rc = st_write_sharded(dir, t, n, 2ULL << 30, e);
    if (!rc) {
        char path[4096];
        snprintf(path, sizeof path, "%s/config.json", dir);
        json_t *c = ac_arch_to_config(a);
        json_object_set_new(c, "torch_dtype",
                            json_string(dtype == ST_F32   ? "float32"
                                        : dtype == ST_F16 ? "float16"
                                                          : "bfloat16"));
        if (ac_fsafe_write_json(path, c, JSON_INDENT(2) | JSON_PRESERVE_ORDER, e))
            rc = -1;
        else if (json_object_get(c, "auto_map"))
            rc = ac_deci_write_module(dir, e);
        json_decref(c);
    }
out:
    for (int i = 0; i < n && names; i++) {
        free(names[i]);
        free(bufs[i]);
    }
    free(t);
    free(names);
    free(bufs);
    return rc;
}

float *ac_layer_matrix(const ac_model *m, int l, ac_wmat which, size_t *n) {
    const ac_layer_arch *la = &m->a.layers[l];
    const ac_layer_w *w = &m->L[l];
    size_t H = m->a.hidden, Q = (size_t)la->n_heads * m->a.head_dim, KV = (size_t)la->n_kv_heads * m->a.head_dim,
           F = la->ffn;
    float *p = NULL;
    *n = 0;
    switch (which) {
    case AC_W_Q:
        p = w->wq;
        *n = Q * H;
        break;
    case AC_W_K:
        p = w->wk;
        *n = KV * H;
        break;
    case AC_W_V:
        p = w->wv;
        *n = KV * H;
        break;
    case AC_W_O:
        p = w->wo;
        *n = H * Q;
        break;
    case AC_W_G:
        p = w->wg;
        *n = F * H;
        break;
    case AC_W_U:
        p = w->wu;
        *n = F * H;
        break;
    case AC_W_D:
        p = w->wd;
        *n = H * F;
        break;
    case AC_W_SSM_IN:
        p = w->ssm_in;
        *n = (size_t)ac_ssm_in_dim(&m->a, l) * H;
        break;
    case AC_W_SSM_OUT:
        p = w->ssm_out;
        *n = H * (size_t)ac_ssm_inner(&m->a, l);
        break;
    case AC_W_SH_U:
    case AC_W_SH_D:
        p = which == AC_W_SH_U ? w->sh_u : w->sh_d;
        *n = la->n_experts ? H * (size_t)m->a.shared_ffn : 0;
        break;
    case AC_W_LAT_DOWN:
    case AC_W_LAT_UP:
        p = which == AC_W_LAT_DOWN ? w->lat_down : w->lat_up;
        *n = la->n_experts ? H * (size_t)m->a.moe_latent : 0;
        break;
    }
    return *n ? p : NULL;
}
