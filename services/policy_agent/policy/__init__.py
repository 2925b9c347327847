"""The agent's policy layer: pure decisions, no libvirt and no files.

The per-guest policy model (:mod:`model`), the host's CPU topology
(:mod:`topology`), which dedicated CPUs a guest gets (:mod:`assignment`),
pools and their planning (:mod:`allocation`), fit and validation
(:mod:`validation`) and start dependencies (:mod:`deps`). CPU sets are read
by the one parser of vmsched, :mod:`vmsched.cpuset`.
"""
