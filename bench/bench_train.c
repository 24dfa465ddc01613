/* bench_train.c - forward + loss + backward tokens/s of the training engine
 * (src/runtime/train.c), as bench/bench_train.py compares against PyTorch:
 *   bench_train MODEL_DIR BATCH CTX STEPS THREADS [cuda]
 * prints {"tok_per_s": best of the timed steps, "median_tok_per_s": ...}.
 * With "cuda": the plugin's trainer on GPU 0, each step also an AdamW update
 * (src/cuda/ac_cuda_train.cu; tools/gpu_check.sh-style runs on a GPU host). */
#include <stdio.h>
#include <stdlib.h>

#include "runtime/cuda_plugin.h"
#include "runtime/kernels_cpu.h"
#include "format/model.h"
#include "runtime/rope.h"
#include "runtime/train.h"

static int cmp(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

int main(int argc, char **argv) {
    if (argc != 6 && argc != 7) {
        fprintf(stderr, "usage: bench_train MODEL_DIR BATCH CTX STEPS THREADS [cuda]\n");
        return 2;
    }
    int B = atoi(argv[2]), T = atoi(argv[3]), steps = atoi(argv[4]);
    ac_set_threads(atoi(argv[5]));
    ac_model m;
    ac_trainer t;
    ac_err e = {{0}};
    if (ac_model_load(argv[1], &m, &e) || ac_trainer_init(&t, &m, B, T, &e)) {
        fprintf(stderr, "bench_train: %s\n", e.msg);
        return 1;
    }
    int *tok = malloc(sizeof(int) * B * T), *tgt = malloc(sizeof(int) * B * T);
    double *dt = malloc(sizeof(double) * (steps + 1));
    unsigned s = 1;
    for (int i = 0; i < B * T; i++) tok[i] = (int)((s = s * 1103515245u + 12345u) >> 8) % m.a.vocab;
    ac_next_token_targets(tgt, tok, B, T);
    const ac_cuda_api *cu = NULL;
    acc_trainer *ct = NULL;
    char er[512] = "";
    if (argc == 7) {
        const char *why;
        if (!(cu = ac_cuda(&why)) || !cu->trainer_create) {
            fprintf(stderr, "bench_train: no CUDA trainer: %s\n", why);
            return 1;
        }
        size_t nr = (size_t)T * (m.a.head_dim / 2);
        float *cs = malloc(nr * sizeof *cs), *sn = malloc(nr * sizeof *sn);
        if (!cs || !sn || ac_rope_tables(&m.a, T, cs, sn, &e) ||
            cu->trainer_create(0, &m, B, T, cs, sn, &ct, er, sizeof er)) {
            fprintf(stderr, "bench_train: %s\n", er[0] ? er : e.msg);
            return 1;
        }
        free(cs);
        free(sn);
    }
    for (int i = 0; ct && i <= steps; i++) {
        double t0 = ac_now(), loss;
        if (cu->trainer_grad(ct, tok, tgt, NULL, B, T, 1, 0, 1, &loss, er, sizeof er) ||
            cu->trainer_step(ct, 1e-4f, 0.9f, 0.95f, 1e-8f, 0.0f, 1.0f, i, NULL, er, sizeof er)) {
            fprintf(stderr, "bench_train: %s\n", er);
            return 1;
        }
        dt[i] = ac_now() - t0;
    }
    for (int i = 0; !ct && i <= steps; i++) { /* step 0 warms up */
        double t0 = ac_now();
        if (ac_train_forward(&t, tok, B, T, &e)) {
            fprintf(stderr, "bench_train: %s\n", e.msg);
            return 1;
        }
        ac_train_loss(&t, tgt, NULL, 1, 0, 1, NULL, NULL);
        ac_train_backward(&t);
        ac_train_zero_grad(&t);
        dt[i] = ac_now() - t0;
    }
    qsort(dt + 1, steps, sizeof(double), cmp);
    printf("{\"tok_per_s\": %.1f, \"median_tok_per_s\": %.1f}\n", B * T / dt[1], B * T / dt[1 + steps / 2]);
    free(dt);
    if (ct) cu->trainer_free(ct);
    free(tok);
    free(tgt);
    ac_trainer_free(&t);
    ac_model_free(&m);
    return 0;
}
