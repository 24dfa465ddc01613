/*
 * gguf.c - writing GGUF v3 files for llama.cpp, and the checks of what
 * llama.cpp can run. See gguf.h; reading is in gguf_read.c.
 *
 * Layout written: "GGUF", version 3, tensor count, metadata count, the
 * metadata (key, type, value), the tensor infos (name, dims innermost
 * first, ggml type, offset), padding to general.alignment (32), then each
 * tensor's data padded to 32 bytes. Little endian (the host order here).
 * The metadata is gathered in memory; tensor data is converted and streamed
 * one tensor at a time.
 */
#include "format/gguf.h"

#include <assert.h>
#include <jansson.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/buf.h"
#include "core/fsafe.h"
#include "core/fsafe_write.h"
#include "gguf_int.h"
#include "format/safetensors.h"
#include "core/tensor.h"

int ac_gguf_is_path(const char *path) {
    size_t n = strlen(path);
    return n > 5 && !strcmp(path + n - 5, ".gguf");
}

const char *ac_gguf_arch_name(const ac_arch *a) {
    if (a->hybrid) return ac_arch_has_moe(a) ? "nemotron_h_moe" : "nemotron_h";
    if (ac_arch_has_moe(a)) return a->qk_norm ? "qwen3moe" : "llama";
    return a->qk_norm ? "qwen3" : ac_arch_is_uniform(a) ? "llama" : "deci";
}

int ac_gguf_check_arch(const ac_arch *a, ac_err *e) {
    if (a->hybrid) { /* llama.cpp's nemotron_h: per-layer KV heads and MLP widths, one query-head and Mamba-head count;
                      * nemotron_h_moe: one expert count and width, and every FFN layer MoE */
        int nh = 0, mh = 0, ne = 0, fe = 0, moe = ac_arch_has_moe(a);
        for (int l = 0; l < a->n_layers; l++) {
            const ac_layer_arch *L = &a->layers[l];
            if ((L->n_heads && nh && L->n_heads != nh) || (L->ssm_heads && mh && L->ssm_heads != mh))
                return ac_errf(e, "export target gguf: llama.cpp's nemotron_h has one query-head count and one "
                                  "Mamba-head count for every layer (layer %d differs)",
                               l);
            if (!L->n_heads + !L->ffn + !L->ssm_heads + !L->n_experts != 3)
                return ac_errf(e, "export target gguf: nemotron_h layer %d must hold exactly one mixer", l);
            if (moe && L->ffn)
                return ac_errf(e, "export target gguf: llama.cpp's nemotron_h_moe makes every FFN layer a mixture of "
                                  "experts (layer %d is a dense MLP)",
                               l);
            if (L->n_experts && ne && (L->n_experts != ne || L->expert_ffn != fe))
                return ac_errf(e, "export target gguf: llama.cpp's nemotron_h_moe has one expert count and expert "
                                  "width for every layer (layer %d differs)",
                               l);
            nh = L->n_heads ? L->n_heads : nh, mh = L->ssm_heads ? L->ssm_heads : mh;
            if (L->n_experts) ne = L->n_experts, fe = L->expert_ffn;
        }
        return 0;
    }
    if (ac_arch_has_moe(a)) {
        if (!ac_arch_is_uniform(a))
            return ac_errf(e, "export target gguf: llama.cpp's MoE architectures (llama for Mixtral, qwen3moe) have "
                              "one expert count, expert width and head count for every layer, and no dense layer "
                              "among MoE ones");
        if (!a->norm_topk)
            return ac_errf(e, "export target gguf: llama.cpp renormalises the top-k routing weights, this model "
                              "does not (norm_topk_prob false)");
    }
    if (a->qk_norm && !ac_arch_is_uniform(a))
        return ac_errf(e, "export target gguf: llama.cpp's qwen3 architecture has one head count and one FFN width for "
                          "every layer, and its deci architecture has no QK-norm: a Qwen3 model exports to GGUF "
                          "only with uniform layers");
    if (a->sliding_window)
        return ac_errf(
            e,
            "export target gguf: llama.cpp's llama/deci/qwen3 architectures have no sliding-window attention (the "
            "model has a window of %d)",
            a->sliding_window);
    return ac_gguf_check_layers(a, e);
}

int ac_gguf_check_layers(const ac_arch *a, ac_err *e) {
    if (a->layers[0].n_heads == 0)
        return ac_errf(e, "export target gguf: llama.cpp needs attention in layer 0 (it reads the head size from it)");
    for (int l = 0; l < a->n_layers; l++)
        if (a->layers[l].n_heads && !a->layers[l].ffn && !a->layers[l].n_experts)
            return ac_errf(e,
                           "export target gguf: layer %d keeps attention but drops its FFN; llama.cpp's deci graph "
                           "drops that attention output",
                           l);
    if (!a->layers[a->n_layers - 1].ffn && !a->layers[a->n_layers - 1].n_experts)
        return ac_errf(e, "export target gguf: llama.cpp needs an FFN in the last layer");
    return 0;
}

/* ---- tokenizer.json analysis ---- */

static const char *find_type(const json_t *p, const char *type) {
    if (!json_is_object(p)) return NULL;
    const char *ty = json_string_value(json_object_get(p, "type"));
    if (ty && !strcmp(ty, type)) return ty;
    const json_t *arr = json_object_get(p, "pretokenizers");
    if (!arr) arr = json_object_get(p, "normalizers");
    for (size_t i = 0; json_is_array(arr) && i < json_array_size(arr); i++)
        if (find_type(json_array_get(arr, i), type)) return type;
    return NULL;
}

static const char *split_regex(const json_t *p) {
    if (!json_is_object(p)) return NULL;
    const char *ty = json_string_value(json_object_get(p, "type"));
    if (ty && !strcmp(ty, "Split")) return json_string_value(json_object_get(json_object_get(p, "pattern"), "Regex"));
    const json_t *arr = json_object_get(p, "pretokenizers");
    for (size_t i = 0; json_is_array(arr) && i < json_array_size(arr); i++) {
        const char *r = split_regex(json_array_get(arr, i));
        if (r) return r;
    }
    return NULL;
}

int gg_tok_analyse(const json_t *root, gg_tokinfo *ti, ac_err *e) {
    memset(ti, 0, sizeof *ti);
    const json_t *model = json_object_get(root, "model"), *pt = json_object_get(root, "pre_tokenizer");
    const char *mty = json_string_value(json_object_get(model, "type"));
    if (!mty || strcmp(mty, "BPE") || !json_is_object(json_object_get(model, "vocab")) ||
        !json_is_array(json_object_get(model, "merges")))
        return ac_errf(e, "export target gguf: tokenizer.json must be a BPE model with vocab and merges");
    if (find_type(pt, "ByteLevel")) {
        const char *re = split_regex(pt);
        if (!re)
            ti->pre = "gpt-2";
        else if (!strcmp(re, GG_RE_LLAMA3))
            ti->pre = "llama-bpe";
        else if (!strcmp(re, GG_RE_QWEN2))
            ti->pre = "qwen2";
        else
            return ac_errf(e, "export target gguf: the tokenizer's split regex is not one llama.cpp has a "
                              "pre-tokenizer type for (Llama-3, Qwen2, GPT-2)");
        return 0;
    }
    const json_t *norm = json_object_get(root, "normalizer");
    ti->sp = 1;
    ti->pre = "default";
    if (!json_is_true(json_object_get(model, "byte_fallback")))
        return ac_errf(
            e, "export target gguf: a tokenizer.json without ByteLevel must be SentencePiece-style with byte_fallback");
    if (find_type(pt, "Metaspace")) {
        const char *sch = json_string_value(json_object_get(pt, "prepend_scheme"));
        json_t *aps = json_object_get(pt, "add_prefix_space");
        ti->space_prefix = sch ? strcmp(sch, "never") != 0 : !aps || json_is_true(aps);
    } else
        ti->space_prefix = find_type(norm, "Prepend") != NULL;
    return 0;
}

int ac_gguf_check_tokenizer(const char *path, ac_err *e) {
    json_t *root = ac_fsafe_json(path, AC_FK_TOKENIZER, e); /* confined, no bytes echoed */
    if (!root) return -1;
    gg_tokinfo ti;
    int rc = gg_tok_analyse(root, &ti, e);
    json_decref(root);
    return rc;
}

int ac_gguf_check_model_dir(const char *dir, ac_err *e) {
    char p[4096];
    ac_arch a;
    if (ac_gguf_is_path(dir)) return 0; /* already a GGUF file */
    if (ac_arch_load(dir, &a, e)) return -1;
    int rc = a.sliding_window ? ac_gguf_check_arch(&a, e) : 0;
    ac_arch_free(&a);
    snprintf(p, sizeof p, "%s/tokenizer.json", dir);
    return rc ? rc : ac_gguf_check_tokenizer(p, e);
}

/* ---- byte buffer of metadata ---- */

typedef struct {
    ac_buf b;
    int oom;
    uint64_t nkv;
} gbuf;

static void gput(gbuf *b, const void *s, size_t n) {
    if (!b->oom && ac_buf_append(&b->b, s, n, 0)) b->oom = 1;
}
static void g32(gbuf *b, uint32_t v) { gput(b, &v, 4); }
static void g64(gbuf *b, uint64_t v) { gput(b, &v, 8); }
static void gstr(gbuf *b, const char *s) {
    g64(b, strlen(s));
    gput(b, s, strlen(s));
}
static void key(gbuf *b, const char *k, uint32_t type) {
    gstr(b, k);
    g32(b, type);
    b->nkv++;
}
static void kv_u32(gbuf *b, const char *k, uint32_t v) {
    key(b, k, GG_U32);
    g32(b, v);
}
static void kv_f32(gbuf *b, const char *k, float v) {
    key(b, k, GG_F32);
    gput(b, &v, 4);
}
static void kv_bool(gbuf *b, const char *k, int v) {
    unsigned char c = v != 0;
    key(b, k, GG_BOOL);
    gput(b, &c, 1);
}
static void kv_str(gbuf *b, const char *k, const char *v) {
    key(b, k, GG_STR);
    gstr(b, v);
}
static void kv_arr(gbuf *b, const char *k, uint32_t et, uint64_t n) {
    key(b, k, GG_ARR);
    g32(b, et);
    g64(b, n);
}

/* "<arch>.<rest>" */
static const char *ak(const char *arch, const char *rest) {
    static char buf[128];
    snprintf(buf, sizeof buf, "%s.%s", arch, rest);
    return buf;
}

static void write_hparams(gbuf *b, const ac_arch *a, const char *arch, int dtype) {
    kv_str(b, "general.architecture", arch);
    kv_str(b, "general.name", "autocompress");
    kv_u32(b, "general.file_type", dtype == ST_F32 ? 0 : 32); /* LLAMA_FTYPE_ALL_F32 / MOSTLY_BF16 */
    kv_u32(b, "general.alignment", GG_ALIGN);
    kv_u32(b, ak(arch, "context_length"), (uint32_t)a->max_pos);
    kv_u32(b, ak(arch, "embedding_length"), (uint32_t)a->hidden);
    kv_u32(b, ak(arch, "block_count"), (uint32_t)a->n_layers);
    if (a->layers[0].n_experts && !a->hybrid) { /* Mixtral (llama), qwen3moe: one expert count and width a layer */
        kv_u32(b, ak(arch, "expert_count"), (uint32_t)a->layers[0].n_experts);
        kv_u32(b, ak(arch, "expert_used_count"), (uint32_t)a->top_k);
        if (!strcmp(arch, "qwen3moe"))
            kv_u32(b, ak(arch, "expert_feed_forward_length"), (uint32_t)a->layers[0].expert_ffn);
    }
    if (a->hybrid) { /* nemotron_h: a layer is Mamba when its KV heads and FFN width are both 0; an MoE layer's
                      * FFN width is its expert width (nemotron_h_moe) */
        int nh = 1, mh = 0;
        const ac_layer_arch *moe = NULL;
        const char *names[2] = {"feed_forward_length", "attention.head_count_kv"};
        for (int k = 0; k < 2; k++) {
            kv_arr(b, ak(arch, names[k]), GG_I32, (uint64_t)a->n_layers);
            for (int l = 0; l < a->n_layers; l++) {
                const ac_layer_arch *L = &a->layers[l];
                g32(b, (uint32_t)(k ? L->n_kv_heads : L->n_experts ? L->expert_ffn : L->ffn));
            }
        }
        for (int l = 0; l < a->n_layers; l++) {
            if (a->layers[l].n_heads) nh = a->layers[l].n_heads;
            if (a->layers[l].ssm_heads) mh = a->layers[l].ssm_heads;
            if (a->layers[l].n_experts && !moe) moe = &a->layers[l];
        }
        if (moe) { /* the converter's nemotron_h_moe keys; the graph's router is the sigmoid one */
            kv_u32(b, ak(arch, "expert_count"), (uint32_t)moe->n_experts);
            kv_u32(b, ak(arch, "expert_used_count"), (uint32_t)a->top_k);
            kv_u32(b, ak(arch, "expert_feed_forward_length"), (uint32_t)moe->expert_ffn);
            kv_u32(b, ak(arch, "expert_shared_feed_forward_length"), (uint32_t)a->shared_ffn);
            kv_u32(b, ak(arch, "expert_shared_count"), 1);
            kv_bool(b, ak(arch, "expert_weights_norm"), a->norm_topk);
            kv_f32(b, ak(arch, "expert_weights_scale"), a->routed_scale);
            kv_u32(b, ak(arch, "expert_group_count"), 1);
            if (a->moe_latent) kv_u32(b, ak(arch, "moe_latent_size"), (uint32_t)a->moe_latent);
        }
        kv_u32(b, ak(arch, "attention.head_count"), (uint32_t)nh);
        kv_u32(b, ak(arch, "ssm.conv_kernel"), (uint32_t)a->ssm_conv);
        kv_u32(b, ak(arch, "ssm.state_size"), (uint32_t)a->ssm_state);
        kv_u32(b, ak(arch, "ssm.group_count"), (uint32_t)a->ssm_groups);
        kv_u32(b, ak(arch, "ssm.inner_size"), (uint32_t)(mh * a->ssm_head_dim));
        kv_u32(b, ak(arch, "ssm.time_step_rank"), (uint32_t)mh); /* the Mamba heads, not a dt rank */
    } else if (strcmp(arch, "deci")) {
        kv_u32(b, ak(arch, "feed_forward_length"),
               (uint32_t)(a->layers[0].n_experts ? a->layers[0].expert_ffn : a->layers[0].ffn));
        kv_u32(b, ak(arch, "attention.head_count"), (uint32_t)a->layers[0].n_heads);
        kv_u32(b, ak(arch, "attention.head_count_kv"), (uint32_t)a->layers[0].n_kv_heads);
    } else {
        const char *names[3] = {"feed_forward_length", "attention.head_count", "attention.head_count_kv"};
        for (int k = 0; k < 3; k++) {
            kv_arr(b, ak(arch, names[k]), GG_I32, (uint64_t)a->n_layers);
            for (int l = 0; l < a->n_layers; l++) {
                const ac_layer_arch *L = &a->layers[l];
                g32(b, (uint32_t)(k == 0 ? L->ffn : k == 1 ? L->n_heads : L->n_kv_heads));
            }
        }
    }
    kv_f32(b, ak(arch, "rope.freq_base"), a->rope_theta);
    kv_f32(b, ak(arch, "attention.layer_norm_rms_epsilon"), a->eps);
    if (a->hybrid) kv_f32(b, ak(arch, "attention.layer_norm_epsilon"), a->eps); /* what llama.cpp's nemotron_h reads */
    kv_u32(b, ak(arch, "attention.key_length"), (uint32_t)a->head_dim);
    kv_u32(b, ak(arch, "attention.value_length"), (uint32_t)a->head_dim);
    kv_u32(b, ak(arch, "rope.dimension_count"), (uint32_t)a->head_dim);
    kv_u32(b, ak(arch, "vocab_size"), (uint32_t)a->vocab);
    if (a->rope_llama3) { /* llama.cpp reads the rope_freqs tensor; these let our loader rebuild the config */
        kv_f32(b, "autocompress.rope_llama3.factor", a->rs_factor);
        kv_f32(b, "autocompress.rope_llama3.low_freq_factor", a->rs_low);
        kv_f32(b, "autocompress.rope_llama3.high_freq_factor", a->rs_high);
        kv_u32(b, "autocompress.rope_llama3.original_context_length", (uint32_t)a->rs_orig);
    }
}

/* nemotron_h: every Mamba layer's A_log in layer order, exactly. llama.cpp
 * reads ssm_a = -exp(A_log), from which A_log comes back only to within
 * an ulp or so (expf maps neighbouring floats to one); our reader takes
 * these values where they give the file's ssm_a (gguf_read.c). */
static void write_a_log(gbuf *b, const ac_model *m) {
    uint64_t n = 0;
    for (int l = 0; l < m->a.n_layers; l++) n += (uint64_t)m->a.layers[l].ssm_heads;
    if (!n) return;
    kv_arr(b, "autocompress.ssm_a_log", GG_F32, n);
    for (int l = 0; l < m->a.n_layers; l++)
        if (m->a.layers[l].ssm_heads) gput(b, m->L[l].a_log, sizeof(float) * (size_t)m->a.layers[l].ssm_heads);
}

/* ---- tokenizer ---- */

typedef struct {
    char **tok; /* id -> string (borrowed from the JSON, or owned when own[id]) */
    char *own;
    int *type;
    float *score;
    char **merges; /* "a b", owned */
    size_t nm;
} gg_vocab;

static void vocab_free(gg_vocab *v, int n) {
    for (int i = 0; v->tok && i < n; i++)
        if (v->own[i]) free(v->tok[i]);
    for (size_t i = 0; i < v->nm; i++) free(v->merges[i]);
    free(v->tok);
    free(v->own);
    free(v->type);
    free(v->score);
    free(v->merges);
}

static int is_byte_token(const char *s) {
    return strlen(s) == 6 && !strncmp(s, "<0x", 3) && s[5] == '>' && strchr("0123456789ABCDEFabcdef", s[3]) &&
           strchr("0123456789ABCDEFabcdef", s[4]);
}

/* Tokens, types, merges and (SentencePiece-style) scores of tokenizer.json for V ids. */
static int build_vocab(const json_t *root, const gg_tokinfo *ti, int V, gg_vocab *v, ac_err *e) {
    const json_t *model = json_object_get(root, "model"), *vocab = json_object_get(model, "vocab");
    const json_t *merges = json_object_get(model, "merges"), *added = json_object_get(root, "added_tokens");
    memset(v, 0, sizeof *v);
    v->tok = calloc(V, sizeof *v->tok);
    v->own = calloc(V, 1);
    v->type = calloc(V, sizeof *v->type);
    v->score = calloc(V, sizeof *v->score);
    v->merges = calloc(json_array_size(merges) + 1, sizeof *v->merges);
    if (!v->tok || !v->own || !v->type || !v->score || !v->merges) return ac_errf(e, "out of memory");
    const char *k;
    json_t *x;
    json_object_foreach((json_t *)vocab, k, x) {
        json_int_t id = json_integer_value(x);
        if (!json_is_integer(x) || id < 0 || id >= V)
            return ac_errf(e, "tokenizer.json: token %s has id %lld outside the model's %d", k, (long long)id, V);
        v->tok[id] = (char *)k;
        v->type[id] = ti->sp && is_byte_token(k) ? TT_BYTE : TT_NORMAL;
    }
    for (size_t i = 0; json_is_array(added) && i < json_array_size(added); i++) {
        const json_t *t = json_array_get(added, i);
        json_int_t id = json_integer_value(json_object_get(t, "id"));
        const char *c = json_string_value(json_object_get(t, "content"));
        if (!c || id < 0 || id >= V)
            return ac_errf(e, "tokenizer.json: added token %zu is outside the model's %d ids", i, V);
        v->tok[id] = (char *)c;
        v->type[id] = json_is_true(json_object_get(t, "special")) ? TT_CONTROL : TT_USER;
    }
    for (int id = 0; id < V; id++) {
        v->score[id] = ti->sp && v->type[id] == TT_NORMAL ? -(float)(json_array_size(merges) + (size_t)id) : 0.0f;
        if (v->tok[id]) continue;
        char pad[32];
        snprintf(pad, sizeof pad, "[PAD%d]", id);
        if (!(v->tok[id] = strdup(pad))) return ac_errf(e, "out of memory");
        v->own[id] = 1;
        v->type[id] = TT_UNUSED;
    }
    for (size_t i = 0; i < json_array_size(merges); i++) {
        const json_t *m = json_array_get(merges, i);
        const char *a = json_string_value(json_array_get(m, 0)), *b = json_string_value(json_array_get(m, 1));
        char *s = NULL;
        if (json_is_string(m))
            s = strdup(json_string_value(m));
        else if (a && b && (s = malloc(strlen(a) + strlen(b) + 2)))
            sprintf(s, "%s %s", a, b);
        if (!s) return ac_errf(e, "tokenizer.json: merge %zu is malformed (or out of memory)", i);
        v->merges[v->nm++] = s;
        if (!ti->sp) continue;
        /* the merged piece's score: minus the rank of the first merge making it */
        char *sp = strchr(s, ' ');
        if (!sp) return ac_errf(e, "tokenizer.json: merge %zu is not \"a b\"", i);
        size_t la = (size_t)(sp - s), lb = strlen(sp + 1);
        char *ab = malloc(la + lb + 1);
        if (!ab) return ac_errf(e, "out of memory");
        memcpy(ab, s, la);
        memcpy(ab + la, sp + 1, lb + 1);
        json_t *id = json_object_get(vocab, ab);
        free(ab);
        if (json_is_integer(id) && v->score[json_integer_value(id)] < -(float)json_array_size(merges) + 0.5f)
            v->score[json_integer_value(id)] = -(float)i;
    }
    return 0;
}

static int added_content_id(const json_t *root, int id, const char **content) {
    const json_t *added = json_object_get(root, "added_tokens");
    for (size_t i = 0; json_is_array(added) && i < json_array_size(added); i++)
        if (json_integer_value(json_object_get(json_array_get(added, i), "id")) == id) {
            *content = json_string_value(json_object_get(json_array_get(added, i), "content"));
            return 1;
        }
    return 0;
}

static int write_tokenizer(gbuf *b, const ac_arch *a, const char *path, ac_err *e) {
    json_t *root = ac_fsafe_json(path, AC_FK_TOKENIZER, e); /* confined, no bytes echoed */
    if (!root) return -1;
    gg_tokinfo ti;
    gg_vocab v = {0};
    int V = a->vocab, rc = gg_tok_analyse(root, &ti, e);
    if (!rc) rc = build_vocab(root, &ti, V, &v, e);
    if (!rc) {
        kv_str(b, "tokenizer.ggml.model", ti.sp ? "llama" : "gpt2");
        kv_str(b, "tokenizer.ggml.pre", ti.pre);
        kv_arr(b, "tokenizer.ggml.tokens", GG_STR, (uint64_t)V);
        for (int i = 0; i < V; i++) gstr(b, v.tok[i]);
        if (ti.sp) {
            kv_arr(b, "tokenizer.ggml.scores", GG_F32, (uint64_t)V);
            gput(b, v.score, sizeof(float) * (size_t)V);
        }
        kv_arr(b, "tokenizer.ggml.token_type", GG_I32, (uint64_t)V);
        gput(b, v.type, sizeof(int) * (size_t)V);
        if (!ti.sp) {
            kv_arr(b, "tokenizer.ggml.merges", GG_STR, v.nm);
            for (size_t i = 0; i < v.nm; i++) gstr(b, v.merges[i]);
        }
        const char *bos = NULL, *unk = json_string_value(json_object_get(json_object_get(root, "model"), "unk_token"));
        char *pp = json_dumps(json_object_get(root, "post_processor"), JSON_COMPACT | JSON_ENCODE_ANY);
        int add_bos =
            a->bos_id >= 0 && a->bos_id < V && pp && added_content_id(root, a->bos_id, &bos) && bos && strstr(pp, bos);
        free(pp);
        if (a->bos_id >= 0 && a->bos_id < V) kv_u32(b, "tokenizer.ggml.bos_token_id", (uint32_t)a->bos_id);
        if (a->eos_id >= 0 && a->eos_id < V) kv_u32(b, "tokenizer.ggml.eos_token_id", (uint32_t)a->eos_id);
        json_t *uid = unk ? json_object_get(json_object_get(json_object_get(root, "model"), "vocab"), unk) : NULL;
        if (json_is_integer(uid)) kv_u32(b, "tokenizer.ggml.unknown_token_id", (uint32_t)json_integer_value(uid));
        kv_bool(b, "tokenizer.ggml.add_bos_token", add_bos);
        kv_bool(b, "tokenizer.ggml.add_eos_token", 0);
        if (ti.sp) kv_bool(b, "tokenizer.ggml.add_space_prefix", ti.space_prefix);
    }
    vocab_free(&v, V);
    json_decref(root);
    return rc;
}

/* ---- tensors ---- */

typedef struct {
    char name[64];
    const float *src; /* stored in sdt (a resident model's BF16/F16 matrices), converted per tensor */
    int sdt;
    int64_t rows, cols; /* cols 0: a 1-D tensor of rows elements */
    int perm;           /* >0: permute rows of this many heads to llama.cpp's RoPE order */
    int type;           /* GGML_F32 / GGML_BF16 */
    uint64_t off;
    float *const *parts; /* np > 0: a 3-D tensor of np matrices rows x cols, each from its own pointer (experts) */
    int64_t np;
} gg_tensor;

const char *const gg_moe_names[3] = {"ffn_gate_exps.weight", "ffn_up_exps.weight", "ffn_down_exps.weight"};

/* llama.cpp's interleaved RoPE layout (convert_hf_to_gguf.py permute):
 * within each head of hd rows, out row 2i+j = in row j*hd/2 + i. */
int gg_layer_tensors(const ac_arch *a, int l, ac_layer_w *w, gg_layer_tensor *out) {
    const ac_layer_arch *L = &a->layers[l];
    int64_t H = a->hidden, hd = a->head_dim, q = L->n_heads * hd, kv = L->n_kv_heads * hd, F = L->ffn;
    int n = 0;
#define T(suffix, ptr, r, c, p)                                                                                        \
    out[n++] = (gg_layer_tensor){.w = &w->ptr, .rows = r, .cols = c, .perm = p};                                       \
    snprintf(out[n - 1].name, sizeof out[n - 1].name, "blk.%d.%s", l, suffix)
    /* qwen3 rotates NEOX-style (halves), as the checkpoint is: no permutation */
    int pq = a->qk_norm ? 0 : L->n_heads, pk = a->qk_norm ? 0 : L->n_kv_heads;
    if (L->n_heads) {
        T("attn_norm.weight", in_norm, H, 0, 0);
        T("attn_q.weight", wq, q, H, pq);
        T("attn_k.weight", wk, kv, H, pk);
        T("attn_v.weight", wv, kv, H, 0);
        T("attn_output.weight", wo, H, q, 0);
        if (a->qkv_bias) {
            T("attn_q.bias", bq, q, 0, pq);
            T("attn_k.bias", bk, kv, 0, pk);
            T("attn_v.bias", bv, kv, 0, 0);
        }
        if (a->qk_norm) {
            T("attn_q_norm.weight", q_norm, hd, 0, 0);
            T("attn_k_norm.weight", k_norm, hd, 0, 0);
        }
    }
    if (F || L->n_experts) { T("ffn_norm.weight", post_norm, H, 0, 0); }
    if (F) {
        T("ffn_gate.weight", wg, F, H, 0);
        T("ffn_up.weight", wu, F, H, 0);
        T("ffn_down.weight", wd, H, F, 0);
    }
    if (L->n_experts) { T("ffn_gate_inp.weight", router, L->n_experts, H, 0); }
#undef T
    assert(n <= GG_LAYER_TENSORS);
    return n;
}

void gg_permute_rows(float *dst, const float *src, int heads, int64_t rows, int64_t cols, int inverse) {
    int64_t hd = rows / heads, half = hd / 2;
    for (int h = 0; h < heads; h++)
        for (int64_t i = 0; i < half; i++)
            for (int j = 0; j < 2; j++) {
                int64_t o = h * hd + 2 * i + j, n = h * hd + j * half + i;
                memcpy(dst + (inverse ? n : o) * cols, src + (inverse ? o : n) * cols, sizeof(float) * (size_t)cols);
            }
}

static int add_t(gg_tensor *t, int *n, const char *name, const float *src, int sdt, int64_t rows, int64_t cols,
                 int perm, int dtype) {
    gg_tensor *x = &t[(*n)++];
    snprintf(x->name, sizeof x->name, "%.63s", name);
    x->src = src;
    x->sdt = cols ? sdt : ST_F32; /* norms and biases are fp32 in every model */
    x->rows = rows;
    x->cols = cols;
    x->perm = perm;
    x->type = cols && dtype == ST_BF16 ? GGML_BF16 : GGML_F32; /* 1-D tensors stay F32, as the converter writes them */
    return 0;
}

/* The list of tensors of m in llama.cpp's names; *freqs gets the llama3
 * rope factors (owned by the caller) when the model has that scaling. */
static int list_tensors(const ac_model *m, int dtype, gg_tensor *t, int *nt, float **freqs, ac_err *e) {
    const ac_arch *a = &m->a;
    int64_t H = a->hidden, hd = a->head_dim, n = 0;
    *nt = 0;
    int wdt = ac_model_wdt(m);
    add_t(t, nt, "token_embd.weight", m->embed, wdt, a->vocab, H, 0, dtype);
    float *aneg = *freqs; /* nemotron_h: -exp(A_log) of every Mamba layer, llama.cpp's ssm_a */
    for (int l = 0; l < a->n_layers; l++) {
        const ac_layer_arch *L = &a->layers[l];
        const ac_layer_w *w = &m->L[l];
        if (a->hybrid) { /* llama.cpp's nemotron_h names; the conv, A, D and the gated norm in F32 */
            char nm[64];
            int lw = ac_model_wdt(m);
#define HT(sfx, src, sdt, r, c)                                                                                        \
    snprintf(nm, sizeof nm, "blk.%d.%s", l, sfx);                                                                      \
    add_t(t, nt, nm, src, sdt, r, c, 0, dtype)
            HT("attn_norm.weight", L->ffn || L->n_experts ? w->post_norm : w->in_norm, ST_F32, H, 0);
            if (L->n_experts) { /* router, correction bias, (LatentMoE's projections,) the experts stacked, the shared
                                 * expert */
                int64_t Hin = a->moe_latent ? a->moe_latent : H;
                HT("ffn_gate_inp.weight", w->router, lw, L->n_experts, H);
                HT("exp_probs_b.bias", w->router_bias, ST_F32, L->n_experts, 0);
                if (a->moe_latent) {
                    HT("ffn_latent_down.weight", w->lat_down, lw, Hin, H);
                    HT("ffn_latent_up.weight", w->lat_up, lw, H, Hin);
                }
                for (int x = 1; x < 3; x++) { /* up, down: no gate */
                    HT(gg_moe_names[x], NULL, lw, x == 2 ? Hin : L->expert_ffn, x == 2 ? L->expert_ffn : Hin);
                    t[*nt - 1].parts = x == 1 ? w->eu : w->ed;
                    t[*nt - 1].np = L->n_experts;
                }
                HT("ffn_up_shexp.weight", w->sh_u, lw, a->shared_ffn, H);
                HT("ffn_down_shexp.weight", w->sh_d, lw, H, a->shared_ffn);
            } else if (L->ffn) {
                HT("ffn_up.weight", w->wu, lw, L->ffn, H);
                HT("ffn_down.weight", w->wd, lw, H, L->ffn);
            } else if (L->n_heads) {
                int64_t q = (int64_t)L->n_heads * hd, kv = (int64_t)L->n_kv_heads * hd; /* no RoPE: no permutation */
                HT("attn_q.weight", w->wq, lw, q, H);
                HT("attn_k.weight", w->wk, lw, kv, H);
                HT("attn_v.weight", w->wv, lw, kv, H);
                HT("attn_output.weight", w->wo, lw, H, q);
            } else {
                int64_t nh = L->ssm_heads, di = nh * a->ssm_head_dim, C = di + 2 * (int64_t)a->ssm_groups * a->ssm_state;
                for (int64_t h = 0; h < nh; h++) aneg[h] = -expf(w->a_log[h]);
                HT("ssm_in.weight", w->ssm_in, lw, di + C + nh, H);
                HT("ssm_conv1d.weight", w->conv_w, ST_F32, C, a->ssm_conv);
                t[*nt - 1].type = GGML_F32;
                if (w->conv_b) {
                    HT("ssm_conv1d.bias", w->conv_b, ST_F32, C, 0);
                }
                HT("ssm_dt.bias", w->dt_bias, ST_F32, nh, 0);
                HT("ssm_a", aneg, ST_F32, nh, 1);
                t[*nt - 1].type = GGML_F32;
                HT("ssm_d", w->ssm_d, ST_F32, nh, 1);
                t[*nt - 1].type = GGML_F32;
                HT("ssm_norm.weight", w->ssm_norm, ST_F32, a->ssm_groups, di / a->ssm_groups);
                t[*nt - 1].type = GGML_F32;
                HT("ssm_out.weight", w->ssm_out, lw, H, di);
                aneg += nh;
            }
#undef HT
            continue;
        }
        gg_layer_tensor lt[GG_LAYER_TENSORS];
        int k = gg_layer_tensors(a, l, &m->L[l], lt), lw = ac_model_wdt(m); /* read only here */
        for (int i = 0; i < k; i++) add_t(t, nt, lt[i].name, *lt[i].w, lw, lt[i].rows, lt[i].cols, lt[i].perm, dtype);
        float *const *parts[3] = {w->eg, w->eu, w->ed};
        for (int x = 0; L->n_experts && x < 3; x++) { /* the experts stacked, expert index outermost */
            char nm[64];
            snprintf(nm, sizeof nm, "blk.%d.%s", l, gg_moe_names[x]);
            add_t(t, nt, nm, NULL, lw, x == 2 ? H : L->expert_ffn, x == 2 ? L->expert_ffn : H, 0, dtype);
            t[*nt - 1].parts = parts[x];
            t[*nt - 1].np = L->n_experts;
        }
    }
    add_t(t, nt, "output_norm.weight", m->final_norm, ST_F32, H, 0, 0, dtype);
    if (!a->tie_embeddings) add_t(t, nt, "output.weight", m->lm_head, wdt, a->vocab, H, 0, dtype);
    if (a->hybrid) return 0; /* *freqs: the -exp(A_log) buffer; no RoPE */
    *freqs = NULL;
    if (a->rope_llama3) { /* convert_hf_to_gguf.py's rope_freqs: the divisor of each frequency */
        n = hd / 2;
        if (!(*freqs = malloc(sizeof(float) * (size_t)n))) return ac_errf(e, "out of memory");
        double lo = a->rs_orig / a->rs_low, hi = a->rs_orig / a->rs_high;
        for (int64_t i = 0; i < n; i++) {
            double f = 1.0 / pow(a->rope_theta, (double)(2 * i) / (double)hd), wl = 2 * M_PI / f;
            if (wl < hi)
                (*freqs)[i] = 1.0f;
            else if (wl > lo)
                (*freqs)[i] = a->rs_factor;
            else {
                double s = (a->rs_orig / wl - a->rs_low) / (a->rs_high - a->rs_low);
                (*freqs)[i] = (float)(1.0 / ((1 - s) / a->rs_factor + s));
            }
        }
        add_t(t, nt, "rope_freqs.weight", *freqs, ST_F32, n, 0, 0, dtype);
    }
    return 0;
}

static uint64_t align_up(uint64_t x) { return (x + GG_ALIGN - 1) / GG_ALIGN * GG_ALIGN; }

static uint64_t t_bytes(const gg_tensor *t) {
    return (uint64_t)t->rows * (uint64_t)(t->cols ? t->cols : 1) * (t->type == GGML_F32 ? 4 : 2) *
           (uint64_t)(t->np ? t->np : 1);
}

static int write_part(FILE *f, const gg_tensor *t, const float *part, size_t pad, ac_err *e);

/* Convert (and permute) one tensor and write it, padded (a stacked tensor
 * part by part, padded after the last). */
static int write_data(FILE *f, const gg_tensor *t, ac_err *e) {
    size_t pad = (size_t)(align_up(t_bytes(t)) - t_bytes(t));
    if (!t->np) return write_part(f, t, t->src, pad, e);
    for (int64_t p = 0; p < t->np; p++)
        if (write_part(f, t, t->parts[p], p + 1 == t->np ? pad : 0, e)) return -1;
    return 0;
}

static int write_part(FILE *f, const gg_tensor *t, const float *part, size_t pad, ac_err *e) {
    size_t n = (size_t)t->rows * (size_t)(t->cols ? t->cols : 1), sz = n * (t->type == GGML_F32 ? 4 : 2);
    float *tmp = NULL, *conv = NULL;
    const float *src = part;
    if (t->sdt != ST_F32) { /* this matrix alone in fp32 */
        if (!(conv = malloc(sizeof(float) * n))) return ac_errf(e, "out of memory");
        ac_to_f32(conv, part, (st_dtype)t->sdt, n, NULL);
        src = conv;
    }
    if (t->perm) {
        if (!(tmp = malloc(sizeof(float) * n))) {
            free(conv);
            return ac_errf(e, "out of memory");
        }
        gg_permute_rows(tmp, src, t->perm, t->rows, t->cols ? t->cols : 1, 0);
        src = tmp;
    }
    void *buf = malloc(sz + GG_ALIGN);
    int rc = 0;
    if (!buf)
        rc = ac_errf(e, "out of memory");
    else if (ac_from_f32(buf, src, t->type == GGML_F32 ? ST_F32 : ST_BF16, n, e))
        rc = -1;
    else {
        memset((char *)buf + sz, 0, pad);
        if (fwrite(buf, 1, sz + pad, f) != sz + pad) rc = ac_errf(e, "write error");
    }
    free(buf);
    free(tmp);
    free(conv);
    return rc;
}

int ac_gguf_write(const ac_model *m, const char *tokenizer_json, const char *path, int dtype, ac_err *e) {
    const ac_arch *a = &m->a;
    if (dtype != ST_BF16 && dtype != ST_F32) return ac_errf(e, "gguf: tensors are written as BF16 or F32");
    if (ac_gguf_check_arch(a, e)) return -1;
    const char *arch = ac_gguf_arch_name(a);
    gbuf kv = {0}, ti = {0};
    gg_tensor *t = calloc((size_t)a->n_layers * (GG_LAYER_TENSORS + 3) + 4, sizeof *t);
    float *freqs = NULL;
    int nt = 0, rc = 0;
    FILE *f = NULL;
    ac_wfile w = {.dirfd = -1}; /* confined, renamed into place (fsafe_write.h) */
    const char *tmp = path;
    if (!t) {
        rc = ac_errf(e, "out of memory");
        goto out;
    }
    write_hparams(&kv, a, arch, dtype);
    if (a->hybrid) write_a_log(&kv, m);
    if (a->hybrid) { /* list_tensors fills it with each Mamba layer's -exp(A_log) */
        size_t na = 1;
        for (int l = 0; l < a->n_layers; l++) na += (size_t)a->layers[l].ssm_heads;
        if (!(freqs = malloc(sizeof(float) * na))) {
            rc = ac_errf(e, "out of memory");
            goto out;
        }
    }
    if ((tokenizer_json && write_tokenizer(&kv, a, tokenizer_json, e)) || list_tensors(m, dtype, t, &nt, &freqs, e)) {
        rc = -1;
        goto out;
    }
    uint64_t off = 0;
    for (int i = 0; i < nt; i++) {
        t[i].off = off;
        off += align_up(t_bytes(&t[i]));
        gstr(&ti, t[i].name);
        g32(&ti, t[i].np ? 3 : t[i].cols ? 2 : 1);
        if (t[i].cols) {
            g64(&ti, (uint64_t)t[i].cols);
            g64(&ti, (uint64_t)t[i].rows);
            if (t[i].np) g64(&ti, (uint64_t)t[i].np);
        } else
            g64(&ti, (uint64_t)t[i].rows);
        g32(&ti, (uint32_t)t[i].type);
        g64(&ti, t[i].off);
    }
    if (kv.oom || ti.oom) {
        rc = ac_errf(e, "out of memory");
        goto out;
    }
    if (ac_fsafe_create(path, &w, e)) {
        rc = -1;
        goto out;
    }
    f = w.f;
    uint32_t ver = 3;
    uint64_t cnt[2] = {(uint64_t)nt, kv.nkv};
    int ok = fwrite("GGUF", 1, 4, f) == 4 && fwrite(&ver, 4, 1, f) == 1 && fwrite(cnt, 8, 2, f) == 2 &&
             fwrite(kv.b.data, 1, kv.b.len, f) == kv.b.len && fwrite(ti.b.data, 1, ti.b.len, f) == ti.b.len;
    uint64_t head = 24 + kv.b.len + ti.b.len;
    static const char zeros[GG_ALIGN];
    if (ok) ok = fwrite(zeros, 1, (size_t)(align_up(head) - head), f) == align_up(head) - head;
    if (!ok) {
        rc = ac_errf(e, "%s: write error", tmp);
        goto out;
    }
    for (int i = 0; i < nt && !rc; i++) rc = write_data(f, &t[i], e);
    if (!rc) rc = ac_fsafe_commit(&w, e);
out:
    ac_fsafe_discard(&w);
    ac_buf_free(&kv.b);
    ac_buf_free(&ti.b);
    free(t);
    free(freqs);
    if (rc) ac_errctx(e, "gguf %s", path);
    return rc;
}
