"""The tuners of adaptive policy: pure functions over samples with history (no libvirt, no I/O).

:mod:`.engine` runs the built-in tuners (:mod:`.hotspot`, :mod:`.demand`, :mod:`.elastic`) and plugin
proposals through :mod:`.guard` (bounds, static policy, pool) and the rate limits; :mod:`.state` holds the
values in force, which the enforcer treats as desired state.
"""
