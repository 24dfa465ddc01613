"""The `deci` export target against the loaders that read it.

vLLM's nemotron_nas rules are re-created here from reading its code
(vllm/model_executor/models/nemotron_nas.py, and LlamaAttention / LlamaMLP it
builds on), not from ours:
- FFN width = _find_multiple(int(2 * ffn_mult * hidden_size / 3), 256) when the
  block's ffn has ffn_mult (intermediate_size is never read then);
- KV heads = num_attention_heads // attention.n_heads_in_group, query heads
  global, head_dim = config.head_dim (else hidden_size // heads);
- a no_op attention has no input_layernorm / self_attn parameters, a no_op FFN
  no post_attention_layernorm / mlp; AutoWeightsLoader rejects any checkpoint
  tensor without a parameter, and leaves parameters without a tensor unset;
- the forward fuses the residual add into the next RMSNorm, starting with no
  residual: an FFN before any attention unpacks a single tensor and fails.
config.json is parsed by the configuration module the export ships (through
its auto_map), imported with a minimal stand-in for transformers.PretrainedConfig
(Transformers itself is not installable here).

Every export is checked tensor by tensor against those rules, and its
perplexity under a PyTorch forward written with vLLM's semantics (float64)
is compared with our engine's. Off-grid widths are zero-padded: the padded
export must score exactly what the unpadded one does.
"""
import copy
import importlib.util
import json
import math
import os
import shutil
import subprocess
import sys
import tempfile
import types

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import ref_llama as R  # noqa: E402
from harness import BUILD, DATA, THREADS, TINY, Daemon, Runner, spec  # noqa: E402

CLI = os.path.join(BUILD, "autocompress")
FIX = os.path.join(BUILD, "fixtures")
TEXT = os.path.join(FIX, "heldout_small.txt")
CTX, WINDOWS = 64, 4
WORK = tempfile.mkdtemp(prefix="ac_deci_")


# ------------------------------------------------------------ Transformers stand-in
class PretrainedConfig:
    """The part of transformers.PretrainedConfig a remote config relies on:
    keyword arguments become attributes, to_dict deep-copies them."""
    model_type = ""

    def __init__(self, **kwargs):
        self.tie_word_embeddings = kwargs.pop("tie_word_embeddings", True)
        for k in ("bos_token_id", "eos_token_id", "pad_token_id", "architectures", "torch_dtype"):
            setattr(self, k, kwargs.pop(k, None))
        for k, v in kwargs.items():
            setattr(self, k, v)

    @classmethod
    def from_dict(cls, d):  # what from_pretrained does with config.json
        return cls(**d)

    def to_dict(self):
        d = copy.deepcopy(self.__dict__)
        d["model_type"] = self.model_type
        return d


def load_config(d):
    """AutoConfig.from_pretrained(d, trust_remote_code=True), by hand."""
    raw = json.load(open(os.path.join(d, "config.json")))
    mod_name, cls_name = raw["auto_map"]["AutoConfig"].split(".")
    stub = types.ModuleType("transformers")
    stub.PretrainedConfig = PretrainedConfig
    sys.modules["transformers"] = stub
    sp = importlib.util.spec_from_file_location(mod_name + str(id(raw)), os.path.join(d, mod_name + ".py"))
    mod = importlib.util.module_from_spec(sp)
    sp.loader.exec_module(mod)
    cls = getattr(mod, cls_name)
    assert cls.model_type == raw["model_type"] == "nemotron-nas", cls.model_type
    return cls.from_dict(raw), raw


# ------------------------------------------------------------ vLLM's rules
def find_multiple(n, k):
    return n if n % k == 0 else n + k - (n % k)


def vllm_ffn(ffn, hidden):
    if hasattr(ffn, "ffn_mult") and ffn.ffn_mult is not None:
        return find_multiple(int(2 * ffn.ffn_mult * hidden / 3), 256)
    return ffn.intermediate_size


def vllm_params(cfg):
    """name -> shape of every parameter vLLM's DeciLMForCausalLM creates
    (q/k/v and gate/up listed as the checkpoint names it stacks)."""
    H, V, nh = cfg.hidden_size, cfg.vocab_size, cfg.num_attention_heads
    hd = getattr(cfg, "head_dim", None) or H // nh
    qkv_bias = getattr(cfg, "qkv_bias", getattr(cfg, "attention_bias", False))
    o_bias = getattr(cfg, "attention_bias", False)
    p = {"model.embed_tokens.weight": [V, H], "model.norm.weight": [H]}
    if not cfg.tie_word_embeddings:
        p["lm_head.weight"] = [V, H]
    for l, b in enumerate(cfg.block_configs):
        pre = f"model.layers.{l}."
        if not b.attention.no_op:
            assert not b.attention.replace_with_linear
            g = b.attention.n_heads_in_group
            assert nh % g == 0, f"layer {l}: {nh} heads, n_heads_in_group {g}"
            kv = nh // g
            p[pre + "input_layernorm.weight"] = [H]
            p[pre + "self_attn.q_proj.weight"] = [nh * hd, H]
            p[pre + "self_attn.k_proj.weight"] = [kv * hd, H]
            p[pre + "self_attn.v_proj.weight"] = [kv * hd, H]
            p[pre + "self_attn.o_proj.weight"] = [H, nh * hd]
            if qkv_bias:
                for n, k in (("q", nh), ("k", kv), ("v", kv)):
                    p[pre + f"self_attn.{n}_proj.bias"] = [k * hd]
            if o_bias:
                p[pre + "self_attn.o_proj.bias"] = [H]
        if not b.ffn.no_op:
            assert not b.ffn.replace_with_linear
            I = vllm_ffn(b.ffn, H)
            p[pre + "post_attention_layernorm.weight"] = [H]
            p[pre + "mlp.gate_proj.weight"] = [I, H]
            p[pre + "mlp.up_proj.weight"] = [I, H]
            p[pre + "mlp.down_proj.weight"] = [H, I]
    return p


def checkpoint_shapes(d):
    files = [f for f in os.listdir(d) if f.endswith(".safetensors")]
    out = {}
    for f in files:
        with open(os.path.join(d, f), "rb") as fh:
            n = int.from_bytes(fh.read(8), "little")
            hdr = json.loads(fh.read(n))
        for k, v in hdr.items():
            if k != "__metadata__":
                assert k not in out, k
                out[k] = v["shape"]
    return out


def rms(x, w, eps, residual=None):
    """vLLM's RMSNorm: with a residual, add it first and return both."""
    if residual is not None:
        x = x + residual
        residual = x
    y = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * w
    return y if residual is None else (y, residual)


def vllm_forward(cfg, W, tokens):
    """DeciModel.forward's order of operations, float64, one sequence."""
    H, nh = cfg.hidden_size, cfg.num_attention_heads
    hd = getattr(cfg, "head_dim", None) or H // nh
    eps, T = cfg.rms_norm_eps, len(tokens)
    inv = 1.0 / (cfg.rope_theta ** (torch.arange(0, hd, 2, dtype=torch.float64) / hd))
    fr = torch.outer(torch.arange(T, dtype=torch.float64), inv)
    cos, sin = torch.cat((fr, fr), -1).cos(), torch.cat((fr, fr), -1).sin()
    mask = torch.full((T, T), float("-inf"), dtype=torch.float64).triu(1)
    h, residual = W["model.embed_tokens.weight"][tokens], None
    for l, b in enumerate(cfg.block_configs):
        pre = f"model.layers.{l}."
        if not b.attention.no_op:
            if residual is None:
                residual, h = h, rms(h, W[pre + "input_layernorm.weight"], eps)
            else:
                h, residual = rms(h, W[pre + "input_layernorm.weight"], eps, residual)
            kv = nh // b.attention.n_heads_in_group
            q = (h @ W[pre + "self_attn.q_proj.weight"].T).view(T, nh, hd).transpose(0, 1)
            k = (h @ W[pre + "self_attn.k_proj.weight"].T).view(T, kv, hd).transpose(0, 1)
            v = (h @ W[pre + "self_attn.v_proj.weight"].T).view(T, kv, hd).transpose(0, 1)
            q, k = q * cos + R.rotate_half(q) * sin, k * cos + R.rotate_half(k) * sin  # neox style
            k, v = k.repeat_interleave(nh // kv, 0), v.repeat_interleave(nh // kv, 0)
            a = torch.softmax(q @ k.transpose(-1, -2) / math.sqrt(hd) + mask, -1) @ v
            h = a.transpose(0, 1).reshape(T, nh * hd) @ W[pre + "self_attn.o_proj.weight"].T
        if not b.ffn.no_op:
            out = rms(h, W[pre + "post_attention_layernorm.weight"], eps, residual)
            assert isinstance(out, tuple), f"layer {l}: vLLM unpacks one tensor here (FFN before any attention)"
            h, residual = out
            g, u = h @ W[pre + "mlp.gate_proj.weight"].T, h @ W[pre + "mlp.up_proj.weight"].T
            h = (torch.nn.functional.silu(g) * u) @ W[pre + "mlp.down_proj.weight"].T
    h, _ = rms(h, W["model.norm.weight"], eps, residual)
    head = W["model.embed_tokens.weight"] if cfg.tie_word_embeddings else W["lm_head.weight"]
    return h @ head.T


def token_ids(model_dir):
    out = subprocess.run([CLI, "tokenize", os.path.join(model_dir, "tokenizer.json"), TEXT], capture_output=True,
                         text=True, check=True).stdout
    return [int(x) for x in out.split()]


def vllm_ppl(cfg, d, ids):
    """Our engine's protocol: non-overlapping windows, every target scored."""
    W = {k: v.double() for k, v in R.load_safetensors(os.path.join(d, "model.safetensors")).items()}
    nll, cnt = 0.0, 0
    for w in range(WINDOWS):
        x = ids[w * CTX:(w + 1) * CTX]
        with torch.no_grad():
            lp = torch.log_softmax(vllm_forward(cfg, W, torch.tensor(x)), -1)
        for t in range(CTX - 1):
            nll -= lp[t, x[t + 1]].item()
            cnt += 1
    return math.exp(nll / cnt)


def engine_ppl(d):
    # --gemm exact: fp32 GEMMs (a BF16 checkpoint's prefill otherwise runs on AMX with BF16 activations)
    out = subprocess.run([CLI, "eval", d, TEXT, "--ctx", str(CTX), "--windows", str(WINDOWS), "--gemm", "exact", "--json"],
                         capture_output=True, text=True, check=True).stdout
    return json.loads(out)["ppl"]


def check_export(d, ids=None):
    """Every tensor of d against vLLM's rules; returns the parsed config."""
    cfg, raw = load_config(d)
    assert raw["architectures"] == ["DeciLMForCausalLM"]
    assert "intermediate_size" not in raw and "num_key_value_heads" not in raw, "deci configs keep these per layer"
    assert raw["head_dim"] == cfg.head_dim
    for b in cfg.block_configs:  # the attributes vLLM / TRT-LLM read exist on every entry
        for sub, keys in ((b.attention, ("no_op", "replace_with_linear", "n_heads_in_group")),
                          (b.ffn, ("no_op", "replace_with_linear", "ffn_mult"))):
            for k in keys:
                assert hasattr(sub, k), k
    json.dumps(cfg.to_dict())  # serialisable again (save_pretrained)
    want, have = vllm_params(cfg), checkpoint_shapes(d)
    assert set(have) == set(want), \
        f"missing {sorted(set(want) - set(have))}, unexpected {sorted(set(have) - set(want))}"
    for k, s in want.items():
        assert have[k] == s, f"{k}: checkpoint {have[k]}, vLLM builds {s}"
    if ids is not None:
        pv, pe = vllm_ppl(cfg, d, ids), engine_ppl(d)
        print(f"   {os.path.basename(d)}: ppl under vLLM's rules {pv:.5f}, our engine {pe:.5f}")
        assert abs(pv / pe - 1) < 2e-4, (pv, pe)
    return cfg


def prune(name, arch, deci=True):
    a = os.path.join(WORK, name + ".json")
    with open(a, "w") as f:
        json.dump(arch, f)
    out = os.path.join(WORK, name + ("" if deci else "_plain"))
    r = subprocess.run([CLI, "prune", TINY, a, out] + (["--deci"] if deci else []), capture_output=True, text=True)
    return out, r


def L(h, kv, f):
    return {"heads": h, "kv_heads": kv, "ffn": f}


# Heterogeneous architectures of the tiny model (8 heads, 4 KV heads, FFN 384, hidden 128).
ARCHS = {
    # off-grid FFN widths (384 = base, 200, 100), KV merged to 2 and 1, no_op attention, no_op FFN
    "mixed": {"hidden": 128,
              "layers": [L(8, 4, 384), L(8, 2, 200), L(0, 0, 384), L(8, 1, 100), L(8, 4, 0), L(8, 2, 256)]},
    # hidden pruned to 96 (hidden != heads * head_dim), an empty layer, attention-only first layer
    "narrow": {"hidden": 96, "layers": [L(8, 4, 0), L(0, 0, 0), L(0, 0, 256), L(8, 2, 384), L(8, 1, 300), L(8, 4, 50)]},
    # every sub-block kept at full width (384 padded to 512), only the KV heads vary
    "kv_only": {"hidden": 128,
                "layers": [L(8, 4, 384), L(8, 2, 384), L(8, 1, 384), L(8, 4, 384), L(8, 2, 384), L(8, 4, 384)]},
}


def have_model():
    return os.path.exists(os.path.join(TINY, "config.json")) and os.path.exists(TEXT)


def test_exports_match_vllm_rules():
    if not have_model():
        return "skip: no tiny model or fixtures/heldout_small.txt (make tiny-model fixtures)"
    ids = token_ids(TINY)
    assert len(ids) >= CTX * WINDOWS
    for name, arch in ARCHS.items():
        d, r = prune(name, arch)
        assert r.returncode == 0, r.stderr
        cfg = check_export(d, ids)
        for l, (want, b) in enumerate(zip(arch["layers"], cfg.block_configs)):
            assert b.attention.no_op == (want["heads"] == 0)
            if want["heads"]:
                assert cfg.num_attention_heads // b.attention.n_heads_in_group == want["kv_heads"]
            assert b.ffn.no_op == (want["ffn"] == 0)
            if want["ffn"]:  # padded up to the grid the loaders compute
                assert vllm_ffn(b.ffn, arch["hidden"]) == find_multiple(want["ffn"], 256), (name, l)


def test_zero_padding_is_exact():
    """The padded export scores what the unpadded one (our own loader's
    form) does; the padding is zeros and the kept part is bit-identical."""
    if not have_model():
        return "skip: no tiny model or fixtures/heldout_small.txt (make tiny-model fixtures)"
    for name in ("mixed", "narrow"):
        d, r = prune(name, ARCHS[name])
        assert r.returncode == 0, r.stderr
        p, r = prune(name, ARCHS[name], deci=False)
        assert r.returncode == 0, r.stderr
        Wd = R.load_safetensors(os.path.join(d, "model.safetensors"))
        Wp = R.load_safetensors(os.path.join(p, "model.safetensors"))
        padded = 0
        for l, la in enumerate(ARCHS[name]["layers"]):
            f = la["ffn"]
            if not f:
                continue
            pre = f"model.layers.{l}.mlp."
            for n, dim in (("gate_proj", 0), ("up_proj", 0), ("down_proj", 1)):
                a, b = Wd[pre + n + ".weight"], Wp[pre + n + ".weight"]
                assert torch.equal(a.narrow(dim, 0, f), b), (l, n)
                rest = a.narrow(dim, f, a.shape[dim] - f)
                assert rest.numel() == 0 or torch.count_nonzero(rest) == 0, (l, n)
                padded += rest.numel()
        assert padded > 0
        e1, e2 = engine_ppl(d), engine_ppl(p)
        print(f"   {name}: padded {e1:.6f}, unpadded {e2:.6f}")
        assert abs(e1 / e2 - 1) < 1e-6, (e1, e2)


def test_ffn_mult_round_trips_through_json():
    """Every exported ffn_mult, as Python parses it from config.json, gives
    back the stored width under the loaders' formula (checked above through
    the shapes); here also for every width of a wide range, as our C code
    prints them (%.17g): see test_costsearch's test_deci_ffn_mult for C."""
    if not have_model():
        return "skip: no tiny model or fixtures/heldout_small.txt (make tiny-model fixtures)"
    d, r = prune("mixed", ARCHS["mixed"])
    assert r.returncode == 0, r.stderr
    raw = json.load(open(os.path.join(d, "config.json")))
    mults = [b["ffn"]["ffn_mult"] for b in raw["block_configs"] if not b["ffn"]["no_op"]]
    assert mults and all(isinstance(m, float) for m in mults)
    for m, w in zip(mults, (512, 256, 512, 256, 256)):
        assert find_multiple(int(2 * m * 128 / 3), 256) == w, (m, w)


def test_unexpressible_architecture_is_refused():
    """An FFN before any attention (vLLM cannot run it) or per-layer query
    heads: --deci refuses to write them, naming the rule."""
    if not have_model():
        return "skip: no tiny model or fixtures/heldout_small.txt (make tiny-model fixtures)"
    bad = {"hidden": 128, "layers": [L(0, 0, 384)] + [L(8, 4, 384)] * 5}
    d, r = prune("ffn_first", bad)
    assert r.returncode != 0 and "first layer" in r.stderr and "attention" in r.stderr, r.stderr
    assert not os.path.exists(os.path.join(d, "config.json"))
    bad = {"hidden": 128, "layers": [L(8, 4, 384), L(4, 2, 384)] + [L(8, 4, 384)] * 4}
    d, r = prune("per_layer_heads", bad)
    assert r.returncode != 0 and "num_attention_heads" in r.stderr, r.stderr


def test_qwen2_biases_and_tied_head():
    """q/k/v biases (no o_proj bias) and a tied head, as vLLM's DeciLM reads
    them: qkv_bias true, attention_bias false, no lm_head tensor. The
    uniform export of the same model is a Qwen2 config, not a Llama one with
    an o_proj bias it does not have."""
    q = os.path.join(FIX, "models", "qwen2_tied_f16")
    if not os.path.exists(os.path.join(q, "config.json")):
        return "skip: no fixture qwen2_tied_f16 (make fixtures)"
    a = os.path.join(WORK, "q.json")
    with open(a, "w") as f:
        json.dump({"layers": [L(4, 1, 160), L(0, 0, 100)]}, f)
    d = os.path.join(WORK, "q_deci")
    r = subprocess.run([CLI, "prune", q, a, d, "--deci"], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    cfg = check_export(d)
    assert cfg.qkv_bias is True and cfg.attention_bias is False and cfg.tie_word_embeddings is True
    assert "model.layers.0.self_attn.k_proj.bias" in vllm_params(cfg) and "lm_head.weight" not in vllm_params(cfg)
    with open(a, "w") as f:
        json.dump({"layers": [L(4, 1, 160), L(4, 1, 160)]}, f)
    u = os.path.join(WORK, "q_uniform")
    r = subprocess.run([CLI, "prune", q, a, u], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    raw = json.load(open(os.path.join(u, "config.json")))
    assert raw["architectures"] == ["Qwen2ForCausalLM"] and raw["model_type"] == "qwen2", raw
    assert not raw["attention_bias"], raw


def test_job_export_is_deci_on_the_grid():
    """A whole job with the deci target: the search's architecture (report),
    the checkpoint, and vLLM's reading of it agree, on the 256 grid."""
    if not have_model():
        return "skip: no tiny model or fixtures/heldout_small.txt (make tiny-model fixtures)"
    out = os.path.join(WORK, "job_out")
    # the target names fp16 weights: the CPU engine has no F16 kernels, so the job plans with the fp32 CPU table
    # and times base and result on fp32 copies (test_daemon's CPU jobs take the BF16 checkpoint's BF16 table)
    s = spec(output=out, constraints={"max_params": 0.8e6}, search={"steps": 60, "seed": 1},
             target={"device": "cpu", "workload": {"batch": 1, "prompt_len": 64, "gen_len": 16},
                     "engine": {"weights_dtype": "fp16"}})
    sp = os.path.join(WORK, "job.json")
    with open(sp, "w") as f:
        json.dump(s, f)
    # AC_QUIET_BUDGET_S 2: the table's and the timings' quiet re-measurement capped, as test_daemon's daemon does
    env = dict(os.environ, AC_COST_DB=os.path.join(WORK, "cost.db"), AC_QUIET_BUDGET_S="2")
    r = subprocess.run([CLI, "compress", sp], capture_output=True, text=True, env=env, timeout=600)
    assert r.returncode == 0, r.stderr[-2000:]
    bad = subprocess.run([CLI, "compress", sp], capture_output=True, text=True, timeout=60,
                         env=dict(env, AC_QUIET_BUDGET_S="forever"))
    assert bad.returncode != 0 and "AC_QUIET_BUDGET_S must be a number" in bad.stderr, bad.stderr
    for threads in ("0", "two", "257"):
        bad = subprocess.run([CLI, "compress", sp], capture_output=True, text=True, timeout=60,
                             env=dict(env, AC_THREADS=threads))
        assert bad.returncode != 0 and "AC_THREADS must be a number of threads in [1, 256]" in bad.stderr, bad.stderr
    rep = json.load(open(os.path.join(out, "report.json")))
    eng, ml = rep["target"]["engine"], rep["measured_local"]
    assert eng["weights_dtype"] == "fp16" and eng["weight_bytes"] == 2, eng
    assert "|fp32|autocompress-cpu|" in rep["target"]["cost_table"], rep["target"]["cost_table"]
    # the job ran on AC_THREADS threads (harness.py sets it in the suite's lanes; the CLI's default is 2)
    assert f"({THREADS or 2} threads)|" in rep["target"]["cost_table"], rep["target"]["cost_table"]
    assert ml["weights_dtype"] == "fp32" and ml["baseline"]["ttft_ms"] > 0 and ml[rep["chosen"]]["tpot_ms"] > 0 and "prediction_error" in ml, ml
    res = rep[rep["chosen"]]
    layers = res["architecture"]["layers"]
    assert all(la["ffn"] % 256 == 0 for la in layers), layers
    assert res["feasible"] and res["predicted"]["params"] <= 0.8e6
    if res["uniform"]:
        print("   (uniform result: exported as LlamaForCausalLM)")
        return
    cfg = check_export(out, token_ids(TINY))
    for la, b in zip(layers, cfg.block_configs):
        assert b.ffn.no_op == (la["ffn"] == 0)
        if la["ffn"]:
            assert vllm_ffn(b.ffn, cfg.hidden_size) == la["ffn"]
        if la["heads"]:
            assert la["heads"] == cfg.num_attention_heads
            assert cfg.num_attention_heads // b.attention.n_heads_in_group == la["kv_heads"]


def test_submit_refuses_what_deci_cannot_express():
    if not os.path.exists(os.path.join(BUILD, "autocompressd")) or not have_model():
        return "skip: no build/autocompressd, tiny model or fixtures (make all tiny-model fixtures)"
    mistral = os.path.join(FIX, "models", "mistral_sharded")  # sliding window
    d = Daemon().start()
    try:
        st, j = d.req("POST", "/v1/jobs", spec(search={"ffn_multiple": 32}))
        assert st == 400 and j["error"]["field"] == "search.ffn_multiple", j
        assert "256" in j["error"]["message"]
        st, j = d.req("POST", "/v1/jobs", spec(search={"ffn_multiple": 32, "export_target": "llama"}))
        assert st == 201, j
        d.req("DELETE", f"/v1/jobs/{j['id']}")
        st, j = d.req("POST", "/v1/jobs", spec(search={"ffn_multiple": 512}))
        assert st == 201, j
        d.req("DELETE", f"/v1/jobs/{j['id']}")
        if not os.path.exists(os.path.join(mistral, "config.json")):
            print("   skip: the sliding-window refusal was not checked: no fixture mistral_sharded (make fixtures)")
            return "skip"
        st, j = d.req("POST", "/v1/jobs", spec(model=mistral))
        assert st == 400 and j["error"]["field"] == "search.export_target", j
        assert "sliding window" in j["error"]["message"]
        st, j = d.req("POST", "/v1/jobs", spec(model=mistral, method="minitron"))
        assert st == 201, j
        d.req("DELETE", f"/v1/jobs/{j['id']}")
    finally:
        d.cleanup()


if __name__ == "__main__":
    r = Runner()
    try:
        for t in (test_exports_match_vllm_rules, test_zero_padding_is_exact, test_ffn_mult_round_trips_through_json,
                  test_unexpressible_architecture_is_refused, test_qwen2_biases_and_tied_head,
                  test_job_export_is_deci_on_the_grid,
                  test_submit_refuses_what_deci_cannot_express):
            r.run(t)
    finally:
        shutil.rmtree(WORK, ignore_errors=True)
    r.done()
