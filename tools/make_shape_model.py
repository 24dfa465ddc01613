#!/usr/bin/env python3
"""Random-init checkpoints with the exact shapes of public models, for the
scale benchmarks (issue 16): config.json as Hugging Face writes it for that
model family, model.safetensors in BF16 (written tensor by tensor, so memory
stays at one tensor), and a tokenizer.json borrowed from a tiny model (its
ids are all below the checkpoint's vocab; the numbers these checkpoints give
are about time and memory, not quality).

  tools/make_shape_model.py --shape llama-3.2-1b --out build/models/shape-1b \
      [--tokenizer build/models/tiny/tokenizer.json] [--seed 0] [--config-only]

Shapes: smollm2-135m, qwen2.5-0.5b, llama-3.2-1b, llama-3.1-8b, llama-3.1-70b
(the last two are meant for --config-only: 16 GB and 141 GB of weights), and
qwen3-30b-a3b-2l: two layers of Qwen3-30B-A3B (mixture of experts: 128
experts of width 768, top-8, 32 heads / 4 KV groups of 128, vocab 151936;
3.6 GB), and nemotron-3-nano-3l: Nemotron 3 Nano 30B-A3B's published shapes
(nemotron_h, hidden 2688, vocab 131072 untied) with one layer of each of its
kinds, `ME*`: Mamba-2 (64 heads of 64 in 8 groups, state 128, conv 4), MoE
(128 squared-ReLU experts of 1856, top-6 through the sigmoid router with its
correction bias, a shared expert of 3712), attention (32 heads / 2 KV groups
of 128); Nano has no dense MLP layer (2.06 B parameters, 4.1 GB).
Needs only numpy.
"""
import argparse
import json
import os
import shutil
import struct

import numpy as np

# hidden, layers, heads, kv heads, head_dim, ffn, vocab, tied, qkv bias, rope theta, max positions, family
SHAPES = {
    "smollm2-135m": (576, 30, 9, 3, 64, 1536, 49152, True, False, 100000.0, 8192, "llama"),
    "qwen2.5-0.5b": (896, 24, 14, 2, 64, 4864, 151936, True, True, 1000000.0, 32768, "qwen2"),
    "llama-3.2-1b": (2048, 16, 32, 8, 64, 8192, 128256, True, False, 500000.0, 131072, "llama"),
    "llama-3.1-8b": (4096, 32, 32, 8, 128, 14336, 128256, False, False, 500000.0, 131072, "llama"),
    "llama-3.1-70b": (8192, 80, 64, 8, 128, 28672, 128256, False, False, 500000.0, 131072, "llama"),
    "qwen3-30b-a3b-2l": (2048, 2, 32, 4, 128, 6144, 151936, False, False, 1000000.0, 40960, "qwen3_moe"),
}
# mixture-of-experts shapes: experts, experts per token, expert width
MOE = {"qwen3-30b-a3b-2l": (128, 8, 768)}
# hybrid Mamba-Transformer shapes: their config.json (Hugging Face's NemotronHConfig keys)
HYBRID = {
    "nemotron-3-nano-3l": {
        "architectures": ["NemotronHForCausalLM"], "model_type": "nemotron_h", "vocab_size": 131072,
        "hidden_size": 2688, "num_hidden_layers": 3, "hybrid_override_pattern": "ME*", "tie_word_embeddings": False,
        "num_attention_heads": 32, "num_key_value_heads": 2, "head_dim": 128, "intermediate_size": 1856,
        "mlp_hidden_act": "relu2", "mamba_num_heads": 64, "mamba_head_dim": 64, "ssm_state_size": 128,
        "n_groups": 8, "conv_kernel": 4, "chunk_size": 128, "use_conv_bias": True, "mamba_hidden_act": "silu",
        "use_bias": False, "mlp_bias": False, "attention_bias": False, "n_routed_experts": 128,
        "num_experts_per_tok": 6, "moe_intermediate_size": 1856, "moe_shared_expert_intermediate_size": 3712,
        "n_shared_experts": 1, "norm_topk_prob": True, "routed_scaling_factor": 2.5, "n_group": 1, "topk_group": 1,
        "layer_norm_epsilon": 1e-5, "max_position_embeddings": 262144, "bos_token_id": 0, "eos_token_id": 0,
        "torch_dtype": "bfloat16"},
}


def config(shape):
    if shape in HYBRID:
        return dict(HYBRID[shape])
    H, L, nh, kv, hd, F, V, tied, bias, theta, maxpos, family = SHAPES[shape]
    arch = {"qwen2": "Qwen2ForCausalLM", "qwen3_moe": "Qwen3MoeForCausalLM"}.get(family, "LlamaForCausalLM")
    c = {
        "architectures": [arch],
        "model_type": family, "vocab_size": V, "hidden_size": H, "num_hidden_layers": L,
        "num_attention_heads": nh, "num_key_value_heads": kv, "head_dim": hd, "intermediate_size": F,
        "max_position_embeddings": maxpos, "rms_norm_eps": 1e-5 if family == "llama" else 1e-6,
        "rope_theta": theta, "rope_scaling": None, "tie_word_embeddings": tied, "hidden_act": "silu",
        "bos_token_id": 0, "eos_token_id": 0, "torch_dtype": "bfloat16",
    }
    if family == "llama":
        c["attention_bias"] = False
        c["mlp_bias"] = False
    if shape in MOE:
        E, k, fe = MOE[shape]
        c.update(num_experts=E, num_experts_per_tok=k, moe_intermediate_size=fe, norm_topk_prob=True,
                 decoder_sparse_step=1, mlp_only_layers=[], attention_bias=False, use_sliding_window=False)
    return c


def hybrid_tensors(c):
    """nemotron_h's tensors (backbone.*), one norm and one mixer per layer."""
    H, V = c["hidden_size"], c["vocab_size"]
    nh, P, G, N, K = c["mamba_num_heads"], c["mamba_head_dim"], c["n_groups"], c["ssm_state_size"], c["conv_kernel"]
    di, E, fe, fs = nh * P, c["n_routed_experts"], c["moe_intermediate_size"], c["moe_shared_expert_intermediate_size"]
    C, q, kv = di + 2 * G * N, c["num_attention_heads"] * c["head_dim"], c["num_key_value_heads"] * c["head_dim"]
    out = [("backbone.embeddings.weight", (V, H), "w")]
    for i, kind in enumerate(c["hybrid_override_pattern"]):
        p = f"backbone.layers.{i}."
        out.append((p + "norm.weight", (H,), "n"))
        m = p + "mixer."
        if kind == "M":  # in_proj rows: z, xBC, dt
            out += [(m + "in_proj.weight", (2 * di + 2 * G * N + nh, H), "w"), (m + "conv1d.weight", (C, 1, K), "w"),
                    (m + "conv1d.bias", (C,), "b"), (m + "dt_bias", (nh,), "b"), (m + "A_log", (nh,), "b"),
                    (m + "D", (nh,), "n"), (m + "norm.weight", (di,), "n"), (m + "out_proj.weight", (H, di), "w")]
        elif kind == "E":
            out += [(m + "gate.weight", (E, H), "w"), (m + "gate.e_score_correction_bias", (E,), "b")]
            for e in range(E):
                out += [(m + f"experts.{e}.up_proj.weight", (fe, H), "w"),
                        (m + f"experts.{e}.down_proj.weight", (H, fe), "w")]
            out += [(m + "shared_experts.up_proj.weight", (fs, H), "w"),
                    (m + "shared_experts.down_proj.weight", (H, fs), "w")]
        elif kind == "*":
            out += [(m + "q_proj.weight", (q, H), "w"), (m + "k_proj.weight", (kv, H), "w"),
                    (m + "v_proj.weight", (kv, H), "w"), (m + "o_proj.weight", (H, q), "w")]
        else:  # '-': squared-ReLU MLP
            F = c["intermediate_size"]
            out += [(m + "up_proj.weight", (F, H), "w"), (m + "down_proj.weight", (H, F), "w")]
    out += [("backbone.norm_f.weight", (H,), "n"), ("lm_head.weight", (V, H), "w")]
    return out


def tensors(shape):
    """(name, shape, kind) in the order Hugging Face checkpoints list them;
    kind: 'w' random weight, 'n' norm (ones), 'b' bias (small random)."""
    if shape in HYBRID:
        return hybrid_tensors(HYBRID[shape])
    H, L, nh, kv, hd, F, V, tied, bias, *_ = SHAPES[shape]
    out = [("model.embed_tokens.weight", (V, H), "w")]
    for i in range(L):
        p = f"model.layers.{i}."
        out += [(p + "input_layernorm.weight", (H,), "n"),
                (p + "self_attn.q_proj.weight", (nh * hd, H), "w"),
                (p + "self_attn.k_proj.weight", (kv * hd, H), "w"),
                (p + "self_attn.v_proj.weight", (kv * hd, H), "w"),
                (p + "self_attn.o_proj.weight", (H, nh * hd), "w")]
        if bias:
            out += [(p + "self_attn.q_proj.bias", (nh * hd,), "b"),
                    (p + "self_attn.k_proj.bias", (kv * hd,), "b"),
                    (p + "self_attn.v_proj.bias", (kv * hd,), "b")]
        if shape in MOE:  # Qwen3-MoE: QK-norm, then the router and the experts
            E, _, fe = MOE[shape]
            out += [(p + "self_attn.q_norm.weight", (hd,), "n"), (p + "self_attn.k_norm.weight", (hd,), "n"),
                    (p + "post_attention_layernorm.weight", (H,), "n"), (p + "mlp.gate.weight", (E, H), "w")]
            for e in range(E):
                out += [(p + f"mlp.experts.{e}.gate_proj.weight", (fe, H), "w"),
                        (p + f"mlp.experts.{e}.up_proj.weight", (fe, H), "w"),
                        (p + f"mlp.experts.{e}.down_proj.weight", (H, fe), "w")]
            continue
        out += [(p + "post_attention_layernorm.weight", (H,), "n"),
                (p + "mlp.gate_proj.weight", (F, H), "w"),
                (p + "mlp.up_proj.weight", (F, H), "w"),
                (p + "mlp.down_proj.weight", (H, F), "w")]
    out.append(("model.norm.weight", (H,), "n"))
    if not tied:
        out.append(("lm_head.weight", (V, H), "w"))
    return out


def bf16_bytes(a):
    """float32 array -> BF16 bytes, rounded to nearest even (as torch does)."""
    u = np.ascontiguousarray(a, dtype=np.float32).view(np.uint32)
    u = (u + 0x7FFF + ((u >> 16) & 1)) >> 16
    return u.astype("<u2").tobytes()


def write_safetensors(path, shape, seed):
    specs = tensors(shape)
    header, off = {}, 0
    for name, shp, _ in specs:
        n = int(np.prod(shp)) * 2
        header[name] = {"dtype": "BF16", "shape": list(shp), "data_offsets": [off, off + n]}
        off += n
    header["__metadata__"] = {"format": "pt"}
    hb = json.dumps(header, separators=(",", ":")).encode()
    hb += b" " * (-len(hb) % 8)
    rng = np.random.default_rng(seed)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(hb)))
        f.write(hb)
        for name, shp, kind in specs:
            if kind == "n":
                a = np.ones(shp, np.float32)
            else:
                std = 0.02 if kind == "w" else 0.01
                a = None
                rows = shp[0]
                step = max(1, (1 << 24) // max(1, int(np.prod(shp[1:]))))  # ~64 MB of fp32 at a time
                for r0 in range(0, rows, step):
                    blk = rng.standard_normal((min(step, rows - r0),) + tuple(shp[1:]), dtype=np.float32) * std
                    f.write(bf16_bytes(blk))
                continue
            f.write(bf16_bytes(a))
    return off


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--shape", required=True, choices=sorted(list(SHAPES) + list(HYBRID)))
    ap.add_argument("--out", required=True)
    ap.add_argument("--tokenizer", default="build/models/tiny/tokenizer.json")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--config-only", action="store_true")
    a = ap.parse_args()
    os.makedirs(a.out, exist_ok=True)
    with open(os.path.join(a.out, "config.json"), "w") as f:
        json.dump(config(a.shape), f, indent=2)
    params = sum(int(np.prod(s)) for _, s, _ in tensors(a.shape))
    if not a.config_only:
        if os.path.exists(a.tokenizer):
            shutil.copyfile(a.tokenizer, os.path.join(a.out, "tokenizer.json"))
        n = write_safetensors(os.path.join(a.out, "model.safetensors"), a.shape, a.seed)
        print(f"{a.shape}: {params:,} parameters, {n / 2**30:.2f} GiB BF16 in {a.out}")
    else:
        print(f"{a.shape}: {params:,} parameters (config only) in {a.out}")


if __name__ == "__main__":
    main()
