"""SIGTERM while work is on the thread pool (docs/architecture.md, "the
threads"): requests the loop offloaded to libuv's pool are answered in full
before the daemon exits (the last of them too: it once lost its reply to the
close), the daemon exits 0, a request that arrives after the signal gets a
503 `shutting_down`, and what was stored before stays in the SQLite
file for the next start. The daemon's test hook AC_TEST_OFFLOAD_DELAY_MS
holds each offloaded task, so the signal lands while the work is there."""
import os
import signal
import sys
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from harness import BUILD, Daemon, Runner, spec  # noqa: E402

DELAY_MS = 1500


def test_sigterm_waits_for_offloaded_work():
    os.environ.update(AUTOCOMPRESSD_TEST_HOOKS="1", AC_TEST_OFFLOAD_DELAY_MS=str(DELAY_MS))
    try:
        d = Daemon(config={"cpu_slots": 0, "model_roots": [BUILD, "/tmp"]}).start()
    finally:
        del os.environ["AC_TEST_OFFLOAD_DELAY_MS"], os.environ["AUTOCOMPRESSD_TEST_HOOKS"]
    try:
        # a job stored before the signal (offloaded too: POST /v1/jobs checks its paths)
        st, j = d.req("POST", "/v1/jobs", spec())
        assert st in (200, 201, 202), (st, j)
        job = j["id"]
        answers = {}

        def ask(key, method, path, body=None):
            try:
                answers[key] = d.req(method, path, body, timeout=30)
            except Exception as e:  # noqa: BLE001 - a reset connection is the failure we look for
                answers[key] = ("error", repr(e))

        threads = [threading.Thread(target=ask, args=("validate", "POST", "/v1/validate", spec())),
                   threading.Thread(target=ask, args=("log", "GET", f"/v1/jobs/{job}/log"))]
        t0 = time.monotonic()
        for t in threads:
            t.start()
        time.sleep(DELAY_MS / 3000)  # both are on the pool now, held by the hook
        proc = d.proc
        proc.send_signal(signal.SIGTERM)
        time.sleep(0.1)
        late = {}
        try:
            late["r"] = d.req("GET", "/v1/jobs", timeout=5)
        except Exception as e:  # noqa: BLE001
            late["r"] = ("error", repr(e))
        for t in threads:
            t.join(timeout=30)
        rc = proc.wait(timeout=30)
        took = time.monotonic() - t0
        d.proc = None
        print(f"   answers: validate {answers['validate'][0]}, log {answers['log'][0]}; "
              f"request after the signal: {late['r'][0]}; exit {rc} after {took:.2f} s", flush=True)
        assert answers["validate"][0] == 200 and answers["validate"][1].get("ok") is True, answers["validate"]
        assert answers["log"][0] == 200, answers["log"]
        assert rc == 0, rc
        assert took >= DELAY_MS / 1000 * 0.9, f"exited after {took:.2f} s, before the held work ({DELAY_MS} ms)"
        # a request after SIGTERM: the server is stopping; it says so
        assert late["r"][0] == 503 and late["r"][1]["error"]["code"] == "shutting_down", late["r"]
        # the next start finds the job as it was stored
        d.start()
        st, j = d.req("GET", f"/v1/jobs/{job}")
        assert st == 200 and j["state"] == "queued", (st, j)
    finally:
        d.cleanup()


if __name__ == "__main__":
    R = Runner()
    R.run(test_sigterm_waits_for_offloaded_work)
    R.done()
