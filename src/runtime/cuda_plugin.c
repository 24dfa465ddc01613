/* cuda_plugin.c - see cuda_plugin.h. */
#include "cuda_plugin.h"

#include <dlfcn.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "safetensors.h"

static ac_cuda_api api;
static const ac_cuda_api *loaded;
static int (*plugin_engine_create)(int, const ac_model *, int, int, const float *, const float *, acc_engine **, char *,
                                   size_t);

/* The plugin reads fp32 matrices: a resident (BF16/F16) model is uploaded
 * from a transient fp32 copy, freed as soon as the weights are on the
 * device (the host holds it only during the upload). */
static int engine_create_any(int dev, const ac_model *m, int max_batch, int max_ctx, const float *rope_cos,
                             const float *rope_sin, acc_engine **out, char *err, size_t errn) {
    if (ac_model_wdt(m) == ST_F32)
        return plugin_engine_create(dev, m, max_batch, max_ctx, rope_cos, rope_sin, out, err, errn);
    ac_model f;
    ac_err e;
    if (ac_model_to_f32(m, &f, &e)) {
        snprintf(err, errn, "fp32 copy for the upload: %s", e.msg);
        return -1;
    }
    int rc = plugin_engine_create(dev, &f, max_batch, max_ctx, rope_cos, rope_sin, out, err, errn);
    ac_model_free(&f);
    return rc;
}
static char why_buf[512] = "not probed";
static pthread_once_t once = PTHREAD_ONCE_INIT;

static void load(void) {
    char paths[4][1100];
    int np = 0;
    const char *env = getenv("AC_CUDA_PLUGIN");
    if (env && *env) snprintf(paths[np++], sizeof paths[0], "%s", env);
    char exe[1024];
    ssize_t n = readlink("/proc/self/exe", exe, sizeof exe - 1);
    if (n > 0) {
        exe[n] = 0;
        char *slash = strrchr(exe, '/');
        if (slash) {
            *slash = 0;
            snprintf(paths[np++], sizeof paths[0], "%s/libac_cuda.so", exe);    /* build/ binaries */
            snprintf(paths[np++], sizeof paths[0], "%s/../libac_cuda.so", exe); /* build/tests, build/bench */
        }
    }
    snprintf(paths[np++], sizeof paths[0], "libac_cuda.so");
    void *h = NULL;
    for (int i = 0; i < np && !h; i++) {
        if (i < np - 1 && access(paths[i], R_OK) != 0) continue;
        h = dlopen(paths[i], RTLD_NOW | RTLD_LOCAL);
        if (!h) snprintf(why_buf, sizeof why_buf, "cannot load %.200s: %.250s", paths[i], dlerror());
    }
    if (!h) {
        if (!strcmp(why_buf, "not probed"))
            snprintf(why_buf, sizeof why_buf, "CUDA plugin libac_cuda.so not built (no nvcc at build time)");
        return;
    }
    const ac_cuda_api *(*entry)(void);
    *(void **)&entry = dlsym(h, "acc_api");
    const ac_cuda_api *got = entry ? entry() : NULL;
    if (!got || !got->device_count || !got->device_info || !got->engine_create || !got->engine_forward ||
        !got->engine_nll || !got->engine_update || !got->engine_free || !got->time_gemm || !got->measure_timings) {
        snprintf(why_buf, sizeof why_buf, "CUDA plugin has no complete acc_api table (built from other sources?)");
        return;
    }
    api = *got;
    plugin_engine_create = api.engine_create;
    api.engine_create = engine_create_any;
    if (api.device_count() <= 0) {
        snprintf(why_buf, sizeof why_buf, "no CUDA device present (plugin loaded)");
        return;
    }
    loaded = &api;
    snprintf(why_buf, sizeof why_buf, "ok");
}

const ac_cuda_api *ac_cuda(const char **why) {
    pthread_once(&once, load);
    if (why) *why = why_buf;
    return loaded;
}
