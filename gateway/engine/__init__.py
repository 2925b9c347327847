"""The engine's protocol: XML-RPC as the oVirt engine speaks it, its calls and their replies.

:mod:`xmlrpc` reads and writes the wire, :mod:`calls` dispatches discover, runFilters, runCostFunctions and
runLoadBalancing, :mod:`operations` holds one row per scheduling operation, :mod:`render` turns the services'
outcomes into the engine's decision and :mod:`scores` makes score units' numbers into the engine's integers.
"""
