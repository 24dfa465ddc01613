/*
 * costsource.c - which cost table a target gets: the local CPU's or a
 * local GPU's from the cache the caller hands in, else measured there; a
 * spec profile's roofline. See costmodel.h.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cost/costmodel.h"
#include "costtimings_int.h"
#include "runtime/cuda_plugin.h"

int ac_cost_cache_lookup(const ac_cost_cache *c, const char *key, ac_cost_table *t, int *found, ac_err *e) {
    *found = 0;
    return c && c->get ? c->get(c->ud, key, t, found, e) : 0;
}

/* The CPU tables are fp32 or bf16: a profile in bf16 gets the BF16 table,
 * any other (fp16, fp8: no such CPU kernels) the fp32 one, as before. */
const char *ac_cost_cpu_table_dtype(const char *profile_dtype) {
    return profile_dtype && !strcmp(profile_dtype, "bf16") ? "bf16" : "fp32";
}

static int table_cpu(const char *dtype, const ac_cost_cache *cache, int threads, int allow_measure,
                     void (*progress)(void *, double), void *ud, ac_cost_table *t, int *cache_hit, ac_err *e) {
    char key[384];
    dtype = ac_cost_cpu_table_dtype(dtype);
    ac_cost_cpu_key(threads, dtype, key, sizeof key, NULL, 0);
    if (ac_cost_cache_lookup(cache, key, t, cache_hit, e)) return -1;
    if (*cache_hit) return 0;
    if (!allow_measure)
        return ac_errf(e,
                       "no measured cost table for this CPU yet (key %s); measure one with POST /v1/cost-tables "
                       "{\"measure\":{\"device\":\"cpu\",\"dtype\":\"%s\"}} or run a job on it",
                       key, dtype);
    return ac_cost_measure_cpu(threads, dtype, progress, ud, t, e);
}

static int table_cuda(const ac_target *target, const ac_cost_cache *cache, int allow_measure,
                      void (*progress)(void *, double), void *ud, ac_cost_table *t, int *cache_hit, ac_err *e) {
    const char *why;
    const ac_cuda_api *cu = ac_cuda(&why);
    int dev = ac_target_cuda_index(target);
    char device[32];
    snprintf(device, sizeof device, target->ordinal < 0 ? "cuda" : "cuda:%d", dev);
    if (!cu) return ac_errf(e, "target %s: %s; target a spec profile such as H100 instead", device, why);
    char name[128], key[384];
    double mem;
    int sms, cc;
    if (cu->device_info(dev, name, sizeof name, &mem, &sms, &cc))
        return ac_errf(e, "target %s: no such CUDA device", device);
    ac_cost_cuda_key(name, cc, key, sizeof key);
    if (ac_cost_cache_lookup(cache, key, t, cache_hit, e)) return -1;
    if (*cache_hit) return 0;
    if (!allow_measure) return ac_errf(e, "no measured cost table for %s yet (key %s)", device, key);
    char err[512] = "";
    double t0 = ac_now();
    if (progress) progress(ud, 0);
    acc_timings *tm = malloc(sizeof *tm);
    if (!tm) return ac_errf(e, "out of memory");
    int rc = cu->measure_timings(dev, tm, err, sizeof err) ? ac_errf(e, "measuring %s: %s", device, err)
                                                           : ac_cost_table_from_timings(tm, t, e);
    free(tm);
    if (rc) return -1;
    t->measure_s = ac_now() - t0;
    if (progress) progress(ud, 1);
    return 0;
}

int ac_cost_table_for(const ac_target *target, const char *dtype, const ac_cost_cache *cache, int threads,
                      int allow_measure, void (*progress)(void *, double), void *ud, ac_cost_table *t, int *cache_hit,
                      ac_err *e) {
    *cache_hit = 0;
    switch (target->kind) {
    case AC_TARGET_CPU: return table_cpu(dtype, cache, threads, allow_measure, progress, ud, t, cache_hit, e);
    case AC_TARGET_CUDA: return table_cuda(target, cache, allow_measure, progress, ud, t, cache_hit, e);
    case AC_TARGET_PROFILE: return ac_cost_roofline(target->profile, dtype, t, e);
    }
    return ac_errf(e, "unknown target kind");
}
