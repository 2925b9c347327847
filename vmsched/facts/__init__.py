"""Host facts: what policy agents measure on their hypervisors, and what plugin units read of them.

:mod:`model` is the facts message on the bus; :mod:`subscription` a service's subscription to it and an
agent's snapshot listener; :mod:`cache` a service replica's newest facts of every host, :mod:`host_map` the
engine's host IDs to agents' IDs; :mod:`pending` the placements the facts do not show yet; :mod:`wire` the
facts a call carries to a plugin worker, proportional to change, and :mod:`held` what a worker keeps of them.
The plugin API is :mod:`vmsched.plugin.facts`. This package imports nothing itself: the plugin worker imports
:mod:`held` without pydantic.
"""
