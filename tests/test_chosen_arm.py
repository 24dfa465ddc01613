#!/usr/bin/env python3
"""The exported arm is the best feasible one, in real jobs over HTTP on the tiny model, in the two cases built to
make the rule visible (docs/search.md, "The chosen arm"):
- both arms meet the limit and Minitron has the lower held-out loss: the job chooses Minitron, says so in its report
  (chosen_reason, the CLI's report and the result event), and the exported checkpoint is Minitron's (its perplexity,
  measured again from the files, is Minitron's and not AutoCompress's);
- Minitron's grid cut down to the unpruned model (minitron.max_width_pruning and max_depth_pruning 0.01: each axis
  keeps only its largest choice), so only AutoCompress meets the limit while Minitron's structure, the base itself,
  has the lower held-out loss. The job must still choose AutoCompress: a choice by loss alone (feasibility ignored)
  would export Minitron, which this test asserts against.
Both jobs are the smallest the search allows (5 surrogate steps, 10 gate steps, 2048 calibration tokens)."""
import os
import re
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from harness import BUILD, run_with_daemon  # noqa: E402
from harness import spec as full_spec  # noqa: E402
from test_modelcard import check_export_is_chosen  # noqa: E402

D = None
SEARCH = {"dnas_steps": 10, "steps": 5}  # gates barely trained: the AutoCompress arm cuts the hidden size (128 -> 112)


def run(name, max_params, **kw):
    out = os.path.join(D.dir, name)
    st, j = D.req("POST", "/v1/jobs", body=full_spec(name=name, output=out, search=SEARCH,
                                                      constraints={"max_params": max_params}, **kw))
    assert st == 201, j
    job = D.wait_state(j["id"], {"succeeded", "failed"}, timeout=400)
    assert job["state"] == "succeeded", job
    st, rep = D.req("GET", f"/v1/jobs/{j['id']}/result")
    assert st == 200, rep
    return j["id"], rep, out


def feasible_by_limit(rep, arm, limit):
    """The arm meets the limit, from its own predicted figure (not its feasible flag)."""
    return rep[arm]["predicted"]["params"] <= limit


def test_minitron_lower_loss_both_feasible():
    limit = 1.0e6
    job, rep, out = run("both", limit)
    m, a = rep["minitron"], rep["autocompress"]
    # the case as built: both meet the limit, Minitron's held-out loss is the lower
    assert feasible_by_limit(rep, "minitron", limit) and feasible_by_limit(rep, "autocompress", limit), rep
    assert m["feasible"] and a["feasible"], (m["feasible"], a["feasible"])
    assert m["nll"] < a["nll"], ("the case no longer has Minitron ahead", m["nll"], a["nll"])
    assert rep["chosen"] == "minitron", rep["chosen"]
    assert rep["chosen_reason"].startswith("both arms meet every limit; minitron has the lower held-out loss"), \
        rep["chosen_reason"]
    assert f"{m['nll']:.6f} against {a['nll']:.6f}" in rep["chosen_reason"], rep["chosen_reason"]
    check_export_is_chosen(rep, out)  # the files are Minitron's model
    # the timings name the arms as everywhere else, and report.html's table of them says so row by row
    ml = rep["measured_local"]
    assert {"baseline", "minitron", "autocompress"} <= set(ml) and not {"base", "result"} & set(ml), list(ml)
    assert set(ml.get("predicted", {"baseline": 0, "minitron": 0})) == {"baseline", "minitron"}, ml  # with a CPU table
    st, page = D.req("GET", f"/v1/jobs/{job}/report.html")
    t = re.search(r'<table id="measured">(.*?)</table>', page, re.S)
    rows = re.findall(r'<tr><th>([a-z]+)</th><td[^>]*>([^<]*)</td><td class="n">([0-9.e+-]+)</td>', t.group(1) if t else "")
    assert [r[0] for r in rows] == ["baseline", "minitron", "autocompress"], rows
    for arm, _, measured in rows:  # TTFT measured, as the report's figure under the arm's name
        assert abs(float(measured) - ml[arm]["ttft_ms"]) <= 5e-4 * ml[arm]["ttft_ms"] + 1e-3, (arm, measured, ml[arm])
    # the result event and the CLI's report say the same
    st, evs = D.req("GET", f"/v1/jobs/{job}/events?format=json")
    res = [e["data"] for e in evs["events"] if e["kind"] == "result"]
    assert len(res) == 1 and res[0]["chosen"] == "minitron", res
    p = subprocess.run([os.path.join(BUILD, "autocompress"), "report", str(job), "--server",
                        f"http://127.0.0.1:{D.port}"], capture_output=True, text=True, timeout=60)
    rows = {ln.split()[0]: ln for ln in p.stdout.splitlines() if ln.split() and ln.split()[0] in rep}
    assert p.returncode == 0 and rows["minitron"].endswith("<- chosen") and "<- chosen" not in rows["autocompress"], \
        p.stdout


def test_feasibility_before_loss():
    limit = 1.0e6
    job, rep, out = run("grid", limit, minitron={"max_width_pruning": 0.01, "max_depth_pruning": 0.01})
    m, a = rep["minitron"], rep["autocompress"]
    assert m["architecture"] == rep["model"]["architecture"], "Minitron's grid is not the base alone"
    assert not feasible_by_limit(rep, "minitron", limit) and not m["feasible"], m["predicted"]["params"]
    assert feasible_by_limit(rep, "autocompress", limit) and a["feasible"], a["predicted"]["params"]
    # the mutation check: by held-out loss alone Minitron's arm (unpruned) would win; the rule must not take it
    by_loss_alone = min(("minitron", "autocompress"), key=lambda x: rep[x]["nll"])
    assert by_loss_alone == "minitron", (m["nll"], a["nll"])
    assert rep["chosen"] == "autocompress", rep["chosen"]
    assert rep["chosen_reason"] == "only the autocompress arm meets every limit", rep["chosen_reason"]
    check_export_is_chosen(rep, out)


if __name__ == "__main__":
    run_with_daemon([test_minitron_lower_loss_both_feasible, test_feasibility_before_loss], globals())
