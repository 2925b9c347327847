"""The guests of the host as the agent knows them.

The event-fed inventory (:mod:`inventory`: states at once from libvirt's
events, policies after each read; the QEMU hook's question is answered from
it alone). No libvirt.
"""
