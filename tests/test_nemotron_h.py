"""Hybrid Mamba-Transformer (nemotron_h) models at the daemon: what the
pipeline compresses is told apart from what it does not yet.

The engine's hybrid forward and the trainer's backward are checked against
tests/ref_mamba.py in test_engine, test_train and test_block, and a whole
minitron job and an autocompress one in test_hybrid_job.py; here a job or a
validation on a Nemotron-H checkpoint, over real HTTP with the daemon's
SQLite file: export_target deci is refused with a 400 naming the field and
the layouts that load a hybrid; the autocompress method with the surrogate search under every
calibration method (each measures the loss curves it scores by), with the
gate search (dnas, the default) or with method minitron validates, and
nothing is queued; an estimate is answered (the cost model prices Mamba
layers: test_estimate_hybrid.py checks its figures).
"""
import os
import shutil
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from harness import BUILD, TINY, Daemon, Runner, spec  # noqa: E402

FIXTURES = [os.path.join(BUILD, "fixtures", "models", n) for n in ("nemotronh_bf16", "nemotronh_moe_bf16")]
WORK = tempfile.mkdtemp(prefix="ac_nemoh_")


def model_dir(fix):
    """A fixture checkpoint with a tokenizer beside it (as a job needs)."""
    d = os.path.join(WORK, os.path.basename(fix))
    if not os.path.exists(d):
        shutil.copytree(fix, d)
        shutil.copy(os.path.join(TINY, "tokenizer.json"), d)
    return d


def have():
    return (all(os.path.exists(os.path.join(f, "config.json")) for f in FIXTURES)
            and os.path.exists(os.path.join(TINY, "tokenizer.json"))
            and os.path.exists(os.path.join(BUILD, "autocompressd")))


def test_jobs_and_estimates_refused_with_the_reason():
    if not have():
        return "skip: no nemotron_h fixtures, tiny model or build/autocompressd (make all fixtures)"
    d = Daemon(config={"cpu_slots": 1, "model_roots": [BUILD, "/tmp"]}).start()
    try:
        for fix in FIXTURES:  # the dense hybrid and the one with MoE layers
            m = model_dir(fix)
            deci = spec(model=m, search={"export_target": "deci"})  # the DeciLM layout has no Mamba layers
            st, j = d.req("POST", "/v1/jobs", deci)
            assert st == 400 and j["error"]["field"] == "search.export_target" and "nemotron_h" in \
                j["error"]["message"], (fix, st, j)
            cpu = spec(model=m, search={"export_target": "gguf", "method": "surrogate"})
            for ok in (cpu, dict(cpu, calibration_method="exact"), dict(cpu, calibration_method="streamed"),
                       dict(cpu, calibration_method="anchored"),  # each measures the curves the surrogate reads
                       spec(model=m, method="minitron", search={"export_target": "gguf"}),
                       spec(model=m, search={"export_target": "gguf"})):  # autocompress with the gate search
                st, j = d.req("POST", "/v1/validate", ok)
                assert st == 200, (fix, st, j)
            st, j = d.req("POST", "/v1/estimate", {"model": m, "target": {"device": "H100"}})
            assert st == 200 and j["figures"]["ssm_state_gib"] > 0, (fix, st, j)
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
