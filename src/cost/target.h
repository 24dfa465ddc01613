/*
 * target.h - what a job, an estimate, the CLI and the scheduler mean by
 * `target.device`: the local CPU, a local CUDA GPU (any, or ordinal N), or a
 * named GPU spec profile (roofline tables). Parsed here and nowhere else.
 */
#ifndef AC_TARGET_H
#define AC_TARGET_H

#include "cost/device.h"
#include "core/err.h"

typedef enum { AC_TARGET_CPU, AC_TARGET_CUDA, AC_TARGET_PROFILE } ac_target_kind;

typedef struct {
    ac_target_kind kind;
    int ordinal;                   /* AC_TARGET_CUDA: device index, -1 = "cuda" (any; device 0 of the process) */
    const ac_device_spec *profile; /* AC_TARGET_PROFILE: the datasheet entry */
} ac_target;

/* "cpu", "cuda", "cuda:N" (N in 0..999) or a profile name as
 * ac_device_spec_find accepts it. On failure e says what is allowed. */
int ac_target_resolve(const char *device, ac_target *t, ac_err *e);

/* The CUDA device a local-GPU target runs on inside this process (0 for "cuda"). */
static inline int ac_target_cuda_index(const ac_target *t) { return t->ordinal < 0 ? 0 : t->ordinal; }

#endif
