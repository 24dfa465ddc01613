#!/usr/bin/env python3
"""AutoCompress versus the Minitron baseline (NVIDIA Model-Optimizer's
search, src/search/minitron.c) under the same limit on the same target: the paper's
three scenarios plus a memory limit, each limit set relative to the unpruned
model's own predicted figure on that target (`autocompress estimate`).

  long-context local coding  RTX 5070, batch 1, 16k prompt   TTFT and TPOT limits
  batched datacenter serving H100, batch 256                 output tokens/s limit
  latency-sensitive chat     RTX 5080, batch 1, short prompt TPOT limit
  memory-bound serving       L4, batch 512                   memory limit

Prints held-out perplexity of base, Minitron and AutoCompress, their
predicted figures against the limit, and the win count. The columns "after
equal distillation" are filled when AC_BENCH_DISTILL=N is set: every job
then distils both arms with the same budget of N tokens (spec "distill",
on the model's training split, train.txt, when its data directory has one,
else on the calibration text), each arm's report holding
"perplexity_pruned" (before) and "perplexity" (after); without it they
print "-". The budget may differ per model: AC_BENCH_DISTILL=N or
AC_BENCH_DISTILL=tiny:N1,kjv:N2 (model-name prefix: tokens).

AutoCompress's search.method comes from AC_SEARCH_METHOD (default dnas), with
AC_DNAS_STEPS (default 300) and AC_COTRAIN=1 (co-trained weights).

Models: build/models/tiny (fortunes, 1.4 M parameters), build/models/second
(King James Bible, 11 M parameters, `make second-model`) when it has been
built, and any other model directory named in AC_BENCH_MODELS (colon-separated
NAME=MODEL_DIR=DATA_DIR entries, DATA_DIR holding calib.txt and heldout.txt).
AC_BENCH_ONLY=NAME-PREFIX[,..] keeps only those models; AC_BENCH_LEVELS=0,1
(default both) picks the moderate (0) and/or tight (1) limits, AC_BENCH_SCENARIOS=0,1,2,3
(default all) the scenarios, in the order above; AC_BENCH_JSON=PATH
also writes every row (limits, each arm's perplexities, architecture, job
seconds and phase times) as JSON after every job, and
`bench_compress.py --from FILE.json ...` prints the table and win count of
such files (a run cut short included).
"""
import json
import os
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BUILD = os.path.abspath(os.environ.get("AC_BUILD", os.path.join(ROOT, "build")))
ENV = dict(os.environ, AC_COST_DB=os.path.join(BUILD, "bench_cost.db"))

# name, device, workload, [(constraint key, metric, (moderate, tight) factor of the unpruned model's figure)].
# The moderate limit is one Minitron's capped grid can meet on the tiny model; the tight one is beyond it.
SCENARIOS = [
    ("long-context coding, RTX 5070", "RTX 5070", {"batch": 1, "prompt_len": 16384, "gen_len": 256},
     [("max_ttft_ms", "ttft_ms", (0.90, 0.75)), ("max_tpot_ms", "tpot_ms", (0.95, 0.85))]),
    ("datacenter batch 256, H100", "H100", {"batch": 256, "prompt_len": 2048, "gen_len": 256},
     [("min_tokens_per_s", "tokens_per_s", (1.08, 1.30))]),
    ("interactive batch 1, RTX 5080", "RTX 5080", {"batch": 1, "prompt_len": 128, "gen_len": 128},
     [("max_tpot_ms", "tpot_ms", (0.95, 0.85))]),
    ("memory-bound batch 512, L4", "L4", {"batch": 512, "prompt_len": 4096, "gen_len": 256},
     [("max_memory_gib", "memory_gib", (0.85, 0.70))]),
]


def models():
    out = [("fortunes-1.4M", os.path.join(BUILD, "models", "tiny"), os.path.join(BUILD, "data")),
           ("kjv-11M", os.path.join(BUILD, "models", "second"), os.path.join(BUILD, "data", "second"))]
    for ent in filter(None, os.environ.get("AC_BENCH_MODELS", "").split(":")):
        name, mdir, ddir = ent.split("=")
        out.append((name, mdir, ddir))
    only = [x for x in os.environ.get("AC_BENCH_ONLY", "").split(",") if x]
    return [m for m in out if not only or any(m[0].startswith(o) for o in only)]


def distill_tokens(mname):
    v = os.environ.get("AC_BENCH_DISTILL", "")
    if ":" not in v:
        return int(v) if v else 0
    for ent in v.split(","):
        pre, n = ent.split(":")
        if mname.startswith(pre):
            return int(n)
    return 0


def run(args):
    return subprocess.run(args, capture_output=True, text=True, env=ENV, check=True).stdout


def arch_str(a):
    kept = [l for l in a["layers"] if l["heads"] or l["ffn"]]
    shapes = {(l["heads"], l["kv_heads"], l["ffn"]) for l in kept}
    if len(shapes) == 1:
        h, kv, f = shapes.pop()
        return f"{len(kept)}L a{h}/kv{kv} f{f} h{a['hidden']}"
    return f"{len(kept)}L hetero h{a['hidden']} " + ",".join(f"{l['kv_heads']}/{l['ffn']}" for l in a["layers"])


def job(tmp, name, mname, mdir, ddir, dev, wl, cons):
    spec = {"model": mdir, "calibration": os.path.join(ddir, "calib.txt"), "heldout": os.path.join(ddir, "heldout.txt"),
            "output": os.path.join(tmp, name), "target": {"device": dev, "workload": wl}, "constraints": cons,
            "search": {"steps": 300, "seed": 0, "export_target": os.environ.get("AC_EXPORT_TARGET", "deci"),
                       "method": os.environ.get("AC_SEARCH_METHOD", "dnas"),
                       "dnas_steps": int(os.environ.get("AC_DNAS_STEPS", "300")),
                       "cotrain": os.environ.get("AC_COTRAIN", "0") == "1"},
            "calibration_tokens": 8192, "eval": {"ctx": 128, "windows": 48}}
    if distill_tokens(mname):
        spec["distill"] = {"tokens": distill_tokens(mname)}
        if os.path.exists(os.path.join(ddir, "train.txt")):
            spec["distill"]["text"] = os.path.join(ddir, "train.txt")
    sp = os.path.join(tmp, name + ".json")
    json.dump(spec, open(sp, "w"))
    out = run([os.path.join(BUILD, "autocompress"), "compress", sp])
    return [json.loads(l) for l in out.splitlines() if l.startswith("{")][-1]["data"]


def write_json(rows):
    """Every row so far as JSON (AC_BENCH_JSON), rewritten after each job so a cut run keeps its rows."""
    if not os.environ.get("AC_BENCH_JSON"):
        return
    with open(os.environ["AC_BENCH_JSON"], "w") as f:
        json.dump([row_json(*r) for r in rows], f, indent=1)


def main():
    if len(sys.argv) > 2 and sys.argv[1] == "--from":  # print the table of saved AC_BENCH_JSON files (cut runs too)
        for f in sys.argv[2:]:
            rows = json.load(open(f))
            print(f"== {f}: search.method {rows[0]['search_method'] if rows else '?'}, "
                  f"distill {rows[0]['distill_tokens'] if rows else '?'} tokens, {len(rows)} jobs")
            print_table(rows)
        return 0
    tmp = tempfile.mkdtemp(prefix="acbench_")
    rows = []
    for mname, mdir, ddir in models():
        if not os.path.exists(os.path.join(mdir, "config.json")):
            print(f"skipping {mname}: {mdir} has no config.json")
            continue
        for i, (sname, dev, wl, limits) in enumerate(SCENARIOS):
            if str(i) not in os.environ.get("AC_BENCH_SCENARIOS", "0,1,2,3").split(","):
                continue
            req = os.path.join(tmp, "est.json")
            json.dump({"model": mdir, "target": {"device": dev, "workload": wl}}, open(req, "w"))
            base = json.loads(run([os.path.join(BUILD, "autocompress"), "estimate", req]))["figures"]
            for level in [int(x) for x in os.environ.get("AC_BENCH_LEVELS", "0,1").split(",")]:
                lim = [(k, m, f[level]) for k, m, f in limits]
                cons = {k: base[m] * f for k, m, f in lim}
                t0 = time.time()
                res = job(tmp, f"{mname}-{i}-{level}", mname, mdir, ddir, dev, wl, cons)
                res["_seconds"] = time.time() - t0
                rows.append((mname, sname, lim, cons, res))
                write_json(rows)
                ts = res.get("timings_s", {})
                print(f"  {mname} / {sname} / {level}: {res['_seconds']:.0f} s (" +
                      ", ".join(f"{k} {ts[k]:.0f}" for k in ("calibrate", "search", "distill", "evaluate") if k in ts) +
                      f"; load {os.getloadavg()[0]:.1f})", file=sys.stderr, flush=True)

    print_table([row_json(*r) for r in rows])


def row_json(mn, sn, lim, c, r):
    """One job as written to AC_BENCH_JSON (and read back by --from)."""
    arm = lambda x: {"perplexity": x["perplexity"], "perplexity_pruned": x.get("perplexity_pruned"),
                     "distilled": "distill" in x, "feasible": x.get("feasible", True),
                     "architecture": arch_str(x["architecture"]) if "architecture" in x else None}
    return {"model": mn, "scenario": sn, "limits": lim, "constraints": c, "seconds": r["_seconds"],
            "timings_s": {k: round(v, 1) for k, v in r.get("timings_s", {}).items()},
            "search_method": os.environ.get("AC_SEARCH_METHOD", "dnas"), "distill_tokens": distill_tokens(mn),
            **{k: arm(r[k]) for k in ("baseline", "minitron", "autocompress")}}


def print_table(rows):
    """The comparison table and the win count, from row_json() rows."""
    dist = lambda x: x["perplexity"] if x.get("distilled", x.get("perplexity_pruned") is not None) else None
    pre = lambda x: x["perplexity_pruned"] if x.get("perplexity_pruned") is not None else x["perplexity"]
    fmt = lambda v: f"{v:8.2f}" if isinstance(v, (int, float)) else f"{'-':>8}"
    print(f"{'model':14} {'scenario':31} {'limit (x unpruned)':28} {'base':>8} | {'Minitron':>8} {'AutoC':>8} | "
          f"{'Mt+dist':>8} {'AC+dist':>8} | Minitron arch / AutoCompress arch")
    wins = wins_d = nd = both = wins_both = 0
    losses = []
    for r in rows:
        mname, sname, limits, m, a = r["model"], r["scenario"], r["limits"], r["minitron"], r["autocompress"]
        lim = ", ".join(f"{k.split('_', 1)[1]} {f:.2f}" for k, _, f in limits)
        mf = "" if m["feasible"] else "*"
        print(f"{mname:14} {sname:31} {lim:28} {r['baseline']['perplexity']:8.2f} | {pre(m):7.2f}{mf or ' '} "
              f"{pre(a):8.2f} | {fmt(dist(m))} {fmt(dist(a))} | {m['architecture']} / {a['architecture']}")
        win = pre(a) < pre(m) or not m["feasible"]
        wins += win
        if m["feasible"]:
            both += 1
            wins_both += pre(a) < pre(m)
        if not win:
            losses.append(f"{mname}/{sname}/{lim}: Minitron {pre(m):.2f} vs AutoCompress {pre(a):.2f}")
        if dist(m) is not None and dist(a) is not None:
            nd += 1
            wins_d += dist(a) < dist(m)
            if dist(a) >= dist(m):
                losses.append(f"{mname}/{sname}/{lim} after distillation: Minitron {dist(m):.2f} vs "
                              f"AutoCompress {dist(a):.2f}")
    print("* Minitron infeasible: no point of its capped grid meets the limit (the closest one is shown)")
    print(f"AutoCompress reaches lower held-out perplexity than Minitron under the same limit in {wins} of {len(rows)} "
          f"cases ({wins_both} of the {both} where Minitron's grid meets the limit)"
          + (f"; after equal distillation in {wins_d} of {nd}" if nd
             else "; after equal distillation: not run (set AC_BENCH_DISTILL)"))
    for l in losses:
        print("  lost:", l)


if __name__ == "__main__":
    sys.exit(main())
