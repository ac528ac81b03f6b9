-- Retention (docs/operations.md, "Retention"). The audit trail stays
-- append-only for rows, and is bounded by dropping whole weeks: each audit
-- table is partitioned by `at`, one partition a week (Monday 00:00 UTC to the
-- next), made ahead of need by `python -m service.retention` (and four weeks
-- of them here), and dropped by it, as the owner, once the whole week is past
-- EXPIRY_RETENTION_DAYS. Each drop and each prune is a row of
-- retention_actions, which nothing drops.
--
-- An existing table is not copied: it is renamed `<table>_legacy`, given the
-- primary key (id, at) that a partitioned table needs, and attached as the
-- partition from its oldest row to next Monday, under the new partitioned
-- table of the old name. This takes an ACCESS EXCLUSIVE lock on each of the
-- four tables for as long as one index build and one scan of it take
-- (docs/operations.md states the time on a million transitions). Ids go on
-- from the highest one.
--
-- The audit tables no longer reference dead_letters: a dead letter closed or
-- replayed longer ago than the retention is removed, and what the audit says
-- of it outlives it (it names the record's id and message id).

-- Monday 00:00 UTC of the week `t` falls in.
CREATE OR REPLACE FUNCTION expiry_week_of(t timestamptz) RETURNS timestamptz
LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
    SELECT date_trunc('week', t AT TIME ZONE 'UTC') AT TIME ZONE 'UTC'
$$;

-- Make the partition of `parent` for [low, high) unless a table of its name
-- exists; return its name, or NULL when there was nothing to do. The partition
-- is made empty and then attached, so that the parent is locked only in SHARE
-- UPDATE EXCLUSIVE mode (inserts and reads go on). It refuses TRUNCATE like its
-- parent; row triggers come from the parent.
CREATE OR REPLACE FUNCTION expiry_make_partition(parent text, low timestamptz, high timestamptz)
RETURNS text LANGUAGE plpgsql AS $$
DECLARE
    part text := format('%s_w%s', parent, to_char(low AT TIME ZONE 'UTC', 'YYYYMMDD'));
BEGIN
    IF to_regclass(quote_ident(part)) IS NOT NULL THEN
        RETURN NULL;
    END IF;
    EXECUTE format('CREATE TABLE %I (LIKE %I INCLUDING DEFAULTS INCLUDING CONSTRAINTS)', part, parent);
    EXECUTE format('ALTER TABLE %I ATTACH PARTITION %I FOR VALUES FROM (%L) TO (%L)',
                   parent, part, low, high);
    EXECUTE format('CREATE TRIGGER %I BEFORE TRUNCATE ON %I FOR EACH STATEMENT '
                   'EXECUTE FUNCTION expiry_append_only()', part || '_no_truncate', part);
    RETURN part;
END;
$$;

-- The audit table `name` refuses UPDATE and DELETE (row trigger `row_check`,
-- cloned to each partition) and TRUNCATE (a statement trigger, which is not
-- cloned: expiry_make_partition gives each partition its own).
CREATE OR REPLACE FUNCTION expiry_guard_audit(name text, row_check text) RETURNS void
LANGUAGE plpgsql AS $$
BEGIN
    EXECUTE format('DROP TRIGGER IF EXISTS %I ON %I', name || '_append_only', name);
    EXECUTE format('CREATE TRIGGER %I BEFORE UPDATE OR DELETE ON %I FOR EACH ROW '
                   'EXECUTE FUNCTION %I()', name || '_append_only', name, row_check);
    EXECUTE format('DROP TRIGGER IF EXISTS %I ON %I', name || '_no_truncate', name);
    EXECUTE format('CREATE TRIGGER %I BEFORE TRUNCATE ON %I FOR EACH STATEMENT '
                   'EXECUTE FUNCTION expiry_append_only()', name || '_no_truncate', name);
END;
$$;

-- Set the table `name` aside as `<name>_legacy`, ready to be attached under a
-- partitioned table of the old name: its primary key, identity, row trigger and
-- references to dead_letters go (the parent brings its own), its indexes and
-- TRUNCATE trigger take the new name, and the runtime roles lose their grants on
-- it (they reach it through the parent). Then make that parent from it (its
-- indexes, foreign keys and triggers are the caller's).
CREATE OR REPLACE FUNCTION expiry_set_aside(name text) RETURNS void
LANGUAGE plpgsql AS $$
DECLARE
    legacy text := name || '_legacy';
    found record;
BEGIN
    EXECUTE format('ALTER TABLE %I RENAME TO %I', name, legacy);
    EXECUTE format('ALTER TABLE %I DROP CONSTRAINT %I', legacy, name || '_pkey');
    EXECUTE format('ALTER TABLE %I ALTER COLUMN id DROP IDENTITY', legacy);
    EXECUTE format('DROP TRIGGER %I ON %I', name || '_append_only', legacy);
    EXECUTE format('ALTER TRIGGER %I ON %I RENAME TO %I',
                   name || '_no_truncate', legacy, legacy || '_no_truncate');
    FOR found IN SELECT conname FROM pg_constraint
                  WHERE conrelid = legacy::regclass AND contype = 'f'
                    AND confrelid = 'dead_letters'::regclass LOOP
        EXECUTE format('ALTER TABLE %I DROP CONSTRAINT %I', legacy, found.conname);
    END LOOP;
    FOR found IN SELECT c.relname FROM pg_index x JOIN pg_class c ON c.oid = x.indexrelid
                  WHERE x.indrelid = legacy::regclass LOOP
        EXECUTE format('ALTER INDEX %I RENAME TO %I',
                       found.relname, legacy || substr(found.relname, length(name) + 1));
    END LOOP;
    EXECUTE format('REVOKE ALL ON %I FROM PUBLIC, expiry_consumer, expiry_scan, expiry_operator',
                   legacy);
    -- The parent: the same columns, defaults and checks (under the same names, which an
    -- attached partition must have), the primary key (id, at), ids the database's.
    EXECUTE format('CREATE TABLE %I (LIKE %I INCLUDING DEFAULTS INCLUDING CONSTRAINTS, '
                   'PRIMARY KEY (id, at)) PARTITION BY RANGE (at)', name, legacy);
    EXECUTE format('ALTER TABLE %I ALTER COLUMN id ADD GENERATED ALWAYS AS IDENTITY', name);
END;
$$;

-- Attach `<name>_legacy` as the first partition of `name`: [its oldest `at`,
-- next Monday). Its indexes are adopted by the parent's; the primary key
-- (id, at) is built. Ids go on from its highest. An empty one is dropped.
CREATE OR REPLACE FUNCTION expiry_adopt_legacy(name text) RETURNS void
LANGUAGE plpgsql AS $$
DECLARE
    legacy text := name || '_legacy';
    oldest timestamptz;
    newest bigint;
BEGIN
    EXECUTE format('SELECT min(at), max(id) FROM %I', legacy) INTO oldest, newest;
    IF oldest IS NULL THEN
        EXECUTE format('DROP TABLE %I', legacy);
        RETURN;
    END IF;
    EXECUTE format('ALTER TABLE %I ATTACH PARTITION %I FOR VALUES FROM (%L) TO (%L)',
                   name, legacy, oldest, expiry_week_of(now()) + interval '7 days');
    PERFORM setval(pg_get_serial_sequence(name, 'id'), newest);
END;
$$;

-- Weeks from this one (or from the end of the legacy partition) to four weeks ahead.
CREATE OR REPLACE FUNCTION expiry_make_weeks(parent text, ahead interval) RETURNS void
LANGUAGE plpgsql AS $$
DECLARE
    low timestamptz;
BEGIN
    SELECT coalesce(max(expiry_partition_high(c.oid)), expiry_week_of(now()))
      INTO low
      FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid
     WHERE i.inhparent = to_regclass(quote_ident(parent));
    WHILE low < now() + ahead LOOP
        PERFORM expiry_make_partition(parent, low, low + interval '7 days');
        low := low + interval '7 days';
    END LOOP;
END;
$$;

-- The bounds of a partition (a range partition of one timestamptz column).
CREATE OR REPLACE FUNCTION expiry_partition_low(part oid) RETURNS timestamptz
LANGUAGE sql STABLE AS $$
    SELECT (regexp_match(pg_get_expr(relpartbound, oid), 'FROM \(''([^'']*)''\)'))[1]::timestamptz
      FROM pg_class WHERE oid = part
$$;
CREATE OR REPLACE FUNCTION expiry_partition_high(part oid) RETURNS timestamptz
LANGUAGE sql STABLE AS $$
    SELECT (regexp_match(pg_get_expr(relpartbound, oid), 'TO \(''([^'']*)''\)'))[1]::timestamptz
      FROM pg_class WHERE oid = part
$$;

REVOKE EXECUTE ON FUNCTION expiry_make_partition(text, timestamptz, timestamptz),
                           expiry_guard_audit(text, text),
                           expiry_set_aside(text), expiry_adopt_legacy(text),
                           expiry_make_weeks(text, interval)
    FROM PUBLIC;

-- reservation_transitions
SELECT expiry_set_aside('reservation_transitions');
ALTER TABLE reservation_transitions
    ADD FOREIGN KEY (reservation_id) REFERENCES reservations (id);
CREATE INDEX reservation_transitions_by_reservation
    ON reservation_transitions (reservation_id);
SELECT expiry_guard_audit('reservation_transitions', 'reservation_transitions_append_only');
SELECT expiry_adopt_legacy('reservation_transitions');
SELECT expiry_make_weeks('reservation_transitions', interval '28 days');
GRANT SELECT ON reservation_transitions TO expiry_operator;
GRANT INSERT (reservation_id, from_status, to_status, message_id, attempt, worker)
    ON reservation_transitions TO expiry_consumer;

-- dead_letter_replays
SELECT expiry_set_aside('dead_letter_replays');
SELECT expiry_guard_audit('dead_letter_replays', 'expiry_append_only');
SELECT expiry_adopt_legacy('dead_letter_replays');
SELECT expiry_make_weeks('dead_letter_replays', interval '28 days');
GRANT SELECT ON dead_letter_replays TO expiry_operator;
GRANT INSERT (dead_letter_id, message_id, operator, outcome, detail, os_user, client_host)
    ON dead_letter_replays TO expiry_operator;

-- dead_letter_events
SELECT expiry_set_aside('dead_letter_events');
CREATE INDEX dead_letter_events_by_dead_letter ON dead_letter_events (dead_letter_id);
SELECT expiry_guard_audit('dead_letter_events', 'expiry_append_only');
SELECT expiry_adopt_legacy('dead_letter_events');
SELECT expiry_make_weeks('dead_letter_events', interval '28 days');
GRANT SELECT ON dead_letter_events TO expiry_operator;
GRANT INSERT (dead_letter_id, kind, operator, detail, os_user, client_host)
    ON dead_letter_events TO expiry_operator;
GRANT INSERT (dead_letter_id, kind, operator, detail) ON dead_letter_events TO expiry_consumer;

-- console_logins
SELECT expiry_set_aside('console_logins');
CREATE INDEX console_logins_checked_by_name
    ON console_logins (name, at) WHERE outcome <> 'refused';
CREATE INDEX console_logins_checked_by_client
    ON console_logins (client_host, at) WHERE outcome <> 'refused';
CREATE INDEX console_logins_by_at ON console_logins (at);
SELECT expiry_guard_audit('console_logins', 'expiry_append_only');
SELECT expiry_adopt_legacy('console_logins');
SELECT expiry_make_weeks('console_logins', interval '28 days');
GRANT SELECT ON console_logins TO expiry_operator;
GRANT INSERT (name, known, client_host, device, outcome, detail)
    ON console_logins TO expiry_operator;

-- What retention did: each partition made, dropped, and each prune that
-- removed rows; by whom (the database user, filled in by the database, and
-- the host and operating-system user of the command). Append-only, never
-- dropped: a few rows a week.
CREATE TABLE IF NOT EXISTS retention_actions (
    id          bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    at          timestamptz NOT NULL DEFAULT now(),
    action      text NOT NULL CHECK (action IN ('made', 'dropped', 'pruned')),
    table_name  text NOT NULL,
    range_from  timestamptz,
    range_to    timestamptz,
    rows        bigint NOT NULL,
    db_user     text NOT NULL DEFAULT session_user,
    os_user     text,
    client_host text
);
SELECT expiry_guard_audit('retention_actions', 'expiry_append_only');

-- The last run of each runner (like scan_passes): for the alert that fires
-- when retention has not run for a day.
CREATE TABLE IF NOT EXISTS retention_runs (
    runner       text PRIMARY KEY,
    finished_at  timestamptz NOT NULL DEFAULT now(),
    result       text NOT NULL CHECK (result IN ('ok', 'failed'))
);

-- Everyone who shows or exports what is retained reads these.
GRANT SELECT ON retention_actions, retention_runs
    TO expiry_operator, expiry_consumer, expiry_scan;
