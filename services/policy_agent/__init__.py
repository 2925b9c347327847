"""vmsched per-hypervisor policy agent: CPU pinning, weight, cap, dedicated
pCPU pools and start dependencies for libvirt guests.

Grouped by concept, each a subpackage: ``policy`` (pure decisions),
``tuners`` (the pure tuners of adaptive policy), ``guests`` (the event-fed
inventory, start and stop in dependency order), ``facts`` (host facts: their
arithmetic and reporter), ``state`` (the checkpoint and the transient-policy
store on disk), ``virt`` (the libvirt adapter), ``enforce`` (keeps guests at
their policy: events, sweeps, set and delete), ``adaptive`` (the loop that
runs the tuners through libvirt) and ``surfaces`` (socket, bus, client, CLI,
hook). ``errors``, ``metrics`` and ``plural`` serve every layer; ``agent``
only wires the parts together and ``serve`` is the ``vmsched agent`` command.
"""
