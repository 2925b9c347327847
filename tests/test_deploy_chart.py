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

import copy
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

from tests.deploy_helpers import AGENT_ENV, parse_cli, settings_env_names
from vmsched.runner import service_queues

ROOT = Path(__file__).resolve().parent.parent
CHART = ROOT / "charts" / "vmsched"
RELEASE, NAMESPACE = "sched", "ovirt"
SECRET, SECRET_KEY = "broker-credentials", "amqp-url"

OLDEST_K8S = "1.25.0"  # Chart.yaml kubeVersion ">=1.25.0-0"
K8S_VERSIONS = (OLDEST_K8S, kv_utils.latest_version())
CRD_KINDS = {
    ("keda.sh/v1alpha1", "ScaledObject"),
    ("keda.sh/v1alpha1", "TriggerAuthentication"),
    ("monitoring.coreos.com/v1", "ServiceMonitor"),
}
WORKERS = ("discovery", "scoring", "balancer")

BASE = {"amqp": {"existingSecret": SECRET, "secretKey": SECRET_KEY}}
COMBOS: dict[str, dict[str, Any]] = {
    "default": {},
    "keda": {"autoscaling": {"keda": {"enabled": True}}},
    "hpa": {"autoscaling": {"hpa": {"enabled": True}}},
    "servicemonitor": {"serviceMonitor": {"enabled": True, "labels": {"release": "kube-prometheus-stack"}}},
    "agent": {"agent": {"enabled": True, "supplementalGroups": [107], "dedicatedPool": "4-7"}},
    "everything": {
        "autoscaling": {"keda": {"enabled": True}},
        "serviceMonitor": {"enabled": True},
        "agent": {"enabled": True, "hostIdFrom": "libvirt", "initChown": False},
        "grafanaDashboard": {"enabled": True},
        "plugins": {"files": {"my_filter.py": "class MyFilter:\n    def do_filter(self, *a):\n        pass\n"}},
        "gateway": {
            "service": {"type": "LoadBalancer", "nodePort": 31878},
            "topologySpreadConstraints": [
                {"maxSkew": 1, "topologyKey": "kubernetes.io/hostname", "whenUnsatisfiable": "ScheduleAnyway"}
            ],
        },
        "imagePullSecrets": [{"name": "regcred"}],
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
    assert not objects(docs, "Secret"), "the chart never creates Secrets"
    gateway_svc = [s for s in objects(docs, "Service") if component(s) == "gateway"]
    assert len(gateway_svc) == 1
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
    assert {p["name"]: p["containerPort"] for p in c["ports"]} == {"http": 18999}
    assert "--port=18999" in c["args"]
    svc = next(s for s in objects(docs, "Service") if component(s) == "gateway")
    assert svc["spec"]["ports"][0]["targetPort"] == "http"


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


def test_amqp_url_comes_from_the_existing_secret(combo: tuple[str, list[dict[str, Any]]]) -> None:
    name, docs = combo
    for wl in workloads(docs):
        for c in containers(wl):
            env = {e["name"]: e for e in c["env"]}
            # the agent's command line reads its own variable (services/policy_agent/cli.py)
            var = "VMSCHED_AGENT_AMQP" if component(wl) == "agent" else "VMSCHED_AMQP_URL"
            ref = env[var]["valueFrom"]["secretKeyRef"]
            assert ref == {"name": SECRET, "key": SECRET_KEY}, (name, c["name"])
            assert "value" not in env[var]
            assert not any("amqp" in a for a in c["args"]), "credentials must not be in the pod spec or argv"


def test_missing_secret_name_fails_the_render(chart: helm.Chart) -> None:
    with pytest.raises(helm.HelmError):
        render(chart, {"amqp": {"existingSecret": ""}})


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
    assert auth["spec"]["secretTargetRef"] == [{"parameter": "host", "name": SECRET, "key": SECRET_KEY}]


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
    # bus on: the agent reads the broker URL from its own variable, never from argv
    assert env["VMSCHED_AGENT_AMQP"]["valueFrom"]["secretKeyRef"] == {"name": SECRET, "key": SECRET_KEY}
    assert "VMSCHED_AGENT_AMQP" in AGENT_ENV
    parsed = parse_cli(args)
    assert parsed.host_id is None or parsed.host_id == "", "the host ID comes from the environment"


def parsed_lock_dir(args: list[str]) -> Path:
    return parse_cli(args).lock_dir


def test_agent_host_id_from_libvirt(chart: helm.Chart) -> None:
    docs = render(chart, {"agent": {"enabled": True, "hostIdFrom": "libvirt", "bus": False}})
    (ds,) = objects(docs, "DaemonSet")
    (agent,) = containers(ds)
    env = {e["name"] for e in agent["env"]}
    assert "VMSCHED_AGENT_HOST_ID" not in env and "VMSCHED_AGENT_AMQP" not in env
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
        {"amqp": {"existingSecret": ""}},
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
    assert f"create secret generic {SECRET}" in notes


def test_docs_only_set_values_the_chart_has(chart: helm.Chart) -> None:
    """Every `--set KEY=...` in docs/deploy.md and the chart README names a real value."""
    values = chart.values
    found = 0
    for doc in (ROOT / "docs" / "deploy.md", CHART / "README.md"):
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
    text = (ROOT / "docs" / "deploy.md").read_text()
    assert "engine-config -s ExternalSchedulerServiceURL=http://" in text
    assert "engine-config -s ExternalSchedulerEnabled=true" in text
