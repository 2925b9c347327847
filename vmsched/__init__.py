"""vmsched: VM placement for oVirt and a libvirt CPU policy agent."""

__version__ = "0.1.0"
