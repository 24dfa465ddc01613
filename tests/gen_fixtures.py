#!/usr/bin/env python3
"""Generate the reference fixtures the C tests compare against.

Everything comes from tests/ref_llama.py (PyTorch, float64), written
independently of the C engine:
  models/<name>/            config.json + safetensors (various dtypes, sharded,
                            heterogeneous), tokens.json, logits.bin (float32)
  tok/<name>/tokenizer.json + cases.json  (text -> ids by the Python BPE,
                            or by the sentencepiece library for sp_*)
  ppl.json                  perplexity of the tiny model on held-out text
"""
import argparse
import json
import math
import os
import unicodedata

import torch

import ref_llama as R
import ref_mamba as M


def model_case(out, name, cfg, dtype, seed, B=2, T=11, shard=False, ref=R):
    d = os.path.join(out, "models", name)
    os.makedirs(d, exist_ok=True)
    arch = ref.arch_from_config(cfg)
    W = ref.random_weights(arch, seed)
    # what is stored (nemotron_h's router correction bias stays fp32, as Hugging Face keeps it)
    W = {k: v.to(torch.float32 if k.endswith("e_score_correction_bias") else dtype) for k, v in W.items()}
    with open(os.path.join(d, "config.json"), "w") as f:
        json.dump(cfg, f, indent=1)
    if shard:
        names = list(W)
        half = len(names) // 2
        parts = [names[:half], names[half:]]
        wm = {}
        total = 0
        for i, part in enumerate(parts):
            fn = f"model-{i + 1:05d}-of-00002.safetensors"
            R.save_safetensors(os.path.join(d, fn), {k: W[k] for k in part})
            for k in part:
                wm[k] = fn
                total += W[k].numel() * W[k].element_size()
        with open(os.path.join(d, "model.safetensors.index.json"), "w") as f:
            json.dump({"metadata": {"total_size": total}, "weight_map": wm}, f)
    else:
        R.save_safetensors(os.path.join(d, "model.safetensors"), W, {"format": "pt"})
    g = torch.Generator().manual_seed(seed + 1000)
    toks = torch.randint(0, cfg["vocab_size"], (B, T), generator=g)
    Wd = {k: v.double() for k, v in W.items()}
    with torch.no_grad():
        logits = ref.forward(arch, Wd, toks).float()
    with open(os.path.join(d, "tokens.json"), "w") as f:
        json.dump({"B": B, "T": T, "ids": toks.flatten().tolist()}, f)
    logits.numpy().astype("<f4").tofile(os.path.join(d, "logits.bin"))


BASE = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "vocab_size": 300, "hidden_size": 64,
        "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2, "intermediate_size": 160,
        "max_position_embeddings": 256, "rms_norm_eps": 1e-5, "rope_theta": 10000.0, "tie_word_embeddings": False}


def models(out):
    model_case(out, "llama_gqa_bf16", dict(BASE), torch.bfloat16, 1)
    model_case(out, "qwen2_tied_f16", dict(BASE, model_type="qwen2", tie_word_embeddings=True, rope_theta=1000000.0,
                                           num_key_value_heads=1, rms_norm_eps=1e-6), torch.float16, 2)
    model_case(out, "llama3_rope_f32", dict(BASE, head_dim=32, num_attention_heads=4, num_key_value_heads=4,
                                            rope_theta=500000.0,
                                            rope_scaling={"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                                                          "high_freq_factor": 4.0, "original_max_position_embeddings": 64}),
               torch.float32, 3, T=40)
    model_case(out, "mistral_sharded", dict(BASE, model_type="mistral", head_dim=24, num_hidden_layers=3, sliding_window=4), torch.bfloat16, 4,
               shard=True)
    deci = dict(BASE, architectures=["DeciLMForCausalLM"], model_type="nemotron-nas", num_hidden_layers=4,
                block_configs=[
                    {"attention": {"n_heads_in_group": 2, "no_op": False, "replace_with_linear": False},
                     "ffn": {"ffn_mult": 3.75, "no_op": False, "replace_with_linear": False, "intermediate_size": 160}},
                    {"attention": {"n_heads_in_group": None, "no_op": True, "replace_with_linear": False},
                     "ffn": {"no_op": False, "replace_with_linear": False, "intermediate_size": 96}},
                    {"attention": {"n_heads_in_group": 1, "num_attention_heads": 2, "no_op": False, "replace_with_linear": False},
                     "ffn": {"no_op": False, "replace_with_linear": False, "intermediate_size": 64}},
                    {"attention": {"n_heads_in_group": 4, "no_op": False, "replace_with_linear": False},
                     "ffn": {"no_op": True, "replace_with_linear": False}}])
    model_case(out, "deci_hetero", deci, torch.float32, 5)
    # Qwen3: per-head q/k norms, head_dim 24 unrelated to hidden 64 / 4 heads
    model_case(out, "qwen3_hd_bf16", dict(BASE, architectures=["Qwen3ForCausalLM"], model_type="qwen3", head_dim=24,
                                          rope_theta=1000000.0, rms_norm_eps=1e-6, attention_bias=False,
                                          use_sliding_window=False, sliding_window=None), torch.bfloat16, 6)
    # Qwen3-MoE: 5 experts (odd), top-2 without renormalisation, layer 1 dense (mlp_only_layers), 3 layers
    model_case(out, "qwen3moe_mixed_bf16",
               dict(BASE, architectures=["Qwen3MoeForCausalLM"], model_type="qwen3_moe", head_dim=24,
                    num_hidden_layers=3, num_experts=5, num_experts_per_tok=2, moe_intermediate_size=48,
                    norm_topk_prob=False, decoder_sparse_step=1, mlp_only_layers=[1], rope_theta=1000000.0,
                    rms_norm_eps=1e-6, attention_bias=False, use_sliding_window=False), torch.bfloat16, 7)
    # Mixtral: 3 experts, top-2 renormalised, every layer MoE
    model_case(out, "mixtral_f32", dict(BASE, architectures=["MixtralForCausalLM"], model_type="mixtral",
                                        num_local_experts=3, num_experts_per_tok=2, intermediate_size=64,
                                        sliding_window=None), torch.float32, 8)
    hybrid_models(out)


# Nemotron-H (hybrid Mamba-2 / attention / MLP): odd widths, 2 groups of 3 Mamba heads of width 5, state 7,
# attention head_dim 12 beside hidden 40
NEMOTRON_H = {"architectures": ["NemotronHForCausalLM"], "model_type": "nemotron_h", "vocab_size": 300,
              "hidden_size": 40, "num_hidden_layers": 5, "hybrid_override_pattern": "M-M*-",
              "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 12, "intermediate_size": 70,
              "mlp_hidden_act": "relu2", "mamba_num_heads": 6, "mamba_head_dim": 5, "ssm_state_size": 7,
              "n_groups": 2, "conv_kernel": 4, "use_conv_bias": True, "use_bias": False, "mlp_bias": False,
              "attention_bias": False, "layer_norm_epsilon": 1e-5, "max_position_embeddings": 256,
              "tie_word_embeddings": False}


# Nemotron-H MoE (Nemotron 3 Nano's layer kinds): 6 squared-ReLU experts of 24, top-2 renormalised and scaled by
# 2.5, a shared expert of 36, the sigmoid router with a random score-correction bias; and an fp32 one with the
# defaults NemotronHConfig fills in where keys are absent (scale 1) but norm_topk_prob false and top-3
NEMOTRON_H_MOE = dict(NEMOTRON_H, hybrid_override_pattern="MEM*E", n_routed_experts=6, num_experts_per_tok=2,
                      moe_intermediate_size=24, moe_shared_expert_intermediate_size=36, norm_topk_prob=True,
                      routed_scaling_factor=2.5, n_group=1, topk_group=1, n_shared_experts=1, moe_latent_size=None)
NEMOTRON_H_MOE_NONORM = dict(NEMOTRON_H, hybrid_override_pattern="E*E", num_hidden_layers=3, n_routed_experts=5,
                             num_experts_per_tok=3, moe_intermediate_size=20, moe_shared_expert_intermediate_size=28,
                             norm_topk_prob=False)
# LatentMoE (Nemotron 3 Super's MoE): the routed experts in a latent width of 24 beside hidden 40
NEMOTRON_H_LATENT = dict(NEMOTRON_H_MOE, hybrid_override_pattern="ME*E", num_hidden_layers=4, moe_latent_size=24,
                         moe_intermediate_size=20, moe_shared_expert_intermediate_size=32, routed_scaling_factor=2.0)


def moe_case(out, name, cfg, dtype, seed):
    """A nemotron_h MoE fixture, checked to be one where the test can fail: the correction bias changes which
    experts some rows choose, and no row's k-th and (k+1)-th choices are within 1e-4 (a flip of the C code's fp32
    arithmetic would not be a real difference)."""
    M.ROUTES.clear()
    model_case(out, name, cfg, dtype, seed, ref=M)
    k, changed, margin = cfg["num_experts_per_tok"], 0, 1.0
    for choice, sig in M.ROUTES:
        top = torch.sort(choice, -1, descending=True).values
        margin = min(margin, (top[:, k - 1] - top[:, k]).min().item())
        a, b = torch.topk(choice, k).indices.sort(-1).values, torch.topk(sig, k).indices.sort(-1).values
        changed += (a != b).any(-1).sum().item()
    assert changed > 0 and margin > 1e-4, (name, changed, margin)
    print(f"{name}: the bias changes the choice of {changed} rows; smallest top-k margin {margin:.4f}")
    hybrid_ppl(out, name, cfg)


def hybrid_ppl(out, name, cfg):
    """ppl.json beside a nemotron_h fixture: ref_mamba.py's perplexity in float64 over 3 windows of 32 random
    tokens (their ids in it), each window from position 0."""
    d = os.path.join(out, "models", name)
    arch = M.arch_from_config(cfg)
    W = {k: v.double() for k, v in R.load_safetensors(os.path.join(d, "model.safetensors")).items()}
    g = torch.Generator().manual_seed(12)
    ctx, nwin = 32, 3
    ids = torch.randint(0, cfg["vocab_size"], (ctx * nwin,), generator=g).tolist()
    nll, cnt = 0.0, 0
    for w in range(nwin):
        x = torch.tensor([ids[w * ctx:(w + 1) * ctx]])
        with torch.no_grad():
            lp = torch.log_softmax(M.forward(arch, W, x)[0], -1)
        for t in range(ctx - 1):
            nll -= lp[t, ids[w * ctx + t + 1]].item()
            cnt += 1
    with open(os.path.join(d, "ppl.json"), "w") as f:
        json.dump({"ids": ids, "ctx": ctx, "windows": nwin, "scored": cnt, "ppl": math.exp(nll / cnt)}, f)


def hybrid_models(out):
    """The nemotron_h fixtures (logits of 2 x 11 tokens, ref_mamba.py in float64) and ppl.json beside each."""
    moe_case(out, "nemotronh_moe_bf16", NEMOTRON_H_MOE, torch.bfloat16, 13)
    moe_case(out, "nemotronh_moe_nonorm_f32", NEMOTRON_H_MOE_NONORM, torch.float32, 14)
    moe_case(out, "nemotronh_latent_bf16", NEMOTRON_H_LATENT, torch.bfloat16, 15)
    model_case(out, "nemotronh_bf16", NEMOTRON_H, torch.bfloat16, 11, ref=M)
    hybrid_ppl(out, "nemotronh_bf16", NEMOTRON_H)


SAMPLES = [
    "Hello world! It's a test, isn't it?",
    "  leading spaces and trailing   ",
    "Numbers: 1234567 and 3.14159; dates 2026-12-02.",
    "Unicode: caf\u00e9 na\u00efve \u00fcber \u4e2d\u6587 \U0001F600 \u00bfqu\u00e9?",
    "line one\nline two\r\n\n\ttabbed\n",
    "<|endoftext|>special<|endoftext|> tokens<|endoftext|>",
    "We'll see what they've done; I'M SURE you'd LIKE it.",
    "Decomposed: cafe\u0301 nai\u0308ve A\u030a \ufb01ne \u2460",
    "",
]


def tokenizers(out, tiny_dir, data_dir):
    text = open(os.path.join(data_dir, "calib.txt")).read() if data_dir and os.path.exists(os.path.join(data_dir, "calib.txt")) else " ".join(SAMPLES * 50)
    cases_extra = [text[:3000], text[3000:6000]]
    # 1. the tiny model's tokenizer (Llama-3 split + ByteLevel, "a b" merges)
    # 2. a GPT-2 style tokenizer (ByteLevel use_regex=true, pair-form merges)
    specs = []
    if tiny_dir and os.path.exists(os.path.join(tiny_dir, "tokenizer.json")):
        specs.append(("tiny", json.load(open(os.path.join(tiny_dir, "tokenizer.json")))))
    merges = R.train_bpe(text[:60000], 200, pattern=R.GPT2_SPLIT)
    tj, _ = R.tokenizer_json(merges, ["<|endoftext|>"], pair_form=True)
    tj["pre_tokenizer"] = {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": True}
    specs.append(("gpt2style", tj))
    # 3. the same with an NFC normalizer, as Qwen2's tokenizer.json has
    specs.append(("nfc", dict(tj, normalizer={"type": "NFC"})))
    for name, tj in specs:
        d = os.path.join(out, "tok", name)
        os.makedirs(d, exist_ok=True)
        with open(os.path.join(d, "tokenizer.json"), "w") as f:
            json.dump(tj, f, ensure_ascii=False)
        model = tj["model"]
        mer = [tuple(m.split(" ", 1)) if isinstance(m, str) else tuple(m) for m in model["merges"]]
        pre = tj["pre_tokenizer"]
        pattern = R.GPT2_SPLIT if pre["type"] == "ByteLevel" else pre["pretokenizers"][0]["pattern"]["Regex"]
        vocab = dict(model["vocab"])
        for a in tj["added_tokens"]:
            vocab[a["content"]] = a["id"]
        norm = (lambda x: unicodedata.normalize("NFC", x)) if tj.get("normalizer") else (lambda x: x)
        cases = [{"text": s, "ids": R.bpe_encode(norm(s), vocab, mer, pattern=pattern, specials=[a["content"] for a in tj["added_tokens"]]),
                  "decoded": norm(s)} for s in SAMPLES + cases_extra]
        with open(os.path.join(d, "cases.json"), "w") as f:
            json.dump(cases, f, ensure_ascii=False)


def sp_tokenizers(out, data_dir):
    """SentencePiece-style tokenizer.json files (the Llama-2 / Mistral family):
    a SentencePiece BPE model with byte fallback is trained here, converted to
    tokenizer.json the way Hugging Face's converter does (merges from every
    split of a piece into two pieces, ordered by the piece's score), in the
    legacy form (Prepend + Replace normalizers) and the Metaspace form. The
    expected ids and decoded text come from the sentencepiece library."""
    try:
        import sentencepiece as spm
    except ImportError:
        print("python3-sentencepiece missing: SentencePiece tokenizer fixtures not written")
        return
    path = os.path.join(data_dir or "", "calib.txt")
    text = open(path).read() if os.path.exists(path) else "\n".join(SAMPLES * 50)
    work = os.path.join(out, "tok", "sp_train")
    os.makedirs(work, exist_ok=True)
    with open(os.path.join(work, "train.txt"), "w") as f:
        f.write(text[:200000])
    spm.SentencePieceTrainer.train(input=os.path.join(work, "train.txt"), model_prefix=os.path.join(work, "sp"), vocab_size=1000,
                                   model_type="bpe", byte_fallback=True, normalization_rule_name="identity",
                                   remove_extra_whitespaces=False, add_dummy_prefix=True, num_threads=1, minloglevel=2,
                                   unk_id=0, bos_id=1, eos_id=2, pad_id=-1)
    sp = spm.SentencePieceProcessor(model_file=os.path.join(work, "sp.model"))
    vocab = {sp.id_to_piece(i): i for i in range(sp.get_piece_size())}
    merges = []
    for piece, pid in vocab.items():
        if sp.is_unknown(pid) or sp.is_control(pid) or sp.is_byte(pid):
            continue
        for i in range(1, len(piece)):
            left, right = piece[:i], piece[i:]
            if left in vocab and right in vocab:
                merges.append((left, right, sp.get_score(pid)))
    merges.sort(key=lambda m: (-m[2], vocab[m[0]], vocab[m[1]]))
    added = [{"id": i, "content": sp.id_to_piece(i), "single_word": False, "lstrip": False, "rstrip": False, "normalized": False,
              "special": True} for i in (0, 1, 2)]
    model = {"type": "BPE", "dropout": None, "unk_token": "<unk>", "continuing_subword_prefix": None, "end_of_word_suffix": None,
             "fuse_unk": True, "byte_fallback": True, "vocab": vocab}
    legacy = {"version": "1.0", "added_tokens": added,
              "normalizer": {"type": "Sequence", "normalizers": [{"type": "Prepend", "prepend": "\u2581"},
                                                                 {"type": "Replace", "pattern": {"String": " "}, "content": "\u2581"}]},
              "pre_tokenizer": None,
              "decoder": {"type": "Sequence", "decoders": [{"type": "Replace", "pattern": {"String": "\u2581"}, "content": " "},
                                                           {"type": "ByteFallback"}, {"type": "Fuse"},
                                                           {"type": "Strip", "content": " ", "start": 1, "stop": 0}]},
              "model": dict(model, merges=[f"{a} {b}" for a, b, _ in merges])}
    meta = {"type": "Metaspace", "replacement": "\u2581", "prepend_scheme": "first", "split": False}
    metaspace = {"version": "1.0", "added_tokens": added, "normalizer": None, "pre_tokenizer": meta, "decoder": meta,
                 "model": dict(model, merges=[[a, b] for a, b, _ in merges])}
    texts = [t for t in SAMPLES if "<|endoftext|>" not in t] + [text[:3000], text[3000:6000]]
    for name, tj, first_only in (("sp_legacy", legacy, False), ("sp_metaspace", metaspace, True)):
        d = os.path.join(out, "tok", name)
        os.makedirs(d, exist_ok=True)
        with open(os.path.join(d, "tokenizer.json"), "w") as f:
            json.dump(tj, f, ensure_ascii=False)
        cases = []
        for t in texts:
            # Metaspace does not add the prefix to text that already starts
            # with a space; SentencePiece always does, so drop one space.
            ids = sp.encode(t[1:] if first_only and t.startswith(" ") else t)
            cases.append({"text": t, "ids": ids, "decoded": sp.decode(ids)})
        with open(os.path.join(d, "cases.json"), "w") as f:
            json.dump(cases, f, ensure_ascii=False)


def ppl(out, tiny_dir, data_dir):
    if not (tiny_dir and os.path.exists(os.path.join(tiny_dir, "config.json"))):
        return
    tj = json.load(open(os.path.join(tiny_dir, "tokenizer.json")))
    vocab = dict(tj["model"]["vocab"])
    for a in tj["added_tokens"]:
        vocab[a["content"]] = a["id"]
    mer = [tuple(m.split(" ", 1)) for m in tj["model"]["merges"]]
    text = open(os.path.join(data_dir, "heldout.txt")).read()[:20000]
    with open(os.path.join(out, "heldout_small.txt"), "w") as f:
        f.write(text)
    ids = R.bpe_encode(text, vocab, mer, specials=["<|endoftext|>"])
    cfg = json.load(open(os.path.join(tiny_dir, "config.json")))
    arch = R.arch_from_config(cfg)
    W = {k: v.double() for k, v in R.load_safetensors(os.path.join(tiny_dir, "model.safetensors")).items()}
    res = {}
    for ctx, stride, nwin in ((64, 0, 6), (64, 32, 8)):
        nll, cnt, prev_end = 0.0, 0, 1
        if stride == 0:
            wins = [(w * ctx, 0) for w in range(min(nwin, len(ids) // ctx))]
        else:
            wins = []
            for w in range(min(nwin, (len(ids) - ctx) // stride + 1)):
                st = w * stride
                wins.append((st, max(0, prev_end - 1 - st)))
                prev_end = st + ctx
        for st, frm in wins:
            x = torch.tensor([ids[st: st + ctx]])
            with torch.no_grad():
                lp = torch.log_softmax(R.forward(arch, W, x)[0], -1)
            for t in range(frm, ctx - 1):
                nll -= lp[t, ids[st + t + 1]].item()
                cnt += 1
        res[f"ctx{ctx}_stride{stride}_win{nwin}"] = {"ctx": ctx, "stride": stride, "windows": nwin, "scored": cnt,
                                                    "ppl": math.exp(nll / cnt)}
    with open(os.path.join(out, "ppl.json"), "w") as f:
        json.dump(res, f, indent=1)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--tiny", default="build/models/tiny")
    ap.add_argument("--data", default="build/data")
    a = ap.parse_args()
    torch.set_num_threads(2)
    models(a.out)
    tokenizers(a.out, a.tiny, a.data)
    sp_tokenizers(a.out, a.data)
    ppl(a.out, a.tiny, a.data)
    print("fixtures written to", a.out)


if __name__ == "__main__":
    main()
