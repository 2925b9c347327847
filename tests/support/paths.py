"""Where things are: the repository and the test tree's own files."""

from __future__ import annotations

from pathlib import Path

#: The repository's root folder.
ROOT = Path(__file__).resolve().parents[2]
#: The plugins most tests load (copied per test by ``stack.plugin_copy``).
TEST_PLUGINS = ROOT / "tests" / "plugins"
