#!/usr/bin/env python3
"""Build the trained models used by the demo, the tests and the benchmarks.

Reproducible: fixed seeds, fixed thread count, inputs from Debian packages.
Two corpora (--corpus):
  fortunes  Debian's `fortunes` (default; the tiny 1.4M-parameter model of
            the demo and the tests), one fortune per item;
  kjv       the King James Bible from Debian's `bible-kjv-text` (4.4 MB),
            dumped with its `bible` program (package `bible-kjv`), one
            chapter per item (the second, larger model of the benches:
            `make second-model`).
Steps:
  1. split the items into train / calibration / held-out text files;
  2. train a byte-level BPE tokenizer (Llama-3 style split regex) and write
     tokenizer.json;
  3. train a small Llama-architecture model (GQA, SwiGLU, RoPE) with PyTorch
     and write config.json + model.safetensors (BF16).
The model code is tests/ref_llama.py, the same reference the C engine is
checked against.

--committed DIR (the tiny model's make rule, DIR = tests/models/tiny): after
step 1, when DIR holds a model trained by this script on the same split text
with the same settings (DIR/inputs.json: the SHA-256 of each split file and
the arguments), its files are copied to --out instead of training again
(training takes about 4.5 minutes on 2 cores); otherwise it trains, saying
why. --write-inputs writes inputs.json beside a trained model (`make
tiny-model-retrain` refreshes the committed one).
"""
import argparse
import glob
import hashlib
import json
import os
import random
import re
import shutil
import subprocess
import sys
import time


def threads_arg(argv):
    """--threads N (default 2): read before torch is imported, since OpenBLAS
    fixes its pool size when it is loaded. On a shared, loaded machine one
    thread costs far fewer CPU-seconds a step than two that wait on each other."""
    for i, a in enumerate(argv):
        if a == "--threads" and i + 1 < len(argv):
            return int(argv[i + 1])
        if a.startswith("--threads="):
            return int(a.split("=", 1)[1])
    return 2


THREADS = threads_arg(sys.argv)
os.environ.setdefault("OPENBLAS_NUM_THREADS", str(THREADS))
os.environ.setdefault("OMP_NUM_THREADS", str(THREADS))

import torch  # noqa: E402

import ref_llama as R  # noqa: E402


def load_fortunes(src):
    items = []
    for path in sorted(glob.glob(os.path.join(src, "*"))):
        if "." in os.path.basename(path) or os.path.isdir(path) or os.path.islink(path):
            continue
        with open(path, "rb") as f:
            text = f.read().decode("utf-8", errors="ignore")
        for chunk in text.split("\n%\n"):
            chunk = chunk.strip("\n%")
            if 20 < len(chunk) < 2000:
                items.append(chunk)
    return items


def load_kjv(_src):
    """One item per chapter: its verses without the references, one a line."""
    try:
        out = subprocess.run(["bible", "-f", "gen1:1-rev22:21"], capture_output=True, text=True, check=True).stdout
    except (OSError, subprocess.CalledProcessError) as e:
        raise SystemExit(f"cannot dump the King James Bible ({e}): install Debian packages 'bible-kjv bible-kjv-text'")
    chapters, cur, key = [], [], None
    for line in out.splitlines():
        m = re.match(r"^(\S+?\d+):\d+ (.*)$", line)
        if not m:
            continue
        if m.group(1) != key and cur:
            chapters.append("\n".join(cur))
            cur = []
        key = m.group(1)
        cur.append(m.group(2).strip())
    if cur:
        chapters.append("\n".join(cur))
    return chapters


CORPORA = {"fortunes": (load_fortunes, 1000, "fortunes"), "kjv": (load_kjv, 1000, "bible-kjv-text")}


def held_out_ppl(arch, W, data, ctx, windows=64):
    """Perplexity over the first `windows` non-overlapping ctx windows of the held-out tokens."""
    n = min(windows, (len(data) - 1) // ctx)
    with torch.no_grad():
        tot = 0.0
        for i in range(n):
            x = data[i * ctx: (i + 1) * ctx].unsqueeze(0)
            y = data[i * ctx + 1: (i + 1) * ctx + 1].unsqueeze(0)
            logits = R.forward(arch, W, x)
            tot += torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), y.reshape(-1)).item()
    return float(torch.exp(torch.tensor(tot / max(n, 1))))


MODEL_FILES = ("config.json", "tokenizer.json", "model.safetensors")
INPUTS = "inputs.json"


def training_inputs(a):
    """What a trained model depends on: the split files' SHA-256 and every argument but the paths."""
    digests = {}
    for k in ("train", "calib", "heldout"):
        with open(os.path.join(a.data, k + ".txt"), "rb") as f:
            digests[k + ".txt"] = hashlib.sha256(f.read()).hexdigest()
    args = {k: v for k, v in vars(a).items() if k not in ("out", "data", "committed", "write_inputs", "eval")}
    return {"data_sha256": digests, "args": args}


def use_committed(src, out, inputs):
    """Copy the model in src to out when src/inputs.json equals inputs; else say why not (the caller trains)."""
    try:
        with open(os.path.join(src, INPUTS)) as f:
            theirs = json.load(f)
    except (OSError, ValueError) as e:
        print(f"no committed model to use ({e}): training", flush=True)
        return False
    if theirs != inputs:
        diff = []
        for part in ("data_sha256", "args"):
            mine, old = inputs[part], theirs.get(part) or {}
            diff += sorted(k for k in set(old) | set(mine) if old.get(k) != mine.get(k))
        print(f"the committed model in {src} was trained on other inputs ({', '.join(diff)}): training", flush=True)
        return False
    os.makedirs(out, exist_ok=True)
    for name in MODEL_FILES:
        shutil.copyfile(os.path.join(src, name), os.path.join(out, name))
    print(f"tiny model: {src}'s, trained by this script on the same split text and settings "
          f"(make tiny-model-retrain trains it again)", flush=True)
    return True


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--data", required=True)
    ap.add_argument("--corpus", choices=sorted(CORPORA), default="fortunes")
    ap.add_argument("--src", default="/usr/share/games/fortunes")
    ap.add_argument("--steps", type=int, default=int(os.environ.get("AC_TINY_STEPS", "400")))
    ap.add_argument("--merges", type=int, default=511)
    ap.add_argument("--hidden", type=int, default=128)
    ap.add_argument("--layers", type=int, default=6)
    ap.add_argument("--heads", type=int, default=8)
    ap.add_argument("--kv-heads", type=int, default=4)
    ap.add_argument("--ffn", type=int, default=384)
    ap.add_argument("--ctx", type=int, default=128)
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--lr", type=float, default=3e-3)
    ap.add_argument("--bpe-chars", type=int, default=400_000, help="training characters the BPE merges are learnt on")
    ap.add_argument("--eval", action="store_true", help="print held-out perplexity at the end (ctx --ctx)")
    ap.add_argument("--threads", type=int, default=2, help="torch and OpenBLAS threads (results depend on it)")
    ap.add_argument("--committed", help="a directory with a model trained on the same inputs: copied instead of training")
    ap.add_argument("--write-inputs", action="store_true", help="write inputs.json (what the model was trained on)")
    a = ap.parse_args()
    torch.manual_seed(1234)
    torch.set_num_threads(a.threads)
    random.seed(1234)
    t0 = time.time()

    load, min_items, pkg = CORPORA[a.corpus]
    items = load(a.src)
    if len(items) < min_items:
        raise SystemExit(f"only {len(items)} {a.corpus} items under {a.src}: install Debian package '{pkg}'")
    random.shuffle(items)
    n = len(items)
    splits = {"train": items[: int(n * 0.9)], "calib": items[int(n * 0.9): int(n * 0.95)], "heldout": items[int(n * 0.95):]}
    os.makedirs(a.data, exist_ok=True)
    for k, v in splits.items():
        with open(os.path.join(a.data, k + ".txt"), "w") as f:
            f.write("\n\n".join(v) + "\n")
    train_text = "\n\n".join(splits["train"])
    inputs = training_inputs(a)
    if a.committed and use_committed(a.committed, a.out, inputs):
        return

    merges = R.train_bpe(train_text[:a.bpe_chars], a.merges)
    special = "<|endoftext|>"
    tj, vocab = R.tokenizer_json(merges, [special])
    os.makedirs(a.out, exist_ok=True)
    with open(os.path.join(a.out, "tokenizer.json"), "w") as f:
        json.dump(tj, f, ensure_ascii=False)
    print(f"tokenizer: {len(vocab)} tokens, {len(merges)} merges ({time.time() - t0:.1f}s)", flush=True)

    ids = R.bpe_encode(special.join(splits["train"]), vocab, merges, specials=[special])
    data = torch.tensor(ids, dtype=torch.long)
    print(f"train tokens: {len(ids)}", flush=True)

    cfg = {
        "architectures": ["LlamaForCausalLM"], "model_type": "llama", "vocab_size": len(vocab),
        "hidden_size": a.hidden, "num_hidden_layers": a.layers, "num_attention_heads": a.heads,
        "num_key_value_heads": a.kv_heads, "head_dim": a.hidden // a.heads, "intermediate_size": a.ffn,
        "max_position_embeddings": 1024, "rms_norm_eps": 1e-5, "rope_theta": 10000.0, "rope_scaling": None,
        "tie_word_embeddings": False, "attention_bias": False, "mlp_bias": False, "hidden_act": "silu",
        "bos_token_id": vocab[special], "eos_token_id": vocab[special], "torch_dtype": "bfloat16",
    }
    arch = R.arch_from_config(cfg)
    W = R.random_weights(arch, seed=1, scale=0.02)
    for k in W:
        if "norm" in k:
            W[k] = torch.ones_like(W[k])
        W[k].requires_grad_(True)
    params = list(W.values())
    print(f"model: {sum(p.numel() for p in params) / 1e6:.2f}M parameters", flush=True)
    opt = torch.optim.AdamW(params, lr=a.lr, betas=(0.9, 0.95), weight_decay=0.05)
    g = torch.Generator().manual_seed(99)
    for step in range(a.steps):
        lr = a.lr * min(1.0, (step + 1) / 30) * (0.1 + 0.9 * 0.5 * (1 + torch.cos(torch.tensor(step / a.steps * 3.14159)).item()))
        for pg in opt.param_groups:
            pg["lr"] = lr
        starts = torch.randint(0, len(data) - a.ctx - 1, (a.batch,), generator=g)
        x = torch.stack([data[s: s + a.ctx] for s in starts])
        y = torch.stack([data[s + 1: s + a.ctx + 1] for s in starts])
        logits = R.forward(arch, W, x)
        loss = torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), y.reshape(-1))
        opt.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()
        if step % 50 == 0 or step == a.steps - 1:
            print(f"step {step} loss {loss.item():.3f} ({time.time() - t0:.0f}s)", flush=True)
    R.write_model(a.out, cfg, {k: v.detach() for k, v in W.items()}, dtype=torch.bfloat16)
    if a.write_inputs:
        with open(os.path.join(a.out, INPUTS), "w") as f:
            json.dump(inputs, f, indent=1, sort_keys=True)
            f.write("\n")
    if a.eval:
        Wb = {k: v.detach().to(torch.bfloat16).float() for k, v in W.items()}  # as written (BF16)
        held = R.bpe_encode(special.join(splits["heldout"]), vocab, merges, specials=[special])
        held = torch.tensor(held, dtype=torch.long)
        print(f"held-out perplexity {held_out_ppl(arch, Wb, held, a.ctx):.2f} "
              f"({min(64, (len(held) - 1) // a.ctx)} windows of {a.ctx} tokens, BF16 weights)", flush=True)
    print(f"wrote {a.out} in {time.time() - t0:.0f}s", flush=True)


if __name__ == "__main__":
    main()
