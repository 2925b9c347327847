"""The operator console at ``GET /``: server-rendered HTML, read-only, offline.

:mod:`pages` the pages, :mod:`agents` the agents' section, :mod:`sessions` its signed-cookie sessions and
:mod:`logouts` the logouts gateway replicas share over the bus.
"""
