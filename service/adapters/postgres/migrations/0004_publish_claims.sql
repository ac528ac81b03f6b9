-- A scan now claims a page of due holds in a short transaction (a lease row
-- whose lease_until is only the publish timeout away), publishes without
-- holding row locks, then extends the lease of each command the broker
-- confirmed (and lets the others lapse at once). A claim that was never
-- confirmed has no publish time and a count of zero.
ALTER TABLE publish_leases
    ALTER COLUMN publish_count SET DEFAULT 0,
    ALTER COLUMN first_published DROP NOT NULL,
    ALTER COLUMN first_published DROP DEFAULT,
    ALTER COLUMN last_published DROP NOT NULL,
    ALTER COLUMN last_published DROP DEFAULT;
