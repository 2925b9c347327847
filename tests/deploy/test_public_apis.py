"""Public APIs only: no code of the product touches a private member of a dependency or of another module.

Ruff's SLF001 runs over gateway/, services/, vmsched/ and plugins/ with nothing that could suppress it
(``--isolated --ignore-noqa``); tests/deploy/private_access.py finds in the AST what SLF001 cannot see (imports of
underscore names, ``getattr(x, "_...")``, ``__dict__`` of other objects, subclasses using a dependency's underscore
members). Nothing is allowed.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from tests.support.paths import ROOT
from tests.deploy.private_access import findings

FOLDERS = ("gateway", "services", "vmsched", "plugins")
#: The named exceptions: where no public route exists, with the reason, the pinned version range
#: (pyproject.toml) and the test that fails when the dependency changes what the code relies on.
ALLOWED = {
    "gateway/http.py: subclass: GatewayHttp derives from uvicorn.protocols.http.httptools_impl.HttpToolsProtocol, "
    "which uvicorn does not export": "uvicorn has no public option for header and body read timeouts, and an "
    "ASGI middleware runs only after the headers are read; uvicorn is pinned below 0.55 and "
    "tests/gateway/test_http_timeouts.py::test_uvicorn_still_offers_what_the_gateway_protocol_extends fails first",
}

def ruff_findings() -> set[str]:
    ruff = Path(sys.executable).with_name("ruff")
    done = subprocess.run([str(ruff), "check", "--isolated", "--ignore-noqa", "--select", "SLF001", "--no-cache",
                           "--output-format", "json", "--exit-zero", *FOLDERS], cwd=ROOT, capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    return {f"{Path(f['filename']).relative_to(ROOT)}: {f['code']}: {f['message']}" for f in json.loads(done.stdout)}


def found() -> dict[str, list[int]]:
    lines: dict[str, list[int]] = {}
    for what, line in findings(ROOT, FOLDERS):
        lines.setdefault(what, []).append(line)
    for what in ruff_findings():
        lines.setdefault(what, [])
    return lines


def test_no_private_member_of_another_module_or_dependency_is_used() -> None:
    found_here = found()
    unexpected = {what: lines for what, lines in found_here.items() if what not in ALLOWED}
    assert not unexpected, "\n".join(f"{what} (lines {lines})" for what, lines in sorted(unexpected.items()))
    assert set(found_here) >= set(ALLOWED), f"allowed but no longer found: {set(ALLOWED) - set(found_here)}"


def test_the_checks_see_what_they_are_for(tmp_path: Path) -> None:
    """Each kind of finding, in a module written for the purpose (the checks cannot pass by seeing nothing)."""
    folder = tmp_path / "vmsched"
    folder.mkdir()
    (folder / "probe.py").write_text(
        "import argparse\nimport json\nfrom json import _default_decoder\nimport xmlrpc.client\n"
        "from vmsched.runtime.pool.batch import Job\n\n\n"
        "class Loud(argparse.HelpFormatter):\n"
        "    def _fill_text(self, text, width, indent):\n        return self._indent_increment and text\n\n\n"
        "class Own(Job):\n    def _private_of_our_own(self):\n        return 1\n\n\n"
        "def poke(parser, obj):\n    getattr(parser, '_actions')\n    obj.__dict__['x'] = 1\n"
        "    vars(obj)['y'] = 2\n    setattr(obj, '_z', 3)\n"
        "    json._default_encoder\n    return xmlrpc.client.Unmarshaller._marks\n\n\n"
        "from uvicorn.protocols.http.h11_impl import H11Protocol\n\n\n"
        "class Timed(H11Protocol):\n    pass\n")
    seen = {what for what, _ in findings(tmp_path, ("vmsched",))}
    assert seen == {
        "vmsched/probe.py: import: json._default_decoder",
        "vmsched/probe.py: import: json._default_encoder",
        "vmsched/probe.py: subclass: Loud overrides HelpFormatter._fill_text",
        "vmsched/probe.py: subclass: Loud uses HelpFormatter._indent_increment",
        "vmsched/probe.py: getattr: getattr(..., '_actions')",
        "vmsched/probe.py: __dict__: obj.__dict__",
        "vmsched/probe.py: __dict__: vars(obj)['y'] = ...",
        "vmsched/probe.py: getattr: setattr(..., '_z')",
        "vmsched/probe.py: subclass: Timed derives from uvicorn.protocols.http.h11_impl.H11Protocol, which uvicorn "
        "does not export",
    }, seen
