#!/usr/bin/env python3
"""The model card (README.md) every export carries, written by `autocompress compress` (the daemon's worker runs the
same stage): its Hugging Face YAML header (base_model, library_name, tags), and every figure in it against the job's
report.json: the limits met or missed, the perplexity of the base and of both arms with the export marked, the
per-layer structure before and after, the CPU timings, and how to load it for the export target (deci with
trust_remote_code and a GGUF; a uniform llama export without); the note when the other arm was better."""
import json
import os
import re
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from harness import BUILD, TINY, Runner, export_ppl  # noqa: E402
from harness import spec as full_spec  # noqa: E402

try:
    import yaml
except ImportError:
    yaml = None

WORK = tempfile.mkdtemp(prefix="ac_card_")


def run_job(name, **search):
    out = os.path.join(WORK, name)
    s = full_spec(output=out)
    s["search"] = dict({"dnas_steps": 40}, **s["search"], **search)
    p = os.path.join(WORK, name + ".json")
    with open(p, "w") as f:
        json.dump(s, f)
    r = subprocess.run([os.path.join(BUILD, "autocompress"), "compress", p], capture_output=True, text=True,
                       timeout=600, env=dict(os.environ, AC_COST_DB=os.path.join(WORK, "cost.db")))
    assert r.returncode == 0, r.stderr
    with open(os.path.join(out, "report.json")) as f:
        rep = json.load(f)
    with open(os.path.join(out, "README.md")) as f:
        card = f.read()
    return rep, card, out


def header(card):
    m = re.match(r"---\n(.*?)\n---\n", card, re.S)
    assert m, card[:200]
    if yaml is None:
        return None
    return yaml.safe_load(m.group(1))


def section(card, title):
    m = re.search(rf"^## {re.escape(title)}\n(.*?)(?=^## |\Z)", card, re.S | re.M)
    assert m, f"no section {title}"
    return m.group(1)


def table(text):
    rows = [ln for ln in text.splitlines() if ln.startswith("|")]
    return [[c.strip() for c in ln.strip("|").split("|")] for ln in rows[2:]]


def check_rule(rep):
    """The export is the arm with the lower held-out loss among those that meet every limit (a tie: the method's)."""
    feas = [a for a in ("minitron", "autocompress") if a in rep and rep[a]["feasible"]]
    assert feas and rep["chosen"] == min(feas, key=lambda a: (rep[a]["nll"], a != rep["method"])), \
        (rep["chosen"], {a: (rep[a]["feasible"], rep[a]["nll"]) for a in ("minitron", "autocompress") if a in rep})


def check_export_is_chosen(rep, out):
    """The exported checkpoint's held-out perplexity, measured again from its files, is the chosen arm's."""
    ppl, want = export_ppl(rep, out), rep[rep["chosen"]]["perplexity"]
    print(f"   the export's perplexity {ppl:.6f}, the report's {want:.6f} ({100 * (ppl / want - 1):+.5f} %)")
    assert abs(ppl - want) <= 2e-3 * want, (ppl, want)
    other = "minitron" if rep["chosen"] == "autocompress" else "autocompress"
    if other in rep and abs(rep[other]["perplexity"] - want) > 1e-2 * want:
        assert abs(ppl - rep[other]["perplexity"]) > 5e-3 * want


def check_common(rep, card):
    check_rule(rep)
    chosen = rep["chosen"]
    assert f"Why this arm: {rep['chosen_reason']}." in card
    assert ("task accuracy is reported" in rep["chosen_reason"]) == bool(rep["baseline"].get("tasks")), rep
    h = header(card)
    if h is not None:
        assert h["base_model"] == os.path.basename(TINY) and h["library_name"] == "transformers", h
        assert h["pipeline_tag"] == "text-generation"
        assert {"autocompress", "pruned", "target-" + rep["target"]["device"].lower()} <= set(h["tags"]), h["tags"]
    # limits: one row per constraint, the export's value and met as in the report
    rows = table(section(card, "Target and limits"))
    lim = rep[chosen]["constraints"]
    assert [r[0] for r in rows] == list(lim), rows
    for r in rows:
        c = lim[r[0]]
        assert float(r[1].split()[1]) == float(f"{c['limit']:.6g}") and float(r[3]) == float(f"{c['value']:.6g}"), r
        assert r[4] == ("yes" if c["met"] else "**no**"), r
        bp = rep["baseline"]["predicted"].get(r[0])
        assert bp is None or float(r[2]) == float(f"{bp:.6g}"), r
    # quality: base, minitron, autocompress perplexities; the export marked once
    rows = table(section(card, "Quality"))
    arms = [a for a in ("baseline", "minitron", "autocompress") if a in rep]
    assert len(rows) == len(arms), rows
    for r, a in zip(rows, arms):
        assert r[0].split()[0] == a, (r, a)  # the arm's one name, as in report.json
        assert r[2].split()[0] == f"{rep[a]['perplexity']:.4f}", (r, a)
        assert ("**this model**" in r[0]) == (a == chosen), r
        if a != "baseline":
            assert r[3] == ("yes" if rep[a]["feasible"] else "**no**"), r
    # structure: one row per layer, before -> after from the two architectures
    rows = table(section(card, "What was pruned"))
    before, after = rep["model"]["architecture"]["layers"], rep[chosen]["architecture"]["layers"]
    assert len(rows) == len(before), rows
    for i, r in enumerate(rows):
        for col, k in ((1, "heads"), (2, "kv_heads"), (3, "ffn")):
            b, a = before[i][k], after[i][k]
            assert r[col] == (str(a) if a == b else f"{b} -> {a}"), (i, k, r)
    # timings on this CPU
    rows = table(section(card, "Measured on the job's CPU"))
    ml = rep["measured_local"]
    assert "base" not in ml and "result" not in ml, list(ml)  # one name per arm
    assert rows[0][0] == "baseline" and rows[0][1:] == [f"{ml['baseline']['ttft_ms']:.3f}", f"{ml['baseline']['tpot_ms']:.3f}"], rows
    assert rows[1][1:] == [f"{ml[chosen]['ttft_ms']:.3f}", f"{ml[chosen]['tpot_ms']:.3f}"], rows
    # the note when the arm not exported met the limits with a lower perplexity
    other = "minitron" if chosen == "autocompress" else "autocompress"
    better = other in rep and rep[other]["feasible"] and rep[other]["perplexity"] < rep[chosen]["perplexity"]
    assert ("Note: the %s arm" % other in card) == better, (better, card[:600])


def test_deci_export_with_gguf():
    rep, card, out = run_job("deci", export_target="gguf")
    check_common(rep, card)
    check_export_is_chosen(rep, out)
    load = section(card, "How to load it")
    # a per-layer result is a DeciLM export (trust_remote_code); Minitron's (layers dropped, then uniform), plain Llama
    deci = "DeciLM" in rep["export"]["format"]
    assert ("vllm serve /path/to/this/folder --trust-remote-code" in load) == deci
    assert ("trust_remote_code=True" in load) == deci
    assert "llama-server -m /path/to/this/folder/model.gguf" in load and os.path.exists(os.path.join(out, "model.gguf"))
    h = header(card)
    assert h is None or {"gguf", "nemotron-nas" if deci else "llama"} <= set(h["tags"])


def test_card_from_report_branches():
    """`autocompress model-card REPORT.json` is the card the job wrote; the loading text of each export format, and
    the note a report whose other arm was better gets, from edited copies of a real report."""
    rep, card, out = run_job("branches")
    cli = os.path.join(BUILD, "autocompress")

    def card_of(r):
        p = os.path.join(WORK, "edited.json")
        with open(p, "w") as f:
            json.dump(r, f)
        x = subprocess.run([cli, "model-card", p], capture_output=True, text=True, check=True)
        return x.stdout
    assert card_of(rep) == card
    deci = json.loads(json.dumps(rep))
    deci["export"] = {"dir": out, "format": "DeciLMForCausalLM (nemotron-nas block_configs)", "dtype": "bf16"}
    load = section(card_of(deci), "How to load it")
    assert "vllm serve /path/to/this/folder --trust-remote-code" in load and "trust_remote_code=True" in load
    assert "a job with `search.export_target` `gguf` writes one" in load
    llama = json.loads(json.dumps(deci))
    llama["export"]["format"] = "LlamaForCausalLM"
    load = section(card_of(llama), "How to load it")
    assert "--trust-remote-code" not in load and "autocompress export-gguf" in load
    # a report whose arm not exported met the limits with a lower perplexity (an older job's rule) says so
    worse = json.loads(json.dumps(rep))
    other = "minitron" if rep["chosen"] == "autocompress" else "autocompress"
    worse[other]["feasible"] = True
    worse[other]["perplexity"] = rep[rep["chosen"]]["perplexity"] * 0.9
    assert f"Note: the {other} arm of the same job also met every limit" in card_of(worse)
    assert "Note: the" not in card


def test_uniform_llama_export():
    rep, card, out = run_job("llama", export_target="llama")
    assert "DeciLM" not in rep["export"]["format"], rep["export"]
    check_common(rep, card)
    check_export_is_chosen(rep, out)
    load = section(card, "How to load it")
    assert "vllm serve /path/to/this/folder\n" in load and "trust_remote_code" not in load, load
    assert "autocompress export-gguf" in load and not os.path.exists(os.path.join(out, "model.gguf"))


def main():
    if not os.path.exists(os.path.join(TINY, "config.json")):
        print("SKIP all: tiny model not built (make tiny-model)")
        print("RESULT 0 0 1")
        sys.exit(0)
    r = Runner()
    try:
        for t in (test_deci_export_with_gguf, test_card_from_report_branches, test_uniform_llama_export):
            r.run(t)
    finally:
        subprocess.run(["rm", "-rf", WORK])
    r.done()


if __name__ == "__main__":
    main()
