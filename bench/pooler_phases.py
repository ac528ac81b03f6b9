"""The pooler's phase (issue 45), as ``--only pooler`` names it: one consumer's backlog
drain three ways in one run, which goes first alternating between repetitions:

- straight to PostgreSQL with the shipped settings (the reference);
- straight to PostgreSQL with ``EXPIRY_DB_POOLER=transaction``: the statement cache off
  and the timeouts set by each transaction, the cost of those settings alone;
- through PgBouncer in transaction mode (``bench/pgbouncer.py``, Debian's 1.18), with
  those settings: what a deployment behind a transaction pooler gets.

The target: through the pooler at least 85% of straight (``bench/targets.py``).
"""

from __future__ import annotations

from bench.measurements import Bench
from bench.pgbouncer import PgBouncerMissing, running_pgbouncer
from bench.recording import Say, record_consume, record_scan
from bench.report import Results
from bench.webhook_phases import this_repetition

POOLED = {"EXPIRY_DB_POOLER": "transaction"}
STRAIGHT = ("pooler_straight", "1 consumer, straight to PostgreSQL")
SETTINGS = ("pooler_settings", "1 consumer, straight, EXPIRY_DB_POOLER=transaction")
THROUGH = ("pooler_pgbouncer", "1 consumer, through PgBouncer (transaction mode)")


async def pooler(bench: Bench, results: Results, say: Say) -> None:
    """The three drains (module docstring), then their ratios to the straight one."""
    try:
        with running_pgbouncer(bench.database_url) as bouncer:
            through = {**POOLED, "DATABASE_URL": bouncer.url_for(bench.database_url)}
            runs = [(STRAIGHT, {}), (SETTINGS, POOLED), (THROUGH, through)]
            for (key, label), env in runs if results.repetition % 2 else runs[::-1]:
                scan, run = await bench.backlog(1, env)
                record_scan(results, scan, say)
                record_consume(results, key, label, run, say)
    except PgBouncerMissing as exc:
        say(f"  pooler           not measured: {exc}")
        return
    for key, label in (SETTINGS, THROUGH):
        ratio = this_repetition(results, f"e2e.{key}", f"e2e.{STRAIGHT[0]}")
        if ratio is not None:
            say(f"  pooler           {label} vs straight: {ratio:.0%}")
