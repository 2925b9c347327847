"""``vmsched console-secret``: the secret that signs the console's sessions, made once."""

from __future__ import annotations

import argparse
import os
import secrets
import sys
from pathlib import Path
from typing import Any


def cmd_secret(args: argparse.Namespace) -> int:
    """A new random secret (384 bits, URL-safe text) in a new file at ``--file``, mode 0600."""
    try:
        fd = os.open(args.file, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:
        raise ValueError(f"{args.file} exists: it is kept (delete it first to make a new secret, which ends every "
                         "console session)") from None
    with os.fdopen(fd, "w") as f:
        f.write(secrets.token_urlsafe(48) + "\n")
    print(f"wrote a new console secret to {args.file} (mode 0600); give the same file to every gateway replica "
          "(--console-secret-file, env VMSCHED_CONSOLE_SECRET_FILE)", file=sys.stderr)
    return 0


def register(sub: Any) -> None:  # sub: what argparse's add_subparsers() returned
    p = sub.add_parser("console-secret", help="make the secret that signs console sessions (never printed)",
                       description="Write a new random secret to FILE (created with mode 0600; an existing file is "
                                   "left as it is, with an error). Every gateway replica reads the same file (--console-secret-file) to sign "
                                   "and check console sessions (docs/console.md).")
    p.add_argument("--file", type=Path, metavar="FILE", required=True, help="the file to create")
    p.set_defaults(func=cmd_secret)
