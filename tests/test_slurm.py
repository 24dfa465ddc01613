#!/usr/bin/env python3
"""The Slurm executor against a real one-node Slurm cluster on localhost
(tests/slurm_cluster.sh: munged, slurmctld, slurmd, configs in a temp dir),
the daemon over real HTTP with a real SQLite file: jobs run as batch jobs of
the same worker binary, their events arrive over HTTP with the job's secret,
cancel is scancel, a SIGKILLed daemon re-attaches and loses nothing, a
node fault fails the running job with Slurm's reason. Skips, saying why,
where Slurm cannot be started (not root, packages missing)."""
import glob
import hashlib
import json
import os
import re
import signal
import sqlite3
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from harness import BUILD, ROOT, TINY, Daemon, Runner, sse_read, spec  # noqa: E402

R = Runner()
D = None
CLUSTER = None
SCRIPT = os.path.join(ROOT, "tests", "slurm_cluster.sh")


def long_spec():
    """A job that runs until it is stopped."""
    return spec(search={"steps": 100000, "seed": 1, "dnas_steps": 100000})


def slurm(*args):
    return subprocess.run(list(args), capture_output=True, text=True, timeout=30)


def job(i):
    st, j = D.req("GET", f"/v1/jobs/{i}")
    assert st == 200, (st, j)
    return j


def wait(i, pred, timeout=180, what="condition"):
    t0 = time.time()
    while time.time() - t0 < timeout:
        j = job(i)
        if pred(j):
            return j
        time.sleep(0.25)
    raise AssertionError(f"job {i}: no {what} after {timeout}s: {j['state']} ({j.get('reason')}) {j.get('slurm')}")


def wait_end(i, timeout=240):
    return wait(i, lambda j: j["state"] in ("succeeded", "failed", "cancelled"), timeout, "end")


def submit(body):
    st, j = D.req("POST", "/v1/jobs", body=body)
    assert st == 201, (st, j)
    return j["id"]


def events(i):
    st, e = D.req("GET", f"/v1/jobs/{i}/events?format=json&limit=10000")
    assert st == 200, (st, e)
    return e["events"]


def jobcomp():
    """(JobId, Name, JobState) of each line of Slurm's job completion log: one line each time a batch job ended,
    a requeue's end included."""
    try:
        lines = open(os.path.join(CLUSTER, "log", "jobcomp.txt")).read().splitlines()
    except OSError:
        return []
    out = []
    for ln in lines:
        f = dict(x.split("=", 1) for x in ln.split() if "=" in x)
        out.append((int(f.get("JobId", "0")), f.get("Name", ""), f.get("JobState", "")))
    return out


def jobcomp_names():
    """Names of the batch jobs Slurm's job completion log recorded."""
    return [n for _, n, _ in jobcomp()]


def one_batch_job(i, sid, ends):
    """Slurm knew job i as one batch job, sid, that ended `ends` times (requeues included): every completion-log
    line of its batch-job name has that id (the daemon submitted it once), and squeue lists one job of the name."""
    name = job(i)["slurm"]["name"]
    deadline = time.time() + 30  # slurmctld writes the line a moment after the end
    while len([r for r in jobcomp() if r[1] == name]) < ends and time.time() < deadline:
        time.sleep(0.5)
    rows = [r for r in jobcomp() if r[1] == name]
    assert len(rows) == ends and {r[0] for r in rows} == {sid}, (name, sid, rows)
    out = slurm("squeue", "--noheader", "--states=all", "--format=%i", f"--name={name}").stdout.split()
    assert out == [str(sid)], out
    return rows


def freeze_at(i, pred, what, timeout=240):
    """Wait until job i's events.jsonl holds an event pred accepts, then SIGSTOP its worker there (before it
    ended)."""
    t0 = time.time()
    seen = False
    while time.time() - t0 < timeout and not seen:
        seen = any(pred(e) for e in file_events(i))
        if seen:
            assert signal_worker(i, signal.SIGSTOP) == 1
            break
        time.sleep(0.02)
    assert seen, f"job {i}: no {what} after {timeout}s"
    assert not any(e["kind"] == "result" for e in file_events(i)), "the job ended before it could be requeued"


def release_requeued(sid, requeued_by):
    """Let requeued batch job sid start now instead of after Slurm's requeue delay, but never within the second
    of its requeue (requeued_by: a time after the requeue killed the first run). Killing the first run revokes the
    job's credentials on the node as of the kill request's time, in whole seconds (slurmd _rpc_terminate_job,
    slurm_cred_revoke), and slurmd refuses a launch whose credential is not newer (slurm_cred_revoked: ctime <=
    revoked, "Job credential revoked"); slurmctld then ends the batch job for good: FAILED, exit code 1, reason
    NonZeroExitCode ("Killing non-startable batch JobId", agent.c _thread_per_group_rpc). Slurm's own delay
    (cred_expire + 1 s, 121 s by default: job_mgr.c batch_requeue_fini, "the time stamp on the new batch launch
    credential must be larger than the time stamp on the revoke request") keeps a requeued job out of that
    second; a release by hand must too. That delay also lets slurmctld deliver the RPCs it still holds for the
    node, such as the kill of the first run sent while the node was down (retried once it answers: slurmd would
    kill the new run with it, "CANCELLED ... DUE TO NODE FAILURE", and the job end FAILED, JobLaunchFailure):
    sdiag's agent queue (retry list) and agent count must be empty too. (Slurm 22.05.)"""
    t0 = time.time()
    while time.time() - t0 < 90:
        out = slurm("sdiag").stdout
        busy = re.findall(r"^Agent (?:queue size|count):\s*(\d+)", out, re.M)
        if time.time() >= int(requeued_by) + 1 and len(busy) == 2 and busy == ["0", "0"]:
            break
        time.sleep(0.1)
    else:
        raise AssertionError("slurmctld still holds RPCs after 90 s: " + out[:400])
    assert slurm("scontrol", "update", f"JobId={sid}", "StartTime=now").returncode == 0


def freeze_after_search(i):
    """Stop job i's worker at its first stage after search (prune): its search checkpoint is on disk."""
    freeze_at(i, lambda e: e["kind"] == "stage" and e["data"]["stage"] == "prune", "prune stage")


def assert_resumed(i):
    """Job i ran twice in one batch job and the second run restored calibrate, profile and search instead of
    computing them: its stage events, its search progress (none after the second load) and its report, whose
    result equals the same spec's uninterrupted run."""
    j = wait_end(i)
    assert j["state"] == "succeeded", j["reason"]
    assert len([t for t in j["transitions"] if t["to"] == "running"]) == 1, j["transitions"]  # one job, requeued
    evs = events(i)
    st = [(e["data"]["stage"], bool(e["data"].get("resumed"))) for e in evs if e["kind"] == "stage"]
    k = st.index(("load", False), 1)  # the second run starts over at load
    assert [x[0] for x in st[:k]][:5] == ["load", "calibrate", "profile", "search", "prune"], st
    assert st[k:] == [("load", False), ("calibrate", True), ("profile", True), ("search", True), ("prune", False),
                      ("evaluate", False), ("export", False)], st
    assert [e["kind"] for e in evs].count("result") == 1
    second = [n for n, e in enumerate(evs) if e["kind"] == "stage" and e["data"]["stage"] == "load"][1]
    assert any(e["kind"] == "search" for e in evs[:second]) and not any(e["kind"] == "search" for e in evs[second:])
    states = [e["data"]["state"] for e in evs if e["kind"] == "slurm"]  # as the daemon saw the batch job go
    r = states.index("RUNNING")
    # submitted, ran, requeued (pending again), as the daemon's squeue polls saw it; that it ran again is the second
    # run's stage events above (load again, stages resumed): its RUNNING may fall between two polls when the resumed
    # run is quick (a clean-clone run saw PENDING, PENDING, RUNNING, PENDING, PENDING, then the result)
    assert "PENDING" in states[r + 1:], states
    st_, res = D.req("GET", f"/v1/jobs/{i}/result")
    assert res["resumed_stages"] == ["calibrate", "profile", "search"], res.get("resumed_stages")
    same_outcome(res, REF["result"])
    return j


def secret(i):
    return open(os.path.join(D.data, "jobs", str(i), "secret")).read().strip()


def post_events(i, body, sec):
    return D.req("POST", f"/v1/jobs/{i}/worker-events", body=body, headers={"Authorization": "Bearer " + sec})


def signal_worker(i, sig):
    """Send sig to the worker process(es) of job i, found by pid from their command line. The count signalled."""
    jobdir = os.path.join(D.data, "jobs", str(i))
    n = 0
    for p in glob.glob("/proc/[0-9]*/cmdline"):
        try:
            cmd = open(p, "rb").read().split(b"\0")
        except OSError:
            continue
        if b"run-job" in cmd and os.path.join(jobdir, "input.json").encode() in cmd:
            try:
                os.kill(int(p.split("/")[2]), sig)
                n += 1
            except OSError:
                pass
    return n


def stop_strays(i):
    """Stop the worker of job i if it outlived its batch job (a killed slurmd leaves it running)."""
    signal_worker(i, signal.SIGKILL)


# ------------------------------------------------------------------ tests

def test_config_shown_and_checked():
    st, c = D.req("GET", "/v1/config")
    assert st == 200, c
    assert c["executor"] == "slurm", c
    s = c["slurm"]
    assert s["partition"] == "debug" and s["time_limit"] == "00:30:00" and s["cpus_per_task"] == 1, s
    assert s["sbatch_options"] == ["--nice=0"] and s["requeue"] is True, s
    assert s["daemon_url"] == f"http://127.0.0.1:{D.port}", s
    assert "tokens" not in c and c["auth"] is False
    # bad executor configs: the daemon refuses to start and says which key
    for bad, word in [({"executor": "pbs"}, "executor"), ({"slurm": {"partition": "a b"}}, "slurm.partition"),
                      ({"slurm": {"sbatch_options": ["--output=/tmp/x"]}}, "--output"),
                      ({"slurm": {"surprise": 1}}, "slurm.surprise"), ({"slurm": {"poll_s": 0}}, "slurm.poll_s"),
                      ({"slurm": {"requeue": "yes"}}, "slurm.requeue"),
                      ({"slurm": {"sbatch_options": ["--no-requeue"]}}, "use slurm.requeue")]:
        d = tempfile.mkdtemp(prefix="acs_")
        cp = os.path.join(d, "c.json")
        json.dump(bad, open(cp, "w"))
        r = subprocess.run([os.path.join(BUILD, "autocompressd"), "--config", cp, "--db", os.path.join(d, "db"),
                            "--data-dir", d, "--listen", "127.0.0.1:0"], capture_output=True, text=True, timeout=30)
        assert r.returncode != 0 and word in r.stderr, (bad, r.returncode, r.stderr)


TIMED = {}


def test_time_limit_start():
    """A job whose batch job reaches its time limit. Slurm's least limit is one minute, checked every 30 s, so
    this job starts before the others and test_time_limit_fails_the_job checks its end later; its worker is
    stopped (SIGSTOP) once it runs, so it holds no CPU meanwhile. The limit is lowered as an admin would, with
    scontrol."""
    i = submit(long_spec())
    j = wait(i, lambda j: (j.get("slurm") or {}).get("state") == "RUNNING" and
             any(e["kind"] == "stage" for e in events(i)), 120, "RUNNING with a stage event")
    sid = j["slurm"]["job_id"]
    r = slurm("scontrol", "update", f"JobId={sid}", "TimeLimit=1")
    assert r.returncode == 0, r.stderr
    assert signal_worker(i, signal.SIGSTOP) == 1
    TIMED.update(id=i, sid=sid)


def test_time_limit_fails_the_job():
    assert TIMED, "test_time_limit_start did not run"
    i, sid = TIMED["id"], TIMED["sid"]
    j = wait_end(i, 180)
    assert j["state"] == "failed", j
    assert f"Slurm job {sid} reached its time limit" in j["reason"] and "TIMEOUT" in j["reason"], j["reason"]
    assert j["slurm"]["state"] == "TIMEOUT", j["slurm"]
    kinds = [e["kind"] for e in events(i)]
    assert "result" not in kinds and kinds.count("stage") >= 1, kinds


def test_job_runs_on_slurm():
    i = submit(spec())
    assert job(i)["executor"] == "slurm"  # queued or submitted: the configured executor
    # the SSE stream of a Slurm job reads as a local one's: stages in order, then the end
    st, evs, _ = sse_read(D.port, f"/v1/jobs/{i}/events",
                          until=lambda e, c: any(x["event"] == "state" and x["data"].get("state") in
                                                 ("succeeded", "failed") for x in e), max_s=240)
    assert st == 200
    j = wait_end(i)
    assert j["state"] == "succeeded", (j["reason"], open(os.path.join(D.data, "jobs", str(i), "worker.log")).read())
    sid = j["slurm"]["job_id"]
    assert j["executor"] == "slurm" and isinstance(sid, int) and sid > 0 and j["device"] == "slurm", j
    stages = [x["data"]["stage"] for x in evs if x["event"] == "stage"]
    assert stages == ["load", "calibrate", "profile", "search", "prune", "evaluate", "export"], stages
    kinds = [e["kind"] for e in events(i)]
    assert kinds.count("result") == 1 and "slurm" in kinds and "progress" in kinds, kinds
    st, res = D.req("GET", f"/v1/jobs/{i}/result")
    assert st == 200 and "autocompress" in res and "baseline" in res, res.keys()
    assert "resumed_stages" not in res, res["resumed_stages"]  # a job run once restores nothing
    assert sorted(os.listdir(os.path.join(D.data, "jobs", str(i), "checkpoint"))) == \
        ["calibrate.ckpt", "profile.ckpt", "search.ckpt"]
    REF["result"] = res
    t0 = time.time()  # the job ends on its result event; Slurm's batch job may still be RUNNING (the worker
    # exiting after it posted the result) or COMPLETING a moment
    while any(f"JobState={s}" in (out := slurm("scontrol", "show", "job", "-o", str(sid)).stdout)
              for s in ("RUNNING", "COMPLETING")) and time.time() - t0 < 30:
        time.sleep(0.2)
    assert "JobState=COMPLETED" in out and f"Name={j['slurm']['name']}" in out, out
    # the worker's stderr is the job's log, as for a local job
    st, log = D.req("GET", f"/v1/jobs/{i}/log")
    assert st == 200 and "worker for job" in log, log[:300]
    # the SQLite row holds the Slurm job id
    con = sqlite3.connect(D.db)
    row = con.execute("SELECT executor, slurm_job_id FROM jobs WHERE id = ?", (i,)).fetchone()
    con.close()
    assert row == ("slurm", sid), row


REF = {}


def file_events(i):
    """The job's events.jsonl as the worker wrote it (read directly: quicker than the daemon's copy)."""
    try:
        return [json.loads(ln) for ln in open(os.path.join(D.data, "jobs", str(i), "events.jsonl")) if ln.endswith("\n")]
    except OSError:
        return []


def same_outcome(a, b):
    """The fields of two reports of the same spec that do not depend on timing: calibration curves, both arms'
    architectures, predictions, feasibility and held-out perplexities, the baseline's and the chosen arm."""
    assert a["importance"] == b["importance"], "calibration curves differ"
    for arm in ("minitron", "autocompress"):
        for k in ("architecture", "predicted", "feasible", "predicted_loss_increase", "perplexity", "nll"):
            assert a[arm][k] == b[arm][k], (arm, k, a[arm][k], b[arm][k])
    assert a["baseline"]["perplexity"] == b["baseline"]["perplexity"]
    assert a["chosen"] == b["chosen"]


def test_requeue_resumes_after_its_last_stage():
    """A running batch job requeued once its Minitron arm was distilled (by an admin, as Slurm does itself after a
    lost node or a preemption; the daemon submits with --requeue), here held in SPECIAL_EXIT (scontrol requeuehold
    State=SpecialExit: pending and held until released, not an end) and then released: the job stays running,
    Slurm kills its worker and runs the same batch job again, and the new worker restores calibrate, profile,
    search and the distilled Minitron arm from their checkpoints instead of computing them again, then distils
    the autocompress arm, evaluates and exports. Slurm saw one batch job (one id, ended twice), not a second
    submission. (test_node_fault_requeues_or_fails requeues a job after its search and compares its result with
    the same spec run without interruption; test_checkpoint.c does so for the arms.)"""
    i = submit(spec(distill={"tokens": 2048}))
    freeze_at(i, lambda e: e["kind"] == "distill" and e["data"].get("arm") == "autocompress",
              "distillation of the autocompress arm (the Minitron arm's is done and kept)")
    sid = job(i)["slurm"]["job_id"]
    assert "Requeue=1" in slurm("scontrol", "show", "job", "-o", str(sid)).stdout  # submitted --requeue
    r = slurm("scontrol", "requeuehold", "State=SpecialExit", str(sid))
    requeued = time.time()
    assert r.returncode == 0, r.stderr
    j = wait(i, lambda j: j["state"] != "running" or (j.get("slurm") or {}).get("state") == "SPECIAL_EXIT", 60,
             "SPECIAL_EXIT after the requeue")
    assert j["state"] == "running" and "requeued, SPECIAL_EXIT" in j["reason"], (j["state"], j["reason"])
    time.sleep(1.5)  # three polls: still held, still running
    j = job(i)
    assert j["state"] == "running" and j["slurm"]["state"] == "SPECIAL_EXIT", (j["state"], j["reason"])
    assert slurm("scontrol", "release", str(sid)).returncode == 0
    wait(i, lambda j: (j.get("slurm") or {}).get("state") == "PENDING", 60, "PENDING once released")
    assert "requeued" in job(i)["reason"], job(i)["reason"]
    release_requeued(sid, requeued)
    j = wait_end(i)
    assert j["state"] == "succeeded", j["reason"]
    assert len([t for t in j["transitions"] if t["to"] == "running"]) == 1, j["transitions"]  # one job, requeued
    evs = events(i)
    second = [n for n, e in enumerate(evs) if e["kind"] == "stage" and e["data"]["stage"] == "load"][1]
    st = [(e["data"]["stage"], bool(e["data"].get("resumed"))) for e in evs[second:] if e["kind"] == "stage"]
    assert st == [("load", False), ("calibrate", True), ("profile", True), ("search", True), ("prune", False),
                  ("distill", False), ("evaluate", False), ("export", False)], st
    arms = lambda evs: {e["data"]["arm"] for e in evs if e["kind"] == "distill"}  # noqa: E731
    assert arms(evs[:second]) == {"minitron", "autocompress"} and arms(evs[second:]) == {"autocompress"}
    assert not any(e["kind"] == "search" for e in evs[second:])
    assert any(e["kind"] == "log" and e["data"].get("arm") == "minitron" and "restored" in e["data"]["message"]
               for e in evs[second:])
    st_, res = D.req("GET", f"/v1/jobs/{i}/result")
    assert res["resumed_stages"] == ["calibrate", "profile", "search", "distill.minitron"], res.get("resumed_stages")
    assert res["minitron"]["distill"]["loss_last"] and res["autocompress"]["distill"]["loss_last"]
    assert "Restarts=1" in slurm("scontrol", "show", "job", "-o", str(sid)).stdout
    one_batch_job(i, sid, 2)
    # the worker removed the distilled students once it had the result; the stage files stay
    assert sorted(os.listdir(os.path.join(D.data, "jobs", str(i), "checkpoint"))) == \
        ["calibrate.ckpt", "profile.ckpt", "search.ckpt"]


def test_requeue_released_in_its_second_fails_with_why():
    """What release_requeued avoids, done on purpose: a running batch job requeued just after a second begins and
    released (StartTime=now) the moment squeue shows it PENDING, within that second. slurmd refuses the launch
    ("Job credential revoked": its credential is no newer than the requeue's kill) and slurmctld ends the batch job
    FAILED (NonZeroExitCode) for good; the job fails with Slurm's state and says its worker never ran again. Where
    slurmctld's next scheduler pass (about once a second, at a phase of its own) or the release itself falls in the
    next second, Slurm runs the job again: it is cancelled and the test skips, saying so."""
    i = submit(long_spec())
    wait(i, lambda j: (j.get("slurm") or {}).get("state") == "RUNNING" and
         any(e["kind"] == "stage" for e in file_events(i)), 120, "RUNNING with a stage event")
    sid = job(i)["slurm"]["job_id"]
    assert signal_worker(i, signal.SIGSTOP) == 1  # quiet until Slurm kills it
    n_before = len(file_events(i))
    while time.time() % 1 > 0.05:
        time.sleep(0.005)
    requeued = time.time()
    assert slurm("scontrol", "requeue", str(sid)).returncode == 0
    while time.time() - requeued < 30 and \
            slurm("squeue", "--noheader", "--states=all", "--format=%T", f"--jobs={sid}").stdout.strip() != "PENDING":
        time.sleep(0.005)
    released = time.time()
    assert slurm("scontrol", "update", f"JobId={sid}", "StartTime=now").returncode == 0
    log = os.path.join(CLUSTER, "log", "slurmctld.log")
    refused = f"Killing non-startable batch JobId={sid}: Job credential revoked"
    t0 = time.time()
    while time.time() - t0 < 30 and refused not in open(log, errors="replace").read() and \
            len(file_events(i)) == n_before:  # a new run's first event: it was launched
        time.sleep(0.1)
    text = open(log, errors="replace").read()
    if refused not in text:
        assert D.req("DELETE", f"/v1/jobs/{i}")[0] == 202
        assert wait_end(i, 60)["state"] == "cancelled"
        # slurmctld starts a released job at its next scheduler pass, about once a second at a phase of its own
        # (controller.c _slurmctld_background), or its backfill scheduler does: where that fell in the next second,
        # Slurm ran the job again
        started = re.findall(r"\[[0-9-]+T([0-9:.]+)\] sched[^\n]*(?:Allocate|Started) JobId=%d " % sid,
                             text[text.rfind("Requeuing JobId=%d\n" % sid):])
        hms = lambda t: time.strftime("%H:%M:%S", time.localtime(t)) + f"{t % 1:.3f}"[1:]  # noqa: E731
        return (f"skip: requeued at {hms(requeued)}, released at {hms(released)}, and slurmctld's scheduler started "
                f"the job again at {started[-1] if started else '?'}, past that second: its launch went through")
    j = wait_end(i, 60)
    assert j["state"] == "failed", j
    assert f"Slurm job {sid} ended: FAILED (NonZeroExitCode), without a result" in j["reason"], j["reason"]
    assert "it ended before its worker ran again" in j["reason"], j["reason"]
    assert len(file_events(i)) == n_before  # no second run
    assert "JobState=FAILED" in slurm("scontrol", "show", "job", "-o", str(sid)).stdout


def test_worker_events_need_the_jobs_secret():
    a = submit(long_spec())
    b = submit(long_spec())
    wait(a, lambda j: (j.get("slurm") or {}).get("job_id"), 60, "Slurm job id")
    wait(b, lambda j: (j.get("slurm") or {}).get("job_id"), 60, "Slurm job id")
    ev = {"events": [{"seq": 10 ** 9, "kind": "log", "data": {"message": "forged"}}]}
    assert post_events(a, ev, "0" * 64)[0] == 401
    assert post_events(a, ev, secret(b))[0] == 401  # another job's secret
    st, r = D.req("POST", f"/v1/jobs/{a}/worker-events", body=ev)  # none
    assert st == 401, (st, r)
    st, r = post_events(a, {"events": "x"}, secret(a))
    assert st == 400 and r["error"]["field"] == "events", r
    st, r = post_events(a, {"events": [{"seq": 5, "kind": "log", "data": {}}, {"seq": 4, "kind": "log", "data": {}}]},
                        secret(a))
    assert st == 400, r
    assert all(e["data"].get("message") != "forged" for e in events(a))
    # a wrong secret is refused with the API's JSON error, the right one accepted (an empty batch: the daemon
    # answers with the last event it has from that worker)
    st, r = post_events(a, {"events": []}, secret(a)[:-1] + ("0" if secret(a)[-1] != "0" else "1"))
    assert st == 401 and r["error"]["code"] == "unauthorized" and "secret" in r["error"]["message"], (st, r)
    st, r = post_events(a, {"events": []}, secret(a))
    assert st == 200 and isinstance(r["last_seq"], int), (st, r)
    # the store keeps only each secret's SHA-256: neither secret is anywhere in the database's files
    con = sqlite3.connect(D.db)
    rows = dict((i, (p, h)) for i, p, h in con.execute(
        "SELECT id, exec_secret, exec_secret_sha256 FROM jobs WHERE id IN (?, ?)", (a, b)))
    con.close()
    for i in (a, b):
        assert rows[i] == (None, hashlib.sha256(secret(i).encode()).hexdigest()), (i, rows[i])
    assert_not_in_db_files([secret(a), secret(b)])
    for i in (a, b):
        assert D.req("DELETE", f"/v1/jobs/{i}")[0] == 202
    for i in (a, b):
        assert wait_end(i)["state"] == "cancelled"
    # an ended job takes no more events, even with its own secret
    st, r = post_events(a, ev, secret(a))
    assert st == 409, (st, r)
    # a secret an older daemon stored in plain text (migration 003) is hashed and cleared when the daemon opens
    # the database: the old secret still identifies its job, and the plain text is gone from the files
    D.stop()
    legacy = "legacy-plain-secret-" + os.urandom(8).hex()
    con = sqlite3.connect(D.db)
    con.execute("UPDATE jobs SET exec_secret = ?, exec_secret_sha256 = NULL WHERE id = ?", (legacy, a))
    con.commit()
    con.close()
    D.start()
    con = sqlite3.connect(D.db)
    row = con.execute("SELECT exec_secret, exec_secret_sha256 FROM jobs WHERE id = ?", (a,)).fetchone()
    con.close()
    assert row == (None, hashlib.sha256(legacy.encode()).hexdigest()), row
    assert post_events(a, ev, legacy)[0] == 409  # its own secret: the job ended
    assert post_events(a, ev, legacy + "x")[0] == 401
    assert_not_in_db_files([legacy])


def assert_not_in_db_files(secrets):
    """No secret appears in the SQLite database file or its WAL / shared-memory files."""
    for f in (D.db, D.db + "-wal", D.db + "-shm"):
        if os.path.exists(f):
            data = open(f, "rb").read()
            for sec in secrets:
                assert sec.encode() not in data, f"{sec[:8]}... found in {f}"


def test_cancel_is_scancel():
    i = submit(long_spec())
    j = wait(i, lambda j: (j.get("slurm") or {}).get("state") == "RUNNING" and
             any(e["kind"] == "stage" for e in events(i)), 120, "RUNNING with events")
    sid = j["slurm"]["job_id"]
    st, _ = D.req("DELETE", f"/v1/jobs/{i}")
    assert st == 202
    j = wait_end(i, 60)
    assert j["state"] == "cancelled" and j["reason"] == "cancelled by user", j["reason"]
    out = slurm("scontrol", "show", "job", "-o", str(sid)).stdout
    assert "JobState=CANCELLED" in out, out


def test_slurm_failure_is_job_failure():
    """A batch job cancelled behind the daemon's back (an admin's scancel) fails the job with Slurm's state."""
    i = submit(long_spec())
    j = wait(i, lambda j: (j.get("slurm") or {}).get("state") == "RUNNING", 120, "RUNNING")
    slurm("scancel", str(j["slurm"]["job_id"]))
    j = wait_end(i, 60)
    assert j["state"] == "failed" and "CANCELLED" in j["reason"] and str(j["slurm"]["job_id"]) in j["reason"], j


def test_unreachable_daemon_reads_the_job_directory():
    """Nodes that cannot reach the daemon's HTTP port: the events come from the job's events.jsonl instead."""
    D.stop()
    saved = json.loads(json.dumps(D.config))
    D.config["slurm"]["daemon_url"] = "http://127.0.0.1:9"  # discard port: nothing listens
    D.start()
    try:
        i = submit(spec())
        j = wait_end(i)
        assert j["state"] == "succeeded", j["reason"]
        evs = events(i)
        st = [e["data"]["stage"] for e in evs if e["kind"] == "stage"]
        assert st == ["load", "calibrate", "profile", "search", "prune", "evaluate", "export"], st
        assert [e["kind"] for e in evs].count("result") == 1
        log = open(os.path.join(D.data, "jobs", str(i), "worker.log")).read()
        assert "cannot deliver events" in log, log[-2000:]
    finally:
        D.stop()
        D.config = saved
        D.start()


def test_sigkill_daemon_reattaches():
    ids = [submit(spec(search={"steps": 50, "seed": s, "dnas_steps": 40})) for s in (11, 12, 13)]
    wait(ids[0], lambda j: any(e["kind"] == "stage" for e in events(ids[0])), 120, "first stage event")
    D.kill(signal.SIGKILL)
    time.sleep(6)  # the batch jobs run on; workers cannot post meanwhile
    D.start()
    for i in ids:
        j = wait_end(i)
        assert j["state"] == "succeeded", (i, j["reason"])
        evs = events(i)
        kinds = [e["kind"] for e in evs]
        assert kinds.count("result") == 1, kinds
        st = [e["data"]["stage"] for e in evs if e["kind"] == "stage"]
        assert st == ["load", "calibrate", "profile", "search", "prune", "evaluate", "export"], (i, st)
        running = [t for t in j["transitions"] if t["to"] == "running"]
        assert len(running) == 1, j["transitions"]  # never re-queued nor submitted twice
    # Slurm saw each exactly once (slurmctld appends to its completion log a moment after a job ends: wait for
    # every job's line, then check there is exactly one)
    deadline = time.time() + 30
    while True:
        names = jobcomp_names()
        counts = {i: len([n for n in names if n.startswith(f"ac-{i}-")]) for i in ids}
        if all(c >= 1 for c in counts.values()) or time.time() > deadline:
            break
        time.sleep(0.5)
    for i in ids:
        assert counts[i] == 1, (i, counts)


def test_jobs_slurm_forgot_end_from_their_files():
    """The daemon was down while its jobs ended and Slurm lost their records (here: slurmctld restarted with its
    state cleared; on a cluster: MinJobAge passed). squeue does not list them: a job whose events.jsonl holds its
    result succeeds with every event; one cancelled meanwhile, with no result, fails with the state Slurm's records
    keep (here no accounting database: sacct --completion reads the job completion log)."""
    a = submit(spec(search={"steps": 50, "seed": 21, "dnas_steps": 40}))
    b = submit(long_spec())
    for i in (a, b):
        wait(i, lambda j: (j.get("slurm") or {}).get("job_id") and any(e["kind"] == "stage" for e in events(i)), 120,
             "a stage event")
    sid_b = job(b)["slurm"]["job_id"]
    D.kill(signal.SIGKILL)
    slurm("scancel", str(sid_b))
    evfile = os.path.join(D.data, "jobs", str(a), "events.jsonl")
    t0 = time.time()
    while time.time() - t0 < 240 and '"kind":"result"' not in open(evfile).read():
        time.sleep(0.5)
    time.sleep(6)  # the worker gives up posting (post_flush_s 5) and its batch job ends
    subprocess.run([SCRIPT, "forget", CLUSTER], check=True, timeout=90)
    D.start()
    j = wait_end(a, 60)
    assert j["state"] == "succeeded", j["reason"]
    st = [e["data"]["stage"] for e in events(a) if e["kind"] == "stage"]
    assert st == ["load", "calibrate", "profile", "search", "prune", "evaluate", "export"], st
    assert [e["kind"] for e in events(a)].count("result") == 1
    # b's end is read from Slurm's records: this cluster keeps no accounting database, so sacct --completion
    # (its job completion log) says the batch job was CANCELLED
    j = wait_end(b, 60)
    assert j["state"] == "failed" and "no longer lists" in j["reason"] and str(sid_b) in j["reason"], j["reason"]
    assert "CANCELLED" in j["reason"] and "job completion log" in j["reason"], j["reason"]


def slurm_stepd_pids(sid):
    """The slurmstepd processes of Slurm job sid (their command line: "slurmstepd: [SID.batch]")."""
    out = []
    for p in glob.glob("/proc/[0-9]*/cmdline"):
        try:
            cmd = open(p, "rb").read()
        except OSError:
            continue
        if cmd.startswith(b"slurmstepd") and f"[{sid}.".encode() in cmd:
            out.append(int(p.split("/")[2]))
    return out


def node_back(timeout):
    """Wait until the restarted slurmd has registered: the node neither DOWN nor NOT_RESPONDING."""
    t0, st = time.time(), ""
    while time.time() - t0 < timeout:
        st = slurm("scontrol", "show", "node", "-o").stdout
        m = re.search(r"State=(\S+)", st)
        if m and not re.search(r"DOWN|NOT_RESPONDING|UNKNOWN|\*", m.group(1)):
            return
        time.sleep(0.2)
    raise AssertionError("the node did not come back: " + st[-400:])


def test_node_fault_requeues_or_fails():
    """The node dies (slurmd, the jobs' slurmstepd and workers SIGKILLed) under two running jobs. The one
    submitted as the daemon does by default (--requeue), frozen after its search, is requeued by Slurm: when the
    node is back it runs again in the same batch job, resumes from its checkpoints and succeeds. The one not
    requeueable (here made so with scontrol, as slurm.requeue false submits it) fails with NODE_FAIL and Slurm's
    words."""
    if "result" not in REF:
        test_job_runs_on_slurm()
    a = submit(long_spec())
    b = submit(spec())
    wait(a, lambda j: (j.get("slurm") or {}).get("state") == "RUNNING" and
         any(e["kind"] == "stage" for e in file_events(a)), 120, "RUNNING with a stage event")
    sid_a = job(a)["slurm"]["job_id"]
    assert slurm("scontrol", "update", f"JobId={sid_a}", "Requeue=0").returncode == 0
    assert signal_worker(a, signal.SIGSTOP) == 1
    freeze_after_search(b)
    sid_b = job(b)["slurm"]["job_id"]
    subprocess.run([SCRIPT, "kill-slurmd", CLUSTER], check=True, timeout=30)
    try:
        for sid in (sid_a, sid_b):
            for p in slurm_stepd_pids(sid):
                os.kill(p, signal.SIGKILL)
        for i in (a, b):
            signal_worker(i, signal.SIGKILL)
        j = wait_end(a, 120)
        assert j["state"] == "failed" and "NODE_FAIL" in j["reason"] and "lost its node" in j["reason"], j["reason"]
        wait(b, lambda j: (j.get("slurm") or {}).get("state") == "PENDING", 60, "PENDING after the node failed")
        assert job(b)["state"] == "running", job(b)
    finally:
        stop_strays(a)
        node = os.uname().nodename.split(".")[0]
        r = subprocess.run(["slurmd", "-f", os.path.join(CLUSTER, "slurm.conf"), "-N", node],
                           capture_output=True, text=True, timeout=30)
        assert r.returncode == 0, r.stderr
    # the node returns (ReturnToService=2) and the requeued job runs again, released once the node answers again
    node_back(30)
    release_requeued(sid_b, time.time())  # the node's registration may have killed the job's remains meanwhile
    assert_resumed(b)
    assert "Restarts=1" in slurm("scontrol", "show", "job", "-o", str(sid_b)).stdout
    one_batch_job(b, sid_b, 2)
    one_batch_job(a, sid_a, 1)


def test_load():
    """AC_SLURM_LOAD jobs at once (0, the default in make test: skipped): none lost, none run twice."""
    n = int(os.environ.get("AC_SLURM_LOAD", "0"))
    if n <= 0:
        return "skip: AC_SLURM_LOAD not set (the load test runs on request)"
    t0 = time.time()
    ids = [submit(spec(search={"steps": 5, "seed": s, "dnas_steps": 5}, eval={"ctx": 64, "windows": 1}))
           for s in range(n)]
    t_sub = time.time() - t0
    ends = {}
    while len(ends) < n and time.time() - t0 < 60 * 30:
        for i in ids:
            if i not in ends:
                j = job(i)
                if j["state"] in ("succeeded", "failed", "cancelled"):
                    ends[i] = (j, time.time() - t0)
        time.sleep(1)
    assert len(ends) == n, f"{n - len(ends)} jobs did not end"
    bad = {i: e[0]["reason"] for i, e in ends.items() if e[0]["state"] != "succeeded"}
    assert not bad, bad
    for i in ids:
        j = ends[i][0]
        assert len([t for t in j["transitions"] if t["to"] == "running"]) == 1, j["transitions"]
        assert [e["kind"] for e in events(i)].count("result") == 1
    time.sleep(1)
    names = jobcomp_names()
    per = {i: len([x for x in names if x.startswith(f"ac-{i}-")]) for i in ids}
    assert all(v == 1 for v in per.values()), per
    sids = [ends[i][0]["slurm"]["job_id"] for i in ids]
    assert len(set(sids)) == n
    wall = max(e[1] for e in ends.values())
    # queue wait: from the job's creation to its batch job RUNNING (the daemon's first "slurm" event saying so);
    # submit: from creation to the Slurm job id (the daemon's sbatch, one at a time)
    waits, subs = [], []
    for i in ids:
        evs = events(i)
        created = ends[i][0]["created_at"]
        run = [e["at"] for e in evs if e["kind"] == "slurm" and e["data"].get("state") == "RUNNING"]
        sub = [e["at"] for e in evs if e["kind"] == "slurm"]
        assert run and sub, (i, [e["kind"] for e in evs])
        waits.append(run[0] - created)
        subs.append(sub[0] - created)
    waits.sort()
    print(f"load: {n} jobs, submitted over HTTP in {t_sub:.1f} s, all ended in {wall:.1f} s "
          f"({n / wall * 60:.1f} jobs/min), {n} batch jobs in Slurm's completion log, 0 lost, 0 twice; "
          f"queue wait (created to RUNNING) median {waits[n // 2]:.1f} s, max {waits[-1]:.1f} s; "
          f"sbatch done after at most {max(subs):.1f} s", flush=True)


def main():
    global D, CLUSTER
    if not os.path.exists(os.path.join(TINY, "config.json")):
        print("SKIP all: tiny model not built (make tiny-model)")
        print("RESULT 0 0 1")
        return 0
    CLUSTER = tempfile.mkdtemp(prefix="acslurm_")
    t0 = time.time()
    r = subprocess.run([SCRIPT, "start", CLUSTER], capture_output=True, text=True, timeout=120)
    if r.returncode != 0:
        print("SKIP all: cannot start a one-node Slurm cluster here: " + (r.stderr.strip() or r.stdout.strip())[-400:])
        subprocess.run([SCRIPT, "stop", CLUSTER], timeout=60)
        print("RESULT 0 0 1")
        return 0
    os.environ["SLURM_CONF"] = os.path.join(CLUSTER, "slurm.conf")
    print(f"cluster up in {time.time() - t0:.1f} s ({CLUSTER})", flush=True)
    cfg = {"executor": "slurm", "cpu_slots": 1, "quiet_budget_s": 2,
           "model_roots": [os.path.dirname(os.path.dirname(TINY)), "/tmp"],
           "slurm": {"partition": "debug", "time_limit": "00:30:00", "cpus_per_task": 1, "poll_s": 0.5,
                     "post_flush_s": 5, "sbatch_options": ["--nice=0"]}}
    # AC_SLURM_ONLY=name,name: only those tests (and the config check), while working on one
    only = [x for x in os.environ.get("AC_SLURM_ONLY", "").split(",") if x]
    try:
        D = Daemon(config=cfg).start()
        for t in [test_config_shown_and_checked, test_time_limit_start, test_job_runs_on_slurm,
                  test_worker_events_need_the_jobs_secret, test_cancel_is_scancel, test_slurm_failure_is_job_failure,
                  test_unreachable_daemon_reads_the_job_directory, test_sigkill_daemon_reattaches,
                  test_requeue_resumes_after_its_last_stage, test_requeue_released_in_its_second_fails_with_why,
                  test_time_limit_fails_the_job,
                  test_jobs_slurm_forgot_end_from_their_files, test_node_fault_requeues_or_fails, test_load]:
            if only and t.__name__ not in only and t is not test_config_shown_and_checked:
                continue
            R.run(t)
    finally:
        if D and R.failed:
            print("--- daemon log (tail)")
            print(open(os.path.join(D.dir, "daemon.log"), errors="replace").read()[-4000:])
        if D and R.failed:  # the workers' own words: each failed job's worker.log (the batch job's output)
            for jd in sorted(glob.glob(os.path.join(D.data, "jobs", "*")), key=lambda p: int(os.path.basename(p))):
                try:
                    st, jj = D.req("GET", f"/v1/jobs/{os.path.basename(jd)}")
                except OSError:
                    break  # the daemon is down: its log above says why
                wl = os.path.join(jd, "worker.log")
                if st == 200 and jj.get("state") == "failed" and os.path.exists(wl):
                    print(f"--- job {os.path.basename(jd)} ({jj.get('reason')}): worker.log (tail)")
                    print(open(wl, errors="replace").read()[-1500:])
        if R.failed:  # Slurm's own words on what failed
            for f in ("slurmctld.log", "slurmd.log"):
                path = os.path.join(CLUSTER, "log", f)
                if os.path.exists(path):
                    print(f"--- {f} (tail)")
                    print(open(path, errors="replace").read()[-3000:])
        keep = os.environ.get("AC_SLURM_KEEP")  # a folder: a failed run's cluster logs and daemon folder go there
        if keep and R.failed:
            import shutil
            dst = tempfile.mkdtemp(prefix="fail_", dir=keep)
            shutil.copytree(os.path.join(CLUSTER, "log"), os.path.join(dst, "cluster-log"), dirs_exist_ok=True)
            if D:
                shutil.copytree(D.dir, os.path.join(dst, "daemon"), dirs_exist_ok=True)
            print(f"--- logs kept in {dst}")
        if D:
            D.cleanup()
        subprocess.run(["scancel", "--user=" + str(os.getuid())], capture_output=True, timeout=30)  # this cluster's
        time.sleep(1)
        subprocess.run([SCRIPT, "stop", CLUSTER], timeout=60)
        import shutil
        shutil.rmtree(CLUSTER, ignore_errors=True)
    R.done()


if __name__ == "__main__":
    sys.exit(main())
