/* test_cuda_job.c - hybrids (nemotron_h) on a local CUDA target against the
 * CPU: the engine method's loss curves (calibration_method exact) against
 * the CPU's exact ones, and whole compression jobs of MoE hybrids (plain
 * and LatentMoE) against the same job on the CPU. Skips with the reason
 * when the plugin or a device is missing; tests/run_all.sh runs it on the
 * CPU emulator (AC_CUDA_PLUGIN=build/tests/libac_cuda_emu.so);
 * AC_TEST_CURVES_ONLY=1 runs the curves alone.
 *
 * The CUDA job runs every loss pass on the device: calibration, Minitron's
 * top-k pruned-candidate losses, the gate search (the CUDA trainer),
 * distillation (teacher on the CUDA engine, student on the trainer), the
 * held-out evaluation and the on-target latency. The CPU job is the same
 * spec on target "L4", a spec profile: its cost table is L4's datasheet
 * roofline, the same table this test puts under the CUDA device's cache key
 * (measuring the GPU grid on the emulator would take hours), so both jobs
 * price every structure alike and differ only in where they compute. */
#include <jansson.h>
#include <math.h>

#include "check.h"
#include "costcache.h"
#include "runtime/cuda_plugin.h"
#include "cost/device.h"
#include "runtime/engine.h"
#include "runtime/eval.h"
#include "search/importance.h"
#include "pipeline/job.h"
#include "format/model_int.h"
#include "format/safetensors.h"
#include "core/err.h"
#include "cost/costmodel.h"
#include "runtime/kernels_cpu.h"

static const ac_cuda_api *cu;
static const char *why;

static void no_emit(void *ud, const char *kind, json_t *data) { (void)ud, (void)kind, (void)data; }

static unsigned rng_next(unsigned *s) { return *s = *s * 1664525u + 1013904223u; }
/* uniform in [-scale, scale) */
static float rnd(unsigned *s, float scale) { return ((rng_next(s) >> 8) / 8388608.0f - 1.0f) * scale; }

static int fill_matrix(void *ud, float **p, size_t n) {
    for (size_t i = 0; i < n; i++) (*p)[i] = rnd(ud, 0.2f);
    return 0;
}

static void ones(float *v, size_t n) {
    for (size_t i = 0; v && i < n; i++) v[i] = 1;
}

/* A random-init nemotron_h checkpoint (BF16) in dir with the tiny model's
 * tokenizer: Mamba-2, MoE (4 squared-ReLU experts, top-2, a shared expert,
 * the sigmoid router with its correction bias), Mamba-2, attention, MoE
 * (pattern MEM*E); latent: LatentMoE's experts on a latent width of 16
 * beside hidden 32. 0 on success. */
static int make_hybrid(const char *dir, const char *tokenizer, int latent, double *params, ac_err *e) {
    char cs[1400];
    snprintf(cs, sizeof cs,
             "{\"architectures\": [\"NemotronHForCausalLM\"], \"model_type\": \"nemotron_h\", \"vocab_size\": 768, "
             "\"hidden_size\": 32, \"num_hidden_layers\": 5, \"hybrid_override_pattern\": \"MEM*E\", "
             "\"num_attention_heads\": 4, \"num_key_value_heads\": 2, \"head_dim\": 8, \"intermediate_size\": 64, "
             "\"mlp_hidden_act\": \"relu2\", \"mamba_num_heads\": 4, \"mamba_head_dim\": 8, \"ssm_state_size\": 8, "
             "\"n_groups\": 2, \"conv_kernel\": 4, \"use_conv_bias\": true, \"use_bias\": false, \"mlp_bias\": false, "
             "\"attention_bias\": false, \"layer_norm_epsilon\": 1e-5, \"max_position_embeddings\": 256, "
             "\"tie_word_embeddings\": false, \"bos_token_id\": 767, \"eos_token_id\": 767, \"n_routed_experts\": 4, "
             "\"num_experts_per_tok\": 2, \"moe_intermediate_size\": 16, \"moe_shared_expert_intermediate_size\": 24, "
             "\"norm_topk_prob\": true, \"routed_scaling_factor\": 2.5, \"n_group\": 1, \"topk_group\": 1, "
             "\"n_shared_experts\": 1, \"moe_latent_size\": %s}",
             latent ? "16" : "null");
    json_t *cfg = json_loads(cs, 0, NULL);
    ac_arch a;
    int rc = cfg ? ac_arch_from_config(cfg, &a, e) : ac_errf(e, "config");
    json_decref(cfg);
    if (rc) return -1;
    ac_model m;
    rc = ac_model_alloc(&m, &a, e);
    ac_arch_free(&a);
    if (rc) return -1;
    unsigned sd = latent ? 11 : 5;
    ac_model_each_matrix(&m, fill_matrix, &sd);
    /* the embedding and head wider: peaked next-token distributions, so that pruning and distillation move the
     * loss */
    for (size_t i = 0; i < (size_t)m.a.vocab * m.a.hidden; i++) m.embed[i] = rnd(&sd, 0.4f), m.lm_head[i] = rnd(&sd, 0.4f);
    ones(m.final_norm, m.a.hidden);
    for (int l = 0; l < m.a.n_layers; l++) {
        ac_layer_w *w = &m.L[l];
        const ac_layer_arch *la = &m.a.layers[l];
        ones(w->in_norm, m.a.hidden);
        ones(w->post_norm, m.a.hidden);
        if (la->ssm_heads) {
            size_t C = ac_ssm_conv_dim(&m.a, l);
            for (size_t i = 0; i < C * m.a.ssm_conv; i++) w->conv_w[i] = rnd(&sd, 0.4f);
            for (size_t i = 0; w->conv_b && i < C; i++) w->conv_b[i] = rnd(&sd, 0.1f);
            for (int h = 0; h < la->ssm_heads; h++)
                w->a_log[h] = logf(1.0f + h), w->dt_bias[h] = rnd(&sd, 0.5f), w->ssm_d[h] = 1.0f + rnd(&sd, 0.2f);
            ones(w->ssm_norm, ac_ssm_inner(&m.a, l));
        }
        for (int x = 0; w->router_bias && x < la->n_experts; x++) w->router_bias[x] = rnd(&sd, 0.05f);
    }
    *params = ac_arch_params(&m.a);
    rc = ac_model_save(&m, dir, ST_BF16, e);
    ac_model_free(&m);
    if (rc) return -1;
    size_t tl;
    char *tj = ac_read_file(tokenizer, 1u << 26, &tl, e), dst[1300];
    if (!tj) return -1;
    snprintf(dst, sizeof dst, "%s/tokenizer.json", dir);
    FILE *f = fopen(dst, "wb");
    rc = f && fwrite(tj, 1, tl, f) == tl ? 0 : ac_errf(e, "writing %s", dst);
    if (f) fclose(f);
    free(tj);
    return rc;
}

/* One job on target device ("cuda" or "L4"); its report in *rep. */
static int run_job(const char *model, const char *out, const char *device, double max_params, const char *db,
                   json_t **rep, double *secs, ac_err *e) {
    char calib[1024], held[1024];
    ck_build_path(calib, sizeof calib, "data/calib.txt");
    ck_build_path(held, sizeof held, "data/heldout.txt");
    json_t *spec = json_pack(
        "{s:s,s:s,s:s,s:s,s:s,s:{s:s,s:{s:i,s:i,s:i}},s:{s:f},s:{s:i,s:i,s:i,s:i,s:b,s:b,s:b},s:i,s:{s:i,s:i},"
        "s:{s:i,s:i,s:i,s:f},s:{s:i}}",
        "model", model, "method", "autocompress", "calibration", calib, "heldout", held, "output", out, "target",
        "device", device, "workload", "batch", 1, "prompt_len", 16, "gen_len", 4, "constraints", "max_params",
        max_params, "search", "steps", 30, "dnas_steps", 12, "dnas_batch", 2, "dnas_seq_len", 16, "prune_experts", 1,
        "prune_expert_ffn", 1, "prune_hidden", 0, "calibration_tokens", 256, "eval", "ctx", 16, "windows", 4,
        "distill", "tokens", 256, "seq_len", 16, "batch", 2, "lr", 1e-3, "minitron", "top_k", 4);
    ac_cost_cache cache;
    costcache_file(&cache, db, 0);
    ac_job_ctx ctx = {.emit = no_emit, .cache = &cache, .threads = ck_threads()};
    static ac_job_spec js;
    double t0 = ck_now();
    int rc = ac_job_spec_parse(spec, &js, NULL, e) || ac_job_run(&js, &ctx, rep, e) ? -1 : 0;
    *secs = ck_now() - t0;
    json_decref(spec);
    return rc;
}

static double num(json_t *o, const char *k) { return json_number_value(json_object_get(o, k)); }

/* The layers of an arm's structure, for the log: type and width per layer. */
static void print_arch(const char *what, json_t *arch) {
    printf("   %s:", what);
    json_t *L;
    size_t i;
    json_array_foreach(json_object_get(arch, "layers"), i, L) {
        const char *t = json_string_value(json_object_get(L, "type"));
        json_t *w = json_object_get(L, !strcmp(t, "mamba") ? "ssm_heads" : !strcmp(t, "moe") ? "experts" : "kv_heads");
        printf(" %s:%lld", t, (long long)json_integer_value(w));
        if (!strcmp(t, "moe"))
            printf("x%lld/%lld", (long long)json_integer_value(json_object_get(L, "expert_ffn")),
                   (long long)json_integer_value(json_object_get(L, "shared_ffn")));
    }
    printf(" (hidden %lld)\n", (long long)json_integer_value(json_object_get(arch, "hidden")));
}

/* The job on the CUDA target against the job on the CPU:
 *  - every stage ran where it should: the report's evaluation engine is
 *    "cuda" (the CPU job's is not), the gate search's trainer is "cuda",
 *    Minitron's candidates were scored on "cuda", each arm's distillation
 *    trainer is "cuda", and the on-target latency exists;
 *  - both jobs computed the same importance (the same rankings, the base
 *    loss to 1e-4 relative: the device job calibrates by the engine method,
 *    its statistics from one CPU engine pass, the CPU job by the
 *    layer-streamed exact pass);
 *  - each arm's structure is the same JSON in both, and so the chosen arm
 *    (Minitron: the same grid, its top-k scored by pruned BF16 students'
 *    losses on the device, each within 0.3 % of the CPU's, test_cuda's bound
 *    on the engine's mean NLL; the gate search: its gates trained on the
 *    device, test_dnas_hybrid holds them to 1e-2 of the CPU's after 3
 *    steps);
 *  - the baseline's and each arm's held-out perplexity before distillation
 *    (the same pruned student, on the CUDA engine in BF16 against the CPU's
 *    kernels) within 0.5 %; after distillation within 1 %: a routed
 *    hybrid's students part by whole steps (a token whose experts nearly
 *    tie goes one way on one backend and the other way on the other:
 *    test_train's cuda_distill). Measured 2026-12-08 on the emulator: 1.5e-3
 *    before (LatentMoE's baseline), 2.4e-3 after, where the 8 distillation
 *    steps move perplexity by 1.0-3.4 % (printed);
 *  - the distillation's first-step loss (the same student, teacher and
 *    batch) within 1 % (measured 6e-4) and its last within 10 %
 *    (test_train's bound for a routed hybrid's late steps); the plain-MoE
 *    job fails both with the device trainer's routed scale dropped (first
 *    step 4.8 % apart, distilled perplexity 2.8 %);
 *  - the export loads, and its CPU perplexity on the held-out windows is
 *    the report's (the CUDA engine's) within 0.5 %.
 * The model's weights are uniform in [-0.2, 0.2) (embedding and head
 * [-0.4, 0.4)): weights of one sign, as a generator of [-s, 0) gives,
 * leave every squared-ReLU MoE layer's output 0 (all its pre-activations
 * negative), and that job then holds no expert numerics. */
static void gpu_job_hybrid(int latent) {
    if (!cu) SKIP("%s", why);
    char tiny[1024], tok[1100], held[1024], dir[] = "/tmp/ac_gpu_hjob_XXXXXX", model[1200], db[1200], out[2][1200];
    ck_build_path(tiny, sizeof tiny, "models/tiny");
    ck_build_path(held, sizeof held, "data/heldout.txt");
    snprintf(tok, sizeof tok, "%s/tokenizer.json", tiny);
    if (!ck_exists(tok) || !ck_exists(held)) SKIP("no tiny model (make tiny-model)");
    if (!mkdtemp(dir)) {
        CHECK(0, "mkdtemp");
        return;
    }
    ac_err e = {{0}};
    double params = 0;
    snprintf(model, sizeof model, "%s/model", dir);
    CHECK(make_hybrid(model, tok, latent, &params, &e) == 0, "%s", e.msg);
    /* L4's datasheet table under the device's cache key: the table the CPU job's target "L4" gets */
    char name[128];
    double mem;
    int sms, cc;
    snprintf(db, sizeof db, "%s/cost.db", dir);
    cu->device_info(0, name, sizeof name, &mem, &sms, &cc);
    ac_cost_table t;
    CHECK(ac_cost_roofline(ac_device_spec_find("L4"), "bf16", &t, &e) == 0, "%s", e.msg);
    ac_cost_cuda_key(name, cc, t.key, sizeof t.key);
    ac_cost_cache wc;
    costcache_file(&wc, db, 1);
    CHECK(wc.put(wc.ud, &t, &e) == 0, "%s", e.msg);
    ac_cost_table_free(&t);
    /* the layers' parameters (the embedding and head are 2 x 768 x 32 = 49152 of them) cut by about 40 % */
    double emb = 2.0 * 768 * 32, limit = emb + 0.6 * (params - emb);
    json_t *rep[2] = {NULL, NULL};
    double secs[2];
    const char *dev[2] = {"cuda", "L4"};
    int ok = 1;
    for (int k = 0; k < 2 && ok; k++) {
        snprintf(out[k], sizeof out[k], "%s/out_%s", dir, dev[k]);
        ok = run_job(model, out[k], dev[k], limit, db, &rep[k], &secs[k], &e) == 0;
        CHECK(ok, "job on %s: %s", dev[k], e.msg);
    }
    if (ok) {
        json_t *g = rep[0], *c = rep[1];
        const char *engine = json_string_value(json_object_get(json_object_get(g, "eval_protocol"), "engine"));
        const char *ce = json_string_value(json_object_get(json_object_get(c, "eval_protocol"), "engine"));
        json_t *ot = json_object_get(g, "measured_on_target");
        printf("   %s hybrid (%.0f params, limit %.0f): job %.1f s on %s, %.1f s on the CPU; chosen %s / %s\n",
               latent ? "LatentMoE" : "MoE", params, limit, secs[0], engine ? engine : "?", secs[1],
               json_string_value(json_object_get(g, "chosen")), json_string_value(json_object_get(c, "chosen")));
        CHECK(engine && !strcmp(engine, "cuda") && ce && strcmp(ce, "cuda"), "evaluated on %s and %s",
              engine ? engine : "?", ce ? ce : "?");
        CHECK(ot && json_object_get(ot, json_string_value(json_object_get(g, "chosen"))),
              "no measured_on_target latency for the chosen arm");
        const char *tr = json_string_value(json_object_get(json_object_get(g, "search"), "gate_trainer"));
        const char *sm = json_string_value(json_object_get(json_object_get(g, "search"), "method"));
        CHECK(sm && !strcmp(sm, "dnas"), "the autocompress arm ran %s, not the gate search", sm ? sm : "?");
        CHECK(tr && !strcmp(tr, "cuda"), "the gates trained on %s", tr ? tr : "?");
        const char *so = json_string_value(json_object_get(json_object_get(g, "minitron"), "scored_on"));
        CHECK(so && !strcmp(so, "cuda"), "Minitron's candidates scored on %s", so ? so : "?");
        /* Minitron's scored candidates: the same ones, their calibration losses (pruned BF16 students on the
         * device and on the CPU) within the engine's 0.3 % (test_cuda) */
        json_t *kg = json_object_get(json_object_get(g, "minitron"), "candidates"),
               *kc = json_object_get(json_object_get(c, "minitron"), "candidates");
        double worst = 0;
        int scored = 0;
        CHECK(json_array_size(kg) == json_array_size(kc), "%zu Minitron candidates on cuda, %zu on the CPU",
              json_array_size(kg), json_array_size(kc));
        for (size_t i = 0; i < json_array_size(kg) && i < json_array_size(kc); i++) {
            json_t *xg = json_array_get(kg, i), *xc = json_array_get(kc, i);
            if (!json_is_number(json_object_get(xg, "calib_nll"))) continue;
            scored++;
            worst = fmax(worst, fabs(num(xg, "calib_nll") - num(xc, "calib_nll")) / num(xc, "calib_nll"));
            CHECK(num(xg, "params") == num(xc, "params"), "Minitron candidate %zu differs", i);
        }
        printf("   Minitron: %d candidates scored on the device, calibration NLL within %.2e of the CPU's\n", scored,
               worst);
        CHECK(scored > 0 && worst <= 3e-3, "Minitron's candidate losses differ by %g", worst);
        json_t *ig = json_object_get(g, "importance"), *ic = json_object_get(c, "importance");
        /* the device job's calibration is the engine method (its statistics from one CPU engine pass, the curves'
         * loss passes on the GPU), the CPU job's the layer-streamed exact pass: the same sums in another order, where a routed
         * token's near-tied experts may go either way (LatentMoE's measured 1.05e-5 apart, 2026-12-08) */
        CHECK(fabs(num(ig, "base_loss") - num(ic, "base_loss")) <= 1e-4 * num(ic, "base_loss"),
              "calibration base loss %.9g on cuda vs %.9g", num(ig, "base_loss"), num(ic, "base_loss"));
        const char *arms[2] = {"minitron", "autocompress"};
        for (int a = 0; a < 2; a++) {
            json_t *ag = json_object_get(g, arms[a]), *ac = json_object_get(c, arms[a]);
            json_t *sg = json_object_get(ag, "architecture"), *sc = json_object_get(ac, "architecture");
            print_arch(arms[a], sg);
            CHECK(sg && json_equal(sg, sc), "%s: the structures differ", arms[a]);
            if (sg && !json_equal(sg, sc)) print_arch("  (on the CPU)", sc);
            CHECK(json_is_true(json_object_get(ag, "feasible")) && num(json_object_get(ag, "predicted"), "params") <=
                                                                       limit + 0.5,
                  "%s: infeasible on cuda", arms[a]);
            double pg = num(ag, "perplexity_pruned"), pc = num(ac, "perplexity_pruned"), dg = num(ag, "perplexity"),
                   dc = num(ac, "perplexity");
            printf("   %s: held-out perplexity pruned %.4f (cuda) vs %.4f (cpu), %.2e apart; distilled %.4f vs %.4f, "
                   "%.2e apart (distillation moved it %.1f %%)\n",
                   arms[a], pg, pc, fabs(pg - pc) / pc, dg, dc, fabs(dg - dc) / dc, 100 * fabs(dg - pg) / pg);
            CHECK(pg > 0 && fabs(pg - pc) <= 0.005 * pc, "%s: pruned perplexity %g on cuda vs %g", arms[a], pg, pc);
            CHECK(dg > 0 && fabs(dg - dc) <= 0.01 * dc, "%s: distilled perplexity %g on cuda vs %g", arms[a], dg, dc);
            json_t *dg_ = json_object_get(ag, "distill"), *dc_ = json_object_get(ac, "distill");
            double fg = num(dg_, "loss_first"), fc = num(dc_, "loss_first"), lg = num(dg_, "loss_last"),
                   lc = num(dc_, "loss_last");
            printf("   %s: distillation loss %.5f -> %.5f (cuda) vs %.5f -> %.5f (cpu)\n", arms[a], fg, lg, fc, lc);
            CHECK(fabs(fg - fc) <= 0.01 * fc && fabs(lg - lc) <= 0.1 * lc,
                  "%s: distillation losses %g -> %g on cuda, %g -> %g on the CPU", arms[a], fg, lg, fc, lc);
            const char *dt = json_string_value(json_object_get(json_object_get(ag, "distill"), "trainer"));
            CHECK(dt && !strcmp(dt, "cuda"), "%s: distilled on %s", arms[a], dt ? dt : "?");
        }
        double bg = num(json_object_get(g, "baseline"), "perplexity"), bc = num(json_object_get(c, "baseline"), "perplexity");
        printf("   baseline perplexity %.4f (cuda) vs %.4f (cpu)\n", bg, bc);
        CHECK(fabs(bg - bc) <= 0.005 * bc, "baseline perplexity %g on cuda vs %g", bg, bc);
        CHECK(!strcmp(json_string_value(json_object_get(g, "chosen")), json_string_value(json_object_get(c, "chosen"))),
              "chosen arms differ");
        /* the export loads; its perplexity on the CPU engine is the report's */
        ac_model mb;
        int *ids = NULL;
        size_t n = 0;
        ac_ppl_result r;
        ac_ppl_opts o = {.ctx = 16, .max_windows = 4, .batch = 4};
        int lrc = ac_model_load(out[0], &mb, &e);
        CHECK(lrc == 0, "export: %s", e.msg);
        if (lrc == 0) {
            double rp = num(json_object_get(g, json_string_value(json_object_get(g, "chosen"))), "perplexity");
            CHECK(ac_load_text_ids(out[0], held, &ids, &n, mb.a.vocab, &e) == 0 &&
                      ac_perplexity(&mb, ids, n, &o, NULL, NULL, NULL, &r, &e) == 0,
                  "%s", e.msg);
            printf("   export: perplexity %.4f on the CPU engine, report %.4f\n", r.ppl, rp);
            CHECK(fabs(r.ppl - rp) <= 0.005 * rp, "the export's perplexity %g vs the report's %g", r.ppl, rp);
            free(ids);
            ac_model_free(&mb);
        }
    }
    json_decref(rep[0]);
    json_decref(rep[1]);
    CHECK(ck_rmtree(dir) == 0, "cleanup %s", dir);
}

/* Largest |a - b| beyond 10 % of |a| over n points (test_cuda's rule for the curves), and the largest |a|. */
static void curve_diff(const double *a, const double *b, int n, double *worst, double *largest) {
    for (int i = 0; i < n; i++) {
        *worst = fmax(*worst, fabs(a[i] - b[i]) - 0.1 * fabs(a[i]));
        *largest = fmax(*largest, fabs(a[i]));
    }
}

/* ids[n] (windows of ctx) sampled from m itself at temperature 0.5 on the
 * CPU engine, so that the model predicts its calibration text and removing
 * a unit raises its loss (on text it does not predict, a random model's
 * loss falls as often as it rises when a unit goes, and the curves, made
 * monotone, are flat). 0 on success. */
static int sample_ids(const ac_model *m, int *ids, int n, int ctx, ac_err *e) {
    ac_engine en;
    if (ac_engine_init(&en, m, 1, ctx, e)) return -1;
    unsigned sd = 17;
    size_t V = m->a.vocab;
    int rc = 0;
    for (int w = 0; w < n / ctx && !rc; w++) {
        int *x = ids + (size_t)w * ctx;
        x[0] = (int)(rng_next(&sd) >> 8) % (int)V;
        for (int t = 1; t < ctx && !rc; t++) {
            if ((rc = ac_engine_forward(&en, x, 1, t, 0, 1, e))) break;
            const float *lg = en.logits;
            double mx = lg[0], z = 0, u = (rng_next(&sd) >> 8) / 16777216.0, acc = 0;
            for (size_t v = 1; v < V; v++) mx = fmax(mx, lg[v]);
            for (size_t v = 0; v < V; v++) z += exp((lg[v] - mx) / 0.5);
            x[t] = (int)V - 1;
            for (size_t v = 0; v < V; v++)
                if ((acc += exp((lg[v] - mx) / 0.5) / z) > u) {
                    x[t] = (int)v;
                    break;
                }
        }
    }
    ac_engine_free(&en);
    return rc;
}

/* A hybrid's calibration with exact asked for on a CUDA target: the engine
 * method's curves (attention KV groups and MLP channels masked on one
 * engine, experts, hidden width, KV merging and Mamba heads from pruned
 * copies, every loss pass on the device) against the CPU's exact ones (the
 * layer-streamed pass, each point carried through the rest of the
 * network), on the three hybrid fixtures (M-M*-, MEM*E, LatentMoE MEM*E):
 * the same unit orders (the activation statistics, on the CPU both ways),
 * the method the engine's, the Mamba curves there and not flat, and every
 * curve point, the Mamba heads' included, within 10 % + 0.01 nats
 * (test_cuda's test_gpu_calibration rule for BF16 on the device against
 * fp32). The calibration text is sampled from each model (sample_ids): the
 * curves reach 0.2-0.5 nats. Measured 2026-12-08 on the emulator: the
 * Mamba points within 1.3e-3 nats but one, LatentMoE's first point (0.0764
 * on the CPU, 0.0632 on the device: a routed model, where a token whose
 * experts nearly tie goes one way on one backend and the other way on the
 * other, moving the mean over these 112 predicted tokens by whole
 * hundredths); the other curves within 10 % + 0.0044. Each Mamba point
 * taken one step further along (a quarter of each group's heads more)
 * fails it. */
static void test_gpu_hybrid_curves(void) {
    if (!cu) SKIP("%s", why);
    const char *names[] = {"nemotronh_bf16", "nemotronh_moe_bf16", "nemotronh_latent_bf16"};
    for (int f = 0; f < 3; f++) {
        char dir[1200], rel[256];
        snprintf(rel, sizeof rel, "fixtures/models/%s", names[f]);
        ck_build_path(dir, sizeof dir, rel);
        ac_model m;
        ac_err e = {{0}};
        if (ac_model_load(dir, &m, &e)) SKIP("no fixture %s (make fixtures)", names[f]);
        int ids[128];
        CHECK(sample_ids(&m, ids, 128, 8, &e) == 0, "%s: sampling: %s", names[f], e.msg);
        ac_importance ic, ig;
        double t0 = ck_now();
        int ok = ac_importance_compute_mode(&m, ids, 128, 8, 16, 0, AC_CALIB_EXACT, NULL, NULL, &ic, &e) == 0;
        double tc = ck_now() - t0;
        ok = ok && ac_importance_compute_mode(&m, ids, 128, 8, 16, 1, AC_CALIB_EXACT, NULL, NULL, &ig, &e) == 0;
        CHECK(ok, "%s: %s", names[f], e.msg);
        if (!ok) {
            ac_model_free(&m);
            continue;
        }
        double worst = 0, largest = 0, worst_s = 0, largest_s = 0, largest_sg = 0;
        int orders = 0, mamba = 0;
        for (int l = 0; l < m.a.n_layers; l++) {
            const ac_layer_arch *la = &m.a.layers[l];
            orders += la->n_heads && memcmp(ic.kv_order[l], ig.kv_order[l], sizeof(int) * la->n_kv_heads);
            orders += la->ffn && memcmp(ic.ffn_order[l], ig.ffn_order[l], sizeof(int) * la->ffn);
            orders += la->n_experts && memcmp(ic.expert_order[l], ig.expert_order[l], sizeof(int) * la->n_experts);
            orders += la->ssm_heads && memcmp(ic.ssm_head_order[l], ig.ssm_head_order[l], sizeof(int) * la->ssm_heads);
            curve_diff(ic.attn_sens[l], ig.attn_sens[l], AC_SENS_POINTS, &worst, &largest);
            curve_diff(ic.ffn_sens[l], ig.ffn_sens[l], AC_SENS_POINTS, &worst, &largest);
            int nm = ic.merge_n && ig.merge_n ? ic.merge_n[l] : -1;
            CHECK(nm >= 0 && ig.merge_n[l] == nm, "%s: layer %d's KV-merge points", names[f], l);
            if (nm > 0) curve_diff(ic.merge_sens[l], ig.merge_sens[l], nm, &worst, &largest);
            if (!la->ssm_heads || !ic.ssm_sens || !ig.ssm_sens) continue;
            mamba++;
            curve_diff(ic.ssm_sens[l], ig.ssm_sens[l], AC_SENS_POINTS, &worst_s, &largest_s);
            for (int p = 0; p < AC_SENS_POINTS; p++) largest_sg = fmax(largest_sg, ig.ssm_sens[l][p]);
        }
        curve_diff(ic.hid_sens, ig.hid_sens, 4, &worst, &largest);
        printf("   %s: CPU exact %.1f s; GPU method %d, orders differing %d, curves' worst excess over 10%% %.4f nats "
               "(largest point %.3f); %d Mamba curves' %.5f (largest %.4f CPU, %.4f GPU)\n",
               names[f], tc, ig.method, orders, worst, largest, mamba, worst_s, largest_s, largest_sg);
        for (int l = 0; l < m.a.n_layers && ig.ssm_sens; l++)
            if (m.a.layers[l].ssm_heads)
                printf("     layer %d Mamba curve CPU %.4f %.4f %.4f %.4f, GPU %.4f %.4f %.4f %.4f\n", l,
                       ic.ssm_sens[l][1], ic.ssm_sens[l][2], ic.ssm_sens[l][3], ic.ssm_sens[l][4], ig.ssm_sens[l][1],
                       ig.ssm_sens[l][2], ig.ssm_sens[l][3], ig.ssm_sens[l][4]);
        CHECK(ig.method == AC_CALIB_ENGINE, "%s: the CUDA target's method is %d", names[f], ig.method);
        CHECK(orders == 0, "%s: %d orders differ", names[f], orders);
        CHECK(mamba > 0 && largest_s > 0 && largest_sg > 0, "%s: Mamba curves missing or flat", names[f]);
        CHECK(largest > 0, "%s: the curves are flat", names[f]);
        CHECK(worst <= 0.01, "%s: curves differ by %g nats beyond 10%%", names[f], worst);
        CHECK(worst_s <= 0.01, "%s: Mamba curves differ by %g nats beyond 10%%", names[f], worst_s);
        ac_importance_free(&ic);
        ac_importance_free(&ig);
        ac_model_free(&m);
    }
}

static void test_gpu_job_hybrid_moe(void) { gpu_job_hybrid(0); }
static void test_gpu_job_hybrid_latent(void) { gpu_job_hybrid(1); }

int main(void) {
    ac_set_threads(ck_threads());
    cu = ac_cuda(&why);
    if (!cu) printf("   CUDA tests skip: %s\n", why);
    RUN(test_gpu_hybrid_curves);
    if (getenv("AC_TEST_CURVES_ONLY")) return DONE();
    RUN(test_gpu_job_hybrid_moe);
    RUN(test_gpu_job_hybrid_latent);
    return DONE();
}
