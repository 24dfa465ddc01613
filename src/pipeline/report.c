/*
 * report.c - the job's report (report.json and the job result; its fields
 * are described in proto/events.md), built from the state the stages left.
 */
#include <jansson.h>

#include "search/dnas.h"
#include "job_state_int.h"
#include "pipeline/jobcheck.h"
#include "cost/provenance.h"

static json_t *arm(const job_state *s, const ac_search_result *r, const ac_ppl_result *pp, int repaired) {
    return json_pack("{s:o,s:o,s:o,s:b,s:f,s:f,s:f,s:i,s:b}", "architecture", ac_arch_to_json(&r->arch), "predicted",
                     ac_cost_to_json(&r->cost), "constraints", ac_constraints_report(&s->P.limits, &r->cost),
                     "feasible", r->feasible, "predicted_loss_increase", r->pred_loss, "perplexity", pp->ppl, "nll",
                     pp->nll, "repaired_layers", repaired, "uniform", ac_arch_is_uniform(&r->arch));
}

static json_t *target_json(const job_state *s) {
    const ac_target_spec *t = &s->spec->target;
    const ac_engine_profile *p = &s->engine;
    const ac_workload *w = &t->workload;
    json_t *j = json_pack("{s:s,s:s,s:s,s:s,s:b,s:{s:s,s:i,s:i,s:i,s:f,s:f,s:f,s:f},s:o,s:i}", "device", t->device,
                     "device_name", s->table.device, "cost_table", s->table.key, "cost_source", s->table.source,
                     "cache_hit", s->cache_hit, "engine", "name", p->name, "weight_bytes", p->w_bytes, "kv_bytes",
                     p->kv_bytes, "block_size", p->block_size, "memory_utilization", p->mem_util, "overhead_ms",
                     p->overhead_ms, "seq_overhead_us", p->seq_overhead_us, "overhead_gib", p->overhead_gib, "workload", ac_workload_to_json(w), "tp",
                     t->tp > 1 ? t->tp : 1);
    /* the weights the predictions are for (a CPU target's follow a BF16 checkpoint unless the spec names them) */
    if (j) json_object_set_new(json_object_get(j, "engine"), "weights_dtype", json_string(s->wdtype ? s->wdtype : "fp32"));
    /* where the predictions' inputs come from, and the base model's figures under a second source (provenance.h) */
    ac_carch c;
    ac_err e;
    if (j && ac_carch_from_arch(&s->m.a, &c, &e) == 0) {
        json_object_set_new(j, "cost_inputs", ac_cost_provenance(&s->table, &c, w, p));
        ac_carch_free(&c);
    }
    /* how much of the base model's predicted latency no structure moves (launches, engine overhead) */
    if (j) json_object_set_new(j, "overhead_share", json_real(s->base_overhead_share));
    return j;
}

json_t *ac_report_build(const job_state *s) {
    const ac_job_spec *sp = s->spec;
    int ac = s->chosen == &s->ra;
    json_t *r =
        json_pack("{s:s,s:s,s:{s:s,s:o},s:o,s:o,s:{s:o,s:f,s:f}}", "version", "autocompress-report/1", "method",
                  ac_method_name(sp->method), "model", "path", sp->model, "architecture", ac_arch_to_json(&s->m.a),
                  "target", target_json(s), "constraints", ac_constraints_json(&sp->limits), "baseline", "predicted",
                  ac_cost_to_json(&s->base_cost), "perplexity", s->pb.ppl, "nll", s->pb.nll);
    if (!r) return NULL;
    json_object_set_new(r, "minitron", arm(s, &s->rm, &s->pmr, s->rep_m));
    if (s->rm.detail) json_object_update(json_object_get(r, "minitron"), s->rm.detail);
    if (s->two_arms) {
        json_object_set_new(r, "autocompress", arm(s, &s->ra, &s->par, s->rep_a));
        json_object_set_new(r, "search",
                            json_pack("{s:i,s:i,s:f,s:s,s:b}", "steps", s->ra.steps_run, "seed", (int)s->P.opts.seed,
                                      "lr", s->P.opts.lr, "method",
                                      ac_dnas_method(ac_dnas_gates_ok(&s->P, &s->m) ? s->P.opts.method : AC_SEARCH_SURROGATE),
                                      "weights_kept", s->pa_cotrained));
        json_t *sr = json_object_get(r, "search");
        if (s->ra.detail) json_object_update(sr, s->ra.detail); /* gate_trainer; top_k_choices (topk.c) */
        if (ac_arch_has_moe(&s->m.a)) /* the top-k choice: the model's, the lowest tried, the one chosen */
            json_object_set_new(sr, "top_k",
                                json_pack("{s:i,s:i,s:i}", "model", s->m.a.top_k, "min_tried",
                                          sp->search.min_top_k >= 1 && sp->search.min_top_k < s->m.a.top_k
                                              ? sp->search.min_top_k
                                              : s->m.a.top_k,
                                          "chosen", s->ra.arch.top_k));
    }
    if (s->puzzle_ran) { /* the third arm (jobpuzzle.c): its library, program and budget split */
        json_object_set_new(r, "puzzle", arm(s, &s->rz, &s->pzr, 0));
        if (s->rz.detail) json_object_update(json_object_get(r, "puzzle"), s->rz.detail);
        if (s->puzzle_extra) json_object_update(json_object_get(r, "puzzle"), s->puzzle_extra);
    }
    json_t *arms = json_array(); /* the arms this report has, in the dashboard's order */
    json_array_append_new(arms, json_string("minitron"));
    if (s->two_arms) json_array_append_new(arms, json_string("autocompress"));
    if (s->puzzle_ran) json_array_append_new(arms, json_string("puzzle"));
    json_object_set_new(r, "arms", arms);
    const char *k;
    json_t *v;
    json_object_foreach(s->distill, k, v) { /* perplexity_pruned, distill {...} per distilled arm */
        json_t *a = json_object_get(r, k);
        if (json_is_object(a)) json_object_update(a, v);
    }
    /* eval.tasks: each arm's "tasks" (after distillation, when it ran) and "tasks_pruned" (before it) */
    const char *keys[2] = {"tasks", "tasks_pruned"};
    json_t *scores[2] = {s->task_scores, s->tasks_pruned};
    for (int i = 0; i < 2; i++)
        json_object_foreach(scores[i], k, v) {
            json_t *a = json_object_get(r, k);
            if (json_is_object(a)) json_object_set(a, keys[i], v);
        }
    json_object_set_new(r, "chosen", json_string(ac ? "autocompress" : "minitron"));
    json_object_set_new(r, "chosen_reason", json_string(s->chosen_reason));
    json_object_set_new(r, "measured_local", json_incref(s->measured_local));
    if (s->measured_on_target) json_object_set_new(r, "measured_on_target", json_incref(s->measured_on_target));
    json_object_set_new(r, "eval_protocol",
                        json_pack("{s:s,s:i,s:i,s:I,s:s,s:s}", "text", sp->heldout, "ctx", sp->eval.ctx, "windows",
                                  s->pb.windows, "scored_tokens", (json_int_t)s->pb.scored, "mode",
                                  "non-overlapping windows, every target in a window scored", "engine", s->pb.engine));
    json_object_set_new(r, "importance", ac_importance_to_json(&s->imp));
    json_object_set_new(r, "export",
                        json_pack("{s:s,s:s,s:s}", "dir", sp->output, "format",
                                  ac_arch_is_hybrid(&s->result->a)    ? "NemotronHForCausalLM (hybrid_override_pattern)"
                                  : ac_arch_is_uniform(&s->result->a) ? "LlamaForCausalLM"
                                                                      : "DeciLMForCausalLM (nemotron-nas block_configs)",
                                  "dtype", "bf16"));
    ac_gguf_report(&sp->search, &s->result->a, sp->output, json_object_get(r, "export"));
    json_object_set_new(r, "timings_s", json_deep_copy(s->timings));
    if (s->resumed) json_object_set_new(r, "resumed_stages", json_deep_copy(s->resumed)); /* restored from checkpoints */
    return r;
}
