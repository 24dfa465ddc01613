/* device.c - see device.h. */
#include "cost/device.h"

#include <dlfcn.h>
#include <stdio.h>
#include <string.h>
#include <strings.h>
#include <sys/sysinfo.h>
#include <unistd.h>

/*
 * Datasheet figures (dense BF16 tensor TFLOP/s with FP32 accumulate, memory,
 * bandwidth). Sources: NVIDIA H100 datasheet (SXM5: 989 TFLOPS dense BF16,
 * 80 GB, 3.35 TB/s); H200 datasheet (same compute as H100 SXM, 141 GB,
 * 4.8 TB/s); B200 / DGX B200 spec (2.25 PFLOPS dense BF16 per GPU, 180 GB,
 * 7.7 TB/s); A100 datasheet (312 TFLOPS BF16, 80 GB, 2.039 TB/s); L4
 * datasheet (121 TFLOPS BF16 dense, 24 GB, 300 GB/s); Ada whitepaper
 * (RTX 4090: 165 TFLOPS BF16 w/ FP32 accumulate, 24 GB, 1008 GB/s); RTX 5080 /
 * 5070 (Blackwell GeForce: 16 GB 960 GB/s, 12 GB 672 GB/s; BF16 with FP32
 * accumulate taken as half the FP16-accumulate rate their specs give;
 * docs/costmodel.md).
 * launch_us: typical per-kernel launch + scheduling cost with CUDA graphs off.
 * fp8: FP8 tensor cores (the A100 has none: FP8 weights run weight-only).
 * nvlink_gbs / pcie_gbs: all-reduce bus bandwidth assumed for tensor
 * parallelism (NVLink 4 / 5 / 3 at about 80 % of the per-direction link
 * rate; PCIe Gen4/Gen5 x16 without peer access, through the host), not
 * measured here; docs/costmodel.md.
 * fp16acc_tflops: dense FP16 tensor rate with FP16 accumulate where it
 * differs from the FP32-accumulate one: the GeForce parts run FP32
 * accumulate at half rate (Ada whitepaper, RTX 4090: 330.3 with FP16
 * accumulate, 165.2 with FP32); the Blackwell GeForce entries' BF16 rate
 * is half the FP16-accumulate figure of their specs, so it is twice
 * theirs. The data-centre datasheets give one rate for both (0 here).
 * sms: streaming multiprocessors, for the wave model of GEMM tiles
 * (costroofline.c): H100 SXM5 and H200 132, B200 148, A100 108 (their
 * datasheets / architecture whitepapers), L4 58, RTX 4090 128 (Ada
 * whitepaper), RTX 5080 84, RTX 5070 48 (Blackwell GeForce specs).
 * ll_gbs: NCCL's ceiling on the bus bandwidth of its LL protocol within one
 * node, by the GPU's generation (src/graph/tuning.cc, llMaxBws: Ampere and
 * Ada 87.7 GB/s, Hopper 141, Blackwell 282); engines.c's all-reduce model.
 */
const ac_device_spec ac_device_specs[] = {
    {"H100", "NVIDIA H100 SXM 80GB", 989, 80, 3350, 4.0, "NVIDIA H100 datasheet", 1, 360, 50, 0, 132, 141},
    {"H200", "NVIDIA H200 SXM 141GB", 989, 141, 4800, 4.0, "NVIDIA H200 datasheet", 1, 360, 50, 0, 132, 141},
    {"B200", "NVIDIA B200 180GB", 2250, 180, 7700, 4.0, "NVIDIA DGX B200 specification", 1, 720, 50, 0, 148, 282},
    {"A100", "NVIDIA A100 SXM 80GB", 312, 80, 2039, 5.0, "NVIDIA A100 datasheet", 0, 230, 25, 0, 108, 87.7},
    {"L4", "NVIDIA L4 24GB", 121, 24, 300, 5.0, "NVIDIA L4 datasheet", 1, 0, 20, 0, 58, 87.7},
    {"RTX4090", "NVIDIA GeForce RTX 4090", 165, 24, 1008, 5.0, "NVIDIA Ada Lovelace architecture whitepaper", 1, 0, 20,
     330.3, 128, 87.7},
    {"RTX5080", "NVIDIA GeForce RTX 5080", 113, 16, 960, 5.0, "Blackwell GeForce specs; BF16/FP32-acc derived", 1, 0,
     40, 226, 84, 282},
    {"RTX5070", "NVIDIA GeForce RTX 5070", 62, 12, 672, 5.0, "Blackwell GeForce specs; BF16/FP32-acc derived", 1, 0,
     40, 124, 48, 282},
    {NULL, NULL, 0, 0, 0, 0, NULL, 0, 0, 0, 0, 0, 0},
};

const ac_device_spec *ac_device_spec_find(const char *name) {
    for (const ac_device_spec *s = ac_device_specs; s->name; s++) {
        if (!strcasecmp(s->name, name) || !strcasecmp(s->full_name, name)) return s;
        /* accept "H100-SXM", "rtx 4090" style spellings */
        char a[64], b[64];
        size_t j = 0;
        for (const char *p = name; *p && j < sizeof a - 1; p++)
            if (*p != ' ' && *p != '-' && *p != '_') a[j++] = *p;
        a[j] = 0;
        snprintf(b, sizeof b, "%s", s->name);
        if (!strncasecmp(a, b, strlen(b)) && (a[strlen(b)] == 0 || !strcasecmp(a + strlen(b), "SXM"))) return s;
    }
    return NULL;
}

const ac_device_spec *ac_device_spec_for_gpu(const char *gpu_name) {
    char compact[160];
    size_t j = 0;
    for (const char *p = gpu_name; *p && j < sizeof compact - 1; p++)
        if (*p != ' ') compact[j++] = *p;
    compact[j] = 0;
    for (const ac_device_spec *s = ac_device_specs; s->name; s++)
        if (strcasestr(compact, s->name)) return s;
    return NULL;
}

json_t *ac_device_spec_json(const ac_device_spec *s) {
    return json_pack("{s:s,s:s,s:f,s:f,s:f,s:f,s:f,s:s,s:b,s:f,s:f,s:i}", "name", s->name, "full_name", s->full_name,
                     "bf16_tflops", s->bf16_tflops, "fp16acc_tflops",
                     s->fp16acc_tflops > 0 ? s->fp16acc_tflops : s->bf16_tflops, "memory_gib", s->mem_gib, "bandwidth_gbs", s->bw_gbs, "launch_us",
                     s->launch_us, "source", s->source, "fp8_tensor_cores", s->fp8, "nvlink_gbs", s->nvlink_gbs,
                     "pcie_gbs", s->pcie_gbs, "sms", s->sms);
}

typedef int (*cu_i)(unsigned);
typedef int (*cu_ip)(int *);
typedef int (*cu_dev)(int *, int);
typedef int (*cu_name)(char *, int, int);
typedef int (*cu_mem)(size_t *, int);
typedef int (*cu_attr)(int *, int, int);
typedef int (*cu_ctx_retain)(void **, int);
typedef int (*cu_ctx_set)(void *);
typedef int (*cu_meminfo)(size_t *, size_t *);
typedef int (*cu_ctx_release)(int);

static int cuda_devices(ac_local_device *out, int max) {
    setenv("CUDA_DEVICE_ORDER", "PCI_BUS_ID", 0); /* before cuInit; workers inherit it */
    void *h = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
    if (!h) return 0;
    cu_i init = (cu_i)dlsym(h, "cuInit");
    cu_ip count = (cu_ip)dlsym(h, "cuDeviceGetCount"), drv = (cu_ip)dlsym(h, "cuDriverGetVersion");
    cu_dev get = (cu_dev)dlsym(h, "cuDeviceGet");
    cu_name name = (cu_name)dlsym(h, "cuDeviceGetName");
    cu_mem mem = (cu_mem)dlsym(h, "cuDeviceTotalMem_v2");
    cu_attr attr = (cu_attr)dlsym(h, "cuDeviceGetAttribute");
    cu_ctx_retain retain = (cu_ctx_retain)dlsym(h, "cuDevicePrimaryCtxRetain");
    cu_ctx_set set = (cu_ctx_set)dlsym(h, "cuCtxSetCurrent");
    cu_meminfo meminfo = (cu_meminfo)dlsym(h, "cuMemGetInfo_v2");
    cu_ctx_release release = (cu_ctx_release)dlsym(h, "cuDevicePrimaryCtxRelease_v2");
    int n = 0, dv = 0;
    if (!init || !count || !get || !name || !mem || !attr || init(0) != 0 || count(&n) != 0) {
        dlclose(h);
        return 0;
    }
    if (drv) drv(&dv);
    int k = 0;
    for (int i = 0; i < n && k < max; i++) {
        int dev;
        if (get(&dev, i) != 0) continue;
        ac_local_device *d = &out[k++];
        memset(d, 0, sizeof *d);
        d->index = i;
        d->driver = dv;
        name(d->name, sizeof d->name, dev);
        size_t total = 0;
        mem(&total, dev);
        d->mem_gib = total / 1073741824.0;
        attr(&d->sms, 16 /* MULTIPROCESSOR_COUNT */, dev);
        attr(&d->cc_major, 75, dev);
        attr(&d->cc_minor, 76, dev);
        void *ctx;
        size_t fr = 0, tot = 0;
        if (retain && set && meminfo && retain(&ctx, dev) == 0) {
            if (set(ctx) == 0 && meminfo(&fr, &tot) == 0) d->free_gib = fr / 1073741824.0;
            if (release) release(dev);
        }
    }
    dlclose(h);
    return k;
}

int ac_devices_local(ac_local_device *out, int max) {
    if (max <= 0) return 0;
    ac_local_device *c = &out[0];
    memset(c, 0, sizeof *c);
    c->index = -1;
    snprintf(c->name, sizeof c->name, "cpu");
    FILE *f = fopen("/proc/cpuinfo", "r");
    char line[512];
    while (f && fgets(line, sizeof line, f)) {
        if (!strncmp(line, "model name", 10)) {
            char *p = strchr(line, ':');
            if (p) {
                p += 2;
                p[strcspn(p, "\n")] = 0;
                snprintf(c->name, sizeof c->name, "cpu: %s", p);
            }
            break;
        }
    }
    if (f) fclose(f);
    c->cores = (int)sysconf(_SC_NPROCESSORS_ONLN);
    struct sysinfo si;
    if (sysinfo(&si) == 0) {
        c->mem_gib = (double)si.totalram * si.mem_unit / 1073741824.0;
        c->free_gib = (double)si.freeram * si.mem_unit / 1073741824.0;
    }
    return 1 + cuda_devices(out + 1, max - 1);
}

void ac_cpu_isa(char *out, size_t n) {
    static const char *const isa[] = {"avx2", "fma", "avx512f", "avx512_bf16", "amx_bf16"};
    char line[8192];
    int have[sizeof isa / sizeof *isa] = {0};
    FILE *f = fopen("/proc/cpuinfo", "r");
    while (f && fgets(line, sizeof line, f)) {
        if (strncmp(line, "flags", 5)) continue;
        for (char *save = NULL, *w = strtok_r(strchr(line, ':') ? strchr(line, ':') + 1 : line, " \t\n", &save); w;
             w = strtok_r(NULL, " \t\n", &save))
            for (size_t i = 0; i < sizeof isa / sizeof *isa; i++) have[i] |= !strcmp(w, isa[i]);
        break; /* the first CPU's: they are alike */
    }
    if (f) fclose(f);
    size_t k = 0;
    if (n) out[0] = 0;
    for (size_t i = 0; i < sizeof isa / sizeof *isa; i++)
        if (have[i] && k < n) k += (size_t)snprintf(out + k, n - k, "%s%s", k ? " " : "", isa[i]);
    if (n && !out[0]) snprintf(out, n, "none");
}

int ac_cuda_driver_version(void) {
    void *h = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
    if (!h) return 0;
    cu_ip drv = (cu_ip)dlsym(h, "cuDriverGetVersion");
    int v = 0;
    if (!drv || drv(&v) != 0) v = 0;
    dlclose(h);
    return v;
}

json_t *ac_local_device_json(const ac_local_device *d) {
    if (d->index < 0)
        return json_pack("{s:s,s:s,s:s,s:i,s:f,s:f}", "id", "cpu", "kind", "cpu", "name", d->name, "cores", d->cores,
                         "memory_gib", d->mem_gib, "free_gib", d->free_gib);
    char id[32], cc[16];
    snprintf(id, sizeof id, "cuda:%d", d->index);
    snprintf(cc, sizeof cc, "%d.%d", d->cc_major, d->cc_minor);
    return json_pack("{s:s,s:s,s:s,s:i,s:f,s:f,s:i,s:s,s:i}", "id", id, "kind", "cuda", "name", d->name, "index",
                     d->index, "memory_gib", d->mem_gib, "free_gib", d->free_gib, "sms", d->sms, "compute_capability",
                     cc, "driver", d->driver);
}

int ac_cuda_pin(const char *current, int ordinal, char *out, size_t n) {
    if (ordinal < 0 || n == 0) return -1;
    if (!current || !*current) return snprintf(out, n, "%d", ordinal) < (int)n ? 0 : -1;
    const char *p = current;
    for (int i = 0; i < ordinal; i++) {
        p = strchr(p, ',');
        if (!p) return -1;
        p++;
    }
    size_t len = strcspn(p, ",");
    while (len && (*p == ' ')) {
        p++;
        len--;
    }
    while (len && p[len - 1] == ' ') len--;
    if (len == 0 || len >= n) return -1;
    memcpy(out, p, len);
    out[len] = 0;
    return 0;
}

double ac_host_mem_available(void) {
    FILE *f = fopen("/proc/meminfo", "r");
    char line[256];
    double kb = 0;
    while (f && fgets(line, sizeof line, f))
        if (sscanf(line, "MemAvailable: %lf kB", &kb) == 1) break;
    if (f) fclose(f);
    return kb * 1024;
}
