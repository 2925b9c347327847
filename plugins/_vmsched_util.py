"""Helpers shared by the stock plugins (a sibling module: not a plugin itself).

Files whose name starts with "_" are not scanned for units.
"""


def id_list(value):
    """'A, b ,C' -> ['a', 'b', 'c'] in the given order, without repeats; None or '' -> []."""
    if not value:
        return []
    parts = (part.strip().lower() for part in value.replace(";", ",").split(","))
    return list(dict.fromkeys(part for part in parts if part))
