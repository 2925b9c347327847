"""vmsched per-hypervisor policy agent: CPU pinning, weight, cap, dedicated
pCPU pools and start dependencies for libvirt guests.

Three layers, each a subpackage: ``policy`` (pure decisions), ``virt`` (the
libvirt adapter) and ``surfaces`` (socket, bus, client, CLI, hook). On top,
``enforce`` brings guests to their policy (sync, sweep, set, delete), ``jobs``
queues the events' work, and ``agent`` only wires them together.
"""
