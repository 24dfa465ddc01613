-- 001: jobs, their state transitions, progress events, cost-table cache.
CREATE TABLE jobs (
    id            INTEGER PRIMARY KEY AUTOINCREMENT,
    name          TEXT,
    state         TEXT NOT NULL CHECK (state IN ('queued','running','succeeded','failed','cancelled')),
    priority      INTEGER NOT NULL DEFAULT 0,
    spec          TEXT NOT NULL,
    device        TEXT,             -- device the job runs (ran) on
    reason        TEXT,             -- why it waits / why it failed
    result        TEXT,             -- report JSON when succeeded
    attempts      INTEGER NOT NULL DEFAULT 0,
    worker_pid    INTEGER,
    cancel_requested INTEGER NOT NULL DEFAULT 0,
    created_at    REAL NOT NULL,
    updated_at    REAL NOT NULL,
    started_at    REAL,
    finished_at   REAL
);
CREATE INDEX jobs_queue ON jobs (state, priority DESC, id);

CREATE TABLE job_transitions (
    id         INTEGER PRIMARY KEY AUTOINCREMENT,
    job_id     INTEGER NOT NULL REFERENCES jobs (id),
    from_state TEXT,
    to_state   TEXT NOT NULL,
    at         REAL NOT NULL,
    reason     TEXT
);
CREATE INDEX job_transitions_job ON job_transitions (job_id, id);

CREATE TABLE events (
    id      INTEGER PRIMARY KEY AUTOINCREMENT,
    job_id  INTEGER NOT NULL REFERENCES jobs (id),
    kind    TEXT NOT NULL,
    data    TEXT NOT NULL,
    at      REAL NOT NULL
);
CREATE INDEX events_job ON events (job_id, id);

CREATE TABLE cost_tables (
    key        TEXT PRIMARY KEY,    -- device identity | dtype | engine | version
    device     TEXT NOT NULL,
    dtype      TEXT NOT NULL,
    engine     TEXT NOT NULL,
    version    INTEGER NOT NULL,
    source     TEXT NOT NULL,       -- measured | roofline | imported
    created_at REAL NOT NULL,
    hits       INTEGER NOT NULL DEFAULT 0,
    data       TEXT NOT NULL
);
