"""The operator console at ``GET /``: server-rendered HTML, read-only, offline.

:mod:`pages` the pages, :mod:`decision` one decision's page, :mod:`markup` what they share (escaping),
:mod:`agents` the agents' section, :mod:`sessions` its signed-cookie sessions and :mod:`logouts` the logouts
gateway replicas share over the bus.
"""
