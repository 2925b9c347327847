"""Values exchanged with the plugin runtime (pool, catalog)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class Limits:
    """Resource limits of one plugin worker process."""

    memory_mb: int = 1024
    cpu_seconds: int = 30
    max_output: int = 1 << 20
    max_procs: int = 256  # RLIMIT_NPROC: processes and threads of the plugin user
    max_files: int = 256  # RLIMIT_NOFILE
    max_file_mb: int = 64  # RLIMIT_FSIZE: largest file a plugin may write, MiB
    nice: int = 0  # added to the worker's niceness (a shadow candidate's: it yields the CPU to live calls)


@dataclass(frozen=True)
class Confinement:
    """How plugin workers are sandboxed (see vmsched.runtime.worker.sandbox and docs/plugins.md)."""

    user: str = "nobody"  # the plugin user when the service runs as root
    allow_root: bool = False  # run plugins as root (without capabilities) if the switch is impossible
    network: bool = False  # plugins may open AF_INET/AF_INET6 sockets
    env: tuple[str, ...] = ()  # extra environment variable names passed to plugins
    write_dirs: tuple[str, ...] = ()  # directories plugins may write besides their private temporary one


@dataclass(frozen=True)
class Call:
    """One plugin unit call: ``plugin.cls().method(*args)`` in a worker."""

    plugin: str  # module name (file stem) in the plugins folder
    cls: str  # class name (= unit name)
    method: str  # do_filter | do_score | do_balance
    args: tuple[Any, ...]  # JSON-able positional arguments
    timeout: float  # seconds, wall clock
    facts: Any = None  # host facts of the call: a JSON-able dict (all of them) or a vmsched.facts.wire.PreparedFacts


@dataclass
class CallResult:
    ok: bool
    value: Any = None  # the unit's result, tuples turned into lists
    error: str | None = None  # precise, human-readable reason when not ok
    timed_out: bool = False
    duration: float = 0.0  # seconds
    stderr: str = ""  # what the plugin wrote to stderr (logged, not an error)
    #: a score unit's numbers, one per requested host in order, in place of ``value`` (the pool's
    #: ``aligned_scores``; unchecked: they come from the plugin's process, contract.checked_aligned)
    scores: list[Any] | None = None


@dataclass(frozen=True)
class AnalyzedUnit:
    name: str
    kind: str  # filter | score | balance
    description: str
    validation: str  # raw properties_validation as the plugin wrote it


@dataclass
class Analysis:
    plugin: str
    units: list[AnalyzedUnit] = field(default_factory=list)
    error: str | None = None
    uses_facts: bool = False  # the plugin reads host facts (vmsched.plugin): only its calls carry them
