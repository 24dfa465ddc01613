/*
 * serve_int.h - a discrete-event simulation of a serving engine's
 * iteration-level scheduler (continuous batching): requests arrive (all
 * at once, Poisson, or a closed loop of a fixed concurrency), wait, are
 * admitted while the KV pool has blocks for them, and every iteration
 * schedules up to a token budget of work (one token per decoding request,
 * prompt chunks of the rest). The time of an iteration comes from a
 * callback (the cost model's per-step cost, or a test's closed form), so
 * the scheduler knows nothing of operators.
 *
 * The policy (one per engine, engines.h):
 * - running requests first, oldest first: a decoding request takes one
 *   token, a prompt being prefilled its next chunk (the budget left; the
 *   whole rest when not chunked, if it fits, or alone when it is longer
 *   than the budget); then waiting requests, in
 *   arrival order, while fewer than max_seqs run, budget is left and the
 *   pool has the blocks of what is scheduled (head of line: the first that
 *   does not fit stops admission);
 * - prefill_first: a step with prompt work to do (a chunk to continue or a
 *   request that can be admitted) runs prompt work only, else decodes;
 * - the KV pool grows with a request (ceil(tokens / block) blocks); when a
 *   running request needs a block and none is free, the newest running
 *   request is preempted: its blocks freed, it goes back to the front of
 *   the queue and recomputes its prompt and the tokens it has generated
 *   (vLLM's recompute); no admission in a step that preempted;
 *   reserve_all: admission reserves blocks for prompt + output, never
 *   preempts (TRT-LLM's GUARANTEED_NO_EVICT);
 * - a request's first token is emitted at the end of the step that
 *   completes its prompt; each later step that decodes it emits one.
 * Metrics as vLLM's benchmark defines them: TTFT = first token - send,
 * TPOT = (E2E - TTFT) / (output - 1), output throughput = output tokens /
 * (last finish - first send); percentiles interpolate linearly between
 * order statistics (numpy's default).
 *
 * Ownership: ac_serve_requests mallocs *out (the caller frees it).
 */
#ifndef AC_SERVE_H
#define AC_SERVE_H

#include "cost/costmodel.h"
#include "core/err.h"

#define AC_SERVE_REQUESTS 512 /* requests simulated when the workload names none */

typedef struct {
    double arrival; /* seconds */
    int prompt, gen;
} ac_serve_req;

/* One iteration's work. */
typedef struct {
    int n_decode;         /* requests generating one token */
    double decode_ctx;    /* sum of their contexts (keys read, the new token's included) */
    int n_chunks;         /* prompt chunks */
    const int *chunk;     /* new tokens of each chunk */
    const int *chunk_end; /* its end position (keys the chunk's last query reads) */
    int tokens;           /* n_decode + the chunks' tokens */
    int logits;           /* rows that produce a token */
} ac_serve_step;

/* Microseconds one iteration takes. */
typedef double (*ac_serve_cost_fn)(void *ud, const ac_serve_step *s);

typedef struct {
    int budget, max_seqs, chunked, prefill_first, reserve_all, block_size;
    long kv_blocks;  /* blocks in the pool */
    int concurrency; /* at most this many requests sent and not finished (0: no cap) */
} ac_serve_policy;

/* Per request (arrays of n the caller may ask for). */
typedef struct {
    double send, ttft, e2e; /* seconds; e2e < 0: never finished (it cannot fit the pool) */
} ac_serve_result;

typedef struct {
    double p50_ttft_ms, p99_ttft_ms, mean_ttft_ms;
    double p50_tpot_ms, p99_tpot_ms, mean_tpot_ms;
    double p50_e2e_ms, p99_e2e_ms, mean_e2e_ms;
    double tokens_per_s, requests_per_s, duration_s;
    int completed, dropped, preemptions, steps, peak_running;
    double mean_batch; /* sequences in a step (decoding or prefilling), weighted by the step's time */
} ac_serve_stats;

/* The requests of a served workload (ac_workload_served): w->requests (or
 * AC_SERVE_REQUESTS) of w->prompt_len / w->gen_len, uniform within
 * +-length_spread; arrivals at 0 (offline, or concurrency without a rate)
 * or Poisson at arrival_rate from w->seed. */
int ac_serve_requests(const ac_workload *w, ac_serve_req **out, int *n, ac_err *e);

/* Run the scheduler over r[0..n) (arrivals non-decreasing). res may be NULL. */
int ac_serve_run(const ac_serve_req *r, int n, const ac_serve_policy *pol, ac_serve_cost_fn cost, void *ud,
                 ac_serve_stats *st, ac_serve_result *res, ac_err *e);

/* The cost model's iteration (costmodel.c): microseconds of step s on
 * table t for the model c, split over the profile's tensor-parallel GPUs
 * (what ac_cost_predict's served workloads charge per step). */
double ac_cost_served_step_us(const ac_cost_table *t, const ac_carch *c, const ac_engine_profile *p,
                              const ac_serve_step *s);

/* numpy-style linear percentile (q in [0, 1]) of x[0..n); sorts x. */
double ac_serve_percentile(double *x, int n, double q);

#endif
