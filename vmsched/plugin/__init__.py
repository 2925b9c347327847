"""What plugin code may import from vmsched: ``from vmsched.plugin import facts``.

Standard library only: the plugin worker imports it (docs/plugins.md, "Host facts").
"""
