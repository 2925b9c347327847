"""Helpers shared by the stock plugins (a sibling module: not a plugin itself).

Files whose name starts with "_" are not scanned for units.
"""


def id_list(value):
    """'A, b ,C' -> {'a', 'b', 'c'}; None or '' -> empty set."""
    if not value:
        return set()
    return {part.strip().lower() for part in value.replace(";", ",").split(",") if part.strip()}
