"""The host-level tuner configuration."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class TunerConfig:
    interval: float = 10.0  # seconds between runs; 0: tuning off
    hysteresis: int = 3  # a condition must hold for this many intervals in a row
    max_changes: int = 4  # per interval, on the host
    max_guest_changes: int = 1  # per guest, per interval
    dry_run: bool = False
    hot_percent: float = 90.0  # a pCPU this busy is saturated ...
    cool_margin: float = 25.0  # ... and a pCPU at least this many points less busy is a place to move to
    target_wait_percent: float = 10.0  # a guest's default target (its adaptive.target_wait_percent wins)
    idle_percent: float = 5.0  # a guest below this CPU use is idle: its weight decays to the base
    slack_percent: float = 60.0  # the shared set below this use has slack: caps may loosen
    weight_step: float = 2.0  # weight x this per raise, / this per decay
    cap_step: float = 10.0  # cap +/- this many points per change
    plugins_dir: str | None = None  # tuner plugins (Python files run in the plugin sandbox)
    plugin_timeout: float = 5.0  # seconds a tuner plugin's round may take

    def problems(self) -> list[str]:
        out = []
        if self.interval < 0:
            out.append(f"tuner interval {self.interval:g} s is negative (0 turns tuning off)")
        if self.hysteresis < 1:
            out.append(f"tuner hysteresis {self.hysteresis} must be at least 1 interval")
        if self.max_changes < 0 or self.max_guest_changes < 0:
            out.append("tuner change limits cannot be negative")
        return out
