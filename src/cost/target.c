/* target.c - see target.h. */
#include "cost/target.h"

#include <string.h>

int ac_target_resolve(const char *device, ac_target *t, ac_err *e) {
    memset(t, 0, sizeof *t);
    t->ordinal = -1;
    if (!device || !*device) return ac_errf(e, "target.device must be a non-empty string");
    if (!strcmp(device, "cpu")) {
        t->kind = AC_TARGET_CPU;
        return 0;
    }
    if (!strncmp(device, "cuda", 4)) {
        t->kind = AC_TARGET_CUDA;
        if (!device[4]) return 0;
        const char *p = device + 5;
        size_t n = strspn(p, "0123456789");
        if (device[4] != ':' || n < 1 || n > 3 || p[n]) return ac_errf(e, "target.device must be cuda or cuda:N");
        t->ordinal = 0;
        for (size_t i = 0; i < n; i++) t->ordinal = t->ordinal * 10 + (p[i] - '0');
        return 0;
    }
    t->profile = ac_device_spec_find(device);
    if (!t->profile)
        return ac_errf(
            e,
            "target.device must be cpu, cuda, cuda:N or a known GPU profile (H100, H200, B200, A100, L4, RTX4090, "
            "RTX5080, RTX5070; see GET /v1/devices); got %.64s",
            device);
    t->kind = AC_TARGET_PROFILE;
    return 0;
}
