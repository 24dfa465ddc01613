/* rope.c - see rope.h. */
#include "runtime/rope.h"

#include <math.h>
#include <stdlib.h>

#include "runtime/kernels_cpu.h"

int ac_rope_tables(const ac_arch *a, int max_ctx, float *cos_t, float *sin_t, ac_err *e) {
    size_t hd = a->head_dim;
    float *inv = malloc(hd / 2 * sizeof *inv);
    if (!inv) return ac_errf(e, "out of memory");
    ac_rope_inv_freq(inv, (int)hd, a->rope_theta, a->rope_llama3, a->rs_factor, a->rs_low, a->rs_high, a->rs_orig);
    for (int p = 0; p < max_ctx; p++)
        for (size_t i = 0; i < hd / 2; i++) {
            float ang = (float)p * inv[i];
            cos_t[p * hd / 2 + i] = cosf(ang);
            sin_t[p * hd / 2 + i] = sinf(ang);
        }
    free(inv);
    return 0;
}
