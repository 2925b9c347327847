"""The guests of the host as the agent knows them, and starting them in order.

The event-fed inventory (:mod:`inventory`: states at once from libvirt's
events, policies after each read; the QEMU hook's question is answered from
it alone) and starting or stopping guests in dependency order, waiting for
each one (:mod:`orchestration`). No libvirt: the calls come in through a
protocol.
"""
