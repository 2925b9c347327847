"""`vmsched token new|list|revoke`, and what the gateway's token store makes of a tokens file that changes."""

from __future__ import annotations

import json
import logging
import os
import re
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


CLIENT = 'clients:\n  - subject: "CN=engine-1,O=Example"\n    roles: [read]\n'
#: Every shape that is not a mapping with a ``tokens:`` list, and what the refusal names.
REFUSED = {
    "an empty file": ("", "is empty (no YAML document)"),
    "blank lines": ("\n  \n", "is empty (no YAML document)"),
    "comments only": ("# nothing here\n", "is empty (no YAML document)"),
    "an empty mapping": ("{}\n", "holds a mapping without a 'tokens:' list"),
    "client subjects alone": (CLIENT, "holds a mapping without a 'tokens:' list"),
    "tokens: with nothing": ("tokens:\n", "'tokens:' holds nothing, not a list of entries"),
    "tokens: null": ("tokens: null\n", "'tokens:' holds nothing, not a list of entries"),
    "tokens: {}": ("tokens: {}\n", "'tokens:' holds a mapping, not a list of entries"),
    "tokens: a name": ("tokens: alice\n", "'tokens:' holds a string, not a list of entries"),
    "a list of entries": (FULL.removeprefix("tokens:\n"), "holds a list, not a mapping with a 'tokens:' list"),
    "an empty list": ("[]\n", "holds a list, not a mapping with a 'tokens:' list"),
    "a word": ("tokens\n", "holds a string, not a mapping with a 'tokens:' list"),
}
REVOKE_ALL = "write 'tokens: []' to revoke every token"


@pytest.mark.parametrize("shape", REFUSED)
def test_a_file_of_another_shape_keeps_the_last_good_set(store: TokenStore, shape: str,
                                                         caplog: pytest.LogCaptureFixture):
    text, reason = REFUSED[shape]
    with caplog.at_level(logging.INFO, "vmsched.auth"):
        rewrite(store, text)
    assert names(store) == {"alice", "bob"}
    assert store.last_error and reason in store.last_error and REVOKE_ALL in store.last_error
    [record] = [r for r in caplog.records if "reloaded" in r.getMessage()]
    assert record.levelno == logging.ERROR, record.getMessage()
    assert "keeping the last good set of 2 tokens" in record.getMessage() and reason in record.getMessage()
    rewrite(store, FULL)  # fixed: picked up again
    assert names(store) == {"alice", "bob"} and store.last_error is None


@pytest.mark.parametrize("shape", REFUSED)
def test_a_file_of_another_shape_refuses_the_start(tmp_path: Path, shape: str):
    text, reason = REFUSED[shape]
    path = tmp_path / "tokens.yaml"
    path.write_text(text)
    with pytest.raises(ValueError, match=re.escape(reason)):
        TokenStore(path)
    out = subprocess.run([sys.executable, "-P", "-m", "vmsched.cli", "gateway", "--amqp", "memory://", "--port", "0",
                          "--tokens-file", str(path)], cwd=ROOT, capture_output=True, text=True, timeout=60,
                         env={**os.environ, "VMSCHED_METRICS_PORT": "0"})
    assert out.returncode == 2, out.stderr
    [line] = out.stderr.strip().splitlines()  # one line, nothing started
    assert line.startswith(f"vmsched: error: tokens file {path}") and reason in line and REVOKE_ALL in line


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


def test_a_file_of_client_subjects_alone_says_tokens_empty(tmp_path: Path):
    """mTLS only: `tokens: []` beside the subjects, at start and after a change."""
    path = tmp_path / "tokens.yaml"
    path.write_text("tokens: []\n" + CLIENT)
    store = TokenStore(path, check_interval=0)
    assert names(store) == set() and store.by_subject("CN=engine-1,O=Example") is not None
    rewrite(store, FULL + CLIENT)
    assert names(store) == {"alice", "bob"} and store.by_subject("CN=engine-1,O=Example") is not None


def test_the_token_commands_write_tokens_when_none_is_left(tmp_path: Path):
    """`vmsched token revoke` of the last token leaves a file the gateway reads as "no token", clients kept."""
    path = tmp_path / "t.yaml"
    path.write_text(TWO.format(a=digest("token-a"), b=digest("token-b")) + CLIENT)
    for name in ("alice", "bob"):
        assert vmsched("token", "revoke", name, "--file", str(path), cwd=tmp_path).returncode == 0
    doc = parse(path.read_text())
    assert doc.tokens == [] and [c.subject for c in doc.clients] == ["CN=engine-1,O=Example"]
    assert "tokens: []" in path.read_text()
    assert names(TokenStore(path)) == set()
    listed = vmsched("token", "list", "--file", str(path), cwd=tmp_path)
    assert listed.returncode == 0 and "client  CN=engine-1,O=Example  read" in listed.stdout
