-- HTTP delivery of events (docs/webhooks.md; ../shared/CONTRACT.md, "Webhooks").
--
-- webhook_endpoints: the endpoints python -m service.deliver was started with (their
-- names only: URLs and secrets stay in its settings), and what every deliverer shares
-- about each: the rate limit's bucket (tokens, refilled at a rate by whoever takes
-- some), and the pause of an endpoint that keeps failing.
--
-- webhook_deliveries: one row per event and endpoint still to deliver, written with
-- the event, in the expiry's own transaction (a statement trigger on expiry_events:
-- no round trip, no row-by-row work), for every endpoint registered at that time. A
-- deliverer claims due rows (SKIP LOCKED, a lease), POSTs them, and only while its
-- lease holds deletes what was delivered, or puts it off (next_at) after a failure
-- that may pass, or marks it dead (a dead letter in dead_letters, for replay). An
-- endpoint registered later gets the events written after; expiries before this
-- migration have no deliveries.
CREATE TABLE IF NOT EXISTS webhook_endpoints (
    name          text PRIMARY KEY,
    registered_at timestamptz NOT NULL DEFAULT now(),
    seen_at       timestamptz NOT NULL DEFAULT now(),  -- a deliverer last started with it
    tokens        float8 NOT NULL DEFAULT 0,            -- the rate limit's bucket
    tokens_at     timestamptz NOT NULL DEFAULT now(),   -- when it was last refilled
    failures      integer NOT NULL DEFAULT 0,           -- failed attempts in a row
    paused_until  timestamptz,                          -- no claims before then
    probing_until timestamptz,                          -- one probe out: no other claims
    pauses        integer NOT NULL DEFAULT 0            -- pauses in a row (each one longer)
);

CREATE TABLE IF NOT EXISTS webhook_deliveries (
    id             bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    endpoint       text NOT NULL,
    message_id     text NOT NULL,        -- the event's, sent as webhook-id
    reservation_id uuid NOT NULL,
    hold_until     timestamptz NOT NULL,
    expired_at     timestamptz NOT NULL,
    traceparent    text,
    created_at     timestamptz NOT NULL DEFAULT now(),
    since          timestamptz NOT NULL DEFAULT now(),  -- the age budget's start (a replay's)
    next_at        timestamptz NOT NULL DEFAULT now(),  -- not claimed before
    attempts       integer NOT NULL DEFAULT 0,
    lease_until    timestamptz,
    lease_token    uuid,
    last_status    integer,              -- the last attempt's HTTP status (none: no answer)
    last_error     text,                 -- the last failed attempt's error class
    dead           boolean NOT NULL DEFAULT false,  -- a dead letter: only a replay revives it
    UNIQUE (endpoint, message_id)
) WITH (
    autovacuum_vacuum_scale_factor = 0,
    autovacuum_vacuum_threshold = 1000,
    autovacuum_vacuum_insert_scale_factor = 0,
    autovacuum_vacuum_insert_threshold = 1000,
    autovacuum_analyze_scale_factor = 0,
    autovacuum_analyze_threshold = 1000
);
CREATE INDEX IF NOT EXISTS webhook_deliveries_due
    ON webhook_deliveries (endpoint, next_at) WHERE NOT dead;

CREATE OR REPLACE FUNCTION expiry_webhooks_of_events() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO webhook_deliveries (endpoint, message_id, reservation_id, hold_until,
                                    expired_at, traceparent)
    SELECT w.name, e.message_id, e.reservation_id, e.hold_until, e.expired_at, e.traceparent
      FROM written e CROSS JOIN webhook_endpoints w
     ORDER BY e.id, w.name;
    RETURN NULL;
END;
$$;

DROP TRIGGER IF EXISTS expiry_webhooks_of_events ON expiry_events;
CREATE TRIGGER expiry_webhooks_of_events
    AFTER INSERT ON expiry_events
    REFERENCING NEW TABLE AS written
    FOR EACH STATEMENT EXECUTE FUNCTION expiry_webhooks_of_events();

-- expiry_deliver: python -m service.deliver. Created when missing, as 0014 creates the
-- relay's (postgres/init.sql creates it beforehand with a password).
DO $$
BEGIN
    IF current_user IN ('expiry_consumer', 'expiry_scan', 'expiry_operator', 'expiry_relay',
                        'expiry_deliver') THEN
        RAISE EXCEPTION 'migration 0015_webhooks: % is a runtime role; run the migrations as the owner of the tables', current_user
            USING ERRCODE = 'insufficient_privilege';
    END IF;
    IF NOT EXISTS (SELECT FROM pg_roles WHERE rolname = 'expiry_deliver') THEN
        BEGIN
            CREATE ROLE expiry_deliver LOGIN;
        EXCEPTION
            WHEN duplicate_object OR unique_violation THEN
                NULL;  -- another migration created it first
            WHEN insufficient_privilege THEN
                RAISE EXCEPTION 'migration 0015_webhooks: role expiry_deliver does not exist and % may not create roles; create it first (postgres/init.sql, docs/reference.md "Database roles")', current_user
                    USING ERRCODE = 'insufficient_privilege';
        END;
    END IF;
END
$$;

DO $$
BEGIN
    EXECUTE format('GRANT CONNECT ON DATABASE %I TO expiry_deliver', current_database());
END
$$;

REVOKE ALL ON TABLE webhook_endpoints, webhook_deliveries
    FROM PUBLIC, expiry_consumer, expiry_scan, expiry_operator, expiry_relay, expiry_deliver;
-- An expiry writes its event, and the event its deliveries (the trigger runs as the
-- writer; an event is written once, message_id being unique, and so is each of its
-- deliveries): the consumers read the endpoints' names and insert deliveries, no more.
GRANT SELECT (name) ON webhook_endpoints TO expiry_consumer;
GRANT INSERT (endpoint, message_id, reservation_id, hold_until, expired_at, traceparent)
    ON webhook_deliveries TO expiry_consumer;
-- The deliverer registers its endpoints and shares their bucket and pause; it claims,
-- puts off, kills and deletes deliveries; it records the dead letters (as the consumers'
-- recorder does) and reads the ledger (the schema check every command makes).
GRANT SELECT, DELETE ON webhook_endpoints TO expiry_deliver;  -- DELETE: --retire
GRANT INSERT (name) ON webhook_endpoints TO expiry_deliver;
GRANT UPDATE (seen_at, tokens, tokens_at, failures, paused_until, probing_until, pauses)
    ON webhook_endpoints TO expiry_deliver;
GRANT SELECT, DELETE ON webhook_deliveries TO expiry_deliver;
GRANT UPDATE (next_at, attempts, lease_until, lease_token, last_status, last_error, dead)
    ON webhook_deliveries TO expiry_deliver;
GRANT SELECT (id, message_id, status, times_dead, error_class, give_up, reason, attempts,
              first_seen, last_seen, worker, owner)
    ON dead_letters TO expiry_deliver;
GRANT INSERT (message_id, reservation_id, hold_until, error_class, give_up, reason, attempts,
              first_seen, last_seen, worker, body_excerpt, policy)
    ON dead_letters TO expiry_deliver;
GRANT UPDATE (times_dead, status, error_class, give_up, reason, attempts, first_seen,
              last_seen, worker, policy, updated_at, owner)
    ON dead_letters TO expiry_deliver;
GRANT INSERT (dead_letter_id, kind, operator, detail) ON dead_letter_events TO expiry_deliver;
GRANT SELECT ON schema_migrations TO expiry_deliver;
-- A replay revives a dead delivery (python -m service.deadletters, the console); status,
-- verify and the gauges read the backlog.
GRANT SELECT ON webhook_endpoints, webhook_deliveries TO expiry_operator;
GRANT UPDATE (since, next_at, attempts, lease_until, lease_token, dead)
    ON webhook_deliveries TO expiry_operator;
