/*
 * costjson.c - cost tables to and from JSON (cache rows, export, import),
 * with validation that names the offending field. See costmodel.h.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cost/costmodel.h"

static json_t *darr(const double *v, int n) {
    json_t *a = json_array();
    for (int i = 0; i < n; i++) json_array_append_new(a, json_real(v[i]));
    return a;
}

json_t *ac_cost_table_to_json(const ac_cost_table *t) {
    json_t *j = json_pack("{s:s,s:s,s:s,s:s,s:i,s:s,s:f,s:f}", "key", t->key, "device", t->device, "dtype", t->dtype,
                          "engine", t->engine, "version", t->version, "source", t->source, "memory_gib", t->mem_gib,
                          "measure_seconds", t->measure_s);
    if (t->roofline) {
        json_object_set_new(j, "roofline",
                            json_pack("{s:f,s:f,s:f,s:f,s:f,s:i,s:f,s:b}", "peak_tflops", t->peak_tflops,
                                      "bandwidth_gbs", t->bw_gbs, "eta_compute", t->eta_c, "eta_memory", t->eta_m,
                                      "launch_us", t->launch_us, "sms", t->sms, "peak_acc16_tflops",
                                      t->peak_acc16_tflops, "fp8_act", t->fp8_act));
        return j;
    }
    json_object_set_new(j, "gemm",
                        json_pack("{s:o,s:o,s:o,s:o}", "m", darr(t->gm, t->nm), "n", darr(t->gn, t->nn), "k",
                                  darr(t->gk, t->nk), "us", darr(t->gemm_us, t->nm * t->nn * t->nk)));
    if (t->gemm_warm_us)
        json_object_set_new(json_object_get(j, "gemm"), "warm_us", darr(t->gemm_warm_us, t->nm * t->nn * t->nk));
    json_object_set_new(j, "cache_bytes", json_real(t->cache_bytes));
    if (t->ndec > 0) {
        json_object_set_new(j, "decode_bands",
                            json_pack("{s:o,s:o}", "working_set_bytes", darr(t->dec_ws, t->ndec), "us_per_mib",
                                      darr(t->dec_us_mib, t->ndec)));
        if (t->dec_b4)
            json_object_set_new(json_object_get(j, "decode_bands"), "us_per_mib_batch4", darr(t->dec_us_mib4, t->ndec));
        if (t->dec_kv)
            json_object_set_new(json_object_get(j, "decode_bands"), "kv_us_per_mib", darr(t->dec_kv_us_mib, t->ndec));
    }

    json_object_set_new(j, "attention",
                        json_pack("{s:o,s:o,s:o,s:o}", "head_dims", darr(t->ahd, t->nhd), "queries",
                                  darr(t->aq, t->naq), "extra_keys", darr(t->as, t->nas), "us",
                                  darr(t->attn_us, t->nhd * t->naq * t->nas)));
    json_object_set_new(j, "elementwise_ns", json_real(t->elem_ns));
    if (t->nre > 0 && t->expert_us) {
        int ne = t->nre * t->nfe * t->nhe;
        json_t *x = json_pack("{s:o,s:o,s:o,s:o}", "rows", darr(t->erows, t->nre), "ffn", darr(t->effn, t->nfe),
                              "hidden", darr(t->ehid, t->nhe), "us", darr(t->expert_us, ne));
        if (x && t->expert_warm_us) json_object_set_new(x, "warm_us", darr(t->expert_warm_us, ne));
        json_object_set_new(j, "experts", x);
    }
    json_object_set_new(j, "launch_us", json_real(t->launch_us));
    if (t->ref_us > 0)
        json_object_set_new(j, "quiet",
                            json_pack("{s:f,s:i,s:i}", "reference_probe_us", t->ref_us, "remeasured",
                                      t->quiet_remeasured, "disturbed", t->quiet_disturbed));
    return j;
}

static int get_grid(const json_t *a, double *out, int *n, const char **field, const char *name, ac_err *e) {
    *field = name;
    if (!json_is_array(a) || json_array_size(a) < 1 || json_array_size(a) > AC_CT_MAXG)
        return ac_errf(e, "%s must be an array of 1..%d numbers", name, AC_CT_MAXG);
    *n = (int)json_array_size(a);
    for (int i = 0; i < *n; i++) {
        json_t *v = json_array_get(a, i);
        if (!json_is_number(v) || json_number_value(v) <= 0 || (i && json_number_value(v) <= out[i - 1]))
            return ac_errf(e, "%s must hold positive, increasing numbers", name);
        out[i] = json_number_value(v);
    }
    return 0;
}

static int get_vals(const json_t *a, double **out, int n, const char **field, const char *name, ac_err *e) {
    *field = name;
    if (!json_is_array(a) || (int)json_array_size(a) != n) return ac_errf(e, "%s must hold %d numbers", name, n);
    *out = malloc(sizeof(double) * n);
    if (!*out) return ac_errf(e, "out of memory");
    for (int i = 0; i < n; i++) {
        json_t *v = json_array_get(a, i);
        if (!json_is_number(v) || !(json_number_value(v) > 0) || !isfinite(json_number_value(v))) {
            free(*out);
            *out = NULL;
            return ac_errf(e, "%s must hold positive numbers", name);
        }
        (*out)[i] = json_number_value(v);
    }
    return 0;
}

/* n finite numbers of the array a into out (*field: name). */
static int get_finite(const json_t *a, double *out, int n, const char **field, const char *name, ac_err *e) {
    *field = name;
    if (!json_is_array(a) || (int)json_array_size(a) != n) return ac_errf(e, "%s must hold %d numbers", name, n);
    for (int i = 0; i < n; i++) {
        json_t *v = json_array_get(a, i);
        if (!json_is_number(v) || !isfinite(json_number_value(v)))
            return ac_errf(e, "%s must hold finite numbers", name);
        out[i] = json_number_value(v);
    }
    return 0;
}

/* The optional CPU decode bands: increasing working sets, finite costs per
 * MiB (negative where the warm tables overestimate a small model), the
 * batch-4 costs and the KV cache's costs optional. */
static int decode_bands_parse(const json_t *d, ac_cost_table *t, const char **field, ac_err *e) {
    t->ndec = t->dec_b4 = t->dec_kv = 0;
    if (!d) return 0;
    int n;
    if (get_grid(json_object_get(d, "working_set_bytes"), t->dec_ws, &n, field, "decode_bands.working_set_bytes", e) ||
        get_finite(json_object_get(d, "us_per_mib"), t->dec_us_mib, n, field, "decode_bands.us_per_mib", e))
        return -1;
    json_t *b4 = json_object_get(d, "us_per_mib_batch4");
    if (b4 && get_finite(b4, t->dec_us_mib4, n, field, "decode_bands.us_per_mib_batch4", e)) return -1;
    t->dec_b4 = b4 != NULL;
    json_t *kv = json_object_get(d, "kv_us_per_mib");
    if (kv && get_finite(kv, t->dec_kv_us_mib, n, field, "decode_bands.kv_us_per_mib", e)) return -1;
    t->dec_kv = kv != NULL;
    t->ndec = n;
    return 0;
}

/* The optional expert grid (rows routed, expert width, hidden width; cold
 * and, optionally, warm microseconds): absent in older tables. */
static int experts_parse(const json_t *x, ac_cost_table *t, const char **field, ac_err *e) {
    t->nre = 0;
    if (!x) return 0;
    int nr, nf, nh;
    if (get_grid(json_object_get(x, "rows"), t->erows, &nr, field, "experts.rows", e) ||
        get_grid(json_object_get(x, "ffn"), t->effn, &nf, field, "experts.ffn", e) ||
        get_grid(json_object_get(x, "hidden"), t->ehid, &nh, field, "experts.hidden", e) ||
        get_vals(json_object_get(x, "us"), &t->expert_us, nr * nf * nh, field, "experts.us", e))
        return -1;
    if (json_object_get(x, "warm_us") &&
        get_vals(json_object_get(x, "warm_us"), &t->expert_warm_us, nr * nf * nh, field, "experts.warm_us", e))
        return -1;
    t->nre = nr, t->nfe = nf, t->nhe = nh;
    return 0;
}

static int table_parse(const json_t *j, ac_cost_table *t, const char **field, ac_err *e) {
    memset(t, 0, sizeof *t);
    const char *f2;
    if (!field) field = &f2;
    if (!json_is_object(j)) {
        *field = "table";
        return ac_errf(e, "table must be an object");
    }
    static const char *strs[] = {"key", "device", "dtype", "engine"};
    char *dst[] = {t->key, t->device, t->dtype, t->engine};
    size_t sz[] = {sizeof t->key, sizeof t->device, sizeof t->dtype, sizeof t->engine};
    for (int i = 0; i < 4; i++) {
        json_t *v = json_object_get(j, strs[i]);
        *field = strs[i];
        if (!json_is_string(v) || json_string_length(v) == 0 || json_string_length(v) >= sz[i])
            return ac_errf(e, "table.%s must be a non-empty string", strs[i]);
        snprintf(dst[i], sz[i], "%s", json_string_value(v));
    }
    json_t *ver = json_object_get(j, "version");
    *field = "version";
    if (!json_is_integer(ver) || json_integer_value(ver) != AC_CT_VERSION)
        return ac_errf(e, "table.version must be %d", AC_CT_VERSION);
    t->version = AC_CT_VERSION;
    snprintf(t->source, sizeof t->source, "%s",
             json_string_value(json_object_get(j, "source")) ? json_string_value(json_object_get(j, "source"))
                                                             : "imported");
    json_t *mem = json_object_get(j, "memory_gib");
    *field = "memory_gib";
    if (!json_is_number(mem) || json_number_value(mem) <= 0)
        return ac_errf(e, "table.memory_gib must be a positive number");
    t->mem_gib = json_number_value(mem);
    json_t *rl = json_object_get(j, "roofline");
    if (rl) {
        t->roofline = 1;
        static const char *rk[] = {"peak_tflops", "bandwidth_gbs", "eta_compute", "eta_memory", "launch_us"};
        double *rd[] = {&t->peak_tflops, &t->bw_gbs, &t->eta_c, &t->eta_m, &t->launch_us};
        for (int i = 0; i < 5; i++) {
            json_t *v = json_object_get(rl, rk[i]);
            *field = rk[i];
            if (!json_is_number(v) || json_number_value(v) < 0 || (i < 4 && json_number_value(v) <= 0))
                return ac_errf(e, "table.roofline.%s must be a positive number", rk[i]);
            *rd[i] = json_number_value(v);
        }
        /* the SM count of the wave model (costroofline.c): absent, 0 (none) */
        json_t *sms = json_object_get(rl, "sms");
        if (sms && (!json_is_integer(sms) || json_integer_value(sms) < 0 || json_integer_value(sms) > 100000)) {
            *field = "sms";
            return ac_errf(e, "table.roofline.sms must be a non-negative integer");
        }
        t->sms = sms ? (int)json_integer_value(sms) : 0;
        /* the FP16-accumulate rate and the FP8 input quantisation (costmodel.c's lin_us, quant_us): absent in
         * older tables, which then price with peak_tflops and no quantisation */
        json_t *acc = json_object_get(rl, "peak_acc16_tflops"), *q = json_object_get(rl, "fp8_act");
        if (acc && (!json_is_number(acc) || json_number_value(acc) < 0)) {
            *field = "peak_acc16_tflops";
            return ac_errf(e, "table.roofline.peak_acc16_tflops must be a non-negative number");
        }
        if (q && !json_is_boolean(q)) {
            *field = "fp8_act";
            return ac_errf(e, "table.roofline.fp8_act must be true or false");
        }
        t->peak_acc16_tflops = acc ? json_number_value(acc) : 0;
        t->fp8_act = q && json_is_true(q);
        return 0;
    }
    json_t *g = json_object_get(j, "gemm"), *a = json_object_get(j, "attention");
    if (get_grid(json_object_get(g, "m"), t->gm, &t->nm, field, "gemm.m", e) ||
        get_grid(json_object_get(g, "n"), t->gn, &t->nn, field, "gemm.n", e) ||
        get_grid(json_object_get(g, "k"), t->gk, &t->nk, field, "gemm.k", e) ||
        get_vals(json_object_get(g, "us"), &t->gemm_us, t->nm * t->nn * t->nk, field, "gemm.us", e) ||
        get_grid(json_object_get(a, "queries"), t->aq, &t->naq, field, "attention.queries", e) ||
        get_grid(json_object_get(a, "extra_keys"), t->as, &t->nas, field, "attention.extra_keys", e) ||
        get_grid(json_object_get(a, "head_dims"), t->ahd, &t->nhd, field, "attention.head_dims", e) ||
        get_vals(json_object_get(a, "us"), &t->attn_us, t->nhd * t->naq * t->nas, field, "attention.us", e)) {
        ac_cost_table_free(t);
        return -1;
    }
    json_t *el = json_object_get(j, "elementwise_ns"), *lu = json_object_get(j, "launch_us");
    *field = "elementwise_ns";
    if (!json_is_number(el) || json_number_value(el) < 0) {
        ac_cost_table_free(t);
        return ac_errf(e, "elementwise_ns must be a number >= 0");
    }
    t->elem_ns = json_number_value(el);
    t->launch_us = json_is_number(lu) ? json_number_value(lu) : 0;
    json_t *cb = json_object_get(j, "cache_bytes");
    t->cache_bytes = json_is_number(cb) && json_number_value(cb) > 0 ? json_number_value(cb) : 0;
    if (decode_bands_parse(json_object_get(j, "decode_bands"), t, field, e) ||
        experts_parse(json_object_get(j, "experts"), t, field, e)) {
        ac_cost_table_free(t);
        return -1;
    }
    if (json_object_get(g, "warm_us") &&
        get_vals(json_object_get(g, "warm_us"), &t->gemm_warm_us, t->nm * t->nn * t->nk, field, "gemm.warm_us", e)) {
        ac_cost_table_free(t);
        return -1;
    }

    t->measure_s = json_number_value(json_object_get(j, "measure_seconds"));
    json_t *q = json_object_get(j, "quiet"), *qr = json_object_get(q, "reference_probe_us");
    *field = "quiet.reference_probe_us";
    if (q && (!json_is_number(qr) || !(json_number_value(qr) > 0) || !isfinite(json_number_value(qr)))) {
        ac_cost_table_free(t);
        return ac_errf(e, "quiet.reference_probe_us must be a positive number");
    }
    t->ref_us = q ? json_number_value(qr) : 0;
    t->quiet_remeasured = (int)json_integer_value(json_object_get(q, "remeasured"));
    t->quiet_disturbed = (int)json_integer_value(json_object_get(q, "disturbed"));
    return 0;
}

int ac_cost_table_from_json(const json_t *j, ac_cost_table *t, ac_err *e) { return table_parse(j, t, NULL, e); }

int ac_cost_table_validate(const json_t *j, const char **field, ac_err *e) {
    ac_cost_table t;
    if (table_parse(j, &t, field, e)) return -1;
    ac_cost_table_free(&t);
    return 0;
}
