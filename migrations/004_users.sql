-- 004: users, their API tokens and roles, who owns each job, and the audit
-- log. A token is stored as the SHA-256 of its text (hex), never the text;
-- the first characters are kept to tell tokens apart in listings. Roles:
-- read (GET), submit (read + submit, validate, estimate, cancel own jobs),
-- admin (everything, every user's jobs). A revoked token stays listed.
CREATE TABLE api_tokens (
    id         INTEGER PRIMARY KEY AUTOINCREMENT,
    user       TEXT NOT NULL,
    role       TEXT NOT NULL CHECK (role IN ('read','submit','admin')),
    hash       TEXT NOT NULL UNIQUE,
    prefix     TEXT NOT NULL,
    created_at REAL NOT NULL,
    revoked_at REAL
);
CREATE INDEX api_tokens_user ON api_tokens (user);

-- The user whose token submitted the job; NULL: submitted without tokens
-- (a loopback daemon with none configured) or before 004, seen by admins.
ALTER TABLE jobs ADD COLUMN owner TEXT;
CREATE INDEX jobs_owner ON jobs (owner, id);

-- Who did what: every request that changes something (POST, PUT, DELETE),
-- every refusal for a role (403), and the token commands. user NULL: no
-- tokens configured; status: the HTTP status (0 for a command).
CREATE TABLE audit_log (
    id      INTEGER PRIMARY KEY AUTOINCREMENT,
    at      REAL NOT NULL,
    user    TEXT,
    role    TEXT,
    action  TEXT NOT NULL,
    target  TEXT,
    status  INTEGER NOT NULL
);
CREATE INDEX audit_log_user ON audit_log (user, id);
