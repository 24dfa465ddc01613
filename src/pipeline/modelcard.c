/* modelcard.c - see modelcard.h. */
#include "pipeline/modelcard.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "textout_int.h"


/* The arms a report can have (the puzzle arm with spec puzzle.enabled). */
#define AC_CARD_ARMS 4
static const char *base_name(const char *p) {
    size_t n = strlen(p);
    while (n > 1 && p[n - 1] == '/') n--;
    const char *s = p + n;
    while (s > p && s[-1] != '/') s--;
    return s;
}

/* A YAML scalar: a JSON string is a valid double-quoted YAML scalar. */
static void put_yaml_str(ac_text *o, const char *s, size_t n) {
    json_t *j = json_stringn(s, n);
    char *t = j ? json_dumps(j, JSON_ENCODE_ANY) : NULL;
    ac_text_put(o, "%s", t ? t : "\"\"");
    free(t);
    json_decref(j);
}

static void put_params(ac_text *o, double p) {
    if (p >= 1e9)
        ac_text_put(o, "%.4g B", p / 1e9);
    else if (p >= 1e5)
        ac_text_put(o, "%.4g M", p / 1e6);
    else
        ac_text_put(o, "%.0f", p);
}

/* A tag from s: lower case, [a-z0-9-] only. */
static void put_tag(ac_text *o, const char *prefix, const char *s) {
    ac_text_put(o, "- %s", prefix);
    for (; *s; s++) {
        char c = *s >= 'A' && *s <= 'Z' ? (char)(*s - 'A' + 'a') : *s;
        ac_text_put(o, "%c", (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') ? c : '-');
    }
    ac_text_put(o, "\n");
}

/* Why this arm (report chosen_reason), and, should the arm not exported
 * have met every limit with a lower perplexity, that too: the card never
 * lets the export look like the better one. */
static void put_choice(ac_text *o, const json_t *r, const char *chosen) {
    const char *other = !strcmp(chosen, "autocompress") ? "minitron" : "autocompress";
    const json_t *a = json_object_get(r, chosen), *b = json_object_get(r, other);
    if (ac_jstr(r, "chosen_reason")[0]) ac_text_put(o, "Why this arm: %s.\n\n", ac_jstr(r, "chosen_reason"));
    if (!json_is_object(b) || !json_is_true(json_object_get(b, "feasible")) ||
        !(ac_jnum(b, "perplexity") < ac_jnum(a, "perplexity")))
        return;
    ac_text_put(
        o,
        "Note: the %s arm of the same job also met every limit and had the lower held-out perplexity (%.4f against "
        "this model's %.4f).\n\n",
        other, ac_jnum(b, "perplexity"), ac_jnum(a, "perplexity"));
}

/* The layer's figure k ("heads", "kv_heads", "ffn") or -1. */
static long layer_fig(const json_t *arch, size_t l, const char *k) {
    const json_t *v = json_object_get(json_array_get(json_object_get(arch, "layers"), l), k);
    return json_is_number(v) ? (long)json_number_value(v) : -1;
}

static void put_limits(ac_text *o, const json_t *r, const json_t *arm, const char *chosen) {
    const json_t *lim = json_object_get(arm, "constraints"),
                 *base = json_object_get(json_object_get(r, "baseline"), "predicted");
    const json_t *tg = json_object_get(r, "target"), *w = json_object_get(tg, "workload");
    ac_text_put(o, "## Target and limits\n\n");
    ac_text_put(
        o,
        "Target: %s (`%s`, cost model `%s`, serving engine profile `%s`, weights %s), workload: batch %.0f, prompt "
        "%.0f tokens, %.0f generated tokens.\n\n",
        ac_jstr(tg, "device_name"), ac_jstr(tg, "device"), ac_jstr(tg, "cost_source"),
        ac_jstr(json_object_get(tg, "engine"), "name"), ac_jstr(json_object_get(tg, "engine"), "weights_dtype"),
        ac_jnum(w, "batch"), ac_jnum(w, "prompt_len"), ac_jnum(w, "gen_len"));
    ac_text_put(
        o, "| limit | bound | base model (predicted) | this model (%s, predicted) | met |\n|---|---|---|---|---|\n",
        chosen);
    const char *k;
    const json_t *v;
    json_object_foreach((json_t *)lim, k, v) {
        const json_t *bv = json_object_get(base, k);
        ac_text_put(o, "| %s | %s %.6g | ", k, !strcmp(ac_jstr(v, "kind"), "min") ? ">=" : "<=", ac_jnum(v, "limit"));
        if (json_is_number(bv))
            ac_text_put(o, "%.6g", json_number_value(bv));
        else
            ac_text_put(o, "-");
        ac_text_put(o, " | %.6g | %s |\n", ac_jnum(v, "value"),
                    json_is_true(json_object_get(v, "met")) ? "yes" : "**no**");
    }
    ac_text_put(
        o, "\nThe figures are the cost model's predictions for the target (docs/costmodel.md in AutoCompress).\n\n");
}

/* eval.tasks: accuracy of each arm per task (acc_norm beside it; before
 * distillation in brackets), or a line saying none was measured. */
static void put_tasks(ac_text *o, const json_t *r, const char *const *arms, const char *const *label,
                      const char *chosen) {
    const json_t *names = json_object_get(json_object_get(r, "baseline"), "tasks");
    if (!json_object_size(names)) {
        ac_text_put(o, "\nTask accuracy: not measured by this job (no eval.tasks; held-out perplexity only).\n\n");
        return;
    }
    ac_text_put(o, "\nMultiple-choice accuracy, zero-shot, scored as lm-evaluation-harness scores it (acc, acc_norm +- the "
           "standard error of acc; before distillation in brackets):\n\n| model |");
    const char *k;
    const json_t *v;
    json_object_foreach((json_t *)names, k, v) ac_text_put(o, " %s (n = %.0f) |", k, ac_jnum(v, "n"));
    ac_text_put(o, "\n|---|");
    json_object_foreach((json_t *)names, k, v) ac_text_put(o, "---|");
    ac_text_put(o, "\n");
    for (int i = 0; i < AC_CARD_ARMS; i++) {
        const json_t *a = json_object_get(r, arms[i]);
        const json_t *t = json_object_get(a, "tasks"), *tp = json_object_get(a, "tasks_pruned");
        if (!json_is_object(t)) continue;
        ac_text_put(o, "| %s%s |", label[i], !strcmp(arms[i], chosen) ? " (**this model**)" : "");
        json_object_foreach((json_t *)names, k, v) {
            const json_t *x = json_object_get(t, k), *y = json_object_get(tp, k);
            ac_text_put(o, " %.3f, %.3f +- %.3f", ac_jnum(x, "acc"), ac_jnum(x, "acc_norm"), ac_jnum(x, "stderr"));
            if (json_is_object(y)) ac_text_put(o, " (%.3f, %.3f)", ac_jnum(y, "acc"), ac_jnum(y, "acc_norm"));
            ac_text_put(o, " |");
        }
        ac_text_put(o, "\n");
    }
    ac_text_put(o, "\n");
}

static void put_quality(ac_text *o, const json_t *r, const char *chosen) {
    const json_t *ev = json_object_get(r, "eval_protocol");
    ac_text_put(o, "## Quality\n\n");
    ac_text_put(o, "Held-out perplexity on %.0f tokens of `%s` (windows of %.0f tokens, %s engine):\n\n",
                ac_jnum(ev, "scored_tokens"), base_name(ac_jstr(ev, "text")), ac_jnum(ev, "ctx"),
                ac_jstr(ev, "engine"));
    ac_text_put(o, "| model | parameters | perplexity | limits met |\n|---|---|---|---|\n");
    const char *arms[AC_CARD_ARMS] = {"baseline", "minitron", "autocompress", "puzzle"};
    /* each row starts with the arm's one name, as in report.json, the API, the dashboard and the CLI */
    const char *label[AC_CARD_ARMS] = {
        "baseline (before pruning)", "minitron (Minitron-style uniform pruning)",
        "autocompress (AutoCompress per-layer search)",
        "puzzle (Puzzle block library: block-local distillation + mixed-integer choice; not exported)"};
    for (int i = 0; i < AC_CARD_ARMS; i++) {
        const json_t *a = json_object_get(r, arms[i]);
        if (!json_is_object(a)) continue;
        ac_text_put(o, "| %s%s | ", label[i], !strcmp(arms[i], chosen) ? " (**this model**)" : "");
        put_params(o, ac_jnum(json_object_get(a, "predicted"), "params"));
        ac_text_put(o, " | %.4f", ac_jnum(a, "perplexity"));
        if (json_is_number(json_object_get(a, "perplexity_pruned")))
            ac_text_put(o, " (%.4f before distillation)", ac_jnum(a, "perplexity_pruned"));
        const json_t *f = json_object_get(a, "feasible");
        ac_text_put(o, " | %s |\n", !json_is_boolean(f) ? "-" : json_is_true(f) ? "yes" : "**no**");
    }
    put_tasks(o, r, arms, label, chosen);
}

static void put_structure(ac_text *o, const json_t *before, const json_t *after) {
    size_t nb = json_array_size(json_object_get(before, "layers")),
           na = json_array_size(json_object_get(after, "layers"));
    int moe = json_is_number(json_object_get(before, "top_k")), nk = moe ? 4 : 3;
    ac_text_put(o, "## What was pruned\n\n");
    ac_text_put(o,
        "Hidden size %.0f -> %.0f; %zu layers -> %zu. Per layer (query heads, KV heads, FFN width%s; 0: the "
        "sub-block was removed):\n\n",
        ac_jnum(before, "hidden"), ac_jnum(after, "hidden"), nb, na, moe ? ", experts" : "");
    if (moe)
        ac_text_put(o, "Each token is routed to %.0f experts of %.0f channels.\n\n", ac_jnum(before, "top_k"),
            (double)layer_fig(before, 0, "expert_ffn") > 0 ? (double)layer_fig(before, 0, "expert_ffn")
                                                           : (double)layer_fig(before, nb - 1, "expert_ffn"));
    ac_text_put(o, moe ? "| layer | heads | KV heads | FFN width | experts |\n|---|---|---|---|---|\n"
               : "| layer | heads | KV heads | FFN width |\n|---|---|---|---|\n");
    for (size_t l = 0; l < nb || l < na; l++) {
        ac_text_put(o, "| %zu |", l);
        const char *ks[] = {"heads", "kv_heads", "ffn", "experts"};
        for (int i = 0; i < nk; i++) {
            long b = layer_fig(before, l, ks[i]), a = layer_fig(after, l, ks[i]);
            if (i == 3 && b < 0 && l < nb) b = 0; /* a dense layer, or experts removed, has no "experts" */
            if (i == 3 && a < 0 && l < na) a = 0;
            if (b == a)
                ac_text_put(o, " %ld |", a);
            else if (a < 0)
                ac_text_put(o, " %ld -> (dropped) |", b);
            else
                ac_text_put(o, " %ld -> %ld |", b, a);
        }
        ac_text_put(o, "\n");
    }
    ac_text_put(o, "\n");
}

/* A hybrid (nemotron_h: layers with a "type"): each layer's mixer and its
 * widths before -> after; a removed layer says so (the export's
 * hybrid_override_pattern has it no more). */
static void put_hybrid_structure(ac_text *o, const json_t *before, const json_t *after) {
    const json_t *bl = json_object_get(before, "layers"), *al = json_object_get(after, "layers");
    size_t nb = json_array_size(bl), kept = 0;
    for (size_t l = 0; l < json_array_size(al); l++)
        kept += strcmp(ac_jstr(json_array_get(al, l), "type"), "removed") != 0;
    ac_text_put(o, "## What was pruned\n\n");
    ac_text_put(o,
                "Hidden size %.0f -> %.0f; %zu layers -> %zu (hybrid Mamba-Transformer: one mixer per layer). Per "
                "layer its type and widths (query heads, KV heads, MLP width, Mamba heads, experts):\n\n",
                ac_jnum(before, "hidden"), ac_jnum(after, "hidden"), nb, kept);
    ac_text_put(o, "| layer | type | heads | KV heads | MLP width | Mamba heads | experts |\n"
                   "|---|---|---|---|---|---|---|\n");
    const char *ks[] = {"heads", "kv_heads", "ffn", "ssm_heads", "experts"};
    for (size_t l = 0; l < nb; l++) {
        const char *tb = ac_jstr(json_array_get(bl, l), "type"), *ta = ac_jstr(json_array_get(al, l), "type");
        int removed = !strcmp(ta, "removed");
        ac_text_put(o, "| %zu | %s%s |", l, tb, removed ? " (removed)" : "");
        for (int i = 0; i < 5; i++) {
            long b = layer_fig(before, l, ks[i]), a = layer_fig(after, l, ks[i]);
            b = b < 0 ? 0 : b, a = a < 0 || removed ? 0 : a;
            if (b == a)
                ac_text_put(o, " %ld |", a);
            else
                ac_text_put(o, " %ld -> %ld |", b, a);
        }
        ac_text_put(o, "\n");
    }
    ac_text_put(o, "\n");
}

static void put_measured(ac_text *o, const json_t *r) {
    const json_t *m = json_object_get(r, "measured_local");
    if (!json_is_object(m)) return;
    const json_t *b = json_object_get(m, "baseline"), *t = json_object_get(m, ac_jstr(r, "chosen")),
                 *w = json_object_get(m, "workload");
    ac_text_put(o, "## Measured on the job's CPU\n\n");
    ac_text_put(o, "AutoCompress's CPU engine, weights %s, batch %.0f, prompt %.0f, %.0f generated tokens:\n\n",
                ac_jstr(m, "weights_dtype"), ac_jnum(w, "batch"), ac_jnum(w, "prompt_len"), ac_jnum(w, "gen_len"));
    ac_text_put(
        o, "| model | TTFT ms | TPOT ms |\n|---|---|---|\n| baseline | %.3f | %.3f |\n| this model | %.3f | %.3f |\n\n",
        ac_jnum(b, "ttft_ms"), ac_jnum(b, "tpot_ms"), ac_jnum(t, "ttft_ms"), ac_jnum(t, "tpot_ms"));
}

static void put_loading(ac_text *o, const json_t *r, int deci) {
    const json_t *ex = json_object_get(r, "export"), *g = json_object_get(ex, "gguf");
    ac_text_put(o, "## How to load it\n\n");
    ac_text_put(o, "Format: %s, %s weights (`model.safetensors`, `config.json`, `tokenizer.json`%s).\n\n",
                ac_jstr(ex, "format"), ac_jstr(ex, "dtype"), json_is_object(g) ? ", `model.gguf`" : "");
    ac_text_put(o, "vLLM:\n\n```sh\nvllm serve /path/to/this/folder%s\n```\n\n", deci ? " --trust-remote-code" : "");
    ac_text_put(o,
                "Transformers:\n\n```python\nfrom transformers import AutoModelForCausalLM, AutoTokenizer\n"
                "model = AutoModelForCausalLM.from_pretrained(\"/path/to/this/folder\"%s)\n"
                "tokenizer = AutoTokenizer.from_pretrained(\"/path/to/this/folder\")\n```\n\n",
                deci ? ", trust_remote_code=True" : "");
    if (json_is_object(g))
        ac_text_put(o,
                    "llama.cpp (GGUF, architecture `%s`):\n\n```sh\nllama-server -m /path/to/this/folder/%s\n```\n\n",
                    ac_jstr(g, "architecture"), ac_jstr(g, "file")[0] ? base_name(ac_jstr(g, "file")) : "model.gguf");
    else if (!deci)
        ac_text_put(
            o, "llama.cpp: convert it first, e.g. `autocompress export-gguf /path/to/this/folder model.gguf`, then "
               "`llama-server -m model.gguf`.\n\n");
    else
        ac_text_put(
            o, "llama.cpp: this export has no `model.gguf`; a job with `search.export_target` `gguf` writes one.\n\n");
}

char *ac_model_card(const json_t *r) {
    ac_text o = {.oom = 0};
    const char *chosen = ac_jstr(r, "chosen");
    const json_t *arm = json_object_get(r, chosen), *model = json_object_get(r, "model");
    const json_t *tg = json_object_get(r, "target"), *ex = json_object_get(r, "export");
    const char *mpath = ac_jstr(model, "path"), *mname = base_name(mpath);
    int deci = strstr(ac_jstr(ex, "format"), "DeciLM") != NULL,
        hybrid = strstr(ac_jstr(ex, "format"), "NemotronH") != NULL;
    /* the YAML header */
    ac_text_put(&o, "---\nbase_model: ");
    put_yaml_str(&o, mname, strlen(mname));
    ac_text_put(&o,
                "\nlibrary_name: transformers\npipeline_tag: text-generation\ntags:\n- autocompress\n- pruned\n"
                "- structured-pruning\n- %s\n",
                deci ? "nemotron-nas" : hybrid ? "nemotron-h" : "llama");
    if (json_is_object(json_object_get(ex, "gguf"))) ac_text_put(&o, "- gguf\n");
    put_tag(&o, "target-", ac_jstr(tg, "device"));
    ac_text_put(&o, "---\n\n");
    /* the text */
    ac_text_put(&o, "# %s, pruned for %s\n\n", mname, ac_jstr(tg, "device_name"));
    ac_text_put(&o, "`%s` (", mname);
    put_params(&o, ac_jnum(json_object_get(json_object_get(r, "baseline"), "predicted"), "params"));
    ac_text_put(&o, " parameters) with its structure pruned per layer by AutoCompress for %s under the limits below: ",
                ac_jstr(tg, "device_name"));
    put_params(&o, ac_jnum(json_object_get(arm, "predicted"), "params"));
    ac_text_put(&o, " parameters now. The job ran method `%s`; this export is its **%s** arm. Base model: `%s`.\n\n",
                ac_jstr(r, "method"), chosen, mpath);
    put_choice(&o, r, chosen);
    put_limits(&o, r, arm, chosen);
    put_quality(&o, r, chosen);
    if (hybrid)
        put_hybrid_structure(&o, json_object_get(model, "architecture"), json_object_get(arm, "architecture"));
    else
        put_structure(&o, json_object_get(model, "architecture"), json_object_get(arm, "architecture"));
    put_measured(&o, r);
    put_loading(&o, r, deci);
    ac_text_put(
        &o, "The whole report (both arms, every predicted figure, the search) is `report.json` beside this file.\n");
    return ac_text_take(&o);
}

int ac_model_card_write(const json_t *report, const char *dir, ac_err *e) {
    return ac_text_write(ac_model_card(report), dir, "README.md", e);
}
