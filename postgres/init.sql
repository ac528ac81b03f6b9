-- PostgreSQL for expiry-service: the roles and the database.
--
-- compose.yaml mounts this file into /docker-entrypoint-initdb.d, so the
-- official image runs it once, at the first boot of an empty data volume, with
-- psql as its superuser (POSTGRES_USER). On a server of your own, run it once
-- as a superuser (docs/reference.md, "Database roles"):
--
--   psql -v ON_ERROR_STOP=1 -U postgres -d postgres -f postgres/init.sql
--
-- Running it again changes nothing: a role or a database that exists is left
-- as it is (its password included), so a password changed since is kept.
--
-- The passwords are throwaway ones for a local trial, like those of
-- rabbitmq/definitions.json: change them (ALTER ROLE ... PASSWORD) and the
-- URLs in compose.yaml before running this anywhere else.
\set ON_ERROR_STOP on

-- expiry_owner runs `python -m service.migrate` and owns every table; it is
-- neither a superuser nor may it create roles or databases, so the runtime
-- roles are created here, before the first migration (which then finds them).
-- The runtime roles hold only what migration 0005 grants them; no process but
-- migrate connects as the owner.
DO $$
BEGIN
    IF NOT EXISTS (SELECT FROM pg_roles WHERE rolname = 'expiry_owner') THEN
        CREATE ROLE expiry_owner LOGIN NOSUPERUSER NOCREATEDB NOCREATEROLE
            PASSWORD 'owner-change-me';
    END IF;
    -- python -m service.consume
    IF NOT EXISTS (SELECT FROM pg_roles WHERE rolname = 'expiry_consumer') THEN
        CREATE ROLE expiry_consumer LOGIN PASSWORD 'consumer-change-me';
    END IF;
    -- python -m service.produce
    IF NOT EXISTS (SELECT FROM pg_roles WHERE rolname = 'expiry_scan') THEN
        CREATE ROLE expiry_scan LOGIN PASSWORD 'scan-change-me';
    END IF;
    -- python -m service.deadletters, status, verify
    IF NOT EXISTS (SELECT FROM pg_roles WHERE rolname = 'expiry_operator') THEN
        CREATE ROLE expiry_operator LOGIN PASSWORD 'operator-change-me';
    END IF;
    -- python -m service.relay (its LISTEN needs a direct connection: docs/deployment.md)
    IF NOT EXISTS (SELECT FROM pg_roles WHERE rolname = 'expiry_relay') THEN
        CREATE ROLE expiry_relay LOGIN PASSWORD 'relay-change-me';
    END IF;
    -- python -m service.deliver
    IF NOT EXISTS (SELECT FROM pg_roles WHERE rolname = 'expiry_deliver') THEN
        CREATE ROLE expiry_deliver LOGIN PASSWORD 'deliver-change-me';
    END IF;
END
$$;

-- The database, owned by expiry_owner: whether the image made it already
-- (POSTGRES_DB=expiry) or not. CREATE DATABASE cannot run inside a DO block,
-- hence psql's \gexec.
SELECT 'CREATE DATABASE expiry OWNER expiry_owner'
 WHERE NOT EXISTS (SELECT FROM pg_database WHERE datname = 'expiry')
\gexec
ALTER DATABASE expiry OWNER TO expiry_owner;

-- Only the service's roles may connect, and none may create temporary tables
-- (PUBLIC may do both by default). The owner keeps every right on its database.
REVOKE ALL ON DATABASE expiry FROM PUBLIC;
GRANT CONNECT ON DATABASE expiry TO expiry_consumer, expiry_scan, expiry_operator, expiry_relay,
    expiry_deliver;

\connect expiry

-- From PostgreSQL 15 on, schema public belongs to the database's owner
-- (pg_database_owner) and nobody else may create in it: expiry_owner can
-- migrate, the runtime roles cannot create tables. Older servers let anyone
-- create there, and give the schema to the bootstrap superuser: do the same by
-- hand.
DO $$
BEGIN
    IF current_setting('server_version_num')::int < 150000 THEN
        ALTER SCHEMA public OWNER TO expiry_owner;
        REVOKE CREATE ON SCHEMA public FROM PUBLIC;
    END IF;
END
$$;
