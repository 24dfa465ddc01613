/* textout.c - see textout_int.h. */
#include "textout_int.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/fsafe_write.h"

void ac_text_put(ac_text *t, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    if (!t->oom && ac_buf_vprintf(&t->b, 0, fmt, ap)) t->oom = 1;
    va_end(ap);
}

char *ac_text_take(ac_text *t) {
    if (t->oom || ac_buf_append(&t->b, "", 1, 0)) { /* an empty text is "" too */
        ac_buf_free(&t->b);
        return NULL;
    }
    char *s = t->b.data;
    t->b = (ac_buf){0};
    return s;
}

int ac_text_write(char *text, const char *dir, const char *name, ac_err *e) {
    if (!text) return ac_errf(e, "%s: out of memory", name);
    char p[AC_FSAFE_PATH_MAX + 64];
    snprintf(p, sizeof p, "%s/%s", dir, name);
    int rc = ac_fsafe_write(p, text, strlen(text), e);
    free(text);
    return rc;
}

const char *ac_jstr(const json_t *o, const char *k) {
    const char *s = json_string_value(json_object_get(o, k));
    return s ? s : "";
}

double ac_jnum(const json_t *o, const char *k) { return json_number_value(json_object_get(o, k)); }
