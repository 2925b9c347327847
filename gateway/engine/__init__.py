"""The engine's protocol: XML-RPC as the oVirt engine speaks it, and its calls.

:mod:`xmlrpc` reads and writes the wire, :mod:`calls` dispatches discover, runFilters, runCostFunctions and
runLoadBalancing, :mod:`operations` holds one row per scheduling operation and :mod:`scheduler` runs a row on
the bus. The decision itself is :mod:`vmsched.decide`'s.
"""
