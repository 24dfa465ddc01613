/*
 * executor_slurm.c - the Slurm executor (executor.h): each queued job becomes
 * a Slurm batch job that runs this same binary (`autocompressd run-job`) on
 * a node.
 *
 * Submission goes through the `sbatch` command rather than libslurm or
 * slurmrestd: the command line is Slurm's stable interface (libslurm's C
 * API changes with every release and Debian ships no headers for it in the
 * client package; slurmrestd needs its own daemon, JWT set-up and an API
 * version per release), it works wherever users can submit jobs, and it
 * runs as this daemon's user with the site's own defaults and plugins.
 * Every command runs as a child process on the loop (uv_spawn), never
 * blocking the HTTP side.
 *
 * The job's directory, DATA_DIR/jobs/ID, is on a file system the nodes
 * share. Before sbatch the daemon writes there: input.json (the spec and the
 * cached cost tables: what a local worker gets on stdin), secret (mode 0600:
 * the per-job secret, never on a command line; the daemon keeps only its
 * SHA-256, jobsecret.h) and job.sh (the batch script:
 * exec autocompressd run-job ...). The worker writes events.jsonl (each event
 * with a sequence number) and posts the same lines to
 * POST /v1/jobs/ID/worker-events with that secret (worker_post.h); Slurm
 * writes its stdout / stderr to worker.log (GET /v1/jobs/ID/log).
 *
 * States. Submitting moves the job to `running` (device "slurm"); Slurm's
 * own state (PENDING, RUNNING, ...) is kept in slurm_state and sent as a
 * `slurm` event when it changes. A "result" event ends the job succeeded,
 * an "error" event failed with its message. A batch job that ends without
 * either (TIMEOUT, NODE_FAIL, OUT_OF_MEMORY, CANCELLED by someone else, a
 * crash) ends it failed with Slurm's state and reason; one cancelled through
 * the API ends cancelled. Before deciding, events.jsonl is read for events
 * that never reached the daemon over HTTP. A requeue (Slurm's restart count
 * went up) keeps the job running; one whose batch job then ends with no
 * event from a later run says its worker never ran again.
 *
 * Restart. Jobs stay `running` in SQLite across a daemon restart (db_recover
 * leaves them); start() re-attaches them: reads the events they wrote
 * meanwhile, then squeue (by batch-job name) says how each stands; one
 * squeue no longer lists is judged by its events file, then by sacct
 * (where the cluster keeps accounting). A job
 * whose sbatch the daemon did not see return is found by its name, so it is
 * never submitted twice; one Slurm has no record of and that wrote no event
 * is submitted again.
 */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <unistd.h>

#include "autocompress.h"
#include "executor.h"
#include "jobsecret.h"

typedef struct sjob {
    struct sjob *next;
    long id, slurm_id, seq;
    char name[64], secret_sha256[80], state[32], reason[160];
    int cancelling, scancel_sent, submitting, sacct_running;
    int requeued; /* pending again after it ran (until it runs again) */
    long restarts;       /* Slurm's restart count at the last poll (-1: not polled yet) */
    long seq_at_requeue; /* the last event when Slurm last requeued it (every earlier run's event read); -1: never */
    double submitted_at;
    char *result;
    char error[512];
} sjob;

/* One command run on the loop; done gets its exit status and output. */
typedef struct cmd {
    uv_process_t proc;
    uv_pipe_t out, err;
    ac_buf buf;
    int64_t status;
    int exited, eof, closing;
    void (*done)(struct cmd *c);
    long job; /* sbatch: the job */
    double started;
} cmd;

static struct {
    ac_daemon *d;
    sjob *jobs;
    int ncmds, stopping, polling, submitting;
    double last_poll;
    char jobs_dir[1100], url[600];
    char health[300]; /* the last squeue / sbatch trouble, "" when none */
} S;

static void slog(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static void slog(const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    fprintf(stderr, "autocompressd: slurm: ");
    vfprintf(stderr, fmt, ap);
    fputc('\n', stderr);
    va_end(ap);
}

static sjob *find(long id) {
    for (sjob *j = S.jobs; j; j = j->next)
        if (j->id == id) return j;
    return NULL;
}

static void drop(sjob *sj) {
    for (sjob **p = &S.jobs; *p; p = &(*p)->next)
        if (*p == sj) {
            *p = sj->next;
            break;
        }
    free(sj->result);
    free(sj);
}

/* ------------------------------------------------------------- commands */

static void cmd_closed(uv_handle_t *h) {
    cmd *c = h->data;
    if (--c->closing > 0) return;
    ac_buf_free(&c->buf);
    free(c);
    S.ncmds--;
}

static void cmd_maybe_done(cmd *c) {
    if (!c->exited || c->eof < 2) return;
    if (c->buf.data) c->buf.data[c->buf.len] = 0;
    c->done(c);
    c->closing = 3;
    uv_close((uv_handle_t *)&c->proc, cmd_closed);
    uv_close((uv_handle_t *)&c->out, cmd_closed);
    uv_close((uv_handle_t *)&c->err, cmd_closed);
}

static void cmd_alloc(uv_handle_t *h, size_t suggested, uv_buf_t *b) {
    (void)h;
    b->base = malloc(suggested);
    b->len = b->base ? suggested : 0;
}

static void cmd_read(uv_stream_t *st, ssize_t n, const uv_buf_t *b) {
    cmd *c = st->data;
    if (n > 0 && ac_buf_reserve(&c->buf, (size_t)n + 1, 16u << 20) == 0) {
        memcpy(c->buf.data + c->buf.len, b->base, (size_t)n);
        c->buf.len += (size_t)n;
    } else if (n < 0) {
        uv_read_stop(st);
        c->eof++;
        cmd_maybe_done(c);
    }
    free(b->base);
}

static void cmd_exit(uv_process_t *p, int64_t status, int sig) {
    cmd *c = p->data;
    c->status = status ? status : sig ? 128 + sig : 0;
    c->exited = 1;
    cmd_maybe_done(c);
}

/* Run argv (stdout and stderr together into c->buf); done is called once
 * it exited and its output ended. 0, or -1 (done not called). */
static int run_cmd(char **argv, long job, void (*done)(cmd *c)) {
    cmd *c = calloc(1, sizeof *c);
    if (!c) return -1;
    c->done = done;
    c->job = job;
    c->started = ac_now();
    uv_pipe_init(S.d->loop, &c->out, 0);
    uv_pipe_init(S.d->loop, &c->err, 0);
    uv_stdio_container_t stdio[3] = {{.flags = UV_IGNORE},
                                     {.flags = UV_CREATE_PIPE | UV_WRITABLE_PIPE, .data.stream = (uv_stream_t *)&c->out},
                                     {.flags = UV_CREATE_PIPE | UV_WRITABLE_PIPE, .data.stream = (uv_stream_t *)&c->err}};
    uv_process_options_t o = {.file = argv[0], .args = argv, .exit_cb = cmd_exit, .stdio = stdio, .stdio_count = 3};
    c->out.data = c->err.data = c->proc.data = c;
    S.ncmds++;
    int r = uv_spawn(S.d->loop, &c->proc, &o);
    if (r) {
        snprintf(S.health, sizeof S.health, "cannot run %s: %s", argv[0], uv_strerror(r));
        slog("%s", S.health);
        c->closing = 3;
        uv_close((uv_handle_t *)&c->proc, cmd_closed);
        uv_close((uv_handle_t *)&c->out, cmd_closed);
        uv_close((uv_handle_t *)&c->err, cmd_closed);
        return -1;
    }
    uv_read_start((uv_stream_t *)&c->out, cmd_alloc, cmd_read);
    uv_read_start((uv_stream_t *)&c->err, cmd_alloc, cmd_read);
    return 0;
}

/* ------------------------------------------------------------- events */

static void finish(sjob *sj, job_state to, const char *reason) {
    ac_daemon *d = S.d;
    ac_err e = {{0}};
    const char *result = to == JOB_SUCCEEDED ? sj->result : NULL;
    int r = db_job_transition(d->db, sj->id, JOB_RUNNING, to, reason, NULL, result, &e);
    if (r < 0) { /* the store refused: keep tracking, the next poll tries again */
        slog("job %ld: cannot record its end: %s", sj->id, e.msg);
        return;
    }
    slog("job %ld (Slurm job %ld) %s: %s", sj->id, sj->slurm_id, job_state_name(to), reason);
    if (r == 0 && to != JOB_SUCCEEDED) sched_release_checkpoints(d, sj->id); /* succeeded: the worker did */
    if (r == 0) {
        daemon_event(d, sj->id, "state", json_pack("{s:s,s:s}", "state", job_state_name(to), "reason", reason));
        events_finish(d, sj->id);
    }
    drop(sj);
}

/* Store one worker event (seq, kind, data: borrowed) of a tracked job; a
 * result or error ends the job. 0, or 1 when the job ended (sj is freed). */
static int apply_event(sjob *sj, long seq, const char *kind, json_t *data) {
    ac_daemon *d = S.d;
    if (seq <= sj->seq) return 0;
    json_t *line = json_pack("{s:s,s:O}", "kind", kind, "data", data);
    char *txt = line ? json_dumps(line, JSON_COMPACT) : NULL;
    json_decref(line);
    wevent ev;
    if (!txt || wevent_parse(txt, strlen(txt), &ev)) {
        free(txt);
        return 0;
    }
    free(txt);
    exec_worker_event(d, sj->id, &ev, &sj->result, sj->error, sizeof sj->error);
    char *s = json_dumps(ev.data, JSON_COMPACT | JSON_ENCODE_ANY);
    ac_err e = {{0}};
    long eid = s ? db_exec_event(d->db, sj->id, seq, ev.kind, s, &e) : -1;
    if (eid > 0) {
        atomic_fetch_add(&d->events_stored, 1);
        sse_publish(d->hub, sj->id, eid, ev.kind, s);
    } else if (eid < 0)
        slog("job %ld: cannot store event %ld: %s", sj->id, seq, e.msg);
    free(s);
    int ended = !strcmp(ev.kind, "result") || !strcmp(ev.kind, "error");
    wevent_free(&ev);
    if (eid < 0) return 0; /* not stored: the file still has it */
    sj->seq = seq;
    if (!ended) return 0;
    if (sj->result)
        finish(sj, JOB_SUCCEEDED, "completed");
    else if (sj->cancelling)
        return 0; /* the worker's error after scancel: ends cancelled when Slurm says so */
    else
        finish(sj, JOB_FAILED, sj->error[0] ? sj->error : "the worker reported an error");
    return 1;
}

/* Read events.jsonl for events the daemon does not have yet. 1 when the
 * job ended on one of them. */
static int ingest_file(sjob *sj) {
    char p[1200];
    snprintf(p, sizeof p, "%s/%ld/events.jsonl", S.jobs_dir, sj->id);
    FILE *f = fopen(p, "r");
    if (!f) return 0;
    char *line = NULL;
    size_t cap = 0;
    ssize_t n;
    int ended = 0;
    while (!ended && (n = getline(&line, &cap, f)) > 0) {
        if (line[n - 1] != '\n') break; /* being written */
        json_t *j = json_loadb(line, (size_t)n, 0, NULL);
        json_t *seq = json_object_get(j, "seq"), *data = json_object_get(j, "data");
        const char *kind = json_string_value(json_object_get(j, "kind"));
        if (json_is_integer(seq) && kind && data) ended = apply_event(sj, (long)json_integer_value(seq), kind, data);
        json_decref(j);
    }
    free(line);
    fclose(f);
    return ended;
}

/* ------------------------------------------------------------- submission */

static int write_file(const char *path, const char *text, mode_t mode, ac_err *e) {
    int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, mode);
    if (fd < 0) return ac_errf(e, "cannot write %s: %s", path, strerror(errno));
    size_t n = strlen(text), off = 0;
    while (off < n) {
        ssize_t w = write(fd, text + off, n - off);
        if (w <= 0) {
            close(fd);
            return ac_errf(e, "cannot write %s: %s", path, strerror(errno));
        }
        off += (size_t)w;
    }
    if (fchmod(fd, mode) || fsync(fd) || close(fd)) return ac_errf(e, "cannot write %s: %s", path, strerror(errno));
    return 0;
}

/* s quoted for sh into b. */
static void shq(ac_buf *b, const char *s) {
    ac_buf_append(b, "'", 1, 1u << 24);
    for (; *s; s++)
        if (*s == '\'')
            ac_buf_append(b, "'\\''", 4, 1u << 24);
        else
            ac_buf_append(b, s, 1, 1u << 24);
    ac_buf_append(b, "' ", 2, 1u << 24);
}

static char *batch_script(ac_daemon *d, long job, const char *dir, const char *device) {
    ac_buf b = {0};
    char id[32], line[256];
    snprintf(id, sizeof id, "%ld", job);
    snprintf(line, sizeof line,
             "#!/bin/sh\n# AutoCompress job %ld, written by autocompressd for Slurm: runs its worker on the node.\n"
             "exec ",
             job);
    ac_buf_append(&b, line, strlen(line), 1u << 24);
    char path[1300], thr[32], qb[32], fl[32];
    snprintf(thr, sizeof thr, "%d", d->cfg.exec.cpus_per_task ? d->cfg.exec.cpus_per_task : d->cfg.worker_threads);
    snprintf(qb, sizeof qb, "%g", d->cfg.quiet_budget_s);
    snprintf(fl, sizeof fl, "%g", d->cfg.exec.post_flush_s);
    shq(&b, d->exe);
    ac_buf_append(&b, "run-job ", 8, 1u << 24);
    shq(&b, id);
    const char *kv[][2] = {{"--device", device},         {"--output", "output"},      {"--input", "input.json"},
                           {"--events", "events.jsonl"}, {"--secret-file", "secret"}, {"--checkpoint", "checkpoint"}};
    for (size_t i = 0; i < sizeof kv / sizeof *kv; i++) {
        shq(&b, kv[i][0]);
        if (i == 0)
            shq(&b, kv[i][1]);
        else {
            snprintf(path, sizeof path, "%s/%s", dir, kv[i][1]);
            shq(&b, path);
        }
    }
    const char *rest[] = {"--post", S.url, "--jobs-dir", S.jobs_dir, "--quiet-budget", qb, "--flush", fl};
    for (size_t i = 0; i < sizeof rest / sizeof *rest; i++) shq(&b, rest[i]);
    for (int i = 0; i < d->cfg.nroots; i++) {
        shq(&b, "--root");
        shq(&b, d->cfg.model_roots[i]);
    }
    /* threads: what Slurm gave the task, else the configured count */
    snprintf(line, sizeof line, "--threads \"${SLURM_CPUS_PER_TASK:-%s}\"\n", thr);
    ac_buf_append(&b, line, strlen(line), 1u << 24);
    if (ac_buf_reserve(&b, 1, 1u << 20)) {
        ac_buf_free(&b);
        return NULL;
    }
    b.data[b.len] = 0;
    return b.data;
}

static void hex(char *dst, size_t nbytes) {
    unsigned char r[64];
    if (nbytes > sizeof r) nbytes = sizeof r;
    if (getrandom(r, nbytes, 0) != (ssize_t)nbytes) { /* never expected: fall back to the clock, but say it */
        slog("getrandom failed: %s", strerror(errno));
        for (size_t i = 0; i < nbytes; i++) r[i] = (unsigned char)(rand() ^ (int)(ac_now() * 1e6));
    }
    for (size_t i = 0; i < nbytes; i++) sprintf(dst + 2 * i, "%02x", r[i]);
}

static void sbatch_done(cmd *c) {
    S.submitting--;
    if (!S.stopping) sched_notify(S.d); /* the next queued job may go */
    sjob *sj = find(c->job);
    char *out = c->buf.data ? c->buf.data : "";
    long sid = 0;
    char *end = out;
    if (c->status == 0) sid = strtol(out, &end, 10);
    if (!sj) return;
    sj->submitting = 0;
    ac_err e = {{0}};
    if (sid > 0 && (*end == 0 || *end == '\n' || *end == ';')) {
        sj->slurm_id = sid;
        snprintf(sj->state, sizeof sj->state, "PENDING");
        sj->submitted_at = ac_now();
        S.health[0] = 0;
        char why[200];
        snprintf(why, sizeof why, "submitted to Slurm as job %ld", sid);
        if (db_exec_set_slurm(S.d->db, sj->id, sid, "PENDING", &e) || db_job_set_reason(S.d->db, sj->id, why, &e))
            slog("job %ld: %s (the name %s finds it again)", sj->id, e.msg, sj->name);
        daemon_event(S.d, sj->id, "slurm", json_pack("{s:I,s:s,s:s}", "job_id", (json_int_t)sid, "name", sj->name,
                                                     "state", "PENDING"));
        slog("job %ld submitted as Slurm job %ld (%s)", sj->id, sid, sj->name);
        return;
    }
    /* sbatch refused or failed: back to the queue while attempts last */
    size_t ol = strcspn(out, "\n");
    char why[600];
    snprintf(why, sizeof why, "sbatch failed (status %lld): %.*s", (long long)c->status, (int)(ol > 400 ? 400 : ol),
             out);
    snprintf(S.health, sizeof S.health, "%.299s", why);
    db_job j;
    int found = 0;
    int requeue = db_job_get(S.d->db, sj->id, &j, &found, &e) == 0 && found && j.attempts < S.d->cfg.max_attempts &&
                  !j.cancel_requested;
    if (found) db_job_clear(&j);
    if (requeue) {
        char r2[700];
        snprintf(r2, sizeof r2, "%s; re-queued", why);
        if (db_job_transition(S.d->db, sj->id, JOB_RUNNING, JOB_QUEUED, r2, NULL, NULL, &e) == 0)
            daemon_event(S.d, sj->id, "state", json_pack("{s:s,s:s}", "state", "queued", "reason", r2));
        slog("job %ld: %s", sj->id, r2);
        drop(sj);
    } else
        finish(sj, JOB_FAILED, why);
}

static void sbatch_opt(char **argv, int *na, char *store, size_t n, const char *flag, const char *val) {
    if (!val || !val[0]) return;
    snprintf(store, n, "%s=%s", flag, val);
    argv[(*na)++] = store;
}

static int slurm_place(ac_daemon *d, long job, const char *device, char *why, size_t n) {
    if (S.stopping) return snprintf(why, n, "waiting: the daemon is stopping"), 1;
    if (S.submitting > 0) return snprintf(why, n, "waiting: another job is being submitted to Slurm"), 1;
    ac_err e = {{0}};
    char dir[1200], p[1300];
    snprintf(dir, sizeof dir, "%s/%ld", S.jobs_dir, job);
    mkdir(S.jobs_dir, 0755);
    mkdir(dir, 0755);
    char ckpt[1200]; /* submitted once: checkpoints there were left by another job (a reused data directory) */
    sched_checkpoint_dir(d, job, ckpt, sizeof ckpt);
    ac_job_clear_checkpoints(ckpt);
    ac_target tg;
    ac_err te;
    int gpu = ac_target_resolve(device, &tg, &te) == 0 && tg.kind == AC_TARGET_CUDA;
    sjob *sj = calloc(1, sizeof *sj);
    char *input = sj ? exec_worker_input(d, job, &e) : NULL, *script = NULL;
    char secret[JOBSECRET_LEN + 1] = "";
    if (sj) {
        sj->id = job;
        sj->seq_at_requeue = sj->restarts = -1;
        char r[17] = "";
        hex(r, 4);
        snprintf(sj->name, sizeof sj->name, "ac-%ld-%s", job, r);
        script = batch_script(d, job, dir, gpu ? "cuda:0" : "cpu");
    }
    int rc = !sj || !input || !script ? ac_errf(&e, "%s", e.msg[0] ? e.msg : "out of memory") : 0;
    if (rc == 0) rc = jobsecret_new(secret, sizeof secret, &e) || jobsecret_hash(secret, sj->secret_sha256, &e);
    if (rc == 0) {
        snprintf(p, sizeof p, "%s/input.json", dir);
        rc = write_file(p, input, 0600, &e);
    }
    if (rc == 0) { /* the worker's copy; the daemon keeps only the hash */
        snprintf(p, sizeof p, "%s/secret", dir);
        rc = write_file(p, secret, 0600, &e);
    }
    explicit_bzero(secret, sizeof secret);
    if (rc == 0) {
        snprintf(p, sizeof p, "%s/job.sh", dir);
        rc = write_file(p, script, 0700, &e);
    }
    free(input);
    free(script);
    if (rc == 0) rc = db_exec_prepare(d->db, job, "slurm", sj->name, sj->secret_sha256, &e);
    if (rc == 0) {
        int t = db_job_transition(d->db, job, JOB_QUEUED, JOB_RUNNING, "submitting to Slurm", "slurm", NULL, &e);
        if (t) { /* cancelled meanwhile, or the store refused */
            free(sj);
            return -1;
        }
    }
    if (rc) {
        slog("job %ld: cannot prepare its batch job: %s", job, e.msg);
        char r2[600];
        snprintf(r2, sizeof r2, "cannot prepare the Slurm batch job: %.500s", e.msg);
        if (db_job_transition(d->db, job, JOB_QUEUED, JOB_FAILED, r2, NULL, NULL, &e) == 0) {
            daemon_event(d, job, "state", json_pack("{s:s,s:s}", "state", "failed", "reason", r2));
            events_finish(d, job);
        }
        free(sj);
        return -1;
    }
    sj->submitting = 1;
    sj->next = S.jobs;
    S.jobs = sj;
    daemon_event(d, job, "state", json_pack("{s:s,s:s}", "state", "running", "device", "slurm"));
    const ac_exec_config *x = &d->cfg.exec;
    char o_name[100], o_out[1400], o_dir[1300], o_part[150], o_acct[150], o_qos[150], o_time[60], o_gres[150],
        o_mem[60], o_cpt[40], cpt[16];
    char *argv[32 + AC_SLURM_MAX_OPTS];
    int na = 0;
    argv[na++] = "sbatch";
    argv[na++] = "--parsable";
    argv[na++] = x->requeue ? "--requeue" : "--no-requeue"; /* slurm.requeue: executor_config.h, operations.md */
    sbatch_opt(argv, &na, o_name, sizeof o_name, "--job-name", sj->name);
    snprintf(p, sizeof p, "%s/worker.log", dir);
    sbatch_opt(argv, &na, o_out, sizeof o_out, "--output", p);
    argv[na++] = "--open-mode=append";
    sbatch_opt(argv, &na, o_dir, sizeof o_dir, "--chdir", dir);
    sbatch_opt(argv, &na, o_part, sizeof o_part, "--partition", x->partition);
    sbatch_opt(argv, &na, o_acct, sizeof o_acct, "--account", x->account);
    sbatch_opt(argv, &na, o_qos, sizeof o_qos, "--qos", x->qos);
    sbatch_opt(argv, &na, o_time, sizeof o_time, "--time", x->time_limit);
    sbatch_opt(argv, &na, o_gres, sizeof o_gres, "--gres", x->gres);
    sbatch_opt(argv, &na, o_mem, sizeof o_mem, "--mem", x->mem);
    snprintf(cpt, sizeof cpt, "%d", x->cpus_per_task);
    if (x->cpus_per_task > 0) sbatch_opt(argv, &na, o_cpt, sizeof o_cpt, "--cpus-per-task", cpt);
    for (int i = 0; i < x->nsbatch_options; i++) argv[na++] = x->sbatch_options[i];
    snprintf(p, sizeof p, "%s/job.sh", dir);
    argv[na++] = p;
    argv[na] = NULL;
    S.submitting++;
    if (run_cmd(argv, job, sbatch_done)) {
        S.submitting--;
        sj->submitting = 0;
        finish(sj, JOB_FAILED, "cannot run sbatch (is slurm-client installed and on PATH?)");
        return -1;
    }
    return 0;
}

/* ------------------------------------------------------------- cancel */

static void scancel_done(cmd *c) {
    if (c->status) slog("scancel for job %ld exited %lld: %.300s", c->job, (long long)c->status, c->buf.data ? c->buf.data : "");
}

static void send_scancel(sjob *sj) {
    char idarg[32], namearg[100];
    char *argv[4] = {"scancel", NULL, NULL, NULL};
    if (sj->slurm_id > 0) {
        snprintf(idarg, sizeof idarg, "%ld", sj->slurm_id);
        argv[1] = idarg;
    } else {
        snprintf(namearg, sizeof namearg, "--name=%s", sj->name);
        argv[1] = namearg;
    }
    if (run_cmd(argv, sj->id, scancel_done) == 0) sj->scancel_sent = 1;
    slog("job %ld: scancel %s", sj->id, argv[1]);
}

static void slurm_cancel(ac_daemon *d, long job) {
    (void)d;
    sjob *sj = find(job);
    if (!sj || sj->cancelling) return;
    sj->cancelling = 1;
    if (!sj->submitting) send_scancel(sj);
    /* else: once sbatch returned, the tick sends it */
}

/* ------------------------------------------------------------- polling */

/* squeue's state ends the batch job for good. Not SPECIAL_EXIT: a job requeued and held (scontrol requeuehold
 * State=SpecialExit, or RequeueExitHold) is pending until someone releases it (Slurm's job_state_string shows
 * the flag before the PENDING under it). */
static int terminal_state(const char *st) {
    static const char *t[] = {"COMPLETED", "FAILED",   "CANCELLED",     "TIMEOUT", "NODE_FAIL", "PREEMPTED",
                              "BOOT_FAIL", "DEADLINE", "OUT_OF_MEMORY", "REVOKED", NULL};
    for (int i = 0; t[i]; i++)
        if (!strncmp(st, t[i], strlen(t[i]))) return 1;
    return 0;
}

/* What a batch job's end state means for the job, in words: Slurm's state
 * (and squeue's reason, or sacct's exit code, in detail) always named. */
static void end_reason(long sid, const char *state, const char *detail, char *out, size_t n) {
    static const struct {
        const char *state, *words;
    } W[] = {
        {"TIMEOUT", "reached its time limit before the job finished (raise slurm.time_limit or the partition's limit)"},
        {"NODE_FAIL", "lost its node"},
        {"OUT_OF_MEMORY", "ran out of memory on its node (raise slurm.mem)"},
        {"PREEMPTED", "was preempted by another job"},
        {"DEADLINE", "passed its deadline"},
        {"BOOT_FAIL", "could not boot its node"},
        {"CANCELLED", "was cancelled outside the daemon"},
    };
    const char *words = "ended";
    for (size_t i = 0; i < sizeof W / sizeof *W; i++)
        if (!strncmp(state, W[i].state, strlen(W[i].state))) words = W[i].words;
    int has = detail && detail[0] && strcmp(detail, "None");
    snprintf(out, n, "Slurm job %ld %s: %s%s%s%s, without a result", sid, words, state, has ? " (" : "",
             has ? detail : "", has ? ")" : "");
}

/* The batch job ended (or is gone): decide the job's end. state: Slurm's
 * end state (NULL: not known); detail: squeue's reason or sacct's exit code;
 * source: where the state came from when not squeue ("sacct", "the job
 * completion log"). */
static void slurm_ended(sjob *sj, const char *state, const char *detail, const char *source) {
    if (ingest_file(sj)) return; /* a result or error in the file ended it */
    char why[800], r[600];
    if (sj->cancelling) {
        finish(sj, JOB_CANCELLED, "cancelled by user");
        return;
    }
    if (sj->error[0]) {
        finish(sj, JOB_FAILED, sj->error);
        return;
    }
    if (state) end_reason(sj->slurm_id, state, detail, r, sizeof r);
    if (state && sj->seq_at_requeue >= 0 && sj->seq == sj->seq_at_requeue) {
        /* no event since the requeue: the batch job ended before its worker ran again (Slurm's launch of the
         * requeued job failed; e.g. one released within the second of its requeue: slurmd refuses the launch,
         * "Job credential revoked", and slurmctld ends the job FAILED, exit code 1: operations.md) */
        size_t l = strlen(r);
        snprintf(r + l, sizeof r - l, "; Slurm had requeued it and it ended before its worker ran again (slurmctld's "
                                      "log says why)");
    }
    if (state && source)
        snprintf(why, sizeof why, "%s (from %s: squeue no longer lists it)", r, source);
    else if (state)
        snprintf(why, sizeof why, "%s", r);
    else
        snprintf(why, sizeof why,
                 "Slurm no longer lists job %ld (it ended while the daemon was not watching), has no accounting record "
                 "of it, and its events hold no result",
                 sj->slurm_id);
    finish(sj, JOB_FAILED, why);
}

/* The last terminal "JobName|State|ExitCode" line of sacct's output for
 * the batch job of that name into st, code: 1 when there is one. (The job
 * completion log has a line per end of the batch job, a requeue's included:
 * the last is its final end; the name guards against a job id Slurm gave
 * again after its state was lost.) */
static int sacct_state(const char *out, const char *name, char st[64], char code[32]) {
    int found = 0;
    for (const char *ln = out; *ln;) {
        char n1[64] = "", s1[64] = "", c1[32] = "";
        if (sscanf(ln, "%63[^|\n]|%63[^|\n]|%31[^|\n]", n1, s1, c1) >= 2 && !strcmp(n1, name) && terminal_state(s1)) {
            snprintf(st, 64, "%s", s1);
            snprintf(code, 32, "%s", c1);
            found = 1;
        }
        const char *nl = strchr(ln, '\n');
        if (!nl) break;
        ln = nl + 1;
    }
    return found;
}

static void ask_sacct_mode(sjob *sj, int completion);

static void sacct_done_mode(cmd *c, int completion) {
    sjob *sj = find(c->job);
    if (!sj) return;
    sj->sacct_running = 0;
    char st[64] = "", code[32] = "";
    const char *out = c->buf.data ? c->buf.data : "";
    if (c->status == 0 && sacct_state(out, sj->name, st, code)) {
        char why[64];
        snprintf(why, sizeof why, "exit code %s", code[0] ? code : "?");
        slurm_ended(sj, st, why, completion ? "sacct --completion, Slurm's job completion log" : "sacct");
    } else if (!completion) /* no accounting, or it does not know the job: the job completion log */
        ask_sacct_mode(sj, 1);
    else /* neither knows it: the files decided what they could */
        slurm_ended(sj, NULL, NULL, NULL);
}
static void sacct_done(cmd *c) { sacct_done_mode(c, 0); }
static void sacct_completion_done(cmd *c) { sacct_done_mode(c, 1); }

/* The batch job's end from Slurm's accounting (sacct), for one squeue no
 * longer lists; where the cluster keeps no accounting (sacct: "accounting
 * storage is disabled"), from its job completion log (sacct --completion,
 * JobCompType). */
static void ask_sacct_mode(sjob *sj, int completion) {
    if (sj->sacct_running) return;
    char id[32];
    snprintf(id, sizeof id, "%ld", sj->slurm_id);
    char *acct[] = {"sacct", "--noheader", "--parsable2", "--allocations", "--format=JobName,State,ExitCode",
                    "--jobs", id, NULL};
    char *comp[] = {"sacct", "--completion", "--noheader", "--parsable2", "--format=JobName,State,ExitCode", "--jobs", id,
                    NULL};
    if (run_cmd(completion ? comp : acct, sj->id, completion ? sacct_completion_done : sacct_done) == 0)
        sj->sacct_running = 1;
    else
        slurm_ended(sj, NULL, NULL, NULL);
}
static void ask_sacct(sjob *sj) { ask_sacct_mode(sj, 0); }

static void poll_done(cmd *c) {
    S.polling = 0;
    double started = c->started;
    if (c->status) {
        snprintf(S.health, sizeof S.health, "squeue failed (status %lld): %.200s", (long long)c->status,
                 c->buf.data ? c->buf.data : "");
        slog("%s", S.health);
        return; /* nothing is decided on a failed poll */
    }
    S.health[0] = 0;
    char *save = NULL;
    /* lines "id|name|state|reason|restarts" */
    typedef struct {
        long id, restarts;
        char name[64], state[32], reason[160];
    } row;
    int nrows = 0, cap = 0;
    row *rows = NULL;
    for (char *ln = strtok_r(c->buf.data ? c->buf.data : "", "\n", &save); ln; ln = strtok_r(NULL, "\n", &save)) {
        row r = {0};
        char *f[5] = {0};
        int nf = 0;
        for (char *q = ln; nf < 5; nf++) {
            f[nf] = q;
            char *bar = strchr(q, '|');
            if (!bar) {
                nf++;
                break;
            }
            *bar = 0;
            q = bar + 1;
        }
        if (nf < 3) continue;
        r.id = atol(f[0]);
        snprintf(r.name, sizeof r.name, "%s", f[1]);
        snprintf(r.state, sizeof r.state, "%s", f[2]);
        snprintf(r.reason, sizeof r.reason, "%s", nf > 3 && f[3] ? f[3] : "");
        r.restarts = nf > 4 && f[4] && *f[4] >= '0' && *f[4] <= '9' ? atol(f[4]) : -1;
        if (nrows == cap) {
            cap = cap ? 2 * cap : 64;
            row *nr = realloc(rows, (size_t)cap * sizeof *rows);
            if (!nr) break;
            rows = nr;
        }
        rows[nrows++] = r;
    }
    ac_err e = {{0}};
    for (sjob *sj = S.jobs, *next; sj; sj = next) {
        next = sj->next;
        if (sj->submitting || sj->sacct_running || sj->submitted_at > started) continue; /* not in this answer */
        row *hit = NULL;
        for (int i = 0; i < nrows; i++) /* the newest batch job of that name */
            if (!strcmp(rows[i].name, sj->name) && (!hit || rows[i].id > hit->id) &&
                (sj->slurm_id <= 0 || rows[i].id == sj->slurm_id))
                hit = &rows[i];
        if (!hit) {
            if (sj->slurm_id > 0) { /* Slurm forgot it (MinJobAge): its files, then accounting */
                if (!ingest_file(sj)) ask_sacct(sj);
                continue;
            }
            /* never seen by Slurm: sbatch did not get through before the daemon stopped */
            char ev[1300];
            snprintf(ev, sizeof ev, "%s/%ld/events.jsonl", S.jobs_dir, sj->id);
            if (access(ev, F_OK) == 0) {
                slurm_ended(sj, NULL, NULL, NULL);
                continue;
            }
            const char *why = "re-queued: Slurm has no batch job of this name (sbatch was interrupted)";
            if (db_job_transition(S.d->db, sj->id, JOB_RUNNING, JOB_QUEUED, why, NULL, NULL, &e) == 0)
                daemon_event(S.d, sj->id, "state", json_pack("{s:s,s:s}", "state", "queued", "reason", why));
            slog("job %ld: %s", sj->id, why);
            drop(sj);
            continue;
        }
        if (sj->slurm_id <= 0) { /* adopted by name after a restart */
            sj->slurm_id = hit->id;
            slog("job %ld: re-attached to Slurm job %ld by its name %s", sj->id, hit->id, sj->name);
        }
        /* Slurm requeued it (a lost node, a preemption, scontrol requeue): the same batch job runs again and its
         * worker resumes from the stage checkpoints. Its restart count says so even where the polls missed it
         * PENDING (a requeued job released at once is PENDING for less than a second). */
        int restarted = sj->restarts >= 0 && hit->restarts > sj->restarts;
        if (hit->restarts >= 0) sj->restarts = hit->restarts;
        if (restarted) {
            slog("job %ld: Slurm requeued job %ld (restart %ld)", sj->id, hit->id, hit->restarts);
            /* the earlier run was killed; what it wrote is in its file: an event after these is a new run's */
            if (ingest_file(sj)) continue; /* its result after all: ended (sj is freed) */
            sj->seq_at_requeue = sj->seq;
        }
        if (strcmp(sj->state, hit->state) || strcmp(sj->reason, hit->reason)) {
            /* back to PENDING after it ran: requeued, until it runs again */
            int requeued = (sj->requeued || restarted || !strcmp(sj->state, "RUNNING") ||
                            !strcmp(sj->state, "COMPLETING")) &&
                           (!strcmp(hit->state, "PENDING") || !strncmp(hit->state, "REQUEUE", 7) ||
                            !strcmp(hit->state, "SPECIAL_EXIT"));
            sj->requeued = requeued;
            snprintf(sj->state, sizeof sj->state, "%s", hit->state);
            snprintf(sj->reason, sizeof sj->reason, "%s", hit->reason);
            char why[300];
            snprintf(why, sizeof why, "Slurm job %ld %s%s%s%s%s", hit->id, requeued ? "requeued, " : "", hit->state,
                     strcmp(hit->reason, "None") && hit->reason[0] ? " (" : "",
                     strcmp(hit->reason, "None") ? hit->reason : "", strcmp(hit->reason, "None") && hit->reason[0] ? ")" : "");
            if (db_exec_set_slurm(S.d->db, sj->id, hit->id, hit->state, &e) ||
                (!terminal_state(hit->state) && db_job_set_reason(S.d->db, sj->id, why, &e)))
                slog("job %ld: %s", sj->id, e.msg);
            daemon_event(S.d, sj->id, "slurm",
                         json_pack("{s:I,s:s,s:s,s:s}", "job_id", (json_int_t)hit->id, "name", sj->name, "state",
                                   hit->state, "reason", hit->reason));
        }
        if (terminal_state(hit->state)) slurm_ended(sj, hit->state, hit->reason, NULL);
    }
    free(rows);
}

static void poll_now(void) {
    if (!S.jobs || S.polling || S.stopping) return;
    ac_buf names = {0};
    ac_buf_append(&names, "--name=", 7, 1u << 24);
    int any = 0;
    for (sjob *sj = S.jobs; sj; sj = sj->next) {
        if (any) ac_buf_append(&names, ",", 1, 1u << 24);
        ac_buf_append(&names, sj->name, strlen(sj->name), 1u << 24);
        any = 1;
    }
    if (ac_buf_reserve(&names, 1, 1u << 24)) {
        ac_buf_free(&names);
        return;
    }
    names.data[names.len] = 0;
    /* the long format: only it has the restart count (a field with ":|" is unpadded and ends with "|") */
    char *argv[] = {"squeue", "--noheader", "--states=all", "--Format=JobID:|,Name:|,State:|,Reason:|,RestartCnt:",
                    names.data, NULL};
    S.last_poll = ac_now();
    if (run_cmd(argv, 0, poll_done) == 0) S.polling = 1;
    ac_buf_free(&names);
}

static void slurm_tick(ac_daemon *d) {
    (void)d;
    for (sjob *sj = S.jobs; sj; sj = sj->next)
        if (sj->cancelling && !sj->scancel_sent && !sj->submitting) send_scancel(sj);
    if (ac_now() - S.last_poll >= d->cfg.exec.poll_s) poll_now();
}

/* ------------------------------------------------------------- start, view */

static int slurm_start(ac_daemon *d, ac_err *e) {
    memset(&S, 0, sizeof S);
    S.d = d;
    snprintf(S.jobs_dir, sizeof S.jobs_dir, "%s/jobs", d->data_dir_abs);
    const char *host = d->cfg.listen_host;
    if (d->cfg.exec.daemon_url[0])
        snprintf(S.url, sizeof S.url, "%s", d->cfg.exec.daemon_url);
    else
        snprintf(S.url, sizeof S.url, "http://%s%s%s:%d", strchr(host, ':') && host[0] != '[' ? "[" : "", host,
                 strchr(host, ':') && host[0] != '[' ? "]" : "", d->cfg.listen_port);
    db_exec_job *live = NULL;
    int n = 0;
    if (db_exec_live(d->db, "slurm", &live, &n, e)) return -1;
    for (int i = 0; i < n; i++) {
        sjob *sj = calloc(1, sizeof *sj);
        if (!sj) {
            free(live);
            return ac_errf(e, "out of memory");
        }
        sj->id = live[i].id;
        sj->slurm_id = live[i].slurm_job_id;
        sj->seq = live[i].seq;
        sj->seq_at_requeue = sj->restarts = -1; /* a requeue before the restart is not known */
        sj->cancelling = live[i].cancel_requested;
        snprintf(sj->name, sizeof sj->name, "%s", live[i].name);
        snprintf(sj->secret_sha256, sizeof sj->secret_sha256, "%s", live[i].secret_sha256);
        snprintf(sj->state, sizeof sj->state, "%s", live[i].slurm_state);
        sj->next = S.jobs;
        S.jobs = sj;
        slog("job %ld: re-attaching (Slurm job %ld, %s, %ld events stored)", sj->id, sj->slurm_id,
             sj->state[0] ? sj->state : "state unknown", sj->seq);
        ingest_file(sj); /* events written while the daemon was away */
    }
    free(live);
    slog("executor ready; workers post events to %s", S.url);
    return 0;
}

static json_t *slurm_status(ac_daemon *d) {
    (void)d;
    int n = 0, pending = 0;
    for (sjob *sj = S.jobs; sj; sj = sj->next) {
        n++;
        pending += !strcmp(sj->state, "PENDING");
    }
    json_t *o = json_pack("{s:i,s:i,s:s}", "tracked", n, "pending", pending, "daemon_url", S.url);
    if (o && S.health[0]) json_object_set_new(o, "problem", json_string(S.health));
    return o;
}

static void slurm_stop(ac_daemon *d) {
    (void)d;
    S.stopping = 1; /* batch jobs run on; the next start re-attaches them */
}

static int slurm_busy(ac_daemon *d) {
    (void)d;
    return S.ncmds > 0;
}

const ac_executor executor_slurm = {.name = "slurm",
                                    .start = slurm_start,
                                    .place = slurm_place,
                                    .cancel = slurm_cancel,
                                    .tick = slurm_tick,
                                    .status = slurm_status,
                                    .stop = slurm_stop,
                                    .busy = slurm_busy};

void exec_job_view(ac_daemon *d, long job, json_t *o) {
    db_exec_job j;
    char ex[32];
    int found = 0;
    ac_err e = {{0}};
    if (db_exec_get(d->db, job, &j, ex, sizeof ex, &found, &e) || !found) return;
    if (!ex[0]) /* none recorded: a queued job goes to the configured executor, any other ran locally */
        snprintf(ex, sizeof ex, "%s", j.state == JOB_QUEUED ? exec_kind_name(d->cfg.exec.kind) : "local");
    json_object_set_new(o, "executor", json_string(ex));
    if (strcmp(ex, "slurm")) return;
    json_object_set_new(o, "slurm",
                        j.name[0] ? json_pack("{s:o,s:s,s:o}", "job_id",
                                              j.slurm_job_id > 0 ? json_integer(j.slurm_job_id) : json_null(), "name",
                                              j.name, "state", j.slurm_state[0] ? json_string(j.slurm_state) : json_null())
                                  : json_null());
}

/* ------------------------------------------------------------- worker events over HTTP */

int exec_worker_post(ac_daemon *d, long job, const char *secret, json_t *body, char *msg, size_t n, const char **field,
                     long *last_seq) {
    *field = NULL;
    sjob *sj = d->cfg.exec.kind == AC_EXEC_SLURM ? find(job) : NULL;
    if (!sj) {
        /* not a running Slurm job of this daemon: tell an ended one apart (with its own secret) */
        db_exec_job j;
        char ex[32];
        int found = 0;
        ac_err e = {{0}};
        if (db_exec_get(d->db, job, &j, ex, sizeof ex, &found, &e)) return snprintf(msg, n, "%s", e.msg), 503;
        if (!found || !jobsecret_matches(secret, j.secret_sha256))
            return snprintf(msg, n, "no such job, or not this job's secret"), 401;
        *last_seq = j.seq;
        return snprintf(msg, n, "job %ld is %s: it takes no more events", job, job_state_name(j.state)), 409;
    }
    if (!jobsecret_matches(secret, sj->secret_sha256)) return snprintf(msg, n, "not this job's secret"), 401;
    json_t *evs = json_object_get(body, "events"), *ev;
    if (!json_is_array(evs)) {
        *field = "events";
        return snprintf(msg, n, "events must be an array of {seq, kind, data}"), 400;
    }
    size_t i;
    long prev = 0;
    json_array_foreach(evs, i, ev) {
        json_t *seq = json_object_get(ev, "seq"), *data = json_object_get(ev, "data");
        const char *kind = json_string_value(json_object_get(ev, "kind"));
        if (!json_is_integer(seq) || json_integer_value(seq) <= prev || !kind || !kind[0] || strlen(kind) > 64 ||
            !data) {
            *field = "events";
            return snprintf(msg, n, "events[%zu] must be {seq (increasing integer), kind (string), data}", i), 400;
        }
        prev = (long)json_integer_value(seq);
    }
    long id = job;
    json_array_foreach(evs, i, ev) {
        long seq = (long)json_integer_value(json_object_get(ev, "seq"));
        if (!(sj = find(id))) break; /* ended on an earlier event */
        if (seq > sj->seq + 1 && ingest_file(sj)) break; /* a gap: the file has the missing ones */
        if (!(sj = find(id))) break;
        if (apply_event(sj, seq, json_string_value(json_object_get(ev, "kind")), json_object_get(ev, "data"))) {
            sj = NULL;
            break;
        }
    }
    sj = find(id);
    *last_seq = sj ? sj->seq : prev;
    return 200;
}
