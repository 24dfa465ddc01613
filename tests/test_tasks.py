#!/usr/bin/env python3
"""Multiple-choice task accuracy (src/runtime/tasks.c, `autocompress tasks`)
against an independent reference: the float64 PyTorch Llama of ref_llama.py
over the tiny model's weights, the Python BPE of ref_llama.py over its
tokenizer.json, and lm-evaluation-harness's rules written out here from its
code (_encode_pair; acc = argmax of summed log-likelihoods, acc_norm =
argmax of log-likelihood / len(choice) in characters; stderr = sample
standard deviation / sqrt(n)). Plus the task file's errors naming the line,
and the fortune task made from the training text scoring above chance, and
the generator's --items lines (one question a verse of the second model)."""
import json
import math
import os
import subprocess
import sys
import tempfile

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import ref_llama as R  # noqa: E402
from harness import BUILD, DATA, ROOT, TINY, Runner  # noqa: E402

CLI = os.path.join(BUILD, "autocompress")
WORK = tempfile.mkdtemp(prefix="ac_tasks_")
sys.path.insert(0, os.path.join(ROOT, "tools"))
import make_fortune_task  # noqa: E402

# Lines the fortune generator does not make: an empty context, trailing
# whitespace on the context, a partial-evaluation (Winogrande) line, no
# delimiter, a choice with non-ASCII characters (acc_norm counts characters,
# not bytes) and a gold index that is not 0.
EDGE = [
    {"context": "", "choices": ["The fortune", "A penny saved"], "gold": 1},
    {"context": "Do not meddle in the affairs of wizards, for they are subtle and quick to \n",
     "choices": ["anger.", "breakfast.", "über-große Äpfel."], "gold": 0},
    {"contexts": ["The trophy did not fit in the suitcase because the trophy",
                  "The trophy did not fit in the suitcase because the suitcase"],
     "continuation": "was too big.", "gold": 0},
    {"context": "You will be", "choices": [" married", " rich", " hungry soon"], "gold": 2, "target_delimiter": ""},
]


def ref_tokenizer():
    tj = json.load(open(os.path.join(TINY, "tokenizer.json")))
    vocab = tj["model"]["vocab"]
    mer = [tuple(m.split(" ", 1)) if isinstance(m, str) else tuple(m) for m in tj["model"]["merges"]]
    specials = [a["content"] for a in tj["added_tokens"]]
    return lambda s: R.bpe_encode(s, vocab, mer, pattern=R.LLAMA3_SPLIT, specials=specials)


def encode_pair(enc, context, continuation, prefix_id):
    """lm-evaluation-harness's TemplateLM._encode_pair, with the empty-context rule of its loglikelihood()."""
    if context == "":
        return [prefix_id], enc(continuation)
    n_spaces = len(context) - len(context.rstrip())
    if n_spaces > 0:
        continuation = context[-n_spaces:] + continuation
        context = context[:-n_spaces]
    whole = enc(context + continuation)
    ctx = enc(context)
    return ctx, whole[len(ctx):]


def requests(doc):
    """(context, continuation, text whose length acc_norm divides by) per choice, as the harness builds them."""
    d = doc.get("target_delimiter", " ")
    if "contexts" in doc:  # multiple_input: the choices are contexts, one shared target
        return [(c, d + doc["continuation"], c) for c in doc["contexts"]]
    return [(doc["context"], d + ch, ch) for ch in doc["choices"]]


def reference(docs, max_len=0):
    cfg = json.load(open(os.path.join(TINY, "config.json")))
    arch = R.arch_from_config(cfg)
    W = {k: v.double() for k, v in R.load_safetensors(os.path.join(TINY, "model.safetensors")).items()}
    enc = ref_tokenizer()
    prefix = cfg["bos_token_id"] if cfg.get("bos_token_id") is not None else cfg["eos_token_id"]
    lls, norms = [], []
    for doc in docs:
        row, nrow = [], []
        for ctx, cont, norm in requests(doc):
            c, k = encode_pair(enc, ctx, cont, prefix)
            whole = c + k
            # the harness's input: (context + continuation)[-(max_length + 1):][:-1]
            inp = whole[-(max_len + 1):][:-1] if max_len else whole[:-1]
            with torch.no_grad():
                logits = R.forward(arch, W, torch.tensor([inp]))[0]
            lp = torch.log_softmax(logits, dim=-1)
            row.append(sum(float(lp[len(inp) - len(k) + i, t]) for i, t in enumerate(k)))
            nrow.append(float(len(norm)))
        lls.append(row)
        norms.append(nrow)
    acc = [float(np.argmax(l) == d["gold"]) for l, d in zip(lls, docs)]
    accn = [float(np.argmax(np.array(l) / np.array(n)) == d["gold"]) for l, n, d in zip(lls, norms, docs)]
    return lls, norms, acc, accn


def stderr(xs):
    xs = np.array(xs)
    return float(np.std(xs, ddof=1) / math.sqrt(len(xs)))


def run_cli(path, *extra):
    p = subprocess.run([CLI, "tasks", TINY, path, "--lls", *extra], capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr
    return json.loads(p.stdout)[os.path.basename(path)[:-len(".jsonl")]]


def write(name, docs):
    path = os.path.join(WORK, name + ".jsonl")
    with open(path, "w") as f:
        for d in docs:
            f.write(json.dumps(d, ensure_ascii=False) + "\n")
    return path


def small_task():
    text = open(os.path.join(DATA, "heldout.txt"), encoding="utf-8").read()
    return make_fortune_task.make_task(text, 14, 4, 4, 5) + EDGE


def check_against_reference(gemm, tol, max_len=0):
    docs = small_task()
    path = write("small_" + gemm, docs)
    got = run_cli(path, "--gemm", gemm, "--batch", "4", "--max-len", str(max_len))
    lls, norms, acc, accn = reference(docs, max_len)
    worst = 0.0
    for i, (a, b) in enumerate(zip(got["lls"], lls)):
        assert len(a) == len(b), (i, a, b)
        worst = max(worst, max(abs(x - y) for x, y in zip(a, b)))
    assert worst < tol, f"largest log-likelihood difference {worst:.2e} >= {tol}"
    # the accuracies follow from the log-likelihoods: the C scorer's own
    # argmaxes (the harness's rule applied here to its lls) give its acc and
    # acc_norm, and agree with the reference's on every question whose top
    # two choices are further apart than twice the largest difference
    n = len(docs)
    assert got["n"] == n, got
    acc_c = [float(np.argmax(l) == d["gold"]) for l, d in zip(got["lls"], docs)]
    accn_c = [float(np.argmax(np.array(l) / np.array(m)) == d["gold"]) for l, m, d in zip(got["lls"], norms, docs)]
    assert abs(got["acc"] - sum(acc_c) / n) < 1e-12 and abs(got["acc_norm"] - sum(accn_c) / n) < 1e-12, got
    assert abs(got["stderr"] - stderr(acc_c)) < 1e-12 and abs(got["acc_norm_stderr"] - stderr(accn_c)) < 1e-12, got
    close = 0
    for i, (l, m) in enumerate(zip(lls, norms)):
        for mine, ref, v in ((acc_c, acc, np.array(l)), (accn_c, accn, np.array(l) / np.array(m))):
            s = np.sort(v)
            if s[-1] - s[-2] > 2 * worst:
                assert mine[i] == ref[i], (i, got["lls"][i], l)
            else:
                close += 1
    assert close <= 2, f"{close} near ties: pick another seed"
    if gemm == "exact":
        assert close == 0 and acc_c == acc and accn_c == accn, (acc_c, acc, accn_c, accn)
    # acc and acc_norm differ on at least one question here, so the test tells them apart
    assert acc != accn, (acc, accn)
    print(f"   {gemm}: {n} questions, acc {got['acc']:.3f} acc_norm {got['acc_norm']:.3f}, "
          f"largest |ll - ref| {worst:.1e} nats, {close} near ties")


def test_exact_gemms_match_float64_reference():
    check_against_reference("exact", 1e-4)


def test_bf16_gemms_match_float64_reference():
    check_against_reference("bf16", 5e-2)


def test_long_inputs_keep_their_last_tokens():
    """Inputs longer than the context lose their first tokens, as the harness truncates: a context just above
    the longest continuation, so most requests are cut."""
    enc, prefix = ref_tokenizer(), json.load(open(os.path.join(TINY, "config.json")))["bos_token_id"]
    pairs = [encode_pair(enc, c, k, prefix) for d in small_task() for c, k, _ in requests(d)]
    max_len = max(len(k) for _, k in pairs) + 2
    cut = sum(len(c) + len(k) - 1 > max_len for c, k in pairs)
    assert cut >= len(pairs) // 2, (cut, len(pairs))
    check_against_reference("exact", 1e-4, max_len=max_len)
    print(f"   --max-len {max_len}: {cut} of {len(pairs)} requests cut")


def test_bad_lines_name_the_line():
    cases = [
        ('{"context": "a", "choices": ["b", "c"], "gold": 2}', "line 2: gold 2 is outside the 2 choices"),
        ('{"context": "a", "choices": [], "gold": 0}', "line 2: \"choices\" must be an array"),
        (json.dumps({"context": "a", "choices": ["b"] * 65, "gold": 0}), "line 2: \"choices\" must be an array of 1 to 64"),
        ('{"context": "a", "choices": ["b"], "gold": 0, "label": 1}', "line 2: unknown field \"label\""),
        ('{"contexts": ["a", "b"], "gold": 0}', "line 2: \"continuation\" must be a string"),
        ('not json', "line 2: not JSON"),
    ]
    for bad, want in cases:
        path = os.path.join(WORK, "bad.jsonl")
        with open(path, "w") as f:
            f.write('{"context": "x", "choices": ["y", "z"], "gold": 0}\n' + bad + "\n")
        p = subprocess.run([CLI, "tasks", TINY, path], capture_output=True, text=True, timeout=60)
        assert p.returncode == 1 and want in p.stderr, (bad, p.stderr)


def test_fortune_task_above_chance():
    """The demo's task (tools/make_fortune_task.py over held-out fortunes, its default 200 questions of 4 choices):
    the trained tiny model beats 1/4."""
    path = os.path.join(WORK, "fortunes.jsonl")
    subprocess.run([sys.executable, os.path.join(ROOT, "tools", "make_fortune_task.py"), "--text",
                    os.path.join(DATA, "heldout.txt"), "--out", path], check=True, capture_output=True)
    with open(path) as f:
        assert all(len(json.loads(ln)["choices"]) == 4 for ln in f), "not 4 choices a question"
    got = run_cli(path)
    assert got["n"] == 200, got
    # chance is 0.25 with a standard error of about 0.031 at n = 200
    assert got["acc"] > 0.25 + 3 * 0.031, got
    print(f"   fortunes: acc {got['acc']:.3f} +- {got['stderr']:.3f}, acc_norm {got['acc_norm']:.3f}")


def test_line_items():
    """--items lines (the King James verses of the second model): one question per line of at least 2 x words
    words, none from a shorter line, each context the first half of its line and the gold choice the words after
    it, each wrong choice words from the second half of another line; paragraphs (the default) give one question
    per blank-line separated paragraph from the same text."""
    verses = [" ".join(f"w{v}x{k}" for k in range(8 + v % 5)) for v in range(30)]
    text = "\n".join(verses[:15]) + "\n\n" + "\n".join(verses[15:]) + "\n  \nshort line only\n"
    rows = make_fortune_task.make_task(text, 100, 4, 4, 3, items="lines")
    assert len(rows) == 30, len(rows)
    seen = set()
    for r in rows:
        gold = r["choices"][r["gold"]]
        line = next(v for v in verses if v.startswith(r["context"] + " "))
        w = line.split()
        assert r["context"] == " ".join(w[:len(w) // 2]) and gold == " ".join(w[len(w) // 2:len(w) // 2 + 4]), r
        seen.add(line)
        for i, c in enumerate(r["choices"]):
            if i != r["gold"]:
                src = [v.split() for v in verses if c in v and v != line]
                assert len(c.split()) == 4 and src, (r, c)
                assert any(" ".join(s[j:j + 4]) == c for s in src for j in range(len(s) // 2, len(s) - 3)), (r, c)
    assert len(seen) == 30
    assert len(make_fortune_task.make_task(text, 100, 2, 4, 3)) == 2  # the default: one per paragraph


def main():
    if not os.path.exists(os.path.join(TINY, "config.json")):
        print("SKIP all: tiny model not built (make tiny-model)")
        print("RESULT 0 0 1")
        sys.exit(0)
    r = Runner()
    try:
        for t in (test_exact_gemms_match_float64_reference, test_bf16_gemms_match_float64_reference,
                  test_long_inputs_keep_their_last_tokens, test_bad_lines_name_the_line, test_fortune_task_above_chance,
                  test_line_items):
            r.run(t)
    finally:
        subprocess.run(["rm", "-rf", WORK])
    r.done()


if __name__ == "__main__":
    main()
