"""Unit tests for ``service/demo``: the plan, the children's environment, the summary."""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from uuid import UUID

import pytest

from service.adapters.amqp.management import Management
from service.demo.children import Children
from service.demo.plan import parser, plan_from
from service.demo.summary import Final, Report, summary
from service.demo.support import Support
from service.demo.workspace import Sandbox, amqp_url, database_url, own_settings
from service.settings import Settings


def _settings() -> Settings:
    return Settings(
        database_url="postgresql://postgres:pw@db:5432/postgres",
        amqp_url=("amqp://svc:pw@rabbit1/", "amqp://svc:pw@rabbit2/"),
        management_url=None,
    )


def test_the_plan_defaults_to_a_fresh_name_and_the_documented_sizes() -> None:
    """No arguments: 3000 holds, 3 consumers, a name expiry_demo_<8 hex>."""
    plan = plan_from(parser().parse_args([]))
    assert (plan.holds, plan.consumers, plan.spread, plan.support_share) == (3000, 3, 5.0, 0.1)
    assert (plan.scan_every, plan.timeout, plan.keep, plan.lead) == (0.5, 120.0, False, 1.0)
    assert plan.name.startswith("expiry_demo_")
    assert len(plan.name) == len("expiry_demo_") + 8


@pytest.mark.parametrize(
    "args",
    [["--name", "Robert'); DROP"], ["--holds", "0"], ["--consumers", "33"], ["--spread", "x"]],
)
def test_the_command_line_refuses_what_is_out_of_bounds(args: list[str]) -> None:
    """A name that is no plain identifier, or a number out of its bounds, is a usage error."""
    with pytest.raises(SystemExit) as exited:
        parser().parse_args(args)
    assert exited.value.code == 2


def test_the_sandbox_is_beside_the_servers_of_the_settings() -> None:
    """The database on DATABASE_URL's server, the vhost on the first node, one name."""
    plan = plan_from(parser().parse_args(["--name", "expiry_demo_x"]))
    assert database_url(_settings(), plan) == "postgresql://postgres:pw@db:5432/expiry_demo_x"
    assert amqp_url(_settings(), plan) == "amqp://svc:pw@rabbit1/expiry_demo_x"


def _sandbox() -> Sandbox:
    urls = ("amqp://svc:pw@rabbit1/v", "amqp://svc:pw@rabbit2/v")
    return Sandbox("d", "v", "postgresql://postgres:pw@db:5432/d", urls, Management("http://h"))


def test_the_demos_own_work_uses_the_sandbox_with_long_timeouts() -> None:
    """Its connections go to the sandbox; a statement may take as long as a run."""
    own = own_settings(_settings(), _sandbox())
    assert own.database_url.endswith("/d")
    assert own.amqp_url == _sandbox().amqp_urls
    assert own.statement_timeout_ms > _settings().statement_timeout_ms


def test_the_children_run_against_the_sandbox_without_a_failpoint(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """This environment, pointed at the sandbox; never a failpoint; the management URL only
    when one is set (else the children find it beside AMQP_URL, as the demo did)."""
    monkeypatch.setenv("EXPIRY_FAILPOINT", "exit-after-commit")
    monkeypatch.setenv("SOMETHING_ELSE", "kept")
    env = Children(_sandbox(), None, tmp_path).env(EXPIRY_WORKER_ID="w")
    assert "EXPIRY_FAILPOINT" not in env
    assert "EXPIRY_MANAGEMENT_URL" not in env
    assert env["SOMETHING_ELSE"] == "kept"
    assert env["AMQP_URL"] == "amqp://svc:pw@rabbit1/v,amqp://svc:pw@rabbit2/v"
    assert (env["EXPIRY_LOG_FORMAT"], env["EXPIRY_HTTP_PORT"], env["EXPIRY_WORKER_ID"]) == (
        "json",
        "0",
        "w",
    )
    given = Children(_sandbox(), "http://admin:pw@h:15672", tmp_path).env()
    assert given["EXPIRY_MANAGEMENT_URL"] == "http://admin:pw@h:15672"


def _report(**states: int) -> Report:
    counts = {
        "placed": 10,
        "expired": 8,
        "consumed": 2,
        "held": 0,
        "held_past_deadline": 0,
        "expired_not_once": 0,
        "consumed_with_transition": 0,
        "min_transitions": 1,
        "max_transitions": 1,
    } | states
    lag = {"p50": 0.1, "p95": 0.2, "max": 0.3, "window": 2.0}
    final = Final(counts, lag, {"demo-consumer-1": 8}, dead=0, queued=0)
    support = Support(tried=3, consumed={UUID(int=1), UUID(int=2)}, too_late=1)
    deliveries = Counter({"expired": 8, "already-done": 1})
    return Report(True, 4.2, final, support, {"consumer-1": 0, "scan": 0}, deliveries)


def test_the_summary_adds_up_and_every_check_passes() -> None:
    """Every hold in one state, one transition each: every check ok."""
    report = _report()
    lines = summary(report)
    assert lines[0] == f"  {'holds placed':<29} 10"
    assert f"  {'ended in exactly one state':<29} 10 of 10" in lines
    assert (
        f"  {'throughput':<29} 4 expirations/s as the holds came due (8 in the 2.0s from "
        "the first deadline to the last expiry)" in lines
    )
    assert [line for line in lines if line.startswith("  [")] == [
        f"  [ok] {what}" for what, _ in report.checks()
    ]
    assert report.ok


def test_a_hold_still_held_past_its_deadline_fails_the_run() -> None:
    """A held hold past its deadline fails two checks: one state, and none past deadline."""
    report = _report(expired=7, held=1, held_past_deadline=1)
    failed = [what for what, passed in report.checks() if not passed]
    assert failed == ["every hold ended in exactly one state", "no held hold past its deadline"]
    assert not report.ok
