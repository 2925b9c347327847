"""The host map and the engine link in every deployment form: the Helm chart, compose, systemd (offline).

The chart is rendered and linted by the real Helm engine and validated against the Kubernetes schemas
(helpers of tests/deploy/test_chart.py); what it mounts is read back by vmsched's own loaders.
"""

from __future__ import annotations

import base64
import json
from pathlib import Path
from typing import Any

import helm_python as helm
import jsonschema
import kubernetes_validate
import pytest
import yaml

from tests.support.deploy import settings_env_names
from tests.deploy.test_chart import (BASE, CHART, K8S_VERSIONS, by_name, chart, component, containers, merge,  # noqa: F401
                                     render, workloads)
from tests.deploy.test_compose import (COMPOSE, DEPLOY, SCHEMA, SYSTEMD, example_env, interpolate, read_unit)
from vmsched.config import Settings
from vmsched.engine_link.client import load_config
from vmsched.facts.host_map import load_host_map

LINK = {"facts": {"hostMap": {"0d3f2c10-engine-guid": "hv1.example.com"},
                  "engineLink": {"enabled": True, "url": "https://engine.example.com/ovirt-engine/api",
                                 "username": "vmsched@internal", "password": "pa ss: 'quoted' #1",
                                 "caConfigMap": "engine-ca"}}}
EXISTING = {"facts": {"existingHostMapConfigMap": "site-host-map",
                      "engineLink": {"enabled": True, "existingSecret": "site-engine-link"}}}
READERS = {"gateway", "scoring", "balancer"}


def _pod(docs: list[dict[str, Any]], comp: str) -> dict[str, Any]:
    return next(w for w in workloads(docs) if component(w) == comp)["spec"]["template"]["spec"]


def _mounted(pod: dict[str, Any], path: str) -> tuple[dict[str, Any], str]:
    """The volume a file path of the first container is on, and the key it is."""
    for mount in pod["containers"][0]["volumeMounts"]:
        if path.startswith(mount["mountPath"] + "/"):
            volume = next(v for v in pod["volumes"] if v["name"] == mount["name"])
            return volume, path[len(mount["mountPath"]) + 1:]
    raise AssertionError(f"{path} is on no volume")


def test_the_chart_mounts_the_host_map_and_the_link_where_the_readers_look(chart: helm.Chart, tmp_path: Path) -> None:
    docs = render(chart, LINK)
    secret = next(d for d in docs if d["kind"] == "Secret" and d["metadata"]["name"].endswith("engine-link"))
    config_map = next(d for d in docs if d["kind"] == "ConfigMap" and d["metadata"]["name"].endswith("host-map"))
    for wl in workloads(docs):
        env = {e["name"]: e.get("value") for e in containers(wl)[0]["env"]}
        if component(wl) not in READERS:
            assert "VMSCHED_ENGINE_LINK_FILE" not in env and "VMSCHED_FACTS_HOST_MAP" not in env, component(wl)
            continue
        assert {"VMSCHED_ENGINE_LINK_FILE", "VMSCHED_ENGINE_LINK_CA", "VMSCHED_FACTS_HOST_MAP"} <= set(env)
        assert {k for k in env if k.startswith("VMSCHED_")} <= settings_env_names()
        pod = _pod(docs, component(wl))
        volume, key = _mounted(pod, env["VMSCHED_ENGINE_LINK_FILE"])
        assert volume["secret"]["secretName"] == secret["metadata"]["name"] and volume["secret"]["defaultMode"] == 0o440
        link_file = tmp_path / f"{component(wl)}-link.yaml"
        link_file.write_bytes(base64.b64decode(secret["data"][key]))
        config = load_config(link_file)  # what the process reads
        assert (config.url, config.username, config.password) == ("https://engine.example.com/ovirt-engine/api",
                                                                  "vmsched@internal", "pa ss: 'quoted' #1")
        volume, key = _mounted(pod, env["VMSCHED_FACTS_HOST_MAP"])
        assert volume["configMap"]["name"] == config_map["metadata"]["name"]
        map_file = tmp_path / f"{component(wl)}-map"
        map_file.write_text(config_map["data"][key])
        assert load_host_map(map_file) == {"0d3f2c10-engine-guid": "hv1.example.com"}
        volume, key = _mounted(pod, env["VMSCHED_ENGINE_LINK_CA"])
        assert volume["configMap"]["name"] == "engine-ca" and key == "ca.pem"
        Settings(**{k[len("VMSCHED_"):].lower(): v for k, v in env.items()
                    if k.startswith(("VMSCHED_ENGINE_LINK_T", "VMSCHED_FACTS"))})  # types accepted


@pytest.mark.parametrize("values", [LINK, EXISTING], ids=["chart-made", "existing"])
@pytest.mark.parametrize("kube_version", K8S_VERSIONS)
def test_the_facts_objects_validate_and_lint(chart: helm.Chart, values: dict, kube_version: str) -> None:
    for doc in render(chart, values):
        kubernetes_validate.validate({k: v for k, v in doc.items() if k != "_template"}, kube_version, strict=True)
    report = helm.lint(CHART, merge(BASE, values), strict=True, kube_version=f"v{kube_version}")
    assert not report["errors"] and not [m for m in report["messages"] if m["severity"] >= 2], report


def test_existing_objects_are_used_and_none_is_made(chart: helm.Chart) -> None:
    docs = render(chart, EXISTING)
    assert not [d for d in docs if d["metadata"]["name"].endswith(("engine-link", "host-map"))]
    pod = _pod(docs, "scoring")
    names = {v["name"]: v for v in pod["volumes"]}
    assert names["engine-link"]["secret"]["secretName"] == "site-engine-link"
    assert names["host-map"]["configMap"]["name"] == "site-host-map"
    assert "engine-ca" not in names  # no CA given: the image's system CAs


def test_by_default_nothing_is_mounted(chart: helm.Chart) -> None:
    for wl in workloads(render(chart, {})):
        names = {v["name"] for v in wl["spec"]["template"]["spec"].get("volumes", [])}
        assert not names & {"engine-link", "engine-ca", "host-map"}, component(wl)


@pytest.mark.parametrize("missing", ["url", "password"])
def test_a_chart_made_link_needs_its_credentials(chart: helm.Chart, missing: str) -> None:
    values = merge(LINK, {"facts": {"engineLink": {missing: ""}}})
    with pytest.raises(Exception, match=f"facts.engineLink.{missing} is required"):
        render(chart, values)


def test_the_schema_refuses_a_plain_http_engine(chart: helm.Chart) -> None:
    with pytest.raises(Exception, match="url"):
        render(chart, merge(LINK, {"facts": {"engineLink": {"url": "http://engine/ovirt-engine/api"}}}))


def test_the_compose_override_hands_the_link_over_as_secrets() -> None:
    override = interpolate(yaml.safe_load((DEPLOY / "compose" / "engine-link.yaml").read_text()), example_env())
    base = interpolate(yaml.safe_load(COMPOSE.read_text()), example_env())
    merged = merge(base, {k: v for k, v in override.items() if not k.startswith("x-")})
    jsonschema.validate(merged, json.loads(SCHEMA.read_text()))
    for name in READERS:
        service = override["services"][name]
        assert set(service["secrets"]) == {"engine-link", "engine-ca"} and name in base["services"]
        assert service["environment"]["VMSCHED_ENGINE_LINK_FILE"] == "/run/secrets/engine-link"
        assert set(service["environment"]) <= settings_env_names()
    assert set(override["secrets"]) == {"engine-link", "engine-ca"}


def test_the_systemd_drop_in_hands_the_link_over_as_a_credential() -> None:
    unit = read_unit(SYSTEMD / "engine-link.conf")
    service = dict(unit["Service"])
    assert service["LoadCredential"] == "engine-link:/etc/vmsched/engine-link.yaml"
    env = dict(item.split("=", 1) for key, item in unit["Service"] if key == "Environment")
    assert env["VMSCHED_ENGINE_LINK_FILE"] == "%d/engine-link" and set(env) <= settings_env_names()
