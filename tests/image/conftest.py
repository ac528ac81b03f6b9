"""The image's tests: an empty database and vhost of their own, and their figures printed
at the end of the session (CI's record of what the containers did)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from service.demo.workspace import sandbox_created
from tests.image.containers import Containers, containers_of, image_or_skip
from tests.image.world import FIGURES, World
from tests.support import RUN_ID, Endpoints, Management, without_credentials

_counter = iter(range(1, 1_000_000))


@pytest.fixture
def image() -> str:
    """The image under test (SERVICE_IMAGE)."""
    return image_or_skip()


@pytest.fixture
async def containers(image: str, tmp_path: Path) -> AsyncIterator[Containers]:
    """The test's containers of the image, removed afterwards."""
    async with containers_of(image, tmp_path) as made:
        yield made


@pytest.fixture
async def world(endpoints: Endpoints, containers: Containers) -> AsyncIterator[World]:
    """An empty database (nothing migrated) and an empty vhost (nothing declared)."""
    number = next(_counter)
    async with sandbox_created(
        endpoints.database_url,
        (endpoints.amqp_url,),
        Management(endpoints.management_url),
        database=f"expiry_img_{RUN_ID}_{number}",
        lenient=True,
    ) as box:
        yield World(
            database_url=box.database_url,
            amqp_url=box.amqp_url,
            management_url=without_credentials(endpoints.management_url),
            containers=containers,
        )


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    """What the containers did, one line a figure."""
    if not FIGURES:
        return
    terminalreporter.section("the image: figures")
    for line in FIGURES:
        terminalreporter.write_line(line)
