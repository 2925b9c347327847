"""``vmsched token new|list|revoke``: the gateway's bearer tokens, in its tokens file."""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from pathlib import Path
from typing import Any

import yaml
from pydantic import ValidationError

from vmsched.tokens import Role, TokenEntry, TokensDocument, digest, new_token, parse

HEADER = "# vmsched tokens: sha256 digests only (vmsched token new); re-read on change\n"


def read_document(path: Path) -> TokensDocument:
    return parse(path.read_text(), f"tokens file {path}") if path.exists() else TokensDocument()


def write_document(path: Path, doc: TokensDocument) -> None:
    """Write ``doc`` to ``path`` (created 0600), replaced atomically so readers see old or new.

    ``tokens:`` is always written, ``tokens: []`` when none is left: the gateway
    reads that as "revoke every token", and an empty file as a broken one.
    """
    data = doc.model_dump(mode="json", exclude=None if doc.clients else {"clients"})
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    try:
        with os.fdopen(fd, "w") as f:
            f.write(HEADER + yaml.safe_dump(data, sort_keys=False))
        if path.exists():
            os.chmod(tmp, path.stat().st_mode & 0o777)
        os.replace(tmp, path)
    except BaseException:
        os.unlink(tmp)
        raise


def _file(args: argparse.Namespace) -> Path:
    if args.file is None:
        raise ValueError(f"vmsched token {args.verb}: which tokens file? Give --file YAML (or VMSCHED_TOKENS_FILE)")
    return args.file


def cmd_new(args: argparse.Namespace) -> int:
    roles = [Role(r) for r in dict.fromkeys(args.role)]
    token = new_token()
    try:
        entry = TokenEntry(name=args.name, roles=roles, sha256=digest(token))
    except ValidationError:
        raise ValueError(f"token name {args.name!r}: letters, digits and . _ @ : - only (at most 128)") from None
    if args.file is not None:  # added to the file, created if missing
        doc = read_document(args.file)
        if any(t.name == entry.name for t in doc.tokens):
            raise ValueError(f"{args.file} already has a token named {entry.name!r} (names are unique; "
                             f"`vmsched token revoke {entry.name}` first to rotate)")
        doc.tokens.append(entry)
        write_document(args.file, doc)
        print(f"added token {args.name!r} ({', '.join(r.value for r in roles)}) to {args.file}; "
              "the token is printed once, on stdout", file=sys.stderr)
    else:
        print("# add this under 'tokens:' in the tokens file (the token itself is printed once, on stdout):",
              file=sys.stderr)
        print(yaml.safe_dump([entry.model_dump(mode="json")], sort_keys=False), end="", file=sys.stderr)
    print(token)
    return 0


def cmd_list(args: argparse.Namespace) -> int:
    path = _file(args)
    if not path.exists():
        raise ValueError(f"tokens file {path} does not exist (`vmsched token new --file {path}` makes one)")
    doc = read_document(path)
    if args.json:
        shown = doc.model_dump(mode="json", exclude={"tokens": {"__all__": {"sha256"}}})  # names and roles only
        print(json.dumps(shown, indent=2))
        return 0
    rows = [("token", t.name, t.roles) for t in doc.tokens] + [("client", c.subject, c.roles) for c in doc.clients]
    width = max([len("NAME"), *(len(name) for _, name, _ in rows)])
    print(f"{'KIND':<7} {'NAME':<{width}}  ROLES")
    for kind, name, roles in rows:
        print(f"{kind:<7} {name:<{width}}  {','.join(r.value for r in roles)}")
    if not doc.tokens:
        print(f"no token in {path}: every /v1 call answers 401", file=sys.stderr)
    return 0


def cmd_revoke(args: argparse.Namespace) -> int:
    path = _file(args)
    if not path.exists():
        raise ValueError(f"tokens file {path} does not exist")
    doc = read_document(path)
    kept = [t for t in doc.tokens if t.name != args.name]
    if len(kept) == len(doc.tokens):
        known = ", ".join(t.name for t in doc.tokens) or "none"
        raise ValueError(f"{path} has no token named {args.name!r} (tokens: {known})")
    doc.tokens = kept
    write_document(path, doc)
    print(f"revoked token {args.name!r} in {path} ({len(kept)} left); a running gateway drops it within a second",
          file=sys.stderr)
    return 0


def register(sub: Any) -> None:  # sub: what argparse's add_subparsers() returned
    p = sub.add_parser("token", help="bearer tokens of the JSON API",
                       description="Manage the gateway's bearer tokens (docs/api-auth.md). The gateway re-reads "
                                   "its tokens file when it changes.")
    verbs = p.add_subparsers(dest="verb", metavar="VERB", required=True)
    n = verbs.add_parser("new", help="make a random token: printed once on stdout, only its sha256 is stored",
                         description="Make a random token. The token goes to stdout, once; the tokens file keeps "
                                     "only its sha256. With --file the entry is added to that file (the gateway "
                                     "re-reads it); without, the YAML entry to add is printed on stderr.")
    n.add_argument("--name", required=True, help="who holds the token (audit lines name it); unique in the file")
    n.add_argument("--role", required=True, action="append", choices=[r.value for r in Role],
                   help="a role of the token; repeat for several")
    n.add_argument("--file", type=Path, metavar="YAML", help="add the entry to this tokens file (created if missing)")
    n.set_defaults(func=cmd_new)
    ls = verbs.add_parser("list", help="list the tokens (names and roles) and client subjects of a tokens file",
                          description="List the names and roles of the tokens, and the client certificate "
                                      "subjects, of a tokens file (it holds no token, only digests).")
    ls.add_argument("--file", type=Path, metavar="YAML", help="the tokens file")
    ls.add_argument("--json", action="store_true", help="print JSON instead of a table")
    ls.set_defaults(func=cmd_list)
    r = verbs.add_parser("revoke", help="remove a token from a tokens file (a running gateway drops it)",
                         description="Remove the token NAME from a tokens file. A running gateway re-reads the "
                                     "file and refuses the token within a second. Revoking the last token writes "
                                     "'tokens: []', which revokes every token.")
    r.add_argument("name", metavar="NAME", help="the token's name (`vmsched token list` shows them)")
    r.add_argument("--file", type=Path, metavar="YAML", help="the tokens file")
    r.set_defaults(func=cmd_revoke)
