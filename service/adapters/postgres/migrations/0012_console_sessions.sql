-- The console's sessions live here, not in a signed cookie: logging out, an
-- idle or absolute timeout, a changed password and `python -m service.console
-- end-sessions` end one at once. The cookie carries a random token; only its
-- SHA-256 is stored. `device` is the SHA-256 of the browser's device cookie,
-- set at a successful login: a later login from that browser is throttled on
-- its own, so an attacker guessing from elsewhere cannot lock its operator out.
CREATE TABLE IF NOT EXISTS console_sessions (
    id            bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    token         bytea NOT NULL UNIQUE CHECK (length(token) = 32),
    operator      text NOT NULL,
    credential    text NOT NULL,  -- a fingerprint of the password hash it began with
    csrf          text NOT NULL,
    device        bytea CHECK (length(device) = 32),
    client_host   text NOT NULL,
    started_at    timestamptz NOT NULL DEFAULT now(),
    last_seen_at  timestamptz NOT NULL DEFAULT now(),
    ended_at      timestamptz,
    ended_by      text,
    end_reason    text,
    CHECK ((ended_at IS NULL) = (end_reason IS NULL))
);
CREATE INDEX IF NOT EXISTS console_sessions_open_by_operator
    ON console_sessions (operator) WHERE ended_at IS NULL;
CREATE INDEX IF NOT EXISTS console_sessions_by_device
    ON console_sessions (device, operator) WHERE device IS NOT NULL;

-- Append-only: every login tried (the name as typed, bounded and cleaned;
-- whether such an operator exists; from which address; whether the browser
-- showed a device cookie of that operator), with what it got: ok, failed, or
-- refused (throttled: the password was not even checked).
CREATE TABLE IF NOT EXISTS console_logins (
    id           bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    at           timestamptz NOT NULL DEFAULT now(),
    name         text NOT NULL,
    known        boolean NOT NULL,
    client_host  text NOT NULL,
    device       boolean NOT NULL,
    outcome      text NOT NULL CHECK (outcome IN ('ok', 'failed', 'refused')),
    detail       text,
    db_user      text NOT NULL DEFAULT session_user
);
-- The throttle reads the checked attempts by name and by address (refused ones, which
-- an attacker makes at no cost, are not in these indexes); the overview reads by time.
CREATE INDEX IF NOT EXISTS console_logins_checked_by_name
    ON console_logins (name, at) WHERE outcome <> 'refused';
CREATE INDEX IF NOT EXISTS console_logins_checked_by_client
    ON console_logins (client_host, at) WHERE outcome <> 'refused';
CREATE INDEX IF NOT EXISTS console_logins_by_at ON console_logins (at);

DROP TRIGGER IF EXISTS console_logins_append_only ON console_logins;
CREATE TRIGGER console_logins_append_only
    BEFORE UPDATE OR DELETE ON console_logins
    FOR EACH ROW EXECUTE FUNCTION expiry_append_only();
DROP TRIGGER IF EXISTS console_logins_no_truncate ON console_logins;
CREATE TRIGGER console_logins_no_truncate
    BEFORE TRUNCATE ON console_logins
    FOR EACH STATEMENT EXECUTE FUNCTION expiry_append_only();

-- expiry_operator (the console, and `python -m service.console sessions` /
-- `end-sessions`): begins, reads, touches and ends sessions (never deletes
-- one, never changes whose it is); appends login attempts and reads them back
-- for the throttle and the overview. The database fills in ids, times and
-- db_user.
GRANT SELECT ON console_sessions, console_logins TO expiry_operator;
GRANT INSERT (token, operator, credential, csrf, device, client_host)
    ON console_sessions TO expiry_operator;
GRANT UPDATE (last_seen_at, ended_at, ended_by, end_reason) ON console_sessions TO expiry_operator;
GRANT INSERT (name, known, client_host, device, outcome, detail)
    ON console_logins TO expiry_operator;
