"""Well-behaved units, new (return) contract."""

from _helpers import even_index


class KeepEven:
    properties_validation = "mode=^(fast|slow)$"

    def do_filter(self, hosts, vm, args):
        """Keep hosts at even positions of the input."""
        return even_index(hosts)


class KeepAllButLast:
    """Keep every host but the last."""

    def do_filter(self, hosts, vm, args):
        return hosts[:-1]


class FloatScore:
    """Scores are floats and huge numbers."""

    def do_score(self, hosts, vm, args):
        return [(h, i * 1.6) for i, h in enumerate(hosts[:-1])] + [(hosts[-1], 10**15)] if hosts else []


class FirstHostBalance:
    """Move the VM given in property vm to the first host."""

    def do_balance(self, hosts, args):
        return (args.get("vm", ""), hosts[:1])
