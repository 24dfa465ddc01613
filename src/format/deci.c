/* deci.c - the deci export target's rules; see deci.h. */
#include "format/deci.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/fsafe_write.h"
#include "format/safetensors.h"

int ac_deci_loader_ffn(double ffn_mult, int hidden) {
    /* int(2 * ffn_mult * n_embd / 3), evaluated left to right in doubles as
     * Python does, then _find_multiple(n, 256) */
    double x = 2 * ffn_mult * hidden / 3;
    if (!(x >= 0) || x > 1e9) return -1;
    int n = (int)x;
    return n % AC_DECI_GRID ? n + AC_DECI_GRID - n % AC_DECI_GRID : n;
}

double ac_deci_ffn_mult(int width, int hidden) {
    if (width <= 0 || width % AC_DECI_GRID || hidden <= 0) return -1;
    /* the readable value first (1.5 * width / hidden, e.g. 6.0), then its
     * neighbours, then the middle of the interval the formula maps to width */
    double m = 1.5 * width / hidden;
    if (ac_deci_loader_ffn(m, hidden) == width) return m;
    double up = m, dn = m;
    for (int i = 0; i < 8; i++) {
        up = nextafter(up, INFINITY);
        dn = nextafter(dn, 0);
        if (ac_deci_loader_ffn(up, hidden) == width) return up;
        if (ac_deci_loader_ffn(dn, hidden) == width) return dn;
    }
    m = 1.5 * (width - AC_DECI_GRID / 2) / hidden;
    return ac_deci_loader_ffn(m, hidden) == width ? m : -1;
}

int ac_deci_padded(int kept) {
    if (kept <= 0) return 0;
    return (kept + AC_DECI_GRID - 1) / AC_DECI_GRID * AC_DECI_GRID;
}

int ac_deci_check_arch(const ac_arch *a, ac_err *e) {
    int nh = 0, first = -1;
    if (a->sliding_window) return ac_errf(e, "deci: a sliding window cannot be expressed (nemotron_nas has none)");
    for (int l = 0; l < a->n_layers; l++) {
        const ac_layer_arch *L = &a->layers[l];
        if (first < 0 && (L->n_heads || L->ffn)) first = l;
        if (!L->n_heads) continue;
        if (nh && L->n_heads != nh)
            return ac_errf(e,
                           "deci: layer %d has %d query heads, layer before %d: nemotron_nas has one global "
                           "num_attention_heads (only KV heads vary per layer)",
                           l, L->n_heads, nh);
        nh = L->n_heads;
        if (L->n_kv_heads <= 0 || L->n_heads % L->n_kv_heads)
            return ac_errf(e, "deci: layer %d: %d query heads are not a multiple of %d KV heads", l, L->n_heads,
                           L->n_kv_heads);
    }
    if (!nh) return ac_errf(e, "deci: no layer keeps attention (vLLM cannot size a KV cache)");
    if (a->layers[first].n_heads == 0)
        return ac_errf(e,
                       "deci: layer %d is the first layer with a sub-block and has no attention; "
                       "vLLM's nemotron_nas needs attention there (it starts the fused residual)",
                       first);
    for (int l = 0; l < a->n_layers; l++) {
        int f = a->layers[l].ffn;
        if (f && ac_deci_ffn_mult(f, a->hidden) < 0)
            return ac_errf(e,
                           "deci: layer %d FFN width %d is not a multiple of %d; loaders compute "
                           "roundup(int(2*ffn_mult*hidden/3), %d)",
                           l, f, AC_DECI_GRID, AC_DECI_GRID);
    }
    return 0;
}

static json_t *block_json(const ac_arch *a, const ac_layer_arch *L) {
    json_t *at = L->n_heads ? json_pack("{s:b,s:b,s:i}", "no_op", 0, "replace_with_linear", 0, "n_heads_in_group",
                                        L->n_heads / L->n_kv_heads)
                            : json_pack("{s:b,s:b,s:n}", "no_op", 1, "replace_with_linear", 0, "n_heads_in_group");
    json_t *ff = L->ffn ? json_pack("{s:b,s:b,s:f}", "no_op", 0, "replace_with_linear", 0, "ffn_mult",
                                    ac_deci_ffn_mult(L->ffn, a->hidden))
                        : json_pack("{s:b,s:b,s:n}", "no_op", 1, "replace_with_linear", 0, "ffn_mult");
    return json_pack("{s:o,s:o}", "attention", at, "ffn", ff);
}

int ac_deci_fill_config(json_t *c, const ac_arch *a, ac_err *e) {
    if (ac_deci_check_arch(a, e)) return -1;
    int nh = 0;
    for (int l = 0; l < a->n_layers; l++)
        if (a->layers[l].n_heads) nh = a->layers[l].n_heads;
    json_t *bc = json_array();
    for (int l = 0; l < a->n_layers; l++) json_array_append_new(bc, block_json(a, &a->layers[l]));
    json_object_set_new(c, "architectures", json_pack("[s]", "DeciLMForCausalLM"));
    json_object_set_new(c, "model_type", json_string("nemotron-nas"));
    json_object_set_new(c, "auto_map", json_pack("{s:s}", "AutoConfig", "configuration_decilm.DeciLMConfig"));
    json_object_set_new(c, "num_attention_heads", json_integer(nh));
    json_object_set_new(c, "head_dim", json_integer(a->head_dim));
    /* per-layer only: a global value would be read by nothing, or wrongly */
    json_object_del(c, "intermediate_size");
    json_object_del(c, "num_key_value_heads");
    if (a->qkv_bias) { /* vLLM's DeciLM: q/k/v biases from qkv_bias, o_proj bias from attention_bias */
        json_object_set_new(c, "attention_bias", json_false());
        json_object_set_new(c, "qkv_bias", json_true());
    }
    json_object_set_new(c, "block_configs", bc);
    return 0;
}

static const char MODULE_PY[] =
    "# configuration_decilm.py - written by AutoCompress into its `deci` exports.\n"
    "# DeciLM / nemotron-nas configuration for Transformers' trust_remote_code\n"
    "# (config.json's auto_map names DeciLMConfig). Each block_configs entry is an\n"
    "# object with .attention (no_op, replace_with_linear, n_heads_in_group) and .ffn\n"
    "# (no_op, replace_with_linear, ffn_mult), as vLLM's nemotron_nas and\n"
    "# TensorRT-LLM read them. FFN width = roundup(int(2 * ffn_mult * hidden_size / 3), 256);\n"
    "# KV heads = num_attention_heads // n_heads_in_group.\n"
    "from transformers import PretrainedConfig\n"
    "\n"
    "\n"
    "class _SubBlock:\n"
    "    DEFAULTS = {}\n"
    "\n"
    "    def __init__(self, **kwargs):\n"
    "        for k, v in {**self.DEFAULTS, **kwargs}.items():\n"
    "            setattr(self, k, v)\n"
    "\n"
    "    def to_dict(self):\n"
    "        return dict(vars(self))\n"
    "\n"
    "    def __repr__(self):\n"
    "        return f\"{type(self).__name__}({self.to_dict()})\"\n"
    "\n"
    "\n"
    "class AttentionConfig(_SubBlock):\n"
    "    DEFAULTS = {\"no_op\": False, \"replace_with_linear\": False, \"n_heads_in_group\": None}\n"
    "\n"
    "\n"
    "class FFNConfig(_SubBlock):\n"
    "    DEFAULTS = {\"no_op\": False, \"replace_with_linear\": False, \"ffn_mult\": None}\n"
    "\n"
    "\n"
    "class BlockConfig:\n"
    "    def __init__(self, attention=None, ffn=None, **kwargs):\n"
    "        if not isinstance(attention, AttentionConfig):\n"
    "            attention = AttentionConfig(**(attention or {}))\n"
    "        if not isinstance(ffn, FFNConfig):\n"
    "            ffn = FFNConfig(**(ffn or {}))\n"
    "        self.attention, self.ffn = attention, ffn\n"
    "        for k, v in kwargs.items():\n"
    "            setattr(self, k, v)\n"
    "        a, f = self.attention, self.ffn\n"
    "        if not a.no_op and not a.replace_with_linear and not a.n_heads_in_group:\n"
    "            raise ValueError(\"attention.n_heads_in_group is required unless attention.no_op\")\n"
    "        if not f.no_op and not f.replace_with_linear and f.ffn_mult is None:\n"
    "            raise ValueError(\"ffn.ffn_mult is required unless ffn.no_op\")\n"
    "\n"
    "    def to_dict(self):\n"
    "        d = {k: v for k, v in vars(self).items() if k not in (\"attention\", \"ffn\")}\n"
    "        d.update(attention=self.attention.to_dict(), ffn=self.ffn.to_dict())\n"
    "        return d\n"
    "\n"
    "    def __repr__(self):\n"
    "        return f\"BlockConfig({self.to_dict()})\"\n"
    "\n"
    "\n"
    "class DeciLMConfig(PretrainedConfig):\n"
    "    model_type = \"nemotron-nas\"\n"
    "    keys_to_ignore_at_inference = [\"past_key_values\"]\n"
    "\n"
    "    def __init__(self, vocab_size=32000, hidden_size=4096, num_hidden_layers=32, num_attention_heads=32,\n"
    "                 head_dim=None, hidden_act=\"silu\", max_position_embeddings=2048, initializer_range=0.02,\n"
    "                 rms_norm_eps=1e-6, use_cache=True, rope_theta=10000.0, rope_scaling=None,\n"
    "                 attention_bias=False, mlp_bias=False, tie_word_embeddings=False, block_configs=None,\n"
    "                 **kwargs):\n"
    "        self.vocab_size = vocab_size\n"
    "        self.hidden_size = hidden_size\n"
    "        self.num_hidden_layers = num_hidden_layers\n"
    "        self.num_attention_heads = num_attention_heads\n"
    "        self.head_dim = head_dim if head_dim is not None else hidden_size // num_attention_heads\n"
    "        self.hidden_act = hidden_act\n"
    "        self.max_position_embeddings = max_position_embeddings\n"
    "        self.initializer_range = initializer_range\n"
    "        self.rms_norm_eps = rms_norm_eps\n"
    "        self.use_cache = use_cache\n"
    "        self.rope_theta = rope_theta\n"
    "        self.rope_scaling = rope_scaling\n"
    "        self.attention_bias = attention_bias\n"
    "        self.mlp_bias = mlp_bias\n"
    "        blocks = [b if isinstance(b, BlockConfig) else BlockConfig(**b) for b in (block_configs or [])]\n"
    "        if block_configs is not None and len(blocks) != num_hidden_layers:\n"
    "            raise ValueError(f\"block_configs has {len(blocks)} entries for {num_hidden_layers} layers\")\n"
    "        self.block_configs = blocks\n"
    "        super().__init__(tie_word_embeddings=tie_word_embeddings, **kwargs)\n"
    "\n"
    "    def to_dict(self):\n"
    "        d = super().to_dict()\n"
    "        d[\"block_configs\"] = [b.to_dict() for b in self.block_configs]\n"
    "        return d\n";

int ac_deci_write_module(const char *dir, ac_err *e) {
    char path[4096];
    snprintf(path, sizeof path, "%s/configuration_decilm.py", dir);
    return ac_fsafe_write(path, MODULE_PY, sizeof MODULE_PY - 1, e);
}

/* search.export_target, with the default (deci) applied. */
int ac_deci_pad_arch(const ac_arch *req, ac_arch *out, ac_err *e) {
    if (ac_arch_copy(out, req, e)) return -1;
    for (int l = 0; l < out->n_layers; l++) out->layers[l].ffn = ac_deci_padded(out->layers[l].ffn);
    return 0;
}

int ac_deci_pad_model(ac_model *m, ac_err *e) {
    if (ac_model_wdt(m) != ST_F32 || m->wmap) return ac_errf(e, "deci padding: an owned fp32 model only");
    size_t H = m->a.hidden;
    for (int l = 0; l < m->a.n_layers; l++) {
        ac_layer_w *w = &m->L[l];
        size_t F = m->a.layers[l].ffn, P = ac_deci_padded((int)F);
        if (P == F) continue;
        float *g = calloc(P * H, sizeof(float)), *u = calloc(P * H, sizeof(float)), *d = calloc(H * P, sizeof(float));
        if (!g || !u || !d) {
            free(g);
            free(u);
            free(d);
            return ac_errf(e, "out of memory padding layer %d", l);
        }
        memcpy(g, w->wg, F * H * sizeof(float)); /* rows F..P-1 stay zero */
        memcpy(u, w->wu, F * H * sizeof(float));
        for (size_t r = 0; r < H; r++) memcpy(d + r * P, w->wd + r * F, F * sizeof(float)); /* columns F..P-1 zero */
        free(w->wg);
        free(w->wu);
        free(w->wd);
        w->wg = g;
        w->wu = u;
        w->wd = d;
        m->a.layers[l].ffn = (int)P;
    }
    return 0;
}
