"""The console's own sessions: a signed cookie, read-only, expiring, revoked on logout and with its token.

Logging in with a token (``POST /login``) gives the browser a session cookie,
never the token. The cookie is ``v1.<session id>.<expiry>.<token name>.<mac>``:
a random session ID, the UNIX time it expires, the name of the token it was
made from (base64url) and an HMAC-SHA256, keyed with the console secret, over
those and the token's sha256 digest as the tokens file holds it. A page
request is accepted while:

- the MAC matches: only a holder of the console secret makes sessions, and a
  session names the very token it came from (a token made again under the same
  name has another digest);
- it has not expired (``--console-session-ttl``);
- the tokens file still has that token, with the ``read`` role (revoking the
  token ends its sessions on every replica: each reads the same file);
- its ID is not in the logout list (:class:`Logouts`; shared by the replicas
  over the bus, :mod:`vmsched.gateway.console.logouts`).

Nothing else is kept per session, so any replica with the same secret and
tokens file accepts it. The login form carries a CSRF token: the MAC of a
nonce that ``GET /login`` also puts in a short-lived cookie; the logout form
one of the session's ID. The secret is read from ``--console-secret-file``;
without one the process makes a random secret, so its sessions end with it and
no other replica accepts them.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import re
import secrets
import threading
import time
from dataclasses import dataclass
from http.cookies import CookieError, SimpleCookie
from pathlib import Path

from starlette.types import Scope

from vmsched.gateway.strict_json import header
from vmsched.tokens import Identity, Role, TokenStore


#: the session cookie, and the login form's CSRF cookie
COOKIE = "vmsched_console"
LOGIN_COOKIE = "vmsched_login"
#: seconds a session lasts by default, and a login form
DEFAULT_TTL = 8 * 3600.0
LOGIN_TTL = 3600
#: the shortest console secret accepted, characters
MIN_SECRET = 32
#: logged-out sessions remembered at most (until they expire); past it the one expiring first is forgotten
MAX_LOGOUTS = 100_000
#: what a session is called in audit lines (``via``)
KIND = "console session"

_SID = re.compile(r"^[A-Za-z0-9_-]{22}$")
_NONCE = _SID
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._@:-]{0,127}$")
_MAX_COOKIE = 512


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def _unb64(text: str) -> str | None:
    try:
        return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4)).decode()
    except (ValueError, UnicodeDecodeError):
        return None


def read_secret(path: Path) -> bytes:
    """The console secret in ``path`` (surrounding whitespace ignored); ValueError saying what to do otherwise."""
    try:
        text = path.read_text().strip()
    except (OSError, UnicodeDecodeError) as exc:
        raise ValueError(f"console secret file {path}: cannot read it ({exc}); make one with "
                         f"`vmsched console-secret --file {path}`") from None
    if len(text) < MIN_SECRET:
        raise ValueError(f"console secret file {path}: holds {len(text)} characters, at least {MIN_SECRET} are "
                         f"needed; make one with `vmsched console-secret --file {path}`")
    return text.encode()


@dataclass(frozen=True)
class Session:
    """A console session as its cookie names it."""

    sid: str
    name: str  # the token's name
    expires: int  # UNIX time


class Logouts:
    """Logged-out session IDs, each until its session would have expired anyway. Thread-safe, bounded."""

    def __init__(self, most: int = MAX_LOGOUTS) -> None:
        self.most = most
        self._until: dict[str, int] = {}
        self._lock = threading.Lock()

    def add(self, sid: str, expires: int, now: float | None = None) -> bool:
        """Remember a logout; False when it is not well formed or over already."""
        now = time.time() if now is None else now
        if not isinstance(sid, str) or not _SID.match(sid) or type(expires) is not int or expires <= now:
            return False
        with self._lock:
            self._until[sid] = expires
            if len(self._until) > self.most:
                self._prune(now)
                while len(self._until) > self.most:
                    del self._until[min(self._until, key=self._until.__getitem__)]
        return True

    def __contains__(self, sid: str) -> bool:
        return sid in self._until

    def entries(self, now: float | None = None) -> list[tuple[str, int]]:
        """Every logout still to remember: (session ID, expiry)."""
        with self._lock:
            self._prune(time.time() if now is None else now)
            return list(self._until.items())

    def _prune(self, now: float) -> None:
        for sid in [s for s, until in self._until.items() if until <= now]:
            del self._until[sid]


class Sessions:
    """Makes and checks console sessions and the CSRF tokens of the login and logout forms."""

    def __init__(self, secret: bytes | None, tokens: TokenStore, logouts: Logouts | None = None,
                 ttl: float = DEFAULT_TTL) -> None:
        """``secret``: the console secret (:func:`read_secret`), None for a random one of this process."""
        self.shared = secret is not None  # False: a random secret of this process
        secret = secrets.token_bytes(32) if secret is None else secret
        self._key = hashlib.sha256(b"vmsched console v1\0" + secret).digest()
        self.tokens = tokens
        self.logouts = logouts or Logouts()
        self.ttl = ttl

    def _mac(self, purpose: str, *parts: str) -> str:
        message = "\0".join((purpose, *parts)).encode()
        return _b64(hmac.new(self._key, message, hashlib.sha256).digest())

    # --- sessions -------------------------------------------------------------------------------
    def issue(self, identity: Identity, now: float | None = None) -> tuple[str, Session] | None:
        """A new session of the token ``identity`` names: its cookie value and itself (None: no such token)."""
        found = self.tokens.by_name(identity.name) if identity.kind == "token" else None
        if found is None:
            return None
        _, digest = found
        session = Session(_b64(secrets.token_bytes(16)), identity.name,
                          int((time.time() if now is None else now) + self.ttl))
        mac = self._mac("session", session.sid, str(session.expires), session.name, digest)
        return f"v1.{session.sid}.{session.expires}.{_b64(session.name.encode())}.{mac}", session

    def read(self, value: str | None, now: float | None = None) -> tuple[Identity, Session] | None:
        """The identity and session of a cookie value while it is valid (see the module), else None."""
        session, token = self._parse(value)
        if session is None or token is None or Role.READ not in token.roles:
            return None
        if session.expires <= (time.time() if now is None else now) or session.sid in self.logouts:
            return None
        return Identity(session.name, token.roles, KIND), session

    def signed(self, value: str | None) -> Session | None:
        """The session a cookie names if its MAC matches, expired or logged out or not (to log it out)."""
        return self._parse(value)[0]

    def _parse(self, value: str | None) -> tuple[Session | None, Identity | None]:
        """The session a cookie names and its token, if the tokens file has it and the MAC matches."""
        if not value or len(value) > _MAX_COOKIE:
            return None, None
        parts = value.split(".")
        if len(parts) != 5 or parts[0] != "v1" or not _SID.match(parts[1]) or not parts[2].isdigit():
            return None, None
        name = _unb64(parts[3])
        if name is None or not _NAME.match(name):
            return None, None
        found = self.tokens.by_name(name)
        if found is None:
            return None, None
        token, digest = found
        if not hmac.compare_digest(parts[4].encode(), self._mac("session", parts[1], parts[2], name, digest).encode()):
            return None, None
        return Session(parts[1], name, int(parts[2])), token

    # --- CSRF -------------------------------------------------------------------------------------
    def login_form(self, now: float | None = None) -> tuple[str, str]:
        """(cookie value, form token) of a login form: the token is the MAC of the cookie's nonce and expiry."""
        nonce, expires = _b64(secrets.token_bytes(16)), str(int((time.time() if now is None else now) + LOGIN_TTL))
        return f"{nonce}.{expires}", self._mac("login", nonce, expires)

    def login_allowed(self, cookie: str | None, form_token: str, now: float | None = None) -> bool:
        """Does the form's CSRF token belong to the login cookie, which has not expired?"""
        nonce, _, expires = (cookie or "").partition(".")
        if not _NONCE.match(nonce) or not expires.isdigit() or int(expires) <= (time.time() if now is None else now):
            return False
        return hmac.compare_digest(form_token.encode(), self._mac("login", nonce, expires).encode())

    def logout_token(self, session: Session) -> str:
        return self._mac("logout", session.sid)

    def logout_allowed(self, session: Session, form_token: str) -> bool:
        return hmac.compare_digest(form_token.encode(), self.logout_token(session).encode())


def cookie(scope: Scope, name: str) -> str | None:
    """The value of the request's cookie ``name``, or None."""
    raw = header(scope, b"cookie")
    if not raw:
        return None
    try:
        morsel = SimpleCookie(raw.decode("latin-1")).get(name)
    except CookieError:
        return None
    return morsel.value if morsel is not None and morsel.value else None
