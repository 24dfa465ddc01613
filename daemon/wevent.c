/* wevent.c - see wevent.h. */
#include "wevent.h"

#include <stdio.h>
#include <string.h>

#include "autocompress.h"

int wevent_parse(const char *line, size_t len, wevent *w) {
    memset(w, 0, sizeof *w);
    if (len > WEVENT_MAX_LINE) return -1;
    w->ev = json_loadb(line, len, JSON_REJECT_DUPLICATES, NULL);
    w->kind = json_string_value(json_object_get(w->ev, "kind"));
    w->data = json_object_get(w->ev, "data");
    if (!w->ev || !w->kind || !w->data || !w->kind[0] || strlen(w->kind) > 64) {
        wevent_free(w);
        return -1;
    }
    if (!strcmp(w->kind, "error")) {
        const char *m = json_string_value(json_object_get(w->data, "message"));
        snprintf(w->error, sizeof w->error, "%s", m ? m : "error");
    } else if (!strcmp(w->kind, "cost_table")) {
        json_t *t = json_object_get(w->data, "table");
        const char *field;
        ac_err e;
        if (t && ac_cost_table_validate(t, &field, &e) == 0) w->table = t;
    }
    return 0;
}

void wevent_free(wevent *w) {
    json_decref(w->ev);
    memset(w, 0, sizeof *w);
}
