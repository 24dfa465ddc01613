/*
 * bench_cuda_upload - host memory and time of uploading a model to the CUDA
 * plugin's engine: loads the checkpoint resident (BF16/F16 left in the
 * mmap'd file), creates an engine for batch 1 x 8 tokens and reports the
 * process's resident set before and after and its peak (VmHWM) during the
 * upload. The transient (peak minus the resident set after) is what the
 * upload itself allocated on the host and freed. Under the CPU emulator
 * (AC_CUDA_PLUGIN=build/tests/libac_cuda_emu.so) device memory is host
 * memory, so the set after includes the "device" weights. Usage:
 * bench_cuda_upload [model_dir] (default build/models/tiny). Prints the
 * reason and exits 0 where the plugin or a device is missing.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "runtime/cuda_plugin.h"
#include "runtime/rope.h"
#include "format/safetensors.h"

static long status_kib(const char *key) {
    FILE *f = fopen("/proc/self/status", "r");
    char line[256];
    long v = -1;
    size_t k = strlen(key);
    while (f && fgets(line, sizeof line, f))
        if (!strncmp(line, key, k)) v = atol(line + k);
    if (f) fclose(f);
    return v;
}

static double now_s(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + t.tv_nsec * 1e-9;
}

int main(int argc, char **argv) {
    const char *arg = argc > 1 ? argv[1] : "build/models/tiny", *why;
    char dir[4096];
    if (!realpath(arg, dir)) return fprintf(stderr, "no model directory %s\n", arg), 1;
    const ac_cuda_api *cu = ac_cuda(&why);
    if (!cu) return printf("no GPU: %s\n", why), 0;
    ac_model m;
    ac_err e;
    if (ac_model_load_resident(dir, &m, &e)) return fprintf(stderr, "%s: %s\n", dir, e.msg), 1;
    int T = 8, rc = 0;
    size_t nr = (size_t)T * (m.a.head_dim / 2);
    float *cs = malloc(nr * sizeof *cs), *sn = malloc(nr * sizeof *sn);
    if (!cs || !sn || ac_rope_tables(&m.a, T, cs, sn, &e)) return fprintf(stderr, "rope tables\n"), 1;
    long rss0 = status_kib("VmRSS:");
    double t0 = now_s();
    acc_engine *g = NULL;
    char err[512] = "";
    if (cu->engine_create(0, &m, 1, T, cs, sn, &g, err, sizeof err)) {
        fprintf(stderr, "engine: %s\n", err);
        rc = 1;
    } else {
        double secs = now_s() - t0;
        long rss1 = status_kib("VmRSS:"), hwm = status_kib("VmHWM:");
        printf("%s (%s, %.3g parameters): upload %.2f s; host RSS before %ld MiB, after %ld MiB, peak %ld MiB; "
               "transient %ld MiB\n",
               dir, st_dtype_name((st_dtype)ac_model_wdt(&m)), ac_arch_params(&m.a), secs, rss0 / 1024, rss1 / 1024,
               hwm / 1024, (hwm - rss1) / 1024);
        cu->engine_free(g);
    }
    free(cs);
    free(sn);
    ac_model_free(&m);
    return rc;
}
