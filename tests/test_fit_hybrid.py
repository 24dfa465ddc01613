"""The config-only search: which structures of a hybrid (nemotron_h) model fit
a target, from its config.json alone (no weights), as `autocompress
estimate` answers with "constraints".

Nemotron-H-8B-Base's published config on one B200 at 128K context: under a
parameter limit (5e9 of its 8.1e9) and under a memory limit at batch 8, every
returned structure is re-priced here as an explicit architecture through the
plain estimate (the layers of each type kept from the first, as the search
keeps them without importance scores) and meets the limit with the figures
the search printed; its Mamba heads are a multiple of n_groups, its removed
fractions are its values against the base's, and the structures come
closest to the binding limit first. A dense model's estimate with
constraints is refused naming the field. Over real HTTP the daemon's
POST /v1/estimate answers the same fits for the nemotron_h fixture.
"""
import json
import os
import shutil
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from harness import BUILD, TINY, Daemon, Runner, cli_estimate, fit_architecture  # noqa: E402
from test_estimate_hybrid import NH8  # noqa: E402

CLI = os.path.join(BUILD, "autocompress")
WORK = tempfile.mkdtemp(prefix="ac_fit_")


def target(prompt, batch=1):
    return {"device": "B200", "workload": {"batch": batch, "prompt_len": prompt, "gen_len": 1}}


def config_dir():
    d = os.path.join(WORK, "nh8")
    if not os.path.exists(d):
        os.makedirs(d)
        with open(os.path.join(d, "config.json"), "w") as f:
            json.dump(NH8, f)
    return d


def check_fits(d, tg, limits, metric):
    ans = cli_estimate({"model": d, "target": tg, "constraints": limits})
    f = ans["fits"]
    assert f["feasible"] and f["grid_feasible"] > 0 and f["structures"], f.keys()
    name, lim = next(iter(limits.items()))
    base = {"hidden_size": NH8["hidden_size"], "ffn_hidden_size": NH8["intermediate_size"],
            "num_attention_heads": NH8["num_attention_heads"], "mamba_num_heads": NH8["mamba_num_heads"],
            "mamba_head_dim": NH8["mamba_head_dim"]}
    prev = None
    for s in f["structures"]:
        assert s["mamba_num_heads"] % NH8["n_groups"] == 0, s
        for k, v in base.items():
            assert abs(s["removed_fraction"][k] - (1 - s[k] / v)) < 1e-12, (k, s)
        arch = fit_architecture(NH8["hybrid_override_pattern"], s)
        j = cli_estimate({"model": d, "architecture": arch, "target": tg})["figures"]
        assert j[metric] <= lim * (1 + 1e-12), (metric, j[metric], lim)
        assert abs(j[metric] - s["predicted"][metric]) <= 1e-9 * abs(j[metric]), (j[metric], s["predicted"][metric])
        assert abs(j["params"] - s["params"]) < 0.5, (j["params"], s["params"])
        if prev is not None:  # closest to the binding limit first
            assert s["predicted"][metric] <= prev * (1 + 1e-12), (s["predicted"][metric], prev)
        prev = s["predicted"][metric]
    best = f["structures"][0]
    print(f"   {name} {lim:g}: {f['grid_feasible']} of {f['grid_size']} structures fit; closest: hidden "
          f"{best['hidden_size']}, MLP {best['ffn_hidden_size']}, Mamba heads {best['mamba_num_heads']}, "
          f"attention {best['num_attention_heads']}/{best['num_query_groups']}, layers kept "
          f"{best['layers_kept_per_type']} ({metric} {best['predicted'][metric]:.4g})")
    return f


def test_nemotron_h_8b_fits_a_b200_at_128k():
    if not os.path.exists(CLI):
        return "skip: build/autocompress missing (make all)"
    d = config_dir()
    check_fits(d, target(131071), {"max_params": 5.0e9}, "params")
    full = cli_estimate({"model": d, "target": target(131071, batch=8)})["figures"]["memory_gib"]
    check_fits(d, target(131071, batch=8), {"max_memory_gib": 0.8 * full}, "memory_gib")


def test_daemon_answers_fits():
    fix = os.path.join(BUILD, "fixtures", "models", "nemotronh_bf16")
    if not (os.path.exists(os.path.join(fix, "config.json")) and os.path.exists(os.path.join(BUILD, "autocompressd"))):
        return "skip: no fixture nemotronh_bf16 or build/autocompressd (make all fixtures)"
    req = {"model": fix, "target": target(512), "constraints": {"max_params": 0.85 * cli_estimate(
        {"model": fix, "target": target(512)})["figures"]["params"]}}
    d = Daemon(config={"cpu_slots": 1, "model_roots": [BUILD, "/tmp"]}).start()
    try:
        st, j = d.req("POST", "/v1/estimate", req)
    finally:
        d.cleanup()
    assert st == 200 and j["fits"]["feasible"], (st, j)
    assert j["fits"] == cli_estimate(req)["fits"], "the daemon and the CLI answer alike"
    print(f"   daemon: {j['fits']['grid_feasible']} of {j['fits']['grid_size']} structures of the fixture fit")


def test_dense_refused():
    if not os.path.exists(os.path.join(TINY, "config.json")):
        return "skip: no tiny model (make tiny-model)"
    p = os.path.join(WORK, "req.json")
    with open(p, "w") as f:
        json.dump({"model": TINY, "target": target(512), "constraints": {"max_params": 1e6}}, f)
    r = subprocess.run([CLI, "estimate", p], capture_output=True, text=True)
    assert r.returncode != 0 and "constraints" in r.stderr and "nemotron_h" in r.stderr, (r.returncode, r.stderr)


if __name__ == "__main__":
    r = Runner()
    try:
        r.run(test_nemotron_h_8b_fits_a_b200_at_128k)
        r.run(test_daemon_answers_fits)
        r.run(test_dense_refused)
    finally:
        shutil.rmtree(WORK, ignore_errors=True)
    r.done()
