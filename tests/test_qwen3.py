"""Qwen3 (QK-norm) end to end: load, evaluate, compress, export.

A Qwen3 checkpoint is made from the trained tiny model (its weights, its
tokenizer, plus per-head q_norm / k_norm weights; config.json as Hugging Face
writes a Qwen3ForCausalLM). Its perplexity under an independent float64
PyTorch forward of the Hugging Face Qwen3 semantics (tests/ref_llama.py) must
equal our engine's; a whole compression job must export a Qwen3 checkpoint
(safetensors + config.json, and GGUF with search.gguf) whose reference
perplexity is what the report says; and the targets that cannot hold
QK-norm (deci, heterogeneous gguf) are refused with a 400 naming the field.
"""
import json
import os
import shutil
import subprocess
import sys
import tempfile

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import ref_llama as R  # noqa: E402
import harness as H  # noqa: E402
from harness import BUILD, TINY, Daemon, Runner, spec  # noqa: E402

CLI = os.path.join(BUILD, "autocompress")
TEXT = os.path.join(BUILD, "fixtures", "heldout_small.txt")
CTX, WINDOWS = 64, 4
WORK = tempfile.mkdtemp(prefix="ac_qwen3_")
QWEN3 = os.path.join(WORK, "qwen3")


def have_model():
    return os.path.exists(os.path.join(TINY, "config.json")) and os.path.exists(TEXT)


def make_qwen3():
    """The tiny model as a Qwen3: same weights, q_norm/k_norm added (BF16, as checkpoints ship)."""
    if os.path.exists(os.path.join(QWEN3, "config.json")):
        return
    os.makedirs(QWEN3, exist_ok=True)
    cfg = json.load(open(os.path.join(TINY, "config.json")))
    cfg.update(architectures=["Qwen3ForCausalLM"], model_type="qwen3", use_sliding_window=False, sliding_window=None,
               max_window_layers=cfg["num_hidden_layers"], attention_bias=False)
    W = R.load_safetensors(os.path.join(TINY, "model.safetensors"))
    hd, g = cfg["head_dim"], torch.Generator().manual_seed(7)
    for l in range(cfg["num_hidden_layers"]):
        for n in ("q_norm", "k_norm"):
            W[f"model.layers.{l}.self_attn.{n}.weight"] = 1 + 0.2 * torch.randn(hd, generator=g)
    R.save_safetensors(os.path.join(QWEN3, "model.safetensors"), {k: v.to(torch.bfloat16) for k, v in W.items()},
                       {"format": "pt"})
    with open(os.path.join(QWEN3, "config.json"), "w") as f:
        json.dump(cfg, f, indent=1)
    shutil.copy(os.path.join(TINY, "tokenizer.json"), QWEN3)


def engine_ppl(d):
    return H.engine_ppl(d, TEXT, CTX, WINDOWS)


def ref_ppl(d):
    return H.ref_ppl(d, TEXT, CTX, WINDOWS)


def test_engine_matches_reference():
    if not have_model():
        return "skip: no tiny model or fixtures/heldout_small.txt (make tiny-model fixtures)"
    make_qwen3()
    pr, pe = ref_ppl(QWEN3), engine_ppl(QWEN3)
    print(f"   qwen3 checkpoint: reference ppl {pr:.5f}, our engine {pe:.5f}")
    assert abs(pr / pe - 1) < 2e-4, (pr, pe)
    # the QK-norm matters: the same weights as a Llama score otherwise
    assert abs(engine_ppl(TINY) / pe - 1) > 1e-3


def test_job_exports_qwen3():
    """A job with the uniform (llama) target on a Qwen3 model: the result is a
    Qwen3ForCausalLM checkpoint (q_norm/k_norm kept) and a qwen3 GGUF."""
    if not have_model():
        return "skip: no tiny model or fixtures/heldout_small.txt (make tiny-model fixtures)"
    make_qwen3()
    out = os.path.join(WORK, "job_out")
    s = spec(model=QWEN3, output=out, constraints={"max_params": 0.75e6},
             search={"steps": 40, "seed": 1, "export_target": "llama", "gguf": True, "dnas_steps": 20},
             target={"device": "H100", "workload": {"batch": 1, "prompt_len": 64, "gen_len": 16}})
    # a GPU profile: a CPU target would measure this CPU's cost table first (about 20 s; test_daemon and
    # test_deci_export measure theirs), and the export is what this test is about
    sp = os.path.join(WORK, "job.json")
    with open(sp, "w") as f:
        json.dump(s, f)
    env = dict(os.environ, AC_COST_DB=os.path.join(WORK, "cost.db"))
    r = subprocess.run([CLI, "compress", sp], capture_output=True, text=True, env=env, timeout=900)
    assert r.returncode == 0, r.stderr[-2000:]
    rep = json.load(open(os.path.join(out, "report.json")))
    res = rep[rep["chosen"]]
    assert res["feasible"] and res["predicted"]["params"] <= 0.75e6, res["predicted"]
    cfg = json.load(open(os.path.join(out, "config.json")))
    assert cfg["architectures"] == ["Qwen3ForCausalLM"] and cfg["model_type"] == "qwen3", cfg
    L = res["architecture"]["layers"]
    assert cfg["intermediate_size"] == L[0]["ffn"] and cfg["num_key_value_heads"] == L[0]["kv_heads"], (cfg, L)
    W = {}
    for f in os.listdir(out):
        if f.endswith(".safetensors"):
            W.update(R.load_safetensors(os.path.join(out, f)))
    assert all(f"model.layers.{l}.self_attn.{n}.weight" in W for l in range(cfg["num_hidden_layers"])
               for n in ("q_norm", "k_norm")), "q_norm/k_norm missing from the export"
    pr, pe = ref_ppl(out), engine_ppl(out)
    print(f"   exported qwen3 ({res['predicted']['params']:.0f} params): reference ppl {pr:.4f}, engine {pe:.4f}")
    assert abs(pr / pe - 1) < 2e-4, (pr, pe)
    assert rep["export"]["gguf"]["architecture"] == "qwen3", rep["export"]
    gg = os.path.join(out, "model.gguf")
    with open(gg, "rb") as f:
        head = f.read()
    assert head[:4] == b"GGUF" and b"qwen3.attention.head_count" in head and b"blk.0.attn_q_norm.weight" in head
    pg = engine_ppl(gg)  # read back by our GGUF reader (llama.cpp runs qwen3 GGUFs in test_gguf)
    print(f"   its GGUF (BF16): ppl {pg:.4f}")
    assert abs(pg / pe - 1) < 5e-3, (pg, pe)


def test_refuses_targets_without_qk_norm():
    if not have_model() or not os.path.exists(os.path.join(BUILD, "autocompressd")):
        return "skip: no tiny model, heldout_small.txt or build/autocompressd (make all tiny-model fixtures)"
    make_qwen3()
    d = Daemon(config={"cpu_slots": 1, "model_roots": [os.path.dirname(os.path.dirname(TINY)), "/tmp"]}).start()
    try:
        for target in ("deci", "gguf"):
            st, j = d.req("POST", "/v1/jobs", spec(model=QWEN3, search={"export_target": target}))
            assert st == 400 and j["error"]["field"] == "search.export_target", (target, st, j)
            assert "QK-norm" in j["error"]["message"], j
        st, j = d.req("POST", "/v1/jobs", spec(model=QWEN3, search={"export_target": "llama", "gguf": True}))
        assert st == 201, j
        d.req("DELETE", f"/v1/jobs/{j['id']}")
    finally:
        d.cleanup()


if __name__ == "__main__":
    r = Runner()
    try:
        for t in (test_engine_matches_reference, test_job_exports_qwen3, test_refuses_targets_without_qk_norm):
            r.run(t)
    finally:
        shutil.rmtree(WORK, ignore_errors=True)
    r.done()
