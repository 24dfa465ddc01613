#!/usr/bin/env python3
"""Quality at equal constraints and equal budget: AutoCompress against the
Minitron baseline where BOTH arms meet the limits, over several seeds,
before and after distillation (issue 39's measure).

For every target below, the limit is one both arms can meet on the tiny
model (a moderate one, relative to the unpruned model's own predicted
figure on that target, `autocompress estimate`); each (target, seed) is one
job (method autocompress: both arms) with spec "distill" (the same total
token budget, distill.tokens, for each arm) and eval.tasks (the demo's
fortunes multiple-choice task, tools/make_fortune_task.py). The seed sets
search.seed and distill.seed. Printed per target and arm: how many seeds met
every limit, held-out perplexity and task accuracy before distillation
(perplexity_pruned, tasks_pruned) and after it (perplexity, tasks), each as
mean +- standard error over the seeds; then, where both arms met the limit
on every seed, the difference after distillation (AutoCompress - Minitron)
and whether it exceeds twice its standard error. Each arm's token split
(report "budget": ranking, gates, final) is printed when the report has it.

  python3 bench/bench_quality.py                 # default: 5 targets x 3 seeds, 16k tokens (15 jobs of 5-13 min on the shared 2-core machine)
  python3 bench/bench_quality.py --full          # 5 seeds, 100k tokens, the 11 M model too when built
  python3 bench/bench_quality.py --from FILE.json   # the table of a saved run (--json FILE writes it)

Options: --seeds N (seeds --first-seed, default 1, onwards), --tokens N, --targets 0,1,.. (indices into TARGETS),
--dnas-steps N (search.dnas_steps, default the job's 300), --model NAME=MODEL_DIR=DATA_DIR
(instead of the tiny model), --spec JSON (merged into every job's spec, e.g.
'{"distill": {"candidates": 3}}' (the KD-aware choice)), --json FILE (rows written after every job).
AC_BUILD names the build folder; the cost tables go to AC_BUILD/bench_cost.db.
"""
import argparse
import json
import math
import os
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BUILD = os.path.abspath(os.environ.get("AC_BUILD", os.path.join(ROOT, "build")))
ENV = dict(os.environ, AC_COST_DB=os.path.join(BUILD, "bench_cost.db"))
AC = os.path.join(BUILD, "autocompress")

# name, device, workload, [(constraint key, metric, factor of the unpruned model's figure)]: limits both
# arms meet on the tiny model. The GPU targets are bench_compress.py's scenarios at their moderate level (workloads
# where the model's own compute and bytes are at least 70 % of the predicted time, docs/benchmarks.md); the CPU:
# the demo's workload under a parameter limit, which does not move with this machine's load as a CPU latency
# limit would.
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_compress import SCENARIOS  # noqa: E402

TARGETS = [(name, dev, wl, [(key, metric, levels[0]) for key, metric, levels in limits])
           for name, dev, wl, limits in SCENARIOS] + [
    ("CPU, b1, 128 prompt", "cpu", {"batch": 1, "prompt_len": 128, "gen_len": 64},
     [("max_params", "params", 0.85)]),
]


def run(args):
    p = subprocess.run(args, capture_output=True, text=True, env=ENV)
    if p.returncode:
        raise RuntimeError(f"{' '.join(args)}: {p.stderr.strip()[-2000:]}")
    return p.stdout


def merge(a, b):
    for k, v in b.items():
        if isinstance(v, dict) and isinstance(a.get(k), dict):
            merge(a[k], v)
        else:
            a[k] = v
    return a


def base_figures(tmp, mdir, dev, wl):
    req = os.path.join(tmp, "est.json")
    json.dump({"model": mdir, "target": {"device": dev, "workload": wl}}, open(req, "w"))
    return json.loads(run([AC, "estimate", req]))["figures"]


def job(tmp, name, mdir, ddir, task, dev, wl, cons, seed, args):
    spec = {"model": mdir, "calibration": os.path.join(ddir, "calib.txt"), "heldout": os.path.join(ddir, "heldout.txt"),
            "output": os.path.join(tmp, name), "target": {"device": dev, "workload": wl}, "constraints": cons,
            "search": {"steps": 300, "seed": seed, "export_target": "deci", "method": "dnas"},
            "calibration_tokens": 8192,
            "eval": {"ctx": 128, "windows": 48, "tasks": [{"name": "fortunes", "path": task}]},
            "distill": {"tokens": args.tokens, "seed": seed + 1}}
    if args.dnas_steps:
        spec["search"]["dnas_steps"] = args.dnas_steps
    if os.path.exists(os.path.join(ddir, "train.txt")):
        spec["distill"]["text"] = os.path.join(ddir, "train.txt")
    if args.spec:
        merge(spec, json.loads(args.spec))
    sp = os.path.join(tmp, name + ".json")
    json.dump(spec, open(sp, "w"))
    out = run([AC, "compress", sp])
    return [json.loads(l) for l in out.splitlines() if l.startswith("{")][-1]["data"]


def arm_row(x):
    t, tp = (x.get("tasks") or {}).get("fortunes"), (x.get("tasks_pruned") or {}).get("fortunes")
    return {"feasible": bool(x.get("feasible", True)), "ppl_pruned": x.get("perplexity_pruned", x["perplexity"]),
            "ppl": x["perplexity"], "acc_pruned": tp["acc"] if tp else None, "acc": t["acc"] if t else None,
            "budget": x.get("budget"), "perplexity_ranked": x.get("perplexity_ranked"),
            "candidates": [{k: c.get(k) for k in ("source", "chosen", "loss_before", "loss_after")}
                           for c in x.get("candidates") or []] or None,
            "arch": [(l["heads"], l["kv_heads"], l["ffn"]) for l in x["architecture"]["layers"]]
            if "architecture" in x else None}


def ms(v):
    """Mean and standard error (sample sd / sqrt n; 0 for one value)."""
    v = [x for x in v if x is not None]
    if not v:
        return None, None
    m = sum(v) / len(v)
    se = math.sqrt(sum((x - m) ** 2 for x in v) / (len(v) - 1) / len(v)) if len(v) > 1 else 0.0
    return m, se


def fmt(m, se, d=2):
    return f"{'-':>15}" if m is None else f"{m:8.{d}f} +-{se:5.{d}f}" if d == 2 else f"{m:7.{d}f} +-{se:6.{d}f}"


def print_table(rows):
    by = {}
    for r in rows:
        by.setdefault((r["model"], r["target"]), []).append(r)
    print(f"{'model / target':38} {'arm':9} {'met':>5} | {'ppl before':>15} {'ppl after':>15} | "
          f"{'acc before':>15} {'acc after':>15} | budget (ranking/gates/final)")
    both_cases, wins_ppl, wins_acc, never_worse = 0, 0, 0, 0
    diffs = []
    for (mn, tn), rs in by.items():
        base = ms([r["baseline"]["ppl"] for r in rs])[0]
        for k in ("minitron", "autocompress"):
            xs = [r[k] for r in rs]
            met = sum(x["feasible"] for x in xs)
            b = xs[0].get("budget")
            bs = f"{b['ranking']}/{b['gates']}/{b['final']}" if b else "-"
            print(f"{(mn + ' / ' + tn)[:38]:38} {k[:9]:9} {met:2}/{len(xs):<2} | "
                  f"{fmt(*ms([x['ppl_pruned'] for x in xs]))} {fmt(*ms([x['ppl'] for x in xs]))} | "
                  f"{fmt(*ms([x['acc_pruned'] for x in xs]), d=3)} {fmt(*ms([x['acc'] for x in xs]), d=3)} | {bs}")
        if len(rs) >= 2 and all(r["minitron"]["feasible"] and r["autocompress"]["feasible"] for r in rs):
            both_cases += 1
            dp = ms([r["autocompress"]["ppl"] - r["minitron"]["ppl"] for r in rs])
            da = ms([(r["autocompress"]["acc"] or 0) - (r["minitron"]["acc"] or 0) for r in rs])
            wins_ppl += dp[0] < 0 and -dp[0] > 2 * dp[1]
            wins_acc += da[0] > 0 and da[0] > 2 * da[1]
            never_worse += not (dp[0] > 0 and dp[0] > dp[1]) and not (da[0] < 0 and -da[0] > da[1])
            diffs.append(f"  {mn} / {tn} (base {base:.2f}): AutoCompress - Minitron after distillation: perplexity "
                         f"{dp[0]:+.3f} +- {dp[1]:.3f}, accuracy {da[0]:+.4f} +- {da[1]:.4f}")
    print(f"Both arms met the limit on every seed (of at least 2) in {both_cases} of {len(by)} cases; there, after distillation, "
          f"AutoCompress is lower in perplexity by more than 2 standard errors in {wins_ppl}, higher in accuracy by "
          f"more than 2 standard errors in {wins_acc}, and not worse than Minitron by more than 1 standard error "
          f"(either metric) in {never_worse}")
    print("\n".join(diffs))
    ranked = [r for r in rows if any("loss_after" in c and c["loss_after"] is not None
                                     for c in (r["autocompress"].get("candidates") or []))]
    if ranked:  # the KD-aware choice: which candidate won, and would the zero-shot ranking have agreed
        agree = 0
        for r in ranked:
            cs = [c for c in r["autocompress"]["candidates"] if c["loss_after"] is not None]
            kd, zs = min(cs, key=lambda c: c["loss_after"]), min(cs, key=lambda c: c["loss_before"])
            agree += kd is zs
            print(f"  {r['target']} seed {r['seed']}: chosen {kd['source']} (" + ", ".join(
                f"{c['source']} {c['loss_before']:.4f} -> {c['loss_after']:.4f}" for c in cs) + ")")
        print(f"Candidate ranking ran in {len(ranked)} jobs; the zero-shot ranking would have chosen the same "
              f"candidate in {agree}")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--full", action="store_true")
    ap.add_argument("--seeds", type=int)
    ap.add_argument("--first-seed", type=int, default=1)
    ap.add_argument("--tokens", type=int)
    ap.add_argument("--targets", default="")
    ap.add_argument("--dnas-steps", type=int, default=0)
    ap.add_argument("--model", action="append", default=[])
    ap.add_argument("--spec", default="")
    ap.add_argument("--json", default="")
    ap.add_argument("--from", dest="from_", nargs="+")
    args = ap.parse_args()
    if args.from_:
        for f in args.from_:
            print(f"== {f}")
            print_table(json.load(open(f)))
        return 0
    args.seeds = args.seeds or (5 if args.full else 3)
    args.tokens = args.tokens or (100000 if args.full else 16384)
    models = [("tiny", os.path.join(BUILD, "models", "tiny"), os.path.join(BUILD, "data"))]
    if args.full and os.path.exists(os.path.join(BUILD, "models", "second", "config.json")):
        models.append(("kjv-11M", os.path.join(BUILD, "models", "second"), os.path.join(BUILD, "data", "second")))
    if args.model:
        models = [tuple(m.split("=")) for m in args.model]
    targets = [int(x) for x in args.targets.split(",")] if args.targets else range(len(TARGETS))
    tmp = tempfile.mkdtemp(prefix="acquality_")
    rows = []
    for mname, mdir, ddir in models:
        task = os.path.join(ddir, "fortunes-mc.jsonl")
        if not os.path.exists(task):
            run([sys.executable, os.path.join(ROOT, "tools", "make_fortune_task.py"), "--text",
                 os.path.join(ddir, "heldout.txt"), "--out", task, "--n", "200"])
        arch = json.load(open(os.path.join(mdir, "config.json")))
        for ti in targets:
            tname, dev, wl, limits = TARGETS[ti]
            cons = {}
            for k, metric, f in limits:
                if metric == "params":  # no table needed (a CPU target's is measured by its first job)
                    cons[k] = f * params_of(arch)
                else:
                    cons[k] = base_figures(tmp, mdir, dev, wl)[metric] * f
            for seed in range(args.first_seed, args.first_seed + args.seeds):
                t0 = time.time()
                r = job(tmp, f"{mname}-{ti}-{seed}", mdir, ddir, task, dev, wl, cons, seed, args)
                row = {"model": mname, "target": tname, "seed": seed, "constraints": cons, "tokens": args.tokens,
                       "seconds": round(time.time() - t0, 1), "baseline": {"ppl": r["baseline"]["perplexity"]},
                       "minitron": arm_row(r["minitron"]), "autocompress": arm_row(r["autocompress"]),
                       "timings_s": {k: round(v, 1) for k, v in r.get("timings_s", {}).items()}}
                rows.append(row)
                if args.json:
                    json.dump(rows, open(args.json, "w"), indent=1)
                print(f"  {mname} / {tname} / seed {seed}: {row['seconds']:.0f} s; minitron "
                      f"{row['minitron']['ppl_pruned']:.2f} -> {row['minitron']['ppl']:.2f}, autocompress "
                      f"{row['autocompress']['ppl_pruned']:.2f} -> {row['autocompress']['ppl']:.2f} "
                      f"(load {os.getloadavg()[0]:.1f})", file=sys.stderr, flush=True)
    print(f"distill.tokens {args.tokens} per arm, {args.seeds} seeds")
    print_table(rows)
    return 0


def params_of(c):
    """Parameters of a Llama config.json (as the cost model counts them: embeddings, layers, norms, LM head)."""
    h, L, f, v = c["hidden_size"], c["num_hidden_layers"], c["intermediate_size"], c["vocab_size"]
    hd = c.get("head_dim") or h // c["num_attention_heads"]
    q, kv = c["num_attention_heads"] * hd, c["num_key_value_heads"] * hd
    per = h * q * 2 + h * kv * 2 + 3 * h * f + 2 * h
    return v * h * (1 if c.get("tie_word_embeddings") else 2) + L * per + h


if __name__ == "__main__":
    sys.exit(main())
