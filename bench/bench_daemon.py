#!/usr/bin/env python3
"""Load check of the daemon on loopback: N concurrent clients each submit
jobs, stream each job's events over SSE, read it back and cancel it.
Jobs stay queued (cpu_slots 0) so the API and the SQLite queue are what is
measured, not the compression. Reports requests/s and latency percentiles
and checks that no job was lost or duplicated."""
import os
import sqlite3
import sys
import threading
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "tests"))
from harness import Daemon, TINY, sse_read, spec  # noqa: E402

CLIENTS = int(os.environ.get("AC_LOAD_CLIENTS", "16"))
JOBS = int(os.environ.get("AC_LOAD_JOBS", "20"))


def main():
    d = Daemon(config={"cpu_slots": 0}).start()
    lat = {"submit": [], "sse": [], "get": [], "cancel": []}
    mine = [[] for _ in range(CLIENTS)]
    errors = []
    lock = threading.Lock()

    def client(i):
        for k in range(JOBS):
            try:
                t0 = time.perf_counter()
                st, j = d.req("POST", "/v1/jobs", body=spec(name=f"c{i}-{k}"))
                t1 = time.perf_counter()
                assert st == 201, (st, j)
                st2, evs, _ = sse_read(d.port, f"/v1/jobs/{j['id']}/events", until=lambda e, c: len(e) >= 1, max_s=10)
                t2 = time.perf_counter()
                assert st2 == 200 and evs and evs[0]["data"]["state"] == "queued"
                st3, g = d.req("GET", f"/v1/jobs/{j['id']}")
                t3 = time.perf_counter()
                assert st3 == 200 and g["name"] == f"c{i}-{k}"
                st4, _ = d.req("DELETE", f"/v1/jobs/{j['id']}")
                t4 = time.perf_counter()
                assert st4 == 202
                with lock:
                    lat["submit"].append(t1 - t0); lat["sse"].append(t2 - t1); lat["get"].append(t3 - t2); lat["cancel"].append(t4 - t3)
                mine[i].append(j["id"])
            except Exception as ex:  # noqa: BLE001
                with lock:
                    errors.append(repr(ex))

    t0 = time.perf_counter()
    th = [threading.Thread(target=client, args=(i,)) for i in range(CLIENTS)]
    for t in th:
        t.start()
    for t in th:
        t.join()
    wall = time.perf_counter() - t0
    d.stop()
    con = sqlite3.connect(d.db)
    rows = con.execute("SELECT id, name, state FROM jobs").fetchall()
    con.close()
    ids = [i for m in mine for i in m]
    names = [r[1] for r in rows]
    lost = CLIENTS * JOBS - len(rows)
    dup = len(names) - len(set(names)) + len(ids) - len(set(ids))
    total = sum(len(v) for v in lat.values())
    print(f"{CLIENTS} clients x {JOBS} jobs: {total} requests in {wall:.2f} s = {total / wall:.0f} requests/s")
    for k, v in lat.items():
        v.sort()
        if v:
            print(f"  {k:7} p50 {1e3 * v[len(v) // 2]:7.2f} ms   p99 {1e3 * v[min(len(v) - 1, int(len(v) * 0.99))]:7.2f} ms   max {1e3 * v[-1]:7.2f} ms")
    print(f"jobs in database: {len(rows)}, lost: {lost}, duplicated: {dup}, all cancelled: {all(r[2] == 'cancelled' for r in rows)}, client errors: {len(errors)}")
    for e in errors[:5]:
        print("  error:", e)
    d.cleanup()
    return 1 if (lost or dup or errors) else 0


if __name__ == "__main__":
    sys.exit(main())
