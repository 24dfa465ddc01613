#!/usr/bin/env python3
"""Hostile load on loopback: N_SSE event-stream clients and N_SLOW sockets
that trickle a request head a byte at a time (each cut at header_timeout_s and
replaced at once), while one client measures /healthz and GET /v1/jobs
latency, against the daemon's default configuration. Clients come from many 127.x.y.z addresses, as many machines would
(per-client limit 64). Bounded: about DURATION seconds, loopback only.

  AC_SSE=1000 AC_SLOW=300 AC_DURATION=20 python3 bench/bench_hostile.py

Prints p50/p99/max of /healthz and GET /v1/jobs, how many streams stayed
open, how many slow sockets were cut by the daemon, and PASS when /healthz
p99 < 50 ms with every stream open and no API request refused."""
import json
import os
import resource
import selectors
import sys
import threading
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "tests"))
from harness import Daemon, raw_conn, spec  # noqa: E402

N_SSE = int(os.environ.get("AC_SSE", "1000"))
N_SLOW = int(os.environ.get("AC_SLOW", "300"))
DURATION = float(os.environ.get("AC_DURATION", "20"))


def addr(group, i, per=40):
    return f"127.{group}.{i // per}.{1 + i % per}"


def pct(xs, p):
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(p / 100 * len(xs)))] if xs else float("nan")


def main():
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    # The default configuration; only cpu_slots 0, so the watched job stays queued and its streams open.
    # AC_CONFIG (JSON) adds keys, e.g. '{"max_connections": 512}'.
    d = Daemon(config=dict({"cpu_slots": 0}, **json.loads(os.environ.get("AC_CONFIG", "{}")))).start()
    stop = threading.Event()
    stats = {"slow_cut": 0, "slow_open": 0, "refused": 0}
    try:
        st, j = d.req("POST", "/v1/jobs", body=spec(name="watched"))  # queued for ever: its streams stay open
        path = f"/v1/jobs/{j['id']}/events"
        sel = selectors.DefaultSelector()
        streams = []
        t0 = time.time()
        for i in range(N_SSE):
            s = raw_conn(d.port, addr(2, i), timeout=5)
            s.sendall(f"GET {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nAccept: text/event-stream\r\n\r\n".encode())
            streams.append(s)
        ok = 0
        for s in streams:
            head = s.recv(4096)
            ok += head.startswith(b"HTTP/1.1 200")
            s.setblocking(False)
            sel.register(s, selectors.EVENT_READ, "sse")
        print(f"{ok}/{N_SSE} event streams open in {time.time() - t0:.1f} s")

        def slow_socket(i):
            s = raw_conn(d.port, addr(3, i, per=30), timeout=5)
            s.sendall(b"GET /v1/jobs HTTP/1.1\r\nHost: 127.0.0.1\r\n")
            s.setblocking(False)
            stats["slow_open"] += 1
            return s

        slow = {i: slow_socket(i) for i in range(N_SLOW)}

        def trickle():
            # one byte per socket per second; a cut socket is replaced at once
            while not stop.is_set():
                for i, s in list(slow.items()):
                    try:
                        s.send(b"X")
                        if s.recv(1) == b"":
                            raise ConnectionError
                    except BlockingIOError:
                        pass
                    except OSError:
                        s.close()
                        stats["slow_cut"] += 1
                        slow[i] = slow_socket(i)
                stop.wait(1.0)

        def drain():
            while not stop.is_set():
                for key, _ in sel.select(0.5):
                    try:
                        if key.fileobj.recv(65536) == b"":
                            sel.unregister(key.fileobj)
                    except OSError:
                        sel.unregister(key.fileobj)

        th = [threading.Thread(target=trickle), threading.Thread(target=drain)]
        for t in th:
            t.start()
        lat = {"/healthz": [], "/v1/jobs": []}
        t0 = time.time()
        while time.time() - t0 < DURATION:
            for p in lat:
                a = time.perf_counter()
                try:
                    st, _ = d.req("GET", p, timeout=5)
                    assert st == 200, st
                    lat[p].append((time.perf_counter() - a) * 1000)
                except (OSError, AssertionError):
                    stats["refused"] += 1
            time.sleep(0.01)
        stop.set()
        for t in th:
            t.join()
        still = sum(1 for k in sel.get_map().values() if k.data == "sse")
        st, m = d.req("GET", "/metrics")
        sse_now = [x for x in m.splitlines() if x.startswith("autocompress_sse_clients ")][0].split()[1]
        cut = [x for x in m.splitlines() if x.startswith("autocompress_http_cut_total ")][0].split()[1]
        for p, xs in lat.items():
            print(f"{p:10s} n={len(xs)} p50={pct(xs, 50):.1f} ms p99={pct(xs, 99):.1f} ms max={max(xs):.1f} ms")
        print(f"streams open at the end: {still} (daemon counts {sse_now}); slow sockets opened {stats['slow_open']}, "
              f"cut by the daemon {cut}; API requests refused {stats['refused']}")
        good = pct(lat["/healthz"], 99) < 50 and still == N_SSE and stats["refused"] == 0
        print("PASS" if good else "FAIL")
        for s in streams:
            s.close()
        for s in slow.values():
            s.close()
        return 0 if good else 1
    finally:
        stop.set()
        d.cleanup()


if __name__ == "__main__":
    sys.exit(main())
