/*
 * test_prune_bf16.c - a job's BF16 student (ac_prune_bf16: each row
 * gathered in fp32 from the resident checkpoint and rounded straight into
 * the student, a mixture-of-experts layer one expert at a time) is the
 * fp32 student (ac_prune) rounded: both exported as BF16 (ac_model_save)
 * give the same model.safetensors and config.json, byte for byte. On every
 * family fixture with every axis cut at once under shuffled importance
 * orders: hidden channels, KV groups merged or cut, dense FFN and Mamba
 * MLP channels, experts removed and each narrowed on its own channels,
 * Mamba heads by group and head dims, the shared expert's width and
 * LatentMoE's latent width.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "check.h"
#include "core/dtype.h"
#include "core/err.h"
#include "format/model.h"
#include "search/importance.h"
#include "search/slice.h"

static unsigned long long rng = 0x9E3779B97F4A7C15ULL;
static unsigned next(void) {
    rng ^= rng << 13, rng ^= rng >> 7, rng ^= rng << 17;
    return (unsigned)(rng >> 33);
}

/* 0..n-1 shuffled, plus base (malloc'd; n + 1 ints). */
static int *perm(int n, int base) {
    int *p = malloc(sizeof(int) * (n + 1));
    for (int i = 0; p && i < n; i++) p[i] = i;
    for (int i = n - 1; p && i > 0; i--) {
        int j = (int)(next() % (unsigned)(i + 1)), x = p[i];
        p[i] = p[j], p[j] = x;
    }
    for (int i = 0; p && i < n; i++) p[i] += base;
    return p;
}

/* The orders this test fills, freed. */
static void imp_free(ac_importance *imp) {
    int **all[] = {imp->kv_order,     imp->ffn_order, imp->expert_order,  imp->echan_order,
                   imp->ssm_head_order, imp->sh_order, imp->ssm_dim_order, imp->lat_order};
    for (size_t k = 0; k < sizeof all / sizeof *all; k++) {
        for (int l = 0; all[k] && l < imp->n_layers; l++) free(all[k][l]);
        free(all[k]);
    }
    free(imp->hid_order);
}

/* Shuffled orders for every unit of a, and t: a cut on every axis a has. */
static void cut_everything(const ac_arch *a, ac_arch *t, ac_importance *imp) {
    int L = a->n_layers, G = a->ssm_groups > 0 ? a->ssm_groups : 1;
    memset(imp, 0, sizeof *imp);
    imp->n_layers = L, imp->hidden = a->hidden;
    imp->hid_order = perm(a->hidden, 0);
    int ***all[] = {&imp->kv_order,       &imp->ffn_order, &imp->expert_order,  &imp->echan_order,
                    &imp->ssm_head_order, &imp->sh_order,  &imp->ssm_dim_order, &imp->lat_order};
    for (size_t k = 0; k < sizeof all / sizeof *all; k++) *all[k] = calloc(L, sizeof(int *));
    t->hidden = a->hidden * 3 / 4;
    if (a->hybrid) {
        t->ssm_head_dim = a->ssm_head_dim - 1;
        t->shared_ffn = a->shared_ffn * 2 / 3;
        t->moe_latent = a->moe_latent * 3 / 4;
    }
    for (int l = 0; l < L; l++) {
        const ac_layer_arch *s = &a->layers[l];
        ac_layer_arch *d = &t->layers[l];
        if (s->n_heads) {
            imp->kv_order[l] = perm(s->n_kv_heads, 0);
            int grp = s->n_heads / s->n_kv_heads;
            if (l % 2 == 0 && s->n_kv_heads % 2 == 0) /* KV heads merged in pairs, every query head kept */
                d->n_kv_heads = s->n_kv_heads / 2;
            else if (s->n_kv_heads > 1) /* the least important KV group cut with its query heads */
                d->n_kv_heads = s->n_kv_heads - 1, d->n_heads = d->n_kv_heads * grp;
        }
        if (s->ffn) {
            imp->ffn_order[l] = perm(s->ffn, 0);
            d->ffn = s->ffn * 3 / 4;
        }
        if (s->n_experts) {
            int E = s->n_experts, Fe = s->expert_ffn;
            imp->expert_order[l] = perm(E, 0);
            imp->echan_order[l] = malloc(sizeof(int) * E * Fe);
            for (int x = 0; x < E; x++) {
                int *p = perm(Fe, 0);
                memcpy(imp->echan_order[l] + (size_t)x * Fe, p, sizeof(int) * Fe);
                free(p);
            }
            d->n_experts = E - 1 >= a->top_k ? E - 1 : E;
            d->expert_ffn = Fe * 2 / 3;
            if (a->shared_ffn) imp->sh_order[l] = perm(a->shared_ffn, 0);
            if (a->moe_latent) imp->lat_order[l] = perm(a->moe_latent, 0);
        }
        if (s->ssm_heads) {
            int hpg = s->ssm_heads / G;
            imp->ssm_head_order[l] = malloc(sizeof(int) * s->ssm_heads);
            for (int g = 0; g < G; g++) {
                int *p = perm(hpg, g * hpg);
                memcpy(imp->ssm_head_order[l] + g * hpg, p, sizeof(int) * hpg);
                free(p);
            }
            imp->ssm_dim_order[l] = perm(a->ssm_head_dim, 0);
            d->ssm_heads = hpg > 1 ? s->ssm_heads - G : s->ssm_heads;
        }
    }
}

/* 1 when dir_a/name and dir_b/name hold the same bytes. */
static int same_file(const char *da, const char *db, const char *name) {
    char pa[400], pb[400];
    snprintf(pa, sizeof pa, "%s/%s", da, name);
    snprintf(pb, sizeof pb, "%s/%s", db, name);
    ac_err e;
    size_t na = 0, nb = 0;
    char *a = ac_read_file(pa, 1 << 28, &na, &e), *b = a ? ac_read_file(pb, 1 << 28, &nb, &e) : NULL;
    int same = a && b && na == nb && na > 0 && !memcmp(a, b, na);
    free(a), free(b);
    return same;
}

static void check_fixture(const char *name) {
    char dir[1100], rel[200];
    snprintf(rel, sizeof rel, "fixtures/models/%s", name);
    ck_build_path(dir, sizeof dir, rel);
    ac_model m;
    ac_err e = {{0}};
    if (ac_model_load_resident(dir, &m, &e)) {
        CHECK(0, "%s: %s (make fixtures)", name, e.msg);
        return;
    }
    ac_arch t;
    ac_importance imp;
    CHECK(ac_arch_copy(&t, &m.a, &e) == 0, "%s: %s", name, e.msg);
    cut_everything(&m.a, &t, &imp);
    ac_model p32, p16;
    int ok32 = ac_prune(&m, &t, &imp, &p32, &e) == 0;
    CHECK(ok32, "%s: ac_prune: %s", name, e.msg);
    int ok16 = ac_prune_bf16(&m, &t, &imp, &p16, &e) == 0;
    CHECK(ok16, "%s: ac_prune_bf16: %s", name, e.msg);
    char tmp[] = "/tmp/ac_test_prune_bf16_XXXXXX", d32[300], d16[300];
    if (ok32 && ok16 && mkdtemp(tmp)) {
        snprintf(d32, sizeof d32, "%s/fp32", tmp);
        snprintf(d16, sizeof d16, "%s/bf16", tmp);
        int saved = ac_model_save(&p32, d32, ST_BF16, &e) == 0 && ac_model_save(&p16, d16, ST_BF16, &e) == 0;
        CHECK(saved, "%s: save: %s", name, e.msg);
        int same = saved && same_file(d32, d16, "model.safetensors") && same_file(d32, d16, "config.json");
        CHECK(same, "%s: the BF16 student differs from the fp32 one rounded", name);
        printf("  %s: hidden %d -> %d, %.0f -> %.0f parameters: BF16 student %s the fp32 student rounded\n", name,
               m.a.hidden, t.hidden, ac_arch_params(&m.a), ac_arch_params(&t), same ? "is" : "is NOT");
        ck_rmtree(tmp);
    }
    if (ok32) ac_model_free(&p32);
    if (ok16) ac_model_free(&p16);
    imp_free(&imp);
    ac_arch_free(&t);
    ac_model_free(&m);
}

static void test_bf16_student_is_fp32_rounded(void) {
    char probe[1100];
    struct stat st;
    ck_build_path(probe, sizeof probe, "fixtures/models/nemotronh_latent_bf16/config.json");
    if (stat(probe, &st)) SKIP("no fixtures (make fixtures)");
    const char *names[] = {"llama_gqa_bf16",     "qwen2_tied_f16",     "qwen3moe_mixed_bf16",  "mixtral_f32",
                           "nemotronh_bf16",     "nemotronh_moe_bf16", "nemotronh_latent_bf16"};
    for (size_t i = 0; i < sizeof names / sizeof *names; i++) check_fixture(names[i]);
}

int main(void) {
    RUN(test_bf16_student_is_fp32_rounded);
    return DONE();
}
