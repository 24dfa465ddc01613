#!/usr/bin/env python3
"""How much of the pruning loss distillation recovers on the tiny fortunes
model: one `autocompress compress` run at a 50 % parameter limit with a
fixed distillation budget (spec "distill"), which distils every arm
(Minitron and AutoCompress) from the unpruned model with the same budget.
Prints, per arm, held-out perplexity of the unpruned model, of the pruned
model and after distillation, and the share of the gap closed:
(ppl_pruned - ppl_distilled) / (ppl_pruned - ppl_base). Goal: >= 0.5 at
100k tokens. With a third argument `puzzle` the job also runs the puzzle
arm (docs/puzzle.md), whose block-local distillation comes out of the same
budget. Usage: bench_distill.py [TOKENS] [LIMIT_FRACTION] [puzzle]."""
import json
import os
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BUILD = os.path.abspath(os.environ.get("AC_BUILD", os.path.join(ROOT, "build")))
TINY = os.path.join(BUILD, "models", "tiny")
DATA = os.path.join(BUILD, "data")


def main():
    tokens = int(sys.argv[1]) if len(sys.argv) > 1 else 100000
    frac = float(sys.argv[2]) if len(sys.argv) > 2 else 0.5
    tmp = tempfile.mkdtemp(prefix="acdistill_")
    est = os.path.join(tmp, "est.json")
    json.dump({"model": TINY, "target": {"device": "H100", "workload": {"batch": 8, "prompt_len": 512, "gen_len": 128}}}, open(est, "w"))
    base_params = json.loads(subprocess.run([os.path.join(BUILD, "autocompress"), "estimate", est], capture_output=True, text=True,
                                            check=True).stdout)["figures"]["params"]
    # distil on the training split: the calibration text alone is ~30k tokens
    spec = {"model": TINY, "calibration": os.path.join(DATA, "calib.txt"), "heldout": os.path.join(DATA, "heldout.txt"),
            "output": os.path.join(tmp, "out"), "target": {"device": "H100", "workload": {"batch": 8, "prompt_len": 512, "gen_len": 128}},
            "constraints": {"max_params": base_params * frac}, "search": {"steps": 300, "seed": 0}, "calibration_tokens": 16384,
            "eval": {"ctx": 128, "windows": 48},
            "distill": {"tokens": tokens, "text": os.path.join(DATA, "train.txt"), "lr": 2e-3, "seq_len": 128, "batch": 8, "temperature": 1}}
    puzzle = len(sys.argv) > 3 and sys.argv[3] == "puzzle"
    if puzzle:
        spec["puzzle"] = {"enabled": True}
    sp = os.path.join(tmp, "spec.json")
    json.dump(spec, open(sp, "w"))
    out = subprocess.run([os.path.join(BUILD, "autocompress"), "compress", sp], capture_output=True, text=True, check=True).stdout
    r = [json.loads(l) for l in out.splitlines() if l.startswith("{")][-1]["data"]
    base = r["baseline"]["perplexity"]
    print(f"tiny model, {base_params:.0f} parameters, limit {frac:.0%} ({base_params * frac:.0f}), distillation budget {tokens} tokens")
    print(f"{'arm':13} {'params':>8} {'base ppl':>9} {'pruned ppl':>11} {'distilled ppl':>14} {'gap closed':>11} {'KL first':>9} "
          f"{'KL last':>8} {'seconds':>8}")
    shares = []
    for arm in ("minitron", "autocompress", "puzzle"):
        a = r.get(arm)
        if not a or "distill" not in a:
            continue
        pp, pd, d = a["perplexity_pruned"], a["perplexity"], a["distill"]
        share = (pp - pd) / (pp - base) if pp > base else float("nan")
        shares.append(share)
        print(f"{arm:13} {a['predicted']['params']:8.0f} {base:9.2f} {pp:11.2f} {pd:14.2f} {share:11.2f} {d['loss_first']:9.4f} "
              f"{d['loss_last']:8.4f} {d['seconds']:8.1f}")
        if arm == "puzzle":
            b = a["budget"]
            print(f"{'':13} budget: {b['bld_tokens']} BLD + {b['distill_tokens']} distillation tokens; BLD {a['bld']['seconds']:.1f} s, "
                  f"{len(a['mip']['iterations'])} solve(s), feasible {a['feasible']}")
    print(f"share of the perplexity gap closed by {tokens} tokens: " + ", ".join(f"{s:.2f}" for s in shares) + " (goal: >= 0.5)")


if __name__ == "__main__":
    main()
