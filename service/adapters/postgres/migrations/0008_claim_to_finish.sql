-- The consumer reports how long a hold took from the scan's confirmed publish
-- to its expiry (expiry_claim_to_finish_seconds): its guarded update reads the
-- hold's lease, when it was last published, and nothing else of the lease.
GRANT SELECT (reservation_id, last_published) ON publish_leases TO expiry_consumer;
