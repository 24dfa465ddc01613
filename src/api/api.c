/* api.c - see api.h. */
#include "api/api.h"

#include <string.h>

#include "core/dtype.h"
#include "pipeline/jobspec.h"
#include "format/model.h"
#include "cost/provenance.h"
#include "search/minitron.h"

int ac_cost_measure_validate(const json_t *req, const char **field, ac_err *e) {
    *field = "measure";
    if (!json_is_object(req)) return ac_errf(e, "measure must be an object");
    const char *k;
    json_t *v;
    json_object_foreach((json_t *)req, k, v) {
        if (strcmp(k, "device") && strcmp(k, "threads") && strcmp(k, "dtype")) {
            *field = "measure";
            return ac_errf(e, "measure: unknown field %s", k);
        }
    }
    json_t *d = json_object_get(req, "device"), *th = json_object_get(req, "threads"),
           *dt = json_object_get(req, "dtype");
    *field = "measure.device";
    if (!json_is_string(d) || strcmp(json_string_value(d), "cpu"))
        return ac_errf(e, "measure.device must be \"cpu\" (CUDA tables are measured by the CUDA backend)");
    *field = "measure.threads";
    if (th && (!json_is_integer(th) || json_integer_value(th) < 1 || json_integer_value(th) > 256))
        return ac_errf(e, "measure.threads must be an integer in [1, 256]");
    *field = "measure.dtype";
    if (dt && (!json_is_string(dt) || !ac_cost_cpu_dtype_ok(json_string_value(dt))))
        return ac_errf(e, "measure.dtype must be \"fp32\" or \"bf16\" (the CPU engine's weight dtypes)");
    return 0;
}

int ac_cost_measure_threads(const json_t *req) {
    json_t *th = json_object_get(req, "threads");
    return json_is_integer(th) ? (int)json_integer_value(th) : 2;
}

const char *ac_cost_measure_dtype(const json_t *req) {
    json_t *dt = json_object_get(req, "dtype");
    return json_is_string(dt) ? json_string_value(dt) : "fp32";
}

void ac_cost_measure_key(const json_t *req, char *key, size_t n) {
    ac_cost_cpu_key(ac_cost_measure_threads(req), ac_cost_measure_dtype(req), key, n, NULL, 0);
}

int ac_cost_measure_json(const json_t *req, json_t **table, ac_err *e) {
    ac_cost_table t;
    if (ac_cost_measure_cpu(ac_cost_measure_threads(req), ac_cost_measure_dtype(req), NULL, NULL, &t, e)) return -1;
    *table = ac_cost_table_to_json(&t);
    ac_cost_table_free(&t);
    return 0;
}

/* The architecture an estimate is for: a model directory's, or a JSON
 * architecture (over the model's, or over Llama-7B-like defaults). */
static int estimate_arch(const json_t *req, ac_arch *arch, const char **field, ac_err *e) {
    ac_arch base;
    memset(&base, 0, sizeof base);
    json_t *model = json_object_get(req, "model"), *aj = json_object_get(req, "architecture");
    if (model) {
        *field = "model";
        if (!json_is_string(model)) return ac_errf(e, "model must be a path string");
        if (ac_arch_load(json_string_value(model), &base, e)) return -1;
    } else {
        *field = "architecture";
        if (!aj) return ac_errf(e, "need model (a model directory) or architecture");
        base.vocab = 32000;
        base.hidden = 4096;
        base.head_dim = 128;
        base.n_layers = 0;
    }
    if (!aj) {
        *arch = base;
        return 0;
    }
    *field = "architecture";
    int rc = ac_arch_from_json(aj, &base, arch, e);
    ac_arch_free(&base);
    return rc;
}

/* The estimate's "constraints" (the job spec's names) into *l. */
static int fit_limits(const json_t *cj, ac_constraints *l, const char **field, ac_err *e) {
    memset(l, 0, sizeof *l);
    *field = "constraints";
    if (!json_is_object(cj)) return ac_errf(e, "constraints must be an object of limits");
    const char *k;
    json_t *v;
    int n = 0;
    json_object_foreach((json_t *)cj, k, v) {
        const ac_constraint *c = ac_constraint_table(), *end = c + AC_NCONSTRAINTS;
        while (c < end && strcmp(c->name, k)) c++;
        if (c == end) return ac_errf(e, "constraints: unknown limit %s", k);
        if (!json_is_number(v) || json_number_value(v) < c->lo || json_number_value(v) > c->hi)
            return ac_errf(e, "constraints.%s must be a number in [%g, %g]", k, c->lo, c->hi);
        *(double *)((char *)l + c->off) = json_number_value(v);
        n++;
    }
    return n ? 0 : ac_errf(e, "constraints: name at least one limit");
}

/* The config-only search (a hybrid model's Minitron grid priced by the cost
 * model, no weights; docs/hybrid.md): the structures that meet the limits,
 * closest to the binding one first, as "fits" in the estimate's answer. */
static int estimate_fit(const json_t *req, const ac_arch *arch, const ac_cost_table *t, const ac_workload *w,
                        const ac_engine_profile *prof, json_t *out, const char **field, ac_err *e) {
    json_t *cj = json_object_get(req, "constraints"), *sj = json_object_get(req, "search");
    if (!cj && !sj) return 0;
    if (!arch->hybrid) {
        *field = cj ? "constraints" : "search";
        return ac_errf(e, "%s: the config-only search answers for hybrid (nemotron_h) models", *field);
    }
    ac_search_problem P = {.table = t, .workload = w, .profile = prof, .base = arch};
    P.opts.prune_hidden = P.opts.prune_experts = 1;
    if (sj) {
        *field = "search";
        if (!json_is_object(sj)) return ac_errf(e, "search must be an object");
        const char *k;
        json_t *v;
        json_object_foreach(sj, k, v) {
            if ((strcmp(k, "prune_hidden") && strcmp(k, "prune_experts")) || !json_is_boolean(v))
                return ac_errf(e, "search: only prune_hidden and prune_experts (booleans) apply here");
            *(strcmp(k, "prune_hidden") ? &P.opts.prune_experts : &P.opts.prune_hidden) = json_is_true(v);
        }
    }
    if (!cj) {
        *field = "constraints";
        return ac_errf(e, "search needs constraints (the limits the structures must meet)");
    }
    if (fit_limits(cj, &P.limits, field, e)) return -1;
    ac_search_result r;
    *field = "model";
    if (ac_search_minitron(&P, &r, e)) return -1;
    json_t *d = r.detail;
    json_t *fits = json_pack("{s:b,s:O,s:O,s:O,s:O,s:o}", "feasible", r.feasible, "grid_size",
                             json_object_get(d, "grid_size"), "grid_feasible", json_object_get(d, "grid_feasible"),
                             "axes", json_object_get(d, "axes"), "structures", json_object_get(d, "candidates"),
                             "limits", ac_constraints_json(&P.limits));
    if (fits) {
        json_object_set_new(fits, "architecture", ac_arch_to_json(&r.arch));
        json_object_set_new(out, "fits", fits);
    }
    ac_search_result_free(&r);
    return fits ? 0 : ac_errf(e, "out of memory");
}

/* The multi-token-prediction layers a nemotron_h config names, which the
 * figures leave out (never loaded; docs/hybrid.md): their blocks and what
 * they would weigh at the figures' weight bytes, as "mtp" in the answer. */
static void estimate_mtp(const ac_arch *arch, const ac_cost *r, json_t *out) {
    if (arch->mtp_layers <= 0) return;
    double p = ac_arch_mtp_params(arch);
    json_t *m = json_pack("{s:i,s:s,s:b}", "layers", arch->mtp_layers, "pattern", arch->mtp_pattern, "counted", 0);
    if (m && p > 0) {
        json_object_set_new(m, "params", json_real(p));
        json_object_set_new(m, "weights_gib", json_real(r->params > 0 ? p * r->weights_gib / r->params : 0));
    }
    if (m) json_object_set_new(out, "mtp", m);
}

int ac_estimate_json(const json_t *req, const ac_cost_cache *cache, int threads, json_t **out, const char **field,
                     ac_err *e) {
    *field = NULL;
    const char *k;
    json_t *v;
    json_object_foreach((json_t *)req, k, v) {
        if (strcmp(k, "model") && strcmp(k, "architecture") && strcmp(k, "target") && strcmp(k, "constraints") &&
            strcmp(k, "search")) {
            *field = k;
            return ac_errf(e, "unknown field %s", k);
        }
    }
    ac_target_spec tg; /* 4 KB */
    ac_arch arch;
    if (estimate_arch(req, &arch, field, e)) return -1;
    if (ac_target_spec_parse(json_object_get(req, "target"), &tg, "target", field, e)) {
        ac_arch_free(&arch);
        return -1;
    }
    ac_cost_table t;
    int hit;
    /* a model's checkpoint dtype, as a job on it (ac_target_engine_for) */
    json_t *model = json_object_get(req, "model");
    ac_engine_profile prof;
    int cwdt = model ? ac_model_checkpoint_wdt(json_string_value(model)) : ST_F32;
    ac_target_engine_for(&tg, cwdt, &prof);
    *field = "target.device";
    if (ac_cost_table_for(&tg.dev, ac_target_table_dtype(&tg, cwdt), cache, threads, 0, NULL, NULL, &t, &hit, e)) {
        ac_arch_free(&arch);
        return -1;
    }
    ac_carch c;
    if (ac_carch_from_arch(&arch, &c, e)) {
        ac_cost_table_free(&t);
        ac_arch_free(&arch);
        return -1;
    }
    ac_cost r;
    const ac_workload *w = &tg.workload;
    ac_cost_predict(&t, &c, w, &prof, 0, &r);
    double share = ac_cost_overhead_share(&t, &c, w, &prof, &r);
    *out = json_pack("{s:s,s:s,s:s,s:o,s:o,s:o,s:{s:s,s:i}}", "device", t.device, "cost_table", t.key, "source",
                     t.source, "figures", ac_cost_to_json(&r), "architecture", ac_arch_to_json(&arch), "workload",
                     ac_workload_to_json(w), "engine", "name", prof.name, "tp", prof.tp > 1 ? prof.tp : 1);
    if (*out) {
        json_object_set_new(json_object_get(*out, "figures"), "overhead_share", json_real(share));
        estimate_mtp(&arch, &r, *out);
        /* where the inputs came from, as a job's report.target.cost_inputs */
        json_t *ci = ac_cost_provenance(&t, &c, w, &prof);
        if (!ci || json_object_set_new(*out, "cost_inputs", ci)) {
            json_decref(*out);
            *out = NULL;
        }
    }
    int rc = *out ? estimate_fit(req, &arch, &t, w, &prof, *out, field, e) : 0;
    if (rc) {
        json_decref(*out);
        *out = NULL;
    }
    ac_carch_free(&c);
    ac_cost_table_free(&t);
    ac_arch_free(&arch);
    if (rc) return -1;
    *field = NULL;
    return *out ? 0 : ac_errf(e, "out of memory");
}
