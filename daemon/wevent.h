/*
 * wevent.h - one line of a worker's stdout: {"kind": K, "data": D}, the
 * worker-to-daemon protocol. Parsed apart from the scheduler so it can be
 * fuzzed (tests/fuzz_parsers.c). A line that is not an event is stored as a
 * "log" line; a cost_table event's table is validated before it reaches the
 * cache.
 */
#ifndef AC_WEVENT_H
#define AC_WEVENT_H

#include <jansson.h>
#include <stddef.h>

#define WEVENT_MAX_LINE (64u << 20)

typedef struct {
    json_t *ev;       /* the whole parsed line (owned) */
    const char *kind; /* borrowed from ev */
    json_t *data;     /* borrowed from ev */
    json_t *table;    /* cost_table: the validated table (borrowed), or NULL */
    char error[256];  /* an "error" event's message, else "" */
} wevent;

/* 0: an event; -1: not one (store the line as a log line). */
int wevent_parse(const char *line, size_t len, wevent *w);
void wevent_free(wevent *w);

#endif
