"""Host state the agent keeps on disk across restarts.

The checkpoint of the dedicated pool and allocations, with start-up recovery:
the checkpoint when it is usable, else a rebuild from the guests
(:mod:`checkpoint`), the store of transient guests' policies (:mod:`store`),
and the durable writes and bounded reads both use (:mod:`durable`).
"""
