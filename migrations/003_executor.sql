-- 003: the executor that runs a job (daemon/executor.h). NULL executor:
-- a local worker process (every job before 003). For a Slurm job: its
-- batch job's name and id, the last state Slurm reported, the per-job
-- secret its worker posts events with, and the sequence number of the
-- last worker event stored (events are stored once, in order).
ALTER TABLE jobs ADD COLUMN executor TEXT;
ALTER TABLE jobs ADD COLUMN slurm_job_id INTEGER;
ALTER TABLE jobs ADD COLUMN slurm_name TEXT;
ALTER TABLE jobs ADD COLUMN slurm_state TEXT;
ALTER TABLE jobs ADD COLUMN exec_secret TEXT;
ALTER TABLE jobs ADD COLUMN exec_seq INTEGER NOT NULL DEFAULT 0;
CREATE INDEX jobs_executor ON jobs (executor, state);
