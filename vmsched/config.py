"""One typed settings object for every vmsched process.

Values come from (highest first): command-line flags, environment variables
(``VMSCHED_*``; ``OSCHEDPROXY_PLUGINS`` is honoured for the plugins folder, as
the old ``ovirt-scheduler-proxy`` did), then the defaults below.
"""

from __future__ import annotations

import ipaddress
import sys
from pathlib import Path
import json
from typing import Annotated, Any, Literal

from pydantic import AliasChoices, Field, ValidationInfo, field_validator, model_validator
from pydantic_settings import BaseSettings, NoDecode, SettingsConfigDict

from vmsched.bus.options import read_url_file
from vmsched.messages import INT32_MAX, INT32_MIN

DEFAULT_AMQP_URL = "amqp://guest:guest@127.0.0.1:5672//"
MEMORY_URL = "memory://"


def stock_plugins_dir() -> Path:
    """The plugins shipped with vmsched (source checkout or installed data)."""
    here = Path(__file__).resolve().parent.parent / "plugins"
    if here.is_dir():
        return here
    beside = here.parent / "share" / "vmsched" / "plugins"  # pip install --target DIR puts data files in DIR
    if beside.is_dir():
        return beside
    return Path(sys.prefix) / "share" / "vmsched" / "plugins"


def parse_timeouts(value: str | dict[str, float] | None) -> dict[str, float]:
    """``"UnitA=5,UnitB=2.5"`` -> ``{"UnitA": 5.0, "UnitB": 2.5}``."""
    if not value:
        return {}
    if isinstance(value, str) and value.lstrip().startswith("{"):
        value = json.loads(value)
    if isinstance(value, dict):
        return {str(k): float(v) for k, v in value.items()}
    out: dict[str, float] = {}
    for item in filter(None, map(str.strip, value.split(","))):
        name, sep, seconds = item.partition("=")
        try:
            if not sep or not name.strip():
                raise ValueError
            out[name.strip()] = float(seconds)
        except ValueError:
            raise ValueError(f"bad timeout entry {item!r}: expected NAME=SECONDS,...") from None
    return out


def parse_factor(item: str) -> tuple[str, int]:
    """``"Unit=5"`` -> ``("Unit", 5)``: a score unit's factor (the engine's int32); ValueError naming the item."""
    unit, sep, value = item.strip().partition("=")
    try:
        factor = int(value)
    except ValueError:
        factor = None
    if not sep or not unit.strip() or factor is None or not INT32_MIN <= factor <= INT32_MAX:
        raise ValueError(f"{item.strip()!r}: expected UNIT=N, N an integer (the engine's int32)")
    return unit.strip(), factor


def parse_factors(value: str) -> dict[str, int]:
    """``"UnitA=5,UnitB=2"`` -> ``{"UnitA": 5, "UnitB": 2}``."""
    return dict(parse_factor(item) for item in value.split(",") if item.strip())


class Settings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="VMSCHED_", extra="ignore", hide_input_in_errors=True)  # the URL holds a password

    # bus
    amqp_url: str = Field(DEFAULT_AMQP_URL, description="AMQP broker URL; memory:// is the embedded bus")
    amqp_url_file: Path | None = Field(None, description="file holding the broker URL (with its password)")
    amqp_ca: Path | None = Field(None, description="amqps: CA of the broker's certificate (default: the system's)")
    amqp_cert: Path | None = Field(None, description="amqps: client certificate chain (PEM)")
    amqp_key: Path | None = Field(None, description="amqps: the client certificate's private key (PEM)")
    prefetch: int = Field(8, ge=1, description="unacknowledged requests a consumer may hold")
    consumers: int = Field(2, ge=1, description="consumer threads per service")
    delivery_limit: int = Field(2, ge=1, le=20, description="deliveries of a scheduling request at most (each one "
                                "whose consumer died counts) before it is dead-lettered and answered with an error; "
                                "the same on every component (it is an argument of the request queues)")
    runtime_dir: Path | None = Field(None, description="a service's runtime directory, kept across its restarts, for "
                                     "its in-flight journal (default: systemd's $RUNTIME_DIRECTORY, else "
                                     "vmsched-<uid> in the temporary directory)")
    connect_timeout: float = Field(2.0, gt=0, description="broker connect timeout, seconds")
    confirm_timeout: float = Field(2.0, gt=0, description="publisher-confirm wait, seconds")
    reconnect_max_delay: float = Field(2.0, gt=0, description="upper bound of the reconnect backoff, seconds")

    # gateway
    host: str = Field("127.0.0.1", description="gateway listen address")
    port: int = Field(18781, ge=0, le=65535, description="gateway listen port")
    request_timeout: float = Field(30.0, gt=0, le=110, description="deadline of one engine request, seconds")
    max_body_bytes: int = Field(1 << 20, ge=1024, description="largest accepted request body, bytes")
    decisions_size: int = Field(200, ge=0, le=100000, description="scheduling decisions the gateway keeps per operation (GET /v1/decisions); 0: no decision log")
    decisions_share: bool = Field(True, description="on RabbitMQ, GET /v1/decisions and the console also ask the other gateway replicas (answers within 0.5 s); off: this gateway's decisions only")
    decisions_log: bool = Field(False, description="also write each decision as one JSON line to stdout (Loki/ELK)")
    gateway_id: str = Field("", description="this gateway's label in decision records; empty: the host name")
    score_per_unit: bool = Field(False, description="score replies as [host, weight, unit] per unit, factored by the "
                                                    "engine (docs/plugins.md); default: one factored total per host")

    # hostile input: request limits and read timeouts (gateway)
    max_hosts: int = Field(10000, ge=1, description="most host IDs in one scheduling request")
    max_units: int = Field(200, ge=1, description="most plugin units in one scheduling request")
    max_string: int = Field(4096, ge=64, description="longest string in a scheduling request (ID, name, property), characters")
    header_timeout: float = Field(10.0, gt=0, le=600, description="time a client has to send a request's headers, seconds")
    body_timeout: float = Field(30.0, gt=0, le=3600, description="time a client has to send a request's body, seconds")

    # gateway trust (docs/api-auth.md)
    tokens_file: Path | None = Field(None, description="YAML file of hashed bearer tokens and client subjects")
    tls_cert: Path | None = Field(None, description="gateway HTTPS certificate chain (PEM), reloaded on change")
    tls_key: Path | None = Field(None, description="gateway HTTPS private key (PEM), reloaded on change")
    tls_client_ca: Path | None = Field(None, description="CA of accepted client certificates (mTLS)")
    engine_allow: str = Field("", description="CIDR,... allowed to call XML-RPC POST / and /RPC2; empty: any")
    console_secret_file: Path | None = Field(None, description="file of the secret that signs console sessions, the "
                                             "same on every gateway replica (`vmsched console-secret`); unset: a "
                                             "random secret of the process")
    console_session_ttl: float = Field(8 * 3600.0, gt=0, le=30 * 86400,
                                       description="how long a console session lasts, seconds")

    # plugins
    plugins_dir: Path = Field(
        default_factory=stock_plugins_dir,
        validation_alias=AliasChoices("plugins_dir", "VMSCHED_PLUGINS", "OSCHEDPROXY_PLUGINS"),
        description="folder of plugin files (top-level *.py)",
    )
    stock_plugins: bool = Field(False, description="also load the stock plugins, after the plugins_dir folder (a "
                                                   "module or unit name in both is a load error)")
    pool_size: int | None = Field(None, ge=1, description="a fixed number of plugin worker processes per service (sets pool_min and pool_max)")
    pool_min: int = Field(1, ge=1, description="plugin worker processes a service keeps when idle")
    pool_max: int = Field(4, ge=1, description="most plugin worker processes per service (more start while calls queue)")
    pool_idle: float = Field(60.0, gt=0, description="seconds a plugin worker above pool_min may stay idle before it stops")
    plugin_bundle_ms: float = Field(2.0, ge=0, description="the units of a request share one plugin worker while their mean run time together stays under this, ms; 0: each unit on its own worker")
    plugin_timeout: float = Field(10.0, gt=0, le=110, description="default per-call plugin timeout, seconds")
    plugin_timeouts: Annotated[dict[str, float], NoDecode] = Field(default_factory=dict, description="per-unit timeouts NAME=SECONDS,...")
    plugin_memory_mb: int = Field(1024, ge=32, description="address-space limit of a plugin worker, MiB")
    plugin_cpu_seconds: int = Field(30, ge=1, description="CPU-time limit of one plugin call, seconds")
    plugin_max_output: int = Field(1 << 20, ge=1024, description="largest plugin stdout accepted, bytes")
    rescan_interval: float = Field(1.0, gt=0, description="plugin folder rescan period, seconds")
    # plugin sandbox (docs/plugins.md)
    plugin_user: str = Field("", description="user plugin workers switch to when the service runs as root; empty: vmsched-plugin if it exists, else nobody")
    allow_root_plugins: bool = Field(False, description="run plugins as root (without capabilities) when the switch to plugin_user is impossible")
    plugin_network: bool = Field(False, description="plugins may open network (AF_INET/AF_INET6) sockets")
    plugin_env: str = Field("", description="extra environment variable names passed to plugins, NAME,...")
    plugin_write_dirs: str = Field("", description="directories plugins may write besides their private temporary one, DIR,...")
    plugin_max_procs: int = Field(256, ge=8, description="RLIMIT_NPROC of a plugin worker (processes and threads of its user)")
    plugin_max_files: int = Field(256, ge=32, description="RLIMIT_NOFILE of a plugin worker")
    plugin_max_file_mb: int = Field(64, ge=1, description="RLIMIT_FSIZE of a plugin worker, MiB")

    # host facts (docs/facts.md)
    facts: bool = Field(True, description="keep a host facts cache fed by the agents (scoring, balancer, gateway)")
    facts_max_age: float | None = Field(None, gt=0, description="host facts older than this are stale, seconds; default 3 agent intervals")
    facts_host_map: Path | None = Field(None, description="file of 'engine host ID = agent host ID' lines")
    engine_link_file: Path | None = Field(None, description="YAML file of the optional, read-only engine link: url, "
                                          "username, password (docs/facts.md); unset: no engine link")
    engine_link_ca: Path | None = Field(None, description="CA of the engine's HTTPS certificate (default: the system's)")
    engine_link_timeout: float = Field(5.0, gt=0, le=60, description="timeout of one engine REST call, seconds")
    engine_link_ttl: float = Field(300.0, ge=1, description="how long the engine link keeps an answer, seconds")
    engine_link_wait: float = Field(0.5, ge=0, le=10, description="how long a plugin call waits for the engine link's "
                                    "first answer about a VM, seconds (0: never; the call then says 'not known yet')")

    # recording of the engine's calls (docs/testing-policies.md)
    record: Path | None = Field(None, description="folder to record the engine's calls and what their units could "
                                "read in (gateway and services); unset: no recording")
    record_max_mb: int = Field(1024, ge=4, description="most MiB of recordings in the --record folder (the oldest "
                               "files go first)")
    record_omit: str = Field("", description="property keys left out of the recording, KEY,...")
    whatif_reports: Path | None = Field(None, description="folder of `vmsched replay --json` reports the console's "
                                        "what-if view lists (gateway); unset: none")

    # a shadow candidate on live calls (docs/testing-policies.md)
    shadow: Path | None = Field(None, description="plugins folder of a candidate policy run beside the live one "
                                "on live calls (scoring, balancer), compared, never answered; unset: no shadow")
    shadow_rate: float = Field(1.0, gt=0, le=1, description="share of live calls the shadow candidate runs, 0-1")
    shadow_factors: str = Field("", description="score units whose factor the candidate changes, UNIT=N,...")
    shadow_drop: str = Field("", description="units the candidate leaves out, UNIT,...")
    shadow_queue: int = Field(16, ge=1, le=10000, description="calls waiting for the shadow at most; more are shed")
    shadow_workers: int = Field(1, ge=1, le=64, description="plugin workers of the shadow candidate (and calls it "
                                "runs at once)")

    # observability
    metrics_port: int | None = Field(None, ge=0, le=65535, description="Prometheus port of a worker service")
    metrics_host: str = Field("127.0.0.1", description="metrics listener address")
    metrics_tls_cert: Path | None = Field(None, description="metrics listener HTTPS certificate (PEM)")
    metrics_tls_key: Path | None = Field(None, description="metrics listener HTTPS key (PEM)")
    metrics_auth: bool = Field(False, description="/metrics requires a token with the read role")
    log_level: str = Field("INFO", description="logging level")
    log_format: Literal["text", "json"] = Field("text", description="every log line as text, or as one JSON "
                                                "object (audit lines: their fields alone; vmsched/logs.py)")

    @field_validator("engine_allow")
    @classmethod
    def _networks(cls, value: str) -> str:
        items = [v.strip() for v in value.split(",") if v.strip()]
        if value and not items:  # a list given (even blanks or commas only) but empty must not mean "any client"
            raise ValueError("lists no network; give CIDR,... or leave it unset "
                             "(unset or empty: any client may call the XML-RPC)")
        for item in items:
            try:
                ipaddress.ip_network(item, strict=False)
            except ValueError:
                raise ValueError(f"{item!r} is not an address or CIDR network") from None
        return value

    @property
    def engine_networks(self) -> list[ipaddress.IPv4Network | ipaddress.IPv6Network]:
        return [ipaddress.ip_network(v.strip(), strict=False) for v in self.engine_allow.split(",") if v.strip()]

    @field_validator("shadow_factors")
    @classmethod
    def _factors(cls, value: str) -> str:
        parse_factors(value)
        return value

    @field_validator("amqp_url_file")
    @classmethod
    def _url_file(cls, value: Path | None) -> Path | None:
        if value is not None:
            read_url_file(value)  # readable and holding a URL: said against the option that names the file
        return value

    @model_validator(mode="after")
    def _url_from_file(self) -> "Settings":
        if self.amqp_url_file is not None:
            if "amqp_url" in self.model_fields_set and self.amqp_url:
                raise ValueError("give the broker URL once: VMSCHED_AMQP_URL/--amqp or VMSCHED_AMQP_URL_FILE/--amqp-url-file")
            self.amqp_url = read_url_file(self.amqp_url_file)
        return self

    @field_validator("pool_max")
    @classmethod
    def _pool_bounds(cls, value: int, info: ValidationInfo) -> int:
        fewest = info.data.get("pool_min")
        if info.data.get("pool_size") is None and fewest is not None and fewest > value:
            raise ValueError(f"below the pool's minimum ({fewest}, --pool-min or VMSCHED_POOL_MIN): raise it, "
                             "or lower the minimum")
        return value

    def pool_bounds(self) -> tuple[int, int]:
        """(fewest, most) plugin worker processes of a service: pool_size fixes both."""
        if self.pool_size is not None:
            return self.pool_size, self.pool_size
        return self.pool_min, self.pool_max

    @field_validator("plugin_timeouts", mode="before")
    @classmethod
    def _timeouts(cls, value: Any) -> dict[str, float]:
        return parse_timeouts(value)

    @property
    def plugin_folders(self) -> list[Path]:
        """The plugins folders, in the order the plugin workers import from them: plugins_dir, then the stock
        plugins with stock_plugins (unless plugins_dir is theirs)."""
        stock = stock_plugins_dir()
        if self.stock_plugins and Path(self.plugins_dir).resolve() != stock.resolve():
            return [self.plugins_dir, stock]
        return [self.plugins_dir]

    @property
    def embedded(self) -> bool:
        return self.amqp_url.startswith("memory://")

    def timeout_for(self, unit: str) -> float:
        return self.plugin_timeouts.get(unit, self.plugin_timeout)
