#!/usr/bin/env python3
"""A multiple-choice task from the project's own text (the tiny model's
Debian fortunes), in the JSONL that a job's eval.tasks reads (docs/tasks.md):
each question is the first half of a fortune as the context, its true next
words as one choice and, as the others, the same number of words from the
second halves of other fortunes. A model that has learnt the text's style
and sense scores above chance (1 / choices). Standard library only.
--items lines takes each non-empty line as an item instead of each
paragraph: for text of one sentence a line, such as the second model's
King James verses (build/data/second/heldout.txt, one chapter a paragraph).

  tools/make_fortune_task.py --text build/data/heldout.txt --out build/data/fortunes-mc.jsonl
  tools/make_fortune_task.py --items lines --text build/data/second/heldout.txt --out build/data/kjv-mc.jsonl
"""
import argparse
import json
import random
import sys


def fortunes(text):
    """The fortunes of a `fortune` file dump: paragraphs split by blank lines
    (and the strfile separator '%'), whitespace folded."""
    out, cur = [], []
    for line in text.splitlines():
        if not line.strip() or line.strip() == "%":
            if cur:
                out.append(" ".join(" ".join(cur).split()))
            cur = []
        else:
            cur.append(line)
    if cur:
        out.append(" ".join(" ".join(cur).split()))
    return out


def lines(text):
    """Every non-empty line, whitespace folded (--items lines)."""
    return [" ".join(ln.split()) for ln in text.splitlines() if ln.strip() and ln.strip() != "%"]


def make_task(text, n, choices, words, seed, items="paragraphs"):
    rnd = random.Random(seed)
    pool = [f.split() for f in (lines(text) if items == "lines" else fortunes(text))]
    pool = [w for w in pool if len(w) >= 2 * words and "--" not in w[: len(w) // 2]]
    if len(pool) < choices:
        raise SystemExit(f"only {len(pool)} items of at least {2 * words} words: need {choices}")
    rnd.shuffle(pool)
    rows = []
    for i, w in enumerate(pool[:n]):
        cut = len(w) // 2
        ending = " ".join(w[cut:cut + words])
        others = [p for j, p in enumerate(pool) if j != i]
        wrong = set()
        while len(wrong) < choices - 1:
            p = rnd.choice(others)
            c = rnd.randrange(len(p) // 2, len(p) - words + 1)
            cand = " ".join(p[c:c + words])
            if cand != ending:
                wrong.add(cand)
        opts = sorted(wrong)
        gold = rnd.randrange(choices)
        opts.insert(gold, ending)
        rows.append({"context": " ".join(w[:cut]), "choices": opts, "gold": gold})
    return rows


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--text", required=True, help="UTF-8 text of fortunes (blank-line separated)")
    ap.add_argument("--out", required=True, help="JSONL to write ('-': stdout)")
    ap.add_argument("--n", type=int, default=200, help="questions (at most one per fortune)")
    ap.add_argument("--choices", type=int, default=4)
    ap.add_argument("--words", type=int, default=4, help="words in each choice")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--items", choices=("paragraphs", "lines"), default="paragraphs",
                    help="what one question is made from: a blank-line separated paragraph (a fortune) or a line")
    a = ap.parse_args()
    with open(a.text, encoding="utf-8") as f:
        rows = make_task(f.read(), a.n, a.choices, a.words, a.seed, a.items)
    out = sys.stdout if a.out == "-" else open(a.out, "w", encoding="utf-8")
    for r in rows:
        out.write(json.dumps(r, ensure_ascii=False) + "\n")
    if out is not sys.stdout:
        out.close()
    print(f"{len(rows)} questions, {a.choices} choices each -> {a.out}", file=sys.stderr)


if __name__ == "__main__":
    main()
