#!/usr/bin/env python3
"""The CLI's daemon client (build/autocompress submit/status/list/logs/cancel/wait/report/download) against a real
daemon on loopback with its own SQLite file: exit statuses, --json, errors naming their field, Idempotency-Key, the
progress bar on a pseudo-terminal and plain lines otherwise, an event stream resumed with Last-Event-ID after the
daemon was killed and restarted, and a download checked byte for byte against the export directory."""
import hashlib
import http.client
import json
import math
import os
import pty
import re
import select
import signal
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from harness import BUILD, TINY, check_report_page, job_curves, run_with_daemon, same_curve, spec  # noqa: E402

CLI = os.path.join(BUILD, "autocompress")
D = None
CONFIG = {"sse_keepalive_s": 1, "cpu_slots": 1, "quiet_budget_s": 2,
          "model_roots": [os.path.dirname(os.path.dirname(TINY)), "/tmp"]}
DONE = []  # a succeeded job (test_submit_follow_plain_lines)


def long_spec(**kw):
    """A job that runs until cancelled."""
    return spec(search={"steps": 100000, "seed": 1, "dnas_steps": 100000}, **kw)


def write_spec(s, name):
    p = os.path.join(D.dir, name)
    with open(p, "w") as f:
        json.dump(s, f)
    return p


def env(**kw):
    e = dict(os.environ, AUTOCOMPRESS_SERVER=f"http://127.0.0.1:{D.port}")
    e.pop("AUTOCOMPRESS_TOKEN", None)
    e.update(kw)
    return e


def cli(*args, timeout=240, **kw):
    """Run the CLI: (exit status, stdout, stderr)."""
    p = subprocess.run([CLI, *args], capture_output=True, text=True, timeout=timeout, env=env(**kw))
    return p.returncode, p.stdout, p.stderr


def wait_running(job):
    D.wait_state(job, {"running"}, timeout=60)


def test_help_and_version():
    rc, out, _ = cli("--version")
    assert rc == 0 and re.fullmatch(r"autocompress \d+\.\d+\.\d+\n", out), out
    rc, out, _ = cli("--help")
    assert rc == 0 and "submit SPEC.json" in out and "eval MODEL_DIR" in out
    # every command the usage lists answers --help (a command added later included)
    listed = re.findall(r"^  autocompress ([a-z][a-z-]*)", out, re.M)
    assert set(listed) >= {"submit", "status", "list", "logs", "cancel", "wait", "report", "download", "eval", "tasks",
                           "compress", "estimate", "validate", "schema", "tokenize", "prune", "export-gguf",
                           "constraints", "model-card", "report-html"}, listed
    for cmd in listed:
        rc, out, _ = cli(cmd, "--help")
        assert rc == 0 and out.startswith(f"usage: autocompress {cmd}"), (cmd, rc, out)
    rc, _, err = cli("list", "--follow")  # an option of another command
    assert rc == 2 and "usage: autocompress list" in err, err
    rc, _, err = cli("status", "abc")
    assert rc == 2 and "not a job id" in err
    rc, _, err = cli("status")
    assert rc == 2


def test_unreachable_server():
    rc, _, err = cli("list", "--server", "http://127.0.0.1:1")
    assert rc == 4 and "127.0.0.1:1" in err, (rc, err)
    # --server wins over $AUTOCOMPRESS_SERVER; the variable wins over the default
    rc, _, _ = cli("list", "--server", f"127.0.0.1:{D.port}", AUTOCOMPRESS_SERVER="http://127.0.0.1:1")
    assert rc == 0


def test_submit_follow_plain_lines():
    p = write_spec(spec(name="plain"), "plain.json")
    rc, out, err = cli("submit", p, "--follow")
    assert rc == 0, (rc, out, err)
    m = re.match(r"job (\d+) queued\n", out)
    assert m, out
    job = int(m.group(1))
    DONE.append(job)
    assert re.search(rf"job {job}: stage 4/7 search \(43%\)", out), out
    assert "\r" not in out and "ETA" not in out, "a progress bar on a pipe"
    # a progress line at most every 10 s (each line's stamp: seconds since the command started, to 0.1 s)
    stamps = [float(t) for t in re.findall(rf"\[ *(\d+\.\d)s\] job {job}: \w+ \d+% of the stage", out)]
    assert all(b - a >= 9.9 for a, b in zip(stamps, stamps[1:])), stamps
    st, res = D.req("GET", f"/v1/jobs/{job}/result")
    last = out.strip().splitlines()[-1]
    assert last.startswith(f"job {job} succeeded: chosen {res['chosen']}, perplexity "), last
    assert f"{res[res['chosen']]['perplexity']:.3f}" in last and res["export"]["dir"] in last, last
    # status, list and report on the same job
    rc, out, _ = cli("status", str(job), "--json")
    j = json.loads(out)
    assert rc == 0 and j["id"] == job and j["state"] == "succeeded" and j["name"] == "plain"
    rc, out, _ = cli("status", str(job))
    assert rc == 0 and f"job {job} (plain): succeeded on cpu" in out and "queued -> running -> succeeded" in out, out
    rc, out, _ = cli("list", "--state", "succeeded", "--json")
    assert rc == 0 and job in [x["id"] for x in json.loads(out)["jobs"]]
    rc, out, _ = cli("list", "--state", "failed", "--json")
    assert rc == 0 and job not in [x["id"] for x in json.loads(out)["jobs"]]
    rc, out, err = cli("list", "--state", "weird")
    assert rc == 4 and "400 bad_request" in err and "(field state)" in err, err
    rc, out, _ = cli("report", str(job))
    rows = {ln.split()[0]: ln for ln in out.splitlines()[2:5]}
    assert set(rows) == {"baseline", "minitron", "autocompress"}, out
    assert rows[res["chosen"]].endswith("<- chosen") and sum("<- chosen" in r for r in rows.values()) == 1, out
    for arm in ("minitron", "autocompress"):
        assert f"{res[arm]['perplexity']:.3f}" in rows[arm], (arm, rows[arm])
    rc, out, _ = cli("report", str(job), "--json")
    assert rc == 0 and json.loads(out) == res


def test_worker_log_json():
    # logs --worker: the worker's text log as served; with --json one {"job", "line", "text"} object a line, whose
    # texts joined are that log line for line (the --json of every other command is JSON too)
    job = DONE[0]
    st, _ = D.req("GET", f"/v1/jobs/{job}/log")
    rc, text, _ = cli("logs", str(job), "--worker")
    assert rc == 0 and st == 200 and text.strip(), (rc, st, text)
    rc, out, err = cli("logs", str(job), "--worker", "--json")
    assert rc == 0, (rc, err)
    rows = [json.loads(ln) for ln in out.splitlines()]  # every line is a JSON object
    assert rows and all(set(r) == {"job", "line", "text"} and r["job"] == job for r in rows), rows[:3]
    assert [r["line"] for r in rows] == list(range(1, len(rows) + 1))
    assert [r["text"] for r in rows] == text.rstrip("\n").split("\n"), (rows[:3], text[:300])
    rc, out, _ = cli("logs", "999999", "--worker", "--json")
    assert rc != 0 and json.loads(out)["error"]["code"] == "not_found", out


def test_list_pages():
    # three pages of one job: every job once, in id order
    st, jobs = D.req("GET", "/v1/jobs?limit=1000")
    rc, out, _ = cli("list", "--json")
    assert rc == 0 and [x["id"] for x in json.loads(out)["jobs"]] == [x["id"] for x in jobs["jobs"]]
    rc, out, _ = cli("list", "--limit", "1", "--json")
    assert rc == 0 and len(json.loads(out)["jobs"]) == 1


def test_submit_errors_name_the_field():
    p = write_spec(spec(constraints={"max_tpot_ms": "fast"}), "bad.json")
    rc, out, err = cli("submit", p)
    assert rc == 4 and "400 invalid_spec" in err and "(field constraints.max_tpot_ms)" in err, (rc, err)
    rc, out, err = cli("submit", p, "--json")
    assert rc == 4 and json.loads(out)["error"]["field"] == "constraints.max_tpot_ms", out
    # what the worker would refuse later, refused at submit (and by /v1/validate) naming the field
    foreign = os.path.join(D.dir, "someone-elses")
    os.makedirs(foreign, exist_ok=True)
    with open(os.path.join(foreign, "notes.txt"), "w") as f:
        f.write("x")
    bad = [(spec(constraints={"max_params": 20000}), "constraints.max_params", "24592"),  # 768 x 16 x 2 + 16
           (spec(constraints={"max_params": 190000}, search={"steps": 5, "prune_hidden": False}),
            "constraints.max_params", "196736"),  # 768 x 128 x 2 + 128
           (spec(output=foreign), "output", "notes.txt"),
           (spec(target={"device": "Z9000"}), "target.device", "Z9000")]
    for s, field, said in bad:
        st, r = D.req("POST", "/v1/validate", body=s)
        assert st == 400 and r["error"]["field"] == field and said in r["error"]["message"], (field, st, r)
        rc, out, err = cli("submit", write_spec(s, "refused.json"))
        assert rc == 4 and f"(field {field})" in err and said in err, (field, rc, err)
    assert D.req("POST", "/v1/validate", body=spec(constraints={"max_params": 30000}))[0] == 200  # reachable: not refused
    assert D.req("POST", "/v1/validate", body=spec(output=os.path.join(foreign, "new")))[0] == 200
    with open(os.path.join(D.dir, "broken.json"), "w") as f:
        f.write("{not json")
    rc, _, err = cli("submit", os.path.join(D.dir, "broken.json"))
    assert rc == 2 and "broken.json" in err


def test_idempotency_key():
    p = write_spec(spec(name="idem"), "idem.json")
    # 201 Created with Location (the client's Location header seen over real HTTP)
    import http.client
    conn = http.client.HTTPConnection("127.0.0.1", D.port, timeout=30)
    with open(write_spec(spec(name="loc"), "loc.json")) as fh:
        conn.request("POST", "/v1/jobs", body=fh.read(), headers={"Content-Type": "application/json"})
    resp = conn.getresponse()
    created = json.loads(resp.read())
    assert resp.status == 201 and resp.getheader("Location") == f"/v1/jobs/{created['id']}", resp.getheaders()
    conn.close()
    rc, out1, _ = cli("submit", p, "--idempotency-key", "k-123", "--json")
    rc2, out2, _ = cli("submit", p, "--idempotency-key", "k-123")
    j1 = json.loads(out1)
    assert rc == 0 and rc2 == 0 and out2.startswith(f"job {j1['id']} (an earlier submission"), out2
    p2 = write_spec(spec(name="other"), "idem2.json")
    rc, _, err = cli("submit", p2, "--idempotency-key", "k-123")
    assert rc == 4 and "409 idempotency_conflict" in err, err
    rc, out, _ = cli("wait", str(j1["id"]), "--json")
    assert rc == 0 and json.loads(out)["state"] == "succeeded"


def test_follow_json_matches_the_store():
    p = write_spec(spec(), "json.json")
    rc, out, err = cli("submit", p, "--follow", "--json")
    assert rc == 0, (rc, err)
    lines = [json.loads(ln) for ln in out.splitlines()]
    final = lines[-1]
    assert final["state"] == "succeeded", final
    evs = lines[:-1]
    st, stored = D.req("GET", f"/v1/jobs/{final['id']}/events?format=json")
    assert [(e["id"], e["kind"], e["data"]) for e in evs] == [(e["id"], e["kind"], e["data"]) for e in stored["events"]]
    assert evs[-1]["kind"] == "state" and evs[-1]["data"]["state"] == "succeeded"
    rc, out, _ = cli("logs", str(final["id"]), "--json")
    assert [json.loads(ln)["id"] for ln in out.splitlines()] == [e["id"] for e in stored["events"]]
    # logs --follow on an ended job: every event from the stream, then exit 0 with the outcome
    rc, out, err = cli("logs", str(final["id"]), "--follow")
    assert rc == 0 and [int(ln.split()[0]) for ln in out.splitlines()] == [e["id"] for e in stored["events"]], (rc, err)


def run_pty(args, timeout=240):
    """Run the CLI with stdout on a pseudo-terminal: (exit status, everything it wrote)."""
    master, slave = pty.openpty()
    p = subprocess.Popen([CLI, *args], stdout=slave, stderr=slave, stdin=subprocess.DEVNULL, env=env())
    os.close(slave)
    buf, t0 = b"", time.time()
    while time.time() - t0 < timeout:
        r, _, _ = select.select([master], [], [], 0.5)
        if r:
            try:
                chunk = os.read(master, 65536)
            except OSError:
                break
            if not chunk:
                break
            buf += chunk
        elif p.poll() is not None:
            break
    os.close(master)
    return p.wait(timeout=10), buf.decode(errors="replace")


def test_progress_bar_on_a_tty():
    # a few hundred gate steps: the search stage lasts long enough for bars
    s = spec()
    s["search"]["dnas_steps"] = 150
    rc, out = run_pty(["submit", write_spec(s, "tty.json"), "--follow"])
    assert rc == 0, out
    bars = re.findall(r"\r\x1b\[Kjob (\d+) \[(\d)/7 (\w+) *\] \[([#.]{30})\] +(\d+)%  (\S+) elapsed  ETA (\S+)", out)
    assert bars, out
    stages = [b[2] for b in bars]
    assert "search" in stages, stages
    pct = [int(b[4]) for b in bars]
    assert pct == sorted(pct), pct
    # the stages count equally: stage i of 7 spans (i - 1)/7 .. i/7 of the job (rounded to a whole percent)
    assert all(math.floor(100 * (int(b[1]) - 1) / 7) <= int(b[4]) <= math.ceil(100 * int(b[1]) / 7) for b in bars), \
        [(b[1], b[4]) for b in bars]
    assert any(b[6] != "?" for b in bars), "no ETA ever"
    job = bars[0][0]
    assert re.search(rf"job {job} succeeded: chosen \w+", out), out
    # no plain stage lines on a terminal (the job's end is a plain line in both modes: "[  12.3s] job N: ...")
    assert not re.search(r"\[ *\d+\.\ds\] job \d+: stage \d", out), "plain stage lines on a terminal"


def test_failed_job_exit_status():
    # a job the worker fails: the tokenizer goes missing between submit and run (a copy of the model whose
    # tokenizer.json is removed as soon as the job is queued behind a running one)
    hold = json.loads(cli("submit", write_spec(long_spec(), "hold.json"), "--json")[1])["id"]
    wait_running(hold)
    mdir = os.path.join("/tmp", f"ac_cli_model_{os.getpid()}")
    subprocess.run(["cp", "-r", TINY, mdir], check=True)
    try:
        rc, out, _ = cli("submit", write_spec(spec(model=mdir), "fail.json"), "--json")
        job = json.loads(out)["id"]
        os.remove(os.path.join(mdir, "tokenizer.json"))
        os.remove(os.path.join(mdir, "model.safetensors"))
        assert cli("cancel", str(hold))[0] == 0
        rc, out, err = cli("wait", str(job))
        assert rc == 1 and f"job {job} failed: " in err, (rc, out, err)
        st, j = D.req("GET", f"/v1/jobs/{job}")
        assert j["state"] == "failed" and j["reason"] in err
        rc, out, err = cli("logs", str(job), "--follow")  # a pipeline following the log sees the failure too
        assert rc == 1 and f"job {job} failed: {j['reason']}" in err, (rc, err)
    finally:
        subprocess.run(["rm", "-rf", mdir])
    rc, out, err = cli("wait", str(hold))
    assert rc == 3 and f"job {hold} cancelled" in err, (rc, err)


def test_cancel_and_wait_timeout():
    rc, out, _ = cli("submit", write_spec(long_spec(name="long"), "long.json"), "--json")
    job = json.loads(out)["id"]
    wait_running(job)
    t0 = time.time()
    rc, out, err = cli("wait", str(job), "--timeout", "2")
    assert rc == 5 and "still running" in err and time.time() - t0 < 30, (rc, err)
    waiter = subprocess.Popen([CLI, "wait", str(job)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                              env=env())
    time.sleep(1)
    rc, out, err = cli("cancel", str(job))
    assert rc == 0 and f"job {job} cancelling" in out, (rc, out, err)
    out, err = waiter.communicate(timeout=60)
    assert waiter.returncode == 3 and f"job {job} cancelled" in err, (waiter.returncode, out, err)
    rc, _, err = cli("cancel", str(job))
    assert rc == 4 and "409 conflict" in err
    rc, _, err = cli("cancel", "999999")
    assert rc == 4 and "404 not_found" in err


def test_logs_follow_resumes_after_daemon_restart():
    rc, out, _ = cli("submit", write_spec(long_spec(name="survivor"), "surv.json"), "--json")
    job = json.loads(out)["id"]
    wait_running(job)
    f = subprocess.Popen([CLI, "logs", str(job), "--follow"], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                         text=True, env=env())
    time.sleep(2)
    st, before = D.req("GET", f"/v1/jobs/{job}/events?format=json")
    D.kill(signal.SIGKILL)  # the stream drops mid-job
    time.sleep(1.5)
    D.start()  # same port, same SQLite file: the job is requeued and runs again
    D.wait_state(job, {"running"}, timeout=30)
    time.sleep(2)
    assert cli("cancel", str(job))[0] == 0
    out, err = f.communicate(timeout=90)
    assert f.returncode == 3 and f"job {job} cancelled" in err, (f.returncode, err)  # the outcome, as wait's
    ids = [int(ln.split()[0]) for ln in out.splitlines()]
    st, stored = D.req("GET", f"/v1/jobs/{job}/events?format=json&limit=10000")
    # every stored event once, in order: nothing lost across the drop, nothing replayed twice
    assert ids == [e["id"] for e in stored["events"]], (ids[:5], len(ids), len(stored["events"]))
    m = re.search(r"event stream dropped; resuming after event (\d+)", err)
    assert m and int(m.group(1)) >= before["events"][-1]["id"], err
    last = out.splitlines()[-1].split(" ", 2)
    assert last[1] == "state" and json.loads(last[2])["state"] == "cancelled", last


def sha(p):
    with open(p, "rb") as f:
        return hashlib.sha256(f.read()).hexdigest()


def test_download():
    rc, out, err = cli("submit", write_spec(spec(), "dl.json"), "--follow", "--json")
    job = json.loads(out.splitlines()[-1])["id"]
    st, res = D.req("GET", f"/v1/jobs/{job}/result")
    src = res["export"]["dir"]
    # a symbolic link and a dot file in the export directory are not served
    os.symlink("/etc/passwd", os.path.join(src, "passwd"))
    with open(os.path.join(src, ".hidden"), "w") as fh:
        fh.write("x")
    dst = os.path.join(D.dir, "download")
    rc, out, err = cli("download", str(job), dst, "--json")
    assert rc == 0, (rc, err)
    got = json.loads(out)
    names = sorted(os.path.basename(x["path"]) for x in got["files"])
    want = sorted(n for n in os.listdir(src) if not n.startswith(".") and not os.path.islink(os.path.join(src, n)))
    assert names == want and "model.safetensors" in names and "report.json" in names, (names, want)
    for n in names:
        assert sha(os.path.join(dst, n)) == sha(os.path.join(src, n)), n
    assert sorted(os.listdir(dst)) == names, "a .part file left behind"
    for bad in ("passwd", ".hidden", "..%2Fjobs.db", "%2Fetc%2Fpasswd", "nope"):
        st, _ = D.req("GET", f"/v1/jobs/{job}/files/{bad}")
        assert st == 404, (bad, st)
    # a job that is still running has no files yet
    rc, out, _ = cli("submit", write_spec(long_spec(), "dl2.json"), "--json")
    j2 = json.loads(out)["id"]
    rc, _, err = cli("download", str(j2), dst)
    assert rc == 4 and "409 not_finished" in err, err
    rc, out, _ = cli("cancel", str(j2), "--json")  # the API's answer as it is
    got = json.loads(out)
    assert rc == 0 and got["id"] == j2 and got["cancel_requested"] is True, got
    D.wait_state(j2, {"cancelled"})


def test_report_html_served_written_and_opened():
    job = DONE[0] if DONE else json.loads(cli("submit", write_spec(spec(), "rh.json"), "--follow", "--json")[1]
                                          .splitlines()[-1])["id"]
    st, rep = D.req("GET", f"/v1/jobs/{job}/result")
    c = http.client.HTTPConnection("127.0.0.1", D.port, timeout=30)
    c.request("GET", f"/v1/jobs/{job}/report.html")
    resp = c.getresponse()
    page = resp.read().decode()
    c.close()
    assert resp.status == 200 and resp.getheader("Content-Type") == "text/html; charset=utf-8", resp.getheaders()
    assert "default-src 'none'" in resp.getheader("Content-Security-Policy")
    t = check_report_page(page, rep)
    # the search loss drawn through every search event of the gate trainer, as the job's events hold them
    search, distill, label = job_curves(D, job)
    assert len(search) >= 2 and not distill and list(t.curves) == [label], (len(search), list(t.curves))
    assert same_curve(t.curves[label], search), (t.curves[label][:3], search[:3])
    # the job's own file is the same page: the job drew it from the events it emitted
    out = rep["export"]["dir"]
    with open(os.path.join(out, "report.html")) as f:
        own = f.read()
    assert own == page
    # from report.json alone: the same tables, no curve (report.json keeps no per-step loss)
    r = subprocess.run([CLI, "report-html", os.path.join(out, "report.json")], capture_output=True, text=True)
    assert r.returncode == 0 and "Not drawn here" in r.stdout and "<polyline" not in r.stdout
    check_report_page(r.stdout, rep)
    # --open: saved to a new file, handed to xdg-open (a stand-in on PATH that records its argument)
    bindir = os.path.join(D.dir, "bin")
    os.makedirs(bindir, exist_ok=True)
    seen = os.path.join(D.dir, "xdg-open.arg")
    with open(os.path.join(bindir, "xdg-open"), "w") as f:
        f.write(f"#!/bin/sh\nprintf '%s' \"$1\" > {seen}\n")
    os.chmod(os.path.join(bindir, "xdg-open"), 0o755)
    rc, outp, err = cli("report", str(job), "--open", PATH=bindir, TMPDIR=D.dir)
    path = outp.splitlines()[0]
    assert rc == 0 and outp.splitlines()[1] == "opened with xdg-open", (rc, outp, err)
    with open(seen) as f:
        assert f.read() == path
    with open(path) as f:
        assert os.path.dirname(path) == D.dir and f.read() == page
    rc, outp, _ = cli("report", str(job), "--open", "--json", PATH=os.path.join(D.dir, "nothing"), TMPDIR=D.dir)
    j = json.loads(outp)
    assert rc == 0 and j["opened"] is False and j["path"] != path and open(j["path"]).read() == page, j
    rc, outp, _ = cli("report", str(job), "--open", PATH=os.path.join(D.dir, "nothing"), TMPDIR=D.dir)
    assert rc == 0 and "no xdg-open" in outp.splitlines()[1], outp
    rc, _, err = cli("report", "999999", "--open")
    assert rc == 4 and "404 not_found" in err, err


def test_head_and_delete_without_content_type():
    job = DONE[0] if DONE else 1
    for path, ctype in ((f"/v1/jobs/{job}", "application/json"), (f"/v1/jobs/{job}/report.html", "text/html"),
                        (f"/v1/jobs/{job}/events", "text/event-stream"), ("/openapi.json", "application/json"),
                        ("/", "text/html")):
        c = http.client.HTTPConnection("127.0.0.1", D.port, timeout=10)
        c.request("GET", path)
        g = c.getresponse()
        body = g.read()
        c.request("HEAD", path)  # the same connection: an answer without its body keeps it usable
        h = c.getresponse()
        assert h.status == 200 and h.read() == b"" and h.getheader("Content-Type").startswith(ctype), (path, h.status)
        if not path.endswith("/events"):
            assert int(h.getheader("Content-Length")) == len(body), path
        c.close()
    assert D.req("HEAD", "/v1/jobs/999999")[0] == 404
    assert D.req("HEAD", "/v1/validate")[0] == 405  # POST only
    rc, out, _ = cli("submit", write_spec(long_spec(), "del.json"), "--json")
    j = json.loads(out)["id"]
    c = http.client.HTTPConnection("127.0.0.1", D.port, timeout=10)
    c.request("DELETE", f"/v1/jobs/{j}")  # no body, no Content-Type
    resp = c.getresponse()
    got = json.loads(resp.read())
    assert resp.status == 202 and got["cancel_requested"] is True, (resp.status, got)
    c.request("DELETE", f"/v1/jobs/{j}", headers={"Origin": "http://evil.example"})  # still no cross-site cancel
    resp = c.getresponse()
    assert resp.status == 403, resp.status
    resp.read()
    c.close()
    D.wait_state(j, {"cancelled"})


def main():
    if not os.path.exists(CLI):
        print("SKIP all: build/autocompress not built")
        print("RESULT 0 0 1")
        sys.exit(0)
    run_with_daemon([test_help_and_version, test_unreachable_server, test_submit_follow_plain_lines, test_worker_log_json,
                     test_list_pages,
                     test_report_html_served_written_and_opened, test_head_and_delete_without_content_type,
                     test_submit_errors_name_the_field, test_idempotency_key, test_follow_json_matches_the_store,
                     test_progress_bar_on_a_tty, test_failed_job_exit_status, test_cancel_and_wait_timeout,
                     test_logs_follow_resumes_after_daemon_restart, test_download], globals(), config=CONFIG)


if __name__ == "__main__":
    main()
