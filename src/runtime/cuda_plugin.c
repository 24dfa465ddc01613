/* cuda_plugin.c - see cuda_plugin.h. */
#include "runtime/cuda_plugin.h"

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

/* The plugin's table when h is a plugin of this build's ABI, else NULL with
 * the reason in why. */
static const ac_cuda_api *check(void *h, char *why, size_t n) {
    /* the ABI version first: an older plugin's table has another layout */
    int (*version)(void);
    *(void **)&version = dlsym(h, "acc_abi_version");
    int v = version ? version() : 1; /* plugins before versioning: 1 */
    if (v != ACC_ABI_VERSION) {
        snprintf(why, n, "CUDA plugin has ABI version %d, this build needs %d: rebuild libac_cuda.so", v,
                 ACC_ABI_VERSION);
        return NULL;
    }
    const ac_cuda_api *(*entry)(void);
    *(void **)&entry = dlsym(h, "acc_api");
    const ac_cuda_api *got = entry ? entry() : NULL;
    if (!got || !got->device_count || !got->device_info || !got->engine_create || !got->engine_forward ||
        !got->engine_nll || !got->engine_update || !got->engine_free || !got->time_gemm || !got->measure_timings ||
        !got->convert || !got->op_test) {
        snprintf(why, n, "CUDA plugin has no complete acc_api table (built from other sources?)");
        return NULL;
    }
    return got;
}

int ac_cuda_plugin_check(const char *path, char *why, size_t n) {
    void *h = dlopen(path, RTLD_NOW | RTLD_LOCAL);
    if (!h) {
        snprintf(why, n, "cannot load %.200s: %.250s", path, dlerror());
        return -1;
    }
    int rc = check(h, why, n) ? 0 : -1;
    if (!rc) snprintf(why, n, "ok");
    dlclose(h);
    return rc;
}

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
    const ac_cuda_api *got = check(h, why_buf, sizeof why_buf);
    if (!got) return;
    api = *got;
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
