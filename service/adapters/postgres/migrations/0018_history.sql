-- History for late subscribers (docs/webhooks.md, "Backfill"; docs/events.md, "A queue
-- bound later"; issue 44): an endpoint configured after the events, or a queue bound
-- after them, gets those the service still keeps, with the same ids.
--
-- history_requests: every backfill (python -m service.deliver --backfill) and every
-- replay to a queue (python -m service.relay --replay-to), who asked (the operator, the
-- OS user and host; the database user is recorded by the database), for what window,
-- and how many events it queued or published. An audit table: append-only, a partition
-- a week, dropped by python -m service.retention with the rest of the audit trail.
CREATE TABLE IF NOT EXISTS history_requests (
    id        bigint GENERATED ALWAYS AS IDENTITY,
    at        timestamptz NOT NULL DEFAULT now(),
    kind      text NOT NULL,            -- backfill or replay-to
    target    text NOT NULL,            -- the endpoint's name, or the queue's
    since     timestamptz NOT NULL,
    until     timestamptz NOT NULL,
    events    integer NOT NULL,         -- queued (backfill) or published and confirmed
    outcome   text NOT NULL,            -- done, or partial (some unconfirmed: run it again)
    operator  text NOT NULL,
    os_user   text NOT NULL,
    host      text NOT NULL,
    db_user   text NOT NULL DEFAULT current_user,
    PRIMARY KEY (id, at)
) PARTITION BY RANGE (at);
SELECT expiry_guard_audit('history_requests', 'expiry_append_only');
SELECT expiry_make_weeks('history_requests', interval '28 days');

REVOKE ALL ON TABLE history_requests
    FROM PUBLIC, expiry_consumer, expiry_scan, expiry_operator, expiry_relay, expiry_deliver;
-- Both are an operator's acts, as the operator's role (which reads the events, sent and
-- pending, and the holds already): audited, and a backfill queues a delivery of each
-- event for one endpoint (origin backfill). The deliverers only send what is queued.
GRANT INSERT (kind, target, since, until, events, outcome, operator, os_user, host)
    ON history_requests TO expiry_operator;
GRANT SELECT ON history_requests TO expiry_operator;
GRANT INSERT (endpoint, message_id, reservation_id, hold_until, expired_at, origin)
    ON webhook_deliveries TO expiry_operator;
