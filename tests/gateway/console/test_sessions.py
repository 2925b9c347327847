"""Console sessions (vmsched.gateway.console.sessions): signed, expiring, revoked on logout and with their token."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from vmsched.gateway.console.sessions import KIND, MIN_SECRET, Logouts, Sessions, read_secret
from vmsched.tokens import Identity, Role, TokenStore, digest

TOKEN, OTHER = "vms_the-operators-token", "vms_another-token"
SECRET = b"s" * MIN_SECRET


def write_tokens(path: Path, *entries: tuple[str, str, str]) -> None:
    """Replace the tokens file whole (a new inode, as `vmsched token new --file` does)."""
    text = "tokens:\n" + "".join(f"  - name: {name}\n    roles: [{roles}]\n    sha256: {digest(token)}\n"
                                 for name, token, roles in entries)
    tmp = path.with_suffix(".new")
    tmp.write_text(text if entries else "tokens: []\n")
    os.replace(tmp, path)


@pytest.fixture
def store(tmp_path: Path) -> TokenStore:
    path = tmp_path / "tokens.yaml"
    write_tokens(path, ("ops", TOKEN, "read, operate"), ("ci", OTHER, "schedule"))
    return TokenStore(path, check_interval=0)


def ops() -> Identity:
    return Identity("ops", frozenset({Role.READ, Role.OPERATE}), "token")


def test_a_session_names_its_token_without_holding_it(store: TokenStore) -> None:
    sessions = Sessions(SECRET, store)
    cookie, session = sessions.issue(ops(), now=1000.0)
    assert TOKEN not in cookie and digest(TOKEN) not in cookie
    assert session.name == "ops" and session.expires == 1000 + int(sessions.ttl)
    identity, read = sessions.read(cookie, now=1001.0)
    assert read == session and identity == Identity("ops", frozenset({Role.READ, Role.OPERATE}), KIND)
    # another replica with the same secret and tokens file accepts it; one with another secret does not
    assert Sessions(SECRET, store).read(cookie, now=1001.0) is not None
    assert Sessions(b"t" * MIN_SECRET, store).read(cookie, now=1001.0) is None


def test_a_session_expires(store: TokenStore) -> None:
    sessions = Sessions(SECRET, store, ttl=60)
    cookie, _ = sessions.issue(ops(), now=1000.0)
    assert sessions.read(cookie, now=1059.0) is not None
    assert sessions.read(cookie, now=1060.0) is None


@pytest.mark.parametrize("part, value", [(1, "A" * 22), (2, "99999999999"), (3, "Y2k"), (4, "A" * 43)])
def test_a_changed_cookie_is_refused(store: TokenStore, part: int, value: str) -> None:
    sessions = Sessions(SECRET, store)
    cookie, _ = sessions.issue(ops(), now=1000.0)
    parts = cookie.split(".")
    parts[part] = value  # another session ID, a later expiry, another token's name ("ci"), another MAC
    assert sessions.read(".".join(parts), now=1001.0) is None


@pytest.mark.parametrize("cookie", ["", "v1", "v2.a.b.c.d", "v1.x.1.b3Bz.y", "v1." + "A" * 22 + ".1.%%%.y",
                                    "v1." + "A" * 22 + ".1.b3Bz." + "é" * 43, "v1.." * 200])
def test_garbage_is_no_session(store: TokenStore, cookie: str) -> None:
    assert Sessions(SECRET, store).read(cookie) is None and Sessions(SECRET, store).signed(cookie) is None


def test_revoking_the_token_ends_its_sessions(store: TokenStore) -> None:
    sessions = Sessions(SECRET, store)
    cookie, _ = sessions.issue(ops(), now=1000.0)
    path = store.path
    assert path is not None
    write_tokens(path, ("ci", OTHER, "schedule"))  # `vmsched token revoke ops`
    assert sessions.read(cookie, now=1001.0) is None
    write_tokens(path, ("ops", "vms_a-new-token-under-the-old-name", "read"))  # the name again, another token
    assert sessions.read(cookie, now=1001.0) is None
    write_tokens(path, ("ops", TOKEN, "operate"))  # the same token without the read role
    assert sessions.read(cookie, now=1001.0) is None
    write_tokens(path, ("ops", TOKEN, "read"))  # given back: the session is the token's again
    assert sessions.read(cookie, now=1001.0) is not None


def test_logging_out_ends_the_session_on_every_replica_that_hears_of_it(store: TokenStore) -> None:
    sessions, replica = Sessions(SECRET, store), Sessions(SECRET, store)
    cookie, session = sessions.issue(ops(), now=1000.0)
    other, _ = sessions.issue(ops(), now=1000.0)
    assert sessions.logouts.add(session.sid, session.expires, now=1001.0)
    assert sessions.read(cookie, now=1001.0) is None and sessions.signed(cookie) == session
    assert sessions.read(other, now=1001.0) is not None, "another session of the same token stays"
    assert replica.read(cookie, now=1001.0) is not None  # until the logout reaches it (console_logouts)
    for sid, expires in sessions.logouts.entries(now=1001.0):
        replica.logouts.add(sid, expires, now=1001.0)
    assert replica.read(cookie, now=1001.0) is None


def test_only_tokens_get_sessions(store: TokenStore) -> None:
    sessions = Sessions(SECRET, store)
    assert sessions.issue(Identity("CN=engine", frozenset({Role.READ}), "certificate")) is None
    assert sessions.issue(Identity("gone", frozenset({Role.READ}), "token")) is None


def test_the_login_forms_csrf_token_belongs_to_its_cookie(store: TokenStore) -> None:
    sessions = Sessions(SECRET, store)
    cookie, form = sessions.login_form(now=1000.0)
    assert sessions.login_allowed(cookie, form, now=1001.0)
    assert Sessions(SECRET, store).login_allowed(cookie, form, now=1001.0), "any replica with the secret"
    other_cookie, other_form = sessions.login_form(now=1000.0)
    assert not sessions.login_allowed(cookie, other_form, now=1001.0)
    assert not sessions.login_allowed(None, form, now=1001.0)
    assert not sessions.login_allowed(cookie, "", now=1001.0)
    assert not sessions.login_allowed(cookie, form, now=1000.0 + 3600)  # the form expired
    assert not Sessions(b"t" * MIN_SECRET, store).login_allowed(cookie, form, now=1001.0)


def test_the_logout_forms_csrf_token_is_the_sessions(store: TokenStore) -> None:
    sessions = Sessions(SECRET, store)
    _, session = sessions.issue(ops())
    _, other = sessions.issue(ops())
    token = sessions.logout_token(session)
    assert sessions.logout_allowed(session, token) and not sessions.logout_allowed(other, token)
    assert not sessions.logout_allowed(session, "") and not sessions.logout_allowed(session, "é")


def test_logouts_are_kept_until_their_session_expires_and_bounded() -> None:
    book = Logouts(most=3)
    sids = [f"{i:022d}" for i in range(5)]
    assert not book.add("not a session id", 2000, now=1000.0)
    assert not book.add(sids[0], 999, now=1000.0), "already expired: nothing to remember"
    for i, sid in enumerate(sids):
        assert book.add(sid, 2000 + i, now=1000.0)
    assert sorted(book.entries(now=1000.0)) == [(sids[2], 2002), (sids[3], 2003), (sids[4], 2004)]
    assert sids[4] in book and sids[0] not in book  # the ones expiring first were forgotten
    assert book.entries(now=2003.0) == [(sids[4], 2004)]


def test_the_secret_file_is_checked(tmp_path: Path) -> None:
    path = tmp_path / "console.secret"
    with pytest.raises(ValueError, match="cannot read it.*vmsched console-secret --file"):
        read_secret(path)
    path.write_text("short\n")
    with pytest.raises(ValueError, match=f"holds 5 characters, at least {MIN_SECRET}.*vmsched console-secret"):
        read_secret(path)
    path.write_text("x" * MIN_SECRET + "\n")
    assert read_secret(path) == b"x" * MIN_SECRET
