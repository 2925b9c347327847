"""`vmsched token new|list|revoke`, and what the gateway's token store makes of a tokens file that changes."""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.paths import ROOT
from vmsched.tokens import TokenStore, digest, parse


def vmsched(*args: str, cwd: Path, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "vmsched.cli", *args], cwd=cwd, capture_output=True, text=True,
                          timeout=60, env={**os.environ, "PYTHONPATH": str(ROOT), **(env or {})})


def test_new_list_revoke(tmp_path: Path):
    a = vmsched("token", "new", "--name", "alice", "--role", "read", "--file", "t.yaml", cwd=tmp_path).stdout.strip()
    b = vmsched("token", "new", "--name", "bob", "--role", "read", "--role", "operate", cwd=tmp_path,
                env={"VMSCHED_TOKENS_FILE": "t.yaml"}).stdout.strip()
    listed = vmsched("token", "list", "--file", "t.yaml", cwd=tmp_path)
    assert listed.returncode == 0
    assert listed.stdout.splitlines() == ["KIND    NAME   ROLES", "token   alice  read", "token   bob    read,operate"]
    assert a not in listed.stdout and b not in listed.stdout  # the file holds digests, never a token
    as_json = json.loads(vmsched("token", "list", "--json", cwd=tmp_path, env={"VMSCHED_TOKENS_FILE": "t.yaml"}).stdout)
    assert as_json == {"tokens": [{"name": "alice", "roles": ["read"]}, {"name": "bob", "roles": ["read", "operate"]}],
                       "clients": []}
    gone = vmsched("token", "revoke", "carol", "--file", "t.yaml", cwd=tmp_path)
    assert gone.returncode == 2 and "has no token named 'carol' (tokens: alice, bob)" in gone.stderr
    assert vmsched("token", "revoke", "alice", "--file", "t.yaml", cwd=tmp_path).returncode == 0
    assert [t.name for t in parse((tmp_path / "t.yaml").read_text()).tokens] == ["bob"]
    assert vmsched("token", "revoke", "bob", "--file", "t.yaml", cwd=tmp_path).returncode == 0
    text = (tmp_path / "t.yaml").read_text()
    assert "\ntokens: []\n" in text  # explicit: revoke every token, not an empty file
    nofile = vmsched("token", "list", cwd=tmp_path, env={"VMSCHED_TOKENS_FILE": ""})
    assert nofile.returncode == 2 and "Give --file YAML (or VMSCHED_TOKENS_FILE)" in nofile.stderr


def test_tokens_yaml_is_ignored_by_git():
    out = subprocess.run(["git", "check-ignore", "-q", "tokens.yaml"], cwd=ROOT)
    assert out.returncode == 0


TWO = """tokens:
- name: alice
  roles: [read, operate]
  sha256: {a}
- name: bob
  roles:
  - read
  sha256: {b}
"""


FULL = TWO.format(a=digest("token-a"), b=digest("token-b"))


@pytest.fixture
def store(tmp_path: Path) -> TokenStore:
    path = tmp_path / "tokens.yaml"
    path.write_text(FULL)
    return TokenStore(path, check_interval=0)


def names(store: TokenStore) -> set[str]:
    """Who the store lets in, by the tokens' names."""
    found = (store.by_token("token-a"), store.by_token("token-b"))
    return {identity.name for identity in found if identity is not None}


def rewrite(store: TokenStore, text: str) -> None:
    assert store.path is not None
    store.path.write_text(text)
    os.utime(store.path, ns=(0, len(text) + 10**18))  # a new signature even at the same size and second
    store.refresh(force=True)


@pytest.mark.parametrize("text", ["", "\n\n", "# nothing here\n"])
def test_an_emptied_file_keeps_the_last_good_set(store: TokenStore, text: str, caplog: pytest.LogCaptureFixture):
    with caplog.at_level(logging.ERROR, "vmsched.auth"):
        rewrite(store, text)
    assert names(store) == {"alice", "bob"}
    assert "is empty (to revoke every token, write 'tokens: []')" in caplog.text


def test_a_file_cut_off_mid_entry_keeps_the_last_good_set(store: TokenStore):
    full = FULL
    entries = [full.index("- name: alice"), full.index("- name: bob"), len(full)]
    for cut in range(entries[0] + 1, len(full)):
        if cut in entries or cut + 1 in entries:
            continue  # between entries: a shorter file, not a cut one
        rewrite(store, full)
        assert names(store) == {"alice", "bob"}
        rewrite(store, full[:cut])
        assert names(store) == {"alice", "bob"}, f"cut at {cut}: {full[:cut]!r}"
        assert store.last_error


def test_an_explicit_empty_list_revokes_every_token(store: TokenStore):
    rewrite(store, "tokens: []\n")
    assert names(store) == set() and store.last_error is None
