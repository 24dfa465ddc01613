"""The headline case on paper: Nemotron 3 Super (120B total, 12B active;
Mamba-2 + LatentMoE + 8 attention layers) from its published shapes alone
(tests/configs/nemotron3-super/config.json, sources in the README beside
it), on one B200 in BF16 at 128K context, through `autocompress estimate`.

- The parameter count is the sum of the layer shapes written out here by
  hand (embedding and head, 40 Mamba-2, 8 attention, 40 LatentMoE layers),
  within 2 % of the published 120B (and 0.5 % of the paper's 120.6B); the
  active count (22 of 512 experts) is within 2 % of the paper's 12.7B. The
  MTP layer is not counted: the loader drops it (docs/hybrid.md), and the
  published total leaves it out too; the answer's "mtp" names it (one layer,
  "*E") with its parameters, summed here by hand.
- The KV cache is that of the 8 attention layers (2 KV heads x 128), the
  Mamba state that of the 40 Mamba layers in fp32, both summed here by hand;
  weights + state + KV alone exceed the B200's memory (180 GB).
- The config-only search under the paper's budget (74e9 parameters) and
  the B200's memory at 128K returns structures that fit; each re-priced as
  an explicit architecture through the plain estimate gives the figures
  the search printed and meets both limits; the axes it cut are named.
- Nemotron 3 Nano 30B-A3B's shapes (tests/configs/nemotron3-nano) sum to
  its published 31.6B within 0.5 %.
- The MTP blocks read from mtp_layers_block_type price as from the pattern,
  two MTP layers twice one, an unknown block leaves the size out, and a
  config without MTP layers gets no "mtp".
"""
import json
import os
import shutil
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from harness import BUILD, ROOT, Runner, cli_estimate, fit_architecture  # noqa: E402

CLI = os.path.join(BUILD, "autocompress")
SUPER = os.path.join(ROOT, "tests", "configs", "nemotron3-super")
TYPES = {"M": "mamba", "*": "attention", "-": "mlp", "E": "moe"}
GIB = 2.0 ** 30
B200_GIB = 180e9 / GIB  # the B200 profile's 180 GB (src/cost/device.c)


def target(prompt=131071, batch=1):
    return {"device": "B200", "workload": {"batch": batch, "prompt_len": prompt, "gen_len": 1}}


def by_hand(c):
    """Total and active parameters from the config's shapes (Hugging Face's NemotronH tensors)."""
    H, V = c["hidden_size"], c["vocab_size"]
    nh, P, N, G, K = c["mamba_num_heads"], c["mamba_head_dim"], c["ssm_state_size"], c["n_groups"], c["conv_kernel"]
    di, conv = nh * P, nh * P + 2 * G * N
    # in_proj, conv (+ bias), A D dt_bias, gated norm, out_proj, the layer's norm
    mamba = H * (2 * di + 2 * G * N + nh) + conv * K + conv + 3 * nh + di + di * H + H
    q, kv = c["num_attention_heads"] * c["head_dim"], c["num_key_value_heads"] * c["head_dim"]
    attn = 2 * H * q + 2 * H * kv + H
    E, k, Fe, Fs, Lt = (c["n_routed_experts"], c["num_experts_per_tok"], c["moe_intermediate_size"],
                        c["moe_shared_expert_intermediate_size"], c["moe_latent_size"])
    expert = 2 * Lt * Fe
    # router (+ correction bias), shared expert, latent projections, the layer's norm
    common = E * H + E + 2 * H * Fs + 2 * H * Lt + H
    pat = c["hybrid_override_pattern"]
    n = {t: pat.count(ch) for ch, t in TYPES.items()}
    fixed = 2 * V * H + H + n["mamba"] * mamba + n["attention"] * attn
    return fixed + n["moe"] * (common + E * expert), fixed + n["moe"] * (common + k * expert)


def attn_mamba_embed(c):
    """by_hand's total without the MoE layers: the same config with no experts, shared expert or latent."""
    z = dict(c, n_routed_experts=0, num_experts_per_tok=0, moe_shared_expert_intermediate_size=0, moe_latent_size=0)
    return by_hand(z)[0] - 40 * z["hidden_size"]  # less the MoE layers' norms


def test_full_model_does_not_fit_one_b200():
    if not os.path.exists(CLI):
        return "skip: build/autocompress missing (make all)"
    c = json.load(open(os.path.join(SUPER, "config.json")))
    total, active = by_hand(c)
    ans = cli_estimate({"model": SUPER, "target": target()})
    f = ans["figures"]
    assert f["params"] == total, (f["params"], total)
    assert abs(total / 120e9 - 1) < 0.02 and abs(total / 120.6e9 - 1) < 0.005, total
    assert abs(active / 12.7e9 - 1) < 0.02, active
    types = [x.get("type") for x in ans["architecture"]["layers"]]
    assert (types.count("mamba"), types.count("attention"), types.count("moe")) == (40, 8, 40), types
    assert abs(f["weights_gib"] - total * 2 / GIB) < 1e-6, f["weights_gib"]
    kv = 8 * 2 * 2 * 128 * 2 * 131072 / GIB  # 8 attention layers, K and V of 2 heads x 128, bf16, 128K tokens
    state = 40 * ((128 * 64 + 2 * 8 * 128) * 3 + 128 * 64 * 128) * 4 / GIB  # 40 Mamba layers: conv window + state, fp32
    assert abs(f["kv_cache_gib"] - kv) < 1e-9, (f["kv_cache_gib"], kv)
    assert abs(f["ssm_state_gib"] - state) < 1e-9, (f["ssm_state_gib"], state)
    assert abs(f["device_memory_gib"] - B200_GIB) < 1e-9, f["device_memory_gib"]
    # the MTP layer ("*E": an attention and a LatentMoE block, the [embedding; hidden] projection and 3 norms)
    # is named apart and left out of the figures
    H = c["hidden_size"]
    moe = (total - attn_mamba_embed(c)) / 40
    mtp = (2 * H * 32 * 128 + 2 * H * 2 * 128 + H) + moe + 2 * H * H + 3 * H
    m = ans["mtp"]
    assert m["layers"] == 1 and m["pattern"] == "*E" and m["counted"] is False, m
    assert abs(m["params"] - mtp) < 0.5 and abs(m["weights_gib"] - mtp * 2 / GIB) < 1e-9, (m, mtp)
    held = f["weights_gib"] + f["kv_cache_gib"] + f["ssm_state_gib"]
    assert held > B200_GIB and f["memory_gib"] > held and not f["served"], (held, f["memory_gib"], f["served"])
    print(f"   Nemotron 3 Super: {total / 1e9:.2f}B parameters ({active / 1e9:.2f}B active); at 128K on one B200: "
          f"weights {f['weights_gib']:.1f} + KV {f['kv_cache_gib']:.2f} + state {f['ssm_state_gib']:.3f} = "
          f"{held:.1f} GiB ({f['memory_gib']:.1f} with activations) against {B200_GIB:.1f}; the MTP layer, not "
          f"counted: {m['params'] / 1e9:.2f}B, {m['weights_gib']:.2f} GiB", flush=True)


def test_search_under_the_74b_budget():
    if not os.path.exists(CLI):
        return "skip: build/autocompress missing (make all)"
    c = json.load(open(os.path.join(SUPER, "config.json")))
    limits = {"max_params": 74e9, "max_memory_gib": B200_GIB}
    f = cli_estimate({"model": SUPER, "target": target(), "constraints": limits})["fits"]
    assert f["feasible"] and f["grid_feasible"] > 0 and f["structures"], {k: f[k] for k in ("feasible", "grid_size")}
    base = {"hidden_size": c["hidden_size"], "num_attention_heads": c["num_attention_heads"],
            "mamba_num_heads": c["mamba_num_heads"], "mamba_head_dim": c["mamba_head_dim"],
            "num_moe_experts": c["n_routed_experts"], "moe_ffn_hidden_size": c["moe_intermediate_size"]}
    for s in f["structures"]:
        assert s["mamba_num_heads"] % c["n_groups"] == 0 and s["num_moe_experts"] >= c["num_experts_per_tok"], s
        for k, v in base.items():
            assert abs(s["removed_fraction"][k] - (1 - s[k] / v)) < 1e-12, (k, s)
        cut = [k for k, v in s["removed_fraction"].items() if v > 0]
        assert cut, s  # 120.7B to under 74B cuts something
        arch = fit_architecture(c["hybrid_override_pattern"], s)
        j = cli_estimate({"model": SUPER, "architecture": arch, "target": target()})["figures"]
        assert j["params"] <= 74e9 and j["memory_gib"] <= B200_GIB * (1 + 1e-12), (j["params"], j["memory_gib"])
        assert abs(j["params"] - s["params"]) < 0.5, (j["params"], s["params"])
        assert abs(j["memory_gib"] - s["predicted"]["memory_gib"]) <= 1e-9 * j["memory_gib"], \
            (j["memory_gib"], s["predicted"]["memory_gib"])
    best = f["structures"][0]
    cut = {k: round(v, 3) for k, v in best["removed_fraction"].items() if v > 0}
    print(f"   74e9 and {B200_GIB:.1f} GiB at 128K: {f['grid_feasible']} of {f['grid_size']} structures fit; closest: "
          f"{best['params'] / 1e9:.2f}B, {best['predicted']['memory_gib']:.2f} GiB; cut {cut}", flush=True)
    # the budget alone: the structures closest to 74e9 parameters, and what they hold at 128K
    p = cli_estimate({"model": SUPER, "target": target(), "constraints": {"max_params": 74e9}})["fits"]
    b = p["structures"][0]["predicted"]
    assert p["feasible"] and 73e9 < b["params"] <= 74e9, b["params"]
    held = b["weights_gib"] + b["kv_cache_gib"] + b["ssm_state_gib"]
    assert held < B200_GIB, held  # weights, KV and state of the 74B budget fit the B200
    print(f"   74e9 alone: closest {b['params'] / 1e9:.2f}B holds {held:.1f} GiB (weights {b['weights_gib']:.1f}); "
          f"memory_gib {b['memory_gib']:.1f} with the 128K prompt's activations {b['activations_gib']:.1f}", flush=True)


def test_chunked_prefill_activations():
    """memory_gib's activations: without an engine named, the whole 128K prompt's in one step; with one named
    that chunks prompts (vLLM, SGLang, llama.cpp), one step of its token budget (vLLM 8192 here: 180 GB and
    not an A100, a served budget); TensorRT-LLM (chunked prefill off) as without. The search under both
    limits then predicts what the named engine holds, equal to the re-priced structure's memory_gib."""
    if not os.path.exists(CLI):
        return "skip: build/autocompress missing (make all)"
    c = json.load(open(os.path.join(SUPER, "config.json")))
    # per token: the hidden state and the widest step value, the MoE layer's router logits and its
    # 22 experts' gate and up intermediates; bf16; plus one sequence's fp32 logits
    per_tok = (c["hidden_size"] + c["n_routed_experts"] + 2 * c["num_experts_per_tok"] * c["moe_intermediate_size"]) * 2
    logits = c["vocab_size"] * 4
    P = 131071

    def fig(engine):
        t = target()
        if engine:
            t["engine"] = {"name": engine}
        return cli_estimate({"model": SUPER, "target": t})["figures"]

    base = fig(None)
    assert abs(base["activations_gib"] - (P * per_tok + logits) / GIB) < 1e-9, base["activations_gib"]
    named = {}
    for engine, tokens in (("vllm", 8192), ("sglang", 8192), ("llamacpp", 2048), ("trtllm", P)):
        f = named[engine] = fig(engine)
        assert abs(f["activations_gib"] - (tokens * per_tok + logits) / GIB) < 1e-9, (engine, f["activations_gib"])
        held = f["weights_gib"] + f["kv_cache_gib"] + f["ssm_state_gib"] + f["activations_gib"]
        assert f["memory_gib"] > held, (engine, f["memory_gib"], held)  # plus the engine's runtime
    t = dict(target(), engine={"name": "vllm"})
    limits = {"max_params": 74e9, "max_memory_gib": B200_GIB}
    fits = cli_estimate({"model": SUPER, "target": t, "constraints": limits})["fits"]
    best = fits["structures"][0]
    j = cli_estimate({"model": SUPER, "architecture": fit_architecture(c["hybrid_override_pattern"], best),
                      "target": t})["figures"]
    assert abs(j["memory_gib"] - best["predicted"]["memory_gib"]) <= 1e-9 * j["memory_gib"], \
        (j["memory_gib"], best["predicted"]["memory_gib"])
    # a step's activations (1.9 GiB) leave the 74e9 budget binding, not the memory
    assert 73e9 < best["params"] <= 74e9 and j["memory_gib"] < B200_GIB, (best["params"], j["memory_gib"])
    print(f"   activations at 128K: {base['activations_gib']:.2f} GiB in one step, "
          f"{named['vllm']['activations_gib']:.2f} GiB in vLLM's 8192-token step; under both limits with vLLM named "
          f"the closest is {best['params'] / 1e9:.2f}B at {j['memory_gib']:.1f} GiB", flush=True)


def test_mtp_block_types():
    """mtp_layers_block_type names the MTP blocks as the pattern does; an unknown block leaves its size unknown;
    a config without MTP layers gets no "mtp"."""
    if not os.path.exists(CLI):
        return "skip: build/autocompress missing (make all)"
    c = json.load(open(os.path.join(SUPER, "config.json")))
    d = tempfile.mkdtemp(prefix="ac-super-")
    try:
        ref = cli_estimate({"model": SUPER, "target": target(8192)})["mtp"]
        answers = []
        for mtp in ({"mtp_layers_block_type": ["attention", "moe"]}, {"mtp_hybrid_override_pattern": "*X"},
                    {"num_nextn_predict_layers": 2, "mtp_hybrid_override_pattern": "*E"}):
            cfg = {k: v for k, v in c.items() if not k.startswith("mtp_") and k != "num_nextn_predict_layers"}
            cfg.update(mtp)
            with open(os.path.join(d, "config.json"), "w") as f:
                json.dump(cfg, f)
            answers.append(cli_estimate({"model": d, "target": target(8192)})["mtp"])
        a, b, two = answers
        assert a == ref, (a, ref)
        assert b["layers"] == 1 and "params" not in b and b["counted"] is False, b
        assert two["layers"] == 2 and abs(two["params"] - 2 * ref["params"]) < 1, (two, ref)
        nano = cli_estimate({"model": os.path.join(ROOT, "tests", "configs", "nemotron3-nano"), "target": target(8192)})
        assert "mtp" not in nano, nano.keys()
    finally:
        shutil.rmtree(d)


def test_nano_cross_check():
    """The same family's Nano 30B-A3B (plain MoE, no latent) sums to its published 31.6B."""
    if not os.path.exists(CLI):
        return "skip: build/autocompress missing (make all)"
    nano = os.path.join(ROOT, "tests", "configs", "nemotron3-nano")
    f = cli_estimate({"model": nano, "target": target()})["figures"]
    assert abs(f["params"] / 31.6e9 - 1) < 0.005, f["params"]
    print(f"   Nemotron 3 Nano: {f['params'] / 1e9:.2f}B parameters", flush=True)


if __name__ == "__main__":
    r = Runner()
    r.run(test_nano_cross_check)
    r.run(test_mtp_block_types)
    r.run(test_full_model_does_not_fit_one_b200)
    r.run(test_search_under_the_74b_budget)
    r.run(test_chunked_prefill_activations)
    r.done()
