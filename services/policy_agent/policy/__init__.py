"""The agent's policy layer: pure decisions, no libvirt.

CPU sets (:mod:`cpuset`), the per-guest policy model (:mod:`model`), pools and
their planning (:mod:`allocation`), fit and validation (:mod:`validation`),
start dependencies and their orchestration (:mod:`deps`,
:mod:`orchestration`), the event-fed inventory of guests (:mod:`inventory`),
and host state kept across restarts (:mod:`checkpoint`, :mod:`recovery`).
Nothing here imports the libvirt adapter or the surfaces.
"""
