"""``vmsched token new``: a fresh bearer token, shown once, and its hashed entry."""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
from pathlib import Path

import yaml
from pydantic import ValidationError

from vmsched.tokens import Role, TokenEntry, digest, entry_yaml, new_token, parse


def add_entry(path: Path, entry: TokenEntry) -> None:
    """Add ``entry`` to the tokens file at ``path`` (created 0600), replaced atomically so readers see old or new."""
    doc = parse(path.read_text(), str(path)) if path.exists() else parse("")
    if any(t.name == entry.name for t in doc.tokens):
        raise ValueError(f"{path} already has a token named {entry.name!r} (names are unique; remove it first to rotate)")
    doc.tokens.append(entry)
    data = doc.model_dump(mode="json", exclude_defaults=False)
    if not data["clients"]:
        del data["clients"]
    text = "# vmsched tokens: sha256 digests only (vmsched token new); re-read on change\n"
    text += yaml.safe_dump(data, sort_keys=False)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    try:
        with os.fdopen(fd, "w") as f:
            f.write(text)
        if path.exists():
            os.chmod(tmp, path.stat().st_mode & 0o777)
        os.replace(tmp, path)
    except BaseException:
        os.unlink(tmp)
        raise


def cmd_new(args: argparse.Namespace) -> int:
    roles = [Role(r) for r in dict.fromkeys(args.role)]
    token = new_token()
    try:
        entry = TokenEntry(name=args.name, roles=roles, sha256=digest(token))
    except ValidationError:
        raise ValueError(f"token name {args.name!r}: letters, digits and . _ @ : - only (at most 128)") from None
    if args.file is not None:
        add_entry(args.file, entry)
        print(f"added token {args.name!r} ({', '.join(r.value for r in roles)}) to {args.file}; "
              "the token is printed once, on stdout", file=sys.stderr)
    else:
        print("# add this under 'tokens:' in the tokens file (the token itself is printed once, on stdout):",
              file=sys.stderr)
        print(entry_yaml(args.name, roles, token), end="", file=sys.stderr)
    print(token)
    return 0


def register(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    p = sub.add_parser("token", help="bearer tokens of the JSON API",
                       description="Manage the gateway's bearer tokens (docs/api-auth.md).")
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
