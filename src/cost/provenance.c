/* provenance.c - see provenance.h. */
#include "cost/provenance.h"

#include <string.h>

#include "cost/device.h"

static int is_cuda(const ac_cost_table *t) { return !strncmp(t->key, "cuda:", 5); }

/* The figures compared: the latencies, throughput and memory a limit can bound. */
static const struct {
    const char *name;
    ac_metric m;
} FIG[] = {{"ttft_ms", AC_M_TTFT},         {"tpot_ms", AC_M_TPOT},         {"tokens_per_s", AC_M_TOKENS_PER_S},
           {"p99_ttft_ms", AC_M_P99_TTFT}, {"p99_tpot_ms", AC_M_P99_TPOT}, {"memory_gib", AC_M_MEM}};

static json_t *compare(const ac_cost *used, const ac_cost *other) {
    json_t *o = json_object();
    for (size_t i = 0; o && i < sizeof FIG / sizeof *FIG; i++) {
        double a = ac_cost_metric(used, FIG[i].m), b = ac_cost_metric(other, FIG[i].m);
        json_t *f = json_pack("{s:f,s:f}", "used", a, "other", b);
        if (f && b > 0) json_object_set_new(f, "ratio", json_real(a / b));
        json_object_set_new(o, FIG[i].name, f);
    }
    return o;
}

static json_t *inputs(const ac_cost_table *t, const ac_engine_profile *p, const ac_device_spec *spec) {
    const char *ops = t->roofline ? "roofline of the spec profile's datasheet figures (0.75 of the peak, FP8 GEMMs 0.6 "
                                    "of theirs, in waves of tiles over the SMs; 0.85 of the bandwidth)"
                                  : is_cuda(t) ? "measured on this GPU (GEMM and attention grids)"
                                               : "measured on this CPU (the engine's own kernels)";
    const char *dec = t->roofline || t->ndec <= 0 ? "the operator tables"
                                                  : "measured decode steps of the engine (decode bands per working set)";
    json_t *o = json_pack("{s:s,s:s,s:{s:f,s:s},s:{s:f,s:s},s:{s:f,s:s},s:{s:f,s:s}}", "operators", ops, "decode", dec,
                          "launch_us", "value", t->launch_us, "source",
                          t->roofline ? "spec profile" : is_cuda(t) ? "measured" : "none (in the CPU tables)",
                          "step_overhead_ms", "value", p->overhead_ms, "source", "engine constant (assumed)",
                          "sequence_overhead_us", "value", p->seq_overhead_us, "source",
                          "engine constant (0 unless the spec sets it)",
                          "runtime_gib", "value", p->overhead_gib, "source", "engine constant (assumed)");
    if (o && p->tp > 1) {
        const char *src = p->link_gbs > 0 ? "the target's interconnect" : "assumed bus bandwidth of the spec profile";
        json_object_set_new(o, "allreduce_link", json_pack("{s:s,s:s}", "source", src, "device",
                                                           spec ? spec->name : t->device));
    }
    return o;
}

/* What priced the experts of c's mixture-of-experts layers
 * (ac_cost_expert_source); with the table's expert grid, the figures it
 * gives beside those of the GEMM grid it replaces (the same table without
 * its expert grid). NULL for a model without experts. */
static json_t *experts_input(const ac_cost_table *t, const ac_carch *c, const ac_workload *w,
                             const ac_engine_profile *p) {
    const char *src = ac_cost_expert_source(t, c);
    if (!src) return NULL;
    const char *what =
        !strcmp(src, "expert_grid")    ? "measured expert path of this CPU's engine (gather, SwiGLU, scatter-add "
                                         "per expert), at the rows each reached expert gets"
        : !strcmp(src, "grouped_gemm") ? "one grouped GEMM over the reached experts, on the GEMM grid"
                                       : "one GEMM of its gathered rows per matrix of each reached expert, on the GEMM "
                                         "grid";
    json_t *o = json_pack("{s:s,s:s}", "source", src, "kernel", what);
    if (o && !strcmp(src, "expert_grid")) {
        ac_cost_table g = *t; /* shares the grids; not freed */
        g.nre = 0;
        ac_cost used, other;
        ac_cost_predict(t, c, w, p, 0, &used);
        ac_cost_predict(&g, c, w, p, 0, &other);
        json_object_set_new(o, "compared_with", json_string("the GEMM grid (this table without its expert grid)"));
        json_object_set_new(o, "figures", compare(&used, &other));
    }
    return o;
}

json_t *ac_cost_provenance(const ac_cost_table *t, const ac_carch *c, const ac_workload *w,
                           const ac_engine_profile *p) {
    const ac_device_spec *spec = t->roofline || is_cuda(t) ? ac_device_spec_for_gpu(t->device) : NULL;
    json_t *o = json_pack("{s:s,s:s,s:o}", "table", t->roofline ? "roofline" : "measured", "device", t->device,
                          "inputs", inputs(t, p, spec));
    json_t *ex = o ? experts_input(t, c, w, p) : NULL;
    if (ex) json_object_set_new(json_object_get(o, "inputs"), "experts", ex);
    if (!o || t->roofline) return o;
    ac_cost used, other;
    ac_cost_predict(t, c, w, p, 0, &used);
    if (is_cuda(t) && spec) {
        ac_cost_table r;
        ac_err e;
        if (ac_cost_roofline(spec, ac_engine_profile_dtype(p), &r, &e)) return o;
        ac_cost_predict(&r, c, w, p, 0, &other);
        ac_cost_table_free(&r);
        json_object_set_new(o, "compared_with", json_sprintf("the %s spec profile's roofline", spec->name));
    } else if (!is_cuda(t) && t->ndec > 0) {
        ac_cost_table ops = *t; /* shares the grids; not freed */
        ops.ndec = 0;
        ac_cost_predict(&ops, c, w, p, 0, &other);
        json_object_set_new(o, "compared_with", json_string("this table's operator grids without its decode bands"));
    } else
        return o;
    json_object_set_new(o, "figures", compare(&used, &other));
    return o;
}
