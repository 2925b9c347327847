"""A sibling module imported by plugins (the plugins folder is on sys.path)."""


def even_index(items):
    return items[::2]
