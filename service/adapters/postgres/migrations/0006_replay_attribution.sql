-- Every replay (and every refused one) says who did it beyond the name given
-- with --operator: the database user it ran as (filled in by the database, so
-- the client cannot choose it), the operating-system user and the host the
-- command ran on.
ALTER TABLE dead_letter_replays
    ADD COLUMN IF NOT EXISTS db_user     text NOT NULL DEFAULT session_user,
    ADD COLUMN IF NOT EXISTS os_user     text,
    ADD COLUMN IF NOT EXISTS client_host text;
