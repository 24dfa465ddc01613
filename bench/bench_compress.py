#!/usr/bin/env python3
"""AutoCompress (search.method from AC_SEARCH_METHOD, default dnas) versus the Minitron baseline on the tiny trained model,
under the same constraint on the same target, for four targets/workloads,
in one run. Each limit is set relative to the unpruned model's predicted
figure on that target (from `autocompress estimate`). Prints held-out
perplexity of both and their predicted figures against the limit."""
import json
import os
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BUILD = os.environ.get("AC_BUILD", os.path.join(ROOT, "build"))
TINY = os.path.join(BUILD, "models", "tiny")
DATA = os.path.join(BUILD, "data")
ENV = dict(os.environ, AC_COST_DB=os.path.join(BUILD, "bench_cost.db"))

TARGETS = [
    ("H200 long-context, 1 user", "H200", {"batch": 1, "prompt_len": 32768, "gen_len": 256}, "max_ttft_ms", "ttft_ms", 0.70),
    ("H100 batched datacenter", "H100", {"batch": 256, "prompt_len": 2048, "gen_len": 256}, "min_tokens_per_s", "tokens_per_s", 1.30),
    ("L4 memory-bound batch", "L4", {"batch": 512, "prompt_len": 4096, "gen_len": 256}, "max_memory_gib", "memory_gib", 0.70),
    ("CPU latency-bound, batch 1", "cpu", {"batch": 1, "prompt_len": 128, "gen_len": 64}, "max_tpot_ms", "tpot_ms", 0.75),
]


def run(args, **kw):
    return subprocess.run(args, capture_output=True, text=True, env=ENV, check=True, **kw).stdout


def main():
    tmp = tempfile.mkdtemp(prefix="acbench_")
    rows = []
    only = os.environ.get("AC_BENCH_TARGETS")  # e.g. "H200,H100": a subset of the devices below
    for name, dev, wl, limit_key, metric, factor in TARGETS:
        if only and dev not in only.split(","):
            continue
        req = os.path.join(tmp, "est.json")
        json.dump({"model": TINY, "target": {"device": dev, "workload": wl}}, open(req, "w"))
        if dev == "cpu":  # make sure the CPU table exists (measured once, cached)
            json.dump({"model": TINY, "calibration": os.path.join(DATA, "calib.txt"), "output": os.path.join(tmp, "warm"),
                       "target": {"device": "cpu", "workload": wl}, "constraints": {"max_params": 1e9}, "search": {"steps": 1},
                       "calibration_tokens": 1024, "eval": {"ctx": 64, "windows": 2}}, open(os.path.join(tmp, "warm.json"), "w"))
            run([os.path.join(BUILD, "autocompress"), "compress", os.path.join(tmp, "warm.json")])
        base = json.loads(run([os.path.join(BUILD, "autocompress"), "estimate", req]))["figures"]
        limit = base[metric] * factor
        spec = {"model": TINY, "calibration": os.path.join(DATA, "calib.txt"), "heldout": os.path.join(DATA, "heldout.txt"),
                "output": os.path.join(tmp, dev), "target": {"device": dev, "workload": wl}, "constraints": {limit_key: limit},
                "search": {"steps": 300, "seed": 0, "export_target": os.environ.get("AC_EXPORT_TARGET", "deci"),
                           "method": os.environ.get("AC_SEARCH_METHOD", "dnas"), "dnas_steps": int(os.environ.get("AC_DNAS_STEPS", "300")),
                           "cotrain": os.environ.get("AC_COTRAIN", "0") == "1"}, "calibration_tokens": 8192, "eval": {"ctx": 128, "windows": 48}}
        sp = os.path.join(tmp, dev + ".json")
        json.dump(spec, open(sp, "w"))
        out = run([os.path.join(BUILD, "autocompress"), "compress", sp])
        res = [json.loads(l) for l in out.splitlines() if l.startswith("{")][-1]["data"]
        a, m = res["autocompress"], res["minitron"]
        rows.append((name, limit_key, limit, res["baseline"]["perplexity"], m, a, metric))
        print(f"  {dev}: search {res['timings_s']['search']:.1f} s, architecture {json.dumps(a.get('architecture'))}", file=sys.stderr)
    print(f"{'target':28} {'constraint':26} {'base ppl':>8} {'minitron ppl':>13} {'autocompress ppl':>17} {'minitron metric':>16} {'autocompress metric':>20}")
    wins = 0
    for name, key, limit, bppl, m, a, metric in rows:
        mf = "" if m["feasible"] else " (infeasible)"
        print(f"{name:28} {key + ' ' + format(limit, '.4g'):26} {bppl:8.2f} {m['perplexity']:13.2f} {a['perplexity']:17.2f} "
              f"{m['predicted'][metric]:16.4g}{mf} {a['predicted'][metric]:20.4g}")
        wins += a["perplexity"] < m["perplexity"] or not m["feasible"]
    print(f"AutoCompress reaches lower held-out perplexity than Minitron under the same limit on {wins} of {len(rows)} targets")


if __name__ == "__main__":
    sys.exit(main())
