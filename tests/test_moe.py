"""Mixture-of-experts models at the daemon: what loads is told apart from
what the pipeline compresses.

The engine's MoE forward is checked against the Hugging Face semantics in
test_engine (logits of the Qwen3-MoE and Mixtral fixtures) and test_block
(routing ties); here a job or an estimate on an MoE checkpoint must get a
400 that names the field and says what is missing, over real HTTP with the
daemon's SQLite file, and nothing is queued.
"""
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


def test_jobs_and_estimates_refused_with_the_reason():
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
            st, j = d.req("POST", "/v1/estimate", {"model": m, "target": {"device": "H100"}})
            assert st == 400 and j["error"]["field"] == "model" and "mixture-of-experts" in j["error"]["message"], j
        st, j = d.req("GET", "/v1/jobs")
        assert st == 200 and j["jobs"] == [], j  # nothing queued
    finally:
        d.cleanup()


if __name__ == "__main__":
    r = Runner()
    try:
        r.run(test_jobs_and_estimates_refused_with_the_reason)
    finally:
        shutil.rmtree(WORK, ignore_errors=True)
    r.done()
