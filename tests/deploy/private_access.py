"""What ruff's SLF001 cannot see: private names of other modules and of dependencies' classes, found in the AST.

- ``import``: an import of another module's underscore name (``from m import _x``, ``m._x``), or of a private
  module from outside its package (``import m._x``, ``from m._x import y``; a package's own modules may use it,
  as the plugins folder's modules use ``_vmsched_util``);
- ``getattr``: ``getattr``/``setattr``/``hasattr``/``delattr``/``object.__setattr__`` with a literal
  underscore name, on anything but ``self`` or ``cls``;
- ``__dict__``: ``x.__dict__`` on anything but ``self`` or ``cls``, and ``vars(x)[...] = ...`` (a write
  into another object's dictionary);
- ``subclass``: a class deriving from a class of another distribution (a dependency or the standard library)
  that defines, or reads through ``self``/``super()``, an underscore member that class has; or deriving from a
  class its distribution does not export: one from a module with a private part in its path, or from a module
  its documentation calls internal (:data:`INTERNAL`).

Each finding is one string, ``path: kind: what`` (the path relative to the repository root), with its line.
"""

from __future__ import annotations

import ast
import functools
import importlib
import importlib.util
import inspect
import re
from collections.abc import Iterator
from pathlib import Path

#: This repository's folders and the package each is installed as ("": the plugins folder, on sys.path itself).
INSTALLED = {"vmsched": "vmsched", "gateway": "vmsched.gateway", "services": "vmsched.services", "plugins": ""}
#: Top-level names of this repository's own code.
OWN = ("vmsched", "_vmsched_util")
ATTR_CALLS = {"getattr", "setattr", "hasattr", "delattr"}
#: Underscore names that are documented public API.
PUBLIC = {"os._exit"}
#: Modules of dependencies whose documentation does not export their classes, with where it says so.
INTERNAL = {
    "uvicorn.protocols": "uvicorn exports main, run, Config and Server (uvicorn.__all__); its protocols are internal",
}


def _private(name: str) -> bool:
    return name.startswith("_") and not (name.startswith("__") and name.endswith("__"))


def _is_self(node: ast.AST) -> bool:
    return isinstance(node, ast.Name) and node.id in ("self", "cls")


def _own(module: str) -> bool:
    return module.split(".")[0] in OWN


class _Finder(ast.NodeVisitor):
    def __init__(self, path: str, module: str) -> None:
        self.path = path
        self.package = module.rpartition(".")[0]  # the importing module's package ("" at the top level)
        self.found: list[tuple[str, int]] = []
        self.imported: dict[str, str] = {}  # local name -> "module" or "module:attr"
        self.modules: dict[str, str] = {}  # local name -> the module it is bound to

    def report(self, node: ast.AST, kind: str, what: str) -> None:
        if what not in PUBLIC:
            self.found.append((f"{self.path}: {kind}: {what}", getattr(node, "lineno", 0)))

    def _inside(self, package: str) -> bool:
        """Whether the importing module is in ``package`` (a private module of a package is its package's)."""
        return self.package == package or self.package.startswith(package + ".") if package else self.package == ""

    def _private_module(self, dotted: str) -> bool:
        parts = dotted.split(".")
        return any(_private(part) and not self._inside(".".join(parts[:i])) for i, part in enumerate(parts))

    def visit_Import(self, node: ast.Import) -> None:
        for alias in node.names:
            if self._private_module(alias.name):
                self.report(node, "import", alias.name)
            local = alias.asname or alias.name.split(".")[0]
            self.modules[local] = alias.name if alias.asname else local
            self.imported[local] = self.modules[local]

    def visit_ImportFrom(self, node: ast.ImportFrom) -> None:
        module = node.module or ""
        if node.level:
            base = self.package.split(".")[: len(self.package.split(".")) - node.level + 1]
            module = ".".join([*base, *([module] if module else [])])
        if self._private_module(module):
            self.report(node, "import", module)
        for alias in node.names:
            local = alias.asname or alias.name
            self.imported[local] = f"{module}:{alias.name}"
            submodule = _is_module(f"{module}.{alias.name}")
            if submodule:
                self.modules[local] = f"{module}.{alias.name}"
            if _private(alias.name) and not (submodule and self._inside(module)):
                self.report(node, "import", f"{module}.{alias.name}")

    def visit_Call(self, node: ast.Call) -> None:
        func = node.func
        name = func.id if isinstance(func, ast.Name) else (
            f"object.{func.attr}" if isinstance(func, ast.Attribute) and isinstance(func.value, ast.Name)
            and func.value.id == "object" else "")
        if (name in ATTR_CALLS or name in ("object.__setattr__", "object.__getattribute__", "object.__delattr__")) \
                and len(node.args) >= 2 and isinstance(node.args[1], ast.Constant) \
                and isinstance(node.args[1].value, str) and _private(node.args[1].value) and not _is_self(node.args[0]):
            self.report(node, "getattr", f"{name}(..., {node.args[1].value!r})")
        self.generic_visit(node)

    def visit_Assign(self, node: ast.Assign) -> None:
        for target in node.targets:
            if isinstance(target, ast.Subscript) and isinstance(target.value, ast.Call) \
                    and isinstance(target.value.func, ast.Name) and target.value.func.id == "vars" \
                    and target.value.args and not _is_self(target.value.args[0]):
                self.report(node, "__dict__", f"{ast.unparse(target)} = ...")
        self.generic_visit(node)

    def visit_Attribute(self, node: ast.Attribute) -> None:
        if node.attr == "__dict__" and not _is_self(node.value):
            self.report(node, "__dict__", ast.unparse(node))
        if isinstance(node.value, ast.Name) and node.value.id in self.modules and _private(node.attr):
            module = self.modules[node.value.id]
            if not (_is_module(f"{module}.{node.attr}") and self._inside(module)):
                self.report(node, "import", f"{module}.{node.attr}")
        self.generic_visit(node)

    def visit_ClassDef(self, node: ast.ClassDef) -> None:
        bases = [cls for base in node.bases if (cls := self._foreign_class(base)) is not None]
        for base in node.bases:
            origin = self._origin(base)  # where the module imports it from, as dotted
            if origin is None or self._foreign_class(base) is None:
                continue
            internal = next((m for m in INTERNAL if origin == m or origin.startswith(m + ".")), None)
            if internal is not None or any(_private(part) for part in origin.split(".")):
                self.report(node, "subclass", f"{node.name} derives from {origin}, which {origin.split('.')[0]} "
                                              "does not export")
        if bases:
            defined = {n.name for n in node.body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))}
            assigned = {t.id for n in node.body if isinstance(n, ast.Assign) for t in n.targets if isinstance(t, ast.Name)}
            for item in node.body:
                if isinstance(item, (ast.FunctionDef, ast.AsyncFunctionDef)) and _private(item.name):
                    for base in bases:
                        if item.name in _privates(base):
                            self.report(item, "subclass", f"{node.name} overrides {base.__qualname__}.{item.name}")
            for sub in ast.walk(node):
                if isinstance(sub, ast.Attribute) and _private(sub.attr) and sub.attr not in defined | assigned \
                        and (_is_self(sub.value) or _is_super(sub.value)):
                    for base in bases:
                        if sub.attr in _privates(base):
                            self.report(sub, "subclass", f"{node.name} uses {base.__qualname__}.{sub.attr}")
        self.generic_visit(node)

    def _origin(self, base: ast.expr) -> str | None:
        """The dotted path ``base`` is imported as (``uvicorn.protocols.http.h11_impl.H11Protocol``)."""
        head, _, rest = ast.unparse(base).partition(".")
        origin = self.imported.get(head)
        if origin is None:
            return None
        module, _, attr = origin.partition(":")
        return ".".join(p for p in (module, attr, rest) if p)

    def _foreign_class(self, base: ast.expr) -> type | None:
        """The class ``base`` names if it comes from another distribution (imported), else None."""
        dotted = ast.unparse(base)
        head, _, rest = dotted.partition(".")
        origin = self.imported.get(head)
        if origin is None:
            return None
        module, _, attr = origin.partition(":")
        if _own(module):
            return None
        path = [p for p in ([attr] if attr else []) + (rest.split(".") if rest else []) if p]
        try:
            found: object = importlib.import_module(module)
        except ImportError:
            return None
        for part in path:
            if not hasattr(found, part):
                try:
                    found = importlib.import_module(f"{found.__name__}.{part}")  # type: ignore[attr-defined]
                    continue
                except (ImportError, AttributeError):
                    return None
            found = getattr(found, part)
        return found if isinstance(found, type) else None


@functools.cache
def _privates(cls: type) -> frozenset[str]:
    """The underscore members of a dependency's class: its attributes, and what its code sets on ``self``."""
    names = {name for name in dir(cls) if _private(name)}
    for klass in cls.__mro__[:-1]:  # not object
        try:
            names |= set(re.findall(r"\bself\.(_[A-Za-z0-9]\w*)", inspect.getsource(klass)))
        except (OSError, TypeError):  # no source (a C extension)
            pass
    return frozenset(name for name in names if _private(name))


def _is_module(dotted: str) -> bool:
    try:
        return importlib.util.find_spec(dotted) is not None
    except (ImportError, ValueError):
        return False


def _is_super(node: ast.AST) -> bool:
    return isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "super"


def findings(root: Path, folders: tuple[str, ...]) -> Iterator[tuple[str, int]]:
    """Every finding in the ``.py`` files under ``folders`` of ``root``, with its line."""
    for folder in folders:
        for path in sorted((root / folder).rglob("*.py")):
            parts = [INSTALLED[folder], *path.relative_to(root / folder).with_suffix("").parts]
            module = ".".join(p for p in parts if p).removesuffix(".__init__")
            if path.name == "__init__.py":
                module += ".__init__"  # its package is itself
            finder = _Finder(str(path.relative_to(root)), module)
            finder.visit(ast.parse(path.read_text(), str(path)))
            yield from finder.found
