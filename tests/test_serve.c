/*
 * test_serve.c - the serving-engine model (issue 32): the scheduler
 * simulation (src/cost/serve.c) against closed-form answers and against a
 * second, independently written simulation of the same policy (ref_run
 * below: per-request states and priority keys instead of queues), and the
 * cost model's engine figures (src/cost/engines.c, costmodel.c) against
 * hand-derived values: paged-KV blocks, CUDA-graph launch savings, tensor
 * parallelism's shards and all-reduces, FP8 peaks, the job spec's engine
 * names.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "cost/costmodel.h"
#include "cost/costtimings_int.h"
#include "cost/device.h"
#include "cost/engines.h"
#include "pipeline/jobcheck.h"
#include "pipeline/jobspec.h"
#include "cost/provenance.h"
#include "cost/serve_int.h"
#include "synth_cost.h"

/* ---------------------------------------------------------------- step costs */

typedef struct {
    double a, per_tok, per_ctx; /* us: fixed, per new token, per key a decode reads */
} lin;

static double lin_cost(void *ud, const ac_serve_step *s) {
    const lin *c = ud;
    return c->a + c->per_tok * s->tokens + c->per_ctx * s->decode_ctx;
}

static ac_serve_policy vllm_like(int budget, long blocks) {
    return (ac_serve_policy){.budget = budget, .max_seqs = 256, .chunked = 1, .block_size = 16, .kv_blocks = blocks};
}

/* ---------------------------------------------------------------- closed forms */

static void test_offline_batch_closed_form(void) {
    /* N requests, all prompts in one step: TTFT = T, then G - 1 decode
     * steps of T: E2E = G T, TPOT = T, throughput N G / (G T) */
    enum { N = 8, P = 100, G = 20 };
    ac_serve_req r[N];
    for (int i = 0; i < N; i++) r[i] = (ac_serve_req){0, P, G};
    lin c = {1000, 0, 0};
    ac_serve_policy pol = vllm_like(N * P, 1000);
    ac_serve_stats st;
    ac_serve_result res[N];
    ac_err e;
    CHECK(ac_serve_run(r, N, &pol, lin_cost, &c, &st, res, &e) == 0, "%s", e.msg);
    CHECK(st.steps == G, "steps %d, want %d", st.steps, G);
    CHECK(fabs(st.p50_ttft_ms - 1) < 1e-9 && fabs(st.p99_ttft_ms - 1) < 1e-9, "ttft %g", st.p99_ttft_ms);
    CHECK(fabs(st.p99_tpot_ms - 1) < 1e-9, "tpot %g", st.p99_tpot_ms);
    CHECK(fabs(st.p99_e2e_ms - G) < 1e-9, "e2e %g", st.p99_e2e_ms);
    CHECK(fabs(st.tokens_per_s - N * G / (G * 1e-3)) < 1e-6, "tok/s %g", st.tokens_per_s);
}

static void test_chunked_prefill_closed_form(void) {
    /* one request of 2.5 budgets: three chunks (B, B, B/2), TTFT = 3a + b P;
     * decodes at contexts P+1 .. P+G-1: a + b + d ctx each */
    enum { B = 512, P = 1280, G = 5 };
    ac_serve_req r = {0, P, G};
    lin c = {100, 0.5, 0.01};
    ac_serve_policy pol = vllm_like(B, 1000);
    ac_serve_stats st;
    ac_serve_result res;
    ac_err e;
    CHECK(ac_serve_run(&r, 1, &pol, lin_cost, &c, &st, &res, &e) == 0, "%s", e.msg);
    double ttft = (3 * c.a + c.per_tok * P) * 1e-6, dec = 0;
    for (int k = P + 1; k <= P + G - 1; k++) dec += (c.a + c.per_tok + c.per_ctx * k) * 1e-6;
    CHECK(fabs(res.ttft - ttft) < 1e-12, "ttft %.9g want %.9g", res.ttft, ttft);
    CHECK(fabs(res.e2e - ttft - dec) < 1e-12, "e2e %.9g want %.9g", res.e2e, ttft + dec);
    CHECK(fabs(st.p50_tpot_ms - dec / (G - 1) * 1e3) < 1e-9, "tpot %g", st.p50_tpot_ms);
}

static void test_isolated_arrivals_closed_form(void) {
    /* arrivals far apart: each request alone, TTFT = a + b P from its send */
    enum { N = 5, P = 64, G = 3 };
    ac_serve_req r[N];
    for (int i = 0; i < N; i++) r[i] = (ac_serve_req){10.0 * i, P, G};
    lin c = {200, 1, 0.1};
    ac_serve_policy pol = vllm_like(2048, 1000);
    ac_serve_stats st;
    ac_serve_result res[N];
    ac_err e;
    CHECK(ac_serve_run(r, N, &pol, lin_cost, &c, &st, res, &e) == 0, "%s", e.msg);
    double ttft = (c.a + c.per_tok * P) * 1e-6,
           e2e = ttft + (2 * (c.a + c.per_tok) + c.per_ctx * ((P + 1) + (P + 2))) * 1e-6;
    for (int i = 0; i < N; i++) {
        CHECK(res[i].send == 10.0 * i, "send %g", res[i].send);
        CHECK(fabs(res[i].ttft - ttft) < 1e-12 && fabs(res[i].e2e - e2e) < 1e-12, "request %d: %g %g", i, res[i].ttft,
              res[i].e2e);
    }
}

static void test_kv_pool_waves(void) {
    /* TRT-LLM's admission (whole KV reserved, whole prompts): a pool of
     * exactly K requests serves 2K in two waves; the second wave's prompts
     * run in the step after the first wave's last token */
    enum { K = 3, P = 32, G = 10 };
    ac_serve_req r[2 * K];
    for (int i = 0; i < 2 * K; i++) r[i] = (ac_serve_req){0, P, G};
    lin c = {1000, 0, 0};
    ac_serve_policy pol = {
        .budget = 8192, .max_seqs = 64, .reserve_all = 1, .block_size = 16, .kv_blocks = K * ((P + G + 15) / 16)};
    ac_serve_stats st;
    ac_serve_result res[2 * K];
    ac_err e;
    CHECK(ac_serve_run(r, 2 * K, &pol, lin_cost, &c, &st, res, &e) == 0, "%s", e.msg);
    for (int i = 0; i < 2 * K; i++) {
        double want_ttft = i < K ? 1e-3 : (G + 1) * 1e-3, want_e2e = i < K ? G * 1e-3 : 2 * G * 1e-3;
        CHECK(fabs(res[i].ttft - want_ttft) < 1e-12 && fabs(res[i].e2e - want_e2e) < 1e-12, "request %d: %g %g", i,
              res[i].ttft, res[i].e2e);
    }
    CHECK(st.preemptions == 0 && st.peak_running == K, "preemptions %d peak %d", st.preemptions, st.peak_running);
    /* one block fewer than a request needs: nothing can be served */
    pol.kv_blocks = (P + G + 15) / 16 - 1;
    CHECK(ac_serve_run(r, 2 * K, &pol, lin_cost, &c, &st, res, &e) == 0 && st.dropped == 2 * K && st.completed == 0,
          "dropped %d", st.dropped);
}

static void test_closed_loop_concurrency(void) {
    /* concurrency 1, all queued at 0: requests run one after another, each
     * sent when the previous one finishes */
    enum { N = 4, P = 10, G = 4 };
    ac_serve_req r[N];
    for (int i = 0; i < N; i++) r[i] = (ac_serve_req){0, P, G};
    lin c = {500, 0, 0};
    ac_serve_policy pol = vllm_like(2048, 1000);
    pol.concurrency = 1;
    ac_serve_stats st;
    ac_serve_result res[N];
    ac_err e;
    CHECK(ac_serve_run(r, N, &pol, lin_cost, &c, &st, res, &e) == 0, "%s", e.msg);
    for (int i = 0; i < N; i++)
        CHECK(fabs(res[i].send - i * G * 5e-4) < 1e-12 && fabs(res[i].e2e - G * 5e-4) < 1e-12, "request %d: %g %g", i,
              res[i].send, res[i].e2e);
}

/* ---------------------------------------------------------------- an independent reference */

/* The same policy written another way: each request has a state and a
 * queue key; the waiting order is the key order (a preempted request gets a
 * key below every other), the running order the admission stamp. */
enum { QUEUED, RUNNING, FINISHED, UNSENT };
typedef struct {
    int st, key, stamp;
    int prompt, gen, emitted, computed, goal;
    long held;
    double send, ttft, e2e;
} rr;

static long nblk(long tok, int bs) { return tok <= 0 ? 0 : (tok - 1) / bs + 1; }

static int ref_run(const ac_serve_req *rq, int n, const ac_serve_policy *pol, const lin *c, double *ttft, double *e2e) {
    rr *x = calloc((size_t)n, sizeof *x);
    int *sched = calloc((size_t)n, sizeof *sched);
    long freeb = pol->kv_blocks;
    int stamp = 0, lowkey = 0, finished = 0;
    double now = 0;
    for (int i = 0; i < n; i++) x[i] = (rr){.st = UNSENT, .key = i, .prompt = rq[i].prompt, .gen = rq[i].gen};
    while (finished < n) {
        int any = 0;
        for (int i = 0; i < n; i++)
            if (x[i].st == UNSENT && rq[i].arrival <= now)
                x[i].st = QUEUED, x[i].send = rq[i].arrival, x[i].goal = x[i].prompt;
        for (int i = 0; i < n; i++) any |= x[i].st == QUEUED || x[i].st == RUNNING;
        if (!any) {
            double nx = HUGE_VAL;
            for (int i = 0; i < n; i++)
                if (x[i].st == UNSENT && rq[i].arrival < nx) nx = rq[i].arrival;
            now = nx;
            continue;
        }
        memset(sched, 0, (size_t)n * sizeof *sched);
        int left = pol->budget, pre = 0, nrun = 0, count = 0;
        for (;;) { /* running, by stamp */
            int best = -1;
            for (int i = 0; i < n; i++)
                if (x[i].st == RUNNING && !sched[i] && x[i].stamp >= 0 && (best < 0 || x[i].stamp < x[best].stamp))
                    best = i;
            if (best < 0 || left <= 0) break;
            rr *r = &x[best];
            int want = r->computed < r->goal ? (r->goal - r->computed < left ? r->goal - r->computed : left) : 1;
            long need = nblk(r->computed + want, pol->block_size) - r->held;
            while (need > freeb) { /* preempt the newest running (possibly itself) */
                int v = -1;
                for (int i = 0; i < n; i++)
                    if (x[i].st == RUNNING && !sched[i] && (v < 0 || x[i].stamp > x[v].stamp)) v = i;
                freeb += x[v].held;
                x[v].held = 0, x[v].computed = 0, x[v].goal = x[v].prompt + x[v].emitted;
                x[v].st = QUEUED, x[v].key = --lowkey;
                pre = 1;
                if (v == best) break;
            }
            if (r->st != RUNNING) continue;
            freeb -= need, r->held += need;
            sched[best] = want, left -= want, count++;
            r->stamp = r->stamp; /* keeps its place */
        }
        for (int i = 0; i < n; i++) nrun += x[i].st == RUNNING;
        while (!pre && left > 0 && nrun < pol->max_seqs) { /* queued, by key */
            int h = -1;
            for (int i = 0; i < n; i++)
                if (x[i].st == QUEUED && (h < 0 || x[i].key < x[h].key)) h = i;
            if (h < 0) break;
            int want = x[h].goal < left ? x[h].goal : left;
            long need = nblk(want, pol->block_size);
            if (need > freeb) break;
            freeb -= need, x[h].held = need, x[h].computed = 0;
            x[h].st = RUNNING, x[h].stamp = ++stamp;
            sched[h] = want, left -= want, count++, nrun++;
        }
        if (!count) {
            free(x), free(sched);
            return -1;
        }
        ac_serve_step s = {0};
        for (int i = 0; i < n; i++) {
            if (!sched[i]) continue;
            s.tokens += sched[i];
            if (x[i].computed >= x[i].goal) s.n_decode++, s.decode_ctx += x[i].computed + 1;
        }
        now += lin_cost((void *)c, &s) * 1e-6;
        for (int i = 0; i < n; i++) {
            if (!sched[i]) continue;
            rr *r = &x[i];
            int prefill = r->computed < r->goal;
            r->computed += sched[i];
            if (prefill && r->computed < r->goal) continue;
            if (r->emitted++ == 0) r->ttft = now - r->send;
            if (r->emitted >= r->gen) {
                r->e2e = now - r->send, r->st = FINISHED, freeb += r->held, r->held = 0, finished++;
            }
        }
    }
    for (int i = 0; i < n; i++) ttft[i] = x[i].ttft, e2e[i] = x[i].e2e;
    free(x), free(sched);
    return 0;
}

static void test_matches_independent_simulation(void) {
    /* Poisson arrivals, spread lengths, a pool small enough to preempt */
    ac_workload w = {
        .prompt_len = 300, .gen_len = 60, .arrival_rate = 40, .requests = 150, .length_spread = 0.8, .seed = 7};
    ac_serve_req *r;
    int n, preempting = 0;
    ac_err e;
    CHECK(ac_serve_requests(&w, &r, &n, &e) == 0, "%s", e.msg);
    lin c = {3000, 2, 0.05};
    long pools[] = {4000, 120, 60};
    int budgets[] = {2048, 512, 256};
    for (int k = 0; k < 3; k++) {
        ac_serve_policy pol = vllm_like(budgets[k], pools[k]);
        pol.max_seqs = 32;
        ac_serve_stats st;
        ac_serve_result *res = calloc((size_t)n, sizeof *res);
        double *t1 = calloc((size_t)n, sizeof *t1), *e1 = calloc((size_t)n, sizeof *e1);
        CHECK(ac_serve_run(r, n, &pol, lin_cost, &c, &st, res, &e) == 0, "%s", e.msg);
        CHECK(ref_run(r, n, &pol, &c, t1, e1) == 0, "reference stalled");
        double worst = 0;
        for (int i = 0; i < n; i++) {
            double d = fmax(fabs(res[i].ttft - t1[i]), fabs(res[i].e2e - e1[i]));
            if (d > worst) worst = d;
        }
        printf("   pool %ld blocks, budget %d: %d steps, %d preemptions, p99 TTFT %.1f ms, max |diff| %.2e s\n",
               pools[k], budgets[k], st.steps, st.preemptions, st.p99_ttft_ms, worst);
        CHECK(worst < 1e-9, "pool %ld: simulations differ by %g s", pools[k], worst);
        CHECK(st.completed == n, "completed %d of %d", st.completed, n);
        preempting += st.preemptions > 0;
        free(res), free(t1), free(e1);
    }
    CHECK(preempting > 0, "no case preempted: the comparison does not cover recompute");
    free(r);
}

static void test_poisson_requests(void) {
    /* mean gap 1 / rate, lengths within the spread, same seed same trace */
    ac_workload w = {
        .prompt_len = 100, .gen_len = 50, .arrival_rate = 4, .requests = 4000, .length_spread = 0.5, .seed = 3};
    ac_serve_req *a, *b;
    int n, m;
    ac_err e;
    CHECK(ac_serve_requests(&w, &a, &n, &e) == 0 && ac_serve_requests(&w, &b, &m, &e) == 0, "%s", e.msg);
    double mean_gap = a[n - 1].arrival / n;
    CHECK(fabs(mean_gap - 0.25) < 0.02, "mean gap %g", mean_gap);
    int lo = 1 << 30, hi = 0;
    for (int i = 0; i < n; i++) lo = a[i].prompt < lo ? a[i].prompt : lo, hi = a[i].prompt > hi ? a[i].prompt : hi;
    CHECK(lo == 50 && hi == 150, "prompt range %d..%d", lo, hi);
    CHECK(!memcmp(a, b, sizeof *a * (size_t)n), "same seed, different trace");
    free(a), free(b);
}

/* ---------------------------------------------------------------- the cost model's engine figures */

static void arch8b(ac_carch *c, double *buf, int L) {
    *c = (ac_carch){.n_layers = L,
                    .head_dim = 128,
                    .vocab = 128256,
                    .hidden = 4096,
                    .heads = buf,
                    .kv = buf + L,
                    .ffn = buf + 2 * L};
    for (int l = 0; l < L; l++) buf[l] = 32, buf[L + l] = 8, buf[2 * L + l] = 14336;
}

static void test_static_and_served_agree(void) {
    /* offline N equal requests whose prompts fit one step is the static
     * batch of N: the same prefill, decode steps at the same contexts */
    double buf[96];
    ac_carch c;
    arch8b(&c, buf, 32);
    ac_cost_table t;
    ac_err e;
    CHECK(ac_cost_roofline(ac_device_spec_find("H100"), "bf16", &t, &e) == 0, "%s", e.msg);
    ac_engine_profile p;
    ac_engine_profile_named(ac_engine_find("trtllm"), 0, &p);
    p.graph_max = -1; /* eager: the static model pads no batch */
    ac_workload ws = {.batch = 16, .prompt_len = 256, .gen_len = 64}, wo = ws;
    wo.offline = 1, wo.requests = 16;
    ac_cost a, b;
    ac_cost_predict(&t, &c, &ws, &p, 0, &a);
    ac_cost_predict(&t, &c, &wo, &p, 0, &b);
    printf("   static: TTFT %.3f TPOT %.4f %.0f tok/s; served: %.3f %.4f %.0f tok/s\n", a.ttft_ms, a.tpot_ms,
           a.tokens_per_s, b.ttft_ms, b.tpot_ms, b.tokens_per_s);
    CHECK(b.served && !a.served, "served flags");
    CHECK(fabs(b.ttft_ms / a.ttft_ms - 1) < 1e-9, "TTFT %g vs %g", b.ttft_ms, a.ttft_ms);
    CHECK(fabs(b.tpot_ms / a.tpot_ms - 1) < 2e-3, "TPOT %g vs %g", b.tpot_ms, a.tpot_ms);
    CHECK(fabs(b.tokens_per_s / a.tokens_per_s - 1) < 2e-3, "tok/s %g vs %g", b.tokens_per_s, a.tokens_per_s);
    CHECK(a.p99_ttft_ms == a.ttft_ms && a.p99_e2e_ms == a.e2e_ms, "static percentiles");
    ac_cost_table_free(&t);
}

static void test_paged_kv_pool(void) {
    /* vLLM on an H100: blocks = floor((0.9 x memory - weights - activations
     * of a budget step - overhead) / (16 x KV bytes per token)) */
    double buf[96];
    ac_carch c;
    arch8b(&c, buf, 32);
    ac_cost_table t;
    ac_err e;
    CHECK(ac_cost_roofline(ac_device_spec_find("H100"), "bf16", &t, &e) == 0, "%s", e.msg);
    ac_engine_profile p;
    ac_engine_profile_named(ac_engine_find("vllm"), 0, &p);
    ac_workload w = {.batch = 1, .prompt_len = 1000, .gen_len = 1000};
    ac_cost k;
    ac_cost_predict(&t, &c, &w, &p, 0, &k);
    double gib = 1073741824.0, kv_tok = 32 * 2 * 8 * 128 * 2.0, widest = 2 * 14336;
    double act = (8192 * (4096 + widest) * 2 + 1024.0 * 128256 * 4) / gib; /* served budget 8192, 1024 sequences */
    double pool = 0.9 * t.mem_gib - ac_carch_params(&c) * 2 / gib - act - 1.5;
    long blocks = (long)floor(pool * gib / (16 * kv_tok));
    CHECK(k.kv_blocks == blocks, "blocks %ld, want %ld", k.kv_blocks, blocks);
    CHECK(k.kv_concurrency == (int)(blocks / 125), "concurrency %d", k.kv_concurrency); /* 2000 tokens = 125 blocks */
    CHECK(fabs(k.engine_mem_gib - 0.9 * t.mem_gib) < 1e-9, "engine memory %g", k.engine_mem_gib);
    printf("   Llama-3.1-8B BF16 on H100, vLLM: %ld blocks, %.0f tokens, %d requests of 1000/1000\n", k.kv_blocks,
           k.kv_tokens, k.kv_concurrency);
    ac_cost_table_free(&t);
}

static void test_cuda_graph_launches(void) {
    /* a decode step of one sequence: graphed, vLLM pays one launch plus the
     * attention kernels (piecewise) instead of every kernel's */
    double buf[96];
    ac_carch c;
    arch8b(&c, buf, 32);
    ac_cost_table t;
    ac_err e;
    CHECK(ac_cost_roofline(ac_device_spec_find("H100"), "bf16", &t, &e) == 0, "%s", e.msg);
    ac_engine_profile p, eager;
    ac_engine_profile_named(ac_engine_find("vllm"), 0, &p);
    eager = p;
    eager.graph_max = -1;
    int ctx = 100;
    int ch[1] = {0};
    ac_serve_step s = {.n_decode = 1, .decode_ctx = ctx, .chunk = ch, .chunk_end = ch, .tokens = 1, .logits = 1};
    double g = ac_cost_served_step_us(&t, &c, &p, &s), x = ac_cost_served_step_us(&t, &c, &eager, &s);
    int launches = 2 + 5 * 32;
    CHECK(fabs((x - g) - (launches - 33) * t.launch_us) < 1e-6, "saved %g us, want %g", x - g,
          (launches - 33) * t.launch_us);
    /* beyond the largest captured size (512 tokens) nothing changes */
    s.n_decode = 600, s.decode_ctx = 600.0 * ctx, s.tokens = 600, s.logits = 600;
    g = ac_cost_served_step_us(&t, &c, &p, &s), x = ac_cost_served_step_us(&t, &c, &eager, &s);
    CHECK(fabs(x - g) < 1e-9, "600 tokens: %g vs %g", g, x);
    ac_engine_rt rt;
    ac_engine_resolve(&p, t.mem_gib, t.device, NULL, &rt);
    CHECK(ac_engine_graph_size(&rt, 3) == 4 && ac_engine_graph_size(&rt, 9) == 16 &&
              ac_engine_graph_size(&rt, 512) == 512 && ac_engine_graph_size(&rt, 513) == 0,
          "capture sizes");
    ac_cost_table_free(&t);
}

/* NCCL's ring all-reduce as its tuning model prices it, written out here
 * from src/graph/tuning.cc's tables: (base, per step) latencies of LL,
 * LL128 and Simple over NVLink, and their bus bandwidths: LL half the link
 * capped at Hopper's 141 GB/s, LL128 0.92 of it, Simple all of it. */
static double nccl_nvlink_hopper_us(int n, double bytes, double link) {
    double steps = 2.0 * (n - 1), algo = n / steps;
    double ll = 6.6 + 0.6 * steps + bytes / (fmin(0.5 * link, 141) * 1e3 * algo);
    double ll128 = 14.0 + 1.9 * steps + bytes / (0.92 * link * 1e3 * algo);
    double simple = 8.4 + 3.4 * steps + bytes / (link * 1e3 * algo);
    return fmin(ll, fmin(ll128, simple));
}

static void test_tensor_parallel(void) {
    /* tp 2 = one GPU's half-width model plus two all-reduces a layer of
     * M x hidden x 2 bytes; TensorRT-LLM's through NCCL over the H100's
     * NVLink (360 GB/s): 1 and 16 tokens on LL, 256 on Simple */
    double buf[96], hb[96];
    ac_carch c, h;
    arch8b(&c, buf, 32);
    arch8b(&h, hb, 32);
    for (int l = 0; l < 32; l++) hb[l] = 16, hb[32 + l] = 4, hb[64 + l] = 7168;
    h.vocab = 128256 / 2;
    ac_cost_table t;
    ac_err e;
    CHECK(ac_cost_roofline(ac_device_spec_find("H100"), "bf16", &t, &e) == 0, "%s", e.msg);
    ac_engine_profile p1, p2;
    ac_engine_profile_named(ac_engine_find("trtllm"), 0, &p1);
    p1.graph_max = -1;
    p2 = p1;
    p2.tp = 2;
    int ch[1] = {0};
    double want[3] = {7.8 + 8192 / 141e3, 7.8 + 131072 / 141e3, 15.2 + 2097152 / 360e3};
    for (int i = 0, tokens = 1; tokens <= 256; tokens *= 16, i++) {
        ac_serve_step s = {.n_decode = tokens,
                           .decode_ctx = 500.0 * tokens,
                           .chunk = ch,
                           .chunk_end = ch,
                           .tokens = tokens,
                           .logits = tokens};
        double one = ac_cost_served_step_us(&t, &h, &p1, &s), two = ac_cost_served_step_us(&t, &c, &p2, &s);
        double each = nccl_nvlink_hopper_us(2, tokens * 4096 * 2, 360), ar = 2 * 32 * each;
        CHECK(fabs(each - want[i]) < 1e-9, "%d tokens: NCCL %g us, by hand %g", tokens, each, want[i]);
        CHECK(fabs(two - one - ar) < 1e-6, "%d tokens: tp2 %g, half model %g + all-reduce %g", tokens, two, one, ar);
    }
    /* vLLM's own kernels over NVLink at tp 4: one stage below 512 KiB (two
     * 6 us barriers, each GPU reading the 3 others' buffers), two stages to
     * 8 MiB (three barriers, 2 (tp - 1) / tp of the bytes), NCCL beyond; no
     * custom kernels over PCIe (an L4: NCCL's LL or Simple, no LL128) */
    ac_engine_profile pv;
    ac_engine_profile_named(ac_engine_find("vllm"), 0, &pv);
    pv.tp = 4;
    ac_engine_rt rt;
    ac_engine_resolve(&pv, 80, "H100", NULL, &rt);
    double small = 256 * 1024, mid = 4 * 1048576.0, big = 16 * 1048576.0;
    CHECK(fabs(ac_engine_allreduce_us(&rt, small) - (12 + 3 * small / 360e3)) < 1e-9, "one stage: %g",
          ac_engine_allreduce_us(&rt, small));
    CHECK(fabs(ac_engine_allreduce_us(&rt, mid) - (18 + 1.5 * mid / 360e3)) < 1e-9, "two stages: %g",
          ac_engine_allreduce_us(&rt, mid));
    CHECK(fabs(ac_engine_allreduce_us(&rt, big) - nccl_nvlink_hopper_us(4, big, 360)) < 1e-9, "NCCL: %g",
          ac_engine_allreduce_us(&rt, big));
    ac_engine_resolve(&pv, 24, "L4", NULL, &rt);
    double pcie = fmin(6.6 + 6 * 1.0 + small / (10e3 * 4 / 6.0), 8.4 + 6 * 5.7 + small / (20e3 * 4 / 6.0));
    CHECK(fabs(ac_engine_allreduce_us(&rt, small) - pcie) < 1e-9, "PCIe: %g vs %g", ac_engine_allreduce_us(&rt, small),
          pcie);
    ac_engine_profile_named(ac_engine_find("trtllm"), 0, &pv);
    pv.tp = 8;
    ac_engine_resolve(&pv, 80, "H200", NULL, &rt);
    CHECK(fabs(ac_engine_allreduce_us(&rt, small) - nccl_nvlink_hopper_us(8, small, 360)) < 1e-9,
          "TensorRT-LLM: NCCL at any size: %g", ac_engine_allreduce_us(&rt, small));
    ac_workload w = {.batch = 1, .prompt_len = 1000, .gen_len = 1000};
    ac_cost k1, k2;
    ac_cost_predict(&t, &c, &w, &p1, 0, &k1);
    ac_cost_predict(&t, &c, &w, &p2, 0, &k2);
    CHECK(k1.params == k2.params, "params are the model's");
    CHECK(k2.weights_gib < 0.51 * k1.weights_gib && k2.weights_gib > 0.49 * k1.weights_gib, "weights per GPU %g of %g",
          k2.weights_gib, k1.weights_gib);
    CHECK(k2.kv_concurrency > 2 * k1.kv_concurrency, "tp2 KV concurrency %d vs %d", k2.kv_concurrency,
          k1.kv_concurrency);
    ac_cost_table_free(&t);
}

static void test_fp8_peaks(void) {
    /* FP8 doubles the peak on FP8 tensor cores (H100), not on the A100
     * (weight-only FP8: BF16 compute) */
    ac_cost_table h8, h16, a8, a16;
    ac_err e;
    CHECK(!ac_cost_roofline(ac_device_spec_find("H100"), "fp8", &h8, &e) &&
              !ac_cost_roofline(ac_device_spec_find("H100"), "bf16", &h16, &e) &&
              !ac_cost_roofline(ac_device_spec_find("A100"), "fp8", &a8, &e) &&
              !ac_cost_roofline(ac_device_spec_find("A100"), "bf16", &a16, &e),
          "%s", e.msg);
    CHECK(h8.peak_tflops == 2 * h16.peak_tflops && a8.peak_tflops == a16.peak_tflops, "peaks %g %g %g %g",
          h8.peak_tflops, h16.peak_tflops, a8.peak_tflops, a16.peak_tflops);
    /* an FP8 KV cache halves what decode attention reads under BF16 weights */
    double buf[96];
    ac_carch c;
    arch8b(&c, buf, 32);
    ac_engine_profile p, q;
    ac_engine_profile_named(ac_engine_find("trtllm"), 0, &p);
    q = p;
    q.kv_bytes = 1;
    double b1 = ac_cost_decode_step_us(&h16, &c, &p, 256, 4096), b2 = ac_cost_decode_step_us(&h16, &c, &q, 256, 4096);
    CHECK(b2 < 0.8 * b1, "FP8 KV step %g vs BF16 KV %g", b2, b1);
    ac_cost_table_free(&h8), ac_cost_table_free(&h16), ac_cost_table_free(&a8), ac_cost_table_free(&a16);
}

/* llama.cpp with F16 weights (gemm_f16_acc): every weight GEMM of more
 * than one row at the profile's FP16-accumulate rate (RTX 4090: 330.3
 * against 165 TFLOP/s) plus two conversions (F32 -> F16 input, F16 -> F32
 * output, 6 bytes an element) and their launches; FP8 GEMMs on FP8 tensor
 * cores quantise each distinct input once (3 bytes an element) with a
 * launch. Both checked as the TTFT difference a hand sum over the
 * Llama-3-8B layer's GEMMs gives (every GEMM here compute-bound). */
static void test_gemm_paths(void) {
    double buf[96];
    ac_carch c;
    arch8b(&c, buf, 32);
    ac_cost_table t, h8;
    ac_err e;
    CHECK(!ac_cost_roofline(ac_device_spec_find("RTX4090"), "bf16", &t, &e) &&
              !ac_cost_roofline(ac_device_spec_find("H100"), "fp8", &h8, &e),
          "%s", e.msg);
    CHECK(t.peak_acc16_tflops == 330.3 && h8.fp8_act == 1, "acc16 peak %g, fp8_act %d", t.peak_acc16_tflops,
          h8.fp8_act);
    ac_engine_profile p, q;
    ac_engine_profile_named(ac_engine_find("llamacpp"), 0, &p);
    p.graph_max = -1;
    q = p;
    q.gemm_f16_acc = 1;
    double M = 512;
    ac_workload w = {.batch = 1, .prompt_len = (int)M, .gen_len = 1};
    ac_cost a, b;
    ac_cost_predict(&t, &c, &w, &p, 0, &a);
    ac_cost_predict(&t, &c, &w, &q, 0, &b);
    /* the layer's GEMMs (n, k): q, k, v, o, gate, up, down */
    double g[7][2] = {{4096, 4096}, {1024, 4096}, {1024, 4096}, {4096, 4096}, {14336, 4096}, {14336, 4096},
                      {4096, 14336}};
    /* at 512 rows every GEMM fills whole waves of 64 x 64 tiles on the
     * 4090's 128 SMs (8 x 16, 8 x 64, 8 x 224 tiles), so the wave model
     * (costroofline.c) prices them at 0.75 of the peak, as written here */
    double d = 0;
    for (int i = 0; i < 7; i++) {
        double fl = 2 * M * g[i][0] * g[i][1];
        d += fl / (0.75 * 330.3e12) - fl / (0.75 * 165e12) + 6 * M * (g[i][0] + g[i][1]) / (0.85 * 1008e9) +
             2 * 5e-6;
    }
    d *= 32 * 1e3; /* ms; the LM head runs one row (the matrix-vector kernel) */
    CHECK(fabs((b.ttft_ms - a.ttft_ms) - d) < 1e-6 * a.ttft_ms, "F16-accumulate TTFT %g - %g ms, hand %g", b.ttft_ms,
          a.ttft_ms, d);
    /* FP8: the same arch on the H100 with and without the input quantisation */
    ac_engine_profile f;
    ac_engine_profile_named(ac_engine_find("trtllm"), 0, &f);
    f.graph_max = -1;
    f.w_bytes = 1;
    ac_cost_table h8n = h8;
    h8n.fp8_act = 0;
    ac_cost_predict(&h8, &c, &w, &f, 0, &a);
    ac_cost_predict(&h8n, &c, &w, &f, 0, &b);
    double inputs[4] = {4096, 4096, 4096, 14336}; /* q/k/v, o, gate/up, down */
    d = 0;
    for (int i = 0; i < 4; i++) d += 3 * M * inputs[i] / (0.85 * 3350e9) + 4e-6;
    d *= 32 * 1e3;
    CHECK(fabs((a.ttft_ms - b.ttft_ms) - d) < 1e-6 * a.ttft_ms, "FP8 quantise TTFT %g - %g ms, hand %g", a.ttft_ms,
          b.ttft_ms, d);
    ac_cost_table_free(&t), ac_cost_table_free(&h8);
}

static void test_engine_names_in_the_spec(void) {
    ac_target_spec t;
    const char *field;
    ac_err e;
    json_t *j = json_pack("{s:s,s:{s:s}}", "device", "H100", "engine", "name", "tgi");
    CHECK(ac_target_spec_parse(j, &t, "target", &field, &e) != 0, "tgi accepted");
    CHECK(!strcmp(field, "target.engine.name"), "field %s", field);
    CHECK(strstr(e.msg, "vllm, trtllm, sglang, llamacpp"), "message does not list the engines: %s", e.msg);
    json_decref(j);
    const char *names[] = {"vllm", "trtllm", "sglang", "llamacpp"};
    int blocks[] = {16, 32, 1, 1};
    for (int i = 0; i < 4; i++) {
        j = json_pack("{s:s,s:{s:s}}", "device", "L4", "engine", "name", names[i]);
        CHECK(ac_target_spec_parse(j, &t, "target", &field, &e) == 0, "%s: %s", names[i], e.msg);
        CHECK(!strcmp(t.engine.name, names[i]) && t.engine.block_size == blocks[i], "%s: block %d", names[i],
              t.engine.block_size);
        json_decref(j);
    }
    /* L4 (24 GB): vLLM's small-GPU defaults, SGLang's */
    ac_engine_profile p;
    ac_engine_rt rt;
    ac_workload w = {.offline = 0};
    ac_engine_profile_named(ac_engine_find("vllm"), 0, &p);
    ac_engine_resolve(&p, 24e9 / 1073741824.0, "NVIDIA L4 24GB", &w, &rt);
    CHECK(rt.budget == 2048 && rt.max_seqs == 256 && rt.graph_max == 512, "vllm on L4 %d %d %d", rt.budget, rt.max_seqs,
          rt.graph_max);
    ac_engine_resolve(&p, 80e9 / 1073741824.0, "NVIDIA A100 SXM 80GB", &w, &rt);
    CHECK(rt.budget == 2048, "vllm on A100 keeps the small budget: %d", rt.budget);
    ac_engine_profile_named(ac_engine_find("sglang"), 0, &p);
    ac_engine_resolve(&p, 24e9 / 1073741824.0, "NVIDIA L4 24GB", &w, &rt);
    CHECK(rt.budget == 2048 && rt.graph_max == 8 && rt.prefill_first, "sglang on L4 %d %d", rt.budget, rt.graph_max);
    /* tp on the CPU, NVLink on an L4: 4xx with the field */
    j = json_pack("{s:s,s:i}", "device", "cpu", "tp", 2);
    CHECK(ac_target_spec_parse(j, &t, "target", &field, &e) != 0 && !strcmp(field, "target.tp"), "tp on cpu: %s",
          field);
    json_decref(j);
    j = json_pack("{s:s,s:i,s:s}", "device", "L4", "tp", 2, "interconnect", "nvlink");
    CHECK(ac_target_spec_parse(j, &t, "target", &field, &e) != 0 && !strcmp(field, "target.interconnect"),
          "nvlink on L4: %s", field);
    json_decref(j);
}

static void test_tp_divisibility(void) {
    /* the base model must split tp ways; the FFN grid follows tp */
    ac_layer_arch ly[2] = {{.n_heads = 32, .n_kv_heads = 8, .ffn = 14336},
                           {.n_heads = 32, .n_kv_heads = 2, .ffn = 14336}};
    ac_arch a = {.n_layers = 2, .hidden = 4096, .head_dim = 128, .vocab = 1000, .layers = ly};
    const char *field = NULL;
    ac_err e;
    CHECK(ac_job_check_tp(4, &a, &field, &e) == 0, "tp 4: %s", e.msg); /* KV 2 divides 4: replicated */
    CHECK(ac_job_check_tp(8, &a, &field, &e) == 0, "tp 8: %s", e.msg);
    CHECK(ac_job_check_tp(3, &a, &field, &e) != 0 && !strcmp(field, "target.tp") && strstr(e.msg, "query heads"),
          "tp 3: %s", e.msg);
    ly[1].n_kv_heads = 6, ly[1].n_heads = 48;
    CHECK(ac_job_check_tp(4, &a, &field, &e) != 0 && strstr(e.msg, "layer 1") && strstr(e.msg, "KV heads"),
          "KV 6 on tp 4: %s", e.msg);
    ly[1] = (ac_layer_arch){.n_heads = 32, .n_kv_heads = 8, .ffn = 14337};
    CHECK(ac_job_check_tp(2, &a, &field, &e) != 0 && strstr(e.msg, "FFN"), "FFN 14337 on tp 2: %s", e.msg);
    static ac_job_spec s;
    json_t *j =
        json_pack("{s:s,s:s,s:{s:s,s:i},s:{s:f},s:{s:s}}", "model", "/m", "calibration", "/c", "target", "device",
                  "H100", "tp", 3, "constraints", "max_params", 1e9, "search", "export_target", "gguf");
    CHECK(ac_job_spec_parse(j, &s, &field, &e) == 0 && s.search.ffn_multiple == 96, "gguf, tp 3: multiple %d (%s)",
          s.search.ffn_multiple, e.msg);
    json_object_set_new(json_object_get(j, "search"), "ffn_multiple", json_integer(64));
    CHECK(ac_job_spec_parse(j, &s, &field, &e) != 0 && !strcmp(field, "search.ffn_multiple"), "64 on tp 3: %s", field);
    json_decref(j);
}

static void test_served_gradient(void) {
    /* the served figures' gradient (the static model's at the simulation's
     * mean batch, scaled to the simulated value) against a central
     * difference of the simulation itself over a uniform 10 % FFN change */
    double buf[96], g[96];
    ac_carch c;
    arch8b(&c, buf, 32);
    ac_cost_table t;
    ac_err e;
    CHECK(ac_cost_roofline(ac_device_spec_find("H100"), "bf16", &t, &e) == 0, "%s", e.msg);
    ac_engine_profile p;
    ac_engine_profile_named(ac_engine_find("vllm"), 0, &p);
    ac_workload w = {.prompt_len = 1024, .gen_len = 128, .arrival_rate = 8, .requests = 256};
    ac_metric ms[] = {AC_M_TOKENS_PER_S, AC_M_TPOT, AC_M_P99_TTFT, AC_M_P99_E2E, AC_M_TOKENS_PER_S};
    const char *names[] = {"tokens/s", "TPOT", "p99 TTFT", "p99 E2E", "offline tokens/s"};
    for (int i = 0; i < 5; i++) {
        if (i == 4) w = (ac_workload){.prompt_len = 1024, .gen_len = 128, .offline = 1, .requests = 1024};
        ac_cost_grad(&t, &c, &w, &p, ms[i], g, g + 32, g + 64, NULL);
        double d = 0.1 * 14336, pred = 0, a, b;
        ac_cost k;
        for (int l = 0; l < 32; l++) pred += g[64 + l] * d;
        for (int l = 0; l < 32; l++) buf[64 + l] = 14336 + d;
        ac_cost_predict(&t, &c, &w, &p, 1, &k), a = ac_cost_metric(&k, ms[i]);
        for (int l = 0; l < 32; l++) buf[64 + l] = 14336 - d;
        ac_cost_predict(&t, &c, &w, &p, 1, &k), b = ac_cost_metric(&k, ms[i]);
        for (int l = 0; l < 32; l++) buf[64 + l] = 14336;
        double fd = (a - b) / 2;
        printf("   %s: gradient x 10 %% of the FFN %.4g, simulated central difference %.4g\n", names[i], pred, fd);
        CHECK(fd != 0 && pred / fd > 0.6 && pred / fd < 1.5, "%s: %g vs %g", names[i], pred, fd);
    }
    ac_cost_table_free(&t);
}

static double fig(const json_t *prov, const char *name, const char *which) {
    return json_real_value(json_object_get(json_object_get(json_object_get(prov, "figures"), name), which));
}

static void test_provenance(void) {
    /* where a prediction's inputs come from, and how far overlapping sources
     * disagree (provenance.h): a roofline has no second source; a table
     * measured on an "H100" is compared with the H100 profile's roofline; a
     * CPU table's decode bands with its operator grids alone */
    double buf[96];
    ac_carch c;
    arch8b(&c, buf, 32);
    ac_cost_table roof, gpu, cpu;
    ac_err e;
    CHECK(ac_cost_roofline(ac_device_spec_find("H100"), "bf16", &roof, &e) == 0, "%s", e.msg);
    ac_engine_profile p;
    ac_engine_profile_named(ac_engine_find("vllm"), 0, &p);
    ac_workload w = {.batch = 1, .prompt_len = 1024, .gen_len = 128}; /* decode reads the weights, not the KV */
    json_t *j = ac_cost_provenance(&roof, &c, &w, &p);
    CHECK(j && !strcmp(json_string_value(json_object_get(j, "table")), "roofline") && !json_object_get(j, "figures"),
          "roofline: no second source");
    json_decref(j);

    /* timings 1.5x the H100 roofline's at every grid point */
    acc_timings *tm = calloc(1, sizeof *tm);
    snprintf(tm->name, sizeof tm->name, "NVIDIA H100 80GB HBM3");
    tm->sms = 132, tm->cc = 90, tm->mem_gib = 79.2;
    tm->nm = 8, tm->nn = tm->nk = 7, tm->nhd = 2, tm->naq = tm->nas = 4;
    for (int i = 0; i < 8; i++) tm->gm[i] = 1 << (2 * i);
    for (int i = 0; i < 7; i++) tm->gn[i] = tm->gk[i] = 128 << (i + i / 2);
    for (int i = 0; i < 4; i++) tm->aq[i] = 1 << (4 * i), tm->as[i] = 1 << (4 * i);
    tm->ahd[0] = 64, tm->ahd[1] = 128;
    for (int a = 0; a < 8; a++)
        for (int b = 0; b < 7; b++)
            for (int k = 0; k < 7; k++)
                tm->gemm_us[(a * 7 + b) * 7 + k] = 1.5 * ac_cost_gemm_us(&roof, tm->gm[a], tm->gn[b], tm->gk[k]);
    for (int h = 0; h < 2; h++)
        for (int a = 0; a < 4; a++)
            for (int b = 0; b < 4; b++)
                tm->attn_us[(h * 4 + a) * 4 + b] =
                    1.5 * (ac_cost_attn_us(&roof, 1, 1, 1, tm->aq[a], tm->aq[a] + tm->as[b] - 1, (int)tm->ahd[h]) -
                           roof.launch_us); /* one head's work, not one launch per head */
    tm->launch_us = 1.5 * roof.launch_us;
    tm->elem_ns = 1.5 * 2 * 2 / (roof.eta_m * roof.bw_gbs); /* the roofline's ns per BF16 element, read and written */
    CHECK(ac_cost_table_from_timings(tm, &gpu, &e) == 0, "%s", e.msg);
    free(tm);
    ac_cost kg, kr;
    ac_cost_predict(&gpu, &c, &w, &p, 0, &kg);
    ac_cost_predict(&roof, &c, &w, &p, 0, &kr);
    j = ac_cost_provenance(&gpu, &c, &w, &p);
    const char *cw = json_string_value(json_object_get(j, "compared_with"));
    CHECK(cw && strstr(cw, "H100"), "compared with %s", cw ? cw : "nothing");
    CHECK(!strcmp(json_string_value(json_object_get(json_object_get(json_object_get(j, "inputs"), "launch_us"),
                                                    "source")),
                  "measured"),
          "a measured table's launch cost is measured");
    CHECK(fig(j, "ttft_ms", "used") == kg.ttft_ms && fig(j, "ttft_ms", "other") == kr.ttft_ms &&
              fig(j, "ttft_ms", "ratio") == kg.ttft_ms / kr.ttft_ms && fig(j, "tpot_ms", "other") == kr.tpot_ms,
          "figures: used %g other %g", fig(j, "ttft_ms", "used"), fig(j, "ttft_ms", "other"));
    double rt = fig(j, "ttft_ms", "ratio"), rp = fig(j, "tpot_ms", "ratio");
    printf("   measured 'H100' at 1.5x the roofline: TTFT x%.3f, TPOT x%.3f of the profile's\n", rt, rp);
    CHECK(rt > 1.45 && rt < 1.6 && rp > 1.45 && rp < 1.6, "ratios %g %g", rt, rp);
    json_decref(j);

    /* a CPU table: the decode bands against the operator grids; prefill uses no bands */
    synth_table(&cpu);
    cpu.ndec = 2;
    cpu.dec_ws[0] = 1 << 20, cpu.dec_ws[1] = 1 << 30;
    cpu.dec_us_mib[0] = cpu.dec_us_mib[1] = 300;
    ac_engine_profile pc;
    ac_engine_profile_default(&pc, 1);
    ac_workload w1 = {.batch = 1, .prompt_len = 128, .gen_len = 32};
    double small[24];
    ac_carch cs = {.n_layers = 8, .head_dim = 32, .vocab = 1000, .hidden = 256, .heads = small, .kv = small + 8,
                   .ffn = small + 16};
    for (int l = 0; l < 8; l++) small[l] = 8, small[8 + l] = 4, small[16 + l] = 768;
    j = ac_cost_provenance(&cpu, &cs, &w1, &pc);
    cw = json_string_value(json_object_get(j, "compared_with"));
    CHECK(cw && strstr(cw, "decode bands"), "compared with %s", cw ? cw : "nothing");
    ac_cost_table ops = cpu;
    ops.ndec = 0;
    ac_cost kb, ko;
    ac_cost_predict(&cpu, &cs, &w1, &pc, 0, &kb);
    ac_cost_predict(&ops, &cs, &w1, &pc, 0, &ko);
    printf("   CPU table: TPOT %.4g ms with its bands, %.4g ms from its operator grids\n", kb.tpot_ms, ko.tpot_ms);
    CHECK(fig(j, "ttft_ms", "ratio") == 1, "prefill uses no decode band: ratio %g", fig(j, "ttft_ms", "ratio"));
    CHECK(fig(j, "tpot_ms", "used") == kb.tpot_ms && fig(j, "tpot_ms", "other") == ko.tpot_ms && kb.tpot_ms != ko.tpot_ms,
          "TPOT %g / %g", fig(j, "tpot_ms", "used"), fig(j, "tpot_ms", "other"));
    json_decref(j);
    ac_cost_table_free(&cpu);
    ac_cost_table_free(&gpu);
    ac_cost_table_free(&roof);
}

int main(void) {
    RUN(test_offline_batch_closed_form);
    RUN(test_chunked_prefill_closed_form);
    RUN(test_isolated_arrivals_closed_form);
    RUN(test_kv_pool_waves);
    RUN(test_closed_loop_concurrency);
    RUN(test_matches_independent_simulation);
    RUN(test_poisson_requests);
    RUN(test_static_and_served_agree);
    RUN(test_paged_kv_pool);
    RUN(test_cuda_graph_launches);
    RUN(test_tensor_parallel);
    RUN(test_fp8_peaks);
    RUN(test_gemm_paths);
    RUN(test_engine_names_in_the_spec);
    RUN(test_tp_divisibility);
    RUN(test_served_gradient);
    RUN(test_provenance);
    printf("RESULT %d %d %d\n", ck_pass, ck_fail, ck_skip);
    return ck_fail ? 1 : 0;
}
