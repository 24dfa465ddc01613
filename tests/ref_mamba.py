"""PyTorch reference for Nemotron-H hybrid Mamba-Transformer models (HF model_type
nemotron_h), written from the Hugging Face modelling code's semantics
(NemotronHBlock, NemotronHMamba2Mixer.torch_forward, Zamba2RMSNormGated,
NemotronHAttention, NemotronHMLP), not from the C code. The Mamba-2 scan is
the sequential recurrence (no chunked SSD), so it is an independent check of
the C op; every function runs in the tensors' dtype (float64 for fixtures)
and is differentiable (the gradient fixtures use autograd on it).

Layer l, by its pattern character (hybrid_override_pattern):
  x += mixer(rmsnorm(x) * norm_w)
  "*" attention: q/k/v/o without bias, GQA, causal, no RoPE, scale hd^-0.5
  "-" MLP: down(relu(up(x))^2)
  "E" MoE (HF NemotronHMoE.route_tokens_to_experts with n_group 1):
      s = sigmoid(x Wr^T); the top_k experts by s + e_score_correction_bias;
      w = s at those experts (no bias), / (sum w + 1e-20) when norm_topk_prob,
      * routed_scaling_factor; out = sum_j w_j down_j(relu(up_j x)^2)
      + shared_down(relu(shared_up x)^2); LatentMoE (moe_latent_size Lt): the routed
      experts run on fc1_latent_proj(x) [Lt] and their sum goes through fc2_latent_proj
      (router and shared expert on x)
  "M" Mamba-2: zxbcdt = in_proj(x) split into z [di], xBC [di + 2GN], dt [nh];
      xBC = silu(causal depthwise conv1d(xBC) + bias); x, B, C = split(xBC);
      dt = softplus(dt + dt_bias); A = -exp(A_log);
      per head h (group g = h // (nh / G)):
        S = exp(dt A) S + dt x_h B_g^T;  y_h = S C_g + D_h x_h
      y = rmsnorm per group of (y * silu(z)) * norm_w;  out_proj(y)
Names: backbone.embeddings.weight, backbone.layers.N.norm.weight,
backbone.layers.N.mixer.*, backbone.norm_f.weight, lm_head.weight.

Gates (as ref_train.py's, for the trainer's fixtures): G["head"][l] on each
attention head's output, G["ffn"][l] on the MLP's relu^2 channels,
G["hidden"] on every block RMSNorm (gated_rmsnorm), G["attn"][l] on an
attention layer's residual add, G["mlp"][l] on an MLP, Mamba or MoE layer's;
G["ssm"][l] on each Mamba head's gated-norm output; G["expert"][l] (when
given) on the MoE router: an expert whose gate is 0 is never chosen, a
chosen one weighs gate * sigmoid before the renormalisation.
"""
import math

import torch
import torch.nn.functional as Fn

P = "backbone."


def arch_from_config(cfg):
    pat = cfg["hybrid_override_pattern"]
    H = cfg["hidden_size"]
    nh = cfg["num_attention_heads"]
    a = {"family": "nemotron_h", "vocab": cfg["vocab_size"], "hidden": H, "eps": cfg.get("layer_norm_epsilon", 1e-5),
         "head_dim": cfg.get("head_dim") or H // nh, "pattern": pat, "tie": cfg.get("tie_word_embeddings", False),
         "mh": cfg["mamba_num_heads"], "P": cfg["mamba_head_dim"], "Ns": cfg["ssm_state_size"],
         "G": cfg.get("n_groups", 1), "K": cfg.get("conv_kernel", 4), "conv_bias": cfg.get("use_conv_bias", True)}
    a["layers"] = [{"type": c, "heads": nh if c == "*" else 0, "kv_heads": cfg["num_key_value_heads"] if c == "*" else 0,
                    "ffn": cfg["intermediate_size"] if c == "-" else 0} for c in pat]
    if "E" in pat:  # NemotronHConfig's defaults where a key is absent
        a.update(E=cfg["n_routed_experts"], k=cfg["num_experts_per_tok"], Fe=cfg["moe_intermediate_size"],
                 Fs=cfg["moe_shared_expert_intermediate_size"], norm=cfg.get("norm_topk_prob", True),
                 scale=cfg.get("routed_scaling_factor", 1.0), Lt=cfg.get("moe_latent_size"))
    return a


def dims(a):
    di = a["mh"] * a["P"]
    C = di + 2 * a["G"] * a["Ns"]
    return di, C, di + C + a["mh"]


def random_weights(a, seed, scale=0.08):
    g = torch.Generator().manual_seed(seed)

    def r(*shape, s=scale):
        return torch.randn(*shape, generator=g, dtype=torch.float64) * s

    H, hd, V = a["hidden"], a["head_dim"], a["vocab"]
    di, C, SI = dims(a)
    W = {P + "embeddings.weight": r(V, H, s=0.5), P + "norm_f.weight": 1 + r(H)}
    if not a["tie"]:
        W["lm_head.weight"] = r(V, H)
    for l, L in enumerate(a["layers"]):
        p = f"{P}layers.{l}."
        W[p + "norm.weight"] = 1 + r(H)
        m = p + "mixer."
        if L["type"] == "*":
            W[m + "q_proj.weight"] = r(L["heads"] * hd, H)
            W[m + "k_proj.weight"] = r(L["kv_heads"] * hd, H)
            W[m + "v_proj.weight"] = r(L["kv_heads"] * hd, H)
            W[m + "o_proj.weight"] = r(H, L["heads"] * hd)
        elif L["type"] == "-":
            W[m + "up_proj.weight"] = r(L["ffn"], H, s=0.15)
            W[m + "down_proj.weight"] = r(H, L["ffn"])
        elif L["type"] == "E":
            W[m + "gate.weight"] = r(a["E"], H, s=0.15)
            W[m + "gate.e_score_correction_bias"] = r(a["E"], s=0.1)  # stored fp32, as HF keeps it
            Hin = a["Lt"] or H
            if a["Lt"]:
                W[m + "fc1_latent_proj.weight"] = r(Hin, H, s=0.2)
                W[m + "fc2_latent_proj.weight"] = r(H, Hin, s=0.2)
            for e in range(a["E"]):
                W[m + f"experts.{e}.up_proj.weight"] = r(a["Fe"], Hin, s=0.15)
                W[m + f"experts.{e}.down_proj.weight"] = r(Hin, a["Fe"])
            W[m + "shared_experts.up_proj.weight"] = r(a["Fs"], H, s=0.15)
            W[m + "shared_experts.down_proj.weight"] = r(H, a["Fs"])
        else:
            W[m + "in_proj.weight"] = r(SI, H, s=0.15)
            W[m + "conv1d.weight"] = r(C, 1, a["K"], s=0.4)
            if a["conv_bias"]:
                W[m + "conv1d.bias"] = r(C, s=0.1)
            # dt_bias around softplus^-1 of 0.01..0.3, A_log of A in 1..nh (HF's init, jittered), D near 1
            W[m + "dt_bias"] = torch.log(torch.expm1(torch.linspace(0.01, 0.3, a["mh"], dtype=torch.float64))) + r(a["mh"], s=0.2)
            W[m + "A_log"] = torch.log(torch.arange(1, a["mh"] + 1, dtype=torch.float64)) + r(a["mh"], s=0.2)
            W[m + "D"] = 1 + r(a["mh"], s=0.3)
            W[m + "norm.weight"] = 1 + r(di)
            W[m + "out_proj.weight"] = r(H, di)
    return W


def ones_gates(a, dtype=torch.float64):
    L = a["layers"]
    return {"head": [torch.ones(x["heads"], dtype=dtype) for x in L], "ffn": [torch.ones(x["ffn"], dtype=dtype) for x in L],
            "hidden": torch.ones(a["hidden"], dtype=dtype), "attn": torch.ones(len(L), dtype=dtype),
            "mlp": torch.ones(len(L), dtype=dtype),
            "ssm": [torch.ones(a["mh"] if x["type"] == "M" else 0, dtype=dtype) for x in L]}


def gated_rmsnorm(x, w, g, eps):
    """w * g * x / sqrt(sum_c g_c x_c^2 / sum_c g_c + eps); g = 1 is the plain RMSNorm."""
    ms = (x.pow(2) * g).sum(-1, keepdim=True) / g.sum()
    return x * torch.rsqrt(ms + eps) * w * g


def mamba(a, W, m, x, gate=None):
    """The Mamba-2 mixer on x [B,T,H] (HF torch_forward's order, the scan sequential); gate [nh] (the trainer's
    Mamba head gates) gates each head inside the grouped norm: its channels weigh the gate in the group's statistic
    (sum g v^2 / sum g) and their output is multiplied by it, so a gate of 0 is the head removed."""
    B, T, _ = x.shape
    nh, Pd, Ns, G, K = a["mh"], a["P"], a["Ns"], a["G"], a["K"]
    di, C, _ = dims(a)
    zx = Fn.linear(x, W[m + "in_proj.weight"])
    z, xbc, dt = zx[..., :di], zx[..., di:di + C], zx[..., di + C:]
    xbc = Fn.conv1d(xbc.transpose(1, 2), W[m + "conv1d.weight"], W.get(m + "conv1d.bias"), padding=K - 1, groups=C)
    xbc = Fn.silu(xbc[..., :T].transpose(1, 2))
    xs = xbc[..., :di].reshape(B, T, nh, Pd)
    Bm = xbc[..., di:di + G * Ns].reshape(B, T, G, Ns).repeat_interleave(nh // G, dim=2)
    Cm = xbc[..., di + G * Ns:].reshape(B, T, G, Ns).repeat_interleave(nh // G, dim=2)
    dt = Fn.softplus(dt + W[m + "dt_bias"])  # [B,T,nh]
    A = -torch.exp(W[m + "A_log"])
    S = torch.zeros(B, nh, Pd, Ns, dtype=x.dtype)
    ys = []
    for t in range(T):
        dA = torch.exp(dt[:, t] * A)[..., None, None]
        S = dA * S + (dt[:, t, :, None, None] * xs[:, t, :, :, None]) * Bm[:, t, :, None, :]
        y = (S * Cm[:, t, :, None, :]).sum(-1) + W[m + "D"][:, None] * xs[:, t]
        ys.append(y.reshape(B, di))
    y = torch.stack(ys, 1)
    v = (y * Fn.silu(z)).reshape(B, T, G, di // G)
    g = (gate if gate is not None else torch.ones(nh, dtype=x.dtype)).repeat_interleave(Pd).reshape(G, di // G)
    v = v * g * torch.rsqrt((v.pow(2) * g).sum(-1, keepdim=True) / g.sum(-1, keepdim=True) + a["eps"])
    y = v.reshape(B, T, di) * W[m + "norm.weight"]
    return Fn.linear(y, W[m + "out_proj.weight"])


ROUTES = []  # moe() appends (choice with the bias, sigmoid without) per call; the fixture generator reads it


def moe(a, W, m, x, z=None):
    """The MoE mixer on x [B,T,H]: sigmoid router with the score-correction bias (selection only); z [E] expert
    gates (None: all 1): a gate of 0 is never chosen, a chosen expert weighs z * s."""
    shp = x.shape
    xf = x.reshape(-1, shp[-1])
    s = torch.sigmoid(Fn.linear(xf, W[m + "gate.weight"]))
    choice = s + W[m + "gate.e_score_correction_bias"].to(s.dtype)
    if z is not None:
        choice = choice.masked_fill((z <= 0).view(1, -1), float("-inf"))
    idx = torch.topk(choice, a["k"], dim=-1).indices
    ROUTES.append((choice.detach(), s.detach()))
    w = (s * z.view(1, -1) if z is not None else s).gather(1, idx)
    if a["norm"]:
        w = w / (w.sum(-1, keepdim=True) + 1e-20)
    w = w * a["scale"]
    xr = Fn.linear(xf, W[m + "fc1_latent_proj.weight"]) if a["Lt"] else xf
    out = torch.zeros_like(xr)
    for e in range(a["E"]):
        rows, pos = (idx == e).nonzero(as_tuple=True)
        if rows.numel() == 0:
            continue
        h = torch.relu(Fn.linear(xr[rows], W[m + f"experts.{e}.up_proj.weight"])).pow(2)
        out = out.index_add(0, rows, Fn.linear(h, W[m + f"experts.{e}.down_proj.weight"]) * w[rows, pos, None])
    if a["Lt"]:
        out = Fn.linear(out, W[m + "fc2_latent_proj.weight"])
    h = torch.relu(Fn.linear(xf, W[m + "shared_experts.up_proj.weight"])).pow(2)
    out = out + Fn.linear(h, W[m + "shared_experts.down_proj.weight"])
    return out.reshape(shp)


def forward_gated(a, W, tokens, G):
    """tokens [B,T] -> logits [B,T,V]."""
    B, T = tokens.shape
    hd, eps = a["head_dim"], a["eps"]
    x = Fn.embedding(tokens, W[P + "embeddings.weight"])
    keep = torch.ones(T, T, dtype=torch.bool).tril()
    for l, L in enumerate(a["layers"]):
        p = f"{P}layers.{l}."
        m = p + "mixer."
        n = gated_rmsnorm(x, W[p + "norm.weight"], G["hidden"], eps)
        if L["type"] == "*":
            q = Fn.linear(n, W[m + "q_proj.weight"]).view(B, T, -1, hd).transpose(1, 2)
            k = Fn.linear(n, W[m + "k_proj.weight"]).view(B, T, -1, hd).transpose(1, 2)
            v = Fn.linear(n, W[m + "v_proj.weight"]).view(B, T, -1, hd).transpose(1, 2)
            rep = L["heads"] // L["kv_heads"]
            k, v = k.repeat_interleave(rep, 1), v.repeat_interleave(rep, 1)
            s = (q @ k.transpose(-1, -2)) / math.sqrt(hd)
            o = torch.softmax(s.masked_fill(~keep, float("-inf")), -1) @ v
            o = (o * G["head"][l].view(1, -1, 1, 1)).transpose(1, 2).reshape(B, T, -1)
            x = x + G["attn"][l] * Fn.linear(o, W[m + "o_proj.weight"])
        elif L["type"] == "-":
            h = torch.relu(Fn.linear(n, W[m + "up_proj.weight"])).pow(2)
            x = x + G["mlp"][l] * Fn.linear(h * G["ffn"][l], W[m + "down_proj.weight"])
        elif L["type"] == "E":
            x = x + G["mlp"][l] * moe(a, W, m, n, G["expert"][l] if "expert" in G else None)
        else:
            x = x + G["mlp"][l] * mamba(a, W, m, n, G["ssm"][l] if "ssm" in G else None)
    n = gated_rmsnorm(x, W[P + "norm_f.weight"], G["hidden"], eps)
    return Fn.linear(n, W.get("lm_head.weight", W[P + "embeddings.weight"]))


def forward(a, W, tokens):
    return forward_gated(a, W, tokens, ones_gates(a, W[P + "embeddings.weight"].dtype))
