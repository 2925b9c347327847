"""The release's version, its CHANGELOG.md and the docs agree.

pyproject.toml's version is the one vmsched reports, the newest section of CHANGELOG.md and of
docs/upgrading.md (which links the changelog), and the one the image tags and file names in the docs name.
"""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

import pytest

import vmsched
from tests.support.paths import ROOT

VERSION = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]
CHANGELOG = ROOT / "CHANGELOG.md"
UPGRADING = ROOT / "docs" / "upgrading.md"


def _sections(path: Path) -> list[str]:
    return re.findall(r"^## (.+)$", path.read_text(), re.M)


def _links(path: Path) -> list[Path]:
    """The files a Markdown file's relative links point at (anchors left off)."""
    targets = re.findall(r"\]\(([^)\s]+)\)", path.read_text())
    return [(path.parent / t.split("#", 1)[0]).resolve() for t in targets
            if not re.match(r"[a-z]+:", t) and not t.startswith("#")]


def test_vmsched_reports_the_version_of_pyproject() -> None:
    assert vmsched.__version__ == VERSION


@pytest.mark.parametrize("path", [CHANGELOG, UPGRADING], ids=lambda p: p.name)
def test_the_newest_section_is_this_version(path: Path) -> None:
    sections = _sections(path)
    assert sections and sections[0] == VERSION, f"{path.name}: sections {sections}, version {VERSION}"
    assert len(sections) == len(set(sections)), f"{path.name}: a version twice"


def test_the_changelog_links_files_that_exist() -> None:
    links = _links(CHANGELOG)
    assert UPGRADING in links
    assert [str(p.relative_to(ROOT)) for p in links if not p.is_file()] == []


@pytest.mark.parametrize("path", [UPGRADING, ROOT / "README.md"], ids=lambda p: p.name)
def test_the_changelog_is_linked(path: Path) -> None:
    assert CHANGELOG in _links(path), f"{path.name} does not link CHANGELOG.md"


def test_image_tags_and_file_names_name_this_version() -> None:
    files = [ROOT / "Dockerfile", ROOT / "compose.yaml", ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
    named = {(str(f.relative_to(ROOT)), m.group(0), m.group(1)) for f in files
             for m in re.finditer(r"\bvmsched(?:-agent)?[:-](\d+(?:\.\d+)+)", f.read_text())}
    assert named, "no image tag or file name with a version found"
    assert sorted((f, text) for f, text, version in named if version != VERSION) == []
