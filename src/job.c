/* job.c - placeholder pipeline until the cost model and search land. */
#include "job.h"

int ac_job_run(const json_t *spec, ac_job_ctx *ctx, json_t **result, ac_err *e) {
    (void)spec; (void)ctx; *result = NULL;
    return ac_errf(e, "stage profile: not implemented yet");
}
