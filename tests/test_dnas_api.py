#!/usr/bin/env python3
"""search.method through the daemon over loopback HTTP: a bad method or
dnas field is a 400 naming the field; a dnas job streams one `search` event
per gate step (phase dnas: task loss, every limit's expected value, the
multipliers and the expected per-layer architecture) and reports
search.method; the result meets the limit by the cost model."""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from harness import run_with_daemon, spec, sse_read  # noqa: E402

D = None


def test_bad_search_fields():
    cases = [
        ({"method": "evolution"}, "search.method"),
        ({"method": "dnas", "dnas_steps": 0}, "search.dnas_steps"),
        ({"method": "dnas", "cotrain": "yes"}, "search.cotrain"),
        ({"method": "dnas", "keep_weights": True}, "search.keep_weights"),  # without cotrain
        ({"method": "surrogate", "cotrain": True, "keep_weights": True}, "search.keep_weights"),
        ({"method": "dnas", "dnas_seq_len": 1}, "search.dnas_seq_len"),
    ]
    for s, field in cases:
        st, r = D.req("POST", "/v1/jobs", body=spec(search=dict({"steps": 50, "seed": 3}, **s)))
        assert st == 400 and r["error"]["code"] == "invalid_spec" and r["error"]["field"] == field, (s, st, r)


def test_dnas_job_events_and_report():
    out = os.path.join(D.dir, "out")
    body = spec(output=out, search={"steps": 50, "seed": 3, "method": "dnas", "dnas_steps": 12, "export_target": "gguf-deci"})
    st, j = D.req("POST", "/v1/jobs", body=body)
    assert st == 201, j
    j = D.wait_state(j["id"], {"succeeded", "failed"}, timeout=240)
    assert j["state"] == "succeeded", j
    _, evs, _ = sse_read(D.port, f"/v1/jobs/{j['id']}/events", until=lambda e, c: any(x["event"] == "state" and
                         x["data"].get("state") in ("succeeded", "failed") for x in e), max_s=30)
    steps = [e["data"] for e in evs if e["event"] == "search" and e["data"].get("phase") == "dnas"]
    assert [d["step"] for d in steps] == list(range(1, 13)), [d["step"] for d in steps]
    for d in steps:
        assert d["task_loss"] >= 0 and abs(d["loss"]) < 1e6, d  # loss = task + lambda g + mu/2 max(0, g)^2, g < 0 when met
        assert set(d["metrics"]) == {"params"} and d["metrics"]["params"]["limit"] == 1.0e6, d["metrics"]
        assert set(d["multipliers"]) == {"params"}, d  # (>= 0: dual ascent clamps it there)
        assert len(d["architecture"]["layers"]) == 6, d["architecture"]
    # the expected architecture is the gates' as they train (keep probabilities and widths are within their
    # ranges by construction; that they move is what shows the event carries the live gates)
    first, last = steps[0]["architecture"]["layers"], steps[-1]["architecture"]["layers"]
    assert any(abs(a[k] - b[k]) > 1e-6 for a, b in zip(first, last) for k in ("attn_keep", "ffn", "kv_heads")), \
        (first, last)
    st, res = D.req("GET", f"/v1/jobs/{j['id']}/result")
    assert st == 200, res
    assert res["search"]["method"] == "dnas", res["search"]
    a = res["autocompress"]
    assert a["feasible"] and a["predicted"]["params"] <= 1.0e6, a["predicted"]
    # Minitron's divisors on the tiny model, min(Model-Optimizer's, max(1, round(base / 16))) (docs/search.md)
    ax = res["minitron"]["axes"]
    got = {k: ax[k]["divisor"] for k in ("hidden_size", "ffn_hidden_size", "num_layers")}
    assert got == {"hidden_size": 8, "ffn_hidden_size": 24, "num_layers": 1}, got


if __name__ == "__main__":
    run_with_daemon([test_bad_search_fields, test_dnas_job_events_and_report], globals())
