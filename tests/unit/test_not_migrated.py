"""A missing table or column is recognised as a database that is not migrated
(``service/adapters/classify.py``), and every command then says so in one line with
exit 5 (``service/cli.py``)."""

from __future__ import annotations

import asyncpg
import pytest

from service.adapters.classify import schema_missing
from service.cli import EXIT_FAILURE, EXIT_NOT_MIGRATED, report_failure


def _caused(outer: Exception, cause: BaseException) -> Exception:
    outer.__cause__ = cause
    return outer


@pytest.mark.parametrize(
    ("exc", "missing"),
    [
        (asyncpg.UndefinedTableError('relation "scan_passes" does not exist'), "scan_passes"),
        (asyncpg.UndefinedColumnError('column "started_at" does not exist'), "started_at"),
        (_caused(RuntimeError("scan"), asyncpg.UndefinedTableError('relation "x"')), '"x"'),
        (ExceptionGroup("g", [ValueError(), asyncpg.UndefinedTableError('relation "y"')]), '"y"'),
        (asyncpg.UndefinedFunctionError("no such function"), None),
        (ConnectionError("cannot reach PostgreSQL"), None),
    ],
)
def test_a_missing_table_or_column_is_found_in_the_cause_chain(
    exc: BaseException, missing: str | None
) -> None:
    """The error, a cause or a grouped exception naming a missing table or column; nothing
    else."""
    found = schema_missing(exc)
    if missing is None:
        assert found is None
    else:
        assert found is not None
        assert missing in found


def test_a_command_on_a_database_not_migrated_says_what_to_do(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """One line naming what is missing and the migrate command, exit 5; other failures keep
    their line and exit 1."""
    failure = asyncpg.UndefinedTableError('relation "reservations" does not exist')
    assert report_failure("expiry-x", failure, verbose=False) == EXIT_NOT_MIGRATED
    assert capsys.readouterr().err == (
        "expiry-x: the database is not migrated, or by an older release "
        '(relation "reservations" does not exist): run python -m service.migrate\n'
    )
    assert report_failure("expiry-x", ConnectionError("down"), verbose=False) == EXIT_FAILURE
    assert capsys.readouterr().err == "expiry-x: failed: ConnectionError: down\n"
