#!/usr/bin/env python3
"""The Python client (clients/python, standard library only) against a real daemon on loopback with its own SQLite
file: installed offline with pip into a scratch folder (when pip is there), then submit / wait / events / report /
download / cancel / jobs / estimate / validate, errors as ApiError with the HTTP status and the field, failed and
cancelled jobs as JobFailed, a wait timeout, and the event iterator resumed with Last-Event-ID across a SIGKILL and
restart of the daemon (every stored event once, in order)."""
import hashlib
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from harness import ROOT, TINY, run_with_daemon, spec  # noqa: E402

D = None
ac = None  # the installed autocompress_client module


def long_spec(**kw):
    return spec(search={"steps": 100000, "seed": 1, "dnas_steps": 100000}, **kw)


def client(**kw):
    return ac.Client(f"http://127.0.0.1:{D.port}", **kw)


def install(target):
    """pip install ./clients/python into target without the network, as a user types it (pip's isolated build
    environment: the in-tree backend needs nothing from an index); the module from there (or from the source tree
    when pip is missing: 'skip' for that part)."""
    src = os.path.join(ROOT, "clients", "python")
    work = tempfile.mkdtemp(prefix="acpy_src_")
    shutil.copytree(src, os.path.join(work, "python"))  # pip builds in the tree: a copy keeps the checkout clean
    p = subprocess.run([sys.executable, "-m", "pip", "install", "--no-index", "--no-deps",
                        "--quiet", "--target", target, os.path.join(work, "python")], capture_output=True, text=True)
    shutil.rmtree(work, ignore_errors=True)
    if p.returncode != 0 and "No module named pip" in p.stderr:
        sys.path.insert(0, src)
        return "skip: pip missing: the offline install was not checked (the module from the source tree)"
    assert p.returncode == 0, p.stderr
    sys.path.insert(0, target)
    return None


def test_installs_offline():
    global ac
    target = tempfile.mkdtemp(prefix="acpy_")
    r = install(target)
    import autocompress_client
    ac = autocompress_client
    if r is None:
        assert os.path.dirname(ac.__file__) == os.path.join(target, "autocompress_client"), ac.__file__
        assert os.path.exists(os.path.join(target, "autocompress_client", "py.typed"))
        with open(os.path.join(target, f"autocompress_client-{ac.__version__}.dist-info", "METADATA")) as f:
            meta = f.read()
        assert f"\nName: autocompress-client\nVersion: {ac.__version__}\n" in meta, meta[:300]
    return r


def test_submit_wait_report_download():
    c = client()
    assert c.health()["status"] == "ok" and c.validate(spec()) == {"ok": True}
    job = c.submit(spec(name="py"))
    assert job["state"] == "queued" and job["name"] == "py"
    seen = []
    final = c.wait(job["id"], on_event=seen.append)
    assert final["state"] == "succeeded", final
    st, stored = D.req("GET", f"/v1/jobs/{job['id']}/events?format=json")
    assert [(e.id, e.kind, e.data) for e in seen] == [(e["id"], e["kind"], e["data"]) for e in stored["events"]]
    rep = c.report(job["id"])
    st, want = D.req("GET", f"/v1/jobs/{job['id']}/result")
    assert rep == want and rep["chosen"] in ("minitron", "autocompress")
    st, page = D.req("GET", f"/v1/jobs/{job['id']}/report.html")
    assert st == 200 and c.report_html(job["id"]) == page and "(chosen, exported)" in page
    # events() after the end: the whole stream again, then it stops
    assert [e.id for e in c.events(job["id"])] == [e.id for e in seen]
    assert [e.id for e in c.events(job["id"], after=seen[3].id)] == [e.id for e in seen[4:]]
    dst = os.path.join(D.dir, "py_download")
    paths = c.download(job["id"], dst)
    src = rep["export"]["dir"]
    assert sorted(os.path.basename(p) for p in paths) == sorted(os.listdir(src)) == sorted(os.listdir(dst))
    for p in paths:
        with open(p, "rb") as a, open(os.path.join(src, os.path.basename(p)), "rb") as b:
            assert hashlib.sha256(a.read()).digest() == hashlib.sha256(b.read()).digest(), p
    assert "worker for job" in c.log(job["id"])


def test_errors_carry_status_and_field():
    c = client()
    try:
        c.submit(spec(constraints={"max_tpot_ms": "fast"}))
        raise AssertionError("no ApiError")
    except ac.ApiError as e:
        assert e.status == 400 and e.code == "invalid_spec" and e.field == "constraints.max_tpot_ms", e
        assert e.body["error"]["field"] == "constraints.max_tpot_ms" and "constraints.max_tpot_ms" in str(e)
    try:
        c.job(999999)
        raise AssertionError("no ApiError")
    except ac.ApiError as e:
        assert e.status == 404 and e.code == "not_found" and e.field is None
    try:
        list(c.jobs(state="weird"))
        raise AssertionError("no ApiError")
    except ac.ApiError as e:
        assert e.status == 400 and e.field == "state"
    try:
        ac.Client("http://127.0.0.1:1").health()
        raise AssertionError("no ConnectionError")
    except ConnectionError as e:
        assert "127.0.0.1:1" in str(e)
    # $AUTOCOMPRESS_SERVER is the default server
    os.environ["AUTOCOMPRESS_SERVER"] = f"127.0.0.1:{D.port}"
    try:
        assert ac.Client().url == f"http://127.0.0.1:{D.port}" and ac.Client().health()["status"] == "ok"
    finally:
        del os.environ["AUTOCOMPRESS_SERVER"]


def test_idempotency_jobs_estimate_devices():
    c = client()
    a = c.submit(spec(name="idem"), idempotency_key="py-1")
    b = c.submit(spec(name="idem"), idempotency_key="py-1")
    assert a["id"] == b["id"]
    try:
        c.submit(spec(name="other"), idempotency_key="py-1")
        raise AssertionError("no 409")
    except ac.ApiError as e:
        assert e.status == 409 and e.code == "idempotency_conflict"
    c.wait(a["id"])
    st, page = D.req("GET", "/v1/jobs?limit=1000")
    assert [j["id"] for j in c.jobs(page_size=1)] == [j["id"] for j in page["jobs"]]
    assert all(j["state"] == "succeeded" for j in c.jobs(state="succeeded"))
    est = c.estimate({"model": TINY, "target": {"device": "H100", "workload": {"batch": 8}}})
    st, want = D.req("POST", "/v1/estimate", body={"model": TINY, "target": {"device": "H100", "workload": {"batch": 8}}})
    assert est == want
    assert c.devices()["local"][0]["id"] == "cpu"
    assert c.openapi()["openapi"].startswith("3.1")


def test_failed_cancelled_and_timeout():
    c = client()
    hold = c.submit(long_spec())
    D.wait_state(hold["id"], {"running"}, timeout=60)
    try:
        c.wait(hold["id"], timeout=1.5)
        raise AssertionError("no TimeoutError")
    except TimeoutError:
        pass
    mdir = os.path.join("/tmp", f"ac_py_model_{os.getpid()}")
    shutil.copytree(TINY, mdir)
    try:
        bad = c.submit(spec(model=mdir))
        os.remove(os.path.join(mdir, "model.safetensors"))
        assert c.cancel(hold["id"])["cancel_requested"] is True
        try:
            c.wait(bad["id"])
            raise AssertionError("no JobFailed")
        except ac.JobFailed as e:
            assert e.state == "failed" and e.job["id"] == bad["id"] and e.reason, e
    finally:
        shutil.rmtree(mdir, ignore_errors=True)
    try:
        c.wait(hold["id"])
        raise AssertionError("no JobFailed")
    except ac.JobFailed as e:
        assert e.state == "cancelled"
    assert c.wait(hold["id"], raise_on_failure=False)["state"] == "cancelled"
    try:
        c.cancel(hold["id"])
        raise AssertionError("no 409")
    except ac.ApiError as e:
        assert e.status == 409


def test_events_resume_after_daemon_restart():
    c = client()
    job = c.submit(long_spec(name="survivor"))
    D.wait_state(job["id"], {"running"}, timeout=60)
    got, errors = [], []

    def read():
        try:
            for ev in c.events(job["id"]):
                got.append(ev)
        except Exception as e:  # noqa: BLE001 - reported by the assertion below
            errors.append(e)

    t = threading.Thread(target=read)
    t.start()
    time.sleep(2)
    n_before = len(got)
    D.kill(signal.SIGKILL)
    time.sleep(1.5)
    D.start()
    D.wait_state(job["id"], {"running"}, timeout=30)
    time.sleep(2)
    c.cancel(job["id"])
    t.join(timeout=90)
    assert not t.is_alive() and not errors, errors
    st, stored = D.req("GET", f"/v1/jobs/{job['id']}/events?format=json&limit=10000")
    assert n_before > 0 and len(got) > n_before
    assert [e.id for e in got] == [e["id"] for e in stored["events"]], "events lost or repeated across the restart"
    assert got[-1].kind == "state" and got[-1].data["state"] == "cancelled"


def main():
    run_with_daemon([test_installs_offline, test_submit_wait_report_download, test_errors_carry_status_and_field,
                     test_idempotency_jobs_estimate_devices, test_failed_cancelled_and_timeout,
                     test_events_resume_after_daemon_restart], globals(),
                    config={"sse_keepalive_s": 1, "cpu_slots": 1, "quiet_budget_s": 2,
                            "model_roots": [os.path.dirname(os.path.dirname(TINY)), "/tmp"]})


if __name__ == "__main__":
    main()
