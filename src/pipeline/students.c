/* students.c - see students_int.h. */
#include "students_int.h"

#include <malloc.h>
#include <stdio.h>

#include "compress/prune.h"
#include "core/dtype.h"
#include "core/fsafe.h"
#include "core/fsafe_write.h"
#include "format/park.h"
#include "search/minitron.h"

int ac_job_prune_arm(job_state *s, const ac_model *src, const ac_arch *arch, const ac_importance *imp,
                     int minitron_arm, ac_model *out, int *repaired, ac_err *e) {
    *repaired = 0;
    if (ac_prune_bf16(src, arch, imp, out, e)) return -1;
    if (s->spec->repair && !ac_arch_is_hybrid(&s->m.a)) {
        int win = s->cwin < 16 ? s->cwin : 16;
        int r = ac_repair_ffn(src, out, imp, s->cids, s->nc, s->spec->eval.ctx, win, e);
        if (r < 0) return -1;
        *repaired = r;
    }
    if (minitron_arm || s->spec->search.target == AC_EXPORT_LLAMA || ac_arch_is_hybrid(&s->m.a))
        ac_minitron_compact(out); /* removed layers out (dnas's whole-layer gates, a hybrid's per type) */
    ac_model_round_vectors(out, ST_BF16); /* the vectors as stage_export writes them (job.c) */
    return 0;
}

void ac_job_park(job_state *s, ac_model *m, const char *arm) {
    if (!s->two_arms || !m->wown || ac_model_wdt(m) != ST_BF16) return;
    char name[64], path[AC_FSAFE_PATH_MAX];
    snprintf(name, sizeof name, "student-%s", arm);
    ac_err e = {{0}};
    if (ac_fsafe_mkdirs(s->spec->output, &e) || ac_fsafe_join(s->spec->output, name, path, sizeof path, &e) ||
        ac_model_park(m, path, &e)) {
        json_t *ev = json_pack("{s:s,s:s,s:s}", "message", "cannot park the student in a file; it stays in memory",
                               "arm", arm, "error", e.msg);
        if (ev && s->ctx->emit) s->ctx->emit(s->ctx->ud, "log", ev);
        json_decref(ev);
        return;
    }
    malloc_trim(0); /* its heap buffers back to the system now, not at the stage's end */
}

void ac_job_student_done(const ac_model *m) {
    if (m->wmap) ac_model_drop_pages(m);
}
