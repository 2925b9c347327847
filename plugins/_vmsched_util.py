"""Helpers shared by the stock plugins (a sibling module: not a plugin itself).

Files whose name starts with "_" are not scanned for units.
"""


def id_list(value):
    """'A, b ,C' -> ['a', 'b', 'c'] in the given order, without repeats; None or '' -> []."""
    if not value:
        return []
    parts = (part.strip().lower() for part in value.replace(";", ",").split(","))
    return list(dict.fromkeys(part for part in parts if part))


def number(args, name, default):
    """The property ``name`` as a number (int when it looks like one), or ``default`` when absent or empty."""
    value = (args.get(name) or "").strip()
    if not value:
        return default
    try:
        return int(value)
    except ValueError:
        return float(value)


def fresh(facts, hosts):
    """``{host: facts}`` for the hosts with facts that are not stale, in the given order."""
    found = {}
    for h in hosts:
        f = facts.host(h)
        if f is not None and not f.stale:
            found[h] = f
    return found


def movable(host_facts):
    """Running guests of a host a balancer may propose: none with dedicated CPUs or a vmsched CPU policy."""
    return [g for g in host_facts.guests if g.state == "running" and not g.dedicated and not g.has_policy]


def guests_with_pending(facts, host, host_facts):
    """Running guests plus the VMs vmsched placed on the host moments ago (facts.pending)."""
    return host_facts.guests_running + len(facts.pending(host))


def free_with_pending(facts, host, host_facts):
    """Free memory (MiB) less the VMs vmsched placed on the host moments ago (facts.pending)."""
    return host_facts.memory_free_mib - sum(facts.pending(host))
