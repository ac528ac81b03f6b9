-- When each scanner's last pass started, by the database's clock: the moment the
-- pass read as "now" to decide what was due (scan/once.py, scan_pass). verify
-- calls a due hold without a live lease a violation only when a pass that
-- succeeded started after the hold became due and after its lease lapsed;
-- before that, the hold is awaiting a scan.
--
-- Passes recorded before this migration keep NULL: when they started is
-- unknown, so they prove nothing (the scanner's next pass fills it in).
ALTER TABLE scan_passes ADD COLUMN IF NOT EXISTS started_at timestamptz;
-- result also takes 'failed' now: the pass raised after it reached the database
-- (ok, unconfirmed, stopped, failed; leases.py PassResult).
-- expiry_scan inserts whole rows (INSERT on the table covers the new column);
-- its upsert updates named columns only.
GRANT UPDATE (started_at) ON scan_passes TO expiry_scan;

-- status, verify and the console (expiry_operator), and a consumer at its start
-- (expiry_consumer), compare the applied migrations with the ones the code
-- ships, to say "not migrated" instead of failing on a missing table (a
-- consumer would otherwise retry, then dead-letter, every command). The
-- versions are no secret.
GRANT SELECT ON schema_migrations TO expiry_operator, expiry_consumer;
