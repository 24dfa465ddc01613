"""The job-spec parser (src/pipeline/jobspec.c, through `autocompress validate`)
against an independent validator: the `jsonschema` library (Debian's
python3-jsonschema, in `make deps`) checking proto/job.schema.json. Random mutations of a
valid spec (values inside, on and just outside each bound, wrong types,
unknown and missing fields, unlisted enum values) must be accepted or
rejected by both alike, and a rejection must name the field the mutation
touched.

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
from harness import BUILD, ROOT, Runner  # noqa: E402

CLI = os.path.join(BUILD, "autocompress")
SCHEMA = os.path.join(ROOT, "proto", "job.schema.json")


def base_spec():
    return {"model": "/m", "calibration": "/c.txt", "target": {"device": "cpu"}, "constraints": {"max_tpot_ms": 5.0}}


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
    n = agree_reject = 0
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
        assert got["ok"] == want_ok, f"spec {spec}: jsonschema says {want_ok}, parser says {got}"
        if not want_ok:
            agree_reject += 1
            f = got["field"]
            # the field named is one the mutation touched, or inside one of them
            assert any(f == t or f.startswith(t + ".") or t.startswith(f + ".") or
                       (f in ("model", "calibration", "target", "constraints") and f not in spec) for t in touched), \
                (spec, touched, got)
    shutil.rmtree(os.path.dirname(tmp), ignore_errors=True)
    assert agree_reject > 100 and n - agree_reject > 50, (n, agree_reject)
    print(f"   {n} mutated specs, {agree_reject} rejected by both, {n - agree_reject} accepted by both")


if __name__ == "__main__":
    if not os.path.exists(CLI):
        print("SKIP all: build/autocompress not built")
        print("RESULT 0 0 1")
        sys.exit(0)
    R = Runner()
    R.run(test_parser_agrees_with_jsonschema)
    R.done()
