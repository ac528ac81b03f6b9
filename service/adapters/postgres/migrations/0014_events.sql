-- The transactional outbox (docs/design.md, "Events"): one `reservation.expired`
-- event for every hold moved from held to expired, written in the transaction of
-- the move itself, by the database: a trigger on the audit trail's inserts
-- (statement-level, over the rows the statement inserted: no extra round trip, no
-- row-by-row work), so every writer of an expiry gives its event, whichever
-- release it runs (a consumer of the previous release during a rolling deploy
-- too), and no event exists for an expiry that did not commit. An expiry made
-- before this migration has no event.
--
-- expiry_events holds the pending events only: python -m service.relay claims a
-- batch (SKIP LOCKED, and a lease: lease_until, lease_token), publishes it with
-- confirms to the exchange expiry.events, and then, only while its lease holds,
-- deletes what it sent and writes it to expiry_events_sent. The table stays as
-- small as the backlog, so that the claim never wades through what was sent
-- (the dead tuples of a queue table that keeps its rows); its autovacuum runs
-- after every thousand changes whatever its size. expiry_events_sent is the
-- record of what was confirmed, partitioned by week like the audit tables and
-- dropped with them by python -m service.retention.

-- The audit row carries the expiry's trace (W3C traceparent), so that the trace
-- of the job continues into its event's publish. Older writers leave it empty.
ALTER TABLE reservation_transitions ADD COLUMN IF NOT EXISTS traceparent text;

CREATE TABLE IF NOT EXISTS expiry_events (
    id             bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    reservation_id uuid NOT NULL,
    hold_until     timestamptz NOT NULL,
    expired_at     timestamptz NOT NULL,  -- the move's time, the database's clock
    message_id     text NOT NULL UNIQUE,  -- expired:<reservation_id>:<hold_until in ms>
    traceparent    text,
    created_at     timestamptz NOT NULL DEFAULT now(),
    lease_until    timestamptz,           -- claimed by a relay until then
    lease_token    uuid,                  -- the claim's: only its holder marks it sent
    claims         integer NOT NULL DEFAULT 0  -- more than one: published again
) WITH (
    autovacuum_vacuum_scale_factor = 0,
    autovacuum_vacuum_threshold = 1000,
    autovacuum_vacuum_insert_scale_factor = 0,
    autovacuum_vacuum_insert_threshold = 1000,
    autovacuum_analyze_scale_factor = 0,
    autovacuum_analyze_threshold = 1000
);

CREATE TABLE IF NOT EXISTS expiry_events_sent (
    id             bigint NOT NULL,       -- its id in expiry_events
    reservation_id uuid NOT NULL,
    message_id     text NOT NULL,
    expired_at     timestamptz NOT NULL,
    created_at     timestamptz NOT NULL,
    at             timestamptz NOT NULL DEFAULT now(),  -- marked sent (after its confirm)
    claims         integer NOT NULL,
    relay          text NOT NULL,         -- the relay that marked it (EXPIRY_WORKER_ID)
    PRIMARY KEY (id, at)
) PARTITION BY RANGE (at);
CREATE INDEX IF NOT EXISTS expiry_events_sent_by_reservation
    ON expiry_events_sent (reservation_id);
SELECT expiry_guard_audit('expiry_events_sent', 'expiry_append_only');
SELECT expiry_make_weeks('expiry_events_sent', interval '28 days');

-- The event of each expiry the statement recorded. The message id is the hold's,
-- as the command's is (hold_until as integer milliseconds since the epoch).
CREATE OR REPLACE FUNCTION expiry_events_of_expiries() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO expiry_events (reservation_id, hold_until, expired_at, message_id, traceparent)
    SELECT t.reservation_id, r.hold_until, t.at,
           'expired:' || t.reservation_id || ':'
               || round(extract(epoch FROM r.hold_until) * 1000)::bigint,
           t.traceparent
      FROM recorded t
      JOIN reservations r ON r.id = t.reservation_id
     WHERE t.from_status = 'held' AND t.to_status = 'expired'
     ORDER BY t.id;
    RETURN NULL;
END;
$$;
DROP TRIGGER IF EXISTS expiry_events_of_expiries ON reservation_transitions;
CREATE TRIGGER expiry_events_of_expiries
    AFTER INSERT ON reservation_transitions
    REFERENCING NEW TABLE AS recorded
    FOR EACH STATEMENT EXECUTE FUNCTION expiry_events_of_expiries();

-- expiry_relay: python -m service.relay. Created when missing, as 0005 creates
-- the other runtime roles (postgres/init.sql creates it beforehand with a
-- password, as it must when the migrating role may not create roles).
DO $$
BEGIN
    IF current_user IN ('expiry_consumer', 'expiry_scan', 'expiry_operator', 'expiry_relay') THEN
        RAISE EXCEPTION 'migration 0014_events: % is a runtime role; run the migrations as the owner of the tables', current_user
            USING ERRCODE = 'insufficient_privilege';
    END IF;
    IF NOT EXISTS (SELECT FROM pg_roles WHERE rolname = 'expiry_relay') THEN
        BEGIN
            CREATE ROLE expiry_relay LOGIN;
        EXCEPTION
            WHEN duplicate_object OR unique_violation THEN
                NULL;  -- another migration created it first
            WHEN insufficient_privilege THEN
                RAISE EXCEPTION 'migration 0014_events: role expiry_relay does not exist and % may not create roles; create it first (postgres/init.sql, docs/reference.md "Database roles")', current_user
                    USING ERRCODE = 'insufficient_privilege';
        END;
    END IF;
END
$$;
DO $$
BEGIN
    EXECUTE format('GRANT CONNECT ON DATABASE %I TO expiry_relay', current_database());
END
$$;

REVOKE ALL ON TABLE expiry_events, expiry_events_sent
    FROM PUBLIC, expiry_consumer, expiry_scan, expiry_operator, expiry_relay;

-- The consumers record an expiry's trace with its audit row, and their expiries
-- write the events (the trigger runs as the writer): INSERT, nothing more.
GRANT INSERT (reservation_id, from_status, to_status, message_id, attempt, worker, traceparent)
    ON reservation_transitions TO expiry_consumer;
GRANT INSERT (reservation_id, hold_until, expired_at, message_id, traceparent)
    ON expiry_events TO expiry_consumer;

-- The relay claims (the lease's columns), reads and deletes what it sent, and
-- records it; it reads the ledger (the schema check every command makes).
GRANT SELECT, DELETE ON expiry_events TO expiry_relay;
GRANT UPDATE (lease_until, lease_token, claims) ON expiry_events TO expiry_relay;
GRANT INSERT ON expiry_events_sent TO expiry_relay;
GRANT SELECT ON schema_migrations TO expiry_relay;

-- status, verify and the gauges read the backlog and what was sent.
GRANT SELECT ON expiry_events, expiry_events_sent TO expiry_operator;
GRANT SELECT (created_at, lease_until) ON expiry_events TO expiry_consumer;
