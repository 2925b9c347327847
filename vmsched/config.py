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

from pydantic import AfterValidator, AliasChoices, BeforeValidator, Field, ValidationInfo, field_validator
from pydantic import model_validator
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


def _networks(value: str) -> str:
    """``--engine-allow``: CIDR networks or addresses, separated by commas."""
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


def _factors(value: str) -> str:
    parse_factors(value)
    return value


def _url_file(value: Path | None) -> Path | None:
    if value is not None:
        read_url_file(value)  # readable and holding a URL: said against the option that names the file
    return value


class Settings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="VMSCHED_", extra="ignore", hide_input_in_errors=True)  # the URL holds a password
    # Each description but amqp_url's and metrics_port's is the --help of the setting's option (vmsched.cli makes
    # the options from them). Times are in seconds, unless the name ends in _ms; sizes ending in _mb are MiB.

    # bus
    amqp_url: str = Field(DEFAULT_AMQP_URL, description="AMQP broker URL; memory:// is the embedded bus")
    amqp_url_file: Annotated[Path | None, AfterValidator(_url_file)] = Field(None, description="file holding the "
                                                                             "broker URL with its password (env "
                                                                             "VMSCHED_AMQP_URL_FILE)")
    amqp_ca: Path | None = Field(None, description="amqps: CA of the broker's certificate (default: the system's)")
    amqp_cert: Path | None = Field(None, description="amqps: client certificate chain")
    amqp_key: Path | None = Field(None, description="amqps: the client certificate's private key")
    prefetch: int = Field(8, ge=1, description="unacknowledged requests per consumer (default 8)")
    consumers: int = Field(2, ge=1, description="consumer threads per service (default 2)")
    # each delivery whose consumer died counts; an argument of the request queues, so the same on every component
    delivery_limit: int = Field(2, ge=1, le=20, description="deliveries of a scheduling request at most before it is "
                                "dead-lettered and answered with an error; the same on the gateway and the services "
                                "(env VMSCHED_DELIVERY_LIMIT; default 2)")
    runtime_dir: Path | None = Field(None, description="runtime directory kept across restarts, for the in-flight "
                                     "journal (env VMSCHED_RUNTIME_DIR; default: systemd's $RUNTIME_DIRECTORY, else "
                                     "vmsched-<uid> in the temporary directory)")
    connect_timeout: float = Field(2.0, gt=0, description="broker connect timeout in seconds (default 2)")
    confirm_timeout: float = Field(2.0, gt=0, description="how long a publish waits for the broker's confirm; a "
                                   "broker that answers nothing that long is taken as gone and another connection "
                                   "opened, seconds (default 2)")
    reconnect_max_delay: float = Field(2.0, gt=0, description="longest wait between two attempts to reach the broker, "
                                       "seconds (default 2)")

    # gateway
    host: str = Field("127.0.0.1", description="listen address (env VMSCHED_HOST; default 127.0.0.1)")
    port: int = Field(18781, ge=0, le=65535, description="listen port (env VMSCHED_PORT; default 18781)")
    request_timeout: float = Field(30.0, gt=0, le=110, description="deadline of one scheduling request in seconds "
                                   "(default 30; the engine waits 120)")
    max_body_bytes: int = Field(1 << 20, ge=1024, description="largest request body accepted (default 1048576)")
    decisions_size: int = Field(200, ge=0, le=100000, description="scheduling decisions kept per operation for GET "
                                "/v1/decisions and the console (default 200; 0: no decision log)")
    # the other replicas' answers are waited for 0.5 s at most
    decisions_share: bool = Field(True, description="on RabbitMQ, GET /v1/decisions and the console also ask the "
                                  "other gateway replicas (default on; --no-decisions-share: this gateway's decisions "
                                  "only)")
    decisions_log: bool = Field(False, description="also write each decision as one JSON line to stdout, for Loki or "
                                "ELK (default off)")
    gateway_id: str = Field("", description="this gateway's label in decision records (default: the host name)")
    score_per_unit: bool = Field(False, description="score replies as [host, weight, unit] per unit, factored by the "
                                 "engine (env VMSCHED_SCORE_PER_UNIT; default off: one total per host; "
                                 "docs/plugins.md)")

    # hostile input: request limits and read timeouts (gateway)
    max_hosts: int = Field(10000, ge=1, description="most host IDs in one scheduling request (default 10000)")
    max_units: int = Field(200, ge=1, description="most plugin units in one scheduling request (default 200)")
    max_string: int = Field(4096, ge=64, description="longest string in a scheduling request: ID, unit name, property "
                            "(default 4096 characters)")
    header_timeout: float = Field(10.0, gt=0, le=600, description="close a connection whose request headers take "
                                  "longer (default 10 s; 408 if it sent some)")
    body_timeout: float = Field(30.0, gt=0, le=3600, description="answer 408 to a request whose body takes longer "
                                "(default 30 s)")

    # gateway trust (docs/api-auth.md)
    # a YAML file of token digests and client-certificate subjects, each with its roles
    tokens_file: Path | None = Field(None, description="hashed bearer tokens and their roles, re-read when it changes "
                                     "(env VMSCHED_TOKENS_FILE; `vmsched token new` makes one; docs/api-auth.md)")
    tls_cert: Path | None = Field(None, description="serve HTTPS with this certificate chain (reloaded when the file "
                                  "changes; env VMSCHED_TLS_CERT)")
    # both files reloaded when they change; tls_client_ca: mTLS
    tls_key: Path | None = Field(None, description="the certificate's private key (env VMSCHED_TLS_KEY)")
    tls_client_ca: Path | None = Field(None, description="accept client certificates signed by this CA, mapped to "
                                       "roles by the tokens file's clients: list")
    engine_allow: Annotated[str, AfterValidator(_networks)] = Field("", description="only these networks may call "
                                                                    "XML-RPC POST / and /RPC2 (env "
                                                                    "VMSCHED_ENGINE_ALLOW; default: any)")
    console_secret_file: Path | None = Field(None, description="the secret that signs console sessions, the same file "
                                             "on every gateway replica (`vmsched console-secret` makes one; env "
                                             "VMSCHED_CONSOLE_SECRET_FILE; default: a random secret of this process)")
    console_session_ttl: float = Field(8 * 3600.0, gt=0, le=30 * 86400,
                                       description="how long a console session lasts (env "
                                       "VMSCHED_CONSOLE_SESSION_TTL; default 28800 s, 8 h)")

    # plugins
    plugins_dir: Path = Field(
        default_factory=stock_plugins_dir,
        validation_alias=AliasChoices("plugins_dir", "VMSCHED_PLUGINS", "OSCHEDPROXY_PLUGINS"),
        description="plugins folder, top-level *.py files (env VMSCHED_PLUGINS or OSCHEDPROXY_PLUGINS; default: the "
                        "stock plugins shipped with vmsched, which a folder given replaces)",
    )
    stock_plugins: bool = Field(False, description="keep the stock plugins beside --plugins DIR: both folders are "
                                "loaded, DIR first; a module or unit name in both is a load error (default off)")
    pool_size: int | None = Field(None, ge=1, description="a fixed number of plugin worker processes per service "
                                  "(sets --pool-min and --pool-max)")
    pool_min: int = Field(1, ge=1, description="plugin worker processes a service keeps when idle (default 1)")
    pool_max: int = Field(4, ge=1, description="most plugin worker processes per service; more start while calls "
                          "queue (default 4)")
    pool_idle: float = Field(60.0, gt=0, description="seconds a plugin worker above --pool-min may stay idle before "
                             "it stops (default 60)")
    plugin_bundle_ms: float = Field(2.0, ge=0, description="the units of a request share one plugin worker while "
                                    "their mean run time together stays under this (default 2); 0: each unit on its "
                                    "own worker")
    plugin_timeout: float = Field(10.0, gt=0, le=110, description="default timeout of one plugin call in seconds "
                                  "(default 10)")
    plugin_timeouts: Annotated[dict[str, float], NoDecode, BeforeValidator(parse_timeouts)] = Field(
        default_factory=dict, description="per-unit timeouts, e.g. 'SlowFilter=30,Quick=2'")
    plugin_memory_mb: int = Field(1024, ge=32, description="address-space limit of a plugin worker (default 1024)")
    plugin_cpu_seconds: int = Field(30, ge=1, description="CPU-time limit of one plugin call (default 30)")
    plugin_max_output: int = Field(1 << 20, ge=1024, description="largest stdout a plugin call may print (default "
                                   "1048576)")
    rescan_interval: float = Field(1.0, gt=0, description="plugins folder rescan period in seconds (default 1)")
    # plugin sandbox (docs/plugins.md)
    plugin_user: str = Field("", description="user plugin workers run as when the service is root (default "
                             "vmsched-plugin, else nobody)")
    allow_root_plugins: bool = Field(False, description="if the switch to --plugin-user is impossible, run plugins as "
                                     "root without capabilities instead of refusing")
    # AF_INET and AF_INET6 sockets
    plugin_network: bool = Field(False, description="let plugins open network sockets (default: off)")
    plugin_env: str = Field("", description="extra environment variables passed to plugins (default: none beyond "
                            "PATH, LANG, LC_*, TZ)")
    plugin_write_dirs: str = Field("", description="directories plugins may write besides a private temporary one "
                                   "(default: none)")
    # RLIMIT_NPROC counts the processes and threads of the plugin user
    plugin_max_procs: int = Field(256, ge=8, description="RLIMIT_NPROC of a plugin worker (default 256)")
    plugin_max_files: int = Field(256, ge=32, description="RLIMIT_NOFILE of a plugin worker (default 256)")
    plugin_max_file_mb: int = Field(64, ge=1, description="RLIMIT_FSIZE of a plugin worker (default 64)")

    # host facts (docs/facts.md)
    facts: bool = Field(True, description="keep a host facts cache fed by the policy agents, for the plugins, "
                        "/v1/facts and the decisions (default on; --no-facts: none)")
    facts_max_age: float | None = Field(None, gt=0, description="host facts older than this are stale (env "
                                        "VMSCHED_FACTS_MAX_AGE; default 3 agent intervals)")
    facts_host_map: Path | None = Field(None, description="engine host ID = agent host ID lines, for agents not "
                                        "started with the engine's ID (docs/facts.md)")
    engine_link_file: Path | None = Field(None, description="the optional, read-only engine link: a file with url, "
                                          "username and password of the engine's REST API, to map engine host IDs by "
                                          "hw_id and to learn a starting VM's memory and vCPUs (env "
                                          "VMSCHED_ENGINE_LINK_FILE; docs/facts.md)")
    engine_link_ca: Path | None = Field(None, description="CA of the engine's HTTPS certificate (default: the "
                                        "system's)")
    engine_link_timeout: float = Field(5.0, gt=0, le=60, description="timeout of one engine REST call (default 5)")
    engine_link_ttl: float = Field(300.0, ge=1, description="how long the engine link keeps an answer (default 300)")
    # 0: never; the plugin call then says 'not known yet'
    engine_link_wait: float = Field(0.5, ge=0, le=10, description="how long a call waits for the link's first answer "
                                    "about a VM (default 0.5; 0: never)")

    # recording of the engine's calls (docs/testing-policies.md)
    record: Path | None = Field(None, description="record the engine's calls and what their units could read in DIR, "
                                "for `vmsched replay` (default: off; docs/testing-policies.md)")
    # the oldest files go first
    record_max_mb: int = Field(1024, ge=4, description="most MiB of recordings in DIR (default 1024)")
    record_omit: str = Field("", description="property keys left out of the recording (secrets)")
    whatif_reports: Path | None = Field(None, description="a folder of `vmsched replay --json` reports (*.json) the "
                                        "console's what-if view lists (default: none; docs/console.md)")

    # a shadow candidate on live calls (docs/testing-policies.md)
    shadow: Path | None = Field(None, description="run the candidate plugins folder DIR beside the live policy on "
                                "live calls, after each reply, and compare (never answered; default: off; "
                                "docs/testing-policies.md)")
    shadow_rate: float = Field(1.0, gt=0, le=1, description="share of live calls the candidate runs, 0-1 (default 1)")
    shadow_factors: Annotated[str, AfterValidator(_factors)] = Field("", description="score units whose factor the "
                                                                     "candidate changes")
    shadow_drop: str = Field("", description="units the candidate leaves out")
    shadow_queue: int = Field(16, ge=1, le=10000, description="calls waiting for the candidate at most; more are shed "
                              "(default 16)")
    # also the calls the candidate runs at once
    shadow_workers: int = Field(1, ge=1, le=64, description="the candidate's plugin workers (default 1)")

    # observability
    metrics_port: int | None = Field(None, ge=0, le=65535, description="Prometheus port of a worker service")
    metrics_host: str = Field("127.0.0.1", description="metrics listen address (env VMSCHED_METRICS_HOST; default "
                              "127.0.0.1)")
    metrics_tls_cert: Path | None = Field(None, description="serve metrics over HTTPS with this certificate")
    metrics_tls_key: Path | None = Field(None, description="the metrics certificate's private key")
    metrics_auth: bool = Field(False, description="/metrics requires a bearer token with the read role (needs "
                               "--tokens-file; env VMSCHED_METRICS_AUTH)")
    log_level: str = Field("INFO", description="DEBUG, INFO, WARNING or ERROR (env VMSCHED_LOG_LEVEL; default INFO)")
    # an audit line in JSON is its fields alone (vmsched/logs.py)
    log_format: Literal["text", "json"] = Field("text", description="every log line, audit lines included, as text or "
                                                "as one JSON object (env VMSCHED_LOG_FORMAT; default text)")

    @property
    def engine_networks(self) -> list[ipaddress.IPv4Network | ipaddress.IPv6Network]:
        return [ipaddress.ip_network(v.strip(), strict=False) for v in self.engine_allow.split(",") if v.strip()]

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
