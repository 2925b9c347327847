"""Bearer tokens and client-certificate subjects, mapped to roles, from a YAML file.

The file holds only sha256 digests of the tokens, never a token::

    tokens:
      - name: ovirt-ops          # who, in audit lines
        roles: [read, operate]   # read | schedule | operate
        sha256: 9f86d081...      # hex sha256 of the token
    clients:                     # optional: mTLS client certificates
      - subject: "CN=engine-1"
        roles: [schedule]

The file is re-read when it changes (its inode, size or mtime: a Kubernetes
Secret mount swaps a symlink), at most every ``check_interval`` seconds. Only
a mapping with a ``tokens:`` list is a tokens file: ``tokens: []`` revokes
every token (a file of client subjects alone says so too). Anything else (a
missing file, an empty one, ``{}``, ``tokens:`` with nothing or a mapping
after it, a list, one cut off mid-entry) is refused: at start with the
reason, after a change by keeping the last good set, the reason logged as an
error and counted (``vmsched_auth_tokens_reloads_total``).
"""

from __future__ import annotations

import hashlib
import hmac
import logging
import secrets
import threading
import time
from dataclasses import dataclass
from enum import Enum
from pathlib import Path
from typing import Annotated, Callable

import yaml
from pydantic import BaseModel, ConfigDict, Field, StringConstraints, ValidationError, field_validator

from vmsched import metrics
from vmsched.tls import file_signature

log = logging.getLogger("vmsched.auth")

#: The longest bearer token a gateway reads (longer: refused before hashing).
MAX_TOKEN = 4096


class Role(str, Enum):
    READ = "read"
    SCHEDULE = "schedule"
    OPERATE = "operate"


Name = Annotated[str, StringConstraints(pattern=r"^[A-Za-z0-9][A-Za-z0-9._@:-]{0,127}$")]


class TokenEntry(BaseModel):
    model_config = ConfigDict(extra="forbid")
    name: Name = Field(description="who holds the token, as audit lines name it")
    roles: list[Role] = Field(min_length=1)
    sha256: Annotated[str, StringConstraints(pattern=r"^[0-9a-fA-F]{64}$")]

    @field_validator("sha256")
    @classmethod
    def _lower(cls, value: str) -> str:
        return value.lower()


class ClientEntry(BaseModel):
    model_config = ConfigDict(extra="forbid")
    subject: Annotated[str, StringConstraints(min_length=1, max_length=1024)] = Field(
        description="the certificate's subject as RFC 4514 text, e.g. 'CN=engine-1,O=example'")
    roles: list[Role] = Field(min_length=1)


class TokensDocument(BaseModel):
    model_config = ConfigDict(extra="forbid")
    tokens: list[TokenEntry] = Field(default_factory=list)
    clients: list[ClientEntry] = Field(default_factory=list)


@dataclass(frozen=True)
class Identity:
    """Who made a request: a token's name or a certificate's subject, and its roles."""

    name: str
    roles: frozenset[Role]
    kind: str  # "token" or "certificate"


def digest(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


def new_token() -> str:
    """A fresh random token (256 bits, URL-safe)."""
    return "vms_" + secrets.token_urlsafe(32)


#: What every refusal of a file's shape ends with: how to say "no token" on purpose.
REVOKE_ALL = "write 'tokens: []' to revoke every token"


def parse(text: str, source: str = "tokens file") -> TokensDocument:
    """Parse and check a tokens file; ValueError with every problem otherwise.

    Only a mapping with a ``tokens:`` list is read: any other shape (no document, ``{}``, ``tokens:`` with
    nothing or a mapping after it, a list) is refused, never read as "no token".
    """
    try:
        raw = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise ValueError(f"{source}: not valid YAML: {' '.join(str(exc).split())}") from None
    if raw is None:
        raise ValueError(f"{source} is empty (no YAML document); {REVOKE_ALL}")
    if not isinstance(raw, dict) or "tokens" not in raw:
        found = "a mapping without" if isinstance(raw, dict) else f"{_kind(raw)}, not a mapping with"
        raise ValueError(f"{source} holds {found} a 'tokens:' list; {REVOKE_ALL}")
    if not isinstance(raw["tokens"], list):
        raise ValueError(f"{source}: 'tokens:' holds {_kind(raw['tokens'])}, not a list of entries; {REVOKE_ALL}")
    try:
        doc = TokensDocument.model_validate(raw)
    except ValidationError as exc:
        problems = "; ".join(f"{'.'.join(str(p) for p in e['loc'])}: {e['msg']}" for e in exc.errors())
        raise ValueError(f"{source}: {problems}") from None
    if len({t.name for t in doc.tokens}) != len(doc.tokens):
        raise ValueError(f"{source}: token names must be unique (audit lines name them)")
    if len({t.sha256 for t in doc.tokens}) != len(doc.tokens):
        raise ValueError(f"{source}: the same token digest appears twice")
    return doc


def _kind(value: object) -> str:
    """What a YAML value is, in a refusal: "nothing", "a mapping", "a list", "a string", ..."""
    names = {type(None): "nothing", dict: "a mapping", list: "a list", str: "a string", bool: "a boolean",
             int: "a number", float: "a number"}
    return names.get(type(value), "a scalar")


class TokenStore:
    """The current tokens and clients, re-read when the file changes."""

    def __init__(self, path: Path | None, check_interval: float = 0.5) -> None:
        self.path = path
        self.check_interval = check_interval
        self._lock = threading.Lock()
        self._doc = TokensDocument()
        self._signature: tuple[int, int, int, int] | None = None
        self._checked = 0.0
        self.last_error: str | None = None
        if path is not None:
            self._signature = file_signature(path)
            if self._signature is None:
                raise ValueError(f"tokens file {path} does not exist (create one with `vmsched token new`)")
            self._install(parse(path.read_text(), f"tokens file {path}"))

    @property
    def configured(self) -> bool:
        return self.path is not None

    def _install(self, doc: TokensDocument) -> None:
        self._doc = doc
        metrics.AUTH_TOKENS.set(len(doc.tokens))
        metrics.AUTH_CLIENTS.set(len(doc.clients))

    def refresh(self, force: bool = False) -> None:
        """Re-read the file if it changed (at most every ``check_interval`` s unless forced)."""
        if self.path is None:
            return
        now = time.monotonic()
        if not force and now - self._checked < self.check_interval:
            return
        with self._lock:
            self._checked = now
            signature = file_signature(self.path)
            if signature == self._signature:
                return
            self._signature = signature
            try:
                if signature is None:
                    raise ValueError(f"tokens file {self.path} is missing")
                doc = parse(self.path.read_text(), f"tokens file {self.path}")
            except (OSError, ValueError) as exc:
                self.last_error = str(exc)
                metrics.AUTH_RELOADS.labels(outcome="error").inc()
                log.error("tokens file not reloaded, keeping the last good set of %d tokens: %s",
                          len(self._doc.tokens), exc)
                return
            self.last_error = None
            self._install(doc)
            metrics.AUTH_RELOADS.labels(outcome="ok").inc()
            log.info("tokens file %s reloaded: %d tokens, %d client subjects",
                     self.path, len(doc.tokens), len(doc.clients))

    def watch(self) -> "TokenStore":
        """Also re-check in a background thread, so a broken update is logged before the next request."""
        if self.path is not None and not getattr(self, "_watcher", None):
            def loop() -> None:
                while True:
                    time.sleep(self.check_interval)
                    self.refresh()

            self._watcher = threading.Thread(target=loop, name="tokens-watch", daemon=True)
            self._watcher.start()
        return self

    def by_token(self, token: str) -> Identity | None:
        self.refresh()
        wanted = digest(token)
        found = None
        for entry in self._doc.tokens:  # no early exit: the same work for every token
            if hmac.compare_digest(entry.sha256, wanted):
                found = entry
        return Identity(found.name, frozenset(found.roles), "token") if found else None

    def by_name(self, name: str) -> tuple[Identity, str] | None:
        """The token named ``name`` and its sha256 digest, or None (a session of the console checks both)."""
        self.refresh()
        for entry in self._doc.tokens:
            if entry.name == name:
                return Identity(entry.name, frozenset(entry.roles), "token"), entry.sha256
        return None

    def by_subject(self, subject: str) -> Identity | None:
        self.refresh()
        for entry in self._doc.clients:
            if entry.subject == subject:
                return Identity(subject, frozenset(entry.roles), "certificate")
        return None


def bearer_authorizer(store: TokenStore, role: Role) -> Callable[[dict[str, str]], str | None]:
    """For plain HTTP listeners (metrics): lower-cased headers -> None when allowed, else the reason."""

    def authorize(headers: dict[str, str]) -> str | None:
        scheme, _, token = headers.get("authorization", "").strip().partition(" ")
        if scheme.lower() != "bearer" or not token.strip():
            return f"send 'Authorization: Bearer <token>' of a token with the {role.value} role"
        identity = store.by_token(token.strip())
        if identity is None:
            return "unknown or revoked token"
        if role not in identity.roles:
            return f"token {identity.name!r} lacks the {role.value} role"
        return None

    return authorize
