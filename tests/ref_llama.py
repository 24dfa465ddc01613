"""Independent PyTorch reference for the AutoCompress engine and formats.

Written from the Hugging Face Llama/Qwen2/Qwen3 semantics (rotate-half RoPE,
RMSNorm in fp32, GQA, SwiGLU; Qwen3's per-head q_norm/k_norm before RoPE),
not from the C code, so the C engine's logits
can be checked against it. Also holds a plain safetensors writer/reader and
a byte-level BPE (train + encode) used to build the tiny model's tokenizer.
Heterogeneous layers: arch["layers"][l] = {"heads","kv_heads","ffn"}, 0 = removed.
"""
import json
import math
import os
import struct

import numpy as np
import torch

# ---------------------------------------------------------------- safetensors
_DT = {"F32": (torch.float32, 4), "F16": (torch.float16, 2), "BF16": (torch.bfloat16, 2)}


def save_safetensors(path, tensors, metadata=None):
    """tensors: dict name -> torch tensor (F32/F16/BF16). Insertion order kept."""
    header, blobs, off = {}, [], 0
    if metadata is not None:
        header["__metadata__"] = metadata
    for name, t in tensors.items():
        t = t.detach().contiguous().cpu()
        dt = {torch.float32: "F32", torch.float16: "F16", torch.bfloat16: "BF16"}[t.dtype]
        raw = t.view(torch.int16).numpy().tobytes() if t.dtype == torch.bfloat16 else t.numpy().tobytes()
        header[name] = {"dtype": dt, "shape": list(t.shape), "data_offsets": [off, off + len(raw)]}
        blobs.append(raw)
        off += len(raw)
    h = json.dumps(header, separators=(",", ":")).encode()
    h += b" " * ((8 - len(h) % 8) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)))
        f.write(h)
        for b in blobs:
            f.write(b)


def load_safetensors(path):
    with open(path, "rb") as f:
        data = f.read()
    n = struct.unpack("<Q", data[:8])[0]
    header = json.loads(data[8:8 + n])
    out = {}
    base = 8 + n
    for name, e in header.items():
        if name == "__metadata__":
            continue
        b, en = e["data_offsets"]
        raw = data[base + b: base + en]
        if e["dtype"] == "BF16":
            t = torch.frombuffer(bytearray(raw), dtype=torch.int16).view(torch.bfloat16)
        else:
            t = torch.frombuffer(bytearray(raw), dtype=_DT[e["dtype"]][0])
        out[name] = t.reshape(e["shape"]).float()
    return out


# ---------------------------------------------------------------- config
def arch_from_config(cfg):
    nh = cfg["num_attention_heads"]
    nkv = cfg.get("num_key_value_heads") or nh
    hd = cfg.get("head_dim") or (128 if cfg["model_type"].startswith("qwen3") else cfg["hidden_size"] // nh)
    layers = [{"heads": nh, "kv_heads": nkv, "ffn": cfg["intermediate_size"]} for _ in range(cfg["num_hidden_layers"])]
    for l, bc in enumerate(cfg.get("block_configs") or []):
        at, ff = bc["attention"], bc["ffn"]
        if at.get("no_op"):
            layers[l]["heads"] = layers[l]["kv_heads"] = 0
        else:
            h = at.get("num_attention_heads", nh)
            layers[l]["heads"], layers[l]["kv_heads"] = h, h // at["n_heads_in_group"]
        layers[l]["ffn"] = 0 if ff.get("no_op") else ff["intermediate_size"]
    mt = cfg["model_type"]
    if mt in ("qwen3_moe", "mixtral"):  # mixture-of-experts FFN layers (HF's layer choice)
        q3 = mt == "qwen3_moe"
        E = cfg["num_experts"] if q3 else cfg["num_local_experts"]
        fe = cfg["moe_intermediate_size"] if q3 else cfg["intermediate_size"]
        step, only = (cfg.get("decoder_sparse_step") or 1, cfg.get("mlp_only_layers") or []) if q3 else (1, [])
        for l, L in enumerate(layers):
            if l not in only and E > 0 and (l + 1) % step == 0:
                L.update(ffn=0, experts=E, expert_ffn=fe)
    return {
        "family": mt, "top_k": cfg.get("num_experts_per_tok", 0),
        "norm_topk": mt == "mixtral" or bool(cfg.get("norm_topk_prob")),
        "hidden": cfg["hidden_size"], "head_dim": hd, "vocab": cfg["vocab_size"], "layers": layers,
        "eps": cfg.get("rms_norm_eps", 1e-6), "theta": cfg.get("rope_theta", 10000.0),
        "rope_scaling": cfg.get("rope_scaling"), "tie": cfg.get("tie_word_embeddings", False),
        "bias": cfg["model_type"] == "qwen2" or cfg.get("attention_bias", False),
        "qk_norm": cfg["model_type"] in ("qwen3", "qwen3_moe") or bool(cfg.get("qk_norm")),
        "window": (cfg.get("sliding_window") or 0)
        if (cfg["model_type"] not in ("qwen2", "qwen3", "qwen3_moe") or cfg.get("use_sliding_window")) else 0,
    }


def inv_freq(arch):
    hd = arch["head_dim"]
    inv = 1.0 / (arch["theta"] ** (torch.arange(0, hd, 2, dtype=torch.int64).float() / hd))
    rs = arch.get("rope_scaling")
    if rs and (rs.get("rope_type") or rs.get("type")) == "llama3":
        factor, lo, hi, orig = rs["factor"], rs["low_freq_factor"], rs["high_freq_factor"], rs["original_max_position_embeddings"]
        lo_wl, hi_wl = orig / lo, orig / hi
        wl = 2 * math.pi / inv
        scaled = torch.where(wl > lo_wl, inv / factor, inv)
        s = (orig / wl - lo) / (hi - lo)
        smooth = (1 - s) * scaled / factor + s * scaled
        medium = ~(wl < hi_wl) & ~(wl > lo_wl)
        inv = torch.where(medium, smooth, scaled)
    return inv


# ---------------------------------------------------------------- model
def moe_names(arch, l):
    """HF tensor names of layer l's router and expert e's gate, up, down (format with e)."""
    p = f"model.layers.{l}."
    if arch["family"] == "mixtral":
        b = p + "block_sparse_moe."
        return b + "gate.weight", b + "experts.{}.w1.weight", b + "experts.{}.w3.weight", b + "experts.{}.w2.weight"
    b = p + "mlp."
    return (b + "gate.weight", b + "experts.{}.gate_proj.weight", b + "experts.{}.up_proj.weight",
            b + "experts.{}.down_proj.weight")


def moe(arch, W, l, L, n):
    """HF's sparse MoE block (Qwen3MoeSparseMoeBlock / MixtralSparseMoeBlock): softmax over the experts,
    top-k, renormalised when norm_topk; each expert a SwiGLU; the weighted sum."""
    rn, gn, un, dn = moe_names(arch, l)
    p = torch.softmax(n @ W[rn].T, dim=-1)
    topv, topi = torch.topk(p, arch["top_k"], dim=-1)
    if arch["norm_topk"]:
        topv = topv / topv.sum(-1, keepdim=True)
    out = torch.zeros_like(n)
    for e in range(L["experts"]):
        w = (topv * (topi == e)).sum(-1, keepdim=True)
        h = torch.nn.functional.silu(n @ W[gn.format(e)].T) * (n @ W[un.format(e)].T)
        out = out + w * (h @ W[dn.format(e)].T)
    return out


def rmsnorm(x, w, eps):
    xf = x.to(torch.promote_types(x.dtype, torch.float32))
    return xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps) * w


def rotate_half(x):
    h = x.shape[-1] // 2
    return torch.cat((-x[..., h:], x[..., :h]), dim=-1)


def forward(arch, W, tokens):
    """tokens: LongTensor [B,T] -> logits [B,T,V] (fp32)."""
    B, T = tokens.shape
    hd = arch["head_dim"]
    x = W["model.embed_tokens.weight"][tokens]
    pos = torch.arange(T).float()
    freqs = torch.outer(pos, inv_freq(arch))
    emb = torch.cat((freqs, freqs), dim=-1)
    cos, sin = emb.cos(), emb.sin()
    mask = torch.full((T, T), float("-inf")).triu(1)
    if arch.get("window"):  # sliding window: query i sees keys i-window+1 .. i
        mask = mask + torch.full((T, T), float("-inf")).tril(-arch["window"])
    for l, L in enumerate(arch["layers"]):
        p = f"model.layers.{l}."
        if L["heads"]:
            n = rmsnorm(x, W[p + "input_layernorm.weight"], arch["eps"])
            q = n @ W[p + "self_attn.q_proj.weight"].T
            k = n @ W[p + "self_attn.k_proj.weight"].T
            v = n @ W[p + "self_attn.v_proj.weight"].T
            if arch["bias"]:
                q = q + W[p + "self_attn.q_proj.bias"]
                k = k + W[p + "self_attn.k_proj.bias"]
                v = v + W[p + "self_attn.v_proj.bias"]
            q = q.view(B, T, L["heads"], hd).transpose(1, 2)
            k = k.view(B, T, L["kv_heads"], hd).transpose(1, 2)
            v = v.view(B, T, L["kv_heads"], hd).transpose(1, 2)
            if arch.get("qk_norm"):  # Qwen3: RMSNorm over head_dim, one weight for all heads, before RoPE
                q = rmsnorm(q, W[p + "self_attn.q_norm.weight"], arch["eps"])
                k = rmsnorm(k, W[p + "self_attn.k_norm.weight"], arch["eps"])
            q = q * cos + rotate_half(q) * sin
            k = k * cos + rotate_half(k) * sin
            rep = L["heads"] // L["kv_heads"]
            k = k.repeat_interleave(rep, dim=1)
            v = v.repeat_interleave(rep, dim=1)
            att = (q @ k.transpose(-1, -2)) / math.sqrt(hd) + mask
            att = torch.softmax(att.to(torch.promote_types(att.dtype, torch.float32)), dim=-1).to(v.dtype)
            o = (att @ v).transpose(1, 2).reshape(B, T, L["heads"] * hd)
            x = x + o @ W[p + "self_attn.o_proj.weight"].T
        if L.get("experts"):
            x = x + moe(arch, W, l, L, rmsnorm(x, W[p + "post_attention_layernorm.weight"], arch["eps"]))
        if L["ffn"]:
            n = rmsnorm(x, W[p + "post_attention_layernorm.weight"], arch["eps"])
            g = n @ W[p + "mlp.gate_proj.weight"].T
            u = n @ W[p + "mlp.up_proj.weight"].T
            x = x + (torch.nn.functional.silu(g) * u) @ W[p + "mlp.down_proj.weight"].T
    x = rmsnorm(x, W["model.norm.weight"], arch["eps"])
    head = W.get("lm_head.weight", W["model.embed_tokens.weight"])
    return x @ head.T


def random_weights(arch, seed, scale=0.08):
    g = torch.Generator().manual_seed(seed)
    H, hd, V = arch["hidden"], arch["head_dim"], arch["vocab"]

    def r(*shape):
        return torch.randn(*shape, generator=g) * scale

    W = {"model.embed_tokens.weight": r(V, H)}
    for l, L in enumerate(arch["layers"]):
        p = f"model.layers.{l}."
        if L["heads"]:
            W[p + "input_layernorm.weight"] = 1 + r(H)
            W[p + "self_attn.q_proj.weight"] = r(L["heads"] * hd, H)
            W[p + "self_attn.k_proj.weight"] = r(L["kv_heads"] * hd, H)
            W[p + "self_attn.v_proj.weight"] = r(L["kv_heads"] * hd, H)
            W[p + "self_attn.o_proj.weight"] = r(H, L["heads"] * hd)
            if arch["bias"]:
                W[p + "self_attn.q_proj.bias"] = r(L["heads"] * hd)
                W[p + "self_attn.k_proj.bias"] = r(L["kv_heads"] * hd)
                W[p + "self_attn.v_proj.bias"] = r(L["kv_heads"] * hd)
            if arch.get("qk_norm"):
                W[p + "self_attn.q_norm.weight"] = 1 + 3 * r(hd)
                W[p + "self_attn.k_norm.weight"] = 1 + 3 * r(hd)
        if L.get("experts"):
            W[p + "post_attention_layernorm.weight"] = 1 + r(H)
            rn, gn, un, dn = moe_names(arch, l)
            W[rn] = 4 * r(L["experts"], H)  # sharper routing than the other weights' scale
            for e in range(L["experts"]):
                W[gn.format(e)] = r(L["expert_ffn"], H)
                W[un.format(e)] = r(L["expert_ffn"], H)
                W[dn.format(e)] = r(H, L["expert_ffn"])
        if L["ffn"]:
            W[p + "post_attention_layernorm.weight"] = 1 + r(H)
            W[p + "mlp.gate_proj.weight"] = r(L["ffn"], H)
            W[p + "mlp.up_proj.weight"] = r(L["ffn"], H)
            W[p + "mlp.down_proj.weight"] = r(H, L["ffn"])
    W["model.norm.weight"] = 1 + r(H)
    if not arch["tie"]:
        W["lm_head.weight"] = r(V, H)
    return W


# ---------------------------------------------------------------- byte-level BPE
def bytes_to_unicode():
    bs = list(range(0x21, 0x7F)) + list(range(0xA1, 0xAD)) + list(range(0xAE, 0x100))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return dict(zip(bs, (chr(c) for c in cs)))


LLAMA3_SPLIT = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
GPT2_SPLIT = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"


def pretokenize(text, pattern):
    import regex  # python3-regex: \p{L} classes
    b2u = bytes_to_unicode()
    return ["".join(b2u[b] for b in m.encode("utf-8")) for m in regex.findall(pattern, text)]


def train_bpe(text, n_merges, pattern=LLAMA3_SPLIT):
    from collections import Counter
    words = Counter(pretokenize(text, pattern))
    seqs = {w: list(w) for w in words}
    merges = []
    for _ in range(n_merges):
        pairs = Counter()
        for w, c in words.items():
            s = seqs[w]
            for i in range(len(s) - 1):
                pairs[(s[i], s[i + 1])] += c
        if not pairs:
            break
        best = max(pairs.items(), key=lambda kv: (kv[1], kv[0]))[0]
        merges.append(best)
        a, b = best
        for w in words:
            s = seqs[w]
            if len(s) < 2:
                continue
            i, out = 0, []
            while i < len(s):
                if i + 1 < len(s) and s[i] == a and s[i + 1] == b:
                    out.append(a + b)
                    i += 2
                else:
                    out.append(s[i])
                    i += 1
            seqs[w] = out
    return merges


def bpe_encode_word(word, ranks):
    s = list(word)
    while len(s) > 1:
        best, bi = None, -1
        for i in range(len(s) - 1):
            r = ranks.get((s[i], s[i + 1]))
            if r is not None and (best is None or r < best):
                best, bi = r, i
        if best is None:
            break
        s = s[:bi] + [s[bi] + s[bi + 1]] + s[bi + 2:]
    return s


def bpe_encode(text, vocab, merges, pattern=LLAMA3_SPLIT, specials=()):
    ranks = {tuple(m): i for i, m in enumerate(merges)}
    ids = []
    parts = [text]
    for sp in specials:
        nxt = []
        for p in parts:
            if isinstance(p, int):
                nxt.append(p)
                continue
            chunks = p.split(sp)
            for i, c in enumerate(chunks):
                if i:
                    nxt.append(vocab[sp])
                if c:
                    nxt.append(c)
        parts = nxt
    for p in parts:
        if isinstance(p, int):
            ids.append(p)
            continue
        for w in pretokenize(p, pattern):
            ids.extend(vocab[t] for t in bpe_encode_word(w, ranks))
    return ids


def tokenizer_json(merges, specials, pattern=LLAMA3_SPLIT, pair_form=False):
    b2u = bytes_to_unicode()
    vocab = {}
    for b in range(256):
        vocab[b2u[b]] = len(vocab)
    for a, b in merges:
        vocab.setdefault(a + b, len(vocab))
    added = []
    for s in specials:
        vocab[s] = len(vocab)
        added.append({"id": vocab[s], "content": s, "single_word": False, "lstrip": False, "rstrip": False,
                      "normalized": False, "special": True})
    tj = {
        "version": "1.0", "truncation": None, "padding": None, "added_tokens": added, "normalizer": None,
        "pre_tokenizer": {"type": "Sequence", "pretokenizers": [
            {"type": "Split", "pattern": {"Regex": pattern}, "behavior": "Isolated", "invert": False},
            {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": False}]},
        "post_processor": None,
        "decoder": {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": True, "use_regex": True},
        "model": {"type": "BPE", "dropout": None, "unk_token": None, "continuing_subword_prefix": None,
                  "end_of_word_suffix": None, "fuse_unk": False, "byte_fallback": False, "ignore_merges": False,
                  "vocab": vocab,
                  "merges": [[a, b] for a, b in merges] if pair_form else [f"{a} {b}" for a, b in merges]},
    }
    return tj, vocab


def write_model(outdir, cfg, W, dtype=torch.float32):
    os.makedirs(outdir, exist_ok=True)
    with open(os.path.join(outdir, "config.json"), "w") as f:
        json.dump(cfg, f, indent=2)
    save_safetensors(os.path.join(outdir, "model.safetensors"), {k: v.to(dtype) for k, v in W.items()}, {"format": "pt"})
