/* distill.c - see distill.h. */
#include "compress/distill.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "runtime/cuda_plugin.h"
#include "cost/device.h"
#include "runtime/engine.h"
#include "runtime/optim.h"
#include "runtime/rope.h"
#include "runtime/train.h"

void ac_distill_defaults(ac_distill_opts *o) {
    *o = (ac_distill_opts){.tokens = 0,
                           .seq_len = 128,
                           .batch = 8,
                           .lr = 1e-3f,
                           .min_lr = 1e-4f,
                           .warmup = -1,
                           .weight_decay = 0.01f,
                           .clip = 1.0f,
                           .temperature = 1.0f,
                           .ce_weight = 0.0f,
                           .seed = 1,
                           .mem_limit = 0};
}

/* ac_engine_init's buffers for batch B x context T (engine.c). */
static double engine_bytes(const ac_arch *a, int B, int T) {
    double N = (double)B * T, H = a->hidden, hd = a->head_dim, mq = 0, mf = 0, mkv = 0, kvc = 0;
    for (int l = 0; l < a->n_layers; l++) {
        mq = fmax(mq, a->layers[l].n_heads * hd);
        mkv = fmax(mkv, a->layers[l].n_kv_heads * hd);
        mf = fmax(mf, a->layers[l].ffn);
        kvc += 2 * N * a->layers[l].n_kv_heads * hd;
    }
    return 4 * (3 * N * H + 2 * N * (mq + 1) + 2 * N * (mf + 1) + 2 * N * (mkv + 1) + (double)T * T + N * a->vocab +
                T * hd + kvc) +
           4 * N;
}

double ac_distill_mem_bytes(const ac_arch *teacher, const ac_arch *student, int batch, int seq_len) {
    double ps = ac_arch_params(student), pt = ac_arch_params(teacher);
    /* weights + 2 Adam moments (gradients are inside ac_trainer_bytes) */
    return 3 * 4 * ps + (double)ac_trainer_bytes(student, batch, seq_len) + 4 * pt +
           engine_bytes(teacher, batch, seq_len);
}

/* MemAvailable in bytes, else total memory, else 0. */
static double host_available(void) {
    double avail = ac_host_mem_available();
    if (avail > 0) return avail;
    ac_local_device d[1];
    return ac_devices_local(d, 1) > 0 ? d[0].mem_gib * 1073741824.0 : 0;
}

static unsigned long long rng_next(unsigned long long *s) {
    unsigned long long x = *s;
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    return *s = x;
}

static int check_opts(const ac_model *teacher, const ac_model *student, size_t n, const ac_distill_opts *o, ac_err *e) {
    if (teacher->a.vocab != student->a.vocab)
        return ac_errf(e, "distill: teacher vocabulary %d differs from the student's %d", teacher->a.vocab,
                       student->a.vocab);
    if (o->batch <= 0 || o->seq_len < 2)
        return ac_errf(e, "distill.batch and distill.seq_len must be at least 1 and 2");
    if (o->tokens < 0 || o->tokens > AC_DISTILL_MAX_TOKENS)
        return ac_errf(e, "distill.tokens=%ld is outside [0, %ld]", o->tokens, AC_DISTILL_MAX_TOKENS);
    if (n < (size_t)o->batch * o->seq_len + 1)
        return ac_errf(e,
                       "distill.text: %zu tokens is shorter than one batch (distill.batch %d x distill.seq_len %d + 1)",
                       n, o->batch, o->seq_len);
    double need = ac_distill_mem_bytes(&teacher->a, &student->a, o->batch, o->seq_len),
           have = o->mem_limit > 0 ? o->mem_limit : host_available();
    if (o->cuda) {
        const char *why;
        const ac_cuda_api *cu = ac_cuda(&why);
        if (!cu) return ac_errf(e, "distill: no CUDA device: %s", why);
        if (!cu->trainer_create) return ac_errf(e, "distill: the CUDA plugin has no trainer (rebuild it)");
        char name[128];
        double gib = 0;
        int sms, cc;
        if (o->mem_limit <= 0 && cu->device_info(0, name, sizeof name, &gib, &sms, &cc) == 0) have = gib * 1073741824.0;
    }
    if (have > 0 && need > 0.9 * have)
        return ac_errf(e,
                       "distill.batch: distillation needs about %.3g GiB (student weights, gradients and Adam state, "
                       "activations of %d x %d "
                       "tokens, teacher) but %.3g GiB is available; lower distill.batch or distill.seq_len",
                       need / 1073741824.0, o->batch, o->seq_len, have / 1073741824.0);
    return 0;
}

/* The host's RoPE tables for T positions of a (rope.c), as the plugin takes them. */
/* After step s of steps: the loss averages over the first and last avg
 * steps, the counts in r, and the caller's callback (non-zero: cancel). */
static int step_done(ac_distill_result *r, int s, int steps, int avg, int N, double loss, float lr, double *first,
                     double *last, ac_distill_cb cb, void *ud, ac_err *e) {
    if (s < avg) *first += loss / avg;
    if (s >= steps - avg) *last += loss / avg;
    r->steps = s + 1;
    r->tokens += N;
    return cb && cb(ud, s + 1, steps, loss, lr) ? ac_errf(e, "cancelled") : 0;
}

static int rope_for(const ac_arch *a, int T, float **cs, float **sn, ac_err *e) {
    size_t n = (size_t)T * (a->head_dim / 2);
    *cs = malloc(n * sizeof **cs), *sn = malloc(n * sizeof **sn);
    if (!*cs || !*sn) return ac_errf(e, "out of memory");
    return ac_rope_tables(a, T, *cs, *sn, e);
}

/* ac_distill on CUDA device 0: the teacher on the plugin's inference engine
 * (logits to the host), the student on its trainer (teacher logits up). */
static int distill_cuda(const ac_model *teacher, ac_model *student, const int *ids, size_t n, const ac_distill_opts *o,
                        const ac_adamw_opts *ao, int steps, ac_distill_cb cb, void *ud, ac_distill_result *r,
                        ac_err *e) {
    const ac_cuda_api *cu = ac_cuda(NULL);
    int B = o->batch, T = o->seq_len, N = B * T, avg = steps / 20 > 0 ? steps / 20 : 1, rc = 0;
    char er[512] = "";
    acc_engine *te = NULL;
    acc_trainer *tr = NULL;
    int *tok = malloc(sizeof(int) * N), *tgt = malloc(sizeof(int) * N);
    float *tl = malloc(sizeof(float) * (size_t)N * teacher->a.vocab), *tc = NULL, *ts = NULL, *sc = NULL, *ss = NULL;
    if (!tok || !tgt || !tl) rc = ac_errf(e, "out of memory");
    if (!rc) rc = rope_for(&teacher->a, T, &tc, &ts, e) || rope_for(&student->a, T, &sc, &ss, e);
    if (!rc && cu->engine_create(0, teacher, B, T, tc, ts, &te, er, sizeof er))
        rc = ac_errf(e, "distill teacher on CUDA: %s", er);
    if (!rc && cu->trainer_create(0, student, B, T, sc, ss, &tr, er, sizeof er))
        rc = ac_errf(e, "distill student on CUDA: %s", er);
    unsigned long long seed = o->seed * 0x9E3779B97F4A7C15ULL + 1;
    double t0 = ac_now(), first = 0, last = 0;
    for (int s = 0; !rc && s < steps; s++) {
        for (int b = 0; b < B; b++) memcpy(tok + (size_t)b * T, ids + rng_next(&seed) % (n - T + 1), sizeof(int) * T);
        ac_next_token_targets(tgt, tok, B, T);
        double loss = 0;
        float lr = ac_lr_at(ao, s);
        if (cu->engine_forward(te, tok, B, T, 0, 0, tl, er, sizeof er) ||
            cu->trainer_grad(tr, tok, tgt, tl, B, T, o->temperature, 1.0f - o->ce_weight, 1.0f, &loss, er, sizeof er) ||
            cu->trainer_step(tr, lr, ao->beta1, ao->beta2, ao->eps, ao->weight_decay, ao->clip, s, NULL, er,
                             sizeof er)) {
            rc = ac_errf(e, "distill on CUDA: %s", er);
            break;
        }
        if (step_done(r, s, steps, avg, N, loss, lr, &first, &last, cb, ud, e)) {
            rc = -1;
            break;
        }
    }
    if (!rc && cu->trainer_download(tr, student, NULL, er, sizeof er)) rc = ac_errf(e, "distill on CUDA: %s", er);
    r->seconds = ac_now() - t0;
    r->loss_first = first;
    r->loss_last = last;
    if (tr) cu->trainer_free(tr);
    if (te) cu->engine_free(te);
    free(tc);
    free(ts);
    free(sc);
    free(ss);
    free(tok);
    free(tgt);
    free(tl);
    return rc;
}

int ac_distill(const ac_model *teacher, ac_model *student, const int *ids, size_t n, const ac_distill_opts *o,
               ac_distill_cb cb, void *ud, ac_distill_result *r, ac_err *e) {
    memset(r, 0, sizeof *r);
    if (check_opts(teacher, student, n, o, e)) return -1;
    int B = o->batch, T = o->seq_len, N = B * T;
    int steps = (int)(o->tokens / N > 0 ? o->tokens / N : 1), avg = steps / 20 > 0 ? steps / 20 : 1;
    ac_engine te;
    ac_trainer tr;
    ac_adamw opt;
    ac_adamw_opts ao = {.lr = o->lr,
                        .min_lr = o->min_lr,
                        .beta1 = 0.9f,
                        .beta2 = 0.95f,
                        .eps = 1e-8f,
                        .weight_decay = o->weight_decay,
                        .clip = o->clip,
                        .warmup = o->warmup >= 0 ? o->warmup : steps / 20,
                        .total_steps = steps};
    if (o->cuda) return distill_cuda(teacher, student, ids, n, o, &ao, steps, cb, ud, r, e);
    ac_adamw_init(&opt, &ao);
    int *tok = malloc(sizeof(int) * N), *tgt = malloc(sizeof(int) * N);
    if (!tok || !tgt) {
        free(tok);
        free(tgt);
        return ac_errf(e, "out of memory");
    }
    if (ac_engine_init(&te, teacher, B, T, e)) {
        free(tok);
        free(tgt);
        return ac_errctx(e, "distill teacher");
    }
    if (ac_trainer_init(&tr, student, B, T, e)) {
        ac_engine_free(&te);
        free(tok);
        free(tgt);
        return ac_errctx(e, "distill student");
    }
    int rc = ac_adamw_add_model(&opt, student, &tr.g, e);
    unsigned long long seed = o->seed * 0x9E3779B97F4A7C15ULL + 1;
    double t0 = ac_now(), first = 0, last = 0;
    for (int s = 0; !rc && s < steps; s++) {
        for (int b = 0; b < B; b++) {
            size_t st = (size_t)(rng_next(&seed) % (n - T + 1));
            memcpy(tok + (size_t)b * T, ids + st, sizeof(int) * T);
        }
        ac_next_token_targets(tgt, tok, B, T);
        if (ac_engine_forward(&te, tok, B, T, 0, 0, e) || ac_train_forward(&tr, tok, B, T, e)) {
            rc = -1;
            break;
        }
        double loss = ac_train_loss(&tr, tgt, te.logits, o->temperature, 1.0f - o->ce_weight, 1.0f, NULL, NULL);
        ac_train_backward(&tr);
        float lr = ac_lr_at(&ao, s);
        if (ac_adamw_step(&opt, NULL, e)) {
            rc = -1;
            break;
        }
        ac_train_zero_grad(&tr);
        if (step_done(r, s, steps, avg, N, loss, lr, &first, &last, cb, ud, e)) {
            rc = -1;
            break;
        }
    }
    r->seconds = ac_now() - t0;
    r->loss_first = first;
    r->loss_last = last;
    ac_adamw_free(&opt);
    ac_trainer_free(&tr);
    ac_engine_free(&te);
    free(tok);
    free(tgt);
    return rc;
}

typedef struct {
    void (*emit)(void *ud, const char *kind, json_t *data);
    void *ud;
    const char *arm;
    volatile int *cancelled;
    double last;
} job_cb;

static int job_step(void *ud, int step, int steps, double loss, double lr) {
    job_cb *c = ud;
    double now = ac_now();
    if (c->emit && (step == 1 || step == steps || now - c->last >= 0.25)) {
        c->last = now;
        json_t *ev =
            json_pack("{s:s,s:i,s:i,s:f,s:f}", "arm", c->arm, "step", step, "steps", steps, "loss", loss, "lr", lr);
        c->emit(c->ud, "distill", ev);
        json_decref(ev);
    }
    return c->cancelled && *c->cancelled;
}

int ac_distill_job(const ac_distill_opts *opts, const char *model_dir, const char *text, const ac_model *teacher,
                   const int *cids, size_t nc, ac_model *const *arms, const char *const *names, int narms,
                   const int *hids, size_t nh, const ac_ppl_opts *po,
                   void (*emit)(void *ud, const char *kind, json_t *data), void *ud, volatile int *cancelled,
                   json_t **out, ac_err *e) {
    *out = NULL;
    ac_distill_opts o = *opts;
    if (o.tokens <= 0) return 0;
    if (text && !text[0]) text = NULL;
    int *ids = NULL;
    size_t n = nc;
    if (text && ac_load_text_ids(model_dir, text, &ids, &n, teacher->a.vocab, e)) return ac_errctx(e, "distill.text");
    const int *use = ids ? ids : cids;
    json_t *res = json_object();
    int rc = res ? 0 : ac_errf(e, "out of memory");
    for (int i = 0; i < narms && !rc; i++) {
        ac_ppl_result pp;
        ac_distill_result dr;
        job_cb c = {emit, ud, names[i], cancelled, 0};
        if (ac_perplexity(arms[i], hids, nh, po, NULL, NULL, NULL, &pp, e)) {
            rc = -1;
            break;
        }
        /* a BF16 student (ac_prune_bf16) trains on fp32 master weights,
         * widened exactly, and is rounded back when trained: its matrices
         * to BF16, its vectors to the values a BF16 export writes */
        int bf16 = ac_model_wdt(arms[i]) == ST_BF16;
        ac_model w32;
        if (bf16) {
            if (ac_model_to_f32(arms[i], &w32, e)) {
                rc = ac_errctx(e, "%s", names[i]);
                break;
            }
            ac_model_free(arms[i]);
            *arms[i] = w32;
        }
        if (ac_distill(teacher, arms[i], use, n, &o, job_step, &c, &dr, e) ||
            (bf16 && ac_model_make_bf16(arms[i], e))) {
            rc = ac_errctx(e, "%s", names[i]);
            break;
        }
        if (bf16) ac_model_round_vectors(arms[i], ST_BF16);
        json_object_set_new(res, names[i],
                            json_pack("{s:f,s:{s:I,s:i,s:f,s:f,s:f,s:f,s:i,s:i,s:f,s:s}}", "perplexity_pruned", pp.ppl,
                                      "distill", "tokens", (json_int_t)dr.tokens, "steps", dr.steps, "seconds",
                                      dr.seconds, "loss_first", dr.loss_first, "loss_last", dr.loss_last, "lr", o.lr,
                                      "seq_len", o.seq_len, "batch", o.batch, "temperature", o.temperature, "trainer",
                                      o.cuda ? "cuda" : "cpu"));
    }
    free(ids);
    if (rc) {
        json_decref(res);
        return -1;
    }
    *out = res;
    return 0;
}
