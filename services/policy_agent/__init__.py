"""vmsched per-hypervisor policy agent: CPU pinning, weight, cap, dedicated
pCPU pools and start dependencies for libvirt guests."""
