"""Host facts as the agent publishes them: collected every interval and on events (:mod:`reporter`).
The libvirt reading is ``virt.collector``; the arithmetic is ``policy.facts``.
"""
