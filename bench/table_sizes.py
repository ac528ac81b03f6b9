"""What the service's tables hold on disk, for ``bench.retention``: each table's rows, and
its ``pg_total_relation_size`` summed over ``pg_partition_tree`` (heap, TOAST, free space
and visibility maps, indexes, every partition) after ``VACUUM ANALYZE``; and those sizes
scaled to another rate of expiries."""

from __future__ import annotations

from dataclasses import dataclass

from bench.db import Connection
from service.adapters.postgres.partitions import TABLES

APPLICATION = "reservations"  # the application's table: the service never deletes from it
SERVICE_TABLES = tuple(name for name in TABLES if name != APPLICATION)
GROWING = ("reservation_transitions", "publish_leases")  # the service's, by the expiries

# Each table: its bytes on disk over its whole partition tree, and its leaf partitions (0:
# not partitioned). pg_partition_tree lists no row for a table that is not partitioned:
# the table itself is added.
SIZES = """
SELECT t.name,
       (SELECT sum(pg_total_relation_size(tree.relid))
          FROM (SELECT p.relid FROM pg_partition_tree(to_regclass(t.name)) AS p
                 UNION SELECT to_regclass(t.name)) AS tree)::bigint AS bytes,
       (SELECT count(*) FROM pg_partition_tree(to_regclass(t.name)) AS p
         WHERE p.isleaf)::int AS partitions
  FROM unnest($1::text[]) AS t (name)
"""


@dataclass(frozen=True)
class Size:
    """One table: its rows, its bytes on disk (all partitions and indexes), its partitions."""

    rows: int
    bytes: int
    partitions: int


Sizes = dict[str, Size]


def total(sizes: Sizes, names: tuple[str, ...] = SERVICE_TABLES) -> int:
    """The bytes of ``names`` (the service's tables) together."""
    return sum(sizes[name].bytes for name in names)


async def measure(conn: Connection) -> Sizes:
    """``VACUUM ANALYZE``, then every table's rows and size."""
    await conn.execute("VACUUM ANALYZE")
    names = [APPLICATION, *SERVICE_TABLES]
    found: Sizes = {}
    for row in await conn.fetch(SIZES, names):
        rows: int = await conn.fetchval(f'SELECT count(*) FROM "{row["name"]}"')
        found[row["name"]] = Size(rows, row["bytes"], row["partitions"])
    return found


def scaled(sizes: Sizes, name: str, scale: float) -> float:
    """``name``'s bytes at ``scale`` times the rate: linear in the rows for the tables that
    grow with the expiries, as measured for the others (they do not)."""
    grows = name in GROWING or name == APPLICATION
    return sizes[name].bytes * scale if grows else float(sizes[name].bytes)


def scaled_total(sizes: Sizes, scale: float) -> float:
    """The service's tables together at ``scale`` times the rate."""
    return sum(scaled(sizes, name, scale) for name in SERVICE_TABLES)
