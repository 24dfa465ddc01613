#!/usr/bin/env python3
"""GET /openapi.json against a live daemon on loopback: the document served, generated from the route and field
tables, is `autocompressd --openapi` and proto/openapi.json, with the job spec's generated schema; every documented operation answers on the live daemon (never "no such route" or 405) with
a status the document lists; the answers of a real job's life (submit, get, list, events, result, files, errors) are
valid against the document's schemas (jsonschema, draft 2020-12); the error codes the daemon's sources can send are
the document's enum. tests/test_openapi.c checks the route table against the document in the other direction."""
import glob
import json
import os
import re
import socket
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from harness import BUILD, ROOT, TINY, run_with_daemon, spec  # noqa: E402

try:
    import jsonschema
except ImportError:  # python3-jsonschema (make deps)
    jsonschema = None

D = None
DOC = None


def get_doc():
    global DOC
    if DOC is None:
        st, DOC = D.req("GET", "/openapi.json")
        assert st == 200 and isinstance(DOC, dict), (st, DOC)
    return DOC


def validate(schema_ref, value):
    """value against the document's schema at schema_ref (a JSON pointer into the document, or a schema)."""
    doc = get_doc()
    root = {"$schema": "https://json-schema.org/draft/2020-12/schema", "components": doc["components"]}
    root.update(schema_ref if isinstance(schema_ref, dict) else {"$ref": schema_ref})
    jsonschema.Draft202012Validator(root).validate(value)


def operation(template, method):
    op = get_doc()["paths"][template][method.lower()]
    return op


def check_answer(template, method, status, body):
    """status is documented for the operation; a JSON body is valid against the documented schema."""
    op = operation(template, method)
    resp = op["responses"].get(str(status))
    assert resp is not None, f"{method} {template} answered {status}, not documented: {list(op['responses'])} {body}"
    if "$ref" in resp:
        resp = get_doc()["components"]["responses"][resp["$ref"].split("/")[-1]]
    schema = resp.get("content", {}).get("application/json", {}).get("schema")
    if schema is not None and isinstance(body, (dict, list)):
        validate(schema, body)


def call(method, template, path=None, **kw):
    st, body = D.req(method, path or template, **kw)
    check_answer(template, method, st, body)
    return st, body


def test_served_document_is_the_generated_file():
    # the daemon builds the document from its route and field tables; proto/openapi.json is that output
    # (`autocompressd --openapi`), kept in the repository for readers and code generators: it must not go stale
    doc = get_doc()
    assert doc["openapi"].startswith("3.1"), doc["openapi"]
    assert doc["info"]["x-server-version"] == D.req("GET", "/healthz")[1]["version"]
    out = subprocess.run([os.path.join(BUILD, "autocompressd"), "--openapi"], capture_output=True, text=True, check=True)
    assert json.loads(out.stdout) == doc, "autocompressd --openapi is not the served document"
    with open(os.path.join(ROOT, "proto", "openapi.json")) as f:
        assert json.load(f) == doc, "proto/openapi.json is stale: build/autocompressd --openapi > proto/openapi.json"
    gen = doc["components"]["schemas"]["JobSpec"]
    out = subprocess.run([os.path.join(BUILD, "autocompress"), "schema"], capture_output=True, text=True, check=True)
    assert gen == json.loads(out.stdout)
    with open(os.path.join(ROOT, "proto", "job.schema.json")) as f:
        assert gen == json.load(f)
    if jsonschema is None:
        return "skip: python3-jsonschema not installed (make deps)"
    jsonschema.Draft202012Validator.check_schema({"$ref": "#/components/schemas/Job", "components": doc["components"]})


def test_error_codes_are_the_documented_enum():
    codes = set()
    for f in glob.glob(os.path.join(ROOT, "daemon", "*.c")):
        with open(f) as fh:
            codes |= set(re.findall(r'rep_error\([^"]*"([a-z_]+)"', fh.read()))
    enum = set(get_doc()["components"]["schemas"]["Error"]["properties"]["error"]["properties"]["code"]["enum"])
    assert codes and codes <= enum, codes - enum
    assert enum - codes <= {"internal"}, enum - codes


def media_examples(node, where=""):
    """(where, schema, example) for every media type object of the document that carries an example."""
    if isinstance(node, dict):
        if "example" in node and "schema" in node:
            yield where, node["schema"], node["example"]
        for k, v in node.items():
            yield from media_examples(v, f"{where}/{k}")
    elif isinstance(node, list):
        for i, v in enumerate(node):
            yield from media_examples(v, f"{where}/{i}")


def test_examples_are_valid():
    # the examples code generators and Postman show are valid against their own schemas (the spec's generated one)
    found = {w: (schema, example) for w, schema, example in media_examples(get_doc())}
    req = "/paths//v1/jobs/post/requestBody/content/application/json"
    assert {req, "/paths//v1/jobs/post/responses/201/content/application/json",
            "/components/responses/Error/content/application/json"} <= set(found), list(found)
    if jsonschema is None:
        return "skip: python3-jsonschema not installed (make deps)"
    for schema, example in found.values():
        validate(schema, example)
    # the check can fail: the request example with a field the spec does not have
    try:
        validate(found[req][0], dict(found[req][1], colour="red"))
    except jsonschema.ValidationError:
        pass
    else:
        raise AssertionError("an unknown spec field passed the JobSpec schema")


def test_every_documented_operation_answers():
    # a finished job to point the {id} routes at
    st, j = D.req("POST", "/v1/jobs", body=spec())
    job = D.wait_state(j["id"], {"succeeded", "failed"}, timeout=240)
    assert job["state"] == "succeeded", job
    fill = {"id": str(job["id"]), "name": "report.json", "key": "no-such-table"}
    n = 0
    for template, item in get_doc()["paths"].items():
        for method in item:
            if method not in ("get", "post", "delete", "put", "patch", "head"):
                continue
            path = re.sub(r"\{(\w+)\}", lambda m: fill[m.group(1)], template)
            if template == "/v1/cost-tables/measurements/{id}":
                path = "/v1/cost-tables/measurements/999999"
            kw = {"body": {}} if method == "post" else {}
            if template.endswith("/events"):
                path += "?format=json"
            st, body = D.req(method.upper(), path, **kw)
            if method == "head":  # the headers the GET answers: same status, same content type, no body
                gst, _ = D.req("GET", path)
                assert st == gst and "content-type" in body, (path, st, gst, body)
                body = None
            assert not (st == 404 and isinstance(body, dict) and body["error"]["message"] == "no such route"), path
            assert st != 405, (method, path, body)
            check_answer(template, method, st, body)
            n += 1
    assert n >= 20, n


def test_a_job_life_validates_against_the_document():
    if jsonschema is None:
        return "skip: python3-jsonschema not installed (make deps)"
    s = spec(name="openapi")
    validate("#/components/schemas/JobSpec", s)  # the request example
    st, j = call("POST", "/v1/jobs", body=s, headers={"Idempotency-Key": "oa-1"})
    assert st == 201
    st, j2 = call("POST", "/v1/jobs", body=s, headers={"Idempotency-Key": "oa-1"})
    assert st == 200 and j2["id"] == j["id"]
    call("POST", "/v1/jobs", body=spec(constraints={"max_tpot_ms": "fast"}))  # 400 Error
    st, r = call("POST", "/v1/jobs", body=spec(constraints={"max_tpot_ms": 1e-6}))  # 400 Error with its bound
    assert st == 400 and r["error"]["bound"]["constraint"] == "max_tpot_ms", r
    call("POST", "/v1/validate", body=s)
    call("GET", "/v1/jobs/{id}", f"/v1/jobs/{j['id']}")
    D.wait_state(j["id"], {"succeeded", "failed"}, timeout=240)
    call("GET", "/v1/jobs/{id}", f"/v1/jobs/{j['id']}")
    call("GET", "/v1/jobs", "/v1/jobs?limit=1")
    call("GET", "/v1/jobs", "/v1/jobs?state=weird")  # 400
    st, evs = call("GET", "/v1/jobs/{id}/events", f"/v1/jobs/{j['id']}/events?format=json")
    assert st == 200 and evs["events"]
    # the event stream of an ended job as sent: `retry: 2000` before the first event, and the stream ends
    with socket.create_connection(("127.0.0.1", D.port), timeout=20) as sk:
        sk.sendall(f"GET /v1/jobs/{j['id']}/events HTTP/1.1\r\nHost: 127.0.0.1\r\nAccept: text/event-stream\r\n"
                   "\r\n".encode())
        raw = b""
        while chunk := sk.recv(65536):
            raw += chunk
    raw = raw.decode(errors="replace")
    assert "retry: 2000\n" in raw and raw.index("retry: 2000\n") < raw.index("\nid: "), raw[:300]
    st, rep = call("GET", "/v1/jobs/{id}/result", f"/v1/jobs/{j['id']}/result")
    assert st == 200, rep
    st, files = call("GET", "/v1/jobs/{id}/files", f"/v1/jobs/{j['id']}/files")
    assert st == 200 and "report.json" in [f["name"] for f in files["files"]]
    call("DELETE", "/v1/jobs/{id}", f"/v1/jobs/{j['id']}")  # 409: ended
    call("GET", "/v1/jobs/{id}", "/v1/jobs/999999")  # 404 Error
    call("GET", "/healthz")
    # a queued job cancelled: 202 with the job
    st, q = call("POST", "/v1/jobs", body=spec(search={"steps": 100000, "seed": 1, "dnas_steps": 100000}))
    st, c = call("DELETE", "/v1/jobs/{id}", f"/v1/jobs/{q['id']}")
    assert st == 202 and c["cancel_requested"], c
    D.wait_state(q["id"], {"cancelled"}, timeout=60)
    call("GET", "/v1/jobs/{id}/files", f"/v1/jobs/{q['id']}/files")  # 409: nothing exported


if __name__ == "__main__":
    run_with_daemon([test_served_document_is_the_generated_file, test_error_codes_are_the_documented_enum,
                     test_examples_are_valid, test_every_documented_operation_answers, test_a_job_life_validates_against_the_document],
                    globals())
