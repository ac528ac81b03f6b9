-- Dead letters an operator can query, and an audit of every replay.

-- One row per dead-lettered message id (a later dead-lettering of the same
-- message, after a replay that did not help, updates the row and counts up).
CREATE TABLE IF NOT EXISTS dead_letters (
    id              bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    message_id      text NOT NULL UNIQUE,
    reservation_id  uuid,            -- NULL when the body named none (poison)
    hold_until      timestamptz,
    error_class     text NOT NULL,
    give_up         text NOT NULL,   -- permanent, attempts-exhausted, age-exhausted, delivery-limit
    reason          text NOT NULL,   -- short and redacted: never message content
    attempts        integer NOT NULL,
    first_seen      timestamptz NOT NULL,
    last_seen       timestamptz NOT NULL,
    worker          text NOT NULL,
    body_excerpt    text,            -- poison only: bounded, with letters and digits masked
    status          text NOT NULL DEFAULT 'dead' CHECK (status IN ('dead', 'replayed')),
    times_dead      integer NOT NULL DEFAULT 1,
    recorded_at     timestamptz NOT NULL DEFAULT now(),
    updated_at      timestamptz NOT NULL DEFAULT now()
);

CREATE INDEX IF NOT EXISTS dead_letters_by_last_seen ON dead_letters (last_seen DESC);
CREATE INDEX IF NOT EXISTS dead_letters_open_by_class ON dead_letters (error_class) WHERE status = 'dead';

-- Append-only: who replayed what, when, and how it went.
CREATE TABLE IF NOT EXISTS dead_letter_replays (
    id              bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    dead_letter_id  bigint NOT NULL REFERENCES dead_letters (id),
    message_id      text NOT NULL,
    operator        text NOT NULL,
    at              timestamptz NOT NULL DEFAULT now(),
    outcome         text NOT NULL,   -- republished, not-in-queue, publish-failed
    detail          text
);

CREATE OR REPLACE FUNCTION expiry_append_only() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    RAISE EXCEPTION '% is append-only', TG_TABLE_NAME;
END;
$$;

DROP TRIGGER IF EXISTS dead_letter_replays_append_only ON dead_letter_replays;
CREATE TRIGGER dead_letter_replays_append_only
    BEFORE UPDATE OR DELETE ON dead_letter_replays
    FOR EACH ROW EXECUTE FUNCTION expiry_append_only();
