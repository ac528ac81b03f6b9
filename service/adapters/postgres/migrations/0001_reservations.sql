-- Reservations (the contract's table), publish leases, and the audit trail.

CREATE TABLE IF NOT EXISTS reservations (
    id          uuid PRIMARY KEY,
    status      text NOT NULL DEFAULT 'held'
                CHECK (status IN ('held', 'expired', 'consumed')),
    hold_until  timestamptz NOT NULL,
    created_at  timestamptz NOT NULL DEFAULT now(),
    updated_at  timestamptz NOT NULL DEFAULT now()
);

-- "Due and held" is a range scan over this small index, oldest deadline first.
CREATE INDEX IF NOT EXISTS reservations_held_by_deadline
    ON reservations (hold_until, id) WHERE status = 'held';

-- One row per reservation the scan has published: the scan skips a hold whose
-- lease is live, and publishes it again once the lease has lapsed.
CREATE TABLE IF NOT EXISTS publish_leases (
    reservation_id  uuid PRIMARY KEY REFERENCES reservations (id),
    message_id      text NOT NULL,
    lease_until     timestamptz NOT NULL,
    first_published timestamptz NOT NULL DEFAULT now(),
    last_published  timestamptz NOT NULL DEFAULT now(),
    publish_count   integer NOT NULL DEFAULT 1
);

-- Append-only: one row per transition this service made.
CREATE TABLE IF NOT EXISTS reservation_transitions (
    id              bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    reservation_id  uuid NOT NULL REFERENCES reservations (id),
    from_status     text NOT NULL,
    to_status       text NOT NULL,
    at              timestamptz NOT NULL DEFAULT now(),
    message_id      text,
    attempt         integer,
    worker          text NOT NULL
);

CREATE INDEX IF NOT EXISTS reservation_transitions_by_reservation
    ON reservation_transitions (reservation_id);

CREATE OR REPLACE FUNCTION reservation_transitions_append_only() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    RAISE EXCEPTION 'reservation_transitions is append-only';
END;
$$;

DROP TRIGGER IF EXISTS reservation_transitions_append_only ON reservation_transitions;
CREATE TRIGGER reservation_transitions_append_only
    BEFORE UPDATE OR DELETE ON reservation_transitions
    FOR EACH ROW EXECUTE FUNCTION reservation_transitions_append_only();
