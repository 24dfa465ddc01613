-- 005: a Slurm job's per-job secret is kept only as its SHA-256
-- (daemon/jobsecret.h): exec_secret_sha256, lowercase hex. The plaintext
-- exec_secret of 003 is no longer written; a row that still has one (a job
-- submitted before 005) is hashed and cleared when the daemon opens the
-- database (db.c: SQLite has no SHA-256 of its own). Ended jobs take no
-- more events: their secrets go now.
ALTER TABLE jobs ADD COLUMN exec_secret_sha256 TEXT;
UPDATE jobs SET exec_secret = NULL WHERE state IN ('succeeded', 'failed', 'cancelled');
