"""Shared helpers for the Python tests: a test runner that prints one line
per test and the RESULT line tests/run_all.sh adds up, and a Daemon that runs
build/autocompressd on a free loopback port with its own SQLite file."""
import html.parser
import http.client
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import traceback

ROOT = os.environ.get("AC_TEST_ROOT", os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
BUILD = os.path.abspath(os.environ.get("AC_BUILD", os.path.join(ROOT, "build")))
TINY = os.path.join(BUILD, "models", "tiny")
DATA = os.path.join(BUILD, "data")


def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    p = s.getsockname()[1]
    s.close()
    return p


def raw_conn(port, src="127.0.0.1", timeout=10):
    """A TCP connection to the daemon on loopback from address src (127.x.y.z: as if from another client)."""
    s = socket.socket()
    s.bind((src, 0))
    s.settimeout(timeout)
    s.connect(("127.0.0.1", port))
    return s


# AC_TEST_THREADS: the threads of every job the tests run (a daemon's worker_threads unless its test names them,
# `autocompress compress` through AC_THREADS); tests/run_all.sh sets 1 when its lanes run side by side (a lane, a
# core). Unset: the service's own default (2).
THREADS = int(os.environ.get("AC_TEST_THREADS") or 0)
if THREADS:
    os.environ["AC_THREADS"] = str(THREADS)


class Daemon:
    def __init__(self, config=None, workdir=None):
        self.dir = workdir or tempfile.mkdtemp(prefix="acd_")
        self.port = free_port()
        self.db = os.path.join(self.dir, "jobs.db")
        self.data = os.path.join(self.dir, "data")
        self.config = config
        self.proc = None
        self.token = None

    def start(self):
        if THREADS and (self.config is None or "worker_threads" not in self.config):
            self.config = dict(self.config or {}, worker_threads=THREADS)
        args = [os.path.join(BUILD, "autocompressd"), "--listen", f"127.0.0.1:{self.port}", "--db", self.db, "--data-dir", self.data,
                "--web-dir", os.path.join(ROOT, "web")]
        if self.config is not None:
            cp = os.path.join(self.dir, "config.json")
            with open(cp, "w") as f:
                json.dump(self.config, f)
            args[1:1] = ["--config", cp]
        self.log = open(os.path.join(self.dir, "daemon.log"), "ab")
        self.proc = subprocess.Popen(args, stdout=self.log, stderr=self.log)
        for _ in range(200):
            try:
                st, _ = self.req("GET", "/healthz")
                if st == 200:
                    return self
            except OSError:
                pass
            time.sleep(0.05)
        raise RuntimeError("daemon did not start: " + open(os.path.join(self.dir, "daemon.log")).read())

    def kill(self, sig=signal.SIGKILL):
        if self.proc and self.proc.poll() is None:
            self.proc.send_signal(sig)
            self.proc.wait(timeout=20)
        self.proc = None

    def stop(self):
        self.kill(signal.SIGTERM)

    def cleanup(self):
        self.kill()
        shutil.rmtree(self.dir, ignore_errors=True)

    def req(self, method, path, body=None, headers=None, raw=None, timeout=30):
        c = http.client.HTTPConnection("127.0.0.1", self.port, timeout=timeout)
        h = dict(headers or {})
        if self.token and "Authorization" not in h:
            h["Authorization"] = "Bearer " + self.token
        data = raw if raw is not None else (json.dumps(body).encode() if body is not None else None)
        if data is not None:  # the API wants a JSON content type on POST (DELETE needs none)
            h.setdefault("Content-Type", "application/json")
        c.request(method, path, body=data, headers=h)
        r = c.getresponse()
        payload = r.read()
        c.close()
        if method == "HEAD":  # headers only: (status, the headers)
            return r.status, {k.lower(): v for k, v in r.getheaders()}
        ctype = r.getheader("Content-Type") or ""
        if "json" in ctype:
            return r.status, json.loads(payload)
        return r.status, payload.decode(errors="replace")

    def wait_state(self, job, states, timeout=120):
        t0 = time.time()
        while time.time() - t0 < timeout:
            st, j = self.req("GET", f"/v1/jobs/{job}")
            if j["state"] in states:
                return j
            time.sleep(0.1)
        raise AssertionError(f"job {job} not in {states} after {timeout}s: {j['state']} ({j.get('reason')})")


def cli_estimate(req, timeout=120):
    """`autocompress estimate` on the request (a dict, written to a scratch
    file): its parsed answer; asserts the command succeeded."""
    with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as f:
        json.dump(req, f)
    try:
        out = subprocess.run([os.path.join(BUILD, "autocompress"), "estimate", f.name], capture_output=True, text=True,
                             timeout=timeout)
    finally:
        os.unlink(f.name)
    assert out.returncode == 0, out.stdout + out.stderr
    return json.loads(out.stdout)


def fit_architecture(pattern, s):
    """A structure of the config-only search ("fits") as an estimate's architecture on a nemotron_h layer pattern:
    each layer type keeps its first layers_kept_per_type layers, at the structure's widths."""
    kept = dict(s["layers_kept_per_type"])
    layers = []
    for c in pattern:
        t = {"M": "mamba", "*": "attention", "-": "mlp", "E": "moe"}[c]
        if kept.get(t, 0) <= 0:
            layers.append({"heads": 0, "kv_heads": 0, "ffn": 0})
            continue
        kept[t] -= 1
        L = {"heads": s["num_attention_heads"] if t == "attention" else 0,
             "kv_heads": s["num_query_groups"] if t == "attention" else 0,
             "ffn": s["ffn_hidden_size"] if t == "mlp" else 0,
             "ssm_heads": s["mamba_num_heads"] if t == "mamba" else 0}
        if t == "moe":
            L["experts"], L["expert_ffn"] = s["num_moe_experts"], s["moe_ffn_hidden_size"]
        layers.append(L)
    return {"hidden": s["hidden_size"], "ssm_head_dim": s["mamba_head_dim"], "layers": layers}


def spec(**kw):
    """A job on the tiny model. Its gate search takes 40 steps (the service's default is 300: about 4/5 of a test
    job's time), unless the test names dnas_steps or keeps a job running (search.steps >= 1000): the tests of the
    search itself (test_dnas_gain, test_dnas_api, test_kd_budget, bench/) set their own."""
    s = {"model": TINY, "calibration": os.path.join(DATA, "calib.txt"), "heldout": os.path.join(DATA, "heldout.txt"),
         "target": {"device": "H100", "workload": {"batch": 1, "prompt_len": 256, "gen_len": 64}},
         "constraints": {"max_params": 1.0e6}, "search": {"steps": 50, "seed": 3},
         "calibration_tokens": 2048, "eval": {"ctx": 64, "windows": 4}}
    s.update(kw)
    if isinstance(s.get("search"), dict) and s["search"].get("steps", 0) < 1000:
        s["search"] = dict({"dnas_steps": 40}, **s["search"])
    return s


def engine_ppl(d, text, ctx, windows):
    """Our engine's perplexity of the checkpoint (or GGUF) d on text: `autocompress eval` with exact GEMMs,
    non-overlapping windows of ctx tokens, the first `windows` of them."""
    out = subprocess.run([os.path.join(BUILD, "autocompress"), "eval", d, text, "--ctx", str(ctx), "--windows",
                          str(windows), "--gemm", "exact", "--json"], capture_output=True, text=True, check=True).stdout
    return json.loads(out)["ppl"]


def export_ppl(rep, out):
    """`autocompress eval` of the export in out under the report's evaluation protocol (its text, ctx and windows)
    with the job's own GEMMs (the default ones, as its evaluate stage runs them): what the report's perplexity of the
    exported arm must be, the report describing the model the user gets."""
    ep = rep["eval_protocol"]
    r = subprocess.run([os.path.join(BUILD, "autocompress"), "eval", out, ep["text"], "--ctx", str(ep["ctx"]),
                        "--windows", str(ep["windows"]), "--json"], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)["ppl"]


def ref_ppl(d, text, ctx, windows):
    """The float64 PyTorch reference's perplexity (tests/ref_llama.py: every family it knows) of the safetensors
    checkpoint d over the engine_ppl protocol (text tokenised by d's tokenizer.json with our tokenizer)."""
    import math

    import torch

    import ref_llama as R
    out = subprocess.run([os.path.join(BUILD, "autocompress"), "tokenize", os.path.join(d, "tokenizer.json"), text],
                         capture_output=True, text=True, check=True).stdout
    ids = [int(x) for x in out.split()]
    arch = R.arch_from_config(json.load(open(os.path.join(d, "config.json"))))
    W = {}
    for f in sorted(os.listdir(d)):
        if f.endswith(".safetensors"):
            W.update({k: v.double() for k, v in R.load_safetensors(os.path.join(d, f)).items()})
    nll, cnt = 0.0, 0
    for w in range(windows):
        x = torch.tensor([ids[w * ctx:(w + 1) * ctx]])
        with torch.no_grad():
            lp = torch.log_softmax(R.forward(arch, W, x)[0], -1)
        for t in range(ctx - 1):
            nll -= lp[t, x[0, t + 1]].item()
            cnt += 1
    return math.exp(nll / cnt)


def limit_verdict(report, arm, name):
    """"met" or "missed": the arm's verdict on limit name as the report says it (the base's from its predicted
    figure, which the report does not judge), what every page showing the report must state."""
    c = report[report["chosen"]]["constraints"][name]
    if arm != "baseline":
        return "met" if report[arm]["constraints"][name]["met"] else "missed"
    v = report["baseline"]["predicted"][name]
    return "met" if (v >= c["limit"] if c["kind"] == "min" else v <= c["limit"]) else "missed"


def run_with_daemon(tests, module_globals, config=None):
    """The main of a test file whose tests share one daemon (its global D): skip all without the tiny model, else start
    the daemon (one CPU slot, model_roots the build folder and /tmp), run the tests, clean up, print RESULT."""
    if not os.path.exists(os.path.join(TINY, "config.json")):
        print("SKIP all: tiny model not built (make tiny-model)")
        print("RESULT 0 0 1")
        sys.exit(0)
    r = Runner()
    cfg = config or {"cpu_slots": 1, "model_roots": [os.path.dirname(os.path.dirname(TINY)), "/tmp"]}
    module_globals["D"] = Daemon(config=cfg).start()
    try:
        for t in tests:
            r.run(t)
    finally:
        module_globals["D"].cleanup()
    r.done()


class Runner:
    def __init__(self):
        self.passed = self.failed = self.skipped = 0

    def run(self, fn):
        t0 = time.monotonic()
        try:
            r = fn()
            if isinstance(r, str) and (r == "skip" or r.startswith("skip: ")):  # "skip: why" says why
                self.skipped += 1
                print(f"SKIP {fn.__name__}{r[4:]}", flush=True)
            else:
                self.passed += 1
                print(f"ok   {fn.__name__} ({time.monotonic() - t0:.1f} s)", flush=True)
        except Exception:
            self.failed += 1
            print(f"FAIL {fn.__name__} ({time.monotonic() - t0:.1f} s)", flush=True)
            traceback.print_exc(file=sys.stdout)

    def done(self):
        print(f"RESULT {self.passed} {self.failed} {self.skipped}")
        sys.exit(1 if self.failed else 0)


def sse_read(port, path, headers=None, until=None, max_s=20):
    """Read an SSE stream; returns (events, comments). until(events) -> stop."""
    s = socket.create_connection(("127.0.0.1", port), timeout=max_s)
    hdr = "".join(f"{k}: {v}\r\n" for k, v in (headers or {}).items())
    s.sendall(f"GET {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nAccept: text/event-stream\r\n{hdr}\r\n".encode())
    buf = b""
    t0 = time.time()
    events, comments = [], []
    head_done = False
    body = b""
    while time.time() - t0 < max_s:
        try:
            chunk = s.recv(65536)
        except socket.timeout:
            break
        if not chunk:
            break
        buf += chunk
        if not head_done:
            if b"\r\n\r\n" not in buf:
                continue
            head, buf = buf.split(b"\r\n\r\n", 1)
            head_done = True
            status = int(head.split(b" ")[1])
            if status != 200:
                s.close()
                return status, [], []
        body += buf
        buf = b""
        # de-chunk lazily: strip chunk-size lines
        text = _dechunk(body)
        events, comments = _parse_sse(text)
        if until and until(events, comments):
            break
    s.close()
    return 200, events, comments


def _dechunk(b):
    out, i = b"", 0
    while True:
        j = b.find(b"\r\n", i)
        if j < 0:
            break
        try:
            n = int(b[i:j], 16)
        except ValueError:
            break
        if n == 0 or j + 2 + n > len(b):
            break
        out += b[j + 2: j + 2 + n]
        i = j + 2 + n + 2
    return out.decode(errors="replace")


def _parse_sse(text):
    events, comments = [], []
    for block in text.split("\n\n")[:-1]:  # the last piece may be incomplete
        ev = {}
        for line in block.split("\n"):
            if line.startswith(":"):
                comments.append(line)
            elif line.startswith("id: "):
                ev["id"] = int(line[4:])
            elif line.startswith("event: "):
                ev["event"] = line[7:]
            elif line.startswith("data: "):
                ev["data"] = json.loads(line[6:])
        if "id" in ev and "data" in ev:
            events.append(ev)
    return events, comments


class Tables(html.parser.HTMLParser):
    """A report.html page: its tables by id as rows of (class, text) cells, its curves as {figcaption: [points]} (each
    polyline's points, as "x,y" strings), and whatever it would fetch or run (a script, src, href, url())."""

    def __init__(self, page):
        super().__init__()
        self.tables, self.cur, self.cell, self.fetches, self.curves = {}, None, None, [], {}
        self.caption = self.last_caption = None
        self.feed(page)

    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        if tag == "script" or any(k in ("src", "href") for k in a) or "url(" in a.get("style", ""):
            self.fetches.append((tag, attrs))
        if tag == "table":
            self.cur = self.tables.setdefault(a.get("id"), [])
        elif tag == "tr" and self.cur is not None:
            self.cur.append([])
        elif tag in ("td", "th") and self.cur is not None:
            self.cell = [a.get("class") or "", ""]
        elif tag == "figcaption":
            self.caption = ""
        elif tag == "polyline":
            self.curves[self.last_caption] = a["points"].split()

    def handle_endtag(self, tag):
        if tag in ("td", "th") and self.cell is not None:
            self.cur[-1].append((self.cell[0], self.cell[1].strip()))
            self.cell = None
        elif tag == "table":
            self.cur = None
        elif tag == "figcaption":
            self.last_caption, self.caption = self.caption, None

    def handle_data(self, data):
        if self.cell is not None:
            self.cell[1] += data
        if self.caption is not None:
            self.caption += data


def curve_points(pts):
    """Where report.html draws the curve through pts ([(step, loss), ...]): a 500 x 200 plot, 46 px left and 20 px
    bottom margins, 4 px top and right; steps across, the loss up, each over its range; at most 400 points (every
    k-th). As (x, y) pairs, to compare with a polyline's points within their 0.1 px rounding."""
    xs, ys = [p[0] for p in pts], [p[1] for p in pts]
    x0, x1, y0, y1 = min(xs), max(xs), min(ys), max(ys)
    x1 = x1 if x1 > x0 else x0 + 1
    y1 = y1 if y1 > y0 else y0 + 1
    k = -(-len(pts) // 400) if len(pts) > 400 else 1
    return [(46 + 450 * (x - x0) / (x1 - x0), 4 + 176 * (1 - (y - y0) / (y1 - y0))) for x, y in pts[::k]]


def same_curve(drawn, pts):
    """A polyline's points (Tables.curves) are curve_points(pts), each within 0.06 px."""
    want = curve_points(pts)
    got = [tuple(float(v) for v in p.split(",")) for p in drawn]
    return len(got) == len(want) and all(abs(a - c) < 0.06 and abs(b - d) < 0.06 for (a, b), (c, d) in zip(got, want))


def job_curves(d, job):
    """The loss curves in job's stored events (daemon d): the search loss [(step, loss)] of the gate trainer (phase
    dnas: its task_loss) or the Lagrangian search (phase autocompress: its loss), {arm: [(step, loss)]} of
    distillation, and the search curve's caption."""
    st, evs = d.req("GET", f"/v1/jobs/{job}/events?format=json&limit=10000")
    assert st == 200, evs
    search, distill, label = [], {}, "search loss"
    for e in evs["events"]:
        x = e["data"]
        if e["kind"] == "search" and x.get("phase") in ("dnas", "autocompress"):
            dnas = x["phase"] == "dnas"
            search.append((x["step"], x["task_loss" if dnas else "loss"]))
            label = "search: distillation KL of the gated model" if dnas else "search: Lagrangian"
        elif e["kind"] == "distill":
            distill.setdefault(x["arm"], []).append((x["step"], x["loss"]))
    return search, distill, label


def check_report_page(page, rep):
    """What report.html states against report.json: the chosen arm marked, every limit met or missed per arm (the
    base's from its predicted figure), all limits met as each arm's feasibility, the perplexities (an arm that missed a
    limit says so), the structure per layer."""
    t = Tables(page)
    assert not t.fetches, t.fetches  # self-contained: no script, nothing fetched
    # no address of the network anywhere in it (a stylesheet's @import or url() included); the SVG namespace is a name
    urls = set(re.findall(r"\w+://[^\s\"'<>)]*", page)) - {"http://www.w3.org/2000/svg"}
    assert not urls and "@import" not in page, urls
    arms = ["baseline", "minitron", "autocompress"]
    head = t.tables["limits"][0][1:]
    assert [x.split()[0] for _, x in head] == arms, head
    assert [a for a, (_, x) in zip(arms, head) if "(chosen, exported)" in x] == [rep["chosen"]], head
    rows = {r[0][1]: r[1:] for r in t.tables["limits"][1:]}
    for name in rep[rep["chosen"]]["constraints"]:
        cells = next(v for k, v in rows.items() if k.startswith(name + " "))
        for a, (cls, txt) in zip(arms, cells):
            want = limit_verdict(rep, a, name)
            assert want in cls.split() and txt.endswith(want), (name, a, cls, txt)
    assert [x for _, x in rows["all limits met"][1:]] == ["yes" if rep[a]["feasible"] else "no" for a in arms[1:]]
    q = {r[0][1]: r[1:] for r in t.tables["quality"][1:]}
    for a, (cls, txt) in zip(arms, q["perplexity"]):
        assert txt.startswith(f"{rep[a]['perplexity']:.4f}"), (a, txt)
        assert ("missed a limit" in txt) == (a != "baseline" and not rep[a]["feasible"]), (a, txt)
    layers = [r[1:] for r in t.tables["structure"][1:]]
    base = rep["model"]["architecture"]["layers"]
    assert len(layers) == len(base)
    for i, cells in enumerate(layers):
        nums = [int(x) for x in re.findall(r"\d+", cells[2][1])]
        assert nums == [base[i]["ffn"], rep["minitron"]["architecture"]["layers"][i]["ffn"],
                        rep["autocompress"]["architecture"]["layers"][i]["ffn"]], (i, cells[2])
    # eval.tasks: a row per task, each arm's acc +- stderr and acc_norm (and before distillation, where it ran)
    names = rep["baseline"].get("tasks", {})
    assert ("tasks" in t.tables) == bool(names), (list(t.tables), names)
    rows = {r[0][1]: r[1:] for r in t.tables.get("tasks", [])[1:]}
    assert sorted(rows) == sorted(f"{k} (n = {v['n']})" for k, v in names.items()), (list(rows), names)
    for k, v in names.items():
        for a, (_, txt) in zip(arms, rows[f"{k} (n = {v['n']})"]):
            x, y = rep[a]["tasks"][k], rep[a].get("tasks_pruned", {}).get(k)
            want = f"{x['acc']:.4f} \u00b1 {x['stderr']:.4f}, acc_norm {x['acc_norm']:.4f}"
            if y:
                want += f" (before distillation {y['acc']:.4f}, acc_norm {y['acc_norm']:.4f})"
            assert txt == want, (k, a, txt, want)
    return t
