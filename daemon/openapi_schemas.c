/*
 * openapi_schemas.c - the JSON bodies of the API as field tables, and the
 * document's components.schemas built from them (openapi.h): JobSpec from
 * the job spec's own field table (ac_job_spec_schema, as `autocompress
 * schema`), Job's states from the store's state names, the rest from the
 * tables below, one row a field: name, type, required, description, and a
 * JSON object of further keywords (minimum, pattern) or NULL.
 *
 * A type is "integer", "number", "string", "boolean", "object" or "any";
 * "T?" is T or null (also "{Name}?"); "#Name" a component; "[T]" an array of T; "{Name}" an
 * object of the table Name (not a component of its own); "enum:a|b" (and
 * "enum?:a|b", or null) strings; "enum:@states" the job states.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "db.h"
#include "openapi.h"

typedef struct {
    const char *name, *type;
    int req;
    const char *desc, *more;
} oa_field;

typedef struct {
    const char *name;
    const oa_field *fields;
    const char *desc;
    const char *example; /* JSON, shown wherever the schema is a request or answer body */
    int component;       /* 0: only inline through "{name}" */
} oa_schema;

static const oa_field ERROR[] = {{"error", "{ErrorBody}", 1, NULL, NULL}, {0}};
static const oa_field ERROR_BODY[] = {
    {"code",
     "enum:bad_request|busy|conflict|forbidden|idempotency_conflict|internal|invalid_path|invalid_request|invalid_"
     "spec|invalid_table|limit_exceeded|malformed_json|method_not_allowed|no_device|no_result|not_finished|not_found|"
     "payload_too_large|shutting_down|storage_unavailable|too_many_streams|unauthorized|unsupported_media_type",
     1, NULL, NULL},
    {"message", "string", 1, NULL, NULL},
    {"field", "string?", 1,
     "the request field at fault (a spec field's dotted path, a header or a query argument), or null", NULL},
    {"bound", "{ErrorBound}", 0,
     "a limit no structure of the model reaches (invalid_spec on constraints.NAME): the limit given and the best "
     "figure any structure reaches",
     NULL},
    {0}};
static const oa_field ERROR_BOUND[] = {
    {"constraint", "string", 1, "the constraint's spec name, e.g. max_tpot_ms", NULL},
    {"metric", "string", 1, "the predicted figure it bounds, e.g. tpot_ms", NULL},
    {"unit", "string", 1, NULL, NULL},
    {"kind", "enum:max|min", 1, NULL, NULL},
    {"limit", "number", 1, NULL, NULL},
    {"reachable", "number", 1, "the lowest figure (kind max) or the highest (kind min) any structure reaches", NULL},
    {0}};

/* view_job (views.c); tests/test_openapi.c compares the two */
static const oa_field JOB[] = {
    {"id", "integer", 1, NULL, NULL},
    {"name", "string?", 1, NULL, NULL},
    {"state", "enum:@states", 1, NULL, NULL},
    {"priority", "integer", 1, NULL, NULL},
    {"device", "string?", 1, NULL, NULL},
    {"reason", "string?", 1, "why it waits (queued), what it does, or why it failed", NULL},
    {"attempts", "integer", 1, NULL, NULL},
    {"cancel_requested", "boolean", 1, NULL, NULL},
    {"created_at", "number", 1, NULL, NULL},
    {"updated_at", "number", 1, NULL, NULL},
    {"started_at", "number?", 1, NULL, NULL},
    {"finished_at", "number?", 1, NULL, NULL},
    {"owner", "string?", 0,
     "the user whose token submitted the job; null: submitted without tokens (or before users existed), seen by "
     "admins only",
     NULL},
    {"spec", "#JobSpec", 0, "single jobs only (not in a page)", NULL},
    {"has_result", "boolean", 0, "single jobs only", NULL},
    {"transitions", "[{Transition}]", 0, "single jobs only", NULL},
    /* exec_job_view (executor_slurm.c), single jobs only */
    {"executor", "enum:local|slurm", 0, "where it runs or ran (single jobs only)", NULL},
    {"slurm", "{SlurmJob}?", 0, "executor slurm: its Slurm job (null before it is submitted there)", NULL},
    {0}};
static const oa_field SLURM_JOB[] = {
    {"job_id", "integer?", 1, NULL, NULL}, {"name", "string", 1, NULL, NULL}, {"state", "string?", 1, NULL, NULL}, {0}};
static const oa_field TRANSITION[] = {{"from", "string?", 1, NULL, NULL},
                                      {"to", "string", 1, NULL, NULL},
                                      {"at", "number", 1, NULL, NULL},
                                      {"reason", "string?", 1, NULL, NULL},
                                      {0}};
static const oa_field JOB_PAGE[] = {
    {"jobs", "[#Job]", 1, NULL, NULL},
    {"next_after", "integer?", 1, "pass as ?after= for the next page; null on the last", NULL},
    {0}};
static const oa_field AUDIT_PAGE[] = {
    {"entries", "[{AuditEntry}]", 1, NULL, NULL},
    {"next_after", "integer?", 1, "pass as ?after= for the next page; null on the last", NULL},
    {0}};
static const oa_field AUDIT_ENTRY[] = {
    {"id", "integer", 1, NULL, NULL},
    {"at", "number", 1, "Unix time", NULL},
    {"user", "string?", 1, "the token's user ('cli:NAME' for a token command); null without tokens", NULL},
    {"role", "enum?:read|submit|admin", 1, NULL, NULL},
    {"action", "string", 1, "'METHOD /path', or the command ('token add', 'token revoke')", NULL},
    {"target", "string?", 1, "the job id, or what a command changed", NULL},
    {"status", "integer", 1, "the HTTP status; 0 for a command", NULL},
    {0}};
static const oa_field EVENT[] = {
    {"id", "integer", 1, NULL, "{\"minimum\": 1}"},
    {"kind", "enum:state|stage|progress|log|cost_table|search|distill|infeasible|error|result", 1, NULL, NULL},
    {"data", "any", 1, "see proto/events.md", NULL},
    {"at", "number", 1, NULL, NULL},
    {0}};
static const oa_field EVENT_LIST[] = {{"events", "[#Event]", 1, NULL, NULL}, {0}};
static const oa_field HEALTH[] = {{"status", "enum:ok|degraded", 1, NULL, NULL},
                                  {"version", "string", 1, NULL, NULL},
                                  {"schema_version", "integer", 1, NULL, NULL},
                                  {"uptime_s", "number", 1, NULL, NULL},
                                  {"sse_streams", "integer", 1, NULL, NULL},
                                  {"reason", "string", 0, "why it is degraded", NULL},
                                  {0}};
static const oa_field FILES[] = {{"id", "integer", 1, NULL, NULL},
                                 {"dir", "string", 1, "the report's export.dir on the server", NULL},
                                 {"files", "[{File}]", 1, NULL, NULL},
                                 {0}};
static const oa_field FILE_[] = {{"name", "string", 1, NULL, "{\"pattern\": \"^[A-Za-z0-9_-][A-Za-z0-9._-]*$\"}"},
                                 {"size", "integer", 1, NULL, "{\"minimum\": 0}"},
                                 {0}};
static const oa_field REPORT[] = {
    {"version", "string", 1, NULL, NULL},
    {"chosen", "enum:minitron|autocompress", 1,
     "the exported arm: the lower held-out loss among the arms that meet every limit", NULL},
    {"chosen_reason", "string", 0, "that rule as it applied, in words", NULL},
    {"baseline", "object", 1, NULL, NULL},
    {"minitron", "object", 1, NULL, NULL},
    {"autocompress", "object", 0, "method autocompress", NULL},
    {"measured_local", "object", 0,
     "the models timed on this CPU, each under its arm's name (baseline, minitron, autocompress)", NULL},
    {"export", "{Export}", 1, NULL, NULL},
    {0}};
static const oa_field EXPORT[] = {
    {"dir", "string", 1, NULL, NULL}, {"format", "string", 1, NULL, NULL}, {"dtype", "string", 1, NULL, NULL}, {0}};
static const oa_field VALID[] = {{"ok", "boolean", 1, NULL, "{\"enum\": [true]}"}, {0}};
static const oa_field ESTIMATE[] = {
    {"model", "string", 0, NULL, NULL},
    {"architecture", "{Architecture}", 0, NULL, NULL},
    {"target", "object", 0, "as the job spec's target", NULL},
    {"constraints", "object", 0,
     "hybrid (nemotron_h) models: limits by the job spec's names; the answer's fits lists the structures of the "
     "Minitron grid that meet them (the config-only search, docs/hybrid.md)",
     NULL},
    {"search", "{EstimateSearch}", 0, "with constraints: which axes the config-only search may cut", NULL},
    {0}};
static const oa_field ARCHITECTURE[] = {{"hidden", "integer", 0, NULL, NULL},
                                        {"head_dim", "integer", 0, NULL, NULL},
                                        {"vocab", "integer", 0, NULL, NULL},
                                        {"layers", "[{Layer}]", 0, NULL, NULL},
                                        {0}};
static const oa_field LAYER[] = {{"heads", "integer", 0, NULL, NULL},
                                 {"kv_heads", "integer", 0, NULL, NULL},
                                 {"ffn", "integer", 0, NULL, NULL},
                                 {0}};
static const oa_field ESTIMATE_SEARCH[] = {
    {"prune_hidden", "boolean", 0, NULL, NULL}, {"prune_experts", "boolean", 0, NULL, NULL}, {0}};
static const oa_field ESTIMATE_ANSWER[] = {
    {"device", "string", 0, NULL, NULL},
    {"cost_table", "string?", 0, NULL, NULL},
    {"source", "string", 0, NULL, NULL},
    {"figures", "#Figures", 0, NULL, NULL},
    {"architecture", "object", 0, NULL, NULL},
    {"workload", "object", 0, NULL, NULL},
    {"engine", "object", 0, NULL, NULL},
    {"cost_inputs", "object", 0, "where each input of the prediction came from, as a report's target.cost_inputs",
     NULL},
    {"fits", "array", 0, "with constraints: the structures that meet them", NULL},
    {"mtp", "object", 0,
     "hybrid models whose config names multi-token-prediction layers: layers, pattern, params and weights_gib "
     "(absent when a block type is unknown), counted false: the figures leave them out",
     NULL},
    {0}};
static const oa_field FIGURES[] = {
    {"ttft_ms", "number", 0, NULL, NULL},
    {"tpot_ms", "number", 0, NULL, NULL},
    {"tokens_per_s", "number", 0, NULL, NULL},
    {"e2e_ms", "number", 0, NULL, NULL},
    {"memory_gib", "number", 0, NULL, NULL},
    {"weights_gib", "number", 0, NULL, NULL},
    {"kv_cache_gib", "number", 0, NULL, NULL},
    {"overhead_share", "number", 0,
     "estimate only: the share (0..1) of a request's predicted latency that is fixed kernel launches and engine "
     "overhead, which no structure moves",
     NULL},
    {"ssm_state_gib", "number", 0,
     "hybrid models only: the Mamba layers' per-sequence state of the batch (fp32, not growing with the context)",
     NULL},
    {"activations_gib", "number", 0, NULL, NULL},
    {"params", "number", 0, NULL, NULL},
    {"max_batch", "number", 0, NULL, NULL},
    {"device_memory_gib", "number", 0, NULL, NULL},
    {0}};
static const oa_field DEVICES[] = {{"local", "[object]", 1, "this host's CPU and CUDA GPUs", NULL},
                                   {"profiles", "[object]", 1, "the named spec profiles (target.device)", NULL},
                                   {"scheduler", "object", 1, "slots and what runs on them", NULL},
                                   {0}};
/* view_cost_tables (views.c) */
static const oa_field COST_TABLES[] = {{"tables", "[{CostTableRow}]", 1, NULL, NULL}, {0}};
static const oa_field COST_TABLE_ROW[] = {
    {"key", "string", 1, NULL, NULL},        {"device", "string", 1, NULL, NULL},   {"dtype", "string", 1, NULL, NULL},
    {"engine", "string", 1, NULL, NULL},     {"version", "integer", 1, NULL, NULL}, {"source", "string", 1, NULL, NULL},
    {"created_at", "number", 1, NULL, NULL}, {"hits", "integer", 1, NULL, NULL},    {0}};
static const oa_field COST_TABLE_REQUEST[] = {
    {"table", "object", 0, "a table to import (as GET /v1/cost-tables/{key} exports it)", NULL},
    {"measure", "{Measure}", 0, "measure this CPU's table in the background (202)", NULL},
    {0}};
static const oa_field MEASURE[] = {
    {"device", "enum:cpu", 1, NULL, NULL},
    {"threads", "integer", 0, "default: the daemon's worker_threads (the key its jobs plan with)", "{\"minimum\": 1, \"maximum\": 256}"},
    {"dtype", "enum:fp32|bf16", 0, "fp32 (default) or bf16 (the engine on BF16 weights)", NULL},
    {0}};
static const oa_field WORKER_EVENTS[] = {{"events", "[{WorkerEvent}]", 1, NULL, NULL}, {0}};
static const oa_field WORKER_EVENT[] = {{"seq", "integer", 1, NULL, "{\"minimum\": 1}"},
                                        {"kind", "string", 1, NULL, NULL},
                                        {"data", "any", 0, NULL, NULL},
                                        {0}};
static const oa_field LAST_SEQ[] = {{"last_seq", "integer", 1, "the last event stored", NULL}, {0}};

static const char JOB_SPEC_EXAMPLE[] =
    "{\"name\": \"tiny-l4\", \"model\": \"/srv/models/tiny\", \"calibration\": \"/srv/data/calib.txt\", "
    "\"heldout\": \"/srv/data/heldout.txt\", \"output\": \"/srv/out/tiny-l4\", \"target\": {\"device\": \"L4\", "
    "\"workload\": {\"batch\": 8}}, \"constraints\": {\"max_params\": 1000000}}";
static const char JOB_EXAMPLE[] =
    "{\"id\": 7, \"name\": \"tiny-l4\", \"state\": \"queued\", \"priority\": 0, \"device\": null, \"reason\": null, "
    "\"attempts\": 0, \"cancel_requested\": false, \"created_at\": 1765000000.0, \"updated_at\": 1765000000.0, "
    "\"started_at\": null, \"finished_at\": null, \"has_result\": false, \"transitions\": [{\"from\": null, \"to\": "
    "\"queued\", \"at\": 1765000000.0, \"reason\": null}]}";
static const char ERROR_EXAMPLE[] =
    "{\"error\": {\"code\": \"invalid_spec\", \"message\": \"constraints.max_tpot_ms must be a number\", \"field\": "
    "\"constraints.max_tpot_ms\"}}";

static const oa_schema SCHEMAS[] = {
    {"Error", ERROR, "every error answer", ERROR_EXAMPLE, 1},
    {"ErrorBody", ERROR_BODY, NULL, NULL, 0},
    {"ErrorBound", ERROR_BOUND, NULL, NULL, 0},
    {"Job", JOB, NULL, JOB_EXAMPLE, 1},
    {"Transition", TRANSITION, NULL, NULL, 0},
    {"SlurmJob", SLURM_JOB, NULL, NULL, 0},
    {"JobPage", JOB_PAGE, "{jobs: [Job without spec], next_after: id|null}", NULL, 1},
    {"AuditPage", AUDIT_PAGE, NULL, NULL, 1},
    {"AuditEntry", AUDIT_ENTRY, NULL, NULL, 0},
    {"Event", EVENT, NULL, NULL, 1},
    {"EventList", EVENT_LIST, NULL, NULL, 1},
    {"Health", HEALTH, NULL, NULL, 1},
    {"Files", FILES, NULL, NULL, 1},
    {"File", FILE_, NULL, NULL, 0},
    {"Report", REPORT, "report.json: see proto/events.md", NULL, 1},
    {"Export", EXPORT, NULL, NULL, 0},
    {"Valid", VALID, "the spec would be accepted", NULL, 1},
    {"Estimate", ESTIMATE, NULL, NULL, 1},
    {"Architecture", ARCHITECTURE, NULL, NULL, 0},
    {"Layer", LAYER, NULL, NULL, 0},
    {"EstimateSearch", ESTIMATE_SEARCH, NULL, NULL, 0},
    {"EstimateAnswer", ESTIMATE_ANSWER, "the prediction", NULL, 1},
    {"Figures", FIGURES, NULL, NULL, 1},
    {"Devices", DEVICES, NULL, NULL, 1},
    {"CostTables", COST_TABLES, NULL, NULL, 1},
    {"CostTableRow", COST_TABLE_ROW, NULL, NULL, 0},
    {"CostTableRequest", COST_TABLE_REQUEST, "import a table, or schedule a measurement", NULL, 1},
    {"Measure", MEASURE, NULL, NULL, 0},
    {"WorkerEvents", WORKER_EVENTS, NULL, NULL, 1},
    {"WorkerEvent", WORKER_EVENT, NULL, NULL, 0},
    {"LastSeq", LAST_SEQ, NULL, NULL, 1},
};
#define NSCHEMAS (sizeof SCHEMAS / sizeof *SCHEMAS)

static const oa_schema *find_schema(const char *name, size_t n) {
    for (size_t i = 0; i < NSCHEMAS; i++)
        if (strlen(SCHEMAS[i].name) == n && !strncmp(SCHEMAS[i].name, name, n)) return &SCHEMAS[i];
    return NULL;
}

static json_t *object_of(const oa_schema *s, ac_err *e);

/* The schema of type t (n characters), or NULL with e. */
static json_t *type_of(const char *t, size_t n, ac_err *e) {
    if (n > 1 && t[0] == '[' && t[n - 1] == ']') {
        json_t *it = type_of(t + 1, n - 2, e);
        return it ? json_pack("{s:s,s:o}", "type", "array", "items", it) : NULL;
    }
    if (n > 2 && t[0] == '{' && t[n - 1] == '?') { /* an object or null */
        json_t *o = type_of(t, n - 1, e);
        return o ? json_pack("{s:[o,{s:s}]}", "anyOf", o, "type", "null") : NULL;
    }
    if (n > 1 && t[0] == '{' && t[n - 1] == '}') {
        const oa_schema *s = find_schema(t + 1, n - 2);
        if (!s) return ac_errf(e, "no field table %.*s", (int)n, t), NULL;
        return object_of(s, e);
    }
    if (t[0] == '#') {
        if (strncmp(t + 1, "JobSpec", n - 1) && !find_schema(t + 1, n - 1))
            return ac_errf(e, "no schema %.*s", (int)n, t), NULL;
        char ref[128];
        snprintf(ref, sizeof ref, "#/components/schemas/%.*s", (int)n - 1, t + 1);
        return json_pack("{s:s}", "$ref", ref);
    }
    if (n > 5 && !strncmp(t, "enum", 4)) {
        int nullable = t[4] == '?';
        const char *v = t + (nullable ? 6 : 5), *end = t + n;
        json_t *en = json_array();
        if (!strncmp(v, "@states", (size_t)(end - v)))
            for (int i = 0; i < JOB_NSTATES; i++) json_array_append_new(en, json_string(job_state_name((job_state)i)));
        else
            while (v < end) {
                const char *bar = memchr(v, '|', (size_t)(end - v));
                size_t k = bar ? (size_t)(bar - v) : (size_t)(end - v);
                json_array_append_new(en, json_stringn(v, k));
                v += k + (bar != NULL);
            }
        if (nullable) json_array_append_new(en, json_null());
        return json_pack("{s:o,s:o}", "type", nullable ? json_pack("[s,s]", "string", "null") : json_string("string"),
                         "enum", en);
    }
    if (n == 3 && !strncmp(t, "any", 3)) return json_object();
    int nullable = t[n - 1] == '?';
    static const char *const BASIC[] = {"integer", "number", "string", "boolean", "object", "array"};
    for (size_t i = 0; i < sizeof BASIC / sizeof *BASIC; i++)
        if (strlen(BASIC[i]) == n - (size_t)nullable && !strncmp(t, BASIC[i], n - (size_t)nullable))
            return json_pack("{s:o}", "type", nullable ? json_pack("[s,s]", BASIC[i], "null") : json_string(BASIC[i]));
    ac_errf(e, "unknown field type %.*s", (int)n, t);
    return NULL;
}

static json_t *object_of(const oa_schema *s, ac_err *e) {
    json_t *o = json_pack("{s:s}", "type", "object"), *props = json_object(), *req = json_array();
    for (const oa_field *f = s->fields; f->name; f++) {
        json_t *p = type_of(f->type, strlen(f->type), e);
        if (!p) {
            json_decref(o), json_decref(props), json_decref(req);
            return NULL;
        }
        if (f->desc) json_object_set_new(p, "description", json_string(f->desc));
        if (f->more) {
            json_t *m = json_loads(f->more, 0, NULL);
            if (!m) {
                json_decref(p), json_decref(o), json_decref(props), json_decref(req);
                return ac_errf(e, "%s.%s: bad keywords %s", s->name, f->name, f->more), NULL;
            }
            json_object_update(p, m);
            json_decref(m);
        }
        json_object_set_new(props, f->name, p);
        if (f->req) json_array_append_new(req, json_string(f->name));
    }
    if (s->desc) json_object_set_new(o, "description", json_string(s->desc));
    json_object_set_new(o, "properties", props);
    if (json_array_size(req))
        json_object_set_new(o, "required", req);
    else
        json_decref(req);
    return o;
}

json_t *openapi_schemas(ac_err *e) {
    json_t *all = json_object();
    for (size_t i = 0; i < NSCHEMAS; i++) {
        if (!SCHEMAS[i].component) continue;
        json_t *o = object_of(&SCHEMAS[i], e);
        if (!o) {
            json_decref(all);
            return NULL;
        }
        json_object_set_new(all, SCHEMAS[i].name, o);
    }
    json_t *spec = ac_job_spec_schema();
    if (!spec) {
        json_decref(all);
        return ac_errf(e, "cannot build the job spec's schema"), NULL;
    }
    json_object_set_new(all, "JobSpec", spec);
    return all;
}

json_t *openapi_example(const char *schema) {
    const char *ex = !strcmp(schema, "JobSpec") ? JOB_SPEC_EXAMPLE : NULL;
    const oa_schema *s = ex ? NULL : find_schema(schema, strlen(schema));
    if (s) ex = s->example;
    return ex ? json_loads(ex, 0, NULL) : NULL;
}

int openapi_schema_known(const char *name) {
    return !strcmp(name, "JobSpec") || (find_schema(name, strlen(name)) && find_schema(name, strlen(name))->component);
}

json_t *openapi_fields(const char *schema) {
    const oa_schema *s = find_schema(schema, strlen(schema));
    if (!s) return NULL;
    json_t *a = json_array();
    for (const oa_field *f = s->fields; f->name; f++) json_array_append_new(a, json_string(f->name));
    return a;
}
