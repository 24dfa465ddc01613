/* jobcheck.c - see jobcheck.h. */
#include "pipeline/jobcheck.h"

#include <dirent.h>
#include <fcntl.h>
#include <fnmatch.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "search/constraints.h"
#include "search/importance.h"
#include "cost/costmodel.h"
#include "format/deci.h"
#include "core/dtype.h"
#include "cost/engines.h"
#include "core/fsafe.h"
#include "format/gguf.h"

/* The names a job's export writes (job.c, the model card, report.html, the
 * deci and GGUF writers) and fsafe_write's temporaries. */
static int export_name(const char *n) {
    static const char *const NAMES[] = {"config.json",  "configuration_decilm.py", "model.safetensors",
                                        "model.safetensors.index.json", "model-*-of-*.safetensors",
                                        "tokenizer.json", "model.gguf", "report.json", "report.html",
                                        "README.md", ".*.tmp"};
    for (size_t i = 0; i < sizeof NAMES / sizeof *NAMES; i++)
        if (!fnmatch(NAMES[i], n, FNM_PERIOD)) return 1;
    return 0;
}

/* An output directory that exists must be empty or hold only what an export
 * writes (a model there is refused by ac_fsafe_check_outdir): anything else
 * is someone else's directory, which the export would write into. */
static int check_output_ours(const char *out, ac_err *e) {
    ac_err ignore;
    int pfd = ac_fsafe_opendir(out, &ignore); /* missing: created by the export (checked above) */
    if (pfd < 0) return 0;
    int fd = openat(pfd, ".", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    close(pfd);
    DIR *dp = fd >= 0 ? fdopendir(fd) : NULL;
    if (!dp) {
        if (fd >= 0) close(fd);
        return ac_errf(e, "%.300s cannot be listed", out);
    }
    struct dirent *de;
    char other[256] = "";
    while ((de = readdir(dp)) && !other[0])
        if (strcmp(de->d_name, ".") && strcmp(de->d_name, "..") && !export_name(de->d_name))
            snprintf(other, sizeof other, "%s", de->d_name);
    closedir(dp);
    if (other[0])
        return ac_errf(e,
                       "%.300s exists and holds %.200s, which no export writes: it is not an output directory of "
                       "ours; name a new or empty directory",
                       out, other);
    return 0;
}

int ac_job_check_paths(const ac_job_spec *s, const char *jobs_dir, const char **field, ac_err *e) {
    const char *path;
    int flags;
    for (int i = 0; ac_job_spec_path(s, i, field, &path, &flags); i++) {
        if (!*path) continue; /* not given */
        if (flags & AC_F_PATH_DIR) {
            if (ac_fsafe_check_model_dir(path, e)) return -1;
        } else if (flags & AC_F_PATH_FILE) {
            int fd = ac_fsafe_open(path, AC_FK_TEXT, NULL, e);
            if (fd < 0) return -1;
            close(fd);
        } else if (flags & AC_F_PATH_OUT) {
            if (ac_fsafe_check_outdir(path, s->model[0] ? s->model : NULL, jobs_dir, e) || check_output_ours(path, e))
                return ac_errctx(e, "output");
        }
    }
    *field = NULL;
    return 0;
}

/* ---- what the pipeline compresses ---- */

/* The floor's figures (see jobcheck.h) on a spec profile's roofline for a
 * static batch into *out: 0, or -1 when the target's table is no roofline
 * or cannot be made (nothing then is checked against it). */
static int floor_cost(const ac_job_spec *s, const ac_arch *a, double h, ac_cost *out) {
    if (s->target.dev.kind != AC_TARGET_PROFILE || ac_workload_served(&s->target.workload)) return -1;
    int cwdt = ac_model_checkpoint_wdt(s->model);
    ac_engine_profile prof;
    ac_target_engine_for(&s->target, cwdt, &prof);
    ac_cost_table t;
    ac_carch c;
    ac_err ignore;
    int hit;
    if (ac_cost_table_for(&s->target.dev, ac_target_table_dtype(&s->target, cwdt), NULL, 1, 0, NULL, NULL, &t, &hit,
                          &ignore))
        return -1;
    if (ac_carch_from_arch(a, &c, &ignore)) {
        ac_cost_table_free(&t);
        return -1;
    }
    c.hidden = h;
    for (int l = 0; l < c.n_layers; l++) {
        c.heads[l] = c.kv[l] = c.ffn[l] = 0;
        if (c.experts) c.experts[l] = c.effn[l] = 0;
    }
    ac_cost_predict(&t, &c, &s->target.workload, &prof, 0, out);
    ac_carch_free(&c);
    ac_cost_table_free(&t);
    return 0;
}

int ac_job_check_reachable(const ac_job_spec *s, const ac_arch *a, const char **field, ac_limit_bound *bound,
                           ac_err *e) {
    int hm = s->search.hidden_multiple > 0 ? s->search.hidden_multiple : 1;
    double h = s->search.prune_hidden && hm < a->hidden ? hm : a->hidden;
    ac_cost fc;
    int have_cost = -1; /* the floor's predicted figures: -1 not yet made, 0 made, 1 not available */
    for (const ac_constraint *c = ac_constraint_table(); c < ac_constraint_table() + AC_NCONSTRAINTS; c++) {
        double lim = ac_constraint_limit(c, &s->limits), best;
        if (!(lim > 0)) continue;
        if (c->m == AC_M_PARAMS) /* exact: the embeddings (and an untied head) and the final norm */
            best = (double)a->vocab * h * (a->tie_embeddings ? 1 : 2) + h;
        else {
            if (have_cost < 0) have_cost = floor_cost(s, a, h, &fc) ? 1 : 0;
            if (have_cost) continue;
            best = ac_cost_metric(&fc, c->m);
        }
        if (ac_constraint_met(c, best, lim)) continue;
        static _Thread_local char fname[64];
        snprintf(fname, sizeof fname, "constraints.%s", c->name);
        *field = fname;
        if (bound) *bound = (ac_limit_bound){c->name, c->metric, c->unit, c->ge, lim, best};
        if (c->m == AC_M_PARAMS)
            return ac_errf(e,
                           "constraints.max_params=%.0f is below what any structure of this model reaches: its "
                           "embeddings%s alone keep %.0f parameters (vocabulary %d x hidden %.0f%s, every layer "
                           "removed)",
                           lim, a->tie_embeddings ? "" : " and output head", best, a->vocab, h,
                           h < a->hidden ? ", the smallest search.hidden_multiple allows" : "");
        return ac_errf(e,
                       "constraints.%s=%.6g is %s what any structure of this model reaches on %s: %s %.6g %s "
                       "predicted with every layer removed (the embeddings%s at hidden %.0f%s)",
                       c->name, lim, c->ge ? "above" : "below", s->target.device, c->metric, best, c->unit,
                       a->tie_embeddings ? "" : " and output head", h,
                       h < a->hidden ? ", the smallest search.hidden_multiple allows" : "");
    }
    return 0;
}

int ac_model_check_compressible(const ac_job_spec *s, const json_t *j, const char **field, ac_err *e) {
    ac_arch a;
    ac_err ignore;
    if (!s->model[0] || ac_arch_load(s->model, &a, &ignore)) return 0; /* fails later with its reason */
    int moe = ac_arch_has_moe(&a), hybrid = ac_arch_is_hybrid(&a), top_k = a.top_k;
    ac_arch_free(&a);
    if (hybrid && s->search.target == AC_EXPORT_DECI) {
        *field = "search.export_target";
        return ac_errf(e, "search.export_target deci: a hybrid (nemotron_h) model exports in its own layout: "
                          "export_target llama (safetensors + config.json as nemotron_h) or gguf (llama.cpp's "
                          "nemotron_h / nemotron_h_moe, with the safetensors beside it)");
    }
    if (moe && s->search.target == AC_EXPORT_DECI) {
        *field = "search.export_target";
        return ac_errf(e, "search.export_target deci: the DeciLM (nemotron-nas) loaders know dense layers only; a "
                          "mixture-of-experts model exports as gguf or llama (its own Hugging Face layout)");
    }
    if (moe && !hybrid && s->search.target == AC_EXPORT_GGUF) { /* nemotron_h_moe: one shape per layer type */
        *field = "search.export_target";
        return ac_errf(e, "search.export_target gguf: llama.cpp's MoE architectures hold one head count, expert count "
                          "and width for every layer; use export_target llama with search.gguf true (uniform layers, "
                          "written as model.gguf too)");
    }
    if (!moe && json_object_get(json_object_get(j, "search"), "prune_experts")) {
        *field = "search.prune_experts";
        return ac_errf(e, "search.prune_experts names a mixture-of-experts axis, and this model is dense");
    }
    if (!moe && json_object_get(json_object_get(j, "search"), "min_top_k")) {
        *field = "search.min_top_k";
        return ac_errf(e, "search.min_top_k names a mixture-of-experts axis, and this model is dense");
    }
    if (moe && s->search.min_top_k > top_k) {
        *field = "search.min_top_k";
        return ac_errf(e, "search.min_top_k %d is more than the model's top_k %d", s->search.min_top_k, top_k);
    }
    if (s->search.keep_weights && (!s->search.cotrain || s->search.method != AC_SEARCH_DNAS ||
                                   s->method != AC_METHOD_AUTOCOMPRESS || moe)) {
        *field = "search.keep_weights";
        return ac_errf(e, "search.keep_weights keeps the weights the gate search trains: it needs method "
                          "autocompress, search.method dnas, search.cotrain true and a dense model");
    }
    if (!moe && json_object_get(json_object_get(j, "search"), "prune_expert_ffn")) {
        *field = "search.prune_expert_ffn";
        return ac_errf(e, "search.prune_expert_ffn names a mixture-of-experts axis, and this model is dense");
    }
    return 0;
}

/* ---- GGUF ---- */

static int wants_gguf(const ac_search_opts *o) { return o->target == AC_EXPORT_GGUF || o->gguf; }

int ac_gguf_check_spec(const ac_search_opts *o, const char *model_dir, const char **field, ac_err *e) {
    const char *dummy;
    if (!field) field = &dummy;
    if (!wants_gguf(o)) return 0;
    if (o->target != AC_EXPORT_GGUF && o->target != AC_EXPORT_LLAMA) {
        *field = "search.gguf";
        return ac_errf(e, "search.gguf writes a uniform (export_target llama) result as GGUF too (the deci target, "
                          "the default, keeps layouts llama.cpp mis-runs); for a heterogeneous GGUF use export_target "
                          "gguf");
    }
    *field = "model";
    if (!model_dir || !model_dir[0]) return 0;
    if (o->target == AC_EXPORT_GGUF) {
        ac_arch a;
        ac_err ignore;
        if (ac_arch_load(model_dir, &a, &ignore) == 0) { /* a bad model fails later with its own reason */
            int qk = a.qk_norm;
            ac_arch_free(&a);
            *field = "search.export_target";
            if (qk)
                return ac_errf(e, "search.export_target gguf writes heterogeneous layers as llama.cpp's deci "
                                  "architecture, which has no QK-norm, and llama.cpp's qwen3 is uniform: for this "
                                  "Qwen3 model use export_target llama with search.gguf (a uniform Qwen3 GGUF)");
            *field = "model";
        }
    }
    return ac_gguf_check_model_dir(model_dir, e);
}

int ac_gguf_export_job(const ac_search_opts *o, const ac_model *m, const char *model_dir, const char *out_dir,
                       ac_err *e) {
    if (!wants_gguf(o)) return 0;
    char tok[4200], out[4200];
    snprintf(tok, sizeof tok, "%s/tokenizer.json", model_dir);
    snprintf(out, sizeof out, "%s/model.gguf", out_dir);
    return ac_gguf_write(m, tok, out, ST_BF16, e);
}

void ac_gguf_report(const ac_search_opts *o, const ac_arch *a, const char *out_dir, json_t *export_obj) {
    if (!export_obj || !wants_gguf(o)) return;
    char f[4200], serve[4300];
    snprintf(f, sizeof f, "%s/model.gguf", out_dir);
    snprintf(serve, sizeof serve, "llama-server -m %s", f);
    json_object_set_new(export_obj, "gguf",
                        json_pack("{s:s,s:s,s:s}", "file", f, "architecture", ac_gguf_arch_name(a), "serve", serve));
}

/* ---- deci ---- */

int ac_deci_validate_spec(int deci, int ffn_multiple, const char **field, ac_err *e) {
    if (!deci || ffn_multiple % AC_DECI_GRID == 0) return 0;
    *field = "search.ffn_multiple";
    return ac_errf(e,
                   "search.ffn_multiple=%d cannot be exported as deci: vLLM, TensorRT-LLM and Transformers "
                   "compute every FFN width as a multiple of %d from ffn_mult (use a multiple of %d, or "
                   "export_target llama/gguf)",
                   ffn_multiple, AC_DECI_GRID, AC_DECI_GRID);
}

int ac_deci_validate_base(int deci, int minitron, const ac_arch *base, const char **field, ac_err *e) {
    if (!deci) return 0;
    /* minitron keeps a uniform base uniform, and uniform results export as llama/mistral */
    if (minitron && ac_arch_is_uniform(base)) return 0;
    *field = "search.export_target";
    if (base->qk_norm)
        return ac_errf(e, "search.export_target deci cannot express this model's QK-norm (Qwen3): nemotron_nas "
                          "loaders have none; use export_target llama (a uniform Qwen3 checkpoint; search.gguf adds "
                          "its GGUF)");
    if (base->sliding_window)
        return ac_errf(e,
                       "search.export_target deci cannot express this model's sliding window (%d tokens): "
                       "nemotron_nas loaders have none; use export_target llama",
                       base->sliding_window);
    int nh = 0;
    for (int l = 0; l < base->n_layers; l++) {
        int h = base->layers[l].n_heads;
        if (h && nh && h != nh)
            return ac_errf(e,
                           "search.export_target deci cannot express this model: its layers have different "
                           "query-head counts (%d and %d); use export_target gguf",
                           nh, h);
        if (h) nh = h;
    }
    return 0;
}

int ac_deci_validate_model(int deci, int minitron, const char *model_dir, const char **field, ac_err *e) {
    if (!deci || !model_dir || !model_dir[0]) return 0;
    ac_arch a;
    ac_err ignore;
    if (ac_arch_load(model_dir, &a, &ignore)) return 0; /* a bad model fails at load with its own message */
    int rc = ac_deci_validate_base(deci, minitron, &a, field, e);
    ac_arch_free(&a);
    return rc;
}

/* ---------------------------------------------------------------- tensor parallelism */

int ac_job_check_tp(int tp, const ac_arch *a, const char **field, ac_err *e) {
    for (int l = 0; l < a->n_layers; l++) {
        int v = 0;
        const char *what = ac_tp_layer_unsplit(tp, &a->layers[l], &v);
        if (what) {
            *field = "target.tp";
            return ac_errf(e, "target.tp=%d does not split layer %d: %d %s", tp, l, v, what);
        }
    }
    return 0;
}

int ac_job_check_tp_model(int tp, const char *model_dir, const char **field, ac_err *e) {
    if (tp <= 1 || !model_dir || !model_dir[0]) return 0;
    ac_arch a;
    ac_err ignore;
    if (ac_arch_load(model_dir, &a, &ignore)) return 0;
    int rc = ac_job_check_tp(tp, &a, field, e);
    ac_arch_free(&a);
    return rc;
}
