-- Dead letters have an owner and a note, and can be closed without a replay
-- ("won't replay", with a reason). Each of these acts is an audited row, as a
-- replay is. Closing parks the hold: the scan leaves a parked hold alone (no
-- command every lease length) until it is reopened or replayed.
ALTER TABLE dead_letters
    ADD COLUMN IF NOT EXISTS owner text,
    ADD COLUMN IF NOT EXISTS note  text;
ALTER TABLE dead_letters DROP CONSTRAINT IF EXISTS dead_letters_status_check;
ALTER TABLE dead_letters
    ADD CONSTRAINT dead_letters_status_check CHECK (status IN ('dead', 'replayed', 'closed'));

-- The console lists open dead letters newest first, by group, page by page.
CREATE INDEX IF NOT EXISTS dead_letters_by_status_last_seen
    ON dead_letters (status, last_seen DESC, id DESC);

-- Append-only: who assigned, noted, closed or reopened a dead letter, when,
-- as whom (the database user, set by the database), from where.
CREATE TABLE IF NOT EXISTS dead_letter_events (
    id              bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    dead_letter_id  bigint NOT NULL REFERENCES dead_letters (id),
    kind            text NOT NULL CHECK (kind IN ('assigned', 'noted', 'closed', 'reopened')),
    operator        text NOT NULL,
    detail          text,
    at              timestamptz NOT NULL DEFAULT now(),
    db_user         text NOT NULL DEFAULT session_user,
    os_user         text,
    client_host     text
);
CREATE INDEX IF NOT EXISTS dead_letter_events_by_dead_letter
    ON dead_letter_events (dead_letter_id);

DROP TRIGGER IF EXISTS dead_letter_events_append_only ON dead_letter_events;
CREATE TRIGGER dead_letter_events_append_only
    BEFORE UPDATE OR DELETE ON dead_letter_events
    FOR EACH ROW EXECUTE FUNCTION expiry_append_only();
DROP TRIGGER IF EXISTS dead_letter_events_no_truncate ON dead_letter_events;
CREATE TRIGGER dead_letter_events_no_truncate
    BEFORE TRUNCATE ON dead_letter_events
    FOR EACH STATEMENT EXECUTE FUNCTION expiry_append_only();

-- Holds the scan must leave alone: a closed dead letter's hold.
CREATE TABLE IF NOT EXISTS parked_holds (
    reservation_id  uuid PRIMARY KEY REFERENCES reservations (id),
    dead_letter_id  bigint NOT NULL REFERENCES dead_letters (id),
    parked_at       timestamptz NOT NULL DEFAULT now()
);

-- expiry_operator: the console and python -m service.deadletters set the owner
-- and the note, close and reopen (the status), append the events (the
-- database fills in id, at and db_user), and park and unpark holds.
GRANT UPDATE (owner, note) ON dead_letters TO expiry_operator;
GRANT SELECT ON dead_letter_events, parked_holds TO expiry_operator;
GRANT INSERT (dead_letter_id, kind, operator, detail, os_user, client_host)
    ON dead_letter_events TO expiry_operator;
GRANT INSERT, DELETE ON parked_holds TO expiry_operator;
-- expiry_scan: CLAIM_DUE skips parked holds (it reads which ones, nothing else).
GRANT SELECT (reservation_id) ON parked_holds TO expiry_scan;
-- expiry_consumer: the backlog gauges count parked holds apart.
GRANT SELECT (reservation_id) ON parked_holds TO expiry_consumer;

-- The last pass of each scanner, for the console's overview: when, and how it went.
CREATE TABLE IF NOT EXISTS scan_passes (
    scanner      text PRIMARY KEY,
    finished_at  timestamptz NOT NULL DEFAULT now(),
    result       text NOT NULL,   -- ok, unconfirmed, stopped
    published    integer NOT NULL,
    unconfirmed  integer NOT NULL
);
GRANT SELECT, INSERT ON scan_passes TO expiry_scan;
GRANT UPDATE (finished_at, result, published, unconfirmed) ON scan_passes TO expiry_scan;
GRANT SELECT ON scan_passes TO expiry_operator;
