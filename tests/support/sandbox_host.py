"""A stand-in service for the sandbox tests: a real process that runs a PluginPool.

Usage: python sandbox_host.py PLUGINS_DIR PLUGIN ARGS_JSON CONFINEMENT_JSON [--amqp URL]
Prints one JSON line: the call's result and the pool's confinement report. The
``--amqp`` argument is only there so that its command line holds a credential.
"""

from __future__ import annotations

import json
import sys
from dataclasses import asdict
from pathlib import Path

from vmsched.runtime import Call, PluginPool
from vmsched.runtime.types import Confinement, Limits


def main() -> int:
    plugins, plugin, args, confinement = sys.argv[1:5]
    conf = json.loads(confinement)
    limits = Limits(**conf.pop("limits", {}))
    pool = PluginPool(Path(plugins), size=1, limits=limits, name="host", confinement=Confinement(**conf))
    try:
        pool.start()
    except RuntimeError as exc:
        print(json.dumps({"start_error": str(exc)}), flush=True)
        return 0
    try:
        [result] = pool.run([Call(plugin, "P", "do_filter", (["h1"], "vm", json.loads(args)), 20.0)])
        print(json.dumps({"result": asdict(result), "sandbox": pool.sandbox}), flush=True)
    finally:
        pool.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
