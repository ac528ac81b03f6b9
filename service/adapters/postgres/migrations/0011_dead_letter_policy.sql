-- Each dead letter keeps the retry policy in force where it was recorded (the
-- recording consumer's own settings, never the message's headers): NULL for
-- records made before this migration. And a dead letter gets its default owner
-- (EXPIRY_DEAD_LETTER_OWNERS) when the recorder records it, audited like an
-- operator's assignment.
ALTER TABLE dead_letters ADD COLUMN IF NOT EXISTS policy jsonb;

-- expiry_consumer: the recorder writes the policy (RECORD_DEAD_LETTER names it
-- as a parameter, never as EXCLUDED.policy, so it needs no SELECT on it), and
-- assigns the default owner only where there is none (ASSIGN_DEFAULT_OWNER: a
-- guarded update that reads the owner and the record's id), appending the
-- event; the database fills in the event's id, `at` and `db_user`. It still
-- cannot read, edit or delete an audit row, nor change a record's note. The
-- gauges count open dead letters without an owner (the same SELECT on owner).
GRANT INSERT (policy) ON dead_letters TO expiry_consumer;
GRANT UPDATE (policy, owner) ON dead_letters TO expiry_consumer;
GRANT SELECT (id, owner) ON dead_letters TO expiry_consumer;
GRANT INSERT (dead_letter_id, kind, operator, detail) ON dead_letter_events TO expiry_consumer;
