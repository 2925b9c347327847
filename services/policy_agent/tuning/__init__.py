"""The adaptive-policy loop as the agent runs it: sampling guests through libvirt and applying the
tuners' decisions (:mod:`tuner`), tuner plugins in the sandbox (:mod:`plugins`) and the tuners' metrics
(:mod:`metrics`). The tuners themselves are pure code in ``policy.tuning``.
"""
