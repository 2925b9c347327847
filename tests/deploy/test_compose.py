"""compose.yaml, its deploy/ files, and the systemd units, checked offline.

* compose.yaml is interpolated the way ``docker compose`` does (``${VAR}``,
  ``${VAR:-default}``, ``${VAR:?error}``) with deploy/compose.env.example, then
  validated against the Compose Specification JSON schema vendored in
  tests/schemas/ (see the README there for its provenance).
* The commands, ports, health checks and environment of the vmsched services
  are checked against the real CLI parser and Settings object.
* Prometheus and Grafana provisioning are checked against compose.yaml
  (targets, ports, mounted paths).
* deploy/systemd/*.service: ExecStart parsed with the real CLI, environment
  names checked against Settings.
"""

from __future__ import annotations

import json
import re
import shlex
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

import jsonschema
import pytest
import yaml

from tests.support.deploy import AGENT_ENV, parse_cli, settings_env_names
from tests.support.paths import ROOT
from vmsched.cli.runner import service_queues
from vmsched.config import Settings

COMPOSE = ROOT / "compose.yaml"
DEPLOY = ROOT / "deploy"
SCHEMA = ROOT / "tests" / "schemas" / "compose-spec.json"
ENV_EXAMPLE = DEPLOY / "compose.env.example"
#: The services that consume the bus's request queues (each declares its QUEUES).
WORKERS = tuple(service_queues())
VMSCHED_SERVICES = ("gateway", *WORKERS)
#: Values the test puts in place of the secrets the example leaves empty.
TEST_SECRETS = {"RABBITMQ_ADMIN_PASSWORD": "s3cret-for-tests-0123", "GRAFANA_ADMIN_PASSWORD": "grafana-for-tests"}
#: Where each vmsched service finds its own broker URL (compose.yaml's x-vmsched).
URL_FILE = "/etc/vmsched/amqp/amqp.url"


# --- interpolation, as docker compose does it ---------------------------------------
class MissingVariable(Exception):
    pass


_VAR = re.compile(
    r"\$(?:(?P<escaped>\$)|\{(?P<braced>[A-Za-z_][A-Za-z0-9_]*)(?:(?P<op>:?[-?])(?P<arg>[^}]*))?\}|(?P<named>[A-Za-z_][A-Za-z0-9_]*))"
)


def interpolate_str(text: str, env: dict[str, str]) -> str:
    def sub(m: re.Match[str]) -> str:
        if m.group("escaped"):
            return "$"
        name = m.group("braced") or m.group("named")
        op, arg = m.group("op"), m.group("arg") or ""
        value = env.get(name)
        unset_or_empty = not value
        if op in (":-", "-"):
            return arg if (unset_or_empty if op == ":-" else value is None) else value  # type: ignore[return-value]
        if op in (":?", "?"):
            if unset_or_empty if op == ":?" else value is None:
                raise MissingVariable(f"{name}: {arg}")
            return value  # type: ignore[return-value]
        return value or ""

    return _VAR.sub(sub, text)


def interpolate(node: Any, env: dict[str, str]) -> Any:
    if isinstance(node, str):
        return interpolate_str(node, env)
    if isinstance(node, list):
        return [interpolate(v, env) for v in node]
    if isinstance(node, dict):
        return {k: interpolate(v, env) for k, v in node.items()}
    return node


def read_env_file(path: Path) -> dict[str, str]:
    env = {}
    for line in path.read_text().splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        key, sep, value = line.partition("=")
        assert sep, f"{path.name}: {line!r} is not KEY=VALUE"
        env[key.strip()] = value.strip()
    return env


def raw_compose() -> dict[str, Any]:
    return yaml.safe_load(COMPOSE.read_text())


def example_env() -> dict[str, str]:
    env = read_env_file(ENV_EXAMPLE)
    for key, value in TEST_SECRETS.items():
        assert key in env, f"{ENV_EXAMPLE.name} should list {key}"
        assert env[key] == "", f"{ENV_EXAMPLE.name} must not ship a password for {key}"
        env[key] = value
    return env


@pytest.fixture(scope="module")
def compose() -> dict[str, Any]:
    return interpolate(raw_compose(), example_env())


@pytest.fixture(scope="module")
def services(compose: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return compose["services"]


def option(args: list[str], name: str) -> str:
    """Value of ``--name V`` or ``--name=V`` in an argument list."""
    for i, arg in enumerate(args):
        if arg == name:
            return args[i + 1]
        if arg.startswith(name + "="):
            return arg.split("=", 1)[1]
    raise AssertionError(f"{name} not in {args}")


# --- the specification --------------------------------------------------------------------
def test_compose_file_is_valid_against_the_compose_specification(compose: dict[str, Any]) -> None:
    schema = json.loads(SCHEMA.read_text())
    validator = jsonschema.Draft201909Validator(schema)
    errors = sorted(validator.iter_errors(compose), key=lambda e: list(e.path))
    assert not errors, "\n".join(f"{'.'.join(map(str, e.path))}: {e.message}" for e in errors)


def test_schema_check_catches_mistakes(compose: dict[str, Any]) -> None:
    """The vendored schema is strict enough to matter."""
    validator = jsonschema.Draft201909Validator(json.loads(SCHEMA.read_text()))
    broken = json.loads(json.dumps(compose))
    broken["services"]["gateway"]["depends_on"]["scoring"] = {"condition": "service_ready"}
    broken["services"]["scoring"]["deploy"]["replicas"] = "three"
    broken["services"]["grafana"]["healthcheck"]["tset"] = ["CMD", "true"]
    assert len(list(validator.iter_errors(broken))) >= 3


def test_secrets_come_from_the_environment() -> None:
    raw = raw_compose()
    env = example_env()
    # every required variable (${VAR:?...}) is documented in the example env file
    required = set(re.findall(r"\$\{([A-Za-z_][A-Za-z0-9_]*):\?", COMPOSE.read_text()))
    assert {"RABBITMQ_ADMIN_PASSWORD", "GRAFANA_ADMIN_PASSWORD"} <= required
    assert required <= set(env)
    # and the file refuses to start without the passwords
    for secret in TEST_SECRETS:
        with pytest.raises(MissingVariable, match=secret):
            interpolate(raw, {**env, secret: ""})
    # nothing in compose.yaml embeds a password, and no broker URL is in any environment
    for name, service in raw["services"].items():
        for key, value in (service.get("environment") or {}).items():
            if re.search(r"PASS|PASSWORD", key):
                assert "${" in str(value), f"{name}: {key} is hard-coded"
            assert key not in ("VMSCHED_AMQP_URL", "VMSCHED_AGENT_AMQP"), f"{name}: {key} puts the URL in the environment"
            assert "amqp://" not in str(value), f"{name}: {key}"
        assert not [k for k in (service.get("environment") or {}) if k.startswith("RABBITMQ_DEFAULT_")], \
            f"{name}: the broker's users come from the definitions, not a default user"


def test_each_component_reads_its_own_broker_user(services: dict[str, dict[str, Any]]) -> None:
    """One URL file per component, in a volume no other vmsched service mounts."""
    volume_of = {}
    for name in VMSCHED_SERVICES:
        svc = services[name]
        assert svc["environment"]["VMSCHED_AMQP_URL_FILE"] == URL_FILE
        mounts = [v.split(":") for v in svc["volumes"]]
        (mount,) = [m for m in mounts if m[1] == str(Path(URL_FILE).parent)]
        assert mount[2] == "ro", name
        volume_of[name] = mount[0]
        assert mount[0] in services["secrets"]["volumes"][0] or any(
            v.startswith(f"{mount[0]}:/secrets/{name}") for v in services["secrets"]["volumes"]), \
            f"{name}: its volume must be written by the secrets service at /secrets/{name}"
    assert len(set(volume_of.values())) == len(volume_of), f"components share a broker user: {volume_of}"
    for name, svc in services.items():
        if name in ("secrets",):
            continue
        foreign = [v for v in svc.get("volumes", []) if v.split(":")[0] in volume_of.values()
                   and v.split(":")[0] != volume_of.get(name)]
        assert not foreign, f"{name} mounts another component's broker URL: {foreign}"
    # the broker waits for the users and loads them at boot
    assert services["rabbitmq"]["depends_on"]["secrets"] == {"condition": "service_completed_successfully"}
    conf = (DEPLOY / "rabbitmq" / "definitions.conf").read_text()
    path = re.search(r"^load_definitions\s*=\s*(\S+)$", conf, re.M).group(1)
    rabbit_mounts = {v.split(":")[1]: v.split(":")[0] for v in services["rabbitmq"]["volumes"]}
    assert rabbit_mounts[str(Path(path).parent)] == "broker-definitions"
    assert any(v.startswith("broker-definitions:/secrets/rabbitmq") for v in services["secrets"]["volumes"])
    assert rabbit_mounts["/etc/rabbitmq/conf.d/91-vmsched-definitions.conf"] == "./deploy/rabbitmq/definitions.conf"


def test_the_gateway_requires_its_tokens_file(services: dict[str, dict[str, Any]]) -> None:
    gw = services["gateway"]
    tokens = Path(gw["environment"]["VMSCHED_TOKENS_FILE"])
    (mount,) = [v.split(":") for v in gw["volumes"] if v.split(":")[1] == str(tokens.parent)]
    assert mount[0] == "gateway-tokens" and mount[2] == "ro"
    assert any(v.startswith("gateway-tokens:/secrets/gateway-tokens") for v in services["secrets"]["volumes"])
    assert gw["depends_on"]["secrets"] == {"condition": "service_completed_successfully"}


def test_the_gateway_reads_the_console_secret_the_secrets_service_makes(services: dict[str, dict[str, Any]]) -> None:
    gw = services["gateway"]
    secret = Path(gw["environment"]["VMSCHED_CONSOLE_SECRET_FILE"])
    (mount,) = [v.split(":") for v in gw["volumes"] if v.split(":")[1] == str(secret.parent)]
    assert mount[0] == "gateway-console" and mount[2] == "ro"
    made = [v.split(":")[1] for v in services["secrets"]["volumes"] if v.startswith("gateway-console:")]
    init = (ROOT / "deploy" / "compose" / "init-secrets.sh").read_text()
    assert made == ["/secrets/gateway-console"] and f"$SECRETS/gateway-console/{secret.name}" in init
    assert [name for name, svc in services.items() if any(str(v).startswith("gateway-console:")
                                                          for v in svc.get("volumes", []))] == ["secrets", "gateway"]


def test_the_secrets_service_is_a_confined_one_shot(services: dict[str, dict[str, Any]]) -> None:
    svc = services["secrets"]
    assert svc["image"] == services["gateway"]["image"], "it runs `vmsched token new` from the same image"
    entry = svc["entrypoint"]
    assert entry[0] == "/bin/bash" and (ROOT / "deploy" / Path(entry[1]).relative_to("/deploy")).is_file()
    assert "./deploy:/deploy:ro" in svc["volumes"]
    assert svc["restart"] == "no" and svc["network_mode"] == "none"
    assert svc["cap_drop"] == ["ALL"] and svc["cap_add"] == ["CHOWN"] and svc["read_only"] is True
    assert "no-new-privileges:true" in svc["security_opt"]
    assert svc["environment"]["RABBITMQ_ADMIN_PASSWORD"] == TEST_SECRETS["RABBITMQ_ADMIN_PASSWORD"]
    # every vmsched service and the broker start after it
    for name in (*VMSCHED_SERVICES, "rabbitmq"):
        assert services[name]["depends_on"]["secrets"] == {"condition": "service_completed_successfully"}, name


# --- vmsched services against the real CLI -------------------------------------------------------
def test_every_vmsched_service_is_there(services: dict[str, dict[str, Any]]) -> None:
    assert {"rabbitmq", "prometheus", "grafana", *VMSCHED_SERVICES} <= set(services)
    images = {services[name]["image"] for name in VMSCHED_SERVICES}
    assert len(images) == 1, "one image runs every service"
    for name in VMSCHED_SERVICES:
        assert services[name]["build"]["target"] == "service"
        assert services[name]["command"][0] == name
    assert services["scoring"]["deploy"]["replicas"] >= 2, "scoring runs several replicas"


@pytest.mark.parametrize("name", VMSCHED_SERVICES)
def test_commands_are_accepted_by_the_cli(services: dict[str, dict[str, Any]], name: str) -> None:
    args = parse_cli(services[name]["command"])
    assert args.command == name


@pytest.mark.parametrize("name", VMSCHED_SERVICES)
def test_environment_is_read_by_vmsched(services: dict[str, dict[str, Any]], name: str, tmp_path: Path) -> None:
    env = dict(services[name]["environment"])
    assert "VMSCHED_AMQP_URL_FILE" in env and "VMSCHED_AMQP_URL" not in env
    known = settings_env_names()
    unknown = [k for k in env if k.startswith("VMSCHED_") and k not in known]
    assert not unknown, f"{name}: nothing reads {unknown}"
    # the values are valid settings, too (files the containers mount stand in here)
    url_file = tmp_path / "amqp.url"
    url_file.write_text("amqp://vmsched-x:0123456789abcdef@rabbitmq:5672/%2F\n")
    env["VMSCHED_AMQP_URL_FILE"] = str(url_file)
    Settings(**{k.removeprefix("VMSCHED_").lower(): v for k, v in env.items()
                if k.startswith("VMSCHED_") and k not in ("VMSCHED_PLUGINS", "VMSCHED_TOKENS_FILE")})


def test_plugins_folder_is_mounted_from_the_host(services: dict[str, dict[str, Any]]) -> None:
    for name in WORKERS:
        svc = services[name]
        target = svc["environment"]["VMSCHED_PLUGINS"]
        mounts = [v.split(":") for v in svc["volumes"]]
        (source,) = [m[0] for m in mounts if m[1] == target]
        assert ["ro"] == [m[2] for m in mounts if m[1] == target]
        assert (ROOT / source).is_dir(), f"{source} does not exist"


def test_the_documented_shadow_override_names_a_mounted_candidate(services: dict[str, dict[str, Any]]) -> None:
    """docs/deploy/compose.md's compose.override.yaml: scoring and balancer mount the candidate they are given."""
    text = (ROOT / "docs" / "deploy" / "compose.md").read_text()
    (block,) = [b for b in re.findall(r"```yaml\n(.*?)```", text, re.S) if "VMSCHED_SHADOW" in b]
    override = yaml.safe_load(block)["services"]
    assert set(override) == {"scoring", "balancer"}, "the services that run live units"
    for name, extra in override.items():
        env = {**services[name]["environment"], **extra["environment"]}
        assert set(extra["environment"]) <= settings_env_names()
        # compose merges volumes by target: the live plugins folder stays, the candidate is another one
        targets = {v.split(":")[1]: v.split(":") for v in [*services[name]["volumes"], *extra["volumes"]]}
        assert targets[env["VMSCHED_SHADOW"]][2] == "ro" and env["VMSCHED_SHADOW"] != env["VMSCHED_PLUGINS"]
        settings = Settings(**{k.removeprefix("VMSCHED_").lower(): v for k, v in extra["environment"].items()})
        assert settings.shadow == Path(env["VMSCHED_SHADOW"]) and 0 < settings.shadow_rate <= 1


def test_ports_and_health_checks_match_the_commands(services: dict[str, dict[str, Any]]) -> None:
    gw = services["gateway"]
    port = option(gw["command"], "--port")
    # containers bind every address explicitly (the CLI's defaults are loopback)
    assert option(gw["command"], "--host") == "0.0.0.0"
    assert option(gw["command"], "--metrics-host") == "0.0.0.0"
    assert option(gw["command"], "--metrics-port") != port, "/metrics has its own listener"
    assert gw["ports"] == [f"18781:{port}"], "the engine expects the gateway on 18781; metrics stay unpublished"
    assert f"127.0.0.1:{port}/readyz" in " ".join(gw["healthcheck"]["test"])
    for name in WORKERS:
        svc = services[name]
        metrics_port = option(svc["command"], "--metrics-port")
        assert option(svc["command"], "--metrics-host") == "0.0.0.0", name
        assert f"127.0.0.1:{metrics_port}/" in " ".join(svc["healthcheck"]["test"]), name
        assert "ports" not in svc, f"{name} is internal (and replicated): no published port"


def test_start_order(services: dict[str, dict[str, Any]]) -> None:
    secrets = {"secrets": {"condition": "service_completed_successfully"}}
    for name in WORKERS:
        assert services[name]["depends_on"] == {**secrets, "rabbitmq": {"condition": "service_healthy"}}
    assert services["gateway"]["depends_on"] == {
        **secrets,
        "rabbitmq": {"condition": "service_healthy"},
        **{w: {"condition": "service_healthy"} for w in WORKERS},
    }
    assert services["grafana"]["depends_on"]["prometheus"]["condition"] == "service_healthy"
    # every service waited on for health has a health check
    for name, svc in services.items():
        for dep, cond in (svc.get("depends_on") or {}).items():
            if cond["condition"] == "service_healthy":
                assert "healthcheck" in services[dep], f"{name} waits for {dep}, which has no health check"


def test_vmsched_containers_are_hardened(services: dict[str, dict[str, Any]]) -> None:
    for name in VMSCHED_SERVICES:
        svc = services[name]
        assert svc["read_only"] is True
        assert svc["tmpfs"] == ["/tmp"]
        assert svc["cap_drop"] == ["ALL"]
        assert "no-new-privileges:true" in svc["security_opt"]
        assert "user" not in svc or svc["user"] not in ("root", "0", "0:0")


def test_third_party_images_are_pinned(services: dict[str, dict[str, Any]]) -> None:
    for name in ("rabbitmq", "prometheus", "grafana"):
        image = services[name]["image"]
        tag = image.rpartition(":")[2]
        assert re.match(r"^v?\d+\.\d+\.\d+", tag), f"{name}: {image} is not pinned to a version"


# --- RabbitMQ, Prometheus, Grafana ----------------------------------------------------------------
def test_rabbitmq_has_management_and_prometheus_plugins(services: dict[str, dict[str, Any]]) -> None:
    plugins = (DEPLOY / "rabbitmq" / "enabled_plugins").read_text().strip()
    assert re.fullmatch(r"\[[a-z_,\s]+\]\.", plugins), "enabled_plugins must be an Erlang list term"
    assert {"rabbitmq_management", "rabbitmq_prometheus"} <= {p.strip() for p in plugins[1:-2].split(",")}
    conf = (DEPLOY / "rabbitmq" / "vmsched.conf").read_text()
    assert re.search(r"^prometheus\.return_per_object_metrics\s*=\s*true$", conf, re.M), "per-queue metrics needed"
    mounts = {v.split(":")[1]: v.split(":")[0] for v in services["rabbitmq"]["volumes"] if v.startswith("./")}
    assert mounts["/etc/rabbitmq/enabled_plugins"] == "./deploy/rabbitmq/enabled_plugins"
    assert re.fullmatch(r"/etc/rabbitmq/conf\.d/[\w-]+\.conf", next(k for k, v in mounts.items() if v.endswith("vmsched.conf")))
    assert "environment" not in services["rabbitmq"], "no default user: the definitions hold every user"


def test_prometheus_scrapes_every_service_and_rabbitmq(services: dict[str, dict[str, Any]]) -> None:
    mount = next(v for v in services["prometheus"]["volumes"] if v.startswith("./"))
    source, target = mount.split(":")[:2]
    config_arg = next(a for a in services["prometheus"]["command"] if a.startswith("--config.file="))
    config_path = ROOT / source / Path(config_arg.split("=", 1)[1]).relative_to(target)
    config = yaml.safe_load(config_path.read_text())
    targets: dict[str, set[str]] = {}
    for job in config["scrape_configs"]:
        for sc in job.get("static_configs", []):
            targets.setdefault(job["job_name"], set()).update(sc["targets"])
        for sd in job.get("dns_sd_configs", []):
            targets.setdefault(job["job_name"], set()).update(f"{n}:{sd['port']}" for n in sd["names"])
        # vmsched's metrics have their own `service` label: no target label may shadow it
        for rc in job.get("relabel_configs", []):
            assert rc.get("target_label") != "service", job["job_name"]
        for sc in job.get("static_configs", []):
            assert "service" not in sc.get("labels", {}), job["job_name"]
    scraped = {t for ts in targets.values() for t in ts}
    assert f"gateway:{option(services['gateway']['command'], '--metrics-port')}" in scraped, "the gateway's metrics listener"
    for name in WORKERS:
        assert f"{name}:{option(services[name]['command'], '--metrics-port')}" in scraped, name
    assert "rabbitmq:15692" in scraped, "RabbitMQ's prometheus plugin listens on 15692"
    agents = next(j for j in config["scrape_configs"] if j["job_name"] == "vmsched-agent")
    assert agents["file_sd_configs"][0]["files"] == [f"{target}/agents/*.yml"]
    example = yaml.safe_load((DEPLOY / "prometheus" / "agents" / "hypervisors.yml.example").read_text())
    assert all(re.fullmatch(r"[\w.-]+:\d+", t) for group in example for t in group["targets"])


def test_grafana_is_provisioned_with_prometheus_and_the_dashboard(services: dict[str, dict[str, Any]]) -> None:
    grafana = services["grafana"]
    mounts = {v.split(":")[1]: v.split(":")[0] for v in grafana["volumes"] if v.startswith("./")}
    provisioning = ROOT / mounts["/etc/grafana/provisioning"]
    (ds,) = yaml.safe_load((provisioning / "datasources" / "prometheus.yml").read_text())["datasources"]
    assert ds["type"] == "prometheus"
    assert ds["url"] == "http://prometheus:9090" and "127.0.0.1:9090:9090" in services["prometheus"]["ports"]
    (provider,) = yaml.safe_load((provisioning / "dashboards" / "vmsched.yml").read_text())["providers"]
    dash_dir = provider["options"]["path"]
    assert mounts[dash_dir] == "./charts/vmsched/dashboards", "compose uses the chart's dashboard"
    dashboard = json.loads((ROOT / mounts[dash_dir] / "vmsched.json").read_text())
    assert dashboard["uid"] == "vmsched"
    home = grafana["environment"]["GF_DASHBOARDS_DEFAULT_HOME_DASHBOARD_PATH"]
    assert home == f"{dash_dir}/vmsched.json"
    assert grafana["environment"]["GF_SECURITY_ADMIN_PASSWORD"] == TEST_SECRETS["GRAFANA_ADMIN_PASSWORD"]


def test_bind_mount_sources_exist(services: dict[str, dict[str, Any]]) -> None:
    for name, svc in services.items():
        for volume in svc.get("volumes", []):
            source = volume.split(":")[0]
            if source.startswith("./"):
                assert (ROOT / source).exists(), f"{name}: {source} missing"


def test_queue_topology_is_what_the_dashboard_filters_on() -> None:
    """The dashboard's queue panels select ``vmsched\\..*``; every service queue matches."""
    queues = [q for qs in service_queues().values() for q in qs]
    assert queues, "the services declare their queues"
    for q in queues:
        assert re.fullmatch(r"vmsched\..*", q)


# --- systemd units ------------------------------------------------------------------------------------
SYSTEMD = DEPLOY / "systemd"
SYSTEMD_ENV_EXAMPLE = DEPLOY / "vmsched.env.example"


def read_unit(path: Path) -> dict[str, list[tuple[str, str]]]:
    sections: dict[str, list[tuple[str, str]]] = {}
    current = None
    buf = ""
    for raw in path.read_text().splitlines():
        line = raw.strip()
        if not buf and (not line or line.startswith(("#", ";"))):
            continue
        if line.endswith("\\"):
            buf += line[:-1] + " "
            continue
        line, buf = buf + line, ""
        if line.startswith("[") and line.endswith("]"):
            current = line[1:-1]
            sections[current] = []
            continue
        key, _, value = line.partition("=")
        assert current, f"{path.name}: {line!r} outside a section"
        sections[current].append((key.strip(), value.strip()))
    return sections


def unit_values(unit: dict[str, list[tuple[str, str]]], section: str, key: str) -> list[str]:
    return [v for k, v in unit.get(section, []) if k == key]


def expand_exec(command: str, env: dict[str, str]) -> list[str]:
    """systemd's ExecStart expansion: ${VAR} is one word, $VAR splits on whitespace."""
    words = []
    for word in shlex.split(command):
        m = re.fullmatch(r"\$([A-Za-z_][A-Za-z0-9_]*)", word)
        if m:
            words += env.get(m.group(1), "").split()
        else:
            words.append(re.sub(r"\$\{([A-Za-z_][A-Za-z0-9_]*)\}", lambda mm: env[mm.group(1)], word))
    return words


UNITS = sorted(p.name for p in SYSTEMD.glob("*.service"))


def test_all_units_are_there() -> None:
    assert set(UNITS) == {f"vmsched-{n}.service" for n in (*VMSCHED_SERVICES, "agent")}
    target = read_unit(SYSTEMD / "vmsched.target")
    wanted = set(unit_values(target, "Unit", "Wants")[0].split())
    assert wanted == {f"vmsched-{n}.service" for n in VMSCHED_SERVICES}


@pytest.mark.parametrize("unit_name", UNITS)
def test_unit_exec_start_is_accepted_by_the_cli(unit_name: str) -> None:
    unit = read_unit(SYSTEMD / unit_name)
    service = unit["Service"]
    env: dict[str, str] = {}
    for value in unit_values(unit, "Service", "Environment"):
        key, _, val = value.partition("=")
        env[key] = val
    env_files = unit_values(unit, "Service", "EnvironmentFile")
    assert [f.lstrip("-") for f in env_files] == ["/etc/vmsched/vmsched.env"]
    env.update(read_env_file(SYSTEMD_ENV_EXAMPLE))
    (exec_start,) = unit_values(unit, "Service", "ExecStart")
    argv = expand_exec(exec_start, env)
    assert argv[0] == "/opt/vmsched/bin/vmsched"
    name = unit_name.removeprefix("vmsched-").removesuffix(".service")
    assert argv[1] == name
    parse_cli(argv[1:])
    # unit variables used on the command line have defaults in the unit itself
    for var in re.findall(r"\$\{?([A-Za-z_][A-Za-z0-9_]*)", exec_start):
        assert var in dict(kv.partition("=")[::2] for kv in unit_values(unit, "Service", "Environment")), var
    # hardening and restart policy
    keys = dict(service)
    assert keys.get("Restart") == "on-failure"
    assert keys.get("NoNewPrivileges") == "yes" and keys.get("ProtectSystem") == "strict"
    assert keys.get("DynamicUser") == "yes" or keys.get("User") not in (None, "root")
    assert "WantedBy" in dict(unit["Install"])


def test_agent_unit_keeps_state_and_socket_where_the_hook_looks() -> None:
    unit = dict(read_unit(SYSTEMD / "vmsched-agent.service")["Service"])
    argv = expand_exec(unit["ExecStart"], {"AGENT_OPTS": ""})
    assert option(argv, "--state-dir") == "/var/lib/vmsched/agent"
    assert "vmsched/agent" in unit["StateDirectory"].split()
    hook = (ROOT / "services" / "policy_agent" / "surfaces" / "hooks" / "qemu").read_text()
    default_socket = re.search(r'"socket":\s*"([^"]+)"', hook).group(1)
    assert option(argv, "--socket") == default_socket
    assert Path(default_socket).parent == Path("/run") / unit["RuntimeDirectory"]
    assert "libvirt" in unit["SupplementaryGroups"].split()


def test_systemd_env_example_names_real_settings() -> None:
    env = read_env_file(SYSTEMD_ENV_EXAMPLE)
    known = settings_env_names() | AGENT_ENV
    commented = set(re.findall(r"^#\s*(VMSCHED_[A-Z_]+)=", SYSTEMD_ENV_EXAMPLE.read_text(), re.M))
    unknown = sorted(k for k in set(env) | commented if k.startswith("VMSCHED_") and k not in known)
    assert not unknown, f"no vmsched setting reads {unknown}"
    assert env["VMSCHED_HOST"] == "0.0.0.0", "the engine must reach the gateway"
    Settings(**{k.removeprefix("VMSCHED_").lower(): v for k, v in env.items()
                if k.startswith("VMSCHED_") and k != "VMSCHED_PLUGINS"})


@pytest.mark.parametrize("unit_name", UNITS)
def test_each_unit_reads_its_own_broker_user_as_a_credential(unit_name: str) -> None:
    unit = read_unit(SYSTEMD / unit_name)
    name = unit_name.removeprefix("vmsched-").removesuffix(".service")
    env = dict(kv.partition("=")[::2] for kv in unit_values(unit, "Service", "Environment"))
    creds = dict(c.partition(":")[::2] for c in unit_values(unit, "Service", "LoadCredential"))
    assert set(creds) == ({"amqp-url", "console-secret"} if name == "gateway" else {"amqp-url"})
    assert creds["amqp-url"] == f"/etc/vmsched/amqp-{name}.url", "one URL file (one broker user) per component"
    var = "VMSCHED_AGENT_AMQP_URL_FILE" if name == "agent" else "VMSCHED_AMQP_URL_FILE"
    assert var in settings_env_names() | AGENT_ENV
    assert env[var] == f"/run/credentials/{unit_name}/amqp-url"
    assert env["VMSCHED_METRICS_HOST"] == "127.0.0.1", "an explicit, safe metrics bind"
    if name == "gateway":
        assert env["VMSCHED_TOKENS_FILE"].startswith("/etc/vmsched/tokens/")
        (group,) = unit_values(unit, "Service", "SupplementaryGroups")
        sysusers = (SYSTEMD / "vmsched.sysusers.conf").read_text()
        assert re.search(rf"^g {group}\b", sysusers, re.M), "the tokens group is created by sysusers"
        # the console secret: a root-only file made by `vmsched console-secret`, handed over as a credential
        assert creds["console-secret"] == "/etc/vmsched/console.secret"
        assert env["VMSCHED_CONSOLE_SECRET_FILE"] == f"/run/credentials/{unit_name}/console-secret"
        assert "VMSCHED_CONSOLE_SECRET_FILE" in settings_env_names()
    # no broker URL in the shared environment file
    shared = read_env_file(SYSTEMD_ENV_EXAMPLE)
    assert not {"VMSCHED_AMQP_URL", "VMSCHED_AGENT_AMQP"} & set(shared)
