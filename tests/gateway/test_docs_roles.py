"""docs/api-auth.md's role table is the gateway's: every route with its role, no other.

ROUTE_ROLES is the app's own table: the gateway refuses to start with a route it does not name
(vmsched.gateway.auth.check_routes).
"""

from __future__ import annotations

import re
from pathlib import Path

from vmsched.gateway.auth import ROUTE_ROLES
from vmsched.tokens import Role

DOC = Path(__file__).resolve().parents[2] / "docs" / "api-auth.md"


def documented() -> dict[tuple[str, str], str]:
    text = DOC.read_text()
    table = text[text.index("| role | routes |"):]
    table = table[:table.index("\n\n")]
    found: dict[tuple[str, str], str] = {}
    for row in table.splitlines()[2:]:
        role = re.match(r"\| `(\w+)` \|", row)
        assert role, f"a row of the role table that names no role: {row}"
        for method, path in re.findall(r"`(GET|POST|PUT|DELETE|PATCH) (/[^`]*)`", row):
            assert (method, path) not in found, f"{method} {path} is listed twice"
            found[(method, path)] = role.group(1)
    return found


def test_the_role_table_lists_every_route_with_its_role() -> None:
    declared = {route: role.value for route, role in ROUTE_ROLES.items()}
    assert documented() == declared
    assert {role.value for role in Role} == set(documented().values())

