"""A client for the AutoCompress daemon's REST API, standard library only.

>>> c = Client("http://127.0.0.1:8321")
>>> job = c.submit(spec)
>>> final = c.wait(job["id"], on_event=print)
>>> c.report(job["id"])["chosen"]

Every call that the API refuses raises :class:`ApiError` (HTTP status, error code, message, field at fault and the
whole body); an unreachable server raises :class:`ConnectionError`. :meth:`Client.events` reads the job's
server-sent events and, after a dropped connection, reconnects with ``Last-Event-ID`` so that no event is lost or
repeated.
"""
from __future__ import annotations

import json
import os
import socket
import time
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass
from typing import Any, Callable, Dict, Iterator, List, Optional

__all__ = ["Client", "ApiError", "JobFailed", "Event", "DEFAULT_SERVER", "__version__"]
__version__ = "0.1.0"

DEFAULT_SERVER = "http://127.0.0.1:8321"
TERMINAL = ("succeeded", "failed", "cancelled")


class ApiError(Exception):
    """The API answered with an error: ``status`` (HTTP), ``code``, ``message``, ``field`` (the request field at
    fault, or None) and ``body`` (the parsed error body, or its text)."""

    def __init__(self, status: int, body: Any):
        self.status = status
        self.body = body
        err = body.get("error", {}) if isinstance(body, dict) else {}
        self.code: Optional[str] = err.get("code")
        self.message: str = err.get("message") or (body if isinstance(body, str) else "")
        self.field: Optional[str] = err.get("field")
        where = f" (field {self.field})" if self.field else ""
        super().__init__(f"{status} {self.code or 'error'}: {self.message}{where}")


class JobFailed(Exception):
    """:meth:`Client.wait` on a job that ended failed or cancelled: ``job`` (the final job), ``state``, ``reason``."""

    def __init__(self, job: Dict[str, Any]):
        self.job = job
        self.state: str = job.get("state", "")
        self.reason: str = job.get("reason") or ""
        super().__init__(f"job {job.get('id')} {self.state}: {self.reason}")


@dataclass(frozen=True)
class Event:
    """One stored event of a job (see proto/events.md): its global ``id``, ``kind`` and ``data``."""

    id: int
    kind: str
    data: Any


class Client:
    """The daemon at ``url`` (default ``$AUTOCOMPRESS_SERVER``, else http://127.0.0.1:8321), with the bearer
    ``token`` (default ``$AUTOCOMPRESS_TOKEN``); ``timeout`` is each request's socket timeout in seconds."""

    def __init__(self, url: Optional[str] = None, token: Optional[str] = None, timeout: float = 60.0):
        url = url or os.environ.get("AUTOCOMPRESS_SERVER") or DEFAULT_SERVER
        if "://" not in url:
            url = "http://" + url
        self.url = url.rstrip("/")
        self.token = token if token is not None else os.environ.get("AUTOCOMPRESS_TOKEN") or None
        self.timeout = timeout

    # ---- plumbing ----

    def _open(self, method: str, path: str, body: Any = None, headers: Optional[Dict[str, str]] = None,
              timeout: Optional[float] = None):
        h = {"Accept": "application/json", "User-Agent": f"autocompress-client/{__version__}"}
        if self.token:
            h["Authorization"] = "Bearer " + self.token
        data = None
        if body is not None:
            data = json.dumps(body).encode()
        if body is not None or method == "POST":  # the API wants a JSON content type there (DELETE: none)
            h["Content-Type"] = "application/json"
        h.update(headers or {})
        req = urllib.request.Request(self.url + path, data=data, method=method, headers=h)
        try:
            return urllib.request.urlopen(req, timeout=timeout or self.timeout)
        except urllib.error.HTTPError as e:
            raw = e.read().decode(errors="replace")
            try:
                parsed: Any = json.loads(raw)
            except ValueError:
                parsed = raw
            raise ApiError(e.code, parsed) from None
        except urllib.error.URLError as e:
            raise ConnectionError(f"{self.url}: {e.reason}") from None

    def _json(self, method: str, path: str, body: Any = None, headers: Optional[Dict[str, str]] = None) -> Any:
        with self._open(method, path, body, headers) as r:
            return json.loads(r.read())

    # ---- jobs ----

    def submit(self, spec: Dict[str, Any], idempotency_key: Optional[str] = None) -> Dict[str, Any]:
        """Submit a job spec (POST /v1/jobs); returns the job. With ``idempotency_key`` a retry with the same key
        and spec returns the first job instead of a second one."""
        return self._json("POST", "/v1/jobs", spec, {"Idempotency-Key": idempotency_key} if idempotency_key else None)

    def validate(self, spec: Dict[str, Any]) -> Dict[str, Any]:
        """What submit would answer, without the job (POST /v1/validate): ``{"ok": True}`` or an ApiError."""
        return self._json("POST", "/v1/validate", spec)

    def job(self, job_id: int) -> Dict[str, Any]:
        """The job: state, reason, spec, transitions (GET /v1/jobs/ID)."""
        return self._json("GET", f"/v1/jobs/{int(job_id)}")

    def jobs(self, state: Optional[str] = None, page_size: int = 100) -> Iterator[Dict[str, Any]]:
        """Every job, oldest first, over every page (GET /v1/jobs), optionally only those in ``state``."""
        after = 0
        while True:
            q = {"limit": page_size, "after": after}
            if state:
                q["state"] = state
            page = self._json("GET", "/v1/jobs?" + urllib.parse.urlencode(q))
            yield from page["jobs"]
            if page.get("next_after") is None:
                return
            after = page["next_after"]

    def cancel(self, job_id: int) -> Dict[str, Any]:
        """Cancel a queued or running job (DELETE /v1/jobs/ID); returns the job. ApiError 409 when it ended."""
        return self._json("DELETE", f"/v1/jobs/{int(job_id)}")

    def report(self, job_id: int) -> Dict[str, Any]:
        """The report of a succeeded job (GET /v1/jobs/ID/result): baseline, minitron, autocompress, chosen."""
        return self._json("GET", f"/v1/jobs/{int(job_id)}/result")

    result = report

    def report_html(self, job_id: int) -> str:
        """The report of a succeeded job as one self-contained HTML page (GET /v1/jobs/ID/report.html): the arms
        side by side, every limit met or missed, quality before and after, predicted and measured cost, the
        structure per layer and the loss curves. Write it to a file to open or attach it."""
        with self._open("GET", f"/v1/jobs/{int(job_id)}/report.html") as r:
            return r.read().decode()

    def log(self, job_id: int) -> str:
        """The worker's text log (GET /v1/jobs/ID/log)."""
        with self._open("GET", f"/v1/jobs/{int(job_id)}/log") as r:
            return r.read().decode(errors="replace")

    def files(self, job_id: int) -> List[Dict[str, Any]]:
        """The files a finished job exported: ``[{"name", "size"}]`` (GET /v1/jobs/ID/files)."""
        return self._json("GET", f"/v1/jobs/{int(job_id)}/files")["files"]

    def download(self, job_id: int, directory: str) -> List[str]:
        """Copy the job's exported files into ``directory`` (created if missing); returns their paths. Each file is
        written as NAME.part and renamed once its size matches the listing."""
        os.makedirs(directory, exist_ok=True)
        out = []
        for f in self.files(job_id):
            name = f["name"]
            if "/" in name or name.startswith("."):
                raise ValueError(f"the server listed an unexpected file name {name!r}")
            path = os.path.join(directory, name)
            with self._open("GET", f"/v1/jobs/{int(job_id)}/files/{urllib.parse.quote(name)}") as r, \
                    open(path + ".part", "wb") as fh:
                while True:
                    chunk = r.read(1 << 20)
                    if not chunk:
                        break
                    fh.write(chunk)
            if os.path.getsize(path + ".part") != f["size"]:
                os.remove(path + ".part")
                raise IOError(f"{name}: got {os.path.getsize(path + '.part')} bytes, the server listed {f['size']}")
            os.replace(path + ".part", path)
            out.append(path)
        return out

    def events(self, job_id: int, after: int = 0, reconnect_s: float = 300.0, read_timeout: float = 60.0,
               deadline: Optional[float] = None) -> Iterator[Event]:
        """The job's events as they come (server-sent events, GET /v1/jobs/ID/events), from after event ``after``,
        until the job's final ``state`` event. After a dropped connection (or ``read_timeout`` seconds without a
        byte; the daemon sends a keep-alive every sse_keepalive_s) it reconnects with ``Last-Event-ID``, waiting the
        stream's ``retry``; it gives up with ConnectionError after ``reconnect_s`` seconds without a connection, and
        raises TimeoutError once ``time.monotonic()`` passes ``deadline``."""
        last, retry_s, down_since = after, 2.0, None
        while True:
            headers = {"Accept": "text/event-stream"}
            if last > 0:
                headers["Last-Event-ID"] = str(last)
            try:
                r = self._open("GET", f"/v1/jobs/{int(job_id)}/events", headers=headers, timeout=read_timeout)
            except ApiError as e:
                if e.status != 503:  # too many streams: retry; anything else is an answer
                    raise
                r = None
            except ConnectionError:
                r = None
            if r is not None:
                down_since = None
                try:
                    with r:
                        kind, data, eid = "message", [], None
                        for raw in r:
                            if deadline is not None and time.monotonic() > deadline:
                                raise TimeoutError(f"job {job_id} did not end in time")
                            line = raw.decode(errors="replace").rstrip("\r\n")
                            if line == "":
                                if data or eid is not None:
                                    ev = Event(eid if eid is not None else 0, kind, json.loads("\n".join(data)))
                                    if eid is not None:
                                        last = eid
                                    yield ev
                                    if ev.kind == "state" and isinstance(ev.data, dict) and \
                                            ev.data.get("state") in TERMINAL:
                                        return
                                kind, data, eid = "message", [], None
                            elif line.startswith(":"):
                                continue
                            else:
                                field, _, value = line.partition(":")
                                value = value[1:] if value.startswith(" ") else value
                                if field == "data":
                                    data.append(value)
                                elif field == "event":
                                    kind = value
                                elif field == "id" and value.isdigit():
                                    eid = int(value)
                                elif field == "retry" and value.isdigit():
                                    retry_s = int(value) / 1000.0
                except (OSError, socket.timeout, ValueError):
                    pass  # dropped mid-stream: resume after the last event
            if deadline is not None and time.monotonic() > deadline:
                raise TimeoutError(f"job {job_id} did not end in time")
            if down_since is None:
                down_since = time.monotonic()
            elif time.monotonic() - down_since > reconnect_s:
                raise ConnectionError(f"{self.url}: no event stream for {reconnect_s:.0f} s (job {job_id})")
            time.sleep(min(retry_s, 30.0))

    def wait(self, job_id: int, on_event: Optional[Callable[[Event], None]] = None, timeout: Optional[float] = None,
             raise_on_failure: bool = True) -> Dict[str, Any]:
        """Follow the job to its end, calling ``on_event`` with every event (from the first); returns the final job.
        Raises JobFailed when it failed or was cancelled (unless ``raise_on_failure`` is False) and TimeoutError
        after ``timeout`` seconds."""
        deadline = time.monotonic() + timeout if timeout is not None else None
        for ev in self.events(job_id, read_timeout=min(60.0, timeout) if timeout else 60.0, deadline=deadline):
            if on_event:
                on_event(ev)
        job = self.job(job_id)
        if raise_on_failure and job["state"] != "succeeded":
            raise JobFailed(job)
        return job

    # ---- the rest of the API ----

    def estimate(self, request: Dict[str, Any]) -> Dict[str, Any]:
        """Predicted TTFT, TPOT, throughput, memory and max batch (POST /v1/estimate): ``{"model": DIR}`` or
        ``{"architecture": {...}}`` with a ``target``."""
        return self._json("POST", "/v1/estimate", request)

    def devices(self) -> Dict[str, Any]:
        """Local CPU and GPUs, GPU spec profiles, scheduler slots (GET /v1/devices)."""
        return self._json("GET", "/v1/devices")

    def cost_tables(self) -> List[Dict[str, Any]]:
        """The cached cost tables (GET /v1/cost-tables)."""
        return self._json("GET", "/v1/cost-tables")["tables"]

    def health(self) -> Dict[str, Any]:
        """GET /healthz (an ApiError 503 while degraded)."""
        return self._json("GET", "/healthz")

    def openapi(self) -> Dict[str, Any]:
        """The API's OpenAPI 3.1 document (GET /openapi.json)."""
        return self._json("GET", "/openapi.json")
