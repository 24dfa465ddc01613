"""PyTorch reference for the training engine (src/runtime/train.c), written from the
semantics in src/runtime/train.h and Hugging Face Llama, not from the C code:
a forward with multiplicative gates and the training losses, differentiated
by autograd (the gradient fixtures run it in float64).

Gates G (tensors, requires_grad where wanted):
  G["head"][l]  [heads]  on each query head's attention output, before o_proj
  G["ffn"][l]   [ffn]    on silu(gate) * up, before down_proj
  G["hidden"]   [H]      on every RMSNorm output (input, post-attention, final); the
                         norm averages over the gate mass, rms = sqrt(sum g x^2 / sum g + eps),
                         so gates in {0,1} are the RMSNorm of the kept channels
  G["attn"][l], G["mlp"][l]  scalars on each sub-block's output
  G["expert"][l] [experts]  (optional; MoE layers) on each expert's softmax numerator in the
                         router: p_e = z_e exp(s_e) / sum_j z_j exp(s_j), then HF's top-k and
                         renormalisation on p, so z in {0,1} routes as the model whose
                         experts at 0 are removed (its router's softmax over the others)
  G["echan"][l] [experts * expert_ffn]  (optional) on expert e's silu(gate) * up channel c
                         (at e * expert_ffn + c) before its down projection
"""
import math

import torch
import torch.nn.functional as Fn

import ref_llama as R


def ones_gates(arch, dtype=torch.float64):
    L = arch["layers"]
    return {"head": [torch.ones(x["heads"], dtype=dtype) for x in L], "ffn": [torch.ones(x["ffn"], dtype=dtype) for x in L],
            "hidden": torch.ones(arch["hidden"], dtype=dtype), "attn": torch.ones(len(L), dtype=dtype),
            "mlp": torch.ones(len(L), dtype=dtype)}


def gated_rmsnorm(x, w, g, eps):
    """w * g * x / sqrt(sum_c g_c x_c^2 / sum_c g_c + eps) over the last axis."""
    xf = x.to(torch.promote_types(x.dtype, torch.float32))
    ms = (xf.pow(2) * g).sum(-1, keepdim=True) / g.sum()
    return xf * torch.rsqrt(ms + eps) * w * g


def forward_gated(arch, W, tokens, G):
    """tokens [B,T] -> logits [B,T,V] in W's dtype."""
    B, T = tokens.shape
    hd, eps = arch["head_dim"], arch["eps"]
    x = Fn.embedding(tokens, W["model.embed_tokens.weight"])
    ang = torch.outer(torch.arange(T, dtype=torch.float32), R.inv_freq(arch).float())
    cos = torch.cat((ang, ang), -1).cos().to(x.dtype)
    sin = torch.cat((ang, ang), -1).sin().to(x.dtype)
    keep = torch.ones(T, T, dtype=torch.bool).tril()
    if arch.get("window"):
        keep &= ~torch.ones(T, T, dtype=torch.bool).tril(-arch["window"])
    for l, L in enumerate(arch["layers"]):
        p = f"model.layers.{l}."
        if L["heads"]:
            n = gated_rmsnorm(x, W[p + "input_layernorm.weight"], G["hidden"], eps)
            proj = {}
            for s in "qkv":
                y = Fn.linear(n, W[p + f"self_attn.{s}_proj.weight"], W.get(p + f"self_attn.{s}_proj.bias") if arch["bias"] else None)
                proj[s] = y.view(B, T, -1, hd).transpose(1, 2)
            if arch.get("qk_norm"):  # Qwen3: per-head RMSNorm of q and k before RoPE
                proj["q"] = R.rmsnorm(proj["q"], W[p + "self_attn.q_norm.weight"], eps).to(y.dtype)
                proj["k"] = R.rmsnorm(proj["k"], W[p + "self_attn.k_norm.weight"], eps).to(y.dtype)
            q = proj["q"] * cos + R.rotate_half(proj["q"]) * sin
            k = proj["k"] * cos + R.rotate_half(proj["k"]) * sin
            rep = L["heads"] // L["kv_heads"]
            k, v = k.repeat_interleave(rep, 1), proj["v"].repeat_interleave(rep, 1)
            s = (q @ k.transpose(-1, -2)) / math.sqrt(hd)
            s = s.masked_fill(~keep, float("-inf"))
            o = torch.softmax(s, -1) @ v                      # [B, heads, T, hd]
            o = o * G["head"][l].view(1, -1, 1, 1)
            o = o.transpose(1, 2).reshape(B, T, L["heads"] * hd)
            x = x + G["attn"][l] * Fn.linear(o, W[p + "self_attn.o_proj.weight"])
        if L.get("experts"):  # the MoE FFN (HF's sparse block), its residual add gated like the dense FFN's
            n = gated_rmsnorm(x, W[p + "post_attention_layernorm.weight"], G["hidden"], eps)
            ge = G.get("expert")
            moe = moe_gated(arch, W, l, L, n, ge[l], G["echan"][l]) if ge and ge[l].numel() else R.moe(arch, W, l, L, n)
            x = x + G["mlp"][l] * moe
        if L["ffn"]:
            n = gated_rmsnorm(x, W[p + "post_attention_layernorm.weight"], G["hidden"], eps)
            h = Fn.silu(Fn.linear(n, W[p + "mlp.gate_proj.weight"])) * Fn.linear(n, W[p + "mlp.up_proj.weight"])
            x = x + G["mlp"][l] * Fn.linear(h * G["ffn"][l], W[p + "mlp.down_proj.weight"])
    n = gated_rmsnorm(x, W["model.norm.weight"], G["hidden"], eps)
    return Fn.linear(n, W.get("lm_head.weight", W["model.embed_tokens.weight"]))


def moe_gated(arch, W, l, L, n, z, gc):
    """The MoE FFN with expert gates z [E] on the router's softmax numerators and channel gates gc [E*Fe]."""
    rn, gn, un, dn = R.moe_names(arch, l)
    s = n @ W[rn].T
    num = z * torch.exp(s - s.max(-1, keepdim=True).values.detach())
    p = num / num.sum(-1, keepdim=True)
    topv, topi = torch.topk(p, arch["top_k"], dim=-1)
    if arch["norm_topk"]:
        topv = topv / topv.sum(-1, keepdim=True)
    Fe = L["expert_ffn"]
    out = torch.zeros_like(n)
    for e in range(L["experts"]):
        w = (topv * (topi == e)).sum(-1, keepdim=True)
        h = Fn.silu(n @ W[gn.format(e)].T) * (n @ W[un.format(e)].T) * gc[e * Fe:(e + 1) * Fe]
        out = out + w * (h @ W[dn.format(e)].T)
    return out


def losses(logits, tokens, teacher=None, tau=1.0, kd_weight=0.0):
    """Next-token cross-entropy (mean over B*(T-1) predictions) and
    tau^2 * KL(teacher || student) on softmax(./tau), mean over all B*T rows;
    returns (loss, ce, kd) with loss = kd_weight*kd + (1-kd_weight)*ce."""
    V = logits.shape[-1]
    ce = Fn.cross_entropy(logits[:, :-1].reshape(-1, V), tokens[:, 1:].reshape(-1))
    if teacher is None:
        return ce, ce, None
    s = Fn.log_softmax(logits.reshape(-1, V) / tau, -1)
    t = Fn.log_softmax(teacher.reshape(-1, V) / tau, -1)
    kd = tau * tau * Fn.kl_div(s, t, log_target=True, reduction="batchmean")
    return kd_weight * kd + (1 - kd_weight) * ce, ce, kd
