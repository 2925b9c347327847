"""How the agent is reached: its operations behind one protocol (:mod:`ops`),
the local UNIX socket (:mod:`socket`), the agent bus (:mod:`bus`), the clients
(:mod:`client`), the command line (:mod:`cli`) and the QEMU hook (``hooks/``).

Surfaces see the agent only through :class:`ops.Agent`; they never import the
agent's wiring or the libvirt adapter.
"""
