#!/usr/bin/env python3
"""Forward-pass speed of the AutoCompress CPU engine against PyTorch
(python3-torch, eager, fp32), same model, same threads (2), same batch and
context, in one run. Prints tokens/s of each and the ratio.

The engine is timed by `autocompress eval --json` (tokenisation excluded);
PyTorch runs tests/ref_llama.py's forward under torch.no_grad()."""
import json
import os
import subprocess
import sys
import time

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, os.path.join(ROOT, "tests"))
import ref_llama as R  # noqa: E402

BUILD = os.path.abspath(os.environ.get("AC_BUILD", os.path.join(ROOT, "build")))


def medium_model(path):
    if os.path.exists(os.path.join(path, "config.json")):
        return
    cfg = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "vocab_size": 768, "hidden_size": 512, "num_hidden_layers": 8,
           "num_attention_heads": 8, "num_key_value_heads": 2, "intermediate_size": 1536, "max_position_embeddings": 2048,
           "rms_norm_eps": 1e-5, "rope_theta": 10000.0, "tie_word_embeddings": False}
    W = R.random_weights(R.arch_from_config(cfg), seed=11, scale=0.03)
    R.write_model(path, cfg, W, dtype=torch.bfloat16)
    import shutil
    shutil.copy(os.path.join(BUILD, "models", "tiny", "tokenizer.json"), path)


def torch_tps(model, batch, ctx, windows, threads):
    torch.set_num_threads(threads)
    cfg = json.load(open(os.path.join(model, "config.json")))
    arch = R.arch_from_config(cfg)
    W = R.load_safetensors(os.path.join(model, "model.safetensors"))
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(0, cfg["vocab_size"], (windows, ctx), generator=g)
    with torch.no_grad():
        R.forward(arch, W, ids[:batch])  # warm-up
        t0 = time.time()
        for i in range(0, windows, batch):
            R.forward(arch, W, ids[i: i + batch])
        dt = time.time() - t0
    return windows * ctx / dt


def engine_tps(model, text, batch, ctx, windows, threads):
    out = subprocess.run([os.path.join(BUILD, "autocompress"), "eval", model, text, "--ctx", str(ctx), "--batch", str(batch), "--windows",
                          str(windows), "--threads", str(threads), "--json"], capture_output=True, text=True, check=True)
    return json.loads(out.stdout)["tok_per_s"]


def main():
    text = os.path.join(BUILD, "data", "heldout.txt")
    medium = os.path.join(BUILD, "models", "medium")
    medium_model(medium)
    threads = 2
    print(f"{'model':8} {'batch':>5} {'ctx':>5} {'engine tok/s':>13} {'torch tok/s':>12} {'ratio':>6}")
    ratios = []
    for name, path in (("tiny", os.path.join(BUILD, "models", "tiny")), ("medium", medium)):
        for batch, ctx, windows in ((1, 128, 32), (4, 128, 64), (4, 512, 16)):
            e = engine_tps(path, text, batch, ctx, windows, threads)
            t = torch_tps(path, batch, ctx, windows, threads)
            ratios.append(e / t)
            print(f"{name:8} {batch:5d} {ctx:5d} {e:13.0f} {t:12.0f} {e / t:6.2f}")
    ratios.sort()
    print(f"engine / PyTorch tokens/s: median {ratios[len(ratios) // 2]:.2f}, min {ratios[0]:.2f} (target: >= 1.0); {threads} threads, torch {torch.__version__}")


if __name__ == "__main__":
    main()
