#!/usr/bin/env python3
"""Gradient and optimizer fixtures for tests/test_train.c (run by `make fixtures`
after gen_fixtures.py, whose checkpoints it reads; the nemotron_h ones
through tests/ref_mamba.py).

For each fixture model and each case, PyTorch autograd in float64 on
tests/ref_train.py's gated forward:
  ce: all gates 1, next-token cross-entropy;
  kd: random gates in [0.5, 1.5], random teacher logits, loss =
      0.7 * tau^2 KL(teacher || student) + 0.3 * CE with tau = 2.
      Mixture-of-experts layers also get expert gates on the router (1 in
      ce; random in kd, with the last expert of the first MoE layer at
      exactly 0: removed, the routing renormalised over the others; on
      nemotron_h's sigmoid router, never chosen) and, but nemotron_h's,
      expert channel gates. nemotron_h's Mamba and MoE layers' residual adds
      take the mlp gates (the trainer's residual scale of that mixer).
Written to grad/<model>_<case>.json (loss, index) + .bin (float32: the
inputs (gates, teacher logits) then the gradient of every weight and gate).

optim/: a random parameter set, a sequence of random gradients (2 micro-
batches per step), and the parameters after torch.optim.AdamW (two groups:
decayed matrices and undecayed vectors), LambdaLR linear warmup + cosine
decay to min_lr, clip_grad_norm_ over the accumulated gradients.
"""
import argparse
import json
import math
import os

import numpy as np
import torch

import ref_llama as R
import ref_mamba as M
import ref_train as RT

CASES = {"ce": dict(gates=False, tau=1.0, kd_weight=0.0), "kd": dict(gates=True, tau=2.0, kd_weight=0.7)}


class Blob:
    def __init__(self):
        self.parts, self.off, self.index = [], 0, {}

    def add(self, name, t, like=None):
        if t is None:  # a gate of a removed sub-block: no gradient
            t = torch.zeros(like.shape)
        a = t.detach().to(torch.float32).contiguous().numpy().reshape(-1).copy()  # not a view of a live tensor
        self.index[name] = {"offset": self.off, "count": int(a.size), "shape": list(t.shape)}
        self.parts.append(a)
        self.off += a.size

    def write(self, path):
        np.concatenate(self.parts).astype("<f4").tofile(path)


def grad_case(out, name, case, seed):
    d = os.path.join(out, "models", name)
    cfg = json.load(open(os.path.join(d, "config.json")))
    hybrid = cfg["model_type"] == "nemotron_h"  # ref_mamba.py's model, with the same gates
    arch = (M if hybrid else R).arch_from_config(cfg)
    W = {}
    for fn in sorted(os.listdir(d)):
        if fn.endswith(".safetensors"):
            W.update(R.load_safetensors(os.path.join(d, fn)))
    W = {k: v.double().requires_grad_(True) for k, v in W.items()}
    tj = json.load(open(os.path.join(d, "tokens.json")))
    B, T = tj["B"], tj["T"]
    toks = torch.tensor(tj["ids"]).view(B, T)
    c = CASES[case]
    g = torch.Generator().manual_seed(seed)
    G = (M if hybrid else RT).ones_gates(arch)
    moe = not hybrid and any(x.get("experts") for x in arch["layers"])
    hmoe = hybrid and any(x["type"] == "E" for x in arch["layers"])  # the sigmoid router's expert gates
    if moe:  # expert and expert-channel gates (empty on dense layers)
        G["expert"] = [torch.ones(x.get("experts", 0), dtype=torch.float64) for x in arch["layers"]]
        G["echan"] = [torch.ones(x.get("experts", 0) * x.get("expert_ffn", 0), dtype=torch.float64)
                      for x in arch["layers"]]
    if hmoe:
        G["expert"] = [torch.ones(arch["E"] if x["type"] == "E" else 0, dtype=torch.float64) for x in arch["layers"]]
    blob = Blob()
    teacher = None
    if c["gates"]:
        def rnd(n):
            return (0.5 + torch.rand(n, generator=g)).float().double()  # float32-representable
        G = dict(G, head=[rnd(len(x)) for x in G["head"]], ffn=[rnd(len(x)) for x in G["ffn"]], hidden=rnd(arch["hidden"]),
                 attn=rnd(len(arch["layers"])), mlp=rnd(len(arch["layers"])))
        if moe or hmoe:
            G["expert"] = [rnd(len(x)) for x in G["expert"]]
            if moe:
                G["echan"] = [rnd(len(x)) for x in G["echan"]]
            first = next((x for x in G["expert"] if len(x)), None)
            if first is not None:
                first[-1] = 0.0  # a removed expert
        if hybrid:  # the Mamba head gates
            G["ssm"] = [rnd(len(x)) for x in G["ssm"]]
        teacher = (torch.randn(B, T, arch["vocab"], generator=g) * 3).float().double()
    leaves = [G["hidden"], G["attn"], G["mlp"]] + G["head"] + G["ffn"] + G.get("expert", []) + G.get("echan", []) + G.get("ssm", [])
    for t in leaves:
        t.requires_grad_(True)
    # inputs first, so the C test can read them
    blob.add("gate.hidden", G["hidden"])
    blob.add("gate.attn", G["attn"])
    blob.add("gate.mlp", G["mlp"])
    for l in range(len(arch["layers"])):
        blob.add(f"gate.head.{l}", G["head"][l])
        blob.add(f"gate.ffn.{l}", G["ffn"][l])
        if moe:
            blob.add(f"gate.expert.{l}", G["expert"][l])
            blob.add(f"gate.echan.{l}", G["echan"][l])
        if hmoe and len(G["expert"][l]):
            blob.add(f"gate.expert.{l}", G["expert"][l])
        if hybrid:
            blob.add(f"gate.ssm.{l}", G["ssm"][l])
    if teacher is not None:
        blob.add("teacher", teacher)
    inputs = dict(blob.index)
    blob.index = {}
    logits = (M if hybrid else RT).forward_gated(arch, W, toks, G)
    loss, ce, kd = RT.losses(logits, toks, teacher, c["tau"], c["kd_weight"])
    loss.backward()
    for k, v in W.items():
        if (v.grad is None or not v.grad.any()) and (k.endswith("e_score_correction_bias") or ".experts." in k):
            continue  # nemotron_h's router bias only chooses the experts, and an expert no row reached (or removed)
        blob.add(k, v.grad)
    blob.add("dgate.hidden", G["hidden"].grad)
    for k in ("attn", "mlp"):
        if G[k].grad is not None:  # (a hybrid without MLP layers has no MLP gate to learn)
            blob.add("dgate." + k, G[k].grad)
    for l in range(len(arch["layers"])):
        blob.add(f"dgate.head.{l}", G["head"][l].grad, G["head"][l])
        blob.add(f"dgate.ffn.{l}", G["ffn"][l].grad, G["ffn"][l])
        if moe:
            blob.add(f"dgate.expert.{l}", G["expert"][l].grad, G["expert"][l])
            blob.add(f"dgate.echan.{l}", G["echan"][l].grad, G["echan"][l])
        if hmoe and len(G["expert"][l]):
            blob.add(f"dgate.expert.{l}", G["expert"][l].grad, G["expert"][l])
        if hybrid:
            blob.add(f"dgate.ssm.{l}", G["ssm"][l].grad, G["ssm"][l])
    grads = blob.index
    blob.index = dict(inputs, **grads)
    os.makedirs(os.path.join(out, "grad"), exist_ok=True)
    base = os.path.join(out, "grad", f"{name}_{case}")
    blob.write(base + ".bin")
    meta = {"model": name, "case": case, "B": B, "T": T, "tau": c["tau"], "kd_weight": c["kd_weight"], "loss": loss.item(),
            "ce": ce.item(), "kd": kd.item() if kd is not None else None, "inputs": inputs, "grads": grads}
    with open(base + ".json", "w") as f:
        json.dump(meta, f, indent=1)


def lr_lambda(step, warmup, total, min_ratio):
    """Multiplier of the base lr for update number `step` (0-based)."""
    if step < warmup:
        return (step + 1) / warmup
    prog = min(1.0, (step - warmup) / max(1, total - warmup))
    return min_ratio + (1 - min_ratio) * 0.5 * (1 + math.cos(math.pi * prog))


def optim_case(out, seed=7):
    g = torch.Generator().manual_seed(seed)
    shapes = [(6, 5), (5,), (4, 6), (3,)]          # matrices decay, vectors do not
    decay = [len(s) == 2 for s in shapes]
    P = [torch.nn.Parameter(torch.randn(*s, generator=g).float()) for s in shapes]
    o = dict(lr=0.05, min_lr=0.005, beta1=0.9, beta2=0.95, eps=1e-8, weight_decay=0.1, clip=1.0, warmup=3, total=10, accum=2)
    blob = Blob()
    for i, p in enumerate(P):
        blob.add(f"p0.{i}", p.data)
    opt = torch.optim.AdamW([{"params": [p for p, d in zip(P, decay) if d], "weight_decay": o["weight_decay"]},
                             {"params": [p for p, d in zip(P, decay) if not d], "weight_decay": 0.0}],
                            lr=o["lr"], betas=(o["beta1"], o["beta2"]), eps=o["eps"])
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: lr_lambda(s, o["warmup"], o["total"], o["min_lr"] / o["lr"]))
    norms = []
    for step in range(o["total"]):
        opt.zero_grad()
        for a in range(o["accum"]):
            for i, p in enumerate(P):
                gr = torch.randn(p.shape, generator=g).float() * (3.0 if step % 3 == 0 else 0.2)
                blob.add(f"g.{step}.{a}.{i}", gr)
                p.grad = gr.clone() if p.grad is None else p.grad + gr
        norms.append(torch.nn.utils.clip_grad_norm_(P, o["clip"]).item())
        opt.step()
        sched.step()
    for i, p in enumerate(P):
        blob.add(f"p.{i}", p.data)
    os.makedirs(os.path.join(out, "optim"), exist_ok=True)
    blob.write(os.path.join(out, "optim", "adamw.bin"))
    with open(os.path.join(out, "optim", "adamw.json"), "w") as f:
        json.dump({"opts": o, "shapes": shapes, "decay": decay, "norms": norms, "index": blob.index}, f, indent=1)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--only", nargs="*", help="these fixture models only (and no optimizer case)")
    a = ap.parse_args()
    torch.set_num_threads(2)
    for i, name in enumerate(["llama_gqa_bf16", "qwen2_tied_f16", "llama3_rope_f32", "mistral_sharded", "deci_hetero",
                              "qwen3_hd_bf16", "qwen3moe_mixed_bf16", "mixtral_f32", "nemotronh_bf16",
                              "nemotronh_moe_bf16", "nemotronh_latent_bf16"]):
        for j, case in enumerate(CASES):
            if not a.only or name in a.only:
                grad_case(a.out, name, case, 100 + 10 * i + j)
    if not a.only:
        optim_case(a.out)
    print("gradient fixtures written to", a.out)


if __name__ == "__main__":
    main()
