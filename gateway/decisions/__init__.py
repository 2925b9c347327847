"""The decision log: what each unit did to each host, and why.

:mod:`record` is one decision as kept and read, :mod:`summary` its one-line summary, :mod:`ranking` a score
decision's hosts in vmsched's order, :mod:`ring` the bounded ring per operation, :mod:`log` the log a gateway
owns, :mod:`peers` the other gateway replicas' decisions, asked for when read, and :mod:`api`
``GET /v1/decisions``.
"""
