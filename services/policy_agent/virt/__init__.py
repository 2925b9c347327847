"""The agent's libvirt adapter: everything that talks to libvirt.

The connection and its events (:mod:`connection`), domain XML reading
(:mod:`domxml`), policy metadata I/O (:mod:`metadata`), verify-and-repair of
pins and scheduler parameters (:mod:`apply`), snapshot reads
(:mod:`snapshot`), starting and stopping guests in dependency order
(:mod:`lifecycle`), the host's
identity and CPUs (:mod:`host`), the one-agent-per-libvirtd lock
(:mod:`hostlock`) and the facts collector (:mod:`collector`). It imports the
policy layer, never the surfaces.
"""
