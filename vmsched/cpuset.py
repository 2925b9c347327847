"""CPU sets in libvirt's syntax, ``0-3,^2,6``: the one parser of vmsched.

Items are separated by commas: ``N`` one CPU, ``N-M`` an inclusive range,
``^N`` or ``^N-M`` CPUs taken out of what the other items select (wherever
the exclusion stands). A set is a ``frozenset[int]`` in the code; the text
form is what users, the domain XML and the API exchange.

Parsing is bounded, whoever wrote the text:

* a text longer than :data:`MAX_TEXT` characters is refused before it is
  read (every set of libvirt's 16,384 CPUs fits, written as :func:`fmt`
  writes it);
* the items are kept as ranges, merged and subtracted as ranges, so the work
  grows with the text, not with the CPUs its ranges span;
* CPU numbers above :data:`MAX_CPU` are refused, and where the host is known
  (``host=``) so is every CPU the host does not have: a set is never larger
  than the host.

Every error is one line naming the problem and a short part of the text.
"""

from __future__ import annotations

import re
from itertools import chain
from typing import Iterable

CpuSet = frozenset[int]
Spans = list[tuple[int, int]]  # sorted, disjoint, non-adjacent inclusive ranges

MAX_CPU = 16383  # libvirt's VIR_DOMAIN_CPUMASK_LEN - 1
MAX_TEXT = 65536  # characters; fmt() of any set of CPUs 0-16383 is at most 43,596
_DIGITS = len(str(MAX_CPU))
_ITEM = re.compile(r"(\^)?\s*([0-9]+)(?:\s*-\s*([0-9]+))?", re.ASCII)  # one stripped item
_SHOWN = 40  # characters of a value quoted in an error


class CpuSetError(ValueError):
    pass


def spans(text: str) -> Spans:
    """The ranges ``text`` selects: ``"0-3,^2,6"`` -> ``[(0, 1), (3, 3), (6, 6)]``; raises CpuSetError."""
    raw = bounded(text).strip()
    if not raw:
        raise CpuSetError("empty CPU set")
    include: Spans = []
    exclude: Spans = []
    for item in raw.split(","):
        item = item.strip()
        m = _ITEM.fullmatch(item)
        if m is None:
            if not item:
                raise CpuSetError(f"empty item in CPU set {_show(raw)}")
            raise CpuSetError(f"bad item {_show(item)} in CPU set {_show(raw)}: expected N, N-M or ^N")
        neg, lo_s, hi_s = m.groups()
        lo = _cpu(lo_s, raw)
        hi = _cpu(hi_s, raw) if hi_s is not None else lo
        if hi < lo:
            raise CpuSetError(f"bad range {_show(item)} in CPU set {_show(raw)}: end before start")
        (exclude if neg else include).append((lo, hi))
    result = _subtract(_merge(include), _merge(exclude))
    if not result:
        raise CpuSetError(f"CPU set {_show(raw)} selects no CPU")
    return result


def bounded(text: str) -> str:
    """``text`` when it is no longer than :data:`MAX_TEXT` (CpuSetError otherwise): the check of a reader that
    passes a CPU set on, before anyone parses it."""
    if not isinstance(text, str):
        raise CpuSetError(f"a CPU set is text such as '0-3,^2', not {type(text).__name__}")
    if len(text) > MAX_TEXT:
        raise CpuSetError(f"CPU set {text[:_SHOWN]!r}... is {len(text):,} characters long; at most {MAX_TEXT:,} are"
                          " accepted: write it with ranges (0-63, not 0,1,2,...)")
    return text


def parse(text: str, host: CpuSet | None = None) -> CpuSet:
    """``"0-3,^2,6"`` -> ``frozenset({0, 1, 3, 6})``; with ``host``, every CPU must be one of the host's."""
    found = spans(text)
    if host is not None:
        top = max(host, default=-1)
        within = frozenset(chain.from_iterable(range(lo, min(hi, top) + 1) for lo, hi in found if lo <= top))
        gone = _merge([(c, c) for c in sorted(within - host)] + [(max(lo, top + 1), hi) for lo, hi in found if hi > top])
        if gone:
            raise CpuSetError(f"{_named(format_spans(gone), _size(gone), 'does', 'do')} not exist on this host"
                              f" (CPUs {fmt(host)})")
        return within
    return frozenset(chain.from_iterable(range(lo, hi + 1) for lo, hi in found))


def normalize(text: str) -> str:
    """``"3,1-2"`` -> ``"1-3"``: the text :func:`fmt` writes for the same set (no set is built)."""
    return format_spans(spans(text))


def count(text: str) -> int:
    """How many CPUs ``text`` selects (no set is built)."""
    return _size(spans(text))


def fmt(cpus: Iterable[int] | None) -> str:
    """``{0, 1, 2, 3, 6}`` -> ``"0-3,6"`` (empty set -> ``""``)."""
    if not cpus:
        return ""
    return format_spans(_merge([(c, c) for c in set(cpus)]))


def named(cpus: Iterable[int], one: str = "", many: str = "") -> str:
    """``CPU 5`` or ``CPUs 5-7``, then ``one`` or ``many`` (a verb agreeing with them): ``CPU 5 is``,
    ``CPUs 5-7 are``."""
    cpus = set(cpus)
    return _named(fmt(cpus), len(cpus), one, many)


def _named(text: str, n: int, one: str, many: str) -> str:
    verb = one if n == 1 else many
    return f"{'CPU' if n == 1 else 'CPUs'} {text}{' ' + verb if verb else ''}"


def _size(ranges: Spans) -> int:
    return sum(hi - lo + 1 for lo, hi in ranges)


def format_spans(ranges: Spans) -> str:
    return ",".join(str(lo) if lo == hi else f"{lo}-{hi}" for lo, hi in ranges)


def to_cpumap(cpus: Iterable[int], ncpus: int) -> tuple[bool, ...]:
    """The boolean tuple the libvirt binding wants for pinning calls."""
    s = set(cpus)
    beyond = [c for c in s if c >= ncpus]
    if beyond:
        raise CpuSetError(f"{named(beyond, 'is', 'are')} beyond the host's {ncpus} CPUs")
    return tuple(i in s for i in range(ncpus))



def _cpu(digits: str, raw: str) -> int:
    value = digits.lstrip("0") or "0"
    cpu = int(value) if len(value) <= _DIGITS else MAX_CPU + 1  # never converts a long string of digits
    if cpu > MAX_CPU:
        shown = digits if len(digits) <= _SHOWN else f"{digits[:_SHOWN]}..."
        raise CpuSetError(f"CPU {shown} out of range 0-{MAX_CPU} in CPU set {_show(raw)}")
    return cpu


def _merge(ranges: Spans) -> Spans:
    """Sorted, with overlapping and adjacent ranges joined."""
    out: Spans = []
    for lo, hi in sorted(ranges):
        if out and lo <= out[-1][1] + 1:
            if hi > out[-1][1]:
                out[-1] = (out[-1][0], hi)
        else:
            out.append((lo, hi))
    return out


def _subtract(include: Spans, exclude: Spans) -> Spans:
    """``include`` without ``exclude`` (both merged), in one pass over each."""
    out: Spans = []
    j = 0
    for lo, hi in include:
        while j < len(exclude) and exclude[j][1] < lo:
            j += 1
        k = j
        while lo <= hi and k < len(exclude) and exclude[k][0] <= hi:
            elo, ehi = exclude[k]
            if elo > lo:
                out.append((lo, elo - 1))
            lo = max(lo, ehi + 1)
            k += 1
        if lo <= hi:
            out.append((lo, hi))
    return out


def _show(text: str) -> str:
    """A value for an error message: quoted, at most _SHOWN characters of it."""
    return repr(text) if len(text) <= _SHOWN else repr(text[:_SHOWN]) + f"... ({len(text):,} characters)"
