#!/usr/bin/env python3
"""distill.tokens is each arm's total training budget, and the autocompress
arm's structure is chosen by its loss after a short distillation
(src/pipeline/candidates.c, docs/search.md "KD-aware choice"). One job on
the tiny model (CLI `compress`, H100 at 1.12x the base's tokens/s, deci,
the demo's setting where the search's and Minitron's structures differ):

- budget: each arm's report "budget" {ranking, gates, final, total} sums to
  distill.tokens; Minitron's ranking and gates are 0; the autocompress arm's
  ranking equals the tokens its candidates trained on, and its final
  distillation trains no more than its final share;
- the report lists every candidate (structure, predicted figures, loss
  before and after its short distillation); the chosen one has the lowest
  loss after it among the ranked, and its structure is the arm's;
- mutation check: ranking by the zero-shot loss (before the short
  distillation) instead would have chosen a candidate whose loss after it is
  strictly higher on this case (the two rankings disagree on the tiny model).
A second job without room for a ranking (fewer than 4 steps a candidate)
gives the whole budget to the search's structure."""
import json
import os
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from harness import BUILD, DATA, TINY, Runner, cli_estimate  # noqa: E402

WL = {"batch": 256, "prompt_len": 2048, "gen_len": 256}


def job(tmp, name, distill, dnas_steps=300, windows=48, search=None):
    base = cli_estimate({"model": TINY, "target": {"device": "H100", "workload": WL}})["figures"]
    spec = {"model": TINY, "calibration": os.path.join(DATA, "calib.txt"), "heldout": os.path.join(DATA, "heldout.txt"),
            "output": os.path.join(tmp, name), "target": {"device": "H100", "workload": WL},
            "constraints": {"min_tokens_per_s": base["tokens_per_s"] * 1.12},
            "search": dict({"steps": 300, "seed": 1, "export_target": "deci", "dnas_steps": dnas_steps},
                           **(search or {})),
            "calibration_tokens": 8192, "eval": {"ctx": 128, "windows": windows},
            "distill": dict({"text": os.path.join(DATA, "train.txt"), "seed": 2}, **distill)}
    p = os.path.join(tmp, name + ".json")
    json.dump(spec, open(p, "w"))
    out = subprocess.run([os.path.join(BUILD, "autocompress"), "compress", p], capture_output=True, text=True,
                         timeout=1800)
    assert out.returncode == 0, out.stderr[-3000:]
    return json.load(open(os.path.join(tmp, name, "report.json")))


def layers(a):
    return [(l["heads"], l["kv_heads"], l["ffn"]) for l in a["layers"]]


def check_budget(r, total):
    for arm in ("minitron", "autocompress"):
        b = r[arm]["budget"]
        assert b["ranking"] + b["gates"] + b["final"] == b["total"] == total, (arm, b)
        assert 0 < r[arm]["distill"]["tokens"] <= b["final"], (arm, b, r[arm]["distill"])
    m = r["minitron"]["budget"]
    assert m["ranking"] == 0 and m["gates"] == 0 and m["final"] == total, m


def test_ranked_choice():
    tmp = tempfile.mkdtemp(prefix="ackd_")
    total = 24576
    r = job(tmp, "ranked", {"tokens": total, "candidates": 3, "ranking_tokens": 12288, "candidate_steps": 4})
    check_budget(r, total)
    a = r["autocompress"]
    cands = a["candidates"]
    ranked = [c for c in cands if "loss_after" in c]
    assert len(ranked) >= 2, cands
    assert sum(c["tokens"] for c in ranked) == a["budget"]["ranking"] > 0, (a["budget"], ranked)
    assert all(c["steps"] == 4 and c["feasible"] for c in ranked), ranked
    for c in cands:
        assert {"source", "architecture", "predicted", "constraints", "predicted_loss_increase"} <= set(c), c
    chosen = [c for c in cands if c["chosen"]]
    assert len(chosen) == 1, cands
    best = min(ranked, key=lambda c: c["loss_after"])
    assert chosen[0] is best, ([(c["source"], c["loss_before"], c["loss_after"]) for c in ranked], chosen[0]["source"])
    assert layers(chosen[0]["architecture"]) == layers(a["architecture"]) and a["feasible"], (chosen[0], a["architecture"])
    assert a["perplexity_pruned"] > 1 and a["perplexity_ranked"] > 1 and a["perplexity"] > 1, a
    # mutation: the zero-shot ranking's pick ends worse after the same short distillation
    zs = min(ranked, key=lambda c: c["loss_before"])
    assert zs["loss_after"] > best["loss_after"], \
        ("zero-shot and post-distillation rankings agree here: the mutation check cannot tell them apart",
         [(c["source"], c["loss_before"], c["loss_after"]) for c in ranked])
    print(f"  chosen {best['source']} (after {best['loss_after']:.4f}); zero-shot would pick {zs['source']} "
          f"(after {zs['loss_after']:.4f})", flush=True)


def test_no_room_for_ranking():
    tmp = tempfile.mkdtemp(prefix="ackd_")
    total = 8192  # a quarter is 2048 tokens: under 4 steps of 1024 for each candidate
    r = job(tmp, "unranked", {"tokens": total, "candidates": 3}, dnas_steps=30, windows=4)
    check_budget(r, total)
    a = r["autocompress"]
    assert a["budget"]["ranking"] == 0 and a["budget"]["final"] == total, a["budget"]
    assert "ranking" not in a and "candidates" not in a, a.get("candidates")
    assert a["distill"]["tokens"] == total, a["distill"]


def test_kept_weights_budget():
    """search.keep_weights: the co-trained gate search's tokens are the arm's "gates" (steps x dnas_batch x
    dnas_seq_len), the final distillation gets the rest, and the report says the arm's weights are the kept ones
    (tests/test_dnas_gain.c checks that they are the trained ones and lower the held-out loss)."""
    tmp = tempfile.mkdtemp(prefix="ackd_")
    total, steps = 8192, 20
    r = job(tmp, "kept", {"tokens": total}, dnas_steps=steps, windows=4,
            search={"cotrain": True, "keep_weights": True})
    check_budget(r, total)
    a = r["autocompress"]
    assert a["budget"]["gates"] == steps * 4 * 64 and a["budget"]["ranking"] == 0, a["budget"]
    assert a["budget"]["final"] == total - steps * 4 * 64 == a["distill"]["tokens"], (a["budget"], a["distill"])
    assert r["search"]["weights_kept"] is True and r["search"]["steps"] == steps, r["search"]
    assert a["feasible"] and a["perplexity_pruned"] > 1 and a["perplexity"] > 1, a


if __name__ == "__main__":
    if not os.path.exists(os.path.join(TINY, "config.json")):
        sys.exit(print("SKIP all: tiny model not built (make tiny-model)\nRESULT 0 0 1"))
    t = Runner()
    only = sys.argv[1:]  # test names to run (default: all)
    for fn in (test_ranked_choice, test_no_room_for_ranking, test_kept_weights_budget):
        if only and fn.__name__ not in only:
            continue
        t.run(fn)
    t.done()
