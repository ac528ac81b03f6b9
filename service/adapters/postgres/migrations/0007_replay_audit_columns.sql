-- The operator appends to the replay audit naming only what it knows; the
-- database fills in the rest itself (the row's id, `at` and `db_user`), so a
-- client cannot backdate a replay or claim another database user.
REVOKE INSERT ON dead_letter_replays FROM expiry_operator;
GRANT INSERT (dead_letter_id, message_id, operator, outcome, detail, os_user, client_host)
    ON dead_letter_replays TO expiry_operator;
