/* jobtasks.c - see jobtasks_int.h. */
#include "jobtasks_int.h"

#include <string.h>

int ac_job_tasks_load(const ac_eval_spec *ev, const char *model_dir, const ac_arch *a, ac_job_tasks *out, ac_err *e) {
    memset(out, 0, sizeof *out);
    for (int i = 0; i < ev->ntasks; i++) {
        if (ac_mc_load_for(model_dir, a, ev->tasks[i].path, &out->t[i], e)) {
            ac_job_tasks_free(out);
            return ac_errctx(e, "eval.tasks[%d] (%s)", i, ev->tasks[i].name);
        }
        out->names[i] = ev->tasks[i].name;
        out->n = i + 1;
    }
    return 0;
}

json_t *ac_job_tasks_score(const ac_job_tasks *jt, const ac_model *m, ac_err *e) {
    json_t *o = json_object();
    if (!o) return ac_errf(e, "out of memory"), NULL;
    for (int i = 0; i < jt->n; i++) {
        ac_mc_result r;
        json_t *j = NULL;
        int rc = ac_mc_score(m, &jt->t[i], 8, 0, NULL, &r, e);
        if (!rc && !(j = ac_mc_result_json(&r))) rc = ac_errf(e, "out of memory");
        if (rc) {
            ac_errctx(e, "task %s", jt->names[i]);
            json_decref(o);
            return NULL;
        }
        json_object_set_new(o, jt->names[i], j);
    }
    return o;
}

void ac_job_tasks_free(ac_job_tasks *jt) {
    for (int i = 0; i < jt->n; i++) ac_mc_free(&jt->t[i]);
    memset(jt, 0, sizeof *jt);
}
