-- 002: Idempotency-Key of POST /v1/jobs, so a retrying client never
-- creates a second job; unique when present.
ALTER TABLE jobs ADD COLUMN idempotency_key TEXT;
CREATE UNIQUE INDEX jobs_idempotency ON jobs (idempotency_key) WHERE idempotency_key IS NOT NULL;
