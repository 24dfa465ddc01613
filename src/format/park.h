/*
 * park.h - a model's matrices moved out of the heap into a file mapping (a
 * "parked" model), so that a job that keeps several pruned students has
 * only the one it is using in memory (docs/architecture.md, "What each
 * stage holds").
 *
 * ac_model_park takes an owned BF16 model (wown: ac_prune_bf16's students,
 * a distilled student rounded back by ac_model_make_bf16), writes its
 * matrices into a new file beside path (ac_fsafe_create: confined as the
 * export is; an unnamed O_TMPFILE one in that directory where its
 * filesystem has them, else the temporary, its name removed once mapped),
 * maps the file read-only, points the matrices into the mapping and frees
 * their heap buffers: nothing stays on disk once the model is freed or the
 * process ends. The model then reads
 * as a resident one does (wdt BF16, not wown, wmap its mapping): the engine,
 * perplexity, latency timing, ac_model_to_f32 / ac_model_to_bf16 and the
 * exports read it in place, same values, same results; reading it brings
 * its pages into the process's memory (from the page cache, or the file),
 * ac_model_drop_pages lets them go again, ac_model_free unmaps it. What
 * changes matrices in place (the FFN repair, ac_model_make_bf16) needs an
 * owned model: park a student once it is final (distillation trains an
 * fp32 copy and rounds it back into an owned one, which is parked again).
 *
 * Ownership: on success the model owns the mapping (as a resident model
 * owns its safetensors); on failure it is unchanged (still owned) and no
 * file is left.
 */
#ifndef AC_PARK_H
#define AC_PARK_H

#include "core/err.h"
#include "format/model.h"

int ac_model_park(ac_model *m, const char *path, ac_err *e);

#endif
