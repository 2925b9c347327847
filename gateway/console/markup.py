"""What the console's pages share: escaping (everything plugins, agents and the engine supply) and formats."""

from __future__ import annotations

import time
from html import escape


def e(value: object) -> str:
    return escape(str(value), quote=True)


def age(seconds: float | None) -> str:
    if seconds is None:
        return "no facts"
    return f"{seconds:.0f} s" if seconds < 120 else f"{seconds / 60:.0f} min"


def when(at: float) -> str:
    return f'<time data-epoch="{at:.3f}">{e(time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(at)))}</time>'


def number(value: float) -> str:
    """A weight or a score, short: ``14``, ``0.5``, ``1.23457e+06``."""
    return f"{value:.6g}"
