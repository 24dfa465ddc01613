/*
 * device.h - what hardware a job can run on or target.
 *
 * Local discovery: the CPU (model, cores, memory) and CUDA GPUs through the
 * CUDA driver API, loaded with dlopen so the library has no link-time CUDA
 * dependency and runs unchanged where there is no driver.
 * Named spec profiles: datasheet figures of GPUs that need not be present,
 * for roofline cost tables.
 */
#ifndef AC_DEVICE_H
#define AC_DEVICE_H

#include <jansson.h>
#include <stddef.h>

typedef struct {
    char name[128];
    int index; /* CUDA ordinal, -1 for the CPU */
    double mem_gib, free_gib;
    int sms, cc_major, cc_minor, driver;
    int cores; /* CPU */
} ac_local_device;

/* Fills up to max entries (CPU first) and returns the count. Ordinals are in
 * PCI bus order (CUDA_DEVICE_ORDER=PCI_BUS_ID unless the environment sets
 * it), as nvidia-smi numbers them. */
int ac_devices_local(ac_local_device *out, int max);

/* What makes two hosts with the same CPU model name different kinds of node
 * for measured cost tables (costmeasure.c keys): the instruction sets the
 * CPU kernels choose between (avx2, fma, avx512f, avx512_bf16, amx_bf16),
 * as the kernel reports them in /proc/cpuinfo (a VM can hide some), as a
 * space-separated list into out ("none" when it has none of them). */
void ac_cpu_isa(char *out, size_t n);
/* The CUDA driver's version (cuDriverGetVersion, e.g. 12040), 0 without one. */
int ac_cuda_driver_version(void);

/* The host memory a new allocation can count on: MemAvailable of
 * /proc/meminfo in bytes, else 0 (unknown). */
double ac_host_mem_available(void);

/* The CUDA_VISIBLE_DEVICES value that makes device 0 of a child process the
 * GPU this process calls `ordinal`: the ordinal itself, or, when this process
 * runs under a CUDA_VISIBLE_DEVICES list (`current`, NULL when unset), the
 * list's entry at that position. Returns 0, or -1 when the ordinal is not in
 * the list or out is too small. */
int ac_cuda_pin(const char *current, int ordinal, char *out, size_t n);
json_t *ac_local_device_json(const ac_local_device *d);

typedef struct {
    const char *name; /* short name used in job specs, e.g. "H100" */
    const char *full_name;
    double bf16_tflops; /* dense BF16, FP32 accumulate */
    double mem_gib;
    double bw_gbs;    /* memory bandwidth, GB/s */
    double launch_us; /* kernel launch + scheduling per op */
    const char *source;
    int fp8;           /* FP8 tensor cores (Ada, Hopper, Blackwell); 0: FP8 weights run weight-only at the BF16 rate */
    double nvlink_gbs; /* all-reduce bus bandwidth over NVLink, GB/s (0: no NVLink) */
    double pcie_gbs;   /* the same over PCIe (through the host where there is no peer access) */
    double fp16acc_tflops; /* dense FP16 with FP16 accumulate (0: the BF16 rate; GeForce parts: twice it) */
    int sms;               /* streaming multiprocessors (0: unknown; no wave model) */
    double ll_gbs;         /* NCCL's cap on its LL protocol's bus bandwidth in one node (llMaxBws, by generation) */
} ac_device_spec;

extern const ac_device_spec ac_device_specs[];
const ac_device_spec *ac_device_spec_find(const char *name);
/* The profile whose short name appears in a CUDA device name
 * ("NVIDIA H200" -> H200), or NULL. */
const ac_device_spec *ac_device_spec_for_gpu(const char *gpu_name);
json_t *ac_device_spec_json(const ac_device_spec *s);

#endif
