"""CPU sets in libvirt's syntax: ``0-3,^2,6``.

A set is a ``frozenset[int]`` internally; the text form is what users, the
domain XML and the API exchange.  Parsing is strict: every error names the
offending part of the text.
"""

from __future__ import annotations

from typing import Iterable

CpuSet = frozenset[int]

MAX_CPU = 16383  # libvirt's VIR_DOMAIN_CPUMASK_LEN - 1


class CpuSetError(ValueError):
    pass


def parse(text: str | int | Iterable[int] | None) -> CpuSet:
    """``"0-3,^2,6"`` -> ``frozenset({0, 1, 3, 6})``.

    Items are separated by commas; ``a-b`` is an inclusive range; ``^n``
    (or ``^a-b``) excludes CPUs from what the previous items selected.
    """
    if text is None:
        return frozenset()
    if isinstance(text, int) and not isinstance(text, bool):
        text = str(text)
    if not isinstance(text, str):
        return frozenset(_check_cpu(int(c), str(c)) for c in text)
    raw = text.strip()
    if not raw:
        raise CpuSetError("empty CPU set")
    include: set[int] = set()
    exclude: set[int] = set()
    for item in raw.split(","):
        item = item.strip()
        if not item:
            raise CpuSetError(f"empty item in CPU set {raw!r}")
        neg = item.startswith("^")
        body = item[1:].strip() if neg else item
        cpus = _parse_item(body, raw)
        (exclude if neg else include).update(cpus)
    result = frozenset(include - exclude)
    if not result:
        raise CpuSetError(f"CPU set {raw!r} selects no CPU")
    return result


def _parse_item(item: str, raw: str) -> range:
    lo_s, sep, hi_s = item.partition("-")
    try:
        lo = int(lo_s.strip())
        hi = int(hi_s.strip()) if sep else lo
    except ValueError:
        raise CpuSetError(f"bad item {item!r} in CPU set {raw!r}: expected N, N-M or ^N") from None
    _check_cpu(lo, raw)
    _check_cpu(hi, raw)
    if hi < lo:
        raise CpuSetError(f"bad range {item!r} in CPU set {raw!r}: end before start")
    return range(lo, hi + 1)


def _check_cpu(cpu: int, raw: str) -> int:
    if cpu < 0 or cpu > MAX_CPU:
        raise CpuSetError(f"CPU {cpu} out of range 0-{MAX_CPU} in CPU set {raw!r}")
    return cpu


def fmt(cpus: Iterable[int] | None) -> str:
    """``{0, 1, 2, 3, 6}`` -> ``"0-3,6"`` (empty set -> ``""``)."""
    if not cpus:
        return ""
    ordered = sorted(set(cpus))
    parts: list[str] = []
    start = prev = ordered[0]
    for cpu in ordered[1:]:
        if cpu == prev + 1:
            prev = cpu
            continue
        parts.append(_span(start, prev))
        start = prev = cpu
    parts.append(_span(start, prev))
    return ",".join(parts)


def _span(a: int, b: int) -> str:
    if a == b:
        return str(a)
    return f"{a}-{b}"


def normalize(text: str) -> str:
    return fmt(parse(text))


def to_cpumap(cpus: Iterable[int], ncpus: int) -> tuple[bool, ...]:
    """The boolean tuple the libvirt binding wants for pinning calls."""
    s = set(cpus)
    beyond = [c for c in s if c >= ncpus]
    if beyond:
        raise CpuSetError(f"CPUs {fmt(beyond)} are beyond the host's {ncpus} CPUs")
    return tuple(i in s for i in range(ncpus))


def from_cpumap(cpumap: Iterable[bool]) -> CpuSet:
    return frozenset(i for i, on in enumerate(cpumap) if on)
