"""The console's agents section: each known agent's dedicated pool and guests with policies.

Agents are found through their host facts (the gateway's facts cache); each
is asked over the bus, in parallel and briefly, for its CPU pool and its
policies. An agent that does not answer is shown with the reason. Everything
an agent sends is escaped.
"""

from __future__ import annotations

import asyncio
from typing import Any

from vmsched.agent_contract import AgentOp
from vmsched.bus.topology import agent_queue
from vmsched.gateway.console.markup import e

#: agents asked at most, and how long each may take, seconds
MAX_AGENTS = 50
TIMEOUT = 2.0


async def _ask(bus: Any, host: str, op: AgentOp) -> dict[str, Any] | str:
    try:
        return await bus.call(agent_queue(host), op.value, {}, TIMEOUT)
    except Exception as exc:  # noqa: BLE001 - shown to the operator, never raised
        return f"{type(exc).__name__}: {exc}"


async def section(bus: Any, hosts: list[str]) -> str:
    if not hosts:
        return ('<section id="agents"><h2>Agents</h2><p>No agent known yet (agents are found through the host '
                'facts they publish).</p></section>')
    hosts = hosts[:MAX_AGENTS]
    answers = await asyncio.gather(*(_ask(bus, h, op) for h in hosts for op in (AgentOp.CPUS, AgentOp.LIST_POLICIES)))
    blocks = "".join(f'<div class="agent" data-host="{e(host)}"><h3>{e(host)}</h3>{_pool(cpus)}{_guests(policies)}</div>'
                     for host, cpus, policies in zip(hosts, answers[::2], answers[1::2]))
    return f'<section id="agents"><h2>Agents ({len(hosts)})</h2>{blocks}</section>'


def _pool(cpus: dict[str, Any] | str) -> str:
    if isinstance(cpus, str):
        return f'<p class="error">CPU pool: {e(cpus)}</p>'
    allocations = ", ".join(f"{g}: {c}" for g, c in sorted((cpus.get("allocations") or {}).items()))
    return (f'<p>host CPUs <code>{e(cpus.get("host_cpus", ""))}</code>, dedicated pool '
            f'<code>{e(cpus.get("dedicated_pool", "") or "none")}</code>, free <code>{e(cpus.get("free", ""))}</code>'
            f', allocated <code>{e(cpus.get("allocated", "") or "none")}</code>'
            + (f" ({e(allocations)})" if allocations else "") + "</p>")


def _guests(policies: dict[str, Any] | str) -> str:
    if isinstance(policies, str):
        return f'<p class="error">policies: {e(policies)}</p>'
    rows = "".join(
        f'<tr class="{"problem" if g.get("status") == "error" or g.get("error") else ""}"><td>{e(g.get("guest", ""))}'
        f'</td><td>{e(g.get("state", ""))}</td><td>{e(g.get("status", ""))}</td>'
        f'<td>{e(g.get("allocation") or "")}</td><td>{e(_policy_text(g.get("policy")))}</td>'
        f'<td>{e(g.get("error") or "; ".join(g.get("warnings") or []))}</td></tr>'
        for g in policies.get("policies", []) if isinstance(g, dict))
    if not rows:
        return "<p>No guest with a policy.</p>"
    return ('<table class="guests"><thead><tr><th>guest</th><th>state</th><th>status</th><th>dedicated CPUs</th>'
            f'<th>policy</th><th>error / drift</th></tr></thead><tbody>{rows}</tbody></table>')


def _policy_text(policy: Any) -> str:
    if not isinstance(policy, dict):
        return ""
    return ", ".join(f"{k}={v}" for k, v in policy.items() if v not in (None, [], {}, ""))
