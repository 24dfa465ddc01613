#!/usr/bin/env python3
"""The distillation stage through the daemon over loopback HTTP: bad
"distill" fields are 400s naming the field (budget over the cap, a text
path outside model_roots or not a file), and a job with distillation
streams `distill` events over SSE and reports, per arm, perplexity before
and after distillation with the distillation figures."""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from harness import DATA, run_with_daemon, spec, sse_read  # noqa: E402

D = None
DIST = {"tokens": 2048, "seq_len": 32, "batch": 4, "lr": 0.001, "temperature": 1.0}


def test_bad_distill_fields():
    cases = [
        (spec(distill=dict(DIST, tokens=2_000_000_000)), "invalid_spec", "distill.tokens"),
        (spec(distill=dict(DIST, seq_len=1)), "invalid_spec", "distill.seq_len"),
        (spec(distill=dict(DIST, schedule="cosine")), "invalid_spec", "distill.schedule"),
        (spec(distill=dict(DIST, text="/etc/passwd")), "invalid_path", "distill.text"),
        (spec(distill=dict(DIST, text=DATA)), "invalid_path", "distill.text"),
    ]
    for body, code, field in cases:
        st, r = D.req("POST", "/v1/jobs", body=body)
        assert st == 400 and r["error"]["code"] == code and r["error"]["field"] == field, (body["distill"], st, r)


def test_job_with_distillation():
    out = os.path.join(D.dir, "out")
    st, j = D.req("POST", "/v1/jobs", body=spec(output=out, distill=dict(DIST, text=os.path.join(DATA, "train.txt"))))
    assert st == 201, j
    j = D.wait_state(j["id"], {"succeeded", "failed"}, timeout=240)
    assert j["state"] == "succeeded", j
    _, evs, _ = sse_read(D.port, f"/v1/jobs/{j['id']}/events", until=lambda e, c: any(x["event"] == "state" and
                      x["data"].get("state") in ("succeeded", "failed") for x in e), max_s=30)
    dist = [e["data"] for e in evs if e["event"] == "distill"]
    arms = {d["arm"] for d in dist}
    assert arms == {"minitron", "autocompress"}, arms
    assert all(d["loss"] >= 0 and 1 <= d["step"] <= d["steps"] for d in dist), dist[:3]
    st, res = D.req("GET", f"/v1/jobs/{j['id']}/result")
    assert st == 200, res
    for arm in ("minitron", "autocompress"):
        a = res[arm]
        assert a["perplexity_pruned"] > 1 and a["perplexity"] > 1, a
        d = a["distill"]
        assert d["tokens"] == 2048 and d["steps"] == 16 and d["seconds"] > 0 and d["loss_first"] > 0 and d["loss_last"] > 0, d
    assert "distill" in res["timings_s"], res["timings_s"]


if __name__ == "__main__":
    run_with_daemon([test_bad_distill_fields, test_job_with_distillation], globals())
