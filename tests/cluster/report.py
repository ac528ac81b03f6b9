"""The figures of the cluster test, printed at once and again in pytest's summary."""

from __future__ import annotations

from dataclasses import dataclass, fields

RESULTS: list[Figures] = []


@dataclass(frozen=True)
class Figures:
    """What a run of the cluster test measured."""

    departure: str  # how the leader's node went away: stop_app, kill or partition
    holds: int
    node_gone: str
    expired_at_departure: int  # holds expired when the node went away
    departure_took_s: float  # how long rabbitmqctl stop_app (or the kill) took
    connections_lost_s: float  # the departure -> the first consumer's broker.next_node
    consumers_back_s: float  # the departure -> all moved, and the queue counts 3 consumers
    work_resumed_s: float  # the departure -> the first outcome on a moved consumer
    all_consumers_working_s: float  # the departure -> the last moved consumer's first outcome
    total_s: float  # the scanner's start -> every hold expired and the queues drained
    deliveries: int  # expiry.outcome lines
    duplicates: int  # already-done outcomes
    expired_without_outcome: int  # expired, yet no "expired" outcome line
    redelivered: int  # outcomes of deliveries flagged redelivered
    retries: int  # expiry.retry lines
    dead_letters: int  # expirations.dead messages + dead_letters records
    next_node_lines: int  # the consumers' broker.next_node lines
    stale_acks: int  # expiry.stale_delivery + expiry.settle_failed lines
    republished: int  # holds whose command the broker confirmed more than once
    scans_after_departure: int  # "scan: published" lines after the departure
    published_after_departure: int  # commands those scans published
    scanner_unreachable: int  # the scanner's broker.unreachable lines after the departure
    failed_scans: int  # scan.failed lines
    consumers_now_on: str  # the nodes of the consumers' connections after the failover
    rejoined_after_heal_s: float = 0.0  # a partition: the heal -> all three nodes running

    def lines(self) -> list[str]:
        """One ``name: value`` line per figure."""
        return [f"  {field.name:26} {getattr(self, field.name)}" for field in fields(self)]


def report(figures: Figures) -> None:
    """Print the figures now and keep them for the end-of-run summary."""
    RESULTS.append(figures)
    print("\ncluster test figures:", *figures.lines(), sep="\n", flush=True)
