"""Keeping guests at their policy, on libvirt's events, in sweeps and on requests.

The enforcer (:mod:`enforcer`: one guest, every guest, pools, and the set and
delete requests make, verified with the tuners' values in force), the queue
of work events make (:mod:`jobs`), policies of transient guests
(:mod:`transient`) and overlaps with dedicated CPUs (:mod:`overlaps`).
"""
