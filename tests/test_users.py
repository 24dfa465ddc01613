"""Users, roles and API tokens over real HTTP with a real SQLite file: tokens made with `autocompressd token add`
while the daemon runs, stored only as their SHA-256 (checked against hashlib), 401 without a live token and 403 for a
role that is too low (JSON bodies), another user's job answering 404 on every job route exactly as an unknown id does,
admins seeing everyone's, Idempotency-Keys per user, revocation taking effect at once, the audit log in the database
and served to admins only by GET /v1/audit (page by page, equal to the table's rows),
the config's single token working as the admin, and a daemon off loopback never serving without a token."""
import hashlib
import http.client
import json
import os
import sqlite3
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from harness import BUILD, TINY, Daemon, Runner, free_port, spec  # noqa: E402

EXE = os.path.join(BUILD, "autocompressd")
ROOTS = {"cpu_slots": 0, "model_roots": [os.path.dirname(os.path.dirname(TINY)), "/tmp"]}  # no slot: jobs stay queued


def call(port, method, path, token=None, body=None, headers=None):
    """(status, JSON body or text, headers) of one request."""
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    h = dict(headers or {})
    if token:
        h["Authorization"] = "Bearer " + token
    data = json.dumps(body).encode() if body is not None else None
    if data is not None:
        h["Content-Type"] = "application/json"
    c.request(method, path, body=data, headers=h)
    r = c.getresponse()
    payload = r.read()
    c.close()
    hd = {k.lower(): v for k, v in r.getheaders()}
    return r.status, (json.loads(payload) if "json" in hd.get("content-type", "") else payload.decode()), hd


def token(db, user, role):
    r = subprocess.run([EXE, "token", "add", user, "--role", role, "--db", db], capture_output=True, text=True, timeout=30)
    assert r.returncode == 0, r.stderr
    tok = r.stdout.strip()
    assert tok.startswith("act_") and len(tok) == 47, tok
    return tok


def token_id(db, user):
    with sqlite3.connect(db) as c:
        return c.execute("SELECT id FROM api_tokens WHERE user = ? AND revoked_at IS NULL", (user,)).fetchone()[0]


def revoke(db, tid):
    r = subprocess.run([EXE, "token", "revoke", str(tid), "--db", db], capture_output=True, text=True, timeout=30)
    return r.returncode, r.stderr


def err(st, body, status, code):
    assert st == status, (st, body)
    assert isinstance(body, dict) and body["error"]["code"] == code, body


def test_roles_owners_and_audit():
    d = Daemon(config=ROOTS).start()
    try:
        port = d.port
        # no token anywhere, on loopback: an anonymous admin, as before users existed
        st, j0, _ = call(port, "POST", "/v1/jobs", body=spec(search={"steps": 5}))
        assert st == 201 and j0["owner"] is None, j0
        toks = {u: token(d.db, u, r) for u, r in [("alice", "submit"), ("bob", "submit"), ("carol", "read"), ("root", "admin")]}
        # stored hashed: no column holds a token's text, the hash is its SHA-256
        with sqlite3.connect(d.db) as c:
            rows = c.execute("SELECT user, role, hash, prefix FROM api_tokens").fetchall()
            dump = "\n".join(c.iterdump())
        for u, role, h, prefix in rows:
            assert h == hashlib.sha256(toks[u].encode()).hexdigest(), u
            assert toks[u].startswith(prefix) and len(prefix) == 12
        assert not any(t in dump for t in toks.values()), "a token's text is in the database"
        # from the first live token on, a token is needed: 401 with a JSON body and WWW-Authenticate
        for t in (None, "act_not-a-token-at-all-0123456789", toks["alice"] + "x"):
            st, b, hd = call(port, "GET", "/v1/jobs", token=t)
            err(st, b, 401, "unauthorized")
            assert hd.get("www-authenticate", "").startswith("Bearer"), hd
        # each submitter owns what it submits
        st, a, _ = call(port, "POST", "/v1/jobs", token=toks["alice"], body=spec(search={"steps": 5}))
        assert st == 201 and a["owner"] == "alice", a
        st, b, _ = call(port, "POST", "/v1/jobs", token=toks["bob"], body=spec(search={"steps": 6}))
        assert st == 201 and b["owner"] == "bob", b
        ids = lambda t: [j["id"] for j in call(port, "GET", "/v1/jobs", token=t)[1]["jobs"]]  # noqa: E731
        assert ids(toks["alice"]) == [a["id"]]
        assert ids(toks["bob"]) == [b["id"]]
        assert ids(toks["carol"]) == []
        assert ids(toks["root"]) == [j0["id"], a["id"], b["id"]]
        # another user's job is not there: every job route answers as for an id that does not exist
        _, unknown, _ = call(port, "GET", "/v1/jobs/999999", token=toks["alice"])
        for path in ("", "/events", "/result", "/log", "/files", "/files/report.json", "/report.html"):
            st, body, _ = call(port, "GET", f"/v1/jobs/{b['id']}{path}", token=toks["alice"])
            err(st, body, 404, "not_found")
            assert body == unknown, (path, body)
            st, body, _ = call(port, "GET", f"/v1/jobs/{j0['id']}{path}", token=toks["bob"])  # no owner: admins only
            assert st == 404, (path, st)
        st, body, _ = call(port, "GET", f"/v1/jobs/{b['id']}/events?access_token={toks['alice']}")
        err(st, body, 404, "not_found")
        st, body, _ = call(port, "DELETE", f"/v1/jobs/{b['id']}", token=toks["alice"])
        err(st, body, 404, "not_found")
        assert call(port, "GET", f"/v1/jobs/{b['id']}", token=toks["bob"])[1]["cancel_requested"] is False
        assert call(port, "GET", f"/v1/jobs/{a['id']}", token=toks["alice"])[0] == 200
        assert call(port, "GET", f"/v1/jobs/{b['id']}", token=toks["root"])[0] == 200
        # a role too low: 403 naming the roles; read can look, not submit or cancel
        st, body, _ = call(port, "POST", "/v1/jobs", token=toks["carol"], body=spec())
        err(st, body, 403, "forbidden")
        assert "carol has role read" in body["error"]["message"] and "needs role submit" in body["error"]["message"], body
        err(*call(port, "DELETE", f"/v1/jobs/{a['id']}", token=toks["carol"])[:2], 403, "forbidden")
        err(*call(port, "POST", "/v1/validate", token=toks["carol"], body=spec())[:2], 403, "forbidden")
        assert call(port, "GET", "/v1/devices", token=toks["carol"])[0] == 200
        assert call(port, "GET", "/v1/cost-tables", token=toks["carol"])[0] == 200
        st, body, _ = call(port, "POST", "/v1/cost-tables", token=toks["alice"], body={"key": "x"})
        err(st, body, 403, "forbidden")
        assert "needs role admin" in body["error"]["message"]
        # Idempotency-Keys are per user: the same key gives bob his own job, not alice's
        k = {"Idempotency-Key": "same-key-1"}
        st, ka, _ = call(port, "POST", "/v1/jobs", token=toks["alice"], body=spec(search={"steps": 7}), headers=k)
        assert st == 201
        st, kb, _ = call(port, "POST", "/v1/jobs", token=toks["bob"], body=spec(search={"steps": 7}), headers=k)
        assert st == 201 and kb["id"] != ka["id"] and kb["owner"] == "bob", kb
        st, again, _ = call(port, "POST", "/v1/jobs", token=toks["alice"], body=spec(search={"steps": 7}), headers=k)
        assert st == 200 and again["id"] == ka["id"], again
        # cancelling: one's own, and an admin anyone's
        assert call(port, "DELETE", f"/v1/jobs/{a['id']}", token=toks["alice"])[0] == 202
        assert call(port, "DELETE", f"/v1/jobs/{b['id']}", token=toks["root"])[0] == 202
        err(*call(port, "POST", "/v1/jobs", body=spec())[:2], 401, "unauthorized")
        # revoked: refused from the next request on; revoking twice is an error
        assert revoke(d.db, token_id(d.db, "alice"))[0] == 0
        err(*call(port, "GET", "/v1/jobs", token=toks["alice"])[:2], 401, "unauthorized")
        rc, msg = revoke(d.db, 1)
        assert rc == 1 and "no live token" in msg, msg
        # the audit log: who changed what, with the status; refusals for a role too; no reads
        with sqlite3.connect(d.db) as c:
            log = c.execute("SELECT user, role, action, target, status FROM audit_log ORDER BY id").fetchall()
        assert (None, None, "POST /v1/jobs", str(j0["id"]), 201) in log, log
        assert ("alice", "submit", "POST /v1/jobs", str(a["id"]), 201) in log, log
        assert ("bob", "submit", "POST /v1/jobs", str(b["id"]), 201) in log, log
        assert ("carol", "read", "POST /v1/jobs", None, 403) in log, log
        assert ("alice", "submit", f"DELETE /v1/jobs/{b['id']}", str(b["id"]), 404) in log, log
        assert ("root", "admin", f"DELETE /v1/jobs/{b['id']}", str(b["id"]), 202) in log, log
        assert ("alice", "submit", "POST /v1/jobs", str(ka["id"]), 200) in log, log  # the replayed submission
        assert not any(a_[2].startswith("GET ") for a_ in log), log
        assert not any(a_[4] == 401 for a_ in log), log  # unidentified callers fill no log
        cli = [r for r in log if r[2].startswith("token ")]
        assert [r[2] for r in cli] == ["token add"] * 4 + ["token revoke"], cli
        assert all(r[0].startswith("cli:") for r in cli), cli
        # GET /v1/audit: admins only (403 JSON for the others, logged as refusals), the database's rows page by page
        for u in ("bob", "carol"):
            err(*call(port, "GET", "/v1/audit", token=toks[u])[:2], 403, "forbidden")
        err(*call(port, "GET", "/v1/audit")[:2], 401, "unauthorized")
        err(*call(port, "GET", "/v1/audit?limit=0", token=toks["root"])[:2], 400, "bad_request")
        err(*call(port, "GET", "/v1/audit?limit=1001", token=toks["root"])[:2], 400, "bad_request")  # 1 to 1000
        assert call(port, "GET", "/v1/audit?limit=1000", token=toks["root"])[0] == 200
        with sqlite3.connect(d.db) as c:
            rows = c.execute("SELECT id, at, user, role, action, target, status FROM audit_log ORDER BY id").fetchall()
        assert ("bob", "submit", "GET /v1/audit", None, 403) in [r[2:] for r in rows], rows
        want = [dict(zip(("id", "at", "user", "role", "action", "target", "status"), r)) for r in rows]
        got, after = [], 0
        while True:
            st, page, _ = call(port, "GET", f"/v1/audit?limit=4&after={after}", token=toks["root"])
            assert st == 200 and len(page["entries"]) <= 4, page
            got += page["entries"]
            if page["next_after"] is None:
                break
            assert page["next_after"] == page["entries"][-1]["id"], page
            after = page["next_after"]
        assert len(got) == len(want) and len(want) > 8, (len(got), len(want))
        for g, w in zip(got, want):
            assert g == dict(w, at=g["at"]) and abs(g["at"] - w["at"]) < 1e-3, (g, w)
        st, page, _ = call(port, "GET", "/v1/audit?user=bob", token=toks["root"])
        assert st == 200 and [e["id"] for e in page["entries"]] == [w["id"] for w in want if w["user"] == "bob"], page
        assert page["next_after"] is None and page["entries"], page
    finally:
        d.cleanup()


def test_single_token_is_the_admin():
    tok = "single-shared-token-0123456789"
    d = Daemon(config=dict(ROOTS, tokens=[tok])).start()
    try:
        st, j, _ = call(d.port, "POST", "/v1/jobs", token=tok, body=spec(search={"steps": 5}))
        assert st == 201 and j["owner"] == "admin", j
        err(*call(d.port, "GET", "/v1/jobs")[:2], 401, "unauthorized")
        dave = token(d.db, "dave", "submit")  # users beside the shared token
        st, dj, _ = call(d.port, "POST", "/v1/jobs", token=dave, body=spec(search={"steps": 6}))
        assert st == 201 and dj["owner"] == "dave"
        assert [x["id"] for x in call(d.port, "GET", "/v1/jobs", token=tok)[1]["jobs"]] == [j["id"], dj["id"]]
        assert [x["id"] for x in call(d.port, "GET", "/v1/jobs", token=dave)[1]["jobs"]] == [dj["id"]]
        assert call(d.port, "GET", f"/v1/jobs/{j['id']}", token=dave)[0] == 404
        # the admin token may do what only admins may
        st, body, _ = call(d.port, "POST", "/v1/cost-tables", token=tok, body={"key": "x"})
        assert st != 403, body
    finally:
        d.cleanup()


def test_off_loopback_never_open():
    tmp = tempfile.mkdtemp(prefix="acusr_")
    db = os.path.join(tmp, "j.db")
    port = free_port()
    args = [EXE, "--listen", f"0.0.0.0:{port}", "--db", db, "--data-dir", tmp]
    r = subprocess.run(args, capture_output=True, text=True, timeout=20)
    assert r.returncode != 0 and "unauthenticated" in r.stderr, r.stderr
    tok = token(db, "erin", "read")  # a token in the store is enough to start
    log = open(os.path.join(tmp, "d.log"), "w")
    p = subprocess.Popen(args, stdout=log, stderr=log)
    try:
        for _ in range(200):
            try:
                if call(port, "GET", "/healthz")[0] == 200:
                    break
            except OSError:
                time.sleep(0.05)
        assert call(port, "GET", "/v1/jobs", token=tok)[0] == 200
        err(*call(port, "GET", "/v1/jobs")[:2], 401, "unauthorized")
        assert revoke(db, token_id(db, "erin"))[0] == 0
        # every token revoked: still no anonymous access off loopback
        err(*call(port, "GET", "/v1/jobs")[:2], 401, "unauthorized")
        err(*call(port, "GET", "/v1/jobs", token=tok)[:2], 401, "unauthorized")
    finally:
        p.kill()
        p.wait()
        log.close()
        subprocess.run(["rm", "-rf", tmp])


if __name__ == "__main__":
    if not os.path.exists(os.path.join(TINY, "config.json")):
        print("SKIP all: tiny model not built (make tiny-model)")
        print("RESULT 0 0 1")
        sys.exit(0)
    R = Runner()
    for t in (test_roles_owners_and_audit, test_single_token_is_the_admin, test_off_loopback_never_open):
        R.run(t)
    R.done()
