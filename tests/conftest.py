"""Shared fixtures: real vmsched processes on the embedded bus and on RabbitMQ.

The helpers they use, and that tests import, are in tests/support/.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Iterator

import pytest

from tests.support.rabbit import RABBIT_URL, private_vhost
from tests.support.stack import BUSES, TEST_ENV, TEST_TOKEN, Stack, start_all_in_one

if os.geteuid() == 0:  # as root, workers switch to `nobody`, who cannot read a Python under /root
    # (a pyenv install, say), so services started by tests run plugins as root without capabilities instead;
    # tests/runtime/worker/test_sandbox.py covers the switch itself with a Python `nobody` can read.
    os.environ.setdefault("VMSCHED_ALLOW_ROOT_PLUGINS", "true")


@pytest.fixture(scope="session", autouse=True)
def test_tokens_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from vmsched.tokens import digest

    path = tmp_path_factory.mktemp("tokens") / "tokens.yaml"
    path.write_text(f"tokens:\n  - name: tests\n    roles: [read, schedule, operate]\n"
                    f"    sha256: {digest(TEST_TOKEN)}\n")
    TEST_ENV["VMSCHED_TOKENS_FILE"] = str(path)
    return path


@pytest.fixture
def plugins(tmp_path: Path) -> Path:
    """An empty plugins folder for a test to write plugin files into."""
    folder = tmp_path / "plugins"
    folder.mkdir()
    return folder


@pytest.fixture(scope="session")
def rabbit_vhost() -> Iterator[str]:
    """A private vhost on the real broker, so test stacks never share queues."""
    with private_vhost("vmsched-test") as vhost:
        yield RABBIT_URL + vhost


@pytest.fixture(scope="module", params=BUSES)
def stack(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    """The all-in-one process on the embedded bus, then on RabbitMQ (one per test module)."""
    bus = "memory://" if request.param == "memory" else request.getfixturevalue("rabbit_vhost")
    s = start_all_in_one(tmp_path_factory.mktemp(request.param), bus)
    yield s
    s.stop()
