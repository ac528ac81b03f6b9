-- Redelivered commands are handled one at a time, and counted here before
-- each attempt: a command whose count keeps growing is one that kills the
-- consumer handling it, and is dead-lettered instead of taking its neighbours
-- down with it until the broker's delivery limit.
CREATE TABLE IF NOT EXISTS delivery_crashes (
    message_id  text PRIMARY KEY,
    handled     integer NOT NULL DEFAULT 1,
    first_at    timestamptz NOT NULL DEFAULT now(),
    last_at     timestamptz NOT NULL DEFAULT now()
);
