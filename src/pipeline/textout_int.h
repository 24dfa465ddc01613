/*
 * textout_int.h - text built piece by piece, for the pages made from a job's
 * report (the model card, report.html): printf-style appends that remember
 * running out of memory, then the whole text or NULL; and the report's JSON
 * read leniently (a missing string reads "", a missing number 0), as a page
 * shows what the report holds.
 */
#ifndef AC_TEXTOUT_H
#define AC_TEXTOUT_H

#include <jansson.h>

#include "core/buf.h"
#include "core/err.h"

typedef struct {
    ac_buf b;
    int oom;
} ac_text;

/* Append printf-style (nothing once out of memory). */
void ac_text_put(ac_text *t, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* The text (owned by the caller), or NULL when an append ran out of memory
 * (the buffer is freed either way). */
char *ac_text_take(ac_text *t);
/* Write text (a page; freed here, NULL meaning out of memory) as DIR/NAME,
 * confined (fsafe_write.h): 0, or -1 with e. */
int ac_text_write(char *text, const char *dir, const char *name, ac_err *e);

/* o[k] as a string ("" when absent) and as a number (0 when absent). */
const char *ac_jstr(const json_t *o, const char *k);
double ac_jnum(const json_t *o, const char *k);

#endif
