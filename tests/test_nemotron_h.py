"""Hybrid Mamba-Transformer (nemotron_h) models at the daemon: what loads is
told apart from what the pipeline compresses.

The engine's hybrid forward and the trainer's backward are checked against
tests/ref_mamba.py in test_engine, test_train and test_block; here a job, a
validation or an estimate on a Nemotron-H checkpoint must get a 400 that
names the field `model` and says what is missing, over real HTTP with the
daemon's SQLite file, and nothing is queued.
"""
import os
import shutil
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from harness import BUILD, TINY, Daemon, Runner, spec  # noqa: E402

FIX = os.path.join(BUILD, "fixtures", "models", "nemotronh_bf16")
WORK = tempfile.mkdtemp(prefix="ac_nemoh_")


def model_dir():
    """The fixture checkpoint with a tokenizer beside it (as a job needs)."""
    d = os.path.join(WORK, "nemotronh")
    if not os.path.exists(d):
        shutil.copytree(FIX, d)
        shutil.copy(os.path.join(TINY, "tokenizer.json"), d)
    return d


def have():
    return (os.path.exists(os.path.join(FIX, "config.json")) and os.path.exists(os.path.join(TINY, "tokenizer.json"))
            and os.path.exists(os.path.join(BUILD, "autocompressd")))


def test_jobs_and_estimates_refused_with_the_reason():
    if not have():
        return "skip"
    d = Daemon(config={"cpu_slots": 1, "model_roots": [BUILD, "/tmp"]}).start()
    try:
        m = model_dir()
        st, j = d.req("POST", "/v1/jobs", spec(model=m))
        assert st == 400 and j["error"]["field"] == "model", (st, j)
        assert "nemotron_h" in j["error"]["message"] and "evaluate" in j["error"]["message"], j
        st, j = d.req("POST", "/v1/validate", spec(model=m))  # the one spec check: the same answer
        assert st == 400 and j["error"]["field"] == "model" and j["error"]["code"] == "invalid_spec", (st, j)
        st, j = d.req("POST", "/v1/estimate", {"model": m, "target": {"device": "H100"}})
        assert st == 400 and j["error"]["field"] == "model" and "nemotron_h" in j["error"]["message"], (st, j)
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
