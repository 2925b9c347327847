"""The Helm chart charts/vmsched, rendered and linted by the real Helm engine.

helm-python-sdk embeds Helm's Go SDK (no helm binary): ``Chart.render`` is
``helm template`` and ``lint`` is ``helm lint``. Every option combination is
rendered, linted (strict) and validated against the Kubernetes OpenAPI schemas
shipped by kubernetes-validate, for the oldest Kubernetes the chart supports
(``kubeVersion`` in Chart.yaml) and the newest one the package knows.

The CRDs the chart can render are not in those schemas: KEDA ``ScaledObject``
and ``TriggerAuthentication`` and the Prometheus Operator ``ServiceMonitor``
get structural checks of their own below (the fields their controllers read).
"""

from __future__ import annotations

import base64
import copy
import hashlib
import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import helm_python as helm
import kubernetes_validate
import pytest
import yaml
from kubernetes_validate import utils as kv_utils

from tests.support.deploy import AGENT_ENV, parse_cli, settings_env_names
from tests.support.paths import ROOT
from vmsched.cli import settings_from
from vmsched.cli.runner import service_queues
from vmsched.config import parse_factors

CHART = ROOT / "charts" / "vmsched"
RELEASE, NAMESPACE = "sched", "ovirt"
SECRET_KEY = "amqp-url"
#: The Secret of each component's own broker user (the test's names, not the defaults).
SECRETS = {c: f"broker-{c}" for c in ("gateway", "discovery", "scoring", "balancer", "agent")}

OLDEST_K8S = "1.25.0"  # Chart.yaml kubeVersion ">=1.25.0-0"
K8S_VERSIONS = (OLDEST_K8S, kv_utils.latest_version())
CRD_KINDS = {
    ("keda.sh/v1alpha1", "ScaledObject"),
    ("keda.sh/v1alpha1", "TriggerAuthentication"),
    ("monitoring.coreos.com/v1", "ServiceMonitor"),
    ("monitoring.coreos.com/v1", "PrometheusRule"),
    ("monitoring.coreos.com/v1", "PodMonitor"),
}
WORKERS = ("discovery", "scoring", "balancer")

BASE = {"amqp": {"secrets": SECRETS, "secretKey": SECRET_KEY}}
COMBOS: dict[str, dict[str, Any]] = {
    "default": {},
    "keda": {"autoscaling": {"keda": {"enabled": True}}},
    "hpa": {"autoscaling": {"hpa": {"enabled": True}}},
    "servicemonitor": {"serviceMonitor": {"enabled": True, "labels": {"release": "kube-prometheus-stack"}}},
    "agent": {"agent": {"enabled": True, "supplementalGroups": [107], "dedicatedPool": "4-7"}},
    "shadow": {"shadow": {"enabled": True, "files": {"my_score.py": "class MyScore:\n    def do_score(self, *a):\n"
                                                                    "        return []\n"},
                          "rate": 0.25, "factors": {"vmsched_MemoryEvenDistribution": 5, "MyScore": -2},
                          "drop": ["vmsched_CpuPinning", "MyFilter"], "queue": 64, "workers": 2}},
    "everything": {
        "autoscaling": {"keda": {"enabled": True}},
        "serviceMonitor": {"enabled": True},
        "prometheusRule": {"enabled": True},
        "brokerMonitor": {"enabled": True, "namespace": "rabbitmq", "labels": {"release": "kube-prometheus-stack"}},
        "agent": {"enabled": True, "hostIdFrom": "libvirt", "initChown": False},
        "grafanaDashboard": {"enabled": True},
        "plugins": {"files": {"my_filter.py": "class MyFilter:\n    def do_filter(self, *a):\n        pass\n"}},
        "shadow": {"enabled": True, "existingVolume": {"persistentVolumeClaim": {"claimName": "candidate"}}},
        "gateway": {
            "service": {"type": "LoadBalancer", "nodePort": 31878},
            "topologySpreadConstraints": [
                {"maxSkew": 1, "topologyKey": "kubernetes.io/hostname", "whenUnsatisfiable": "ScheduleAnyway"}
            ],
        },
        "imagePullSecrets": [{"name": "regcred"}],
    },
    "locked-down": {
        "agent": {"enabled": True},
        "gateway": {"engineAllow": ["192.0.2.10/32", "2001:db8::/64"], "auth": {"existingSecret": "site-tokens"}},
        "networkPolicy": {
            "gateway": {"allowedCIDRs": ["192.0.2.10/32"],
                        "from": [{"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "ops"}}}]},
            "metrics": {"from": [{"namespaceSelector": {"matchLabels": {"team": "observability"}},
                                  "podSelector": {"matchLabels": {"app.kubernetes.io/name": "prometheus"}}}]},
            "egress": {"enabled": True, "extraTo": [{"ipBlock": {"cidr": "198.51.100.7/32"}}]},
            "broker": {"enabled": True, "namespace": "rabbitmq",
                       "extraFrom": [{"ipBlock": {"cidr": "198.51.100.0/24"}}],
                       "extraIngress": [{"ports": [{"port": 15692}],
                                         "from": [{"namespaceSelector": {"matchLabels": {"team": "observability"}}}]}]},
        },
    },
}


def merge(*layers: dict[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for layer in layers:
        for key, value in layer.items():
            if isinstance(value, dict) and isinstance(out.get(key), dict):
                out[key] = merge(out[key], value)
            else:
                out[key] = copy.deepcopy(value)
    return out


@pytest.fixture(scope="module")
def chart() -> Iterator[helm.Chart]:
    with helm.Chart.load(CHART) as loaded:
        yield loaded


def render_raw(chart: helm.Chart, values: dict[str, Any], release: str = RELEASE) -> dict[str, str]:
    return chart.render(merge(BASE, values), name=release, namespace=NAMESPACE, is_install=True)


def render(chart: helm.Chart, values: dict[str, Any], release: str = RELEASE) -> list[dict[str, Any]]:
    docs = []
    for path, text in render_raw(chart, values, release).items():
        if not path.endswith(".yaml"):
            continue
        for doc in yaml.safe_load_all(text):
            if doc:
                doc.setdefault("_template", path)  # for messages; stripped before validation
                docs.append(doc)
    return docs


def objects(docs: list[dict[str, Any]], kind: str) -> list[dict[str, Any]]:
    return [d for d in docs if d["kind"] == kind]


def by_name(docs: list[dict[str, Any]], kind: str) -> dict[str, dict[str, Any]]:
    return {d["metadata"]["name"]: d for d in objects(docs, kind)}


def workloads(docs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [d for d in docs if d["kind"] in ("Deployment", "DaemonSet")]


def component(doc: dict[str, Any]) -> str:
    return doc["metadata"]["labels"]["app.kubernetes.io/component"]


def containers(workload: dict[str, Any], init: bool = False) -> list[dict[str, Any]]:
    spec = workload["spec"]["template"]["spec"]
    return list(spec.get("initContainers", []) if init else spec["containers"])


@pytest.fixture(scope="module", params=sorted(COMBOS))
def combo(request: pytest.FixtureRequest, chart: helm.Chart) -> tuple[str, list[dict[str, Any]]]:
    return request.param, render(chart, COMBOS[request.param])


# --- Helm's own checks -----------------------------------------------------------
@pytest.mark.parametrize("name", sorted(COMBOS))
@pytest.mark.parametrize("kube_version", K8S_VERSIONS)
def test_lint_is_clean(name: str, kube_version: str) -> None:
    report = helm.lint(CHART, merge(BASE, COMBOS[name]), strict=True, kube_version=f"v{kube_version}")
    assert report["total_charts_linted"] == 1
    assert not report["errors"], report
    # severities: 1 info, 2 warning, 3 error. The one info left is "icon is recommended".
    serious = [m for m in report["messages"] if m["severity"] >= 2]
    assert not serious, serious


def test_chart_metadata_follows_best_practices(chart: helm.Chart) -> None:
    meta = chart.metadata
    assert meta["apiVersion"] == "v2"
    assert meta["name"] == "vmsched" == CHART.name
    assert re.fullmatch(r"\d+\.\d+\.\d+", meta["version"])
    assert meta["appVersion"] == __import__("vmsched").__version__, "appVersion must be the vmsched version"
    assert meta["kubeVersion"].startswith(">=1.25")
    for required in ("values.yaml", "values.schema.json", "templates/_helpers.tpl", "templates/NOTES.txt", ".helmignore"):
        assert (CHART / required).is_file(), required


# --- Kubernetes schemas ----------------------------------------------------------
@pytest.mark.parametrize("kube_version", K8S_VERSIONS)
def test_manifests_validate_against_kubernetes_schemas(combo: tuple[str, list[dict[str, Any]]], kube_version: str) -> None:
    name, docs = combo
    assert docs, name
    for doc in docs:
        doc = {k: v for k, v in doc.items() if k != "_template"}
        if (doc["apiVersion"], doc["kind"]) in CRD_KINDS:
            continue  # checked structurally below
        try:
            kubernetes_validate.validate(doc, kube_version, strict=True)
        except kubernetes_validate.ValidationError as exc:
            path = ".".join(str(p) for p in exc.path)
            pytest.fail(f"[{name}] {doc['kind']}/{doc['metadata']['name']} invalid for {kube_version}: {path}: {exc.message}")
        except kv_utils.SchemaNotFoundError as exc:
            pytest.fail(f"[{name}] no schema for {exc.kind} {exc.api_version}: not a built-in kind, not a known CRD")


def test_names_are_dns_labels_even_for_long_release_names(chart: helm.Chart) -> None:
    release = "a-very-long-release-name-for-vmsched-in-production-x"  # 52 chars, Helm's release-name limit is 53
    docs = render(chart, merge(COMBOS["everything"], {"autoscaling": {"keda": {"enabled": False}}}), release=release)
    names = [d["metadata"]["name"] for d in docs]
    assert len(names) == len(set((d["kind"], d["metadata"]["name"]) for d in docs)), "duplicate object names"
    for n in names:
        assert len(n) <= 63 and re.fullmatch(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?", n), n


# --- labels ------------------------------------------------------------------------
RECOMMENDED = ("app.kubernetes.io/name", "app.kubernetes.io/instance", "app.kubernetes.io/version",
               "app.kubernetes.io/managed-by", "app.kubernetes.io/part-of", "helm.sh/chart")


def test_recommended_labels_everywhere(combo: tuple[str, list[dict[str, Any]]]) -> None:
    name, docs = combo
    for doc in docs:
        labels = doc["metadata"].get("labels", {})
        missing = [label for label in RECOMMENDED if label not in labels]
        assert not missing, f"[{name}] {doc['kind']}/{doc['metadata']['name']} lacks {missing}"
        assert labels["app.kubernetes.io/name"] == "vmsched"
        assert labels["app.kubernetes.io/instance"] == RELEASE
        assert labels["app.kubernetes.io/managed-by"] == "Helm"
        assert labels["app.kubernetes.io/version"] == __import__("vmsched").__version__


def test_selectors_are_stable_and_match_pod_labels(combo: tuple[str, list[dict[str, Any]]]) -> None:
    name, docs = combo
    for wl in workloads(docs):
        selector = wl["spec"]["selector"]["matchLabels"]
        pod_labels = wl["spec"]["template"]["metadata"]["labels"]
        assert selector.items() <= pod_labels.items(), wl["metadata"]["name"]
        # selectors are immutable: nothing that changes on upgrade may be in them
        assert set(selector) == {"app.kubernetes.io/name", "app.kubernetes.io/instance", "app.kubernetes.io/component"}
        for label in RECOMMENDED:
            assert label in pod_labels, (name, wl["metadata"]["name"], label)
    # every Service selects exactly one component's pods, and they exist
    for svc in objects(docs, "Service"):
        matched = [wl for wl in workloads(docs)
                   if svc["spec"]["selector"].items() <= wl["spec"]["template"]["metadata"]["labels"].items()]
        assert len(matched) == 1, (name, svc["metadata"]["name"], [m["metadata"]["name"] for m in matched])


def test_every_component_is_deployed(chart: helm.Chart) -> None:
    docs = render(chart, {})
    deployments = {component(d): d for d in objects(docs, "Deployment")}
    assert set(deployments) == {"gateway", *WORKERS}
    assert not objects(docs, "DaemonSet"), "the agent is off by default"
    assert not [d for d in docs if (d["apiVersion"], d["kind"]) in CRD_KINDS], "CRD objects are opt-in"
    assert not objects(docs, "HorizontalPodAutoscaler"), "autoscaling is opt-in"
    # the only Secrets the chart makes: the gateway's tokens file, its first token and the console's session
    # secret (no broker password)
    assert {s["metadata"]["name"] for s in objects(docs, "Secret")} == {
        f"{RELEASE}-vmsched-gateway-tokens", f"{RELEASE}-vmsched-gateway-admin-token",
        f"{RELEASE}-vmsched-gateway-console"}
    gateway_svc = [s for s in objects(docs, "Service") if component(s) == "gateway" and not s["spec"].get("clusterIP")]
    assert len(gateway_svc) == 1, "the API Service (the other one is the headless metrics Service)"
    assert gateway_svc[0]["spec"]["ports"][0]["port"] == 18781
    assert deployments["scoring"]["spec"]["replicas"] == 3


# --- probes, security, resources -------------------------------------------------------
def test_probes_hit_healthz_and_readyz_on_a_declared_port(combo: tuple[str, list[dict[str, Any]]]) -> None:
    name, docs = combo
    for wl in workloads(docs):
        for c in containers(wl):
            ports = {p["name"]: p["containerPort"] for p in c["ports"]}
            live, ready = c.get("livenessProbe"), c.get("readinessProbe")
            assert live and ready, f"[{name}] {wl['metadata']['name']}/{c['name']}: probes missing"
            assert live["httpGet"]["path"] == "/healthz"
            assert ready["httpGet"]["path"] == "/readyz"
            for probe in (live, ready, c.get("startupProbe")):
                if probe:
                    assert probe["httpGet"]["port"] in ports, (name, c["name"], probe)


def test_gateway_probes_use_the_gateway_port(chart: helm.Chart) -> None:
    docs = render(chart, {"gateway": {"port": 18999}})
    gw = next(d for d in objects(docs, "Deployment") if component(d) == "gateway")
    c = containers(gw)[0]
    assert {p["name"]: p["containerPort"] for p in c["ports"]} == {"http": 18999, "metrics": 9100}
    assert "--port=18999" in c["args"]
    svc = by_name(docs, "Service")[f"{RELEASE}-vmsched-gateway"]
    assert svc["spec"]["ports"] == [{"name": "http", "port": 18781, "targetPort": "http", "protocol": "TCP"}]
    assert by_name(docs, "Service")[f"{RELEASE}-vmsched-gateway-metrics"]["spec"]["ports"][0]["targetPort"] == "metrics"


def test_security_contexts_non_root_read_only(combo: tuple[str, list[dict[str, Any]]]) -> None:
    name, docs = combo
    for wl in workloads(docs) + objects(docs, "Pod"):
        pod = wl["spec"]["template"]["spec"] if wl["kind"] != "Pod" else wl["spec"]
        where = f"[{name}] {wl['kind']}/{wl['metadata']['name']}"
        assert pod["securityContext"]["runAsNonRoot"] is True, where
        assert pod["securityContext"]["runAsUser"] != 0, where
        assert pod["securityContext"]["seccompProfile"]["type"] == "RuntimeDefault", where
        assert pod["automountServiceAccountToken"] is False, where
        assert "hostNetwork" not in pod and "hostPID" not in pod, where
        for c in pod["containers"]:
            sc = c["securityContext"]
            assert sc["runAsNonRoot"] is True, (where, c["name"])
            assert sc["readOnlyRootFilesystem"] is True, (where, c["name"])
            assert sc["allowPrivilegeEscalation"] is False, (where, c["name"])
            assert sc["capabilities"]["drop"] == ["ALL"] and "add" not in sc["capabilities"], (where, c["name"])
            assert not sc.get("privileged"), (where, c["name"])
            # a read-only root needs a writable /tmp
            assert any(m["mountPath"] == "/tmp" for m in c["volumeMounts"]), (where, c["name"])
        for c in pod.get("initContainers", []):
            # the one exception: the agent's chown of its hostPath directories, CHOWN only
            assert c["name"] == "prepare-host-dirs", (where, c["name"])
            assert c["command"][0] == "chown"
            sc = c["securityContext"]
            assert sc["capabilities"] == {"drop": ["ALL"], "add": ["CHOWN"]}
            assert sc["allowPrivilegeEscalation"] is False and sc["readOnlyRootFilesystem"] is True


def test_agent_init_container_is_optional(chart: helm.Chart) -> None:
    docs = render(chart, {"agent": {"enabled": True, "initChown": False}})
    ds = objects(docs, "DaemonSet")[0]
    assert not containers(ds, init=True)


def test_every_container_has_requests_and_a_memory_limit(combo: tuple[str, list[dict[str, Any]]]) -> None:
    name, docs = combo
    for wl in workloads(docs):
        for c in containers(wl):
            res = c["resources"]
            assert {"cpu", "memory"} <= set(res["requests"]), (name, c["name"])
            assert "memory" in res["limits"], (name, c["name"])


def test_pod_disruption_budgets_cover_every_deployment(combo: tuple[str, list[dict[str, Any]]]) -> None:
    name, docs = combo
    pdbs = objects(docs, "PodDisruptionBudget")
    for dep in objects(docs, "Deployment"):
        labels = dep["spec"]["template"]["metadata"]["labels"]
        covering = [p for p in pdbs if p["spec"]["selector"]["matchLabels"].items() <= labels.items()]
        assert len(covering) == 1, (name, dep["metadata"]["name"])
        assert covering[0]["spec"]["maxUnavailable"] == 1


def test_pod_disruption_budget_can_be_disabled(chart: helm.Chart) -> None:
    docs = render(chart, {"scoring": {"podDisruptionBudget": {"enabled": False}}})
    assert {component(p) for p in objects(docs, "PodDisruptionBudget")} == {"gateway", "discovery", "balancer"}


# --- configuration of the processes ---------------------------------------------------
def test_container_args_are_accepted_by_the_cli(combo: tuple[str, list[dict[str, Any]]]) -> None:
    name, docs = combo
    for wl in workloads(docs):
        for c in containers(wl):
            assert c["args"][0] == component(wl), (name, c["args"])
            parse_cli(c["args"])


def test_container_env_is_read_by_vmsched(combo: tuple[str, list[dict[str, Any]]]) -> None:
    name, docs = combo
    known = settings_env_names() | AGENT_ENV
    for wl in workloads(docs):
        for c in containers(wl):
            for env in c["env"]:
                if env["name"].startswith("VMSCHED_"):
                    assert env["name"] in known, f"[{name}] {c['name']}: {env['name']} is read by nothing"


def test_each_component_reads_its_own_broker_user_from_a_file(combo: tuple[str, list[dict[str, Any]]]) -> None:
    name, docs = combo
    seen = {}
    for wl in workloads(docs):
        comp = component(wl)
        pod = wl["spec"]["template"]["spec"]
        (c,) = containers(wl)
        env = {e["name"]: e for e in c["env"]}
        # the agent's command line reads its own variable (services/policy_agent/surfaces/cli.py)
        var = "VMSCHED_AGENT_AMQP_URL_FILE" if comp == "agent" else "VMSCHED_AMQP_URL_FILE"
        assert var in AGENT_ENV | settings_env_names()
        path = Path(env[var]["value"])
        (mount,) = [m for m in c["volumeMounts"] if m["mountPath"] == str(path.parent)]
        assert mount.get("readOnly") is True and "subPath" not in mount
        (volume,) = [v for v in pod["volumes"] if v["name"] == mount["name"]]
        assert volume["secret"]["secretName"] == SECRETS[comp], (name, comp)
        assert volume["secret"]["items"] == [{"key": SECRET_KEY, "path": path.name}]
        assert volume["secret"]["defaultMode"] & 0o007 == 0, "not world-readable"
        # nothing in the environment or on the command line
        assert not {"VMSCHED_AMQP_URL", "VMSCHED_AGENT_AMQP"} & set(env), (name, comp)
        assert not any("secretKeyRef" in e.get("valueFrom", {}) for e in env.values()), (name, comp)
        assert not any("amqp" in a for a in c["args"]), "credentials must not be in the pod spec or argv"
        seen[comp] = volume["secret"]["secretName"]
    assert len(set(seen.values())) == len(seen), f"components share a broker user: {seen}"


@pytest.mark.parametrize("comp", ["gateway", "discovery", "scoring", "balancer"])
def test_missing_secret_name_fails_the_render(chart: helm.Chart, comp: str) -> None:
    with pytest.raises(helm.HelmError, match=rf"amqp[/.]secrets\W+{comp}|'{comp}'"):
        chart.render(merge(BASE, {"amqp": {"secrets": {comp: None}}}), name=RELEASE, namespace=NAMESPACE,
                     is_install=True)


def test_worker_tuning_reaches_the_command_line(chart: helm.Chart) -> None:
    docs = render(chart, {"scoring": {"consumers": 7, "poolSize": 5}, "metricsPort": 9200})
    scoring = next(d for d in objects(docs, "Deployment") if component(d) == "scoring")
    c = containers(scoring)[0]
    assert {"--consumers=7", "--pool-size=5", "--metrics-port=9200"} <= set(c["args"])
    assert c["ports"] == [{"name": "metrics", "containerPort": 9200, "protocol": "TCP"}]


# --- plugins ------------------------------------------------------------------------------
def _plugin_setup(docs: list[dict[str, Any]], comp: str) -> tuple[dict | None, dict | None, str | None]:
    dep = next(d for d in objects(docs, "Deployment") if component(d) == comp)
    pod = dep["spec"]["template"]["spec"]
    volume = next((v for v in pod["volumes"] if v["name"] == "plugins"), None)
    c = pod["containers"][0]
    mount = next((m for m in c["volumeMounts"] if m["name"] == "plugins"), None)
    env = next((e["value"] for e in c["env"] if e["name"] == "VMSCHED_PLUGINS"), None)
    return volume, mount, env


def test_plugins_from_inline_files(chart: helm.Chart) -> None:
    source = "class A:\n    def do_score(self, *a):\n        return []\n"
    docs = render(chart, {"plugins": {"files": {"a.py": source}}})
    cm = objects(docs, "ConfigMap")
    assert len(cm) == 1 and cm[0]["data"] == {"a.py": source}
    for comp in WORKERS:
        volume, mount, env = _plugin_setup(docs, comp)
        assert volume == {"name": "plugins", "configMap": {"name": cm[0]["metadata"]["name"]}}
        assert mount == {"name": "plugins", "mountPath": "/etc/vmsched/plugins", "readOnly": True}
        assert env == "/etc/vmsched/plugins"


def test_plugins_from_existing_configmap_or_volume(chart: helm.Chart) -> None:
    docs = render(chart, {"plugins": {"existingConfigMap": "site-plugins", "files": {"ignored.py": "x = 1\n"}}})
    assert not objects(docs, "ConfigMap")
    for comp in WORKERS:
        assert _plugin_setup(docs, comp)[0] == {"name": "plugins", "configMap": {"name": "site-plugins"}}

    pvc = {"persistentVolumeClaim": {"claimName": "plugins", "readOnly": True}}
    docs = render(chart, {"plugins": {"existingVolume": pvc, "mountPath": "/plugins"}})
    for comp in WORKERS:
        volume, mount, env = _plugin_setup(docs, comp)
        assert volume == {"name": "plugins", **pvc}
        assert mount["mountPath"] == env == "/plugins"


def test_stock_plugins_by_default(chart: helm.Chart) -> None:
    docs = render(chart, {})
    for comp in WORKERS:
        assert _plugin_setup(docs, comp) == (None, None, None)


# --- a shadow candidate ------------------------------------------------------------------------------
def _shadow_setup(docs: list[dict[str, Any]], comp: str) -> tuple[dict | None, dict | None, list[str]]:
    dep = next(d for d in workloads(docs) if component(d) == comp)
    pod = dep["spec"]["template"]["spec"]
    volume = next((v for v in pod["volumes"] if v["name"] == "candidate"), None)
    (c,) = pod["containers"]
    mount = next((m for m in c["volumeMounts"] if m["name"] == "candidate"), None)
    return volume, mount, [a for a in c["args"] if a.startswith("--shadow")]


@pytest.mark.parametrize("values", [{}, {"shadow": {"files": {"a.py": "x = 1\n"}, "existingConfigMap": "cand"}}],
                         ids=["default", "sources-but-disabled"])
def test_no_shadow_unless_enabled(chart: helm.Chart, values: dict[str, Any]) -> None:
    docs = render(chart, merge(values, COMBOS["agent"]))
    assert not objects(docs, "ConfigMap")
    for wl in workloads(docs):
        assert _shadow_setup(docs, component(wl)) == (None, None, []), component(wl)
        assert not any(e["name"].startswith("VMSCHED_SHADOW") for e in containers(wl)[0]["env"])
        assert not any("candidate" in str(m) for m in containers(wl)[0]["volumeMounts"])


def test_shadow_candidate_from_inline_files(chart: helm.Chart) -> None:
    values = COMBOS["shadow"]
    docs = render(chart, merge(values, COMBOS["agent"]))
    (cm,) = objects(docs, "ConfigMap")
    assert cm["metadata"]["name"] == f"{RELEASE}-vmsched-candidate"
    assert cm["data"] == values["shadow"]["files"]
    for wl in workloads(docs):
        comp = component(wl)
        volume, mount, args = _shadow_setup(docs, comp)
        if comp not in ("scoring", "balancer"):  # the gateway, discovery and the agent run no live units
            assert (volume, mount, args) == (None, None, []), comp
            continue
        assert volume == {"name": "candidate", "configMap": {"name": cm["metadata"]["name"]}}
        assert mount == {"name": "candidate", "mountPath": "/etc/vmsched/candidate", "readOnly": True}
        # what the service makes of its command line: the settings the shadow runs with
        settings = settings_from(parse_cli(containers(wl)[0]["args"]))
        assert settings.shadow == Path("/etc/vmsched/candidate")
        assert settings.shadow_rate == 0.25
        assert parse_factors(settings.shadow_factors) == {"vmsched_MemoryEvenDistribution": 5, "MyScore": -2}
        assert settings.shadow_drop.split(",") == ["vmsched_CpuPinning", "MyFilter"]
        assert (settings.shadow_queue, settings.shadow_workers) == (64, 2)
        # the live plugins folder stays what it was
        assert _plugin_setup(docs, comp) == (None, None, None)


def test_shadow_defaults_reach_the_command_line(chart: helm.Chart) -> None:
    docs = render(chart, {"shadow": {"enabled": True, "existingConfigMap": "cand", "mountPath": "/cand"}})
    for comp in ("scoring", "balancer"):
        args = _shadow_setup(docs, comp)[2]
        assert args == ["--shadow=/cand", "--shadow-rate=1", "--shadow-queue=16", "--shadow-workers=1"], comp


def test_shadow_candidate_from_existing_configmap_or_volume(chart: helm.Chart) -> None:
    files = {"ignored.py": "x = 1\n"}
    docs = render(chart, {"shadow": {"enabled": True, "existingConfigMap": "site-candidate", "files": files}})
    assert not objects(docs, "ConfigMap")
    for comp in ("scoring", "balancer"):
        assert _shadow_setup(docs, comp)[0] == {"name": "candidate", "configMap": {"name": "site-candidate"}}

    pvc = {"persistentVolumeClaim": {"claimName": "candidate", "readOnly": True}}
    docs = render(chart, {"shadow": {"enabled": True, "existingVolume": pvc, "existingConfigMap": "site-candidate",
                                     "files": files}})
    assert not objects(docs, "ConfigMap")
    for comp in ("scoring", "balancer"):
        volume, mount, args = _shadow_setup(docs, comp)
        assert volume == {"name": "candidate", **pvc}
        assert mount["readOnly"] is True and f"--shadow={mount['mountPath']}" in args


def test_shadow_without_a_candidate_fails_the_render(chart: helm.Chart) -> None:
    with pytest.raises(helm.HelmRenderError, match=r"shadow\.enabled needs the candidate's plugins folder: set "
                                                   r"shadow\.files, shadow\.existingConfigMap or shadow\.existingVolume"):
        render(chart, {"shadow": {"enabled": True}})


# --- autoscaling ------------------------------------------------------------------------------
def test_keda_scaled_objects_watch_the_queues_the_services_consume(chart: helm.Chart) -> None:
    docs = render(chart, COMBOS["keda"])
    deployments = by_name(docs, "Deployment")
    auths = by_name(docs, "TriggerAuthentication")
    scaled = objects(docs, "ScaledObject")
    assert {component(s) for s in scaled} == {"scoring", "balancer"}
    assert not objects(docs, "HorizontalPodAutoscaler"), "KEDA owns the HPA"
    for so in scaled:
        assert so["apiVersion"] == "keda.sh/v1alpha1"
        spec = so["spec"]
        target = spec["scaleTargetRef"]
        assert target.get("kind", "Deployment") == "Deployment"
        dep = deployments[target["name"]]
        comp = component(dep)
        assert comp == component(so)
        assert "replicas" not in dep["spec"], f"{comp}: replicas would fight the autoscaler"
        assert 1 <= spec["minReplicaCount"] <= spec["maxReplicaCount"]
        assert spec["pollingInterval"] > 0 and spec["cooldownPeriod"] >= 0
        queues = []
        for trigger in spec["triggers"]:
            assert trigger["type"] == "rabbitmq"
            meta = trigger["metadata"]
            assert meta["mode"] == "QueueLength"
            assert meta["protocol"] in ("amqp", "http", "auto")
            assert isinstance(meta["value"], str) and int(meta["value"]) > 0, "KEDA metadata values are strings"
            assert "host" not in meta, "the broker URL comes from the TriggerAuthentication, not the manifest"
            assert trigger["authenticationRef"]["name"] in auths
            queues.append(meta["queueName"])
        # the queues the real services consume (their QUEUES)
        assert sorted(queues) == sorted(service_queues()[comp]), comp
    (auth,) = auths.values()
    # KEDA reads queue lengths as the gateway's user unless given a Secret of its own
    assert auth["spec"]["secretTargetRef"] == [{"parameter": "host", "name": SECRETS["gateway"], "key": SECRET_KEY}]
    docs = render(chart, merge(COMBOS["keda"], {"autoscaling": {"keda": {"existingSecret": "keda-monitor"}}}))
    (auth,) = objects(docs, "TriggerAuthentication")
    assert auth["spec"]["secretTargetRef"][0]["name"] == "keda-monitor"


def test_chart_queue_table_matches_the_bus_topology() -> None:
    helpers = (CHART / "templates" / "_helpers.tpl").read_text()
    block = re.search(r'define "vmsched.queues" -}}\n(.*?)\n{{- end', helpers, re.S).group(1)
    assert {k: tuple(v) for k, v in yaml.safe_load(block).items()} == {k: tuple(v) for k, v in service_queues().items()}


def test_hpa_scales_scoring_and_balancer_on_cpu(chart: helm.Chart) -> None:
    docs = render(chart, COMBOS["hpa"])
    deployments = by_name(docs, "Deployment")
    hpas = objects(docs, "HorizontalPodAutoscaler")
    assert {component(h) for h in hpas} == {"scoring", "balancer"}
    assert not objects(docs, "ScaledObject")
    for hpa in hpas:
        spec = hpa["spec"]
        dep = deployments[spec["scaleTargetRef"]["name"]]
        assert spec["scaleTargetRef"]["kind"] == "Deployment"
        assert "replicas" not in dep["spec"]
        assert spec["minReplicas"] <= spec["maxReplicas"]
        (metric,) = spec["metrics"]
        assert metric["resource"]["name"] == "cpu"
        assert metric["resource"]["target"] == {"type": "Utilization", "averageUtilization": 70}
        # utilisation is relative to the CPU request, which must exist
        assert containers(dep)[0]["resources"]["requests"]["cpu"]
    # not autoscaled: fixed replicas
    assert next(d for d in deployments.values() if component(d) == "discovery")["spec"]["replicas"] == 2


def test_keda_and_hpa_are_exclusive(chart: helm.Chart) -> None:
    with pytest.raises(helm.HelmRenderError, match="exclusive"):
        render(chart, {"autoscaling": {"keda": {"enabled": True}, "hpa": {"enabled": True}}})


# --- monitoring -----------------------------------------------------------------------------------
def test_service_monitor_scrapes_every_component(chart: helm.Chart) -> None:
    docs = render(chart, merge(COMBOS["servicemonitor"], COMBOS["agent"]))
    (sm,) = objects(docs, "ServiceMonitor")
    assert sm["apiVersion"] == "monitoring.coreos.com/v1"
    assert sm["metadata"]["labels"]["release"] == "kube-prometheus-stack"
    assert sm["spec"]["namespaceSelector"] == {"matchNames": [NAMESPACE]}
    endpoints = {e["port"]: e for e in sm["spec"]["endpoints"]}
    for e in endpoints.values():
        assert e["path"] == "/metrics"
        assert e["honorLabels"] is True, "vmsched's own `service` label must survive the operator's target labels"
        assert re.fullmatch(r"\d+(s|m)", e["interval"]) and re.fullmatch(r"\d+(s|m)", e["scrapeTimeout"])
    selected = [s for s in objects(docs, "Service") if sm["spec"]["selector"]["matchLabels"].items() <= s["metadata"]["labels"].items()]
    scraped = set()
    for svc in selected:
        ports = {p["name"] for p in svc["spec"]["ports"]} & set(endpoints)
        assert ports, f"{svc['metadata']['name']} is selected but no endpoint matches its ports"
        scraped.add(component(svc))
    assert scraped == {"gateway", *WORKERS, "agent"}
    # each metrics Service points at the port the process really serves /metrics on
    for wl in workloads(docs):
        port_names = {p["name"] for c in containers(wl) for p in c["ports"]}
        assert port_names & set(endpoints), wl["metadata"]["name"]


def test_grafana_dashboard_configmap_ships_the_dashboard(chart: helm.Chart) -> None:
    docs = render(chart, {"grafanaDashboard": {"enabled": True}})
    (cm,) = objects(docs, "ConfigMap")
    assert cm["metadata"]["labels"]["grafana_dashboard"] == "1"
    shipped = json.loads(cm["data"]["vmsched.json"])
    assert shipped == json.loads((CHART / "dashboards" / "vmsched.json").read_text())


# --- agent ------------------------------------------------------------------------------------------
def test_agent_daemonset_reaches_libvirt_and_takes_its_host_id_from_the_node(chart: helm.Chart) -> None:
    docs = render(chart, COMBOS["agent"])
    (ds,) = objects(docs, "DaemonSet")
    pod = ds["spec"]["template"]["spec"]
    assert pod["nodeSelector"] == {"vmsched.io/hypervisor": "true"}
    assert pod["securityContext"]["supplementalGroups"] == [107]
    volumes = {v["name"]: v for v in pod["volumes"]}
    assert volumes["libvirt"]["hostPath"] == {"path": "/var/run/libvirt", "type": "Directory"}
    assert volumes["state"]["hostPath"]["type"] == "DirectoryOrCreate"
    (agent,) = pod["containers"]
    mounts = {m["name"]: m for m in agent["volumeMounts"]}
    assert mounts["libvirt"] == {"name": "libvirt", "mountPath": "/var/run/libvirt", "readOnly": True}
    env = {e["name"]: e for e in agent["env"]}
    assert env["VMSCHED_AGENT_HOST_ID"]["valueFrom"] == {"fieldRef": {"fieldPath": "spec.nodeName"}}
    args = agent["args"]
    assert args[0] == "agent"
    assert "--libvirt=qemu:///system" in args and "--dedicated-pool=4-7" in args
    # the socket the host's libvirt QEMU hook connects to lives on the host
    sock = next(a for a in args if a.startswith("--socket=")).split("=", 1)[1]
    assert Path(sock).parent == Path(mounts["run"]["mountPath"]) == Path(volumes["run"]["hostPath"]["path"])
    state = next(a for a in args if a.startswith("--state-dir=")).split("=", 1)[1]
    assert state == mounts["state"]["mountPath"] == volumes["state"]["hostPath"]["path"]
    # one agent per libvirtd: the lock folder is a fixed host path that every agent on the node sees
    lock = next(a for a in args if a.startswith("--lock-dir=")).split("=", 1)[1]
    assert mounts["lock"]["mountPath"] == lock and not mounts["lock"].get("readOnly")
    assert volumes["lock"]["hostPath"] == {"path": "/run/libvirt/vmsched", "type": "DirectoryOrCreate"}
    assert parsed_lock_dir(args) == Path(lock)
    # bus on: the agent reads the broker URL file named by its own variable, never from argv
    url_file = Path(env["VMSCHED_AGENT_AMQP_URL_FILE"]["value"])
    assert volumes["amqp"]["secret"]["secretName"] == SECRETS["agent"]
    assert mounts["amqp"]["mountPath"] == str(url_file.parent)
    assert "VMSCHED_AGENT_AMQP_URL_FILE" in AGENT_ENV
    parsed = parse_cli(args)
    assert parsed.host_id is None or parsed.host_id == "", "the host ID comes from the environment"


def parsed_lock_dir(args: list[str]) -> Path:
    return parse_cli(args).lock_dir


def test_agent_host_id_from_libvirt(chart: helm.Chart) -> None:
    docs = render(chart, {"agent": {"enabled": True, "hostIdFrom": "libvirt", "bus": False}})
    (ds,) = objects(docs, "DaemonSet")
    (agent,) = containers(ds)
    env = {e["name"] for e in agent["env"]}
    assert "VMSCHED_AGENT_HOST_ID" not in env and "VMSCHED_AGENT_AMQP_URL_FILE" not in env
    assert "amqp" not in {v["name"] for v in ds["spec"]["template"]["spec"]["volumes"]}
    assert not any(a.startswith("--host-id") or a.startswith("--amqp") for a in agent["args"])


# --- values.yaml and values.schema.json ------------------------------------------------------------
def _schema_node(schema: dict[str, Any], path: list[str]) -> dict[str, Any] | None:
    node: dict[str, Any] | None = schema
    for key in path:
        if node is None or "properties" not in node:
            return None
        node = node["properties"].get(key)
    return node


def test_every_values_key_is_commented_and_typed() -> None:
    schema = json.loads((CHART / "values.schema.json").read_text())
    lines = (CHART / "values.yaml").read_text().splitlines()
    stack: list[tuple[int, str]] = []
    undocumented, untyped = [], []
    for i, line in enumerate(lines):
        m = re.match(r"^(\s*)([A-Za-z0-9_.\"/-]+):(\s|$)", line)
        if not m:
            continue
        indent, key = len(m.group(1)), m.group(2).strip('"')
        while stack and stack[-1][0] >= indent:
            stack.pop()
        parent = [k for _, k in stack]
        stack.append((indent, key))
        parent_node = _schema_node(schema, parent)
        if parent_node is None or "properties" not in parent_node:
            continue  # inside a free-form map (resources, securityContext, ...): documented by its parent
        if key not in parent_node["properties"]:
            untyped.append(".".join(parent + [key]))
        previous = lines[i - 1].strip() if i else ""
        if not previous.startswith("#"):
            undocumented.append(".".join(parent + [key]))
    assert not undocumented, f"values.yaml keys without a comment above them: {undocumented}"
    assert not untyped, f"values.yaml keys missing from values.schema.json: {untyped}"


def test_schema_describes_only_keys_that_exist(chart: helm.Chart) -> None:
    schema = json.loads((CHART / "values.schema.json").read_text())
    values = chart.values

    def walk(node: dict[str, Any], value: Any, path: str) -> None:
        for key, sub in node.get("properties", {}).items():
            if key == "global":
                continue
            assert isinstance(value, dict) and key in value, f"schema key {path}{key} has no default in values.yaml"
            walk(sub, value[key], f"{path}{key}.")

    walk(schema, values, "")
    chart.validate_schema(values)


@pytest.mark.parametrize(
    "bad",
    [
        {"scoring": {"consumers": 0}},
        {"gateway": {"service": {"type": "Ingress"}}},
        {"agent": {"hostIdFrom": "hostname"}},
        {"agent": {"dedicatedPool": "four"}},
        {"plugins": {"files": {"../evil.py": "x"}}},
        {"autoscaling": {"keda": {"enabled": "yes"}}},
        {"typo": True},
        {"amqp": {"secrets": {"gateway": ""}}},
        {"amqp": {"existingSecret": "vmsched-amqp"}},  # the old single-Secret key
        {"networkPolicy": {"gateway": {"allowedCIDRs": ["engine.example.com"]}}},
        {"networkPolicy": {"enabled": "no"}},
        {"gateway": {"auth": {"existingSecret": "Not_A_Name"}}},
        {"shadow": {"rate": 0}},
        {"shadow": {"rate": 1.5}},
        {"shadow": {"factors": {"MyScore": 1.5}}},
        {"shadow": {"factors": {"A=1,B": 2}}},
        {"shadow": {"drop": ["A,B"]}},
        {"shadow": {"workers": 0}},
        {"shadow": {"enabled": "yes"}},
    ],
)
def test_schema_rejects_bad_values(chart: helm.Chart, bad: dict[str, Any]) -> None:
    with pytest.raises(helm.HelmValuesError):
        chart.validate_schema(merge(chart.values, bad))
    with pytest.raises(helm.HelmError):
        render(chart, bad)


def test_notes_tell_how_to_point_the_engine_at_the_gateway(chart: helm.Chart) -> None:
    notes = render_raw(chart, {"gateway": {"service": {"type": "LoadBalancer"}}})["vmsched/templates/NOTES.txt"]
    assert "engine-config -s ExternalSchedulerServiceURL=http://$GATEWAY:18781/" in notes
    assert "engine-config -s ExternalSchedulerEnabled=true" in notes
    for comp in ("gateway", "discovery", "scoring", "balancer"):
        assert f"{comp}: {SECRETS[comp]}" in notes
    assert f"create secret generic {SECRETS['scoring']} --from-file={SECRET_KEY}=vmsched-scoring.url" in notes
    assert f"get secret {RELEASE}-vmsched-gateway-admin-token -o jsonpath='{{.data.token}}' | base64 -d" in notes
    assert "networkPolicy.gateway.allowedCIDRs" in notes


def test_docs_only_set_values_the_chart_has(chart: helm.Chart) -> None:
    """Every `--set KEY=...` in the deployment docs and the chart README names a real value."""
    values = chart.values
    found = 0
    deploy_docs = [ROOT / "docs" / "deploy.md", *sorted((ROOT / "docs" / "deploy").glob("*.md"))]
    for doc in (*deploy_docs, CHART / "README.md"):
        for m in re.finditer(r"--set(?:-file|-json|-string)?[ =]'?([A-Za-z0-9_.\\-]+)=", doc.read_text()):
            keys = [k.replace("\\", "") for k in re.split(r"(?<!\\)\.", m.group(1))]
            node: Any = values
            for i, key in enumerate(keys):
                if isinstance(node, dict) and node == {} and i > 0:
                    break  # a free-form map (plugins.files, labels, ...)
                assert isinstance(node, dict) and key in node, f"{doc.name}: --set {m.group(1)}: no such value"
                node = node[key]
            found += 1
    assert found >= 10
    text = "".join(doc.read_text() for doc in deploy_docs)
    assert "engine-config -s ExternalSchedulerServiceURL=http://" in text
    assert "engine-config -s ExternalSchedulerEnabled=true" in text


# --- the gateway's tokens ---------------------------------------------------------------------------
def test_the_chart_makes_a_tokens_secret_and_the_gateway_mounts_it(chart: helm.Chart) -> None:
    from vmsched.tokens import TokenStore, parse

    docs = render(chart, {})
    secrets = by_name(docs, "Secret")
    tokens_secret = secrets[f"{RELEASE}-vmsched-gateway-tokens"]
    token = base64.b64decode(secrets[f"{RELEASE}-vmsched-gateway-admin-token"]["data"]["token"]).decode()
    assert len(token) >= 40
    text = base64.b64decode(tokens_secret["data"]["tokens.yaml"]).decode()
    assert token not in text, "the tokens file holds the digest only"
    doc = parse(text)
    (entry,) = doc.tokens
    assert entry.name == "admin" and {r.value for r in entry.roles} == {"read", "schedule", "operate"}
    assert entry.sha256 == hashlib.sha256(token.encode()).hexdigest()
    # another render (no cluster to look up) makes another token
    again = by_name(render(chart, {}), "Secret")[f"{RELEASE}-vmsched-gateway-admin-token"]["data"]["token"]
    assert again != secrets[f"{RELEASE}-vmsched-gateway-admin-token"]["data"]["token"]

    gw = next(d for d in objects(docs, "Deployment") if component(d) == "gateway")
    pod = gw["spec"]["template"]["spec"]
    (c,) = containers(gw)
    path = Path(next(e["value"] for e in c["env"] if e["name"] == "VMSCHED_TOKENS_FILE"))
    assert parse_cli(c["args"]).command == "gateway"
    (mount,) = [m for m in c["volumeMounts"] if m["mountPath"] == str(path.parent)]
    assert mount["readOnly"] is True and "subPath" not in mount, "a subPath mount never sees a rotated Secret"
    (volume,) = [v for v in pod["volumes"] if v["name"] == mount["name"]]
    assert volume["secret"]["secretName"] == tokens_secret["metadata"]["name"]
    assert volume["secret"]["items"] == [{"key": "tokens.yaml", "path": path.name}]
    # the plain token is never mounted in any pod
    for wl in workloads(docs):
        for v in wl["spec"]["template"]["spec"]["volumes"]:
            assert v.get("secret", {}).get("secretName") != f"{RELEASE}-vmsched-gateway-admin-token"
    # what the gateway reads is what it is given: the store accepts the token
    tmp = Path(__import__("tempfile").mkdtemp()) / path.name
    tmp.write_text(text)
    assert TokenStore(tmp).by_token(token).name == "admin"
    # a new generated file rolls the gateway
    assert "checksum/tokens" in gw["spec"]["template"]["metadata"]["annotations"]


def test_the_chart_makes_one_console_secret_that_every_gateway_pod_mounts(chart: helm.Chart) -> None:
    from vmsched.gateway.console.sessions import MIN_SECRET, read_secret

    docs = render(chart, {"gateway": {"replicaCount": 3}})
    secret = by_name(docs, "Secret")[f"{RELEASE}-vmsched-gateway-console"]
    value = base64.b64decode(secret["data"]["console.secret"]).decode()
    again = by_name(render(chart, {}), "Secret")[f"{RELEASE}-vmsched-gateway-console"]["data"]["console.secret"]
    assert again != secret["data"]["console.secret"], "generated: another render (no cluster to look up) differs"
    gw = next(d for d in objects(docs, "Deployment") if component(d) == "gateway")
    assert gw["spec"]["replicas"] == 3, "one Deployment: every replica mounts the same Secret"
    (c,) = containers(gw)
    env = {e["name"]: e.get("value") for e in c["env"]}
    path = Path(env["VMSCHED_CONSOLE_SECRET_FILE"])
    assert env["VMSCHED_CONSOLE_SESSION_TTL"] == "28800"
    (mount,) = [m for m in c["volumeMounts"] if m["mountPath"] == str(path.parent)]
    (volume,) = [v for v in gw["spec"]["template"]["spec"]["volumes"] if v["name"] == mount["name"]]
    assert mount["readOnly"] is True and volume["secret"]["secretName"] == secret["metadata"]["name"]
    assert volume["secret"]["items"] == [{"key": "console.secret", "path": path.name}]
    assert "checksum/console" in gw["spec"]["template"]["metadata"]["annotations"]
    tmp = Path(__import__("tempfile").mkdtemp()) / path.name
    tmp.write_text(value)
    assert len(read_secret(tmp)) >= MIN_SECRET, "the gateway accepts what it is given"
    for wl in workloads(docs):
        if component(wl) != "gateway":
            assert all(v.get("secret", {}).get("secretName") != secret["metadata"]["name"]
                       for v in wl["spec"]["template"]["spec"]["volumes"]), "the gateway's alone"


def test_an_existing_console_secret_is_used_as_is(chart: helm.Chart) -> None:
    docs = render(chart, {"gateway": {"console": {"existingSecret": "site-console", "secretKey": "k"}}})
    assert f"{RELEASE}-vmsched-gateway-console" not in by_name(docs, "Secret")
    gw = next(d for d in objects(docs, "Deployment") if component(d) == "gateway")
    (c,) = containers(gw)
    volumes = {v["name"]: v for v in gw["spec"]["template"]["spec"]["volumes"]}
    assert volumes["console"]["secret"]["secretName"] == "site-console"
    assert {"name": "VMSCHED_CONSOLE_SECRET_FILE", "value": "/etc/vmsched/console/k"} in c["env"]
    assert "checksum/console" not in gw["spec"]["template"]["metadata"]["annotations"]


def test_an_existing_tokens_secret_is_used_as_is(chart: helm.Chart) -> None:
    docs = render(chart, {"gateway": {"auth": {"existingSecret": "site-tokens", "tokensKey": "t.yaml"},
                                      "console": {"existingSecret": "site-console"}}})
    assert not objects(docs, "Secret"), "nothing generated"
    gw = next(d for d in objects(docs, "Deployment") if component(d) == "gateway")
    (c,) = containers(gw)
    volumes = {v["name"]: v for v in gw["spec"]["template"]["spec"]["volumes"]}
    assert volumes["tokens"]["secret"]["secretName"] == "site-tokens"
    assert {"name": "VMSCHED_TOKENS_FILE", "value": "/etc/vmsched/tokens/t.yaml"} in c["env"]


def test_container_binds_are_explicit(combo: tuple[str, list[dict[str, Any]]]) -> None:
    name, docs = combo
    for wl in workloads(docs):
        (c,) = containers(wl)
        args = parse_cli(c["args"])
        assert args.metrics_host == "0.0.0.0", (name, c["name"])
        ports = {p["name"]: p["containerPort"] for p in c["ports"]}
        assert ports["metrics"] == int(args.metrics_port)
        if component(wl) == "gateway":
            assert args.host == "0.0.0.0" and ports["http"] == int(args.port)


def test_engine_allow_reaches_the_gateway(chart: helm.Chart) -> None:
    docs = render(chart, COMBOS["locked-down"])
    gw = next(d for d in objects(docs, "Deployment") if component(d) == "gateway")
    assert parse_cli(containers(gw)[0]["args"]).engine_allow == "192.0.2.10/32,2001:db8::/64"


# --- NetworkPolicies ------------------------------------------------------------------------------------
def selects(selector: dict[str, Any], labels: dict[str, str]) -> bool:
    """Kubernetes label-selector semantics (matchLabels and matchExpressions)."""
    if not selector.get("matchLabels", {}).items() <= labels.items():
        return False
    for expr in selector.get("matchExpressions", []):
        key, op, values = expr["key"], expr["operator"], expr.get("values", [])
        ok = {"In": key in labels and labels[key] in values, "NotIn": labels.get(key) not in values,
              "Exists": key in labels, "DoesNotExist": key not in labels}[op]
        if not ok:
            return False
    return True


def pods_selected(policy: dict[str, Any], docs: list[dict[str, Any]]) -> set[str]:
    pods = workloads(docs) + objects(docs, "Pod")
    return {component(p) for p in pods if selects(policy["spec"]["podSelector"], (
        p["spec"]["template"]["metadata"] if p["kind"] != "Pod" else p["metadata"])["labels"])}


def admitted(docs: list[dict[str, Any]], comp: str) -> dict[str, list[dict[str, Any]]]:
    """Container port name -> the peers every ingress policy selecting ``comp`` admits to it."""
    out: dict[str, list[dict[str, Any]]] = {}
    for policy in objects(docs, "NetworkPolicy"):
        if comp not in pods_selected(policy, docs) or "Ingress" not in policy["spec"]["policyTypes"]:
            continue
        for rule in policy["spec"].get("ingress", []):
            for port in rule["ports"]:
                out.setdefault(port["port"], []).extend(rule["from"])
    return out


def test_network_policies_by_default(chart: helm.Chart) -> None:
    docs = render(chart, {})
    policies = by_name(docs, "NetworkPolicy")
    assert set(policies) == {f"{RELEASE}-vmsched-gateway", f"{RELEASE}-vmsched-metrics"}
    for policy in policies.values():
        assert policy["spec"]["policyTypes"] == ["Ingress"]
        assert "namespace" not in policy["metadata"]
    monitoring = [{"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "monitoring"}}}]
    test_pod = {"podSelector": {"matchLabels": {"app.kubernetes.io/name": "vmsched", "app.kubernetes.io/instance": RELEASE,
                                                "app.kubernetes.io/component": "test"}}}
    # every component is isolated: the gateway's API only from the chart's test pod until sources are set,
    # every metrics port only from the monitoring namespace, nothing else anywhere
    assert admitted(docs, "gateway") == {"http": [test_pod], "metrics": monitoring}
    for comp in WORKERS:
        assert admitted(docs, comp) == {"metrics": monitoring}, comp
    # the test pod really carries the labels the policy admits
    (test,) = objects(docs, "Pod")
    assert selects(test_pod["podSelector"], test["metadata"]["labels"])
    # named ports exist on the containers they select
    for wl in workloads(docs):
        names = {p["name"] for p in containers(wl)[0]["ports"]}
        assert set(admitted(docs, component(wl))) <= names


def test_network_policies_follow_the_values(chart: helm.Chart) -> None:
    docs = render(chart, COMBOS["locked-down"])
    v = COMBOS["locked-down"]["networkPolicy"]
    gateway = admitted(docs, "gateway")["http"]
    assert {"ipBlock": {"cidr": "192.0.2.10/32"}} in gateway and v["gateway"]["from"][0] in gateway
    for comp in ("gateway", *WORKERS, "agent"):
        assert admitted(docs, comp)["metrics"] == v["metrics"]["from"], comp
    assert set(admitted(docs, "agent")) == {"metrics"}
    # egress: DNS and the broker only (and the extra destination)
    (egress,) = [p for p in objects(docs, "NetworkPolicy") if p["spec"]["policyTypes"] == ["Egress"]]
    assert pods_selected(egress, docs) == {"gateway", *WORKERS, "agent"}
    rules = egress["spec"]["egress"]
    assert {(p["port"], p["protocol"]) for p in rules[0]["ports"]} == {(53, "UDP"), (53, "TCP")}
    assert rules[1]["to"] == [{"namespaceSelector": {}, "podSelector": {"matchLabels": {"app.kubernetes.io/name": "rabbitmq"}}}]
    assert {p["port"] for p in rules[1]["ports"]} == {5672, 5671}
    assert rules[2] == {"to": [{"ipBlock": {"cidr": "198.51.100.7/32"}}]}
    # the broker's own policy, for its namespace: AMQP only from this release's pods and the extra sources
    broker = by_name(docs, "NetworkPolicy")[f"{RELEASE}-vmsched-broker"]
    assert broker["metadata"]["namespace"] == "rabbitmq"
    assert broker["spec"]["podSelector"] == {"matchLabels": {"app.kubernetes.io/name": "rabbitmq"}}
    amqp, cluster, extra = broker["spec"]["ingress"]
    assert {p["port"] for p in amqp["ports"]} == {5672, 5671}
    vmsched_peer, hypervisors = amqp["from"]
    assert vmsched_peer["namespaceSelector"] == {"matchLabels": {"kubernetes.io/metadata.name": NAMESPACE}}
    for wl in workloads(docs):  # every vmsched pod of the release, and nothing but them
        assert selects(vmsched_peer["podSelector"], wl["spec"]["template"]["metadata"]["labels"])
    assert not selects(vmsched_peer["podSelector"], {"app.kubernetes.io/name": "rabbitmq"})
    assert hypervisors == {"ipBlock": {"cidr": "198.51.100.0/24"}}
    assert cluster == {"from": [{"podSelector": {"matchLabels": {"app.kubernetes.io/name": "rabbitmq"}}}]}
    assert extra == v["broker"]["extraIngress"][0]


def test_network_policies_can_be_disabled(chart: helm.Chart) -> None:
    assert not objects(render(chart, {"networkPolicy": {"enabled": False}}), "NetworkPolicy")
