/*
 * measure_int.h - measured latency of a model (the evaluation's counterpart of
 * the cost model): best-of-5 TTFT and TPOT on the CPU engine or the CUDA
 * plugin's device 0, and the comparisons the report carries of base and
 * result measured against the cost table's prediction.
 */
#ifndef AC_MEASURE_H
#define AC_MEASURE_H

#include <jansson.h>

#include "cost/costmodel.h"
#include "format/model.h"
#include "cost/quiet.h"

/* Best-of-5 TTFT / TPOT (ms) of m for workload w, prompts and decode tokens
 * drawn from ids (on the CPU, TPOT averages each step's fastest of 5). The
 * minimum, like the cost table's measurements: neighbours on a shared
 * machine only add time. On the CPU the runs are quiet measurements
 * (quiet.h): runs a neighbour slowed beyond the tolerance of quiet_ref_us
 * (the cost table's reference probe; 0: the quietest probe seen) are run
 * again, within 4 rounds and 20 s; *qr (may be NULL) says how it went. */
int ac_measure_latency(const ac_model *m, const int *ids, size_t n, const ac_workload *w, int cuda, double quiet_ref_us,
                       double *ttft_ms, double *tpot_ms, ac_quiet_result *qr, ac_err *e);

/* ac_measure_latency on the CPU with the weights in dtype ("bf16", else
 * fp32): m as it is when it holds them so, else a temporary copy in it
 * (ac_model_to_bf16 / ac_model_to_f32; a resident m's pages are dropped
 * meanwhile). */
int ac_measure_latency_in(const ac_model *m, const char *dtype, const int *ids, size_t n, const ac_workload *w,
                          double quiet_ref_us, double *ttft_ms, double *tpot_ms, ac_quiet_result *qr, ac_err *e);

/* The workload measured on this CPU: wl capped to batch 4, prompt 128, 32
 * generated. */
ac_workload ac_measure_local_workload(const ac_workload *wl);

/* Base and result timed on this CPU for ac_measure_local_workload(wl), in
 * two steps, so that the caller may measure the CPU table again between
 * them (job.c): the timings, held to quiet_ref_us as ac_measure_latency;
 * then the report's "measured_local" against cpu_table's prediction (may be
 * NULL; it should be of the timings' dtype) under the CPU engine profile in
 * that dtype, with its "quiet" object (how disturbed the machine was,
 * against the table's reference); NULL when out of memory, else the caller
 * owns it. Both models are timed with their weights in dtype ("bf16" or
 * "fp32", ac_measure_latency_in): a BF16 base on its mapping and fp32
 * students on BF16 copies (half their size), or, for fp32 timings, a
 * resident base on an fp32 copy (twice its file), so the caller should
 * hold nothing else of that size meanwhile (job.c frees the other arm
 * first). */
typedef struct {
    ac_workload w; /* ac_measure_local_workload of the job's */
    char dtype[8]; /* "bf16" or "fp32": the weights the models were timed with */
    double base_ttft, base_tpot, res_ttft, res_tpot;
    ac_quiet_result qb, qres; /* how quiet the base's and the result's runs were */
} ac_local_timing;
int ac_measure_local_time(const ac_model *base, const ac_model *res, const char *dtype, const int *ids, size_t n,
                          const ac_workload *wl, double quiet_ref_us, ac_local_timing *t, ac_err *e);
/* The report's measured_local: the timings under "baseline" and arm (the
 * exported arm's name, "minitron" or "autocompress"; res is that arm). */
json_t *ac_measure_local_report(const ac_local_timing *t, const ac_model *base, const ac_model *res, const char *arm,
                                const ac_cost_table *cpu_table);
/* When either model's runs ran, by their reference probe level (quiet.h),
 * more than the tolerance slower or quicker than tb's reference (the CPU
 * was in another state than when tb was measured): that level, the slower
 * model's when it ran too slow, else the quicker one's. 0 when both are
 * within the tolerance, or without references. */
double ac_local_timing_off_table(const ac_local_timing *t, const ac_cost_table *tb);

/* Base and result measured on the local GPU for wl capped to batch 32,
 * prompt 2048, 64 generated, against table's prediction for the result
 * with profile p (overhead_ms 0: our engine, not a serving framework):
 * the report's "measured_on_target" {device, workload, baseline, ARM,
 * predicted {ARM}, prediction_error}, ARM being arm (res's arm name). */
int ac_measure_on_gpu(const ac_model *base, const ac_model *res, const char *arm, const int *ids, size_t n,
                      const ac_workload *wl, const ac_cost_table *table, const ac_engine_profile *p, json_t **out,
                      ac_err *e);

#endif
