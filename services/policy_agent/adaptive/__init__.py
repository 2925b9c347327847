"""Adaptive policy as the agent runs it: every interval, sample the guests through libvirt, run the tuners
and apply what they decide (:mod:`loop`), tuner plugins in the sandbox (:mod:`plugins`) and the tuners'
metrics (:mod:`metrics`). The tuners themselves are pure code in ``tuners``.
"""
