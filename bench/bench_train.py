#!/usr/bin/env python3
"""Training speed: forward + cross-entropy + backward tokens/s of the C
training engine (build/bench/bench_train, src/runtime/train.c) against PyTorch eager
autograd (python3-torch, fp32, tests/ref_llama.py's forward with the weights
as leaf tensors), same model, batch, context and 2 threads, in one run.
Both sides: best of the timed steps after a warm-up, and the median."""
import json
import os
import subprocess
import sys
import time

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, os.path.join(ROOT, "tests"))
sys.path.insert(0, HERE)
import ref_llama as R  # noqa: E402
from bench_engine import medium_model  # noqa: E402

BUILD = os.path.abspath(os.environ.get("AC_BUILD", os.path.join(ROOT, "build")))


def torch_tps(model, batch, ctx, steps, threads):
    torch.set_num_threads(threads)
    cfg = json.load(open(os.path.join(model, "config.json")))
    arch = R.arch_from_config(cfg)
    W = {k: v.float().requires_grad_(True) for k, v in R.load_safetensors(os.path.join(model, "model.safetensors")).items()}
    ids = torch.randint(0, cfg["vocab_size"], (batch, ctx), generator=torch.Generator().manual_seed(0))
    dts = []
    for i in range(steps + 1):
        t0 = time.time()
        logits = R.forward(arch, W, ids)
        loss = torch.nn.functional.cross_entropy(logits[:, :-1].reshape(-1, cfg["vocab_size"]), ids[:, 1:].reshape(-1))
        loss.backward()
        for w in W.values():
            w.grad = None
        dts.append(time.time() - t0)
    dts = sorted(dts[1:])
    return batch * ctx / dts[0], batch * ctx / dts[len(dts) // 2]


def c_tps(model, batch, ctx, steps, threads):
    out = subprocess.run([os.path.join(BUILD, "bench", "bench_train"), model, str(batch), str(ctx), str(steps), str(threads)],
                         capture_output=True, text=True, check=True)
    r = json.loads(out.stdout)
    return r["tok_per_s"], r["median_tok_per_s"]


def main():
    medium = os.path.join(BUILD, "models", "medium")
    medium_model(medium)
    threads = 2
    print(f"{'model':8} {'batch':>5} {'ctx':>5} {'C tok/s':>9} {'torch tok/s':>12} {'ratio':>6} {'(median ratio)':>15}")
    ratios = []
    for name, path, steps in (("tiny", os.path.join(BUILD, "models", "tiny"), 6), ("medium", medium, 3)):
        for batch, ctx in ((1, 128), (4, 128), (4, 512)):
            c, cm = c_tps(path, batch, ctx, steps, threads)
            t, tm = torch_tps(path, batch, ctx, steps, threads)
            ratios.append(c / t)
            print(f"{name:8} {batch:5d} {ctx:5d} {c:9.0f} {t:12.0f} {c / t:6.2f} {cm / tm:15.2f}")
    ratios.sort()
    # the CUDA trainer (src/cuda/ac_cuda_train.cu) where a GPU and the plugin are here
    for batch, ctx in ((8, 512), (16, 1024)):
        r = subprocess.run([os.path.join(BUILD, "bench", "bench_train"), medium, str(batch), str(ctx), "5", str(threads), "cuda"],
                           capture_output=True, text=True)
        if r.returncode != 0:
            print("CUDA trainer: skipped (" + (r.stderr.strip().splitlines() or ["no output"])[-1] + ")")
            break
        print(f"{'medium':8} {batch:5d} {ctx:5d} CUDA trainer (fwd+bwd+AdamW): {json.loads(r.stdout)['tok_per_s']:.0f} tok/s")
    print(f"C / PyTorch forward+backward tokens/s: median {ratios[len(ratios) // 2]:.2f}, min {ratios[0]:.2f} (goal: >= 1.5); "
          f"{threads} threads, torch {torch.__version__}")


if __name__ == "__main__":
    main()
