#!/usr/bin/env python3
"""Multiple-choice benchmark files, as lm-evaluation-harness reads them
(the Hugging Face datasets' JSON or JSONL), into the JSONL a job's
eval.tasks reads (docs/tasks.md). Each layout gets the harness's zero-shot
prompt, so a job's acc / acc_norm are the harness's on the same model:

  hellaswag   ctx_a, ctx_b, activity_label (or ctx), endings, label
              context "<activity_label>: <ctx_a> <Ctx_b>", the harness's
              preprocess() (" [title]" -> ". ", "[...]" dropped, double spaces)
  arc         question, choices {text, label}, answerKey (also AI2's original
              {"question": {"stem", "choices": [{"text", "label"}]}, "answerKey"})
              context "Question: <question>\\nAnswer:"
  piqa        goal, sol1, sol2, label        context "Question: <goal>\\nAnswer:"
  winogrande  sentence (one "_"), option1, option2, answer ("1"/"2")
              partial evaluation, as the harness does it: one context per
              option (the sentence up to "_" with the option in its place),
              the rest of the sentence the one continuation scored
  mmlu        question, choices (4), answer (index), subject (optional)
              context "The following are multiple choice questions (with
              answers) about <subject>.\\n\\n<question>\\nA. ..\\nD. ..\\nAnswer:",
              choices "A".."D"

  tools/mc2jsonl.py LAYOUT IN.json[l] [OUT.jsonl] [--subject NAME] [--limit N]

Standard library only. A record the layout cannot read stops the run with
its line (JSONL) or index (JSON array).
"""
import argparse
import json
import re
import sys


def hellaswag_pre(text):
    text = text.strip()
    text = text.replace(" [title]", ". ")
    text = re.sub("\\[.*?\\]", "", text)
    return text.replace("  ", " ")


def hellaswag(d, _):
    if "ctx_a" in d:
        ctx = d["ctx_a"] + " " + d.get("ctx_b", "").capitalize()
    else:
        ctx = d["ctx"]
    query = (d["activity_label"] + ": " + ctx) if d.get("activity_label") else ctx
    return {"context": hellaswag_pre(query), "choices": [hellaswag_pre(e) for e in d["endings"]],
            "gold": int(d["label"])}


def arc(d, _):
    q = d["question"]
    if isinstance(q, dict):  # AI2's own layout
        text, labels = [c["text"] for c in q["choices"]], [c["label"] for c in q["choices"]]
        q = q["stem"]
    else:
        text, labels = list(d["choices"]["text"]), list(d["choices"]["label"])
    return {"context": f"Question: {q}\nAnswer:", "choices": text, "gold": labels.index(d["answerKey"])}


def piqa(d, _):
    return {"context": f"Question: {d['goal']}\nAnswer:", "choices": [d["sol1"], d["sol2"]], "gold": int(d["label"])}


def winogrande(d, _):
    s = d["sentence"]
    i = s.index("_")
    return {"contexts": [s[:i] + d["option1"], s[:i] + d["option2"]], "continuation": s[i + 1:].strip(),
            "gold": {"1": 0, "2": 1}[str(d["answer"])]}


def mmlu(d, subject):
    ch = list(d["choices"])
    if len(ch) != 4:
        raise ValueError(f"MMLU has 4 choices, this record {len(ch)}")
    sub = (subject or d.get("subject") or "").replace("_", " ")
    head = f"The following are multiple choice questions (with answers) about {sub}.\n\n" if sub else ""
    body = d["question"].strip() + "".join(f"\n{k}. {c}" for k, c in zip("ABCD", ch)) + "\nAnswer:"
    ans = d["answer"]
    gold = "ABCD".index(ans) if isinstance(ans, str) and ans in "ABCD" and ans else int(ans)
    return {"context": head + body, "choices": ["A", "B", "C", "D"], "gold": gold}


LAYOUTS = {"hellaswag": hellaswag, "arc": arc, "piqa": piqa, "winogrande": winogrande, "mmlu": mmlu}


def records(text):
    """(where, record) from a JSON array, a {"data"|"rows": [...]} object, or JSONL."""
    s = text.lstrip()
    if s.startswith("["):
        return [(f"record {i}", r) for i, r in enumerate(json.loads(s))]
    if s.startswith("{"):
        try:
            whole = json.loads(s)
        except json.JSONDecodeError:
            whole = None  # JSONL
        if isinstance(whole, dict):
            for k in ("data", "rows"):
                if isinstance(whole.get(k), list):
                    return [(f"record {i}", r.get("row", r)) for i, r in enumerate(whole[k])]
            return [("line 1", whole)]
    out = []
    for n, line in enumerate(text.splitlines(), 1):
        if line.strip():
            out.append((f"line {n}", json.loads(line)))
    return out


def convert(layout, text, subject=None, limit=0):
    fn = LAYOUTS[layout]
    out = []
    for where, r in records(text):
        try:
            out.append(fn(r, subject))
        except (KeyError, ValueError, TypeError, IndexError) as ex:
            raise SystemExit(f"{where}: not a {layout} record ({type(ex).__name__}: {ex})")
        if limit and len(out) >= limit:
            break
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("layout", choices=sorted(LAYOUTS))
    ap.add_argument("input", help="JSON or JSONL ('-': stdin)")
    ap.add_argument("output", nargs="?", default="-", help="JSONL (default: stdout)")
    ap.add_argument("--subject", help="mmlu: the subject for the prompt's first line (default: the record's)")
    ap.add_argument("--limit", type=int, default=0, help="first N questions only")
    a = ap.parse_args()
    text = sys.stdin.read() if a.input == "-" else open(a.input, encoding="utf-8").read()
    rows = convert(a.layout, text, a.subject, a.limit)
    out = sys.stdout if a.output == "-" else open(a.output, "w", encoding="utf-8")
    for r in rows:
        out.write(json.dumps(r, ensure_ascii=False) + "\n")
    if out is not sys.stdout:
        out.close()
        print(f"{len(rows)} {a.layout} questions -> {a.output}", file=sys.stderr)


if __name__ == "__main__":
    main()
