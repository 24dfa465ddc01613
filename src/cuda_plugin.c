/* cuda_plugin.c - see cuda_plugin.h. */
#include "cuda_plugin.h"

#include <dlfcn.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static ac_cuda_api api;
static const ac_cuda_api *loaded;
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
        if (!strcmp(why_buf, "not probed")) snprintf(why_buf, sizeof why_buf, "CUDA plugin libac_cuda.so not built (no nvcc at build time)");
        return;
    }
#define SYM(field, name) *(void **)&api.field = dlsym(h, name)
    SYM(device_count, "acc_device_count");
    SYM(device_info, "acc_device_info");
    SYM(engine_create, "acc_engine_create");
    SYM(engine_forward, "acc_engine_forward");
    SYM(engine_nll, "acc_engine_nll");
    SYM(engine_update, "acc_engine_update");
    SYM(engine_free, "acc_engine_free");
    SYM(time_gemm, "acc_time_gemm");
    SYM(measure_table, "acc_measure_table");
    SYM(trainer_create, "acc_trainer_create");
    SYM(trainer_grad, "acc_trainer_grad");
    SYM(trainer_step, "acc_trainer_step");
    SYM(trainer_download, "acc_trainer_download");
    SYM(trainer_free, "acc_trainer_free");
    SYM(trainer_gates, "acc_trainer_gates");
    if (!api.trainer_create || !api.trainer_grad || !api.trainer_step || !api.trainer_download || !api.trainer_free || !api.trainer_gates)
        api.trainer_create = NULL; /* an older plugin: training stays on the CPU */
#undef SYM
    if (!api.device_count || !api.device_info || !api.engine_create || !api.engine_forward || !api.engine_nll || !api.engine_update || !api.engine_free || !api.time_gemm || !api.measure_table) {
        snprintf(why_buf, sizeof why_buf, "CUDA plugin is missing symbols");
        return;
    }
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
