#!/usr/bin/env python3
"""Tokenizer speed, side by side in one run:
  - byte-level (the tiny model's Llama-3-style tokenizer.json): the C
    tokenizer (`autocompress tokenize`) against the Python reference BPE of
    tests/ref_llama.py on the same held-out text;
  - SentencePiece-style (the sp_legacy fixture): the C tokenizer against the
    sentencepiece library (C++) that the fixture's model came from;
  - scaling: the C tokenizer on 1x and 8x the text (linear time: ratio ~8).
Times are best of 3 and include process start and reading the file."""
import json
import os
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, os.path.join(ROOT, "tests"))
import ref_llama as R  # noqa: E402

BUILD = os.path.abspath(os.environ.get("AC_BUILD", os.path.join(ROOT, "build")))
CLI = os.path.join(BUILD, "autocompress")


def best(fn, reps=3):
    out, t = None, 1e30
    for _ in range(reps):
        t0 = time.perf_counter()
        out = fn()
        t = min(t, time.perf_counter() - t0)
    return out, t


def c_encode(tok_json, path):
    r = subprocess.run([CLI, "tokenize", tok_json, path], capture_output=True, text=True, check=True)
    return list(map(int, r.stdout.split()))


def main():
    text_path = os.path.join(BUILD, "data", "heldout.txt")
    tiny_tok = os.path.join(BUILD, "models", "tiny", "tokenizer.json")
    text = open(text_path).read()
    mb = len(text.encode()) / 1e6

    tj = json.load(open(tiny_tok))
    vocab = dict(tj["model"]["vocab"])
    for a in tj["added_tokens"]:
        vocab[a["content"]] = a["id"]
    merges = [tuple(m.split(" ", 1)) for m in tj["model"]["merges"]]
    pattern = tj["pre_tokenizer"]["pretokenizers"][0]["pattern"]["Regex"]
    specials = [a["content"] for a in tj["added_tokens"]]
    ids_c, t_c = best(lambda: c_encode(tiny_tok, text_path))
    ids_py, t_py = best(lambda: R.bpe_encode(text, vocab, merges, pattern=pattern, specials=specials), reps=1)
    print(f"byte-level, {mb:.2f} MB: C {mb / t_c:.2f} MB/s, Python reference {mb / t_py:.2f} MB/s, ratio {t_py / t_c:.1f}x "
          f"(same ids: {ids_c == ids_py})")

    sp_dir = os.path.join(BUILD, "fixtures", "tok")
    sp_model = os.path.join(sp_dir, "sp_train", "sp.model")
    if os.path.exists(sp_model):
        import sentencepiece as spm
        sp = spm.SentencePieceProcessor(model_file=sp_model)
        sp_tok = os.path.join(sp_dir, "sp_legacy", "tokenizer.json")
        ids_c, t_c = best(lambda: c_encode(sp_tok, text_path))
        ids_sp, t_sp = best(lambda: sp.encode(open(text_path).read()))
        print(f"SentencePiece-style, {mb:.2f} MB: C {mb / t_c:.2f} MB/s, sentencepiece {mb / t_sp:.2f} MB/s, ratio {t_sp / t_c:.2f}x "
              f"(same ids: {ids_c == ids_sp})")
    else:
        print("SentencePiece-style: no fixture (make fixtures with python3-sentencepiece)")

    with tempfile.NamedTemporaryFile("w", suffix=".txt", delete=False) as f:
        f.write(text * 8)
        big = f.name
    try:
        _, t1 = best(lambda: c_encode(tiny_tok, text_path))
        _, t8 = best(lambda: c_encode(tiny_tok, big))
        print(f"scaling: 8x the text takes {t8 / t1:.1f}x the time (linear: ~8)")
    finally:
        os.unlink(big)


if __name__ == "__main__":
    main()
