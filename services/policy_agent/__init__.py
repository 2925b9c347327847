"""vmsched per-hypervisor policy agent: CPU pinning, weight, cap, dedicated
pCPU pools and start dependencies for libvirt guests.

Grouped by concept, each a subpackage: ``policy`` (pure decisions), ``virt``
(the libvirt adapter), ``enforce`` (keeps guests at their policy: events,
sweeps, set and delete), ``tuning`` (the adaptive-policy loop that drives
libvirt; its pure tuners are ``policy.tuning``), ``facts`` (the host facts
reporter) and ``surfaces`` (socket, bus, client, CLI, hook). ``metrics`` is
the agent's Prometheus catalogue, ``agent`` only wires the parts together and
``serve`` is the ``vmsched agent`` command.
"""
