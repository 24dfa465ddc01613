/* serve.c - see serve_int.h. */
#include "serve_int.h"

#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

/* ---------------------------------------------------------------- requests */

static uint64_t splitmix(uint64_t *s) {
    uint64_t z = (*s += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

/* uniform in (0, 1) */
static double unif(uint64_t *s) { return ((splitmix(s) >> 11) + 0.5) / 9007199254740992.0; }

static int spread_len(int L, double spread, uint64_t *s) {
    if (spread <= 0) return L;
    int lo = (int)lround(L * (1 - spread)), hi = (int)lround(L * (1 + spread));
    if (lo < 1) lo = 1;
    if (hi < lo) hi = lo;
    int v = lo + (int)(unif(s) * (hi - lo + 1));
    return v > hi ? hi : v;
}

int ac_serve_requests(const ac_workload *w, ac_serve_req **out, int *n, ac_err *e) {
    int N = w->requests > 0 ? w->requests : AC_SERVE_REQUESTS;
    ac_serve_req *r = calloc((size_t)N, sizeof *r);
    if (!r) return ac_errf(e, "out of memory (%d requests)", N);
    uint64_t s = 0x5EED0000ull + (uint64_t)(unsigned)w->seed;
    double t = 0;
    for (int i = 0; i < N; i++) {
        if (w->arrival_rate > 0 && !w->offline) {
            t += -log(unif(&s)) / w->arrival_rate;
            r[i].arrival = t;
        }
        r[i].prompt = spread_len(w->prompt_len, w->length_spread, &s);
        r[i].gen = spread_len(w->gen_len, w->length_spread, &s);
    }
    *out = r;
    *n = N;
    return 0;
}

double ac_serve_percentile(double *x, int n, double q) {
    if (n <= 0) return 0;
    for (int i = 1; i < n; i++) { /* insertion sort: n is at most a few thousand here */
        double v = x[i];
        int j = i - 1;
        while (j >= 0 && x[j] > v) x[j + 1] = x[j], j--;
        x[j + 1] = v;
    }
    double pos = q * (n - 1);
    int i = (int)floor(pos);
    if (i >= n - 1) return x[n - 1];
    return x[i] + (x[i + 1] - x[i]) * (pos - i);
}

/* ---------------------------------------------------------------- the scheduler */

typedef struct {
    int prompt, gen;
    int g;       /* tokens emitted */
    int k;       /* positions with KV computed */
    int target;  /* positions to compute before the next token, while prefilling */
    long blocks; /* held */
    int sched;   /* tokens scheduled this step */
    double send, ttft, e2e;
} rq;

static long blocks_for(long tokens, int bs) { return (tokens + bs - 1) / bs; }

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

/* A request leaves at t (finished or dropped): in a closed loop of C
 * clients its client's slot frees (its next request is sent at t). */
static void leave(int *done, int *inflight, double *slot, int C, double t) {
    (*done)++;
    (*inflight)--;
    for (int j = 0; j < C; j++)
        if (slot[j] == HUGE_VAL) {
            slot[j] = t;
            break;
        }
}

int ac_serve_run(const ac_serve_req *req, int n, const ac_serve_policy *pol, ac_serve_cost_fn cost, void *ud,
                 ac_serve_stats *st, ac_serve_result *res, ac_err *e) {
    memset(st, 0, sizeof *st);
    if (n <= 0) return ac_errf(e, "no requests");
    if (pol->budget < 1 || pol->max_seqs < 1 || pol->block_size < 1)
        return ac_errf(e, "scheduler needs a token budget, max_seqs and a block size of at least 1");
    rq *q = calloc((size_t)n, sizeof *q);
    /* the waiting queue: a window of wbuf that pops at its front, takes
     * arrivals at its back and preempted requests back at its front. Each
     * request preempted was admitted (popped) before, so the front stays at
     * or after wbuf + n and the back at or before wbuf + 2n. */
    int *run = malloc((size_t)n * sizeof *run), *wbuf = malloc((size_t)(2 * n + 1) * sizeof *wbuf),
        *chunk = malloc((size_t)n * sizeof *chunk), *chunk_end = malloc((size_t)n * sizeof *chunk_end);
    int C = pol->concurrency > 0 && pol->concurrency < n ? pol->concurrency : 0;
    double *slot = calloc((size_t)(C > 0 ? C : 1), sizeof *slot); /* when each slot frees (HUGE_VAL: busy) */
    double *tmp = malloc((size_t)n * sizeof *tmp);
    if (!q || !run || !wbuf || !chunk || !chunk_end || !slot || !tmp) {
        free(q), free(run), free(wbuf), free(chunk), free(chunk_end), free(slot), free(tmp);
        return ac_errf(e, "out of memory");
    }
    for (int i = 0; i < n; i++) {
        q[i].prompt = req[i].prompt > 0 ? req[i].prompt : 1;
        q[i].gen = req[i].gen > 0 ? req[i].gen : 1;
        q[i].e2e = -1;
    }
    int *wait = wbuf + n;
    int nrun = 0, nwait = 0, next = 0, done = 0, inflight = 0;
    long free_blocks = pol->kv_blocks;
    double t = 0, busy = 0;
    for (;;) {
        /* sends: arrivals up to now, while a concurrency slot is free */
        while (next < n && req[next].arrival <= t) {
            double send = req[next].arrival;
            if (C) {
                int s = 0;
                for (int j = 1; j < C; j++)
                    if (slot[j] < slot[s]) s = j;
                if (slot[s] > t) break;
                if (slot[s] > send) send = slot[s];
                slot[s] = HUGE_VAL;
            }
            q[next].send = send;
            q[next].target = q[next].prompt;
            wait[nwait++] = next++;
            inflight++;
        }
        if (!nrun && !nwait) {
            if (next >= n) break;
            double at = req[next].arrival; /* idle until the next arrival */
            if (C) {
                double f = HUGE_VAL;
                for (int j = 0; j < C; j++)
                    if (slot[j] < f) f = slot[j];
                if (f > at) at = f;
            }
            t = at > t ? at : t;
            continue;
        }
        /* ---- form the step */
        int budget = pol->budget, preempted = 0, nsched = 0, prompts = 0; /* prompts: prompt chunks scheduled */
        for (int i = 0; i < nrun; i++) q[run[i]].sched = 0;
        int prompt_work = 0;
        if (pol->prefill_first) {
            for (int i = 0; i < nrun && !prompt_work; i++) prompt_work = q[run[i]].k < q[run[i]].target;
            if (!prompt_work && nwait && nrun < pol->max_seqs) {
                rq *h = &q[wait[0]];
                int c = h->target - h->k < budget ? h->target - h->k : budget;
                long need = pol->reserve_all ? blocks_for(h->prompt + h->gen, pol->block_size)
                                             : blocks_for(h->k + c, pol->block_size) - h->blocks;
                prompt_work = need <= free_blocks; /* unchunked, a long prompt runs alone (below) */
            }
        }
        for (int i = 0; i < nrun && budget > 0; i++) {
            rq *r = &q[run[i]];
            int prefilling = r->k < r->target, c;
            if (pol->prefill_first && prompt_work != prefilling) continue;
            if (prefilling) {
                c = r->target - r->k;
                if (c > budget) {
                    if (!pol->chunked) continue;
                    c = budget;
                }
            } else {
                c = 1;
            }
            if (!pol->reserve_all) {
                long need = blocks_for(r->k + c, pol->block_size) - r->blocks;
                while (need > free_blocks && nrun - 1 > i) { /* preempt the newest running request */
                    rq *v = &q[run[--nrun]];
                    free_blocks += v->blocks;
                    v->blocks = 0;
                    v->k = 0;
                    v->target = v->prompt + v->g;
                    v->sched = 0;
                    *--wait = (int)(v - q);
                    nwait++;
                    preempted = 1;
                    st->preemptions++;
                }
                if (need > free_blocks) { /* this one too: nothing newer to take from */
                    free_blocks += r->blocks;
                    r->blocks = 0;
                    r->k = 0;
                    r->target = r->prompt + r->g;
                    r->sched = 0;
                    *--wait = run[i];
                    nwait++;
                    memmove(run + i, run + i + 1, (size_t)(nrun - i - 1) * sizeof *run);
                    nrun--;
                    i--;
                    preempted = 1;
                    st->preemptions++;
                    continue;
                }
                free_blocks -= need;
                r->blocks += need;
            }
            r->sched = c;
            budget -= c;
            nsched++;
            prompts += prefilling;
        }
        if (!preempted && (!pol->prefill_first || prompt_work)) {
            while (nwait && nrun < pol->max_seqs && budget > 0) {
                rq *h = &q[wait[0]];
                int c = h->target - h->k;
                if (c > budget) {
                    /* unchunked, a prompt longer than the budget runs as the
                     * step's only prompt (the engine's token limit is at
                     * least its longest input) */
                    if (!pol->chunked && prompts) break;
                    if (pol->chunked) c = budget;
                }
                long need = pol->reserve_all ? blocks_for(h->prompt + h->gen, pol->block_size)
                                             : blocks_for(h->k + c, pol->block_size);
                if (need > free_blocks) break;
                free_blocks -= need;
                h->blocks = need;
                h->sched = c;
                budget -= c;
                nsched++;
                prompts++;
                run[nrun++] = *wait++;
                nwait--;
            }
        }
        if (!nsched) {
            if (nrun) { /* cannot happen: a running request always gets a token or is preempted */
                free(q), free(run), free(wbuf), free(chunk), free(chunk_end), free(slot), free(tmp);
                return ac_errf(e, "scheduler stalled with %d running", nrun);
            }
            /* the head of the queue can never fit the pool: drop it */
            rq *h = &q[wait[0]];
            h->e2e = -1;
            wait++, nwait--;
            st->dropped++;
            leave(&done, &inflight, slot, C, t);
            continue;
        }
        /* ---- cost it */
        ac_serve_step s;
        memset(&s, 0, sizeof s);
        s.chunk = chunk;
        s.chunk_end = chunk_end;
        for (int i = 0; i < nrun; i++) {
            rq *r = &q[run[i]];
            if (!r->sched) continue;
            if (r->k < r->target) {
                chunk[s.n_chunks] = r->sched;
                chunk_end[s.n_chunks++] = r->k + r->sched;
                s.logits += r->k + r->sched == r->target;
            } else {
                s.n_decode++;
                s.decode_ctx += r->k + 1;
                s.logits++;
            }
            s.tokens += r->sched;
        }
        if (nrun > st->peak_running) st->peak_running = nrun;
        double dt = cost(ud, &s) * 1e-6;
        t += dt;
        busy += dt;
        st->mean_batch += dt * (s.n_decode + s.n_chunks);
        st->steps++;
        /* ---- advance */
        for (int i = 0; i < nrun; i++) {
            rq *r = &q[run[i]];
            if (!r->sched) continue;
            int emit;
            if (r->k < r->target) {
                r->k += r->sched;
                emit = r->k == r->target;
            } else {
                r->k += 1;
                emit = 1;
            }
            if (!emit) continue;
            if (r->g == 0) r->ttft = t - r->send;
            r->g++;
            if (r->g >= r->gen) {
                r->e2e = t - r->send;
                free_blocks += r->blocks;
                r->blocks = 0;
                r->sched = -1; /* finished: removed below */
                leave(&done, &inflight, slot, C, t);
            }
        }
        int m = 0;
        for (int i = 0; i < nrun; i++)
            if (q[run[i]].sched >= 0) run[m++] = run[i];
        nrun = m;
        if (done >= n) break;
    }
    /* ---- metrics */
    if (busy > 0) st->mean_batch /= busy;
    double first = HUGE_VAL, last = 0, toks = 0;
    int k = 0;
    for (int i = 0; i < n; i++) {
        if (res) res[i].send = q[i].send, res[i].ttft = q[i].ttft, res[i].e2e = q[i].e2e;
        if (q[i].e2e < 0) continue;
        if (q[i].send < first) first = q[i].send;
        if (q[i].send + q[i].e2e > last) last = q[i].send + q[i].e2e;
        toks += q[i].gen;
        st->completed++;
    }
#define PCT(field, expr, cond)                                                                                         \
    do {                                                                                                               \
        k = 0;                                                                                                         \
        double sum = 0;                                                                                                \
        for (int i = 0; i < n; i++)                                                                                    \
            if (q[i].e2e >= 0 && (cond)) tmp[k++] = (expr)*1e3, sum += (expr)*1e3;                                     \
        if (k) qsort(tmp, (size_t)k, sizeof *tmp, cmp_double);                                                         \
        st->mean_##field##_ms = k ? sum / k : 0;                                                                       \
        st->p50_##field##_ms = ac_serve_percentile(tmp, k, 0.5);                                                       \
        st->p99_##field##_ms = ac_serve_percentile(tmp, k, 0.99);                                                      \
    } while (0)
    PCT(ttft, q[i].ttft, 1);
    PCT(tpot, (q[i].e2e - q[i].ttft) / (q[i].gen - 1), q[i].gen > 1);
    PCT(e2e, q[i].e2e, 1);
#undef PCT
    if (st->completed && last > first) {
        st->duration_s = last - first;
        st->tokens_per_s = toks / st->duration_s;
        st->requests_per_s = st->completed / st->duration_s;
    }
    free(q), free(run), free(wbuf), free(chunk), free(chunk_end), free(slot), free(tmp);
    return 0;
}
