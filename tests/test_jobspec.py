"""The job-spec validation (ac_job_spec_check, src/pipeline/jobspec.c).

1. Through `autocompress validate`, against an independent validator: the
`jsonschema` library (Debian's python3-jsonschema, in `make deps`) checking
proto/job.schema.json. Random mutations of a valid spec (values inside, on
and just outside each bound, wrong types, unknown and missing fields,
unlisted enum values) must be accepted or rejected by both alike, and a
rejection must name the field the mutation touched. validate also checks
the files a spec names, which no schema can: a path the schema accepts may
still be refused, naming that (touched) path field.

2. Over HTTP on loopback: `autocompress validate`, `autocompress compress`,
POST /v1/validate and POST /v1/jobs give one verdict on a spec, naming the
same field (they all call ac_job_spec_check).

Outside the schema's reach, and so not mutated here: target.device names
(resolved against the device profiles; tests/test_jobspec.c covers them) and
integral floats such as 3.0 in integer fields (JSON Schema calls them
integers; the parser, like before the table existed, wants JSON integers)."""
import json
import os
import random
import shutil
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from harness import BUILD, DATA, ROOT, TINY, Daemon, Runner  # noqa: E402

CLI = os.path.join(BUILD, "autocompress")
SCHEMA = os.path.join(ROOT, "proto", "job.schema.json")
MISTRAL = os.path.join(BUILD, "fixtures", "models", "mistral_sharded")  # a sliding window: no deci export
PATH_FIELDS = {"model", "calibration", "heldout", "output", "distill.text"}


def base_spec(out="/tmp/acspec_out/never_written"):
    return {"model": TINY, "calibration": os.path.join(DATA, "calib.txt"), "output": out, "target": {"device": "cpu"},
            "constraints": {"max_tpot_ms": 5.0}}


def leaves(schema, path=()):
    """(path, property schema) of every field, objects included."""
    for k, p in schema.get("properties", {}).items():
        yield path + (k,), p
        if "properties" in p:
            yield from leaves(p, path + (k,))


def values_for(p, rnd):
    """Candidate values for a field: valid, boundary, invalid."""
    out = [None, "x", 7, 2.5, True, [], {}]
    if p.get("type") in ("integer", "number"):
        lo, hi = p["minimum"], p["maximum"]
        isint = p["type"] == "integer"
        out += [lo, hi]
        if isint:
            out += [lo - 1, hi + 1, rnd.randint(int(lo), int(min(hi, lo + 10 ** 6)))]
        else:
            eps = abs(lo) * 1e-6 + 1e-12
            out += [lo - eps, hi * (1 + 1e-6) + 1e-12, rnd.uniform(lo, min(hi, lo + 1e3)) + 0.1234]
    if p.get("type") == "string":
        out += ["", "a" * (p["maxLength"]), "a" * (p["maxLength"] + 1), "/p/" + str(rnd.randint(0, 99))]
    if "enum" in p:
        out += list(p["enum"]) + ["no-such-value"]
    if p.get("type") == "boolean":
        out += [False, True]
    if p.get("type") == "object":
        out += [{}, {"no_such_field": 1}]
    # integral floats are outside the comparison (see the module comment)
    return [v for v in out if not (p.get("type") == "integer" and isinstance(v, float) and v == int(v))]


def set_path(d, path, v):
    for k in path[:-1]:
        if not isinstance(d.get(k), dict):
            d[k] = {}
        d = d[k]
    if v is None:
        d.pop(path[-1], None)
    else:
        d[path[-1]] = v


def cli_validate(spec, tmp):
    with open(tmp, "w") as f:
        json.dump(spec, f)
    r = subprocess.run([CLI, "validate", tmp], capture_output=True, text=True, timeout=30)
    return json.loads(r.stdout.strip().splitlines()[-1])


def test_parser_agrees_with_jsonschema():
    try:
        import jsonschema
    except ImportError:
        print("   skip: python3-jsonschema is not installed (make deps)")
        return "skip"
    schema = json.load(open(SCHEMA))
    validator = jsonschema.Draft202012Validator(schema)
    fields = [(path, p) for path, p in leaves(schema) if path != ("target", "device")]
    rnd = random.Random(10)
    tmp = os.path.join(tempfile.mkdtemp(prefix="acspec_"), "spec.json")
    n = agree_reject = files = 0
    for i in range(400):
        spec = base_spec()
        touched = []
        for _ in range(rnd.choice([1, 1, 2, 3])):
            path, p = rnd.choice(fields)
            set_path(spec, path, rnd.choice(values_for(p, rnd)))
            touched.append(".".join(path))
        if rnd.random() < 0.05:
            spec["no_such_field"] = 1
            touched.append("no_such_field")
        want_ok = validator.is_valid(spec)
        got = cli_validate(spec, tmp)
        n += 1
        if want_ok and not got["ok"]:  # the files: only a path the mutation touched may fail them, or a max_params
            # below what any structure of the model reaches (its embeddings and output head: at most 768 x 128 x 2 + 128)
            small = got["field"] == "constraints.max_params" and spec["constraints"]["max_params"] < 196736 and \
                "below what any structure of this model reaches" in got["error"]
            # and a mixture-of-experts option, which the tiny (dense) model may not name
            moe = got["field"] in ("search.prune_experts", "search.prune_expert_ffn", "search.min_top_k") and \
                "this model is dense" in got["error"]
            # and search.keep_weights without what it needs (cotrain, method autocompress, dnas, a dense model): a
            # rule across fields the schema does not state
            keep = got["field"] == "search.keep_weights" and "it needs method autocompress" in got["error"]
            assert (got["field"] in PATH_FIELDS or small or moe or keep) and got["field"] in touched, (spec, touched, got)
            files += 1
            continue
        assert got["ok"] == want_ok, f"spec {spec}: jsonschema says {want_ok}, parser says {got}"
        if not want_ok:
            agree_reject += 1
            f = got["field"]
            # the field named is one the mutation touched, or inside one of them
            assert any(f == t or f.startswith(t + ".") or t.startswith(f + ".") or
                       (f in ("model", "calibration", "target", "constraints") and f not in spec) for t in touched), \
                (spec, touched, got)
    shutil.rmtree(os.path.dirname(tmp), ignore_errors=True)
    assert agree_reject > 100 and n - agree_reject - files > 50, (n, agree_reject, files)
    print(f"   {n} mutated specs, {agree_reject} rejected by both, {n - agree_reject - files} accepted by both, "
          f"{files} valid by the schema with a path that is not there")


def cli(cmd, spec, tmp):
    with open(tmp, "w") as f:
        json.dump(spec, f)
    return subprocess.run([CLI, cmd, tmp], capture_output=True, text=True, timeout=300)


def test_one_validation_for_validate_compress_and_submit():
    """A spec `autocompress validate` used to accept ({"ok": true}: it only parsed) while `compress` and the daemon
    refuse it: the Mistral fixture (a sliding window) with the default export_target deci, which nemotron-nas cannot
    express. Now validate, compress, POST /v1/validate and POST /v1/jobs all refuse it naming search.export_target,
    and agree on a missing model (invalid_path) and on a good spec."""
    if not os.path.exists(os.path.join(MISTRAL, "config.json")):
        print("   skip: no fixtures (make fixtures)")
        return "skip"
    work = tempfile.mkdtemp(prefix="acval_")
    tmp = os.path.join(work, "spec.json")
    D = Daemon(config={"cpu_slots": 1, "model_roots": [BUILD, "/tmp"]}).start()
    try:
        cases = [  # spec, the field every front names (None: accepted), the daemon's error code
            (base_spec(os.path.join(work, "out1")), None, None),
            (dict(base_spec(os.path.join(work, "out2")), model=MISTRAL), "search.export_target", "invalid_spec"),
            (dict(base_spec(os.path.join(work, "out3")), model=MISTRAL, search={"export_target": "gguf"}), "model",
             "invalid_spec"),
            (dict(base_spec(os.path.join(work, "out4")), model=os.path.join(work, "no_such_model")), "model",
             "invalid_path"),
            (dict(base_spec(os.path.join(work, "out5")), calibration=work), "calibration", "invalid_path"),
        ]
        for sp, field, code in cases:
            v = cli_validate(sp, tmp)
            st, r = D.req("POST", "/v1/validate", body=sp)
            if field is None:
                assert v == {"ok": True}, (sp, v)
                assert st == 200 and r == {"ok": True}, (sp, st, r)
                continue
            assert v["ok"] is False and v["field"] == field, (sp, v)
            assert st == 400 and r["error"]["code"] == code and r["error"]["field"] == field, (sp, st, r)
            assert v["error"] in r["error"]["message"], (v, r)
            st2, r2 = D.req("POST", "/v1/jobs", body=sp)
            assert (st2, r2) == (st, r), (sp, st2, r2, r)
            c = cli("compress", sp, tmp)
            assert c.returncode == 1 and v["error"] in c.stderr, (sp, c.returncode, c.stderr[-2000:])
            assert not os.path.exists(sp["output"]), sp
        # nothing was queued by the refused submits
        st, jobs = D.req("GET", "/v1/jobs")
        assert st == 200 and jobs["jobs"] == [], jobs
        # the context differs in one rule only: the daemon gives a job its own output directory, the CLI needs one
        sp = base_spec()
        del sp["output"]
        v = cli_validate(sp, tmp)
        assert v["ok"] is False and v["field"] == "output", v
        st, r = D.req("POST", "/v1/validate", body=sp)
        assert st == 200 and r == {"ok": True}, (st, r)
        # the daemon's own rules come through the same function
        st, r = D.req("POST", "/v1/validate", body=dict(base_spec(), target={"device": "cuda:0"}))
        assert st == 400 and r["error"]["code"] == "no_device" and r["error"]["field"] == "target.device", (st, r)
    finally:
        D.cleanup()
        shutil.rmtree(work, ignore_errors=True)


def test_unreachable_limits_refused_with_the_bound():
    """A limit no structure of the model reaches is refused at submit (POST /v1/jobs and /v1/validate, 400
    invalid_spec naming constraints.NAME) with error.bound: the limit and the best figure any structure reaches. That
    floor is the model with every layer removed at the smallest hidden size search.hidden_multiple allows; the test
    gets it from POST /v1/estimate on that architecture (and max_params from config.json), and checks that limits
    just past it are accepted. Checked on a spec profile (a roofline table) with a static batch; a served workload and
    the local CPU are left to the search (its infeasible event, test_daemon.py)."""
    cfg = json.load(open(os.path.join(TINY, "config.json")))
    L, H = cfg["num_hidden_layers"], 32  # hidden_multiple 32: the search may narrow hidden down to 32
    head = 1 if cfg.get("tie_word_embeddings") else 2
    work = tempfile.mkdtemp(prefix="acreach_")
    D = Daemon(config={"cpu_slots": 1, "model_roots": [BUILD, "/tmp"]}).start()
    try:
        target = {"device": "H100", "workload": {"batch": 1, "prompt_len": 256, "gen_len": 64}}
        floor_arch = {"hidden": H, "layers": [{"heads": 0, "kv_heads": 0, "ffn": 0}] * L}
        st, fl = D.req("POST", "/v1/estimate", body={"model": TINY, "architecture": floor_arch, "target": target})
        assert st == 200 and fl["source"] == "roofline", fl
        F = fl["figures"]
        st, base = D.req("POST", "/v1/estimate", body={"model": TINY, "target": target})
        assert st == 200, base
        B = base["figures"]  # the base model is a structure too: the floor is no worse in any figure
        assert B["tpot_ms"] > F["tpot_ms"] and B["ttft_ms"] > F["ttft_ms"] and B["memory_gib"] > F["memory_gib"]
        assert B["tokens_per_s"] < F["tokens_per_s"]
        params = cfg["vocab_size"] * H * head + H
        assert F["params"] == params, (F["params"], params)

        def sp(limits, **tg):
            return dict(base_spec(os.path.join(work, "out")), constraints=limits, target=dict(target, **tg),
                        search={"prune_hidden": True, "hidden_multiple": H})
        cases = [("max_ttft_ms", "ttft_ms", "max", 0.9), ("max_tpot_ms", "tpot_ms", "max", 0.9),
                 ("max_memory_gib", "memory_gib", "max", 0.9), ("min_tokens_per_s", "tokens_per_s", "min", 1.1),
                 ("max_params", "params", "max", (params - 1) / params)]
        for name, metric, kind, f in cases:
            lim = F[metric] * f
            for path in ("/v1/validate", "/v1/jobs"):
                st, r = D.req("POST", path, body=sp({name: lim}))
                err = r.get("error", {})
                assert st == 400 and err["code"] == "invalid_spec" and err["field"] == f"constraints.{name}", (path, r)
                b = err["bound"]
                assert (b["constraint"], b["metric"], b["kind"]) == (name, metric, kind), b
                assert abs(b["limit"] - lim) <= 1e-9 * lim and abs(b["reachable"] - F[metric]) <= 1e-9 * F[metric], \
                    (b, F[metric])
                assert "what any structure of this model reaches" in err["message"], err
            # just past the floor: reachable, accepted (every limit at once: the floor meets them all)
            past = F[metric] * (1.001 if kind == "max" else 0.999)
            st, r = D.req("POST", "/v1/validate", body=sp({name: past}))
            assert st == 200 and r == {"ok": True}, (name, past, st, r)
        st, r = D.req("POST", "/v1/validate", body=sp({n: F[m] * (1.001 if k == "max" else 0.999)
                                                        for n, m, k, _ in cases}))
        assert st == 200, r
        # not judged at submit: a served workload (its scheduler trades one figure for another) and a measured table
        served = {"concurrency": 1, "requests": 8, "prompt_len": 256, "gen_len": 64}
        assert D.req("POST", "/v1/validate", body=sp({"max_tpot_ms": F["tpot_ms"] * 0.5}, workload=served))[0] == 200
        assert D.req("POST", "/v1/validate", body=dict(sp({"max_tpot_ms": 1e-6}), target={"device": "cpu"}))[0] == 200
        st, jobs = D.req("GET", "/v1/jobs")
        assert st == 200 and jobs["jobs"] == [], jobs  # nothing was queued by the refused submits
    finally:
        D.cleanup()
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    if not os.path.exists(CLI):
        print("SKIP all: build/autocompress not built")
        print("RESULT 0 0 1")
        sys.exit(0)
    if not os.path.exists(os.path.join(TINY, "config.json")):
        print("SKIP all: tiny model not built (make tiny-model)")
        print("RESULT 0 0 1")
        sys.exit(0)
    R = Runner()
    R.run(test_parser_agrees_with_jsonschema)
    R.run(test_one_validation_for_validate_compress_and_submit)
    R.run(test_unreachable_limits_refused_with_the_bound)
    R.done()
