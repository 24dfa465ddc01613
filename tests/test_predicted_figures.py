#!/usr/bin/env python3
"""The figures a job's report prints are the cost model's for the structures they name (issue 32, item 6: the search
sees the model the report states). One job on the tiny model (`autocompress compress`, on this CPU) for a served
workload on two H100s under vLLM (tensor parallelism, continuous batching, a p99 limit), then `autocompress estimate`
(the same cost model reached through POST /v1/estimate's code, not the search's) on:
- the base model: the report's baseline figures;
- each arm's architecture as the report prints it: that arm's figures (what its search predicted and judged the
  limits by);
- the exported checkpoint read back from disk: the chosen arm's figures (the structure the search priced is the one
  written, grid padding included).
Every figure must agree to 1e-12 (the same function on the same inputs; the simulation is seeded), and each arm's
layers must split over the two GPUs as vLLM requires."""
import json
import os
import shutil
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from harness import BUILD, TINY, Runner  # noqa: E402
from harness import spec as full_spec  # noqa: E402

WORK = tempfile.mkdtemp(prefix="ac_predicted_")  # removed when every test passed
TARGET = {"device": "H100", "tp": 2, "engine": {"name": "vllm"},
          "workload": {"concurrency": 4, "prompt_len": 256, "gen_len": 32, "requests": 48, "length_spread": 0.25}}
RUN = {}


def job():
    """Runs the job once; the report and the export directory."""
    if not RUN:
        out = os.path.join(WORK, "out")
        s = full_spec(output=out, target=TARGET)
        s["constraints"] = {"max_params": 1.0e6, "max_p99_ttft_ms": 1.0e4}
        s["search"] = dict(s["search"], dnas_steps=30)
        p = os.path.join(WORK, "spec.json")
        with open(p, "w") as f:
            json.dump(s, f)
        r = subprocess.run([os.path.join(BUILD, "autocompress"), "compress", p], capture_output=True, text=True,
                           timeout=600, env=dict(os.environ, AC_COST_DB=os.path.join(WORK, "cost.db")))
        assert r.returncode == 0, r.stderr[-3000:]
        with open(os.path.join(out, "report.json")) as f:
            RUN["report"] = json.load(f)
        RUN["out"] = out
    return RUN["report"], RUN["out"]


def estimate(req):
    p = os.path.join(WORK, "estimate.json")
    with open(p, "w") as f:
        json.dump(dict(req, target=TARGET), f)
    r = subprocess.run([os.path.join(BUILD, "autocompress"), "estimate", p], capture_output=True, text=True,
                       timeout=120)
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)


# figures the estimate gives beside the prediction (the report keeps the base model's in target.overhead_share)
ESTIMATE_ONLY = {"overhead_share"}


def same_figures(printed, estimated, what):
    est = set(estimated["figures"]) - ESTIMATE_ONLY
    assert set(printed) == est, (what, sorted(set(printed) ^ est))
    for k, v in printed.items():
        w = estimated["figures"][k]
        assert abs(v - w) <= 1e-12 * max(abs(v), abs(w), 1e-300), f"{what}: {k} printed {v!r}, cost model {w!r}"


def test_baseline_is_the_base_models_cost():
    rep, _ = job()
    est = estimate({"model": TINY})
    same_figures(rep["baseline"]["predicted"], est, "baseline")
    # the share of the base model's latency no structure moves: the report's is the estimate's
    v, w = rep["target"]["overhead_share"], est["figures"]["overhead_share"]
    assert v > 0 and abs(v - w) <= 1e-12, (v, w)  # (v <= 1 holds by the clamp in ac_cost_overhead_share)
    assert est["engine"] == {"name": "vllm", "tp": 2}, est["engine"]
    # where the inputs came from: the H100 profile's roofline, no second source to compare with
    ci = rep["target"]["cost_inputs"]
    assert ci["table"] == "roofline" and "figures" not in ci, ci
    assert ci["inputs"]["launch_us"]["source"] == "spec profile" and ci["inputs"]["allreduce_link"]["device"] == "H100", ci
    assert ci["inputs"]["step_overhead_ms"]["value"] == rep["target"]["engine"]["overhead_ms"], ci
    # the estimate says the same of its inputs (POST /v1/estimate's cost_inputs)
    assert est["cost_inputs"] == ci, (est["cost_inputs"], ci)


def test_each_arm_is_its_architectures_cost():
    rep, _ = job()
    arms = [a for a in ("minitron", "autocompress") if a in rep]
    assert arms, sorted(rep)
    for arm in arms:
        a = rep[arm]["architecture"]
        same_figures(rep[arm]["predicted"], estimate({"model": TINY, "architecture": a}), arm)
        for i, y in enumerate(a["layers"]):  # vLLM's QKVParallelLinear / MergedColumnParallelLinear over 2 GPUs
            h, kv, f = y.get("heads", 0), y.get("kv_heads", 0), y.get("ffn", 0)
            assert h % 2 == 0 and (not h or (kv % 2 == 0 if kv >= 2 else 2 % kv == 0)) and f % 2 == 0, (arm, i, y)
    # the limits the report prints are judged on those figures
    for arm in arms:
        cons = rep[arm]["constraints"]
        assert set(cons) == {"params", "p99_ttft_ms"}, cons
        for metric, c in cons.items():
            assert c["value"] == rep[arm]["predicted"][metric] and c["kind"] == "max", (arm, metric, c)
            assert c["met"] == (c["value"] <= c["limit"]), (arm, metric, c)
        assert rep[arm]["feasible"] == all(c["met"] for c in cons.values()), (arm, cons)


def test_export_is_the_chosen_arms_cost():
    rep, out = job()
    same_figures(rep[rep["chosen"]]["predicted"], estimate({"model": out}), "export (" + rep["chosen"] + ")")


if __name__ == "__main__":
    if not os.path.exists(os.path.join(TINY, "config.json")):
        print("  skip: no tiny model (make tiny-model)")
        print("RESULT 0 0 1")
        sys.exit(0)
    R = Runner()
    for t in (test_baseline_is_the_base_models_cost, test_each_arm_is_its_architectures_cost,
              test_export_is_the_chosen_arms_cost):
        R.run(t)
    if not R.failed:
        shutil.rmtree(WORK, ignore_errors=True)
    R.done()
