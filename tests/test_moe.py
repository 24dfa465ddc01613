"""Mixture-of-experts models at the daemon: what loads is told apart from
what the pipeline compresses.

The engine's MoE forward is checked against the Hugging Face semantics in
test_engine (logits of the Qwen3-MoE and Mixtral fixtures) and test_block
(routing ties); here a job on an MoE checkpoint must get a 400 that names
the field and says what is missing, over real HTTP with the daemon's SQLite
file, and nothing is queued; an estimate on one holds every expert.
"""
import json
import os
import shutil
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from harness import BUILD, TINY, Daemon, Runner, spec  # noqa: E402

FIX = os.path.join(BUILD, "fixtures", "models")
WORK = tempfile.mkdtemp(prefix="ac_moe_")


def moe_dir(name):
    """A fixture MoE checkpoint with a tokenizer beside it (as a job needs)."""
    d = os.path.join(WORK, name)
    if not os.path.exists(d):
        shutil.copytree(os.path.join(FIX, name), d)
        shutil.copy(os.path.join(TINY, "tokenizer.json"), d)
    return d


def have():
    return (os.path.exists(os.path.join(FIX, "mixtral_f32", "config.json")) and
            os.path.exists(os.path.join(TINY, "tokenizer.json")) and
            os.path.exists(os.path.join(BUILD, "autocompressd")))


def test_jobs_refused_estimates_answered():
    if not have():
        return "skip"
    d = Daemon(config={"cpu_slots": 1, "model_roots": [BUILD, "/tmp"]}).start()
    try:
        for name in ("mixtral_f32", "qwen3moe_mixed_bf16"):
            m = moe_dir(name)
            st, j = d.req("POST", "/v1/jobs", spec(model=m))
            assert st == 400 and j["error"]["field"] == "model", (name, st, j)
            assert "mixture-of-experts" in j["error"]["message"], j
            st, j = d.req("POST", "/v1/validate", spec(model=m))  # the one spec check: the same answer
            assert st == 400 and j["error"]["field"] == "model" and j["error"]["code"] == "invalid_spec", (st, j)
            # the cost model holds every expert and reads the routed ones
            st, j = d.req("POST", "/v1/estimate", {"model": m, "target": {"device": "H100"}})
            assert st == 200, (name, st, j)
            cfg = json.load(open(os.path.join(m, "config.json")))
            E = cfg.get("num_local_experts", cfg.get("num_experts"))
            arch = j["architecture"]
            assert arch["top_k"] == cfg["num_experts_per_tok"], arch
            assert any(L.get("experts") == E for L in arch["layers"]), arch
            assert abs(j["figures"]["params"] - arch["params"]) < 1, (j["figures"]["params"], arch["params"])
            # fewer experts: fewer parameters, the same per-token work at batch 1
            fewer = {"top_k": arch["top_k"], "layers": [dict(L, experts=max(arch["top_k"], L["experts"] - 1))
                                                        if L.get("experts") else L for L in arch["layers"]]}
            st, k = d.req("POST", "/v1/estimate", {"model": m, "architecture": fewer, "target": {"device": "H100"}})
            assert st == 200 and k["figures"]["params"] < j["figures"]["params"], (st, k)
        # a dense model's architecture may not name experts
        st, j = d.req("POST", "/v1/estimate", {"model": TINY, "target": {"device": "H100"}, "architecture": {
            "top_k": 1, "layers": [{"heads": 4, "kv_heads": 2, "ffn": 0, "experts": 2, "expert_ffn": 8}]}})
        assert st == 400 and j["error"]["field"] == "architecture" and "dense model" in j["error"]["message"], j
        st, j = d.req("GET", "/v1/jobs")
        assert st == 200 and j["jobs"] == [], j  # nothing queued
    finally:
        d.cleanup()


if __name__ == "__main__":
    r = Runner()
    try:
        r.run(test_jobs_refused_estimates_answered)
    finally:
        shutil.rmtree(WORK, ignore_errors=True)
    r.done()
