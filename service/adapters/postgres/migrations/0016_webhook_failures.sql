-- Failures as the Standard Webhooks specification has them (docs/webhooks.md; issue 44):
-- every answer but a 2xx is a failure tried again, a Retry-After holds back the whole
-- endpoint, and 410 Gone disables it until an operator enables it.
--
-- held_until:  no deliverer sends to the endpoint before then (the latest Retry-After).
-- disabled_at: it answered 410 Gone then; nothing is sent to it until
--              python -m service.deliver --enable NAME, and its deliveries wait.
ALTER TABLE webhook_endpoints ADD COLUMN IF NOT EXISTS held_until timestamptz;
ALTER TABLE webhook_endpoints ADD COLUMN IF NOT EXISTS disabled_at timestamptz;

-- Each endpoint's backlog (status, the console, every deliverer's gauges every 15 s):
-- its pending deliveries and the oldest one's age budget, read from these indexes alone,
-- not from a scan of every delivery; the oldest counts from `since`, so that a replayed
-- dead letter is as young as its replay.
CREATE INDEX IF NOT EXISTS webhook_deliveries_pending
    ON webhook_deliveries (endpoint, since) WHERE NOT dead;
CREATE INDEX IF NOT EXISTS webhook_deliveries_dead
    ON webhook_deliveries (endpoint) WHERE dead;

-- The deliverer holds and disables its endpoints, and (--enable) enables one: its
-- waiting deliveries' age budget then leaves out the time it was disabled.
GRANT UPDATE (held_until, disabled_at) ON webhook_endpoints TO expiry_deliver;
GRANT UPDATE (since) ON webhook_deliveries TO expiry_deliver;
