-- Least privilege. Each command connects as a role of its own that holds only
-- what its statements (service/db.py) need; whoever runs the migrations owns
-- every table, so no runtime role can drop, alter or truncate one, or disable
-- a trigger. docs/reference.md, "Database roles", has the matrix and the URLs.
--
-- A later migration that adds a table, or a column the service writes where
-- the grant below is column-level, grants it too: tests/integration/
-- test_roles.py runs every command as its role and pins the exact grants.

-- The roles. They are cluster-wide, and many databases of one cluster are
-- migrated, some at the same moment (the advisory lock of migrate.py is per
-- database): a role is created only when missing, and a concurrent creator's
-- win counts as ours (duplicate_object; or unique_violation, when the other
-- transaction committed while this one waited on pg_authid's unique index).
-- A role that exists keeps its attributes and its password. LOGIN without a
-- password: a deploy sets one (ALTER ROLE ... PASSWORD) or creates the roles
-- beforehand (postgres/init.sql), as it must when the migrating role may not
-- create roles.
DO $$
DECLARE
    runtime_role text;
BEGIN
    IF current_user IN ('expiry_consumer', 'expiry_scan', 'expiry_operator') THEN
        RAISE EXCEPTION 'migration 0005_roles: % is a runtime role; run the migrations as the owner of the tables', current_user
            USING ERRCODE = 'insufficient_privilege';
    END IF;
    FOREACH runtime_role IN ARRAY ARRAY['expiry_consumer', 'expiry_scan', 'expiry_operator'] LOOP
        CONTINUE WHEN EXISTS (SELECT FROM pg_roles WHERE rolname = runtime_role);
        BEGIN
            EXECUTE format('CREATE ROLE %I LOGIN', runtime_role);
        EXCEPTION
            WHEN duplicate_object OR unique_violation THEN
                NULL;  -- another migration created it first: it exists, which is all we need
            WHEN insufficient_privilege THEN
                RAISE EXCEPTION 'migration 0005_roles: role % does not exist and % may not create roles; create expiry_consumer, expiry_scan and expiry_operator first (postgres/init.sql, docs/reference.md "Database roles")', runtime_role, current_user
                    USING ERRCODE = 'insufficient_privilege';
        END;
    END LOOP;
END
$$;

-- Start from nothing, whatever the database held before (a default privilege,
-- a grant by hand): PUBLIC keeps nothing on our tables, and each runtime role
-- gets exactly the grants below (revoking a table privilege revokes the
-- column privileges too). The identity sequences need no grant: an INSERT
-- draws its generated id without any privilege on the sequence.
REVOKE ALL ON TABLE reservations, publish_leases, reservation_transitions, dead_letters,
                    dead_letter_replays, delivery_crashes, schema_migrations
    FROM PUBLIC, expiry_consumer, expiry_scan, expiry_operator;
REVOKE ALL ON SEQUENCE reservation_transitions_id_seq, dead_letters_id_seq,
                       dead_letter_replays_id_seq
    FROM PUBLIC, expiry_consumer, expiry_scan, expiry_operator;

-- expiry_consumer: python -m service.consume.
-- The guarded update, one at a time or batched (EXPIRE_RESERVATION,
-- EXPIRE_BATCH, whose row locks are covered by the same UPDATE grant), the
-- re-read (READ_RESERVATION) and the backlog gauges (BACKLOG). It may change a
-- reservation's status and nothing else: never its deadline, never its id.
GRANT SELECT ON reservations TO expiry_consumer;
GRANT UPDATE (status, updated_at) ON reservations TO expiry_consumer;
-- The audit row: only the columns the statement names, so that `at` (and the
-- id) always come from the database; a client-chosen `at` could hide an early
-- expiry from verify's expired-before-deadline check. No SELECT, UPDATE,
-- DELETE or TRUNCATE: the consumer writes the trail, it never reads or edits it.
GRANT INSERT (reservation_id, from_status, to_status, message_id, attempt, worker)
    ON reservation_transitions TO expiry_consumer;
-- The crash counter: MARK_HANDLING's upsert and CLEAR_HANDLING's delete.
GRANT SELECT, INSERT, DELETE ON delivery_crashes TO expiry_consumer;
GRANT UPDATE (handled, last_at) ON delivery_crashes TO expiry_consumer;
-- The recorder's upsert (RECORD_DEAD_LETTER): it inserts a record, and for a
-- message dead-lettered again rewrites what the new dead-lettering says. It
-- cannot rewrite a record's identity (message, reservation, body excerpt, when
-- it was first recorded). SELECT covers what the upsert reads: the conflict
-- key, the old values it compares, and every column whose EXCLUDED value it
-- takes (PostgreSQL checks SELECT on those too).
GRANT INSERT (message_id, reservation_id, hold_until, error_class, give_up, reason, attempts,
              first_seen, last_seen, worker, body_excerpt)
    ON dead_letters TO expiry_consumer;
GRANT SELECT (message_id, status, times_dead, error_class, give_up, reason, attempts, first_seen,
              last_seen, worker)
    ON dead_letters TO expiry_consumer;
GRANT UPDATE (status, times_dead, error_class, give_up, reason, attempts, first_seen, last_seen,
              worker, updated_at)
    ON dead_letters TO expiry_consumer;

-- expiry_scan: python -m service.produce.
-- CLAIM_DUE reads due holds and locks them (FOR NO KEY UPDATE ... SKIP
-- LOCKED), and PostgreSQL allows a row-locking SELECT only to a role with
-- UPDATE on at least one column of the table. The scan changes no
-- reservation, so it gets the one column whose value decides nothing:
-- updated_at (not status, the guard; not hold_until, the deadline; not id).
GRANT SELECT ON reservations TO expiry_scan;
GRANT UPDATE (updated_at) ON reservations TO expiry_scan;
-- Its leases: CLAIM_LEASES (an upsert that takes over a lapsed lease),
-- RECORD_LEASES and RELEASE_CLAIMS. A lease is never deleted, and never moved
-- to another reservation.
GRANT SELECT, INSERT ON publish_leases TO expiry_scan;
GRANT UPDATE (message_id, lease_until, first_published, last_published, publish_count)
    ON publish_leases TO expiry_scan;

-- expiry_operator: python -m service.deadletters (list, show, replay),
-- python -m service.status and python -m service.verify. It reads everything
-- they show or check, audits each replay, and marks a replayed record; it
-- cannot edit what a record says, nor touch a reservation or the audit trail.
GRANT SELECT ON reservations, reservation_transitions, publish_leases, dead_letters,
                dead_letter_replays
    TO expiry_operator;
GRANT UPDATE (status, updated_at) ON dead_letters TO expiry_operator;
-- Table-level, so that columns added later (0006_replay_attribution) are covered.
GRANT INSERT ON dead_letter_replays TO expiry_operator;

-- TRUNCATE bypasses the row triggers that make the audit tables append-only,
-- so each also refuses it with a statement trigger. Triggers bind the owner
-- and superusers too (TRUNCATE ... CASCADE from reservations or dead_letters
-- included); only the owner could drop them, and the owner is the migrations'
-- role, which no process runs as.
DROP TRIGGER IF EXISTS reservation_transitions_no_truncate ON reservation_transitions;
CREATE TRIGGER reservation_transitions_no_truncate
    BEFORE TRUNCATE ON reservation_transitions
    FOR EACH STATEMENT EXECUTE FUNCTION expiry_append_only();

DROP TRIGGER IF EXISTS dead_letter_replays_no_truncate ON dead_letter_replays;
CREATE TRIGGER dead_letter_replays_no_truncate
    BEFORE TRUNCATE ON dead_letter_replays
    FOR EACH STATEMENT EXECUTE FUNCTION expiry_append_only();
