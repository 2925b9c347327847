"""Keeping guests at their policy, on libvirt's events and in sweeps.

The enforcer (:mod:`enforcer`: one guest, every guest, pools), the changes
requests make (:mod:`changes`: set and delete, a collaborator of the
enforcer), the queue of work events make (:mod:`jobs`), policies of transient
guests (:mod:`transient`), overlaps with dedicated CPUs (:mod:`overlaps`) and
verification with the tuners' values in force (:mod:`tuned_sync`).
"""
