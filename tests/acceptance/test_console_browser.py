"""The console in a real browser: Debian's Chromium, driven by Selenium through Debian's
chromium-driver (no browser is downloaded).

Real dead letters are made by the real service (holds whose retries run out while the
database is away, and poison); an operator logs in, reads the overview, finds the
dead letters by group, opens one, dry-runs and replays the group, and the database shows
each hold expired once and the audit naming the operator. Screenshots of the overview
and of the dead-letter pages are saved where pytest keeps the test's files
(``tmp_path``) and, with ``CONSOLE_SCREENSHOTS=DIR``, into DIR as well. Skips where
Chromium or its driver is missing, except under ``CI=true``.
"""

from __future__ import annotations

import asyncio
import functools
import os
import shutil
from collections.abc import Callable, Iterator
from pathlib import Path
from uuid import UUID

import pytest
from selenium import webdriver
from selenium.common.exceptions import WebDriverException
from selenium.webdriver.chrome.service import Service
from selenium.webdriver.common.by import By
from selenium.webdriver.remote.webdriver import WebDriver
from selenium.webdriver.support import expected_conditions
from selenium.webdriver.support.wait import WebDriverWait

from tests.acceptance.console_support import PASSWORDS, running_console
from tests.seeding import seed_dead_letters
from tests.support import (
    Stack,
    missing,
    pg_connection,
    queue_depth,
    running_consumer,
    transitions_per_reservation,
    wait_for_consumers,
)

# one_broker: the pages in a browser: the replay behind them is tests/acceptance/test_console.py's,
# run on every broker version.
pytestmark = [pytest.mark.acceptance, pytest.mark.one_broker]

CHROMIUM = ("/usr/bin/chromium", "/usr/bin/chromedriver")


@pytest.fixture
def browser(tmp_path: Path) -> Iterator[WebDriver]:
    """A headless Chromium with a fresh profile, quit afterwards."""
    binary, driver = CHROMIUM
    if not (shutil.which(binary) and shutil.which(driver)):
        missing("Debian's chromium and chromium-driver are not installed")
    options = webdriver.ChromeOptions()
    options.binary_location = binary
    for flag in (
        "--headless=new",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-dev-shm-usage",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
        "--no-first-run",
        "--window-size=1400,1000",
        f"--user-data-dir={tmp_path / 'profile'}",
    ):
        options.add_argument(flag)
    chrome = webdriver.Chrome(service=Service(driver), options=options)
    chrome.set_page_load_timeout(30)
    try:
        yield chrome
    finally:
        chrome.quit()


def screenshot(browser: WebDriver, tmp_path: Path, name: str) -> Path:
    """Save the page as ``name``.png (and into CONSOLE_SCREENSHOTS when it is set)."""
    path = tmp_path / f"{name}.png"
    browser.save_screenshot(str(path))
    if extra := os.environ.get("CONSOLE_SCREENSHOTS"):
        Path(extra).mkdir(parents=True, exist_ok=True)
        shutil.copy(path, Path(extra) / path.name)
    return path


async def follow(browser: WebDriver, act: Callable[[], object]) -> None:
    """Do ``act`` (a click, a script's form submit), then wait until the page it leads to
    has loaded in place of this one: what is read next is never the old page's. The old
    page is marked in its own window object, which a new page does not have; questions
    asked while the browser is between pages are asked again."""
    browser.execute_script("window.__leaving = true")
    await asyncio.to_thread(act)

    def arrived(driver: WebDriver) -> bool:
        return bool(
            driver.execute_script(
                "return window.__leaving === undefined && document.readyState === 'complete'"
            )
        )

    waiting = WebDriverWait(browser, 15, ignored_exceptions=[WebDriverException])
    await asyncio.to_thread(waiting.until, arrived)


def text_of(browser: WebDriver, element_id: str) -> str:
    """The visible text of the element with this id."""
    found = WebDriverWait(browser, 15).until(
        expected_conditions.presence_of_element_located((By.ID, element_id))
    )  # a click's page may still be loading
    return str(found.text)


async def test_an_operator_finds_dead_letters_dry_runs_and_replays_a_group(
    stack: Stack, browser: WebDriver, tmp_path: Path
) -> None:
    """Log in, the overview, the groups, one dead letter, a group's dry run and replay;
    then each hold expired once and every replay row names alice. Unauthenticated, the
    browser is sent to the login; a form without its CSRF token is refused."""
    holds = await seed_dead_letters(stack, exhausted=3, poison=2)
    async with running_console(stack) as console:
        go = browser.get
        await asyncio.to_thread(go, f"{console.base}/")
        assert browser.current_url.endswith("/login")
        browser.find_element(By.ID, "name").send_keys("alice")
        browser.find_element(By.ID, "password").send_keys(PASSWORDS["alice"])
        await follow(browser, browser.find_element(By.ID, "login").click)
        text_of(browser, "verdict")
        assert "Is anything stuck?" in browser.page_source
        dead = text_of(browser, "dead-by-class")
        assert "db.unavailable" in dead
        assert "poison.not-json" in dead
        screenshot(browser, tmp_path, "overview")

        await asyncio.to_thread(go, f"{console.base}/dead-letters")
        groups = text_of(browser, "groups")
        assert "db.unavailable attempts-exhausted dead 3" in groups
        assert "poison.not-json permanent dead 2" in groups
        screenshot(browser, tmp_path, "dead-letters")
        await follow(browser, browser.find_element(By.CLASS_NAME, "dead-letter").click)
        assert text_of(browser, "field-status") == "dead"
        assert "it will expire" in text_of(browser, "expectation")
        screenshot(browser, tmp_path, "dead-letter")
        # A form without its CSRF token (the browser's own request, the token removed) is
        # refused, and changes nothing.
        detail_url = browser.current_url
        browser.execute_script(
            "document.querySelectorAll('input[name=csrf]').forEach(e => e.remove())"
        )
        browser.find_element(By.ID, "note-text").send_keys("no token")
        await follow(browser, browser.find_element(By.ID, "note").click)
        assert "the form expired" in text_of(browser, "refused")
        await asyncio.to_thread(go, detail_url)
        assert "no token" not in text_of(browser, "events")

        await asyncio.to_thread(go, f"{console.base}/dead-letters?error_class=db.unavailable")
        await follow(browser, browser.find_element(By.CLASS_NAME, "replay-group").click)
        plan = text_of(browser, "plan")
        assert plan.count("the hold is held and due: it will expire") == 3
        assert "replay (dry run): 3 selected, 3 would-republish" in plan
        screenshot(browser, tmp_path, "replay-plan")
        async with running_consumer(stack.settings) as task:
            await wait_for_consumers(stack.amqp_url, 1, task)
            await follow(browser, browser.find_element(By.ID, "confirm").click)
            assert "replay: 3 selected, 3 republished" in text_of(browser, "result")
            await _all_expired(stack, holds)
        screenshot(browser, tmp_path, "replayed")

    per_hold = await transitions_per_reservation(stack.database_url)
    assert [per_hold.get(rid) for rid in holds] == [1, 1, 1]
    async with pg_connection(stack.database_url) as conn:
        replays = await conn.fetch("SELECT operator, outcome, os_user FROM dead_letter_replays")
        open_poison = await conn.fetchval("SELECT count(*) FROM dead_letters WHERE status = 'dead'")
    assert [(r["operator"], r["outcome"]) for r in replays] == [("alice", "republished")] * 3
    assert open_poison == 2  # the poison group was not replayed


async def test_a_confirmed_group_replay_replays_only_what_its_dry_run_listed(
    stack: Stack, browser: WebDriver, tmp_path: Path
) -> None:
    """A group's dry run lists three dead letters; two more of the group arrive before the
    confirm: only the three are replayed (their holds expired once, their records replayed,
    their messages gone from expirations.dead), the two newcomers are named on the result
    page and left as they were. A hand-made confirm that selects nothing changes nothing."""
    listed = await seed_dead_letters(stack, exhausted=3, poison=0)
    async with running_console(stack) as console:
        await _log_in(browser, console.base)
        await asyncio.to_thread(
            browser.get, f"{console.base}/dead-letters?error_class=db.unavailable"
        )
        await follow(browser, browser.find_element(By.CLASS_NAME, "replay-group").click)
        plan = text_of(browser, "plan")
        assert "replay (dry run): 3 selected, 3 would-republish" in plan
        newcomers = await seed_dead_letters(stack, exhausted=2, poison=0)
        async with running_consumer(stack.settings) as task:
            await wait_for_consumers(stack.amqp_url, 1, task)
            await follow(browser, browser.find_element(By.ID, "confirm").click)
            result = text_of(browser, "result")
            await _all_expired(stack, listed)
        screenshot(browser, tmp_path, "replayed-with-newcomers")
        assert "replay: 3 selected, 3 republished" in result
        newcomer_ids = await _record_ids(stack, newcomers)
        for record_id in newcomer_ids:
            assert f"left out #{record_id}" in result
        assert result.count("not in the dry run") == 2

        # A hand-made confirm with no selection (the page's own session and token).
        hand_made = functools.partial(
            browser.execute_script,
            """const token = document.querySelector('input[name=csrf]').value;
            const form = document.createElement('form');
            form.method = 'post'; form.action = '/replay';
            for (const [name, value] of [['csrf', token], ['step', 'confirm'], ['plan', '']]) {
              const input = document.createElement('input');
              input.type = 'hidden'; input.name = name; input.value = value;
              form.appendChild(input);
            }
            document.body.appendChild(form); form.submit();""",
        )
        await follow(browser, hand_made)
        assert "nothing selected" in text_of(browser, "refused")

    async with pg_connection(stack.database_url) as conn:
        states = await conn.fetch(
            "SELECT d.id, d.status, r.status AS hold FROM dead_letters d"
            " JOIN reservations r ON r.id = d.reservation_id"
        )
        replays = await conn.fetchval("SELECT count(*) FROM dead_letter_replays")
    by_id = {row["id"]: (row["status"], row["hold"]) for row in states}
    assert sorted(by_id[i] for i in newcomer_ids) == [("dead", "held")] * 2
    assert (
        sorted(v for k, v in by_id.items() if k not in newcomer_ids)
        == [("replayed", "expired")] * 3
    )
    assert replays == 3
    assert await queue_depth(stack.amqp_url, "expirations.dead") == 2  # the newcomers'
    per_hold = await transitions_per_reservation(stack.database_url)
    assert [per_hold.get(rid) for rid in listed] == [1, 1, 1]


async def _log_in(browser: WebDriver, base: str) -> None:
    await asyncio.to_thread(browser.get, f"{base}/login")
    browser.find_element(By.ID, "name").send_keys("alice")
    browser.find_element(By.ID, "password").send_keys(PASSWORDS["alice"])
    await follow(browser, browser.find_element(By.ID, "login").click)
    text_of(browser, "verdict")  # the overview has loaded


async def _record_ids(stack: Stack, holds: list[UUID]) -> list[int]:
    async with pg_connection(stack.database_url) as conn:
        rows = await conn.fetch(
            "SELECT id FROM dead_letters WHERE reservation_id = ANY($1::uuid[])", holds
        )
    return [row["id"] for row in rows]


async def _all_expired(stack: Stack, holds: list[UUID]) -> None:
    async with asyncio.timeout(60):
        while True:
            async with pg_connection(stack.database_url) as conn:
                held = await conn.fetchval(
                    "SELECT count(*) FROM reservations WHERE id = ANY($1::uuid[])"
                    " AND status <> 'expired'",
                    holds,
                )
            if held == 0:
                return
            await asyncio.sleep(0.2)
