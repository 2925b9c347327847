"""Host facts as the agent publishes them: the pure arithmetic (:mod:`arithmetic`: CPU use from /proc/stat
counters, free memory, the length of the history, the dedicated-CPU summary) and the reporter that publishes
them every interval and on events (:mod:`reporter`). The reading of libvirt and /proc is ``virt.collector``.
"""
