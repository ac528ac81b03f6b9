-- Every webhook attempt, recorded (docs/webhooks.md, "The attempt log"; issue 44): so
-- that "did you send us X, when, and what did we answer?" has an answer, and verify can
-- prove that every event reached every endpoint registered when it was written.
--
-- webhook_attempts: one row per attempt, written by the deliverer in the same statement
-- that settles it (also when its claim had lapsed: the request went out all the same):
-- the endpoint, the event's message id (the webhook-id), the attempt's number, what
-- made it (automatic, a probe after a pause, a replay, a backfill), the answer's status
-- or the error's class, how long it took, and which deliverer made it. Never a body, a
-- URL or a secret. An audit table: append-only, partitioned by week on `at`, made
-- ahead and dropped by python -m service.retention with the rest of the audit trail.
--
-- webhook_deliveries.origin: what made the delivery (the trigger: automatic; an
-- operator's replay: replay; python -m service.deliver --backfill: backfill), so that
-- its attempts say so.
ALTER TABLE webhook_deliveries ADD COLUMN IF NOT EXISTS origin text NOT NULL DEFAULT 'automatic';

CREATE TABLE IF NOT EXISTS webhook_attempts (
    id          bigint GENERATED ALWAYS AS IDENTITY,
    at          timestamptz NOT NULL DEFAULT now(),  -- recorded, once it was answered
    endpoint    text NOT NULL,
    message_id  text NOT NULL,        -- the event's: the webhook-id sent
    attempt     integer NOT NULL,     -- its delivery's, from 1 (a replay starts again)
    kind        text NOT NULL,        -- automatic, probe, replay or backfill
    status      integer,              -- the HTTP status answered (none: no answer)
    error_class text,                 -- none: delivered (2xx)
    duration_ms real NOT NULL,        -- from the request to the answer read
    deliverer   text NOT NULL,        -- EXPIRY_WORKER_ID of the deliverer
    PRIMARY KEY (id, at)
) PARTITION BY RANGE (at);
CREATE INDEX IF NOT EXISTS webhook_attempts_by_message ON webhook_attempts (message_id);
SELECT expiry_guard_audit('webhook_attempts', 'expiry_append_only');
SELECT expiry_make_weeks('webhook_attempts', interval '28 days');

REVOKE ALL ON TABLE webhook_attempts
    FROM PUBLIC, expiry_consumer, expiry_scan, expiry_operator, expiry_relay, expiry_deliver;
GRANT INSERT (endpoint, message_id, attempt, kind, status, error_class, duration_ms, deliverer)
    ON webhook_attempts TO expiry_deliver;
-- The operator's view of an event (python -m service.attempts, the console) and verify.
GRANT SELECT ON webhook_attempts TO expiry_operator;
-- A replay marks the delivery it revives as one.
GRANT UPDATE (origin) ON webhook_deliveries TO expiry_operator;
