"""Estimates of a hybrid Mamba-2 / attention model (nemotron_h) from its
config alone, the way a user asks before downloading the weights:
`autocompress estimate` on a directory holding only Nemotron-H-8B-Base's
config.json. The parameter count is the published checkpoint's
(8,100,852,736: the sum of its tensors' shapes); at 128K context on the
B200 the KV cache is that of its 4 attention layers, summed here by hand,
an eighth of Llama-3.1-8B's (32 layers of the same 8 KV heads x 128); the
Mamba state is summed here by hand too, per sequence, and is the same at
8K and 128K; over real HTTP the daemon estimates the nemotron_h fixture
checkpoint with the state in its figures."""
import json
import os
import shutil
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from harness import BUILD, Daemon, Runner, cli_estimate  # noqa: E402

CLI = os.path.join(BUILD, "autocompress")
FIX = os.path.join(BUILD, "fixtures", "models", "nemotronh_bf16")
PATTERN = "M-M-M-M*-M-M-M-M-M*-M-M-M-M-M*-M-M-M-M-M*-M-M-M-M-M-"
NH8 = {"architectures": ["NemotronHForCausalLM"], "model_type": "nemotron_h", "vocab_size": 131072,
       "hidden_size": 4096, "num_hidden_layers": 52, "hybrid_override_pattern": PATTERN,
       "num_attention_heads": 32, "num_key_value_heads": 8, "head_dim": 128, "intermediate_size": 21504,
       "mlp_hidden_act": "relu2", "mamba_num_heads": 128, "mamba_head_dim": 64, "ssm_state_size": 128,
       "n_groups": 8, "conv_kernel": 4, "use_conv_bias": True, "use_bias": False, "mlp_bias": False,
       "attention_bias": False, "layer_norm_epsilon": 1e-5, "max_position_embeddings": 8192,
       "tie_word_embeddings": False, "torch_dtype": "bfloat16"}
GIB = 2.0 ** 30


def estimate(req):
    return cli_estimate(req, timeout=60)


def target(prompt, gen=1, batch=1):
    return {"device": "B200", "workload": {"batch": batch, "prompt_len": prompt, "gen_len": gen}}


def test_config_only_estimate_at_128k():
    d = tempfile.mkdtemp(prefix="ac-nh8-")
    try:
        with open(os.path.join(d, "config.json"), "w") as f:
            json.dump(NH8, f)
        long = estimate({"model": d, "target": target(131071)})
        short = estimate({"model": d, "target": target(8191)})
        fl, fs = long["figures"], short["figures"]
        assert fl["params"] == 8100852736, fl["params"]
        assert abs(fl["weights_gib"] - 8100852736 * 2 / GIB) < 1e-6, fl["weights_gib"]
        kv = 4 * 2 * 8 * 128 * 2 * 131072 / GIB  # 4 attention layers, K and V, bf16, 128K tokens
        assert abs(fl["kv_cache_gib"] - kv) < 1e-9, (fl["kv_cache_gib"], kv)
        state = 24 * ((8192 + 2 * 8 * 128) * 3 + 8192 * 128) * 4 / GIB  # 24 Mamba layers: conv window + state, fp32
        assert abs(fl["ssm_state_gib"] - state) < 1e-9 and fs["ssm_state_gib"] == fl["ssm_state_gib"], \
            (fl["ssm_state_gib"], fs["ssm_state_gib"], state)
        types = [x.get("type") for x in long["architecture"]["layers"]]
        assert types.count("mamba") == 24 and types.count("attention") == 4 and types.count("mlp") == 24, types
        # Llama-3.1-8B's shapes at the same context: 32 attention layers of the same KV width
        llama = estimate({"architecture": {"hidden": 4096, "head_dim": 128, "vocab": 128256,
                                           "layers": [{"heads": 32, "kv_heads": 8, "ffn": 14336}] * 32},
                          "target": target(131071)})["figures"]
        assert abs(llama["kv_cache_gib"] / fl["kv_cache_gib"] - 8) < 1e-9, (llama["kv_cache_gib"], fl["kv_cache_gib"])
        assert "ssm_state_gib" not in llama
        print(f"   Nemotron-H-8B on B200 at 128K: {fl['memory_gib']:.1f} GiB ({fl['kv_cache_gib']:.1f} KV, "
              f"{fl['ssm_state_gib']:.3f} state), TTFT {fl['ttft_ms']:.0f} ms, TPOT {fl['tpot_ms']:.2f} ms; "
              f"Llama-3.1-8B shapes: {llama['memory_gib']:.1f} GiB ({llama['kv_cache_gib']:.1f} KV), "
              f"TTFT {llama['ttft_ms']:.0f} ms", flush=True)
        # at 128K the hybrid's prefill beats the all-attention model's
        assert fl["ttft_ms"] < llama["ttft_ms"], (fl["ttft_ms"], llama["ttft_ms"])
    finally:
        shutil.rmtree(d)


def test_daemon_estimates_the_fixture():
    if not os.path.exists(os.path.join(FIX, "model.safetensors")):
        return "skip: no fixture nemotronh_bf16 (make fixtures)"
    d = Daemon(config={"cpu_slots": 1, "model_roots": [BUILD, "/tmp"]}).start()
    try:
        st, j = d.req("POST", "/v1/estimate", {"model": FIX, "target": {"device": "H100"}})
        assert st == 200, (st, j)
        f = j["figures"]
        # the fixture: 2 Mamba layers of 6 heads x 5, 2 groups of state 7, conv 4; one attention layer
        state = 2 * ((30 + 2 * 2 * 7) * 3 + 30 * 7) * 4 / GIB
        batch = j["workload"]["batch"]
        assert abs(f["ssm_state_gib"] - batch * state) < 1e-15, (f["ssm_state_gib"], batch * state)
    finally:
        d.cleanup()


if __name__ == "__main__":
    R = Runner()
    if not os.path.exists(CLI):
        print("SKIP: build/autocompress missing")
        R.skipped += 1
    else:
        R.run(test_config_only_estimate_at_128k)
        R.run(test_daemon_estimates_the_fixture)
    R.done()
