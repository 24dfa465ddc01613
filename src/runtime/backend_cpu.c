/* backend_cpu.c - the CPU engine (engine.c) behind the backend interface (backend_int.h). */
#include <stdlib.h>

#include "backend_int.h"

struct ac_backend_engine {
    ac_engine en;
    ac_engine_hooks hooks; /* the caller's observers (activation statistics), when given */
};

static int cpu_open(const ac_model *m, int max_batch, int max_ctx, const ac_engine_hooks *hooks,
                    ac_backend_engine **out, ac_err *e) {
    ac_backend_engine *b = calloc(1, sizeof *b);
    if (!b) return ac_errf(e, "out of memory");
    if (ac_engine_init(&b->en, m, max_batch, max_ctx, e)) {
        free(b);
        return -1;
    }
    if (hooks) {
        b->hooks = *hooks;
        b->en.hooks = &b->hooks;
    }
    *out = b;
    return 0;
}

static int cpu_step(ac_backend_engine *b, const int *tok, int B, int n, int pos0, ac_err *e) {
    return ac_engine_forward(&b->en, tok, B, n, pos0, 1, e);
}

static int cpu_window_nll(ac_backend_engine *b, const int *tok, int nb, int ctx, int from, double *sum, long *count,
                          ac_err *e) {
    if (ac_engine_forward(&b->en, tok, nb, ctx, 0, 0, e)) return -1;
    double mean = ac_engine_nll(&b->en, tok, nb, ctx, from, count);
    *sum = mean * *count;
    return 0;
}

/* The CPU engine reads the model's weights directly: nothing to copy. */
static int cpu_weights_changed(ac_backend_engine *b, int layer, ac_wmat which, ac_err *e) {
    (void)b, (void)layer, (void)which, (void)e;
    return 0;
}

static void cpu_close(ac_backend_engine *b) {
    if (!b) return;
    ac_engine_free(&b->en);
    free(b);
}

const ac_backend ac_backend_cpu = {"cpu", cpu_open, cpu_step, cpu_window_nll, cpu_weights_changed, cpu_close};
