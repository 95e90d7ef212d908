"""deploy/k8s: every manifest against the Kubernetes schemas, offline, and their wiring.

No cluster here: the built-in kinds are checked with kubernetes-validate (the API's JSON
schemas ship inside the package; strict, so unknown fields fail), the ServiceMonitor with
jsonschema against tests/support/servicemonitor_v1.schema.json (its source is in its
``$comment``). Then what a schema cannot see: selectors against pod labels, the HPA and
PDB targets, probe ports against the port the daemon listens on, the daemon's own CLI
parsing the pods' arguments and environment, and the secret files being mounted.
"""

from __future__ import annotations

import copy
import json
import re
from pathlib import Path
from typing import Any

import jsonschema
import kubernetes_validate
import pytest
import yaml

from ingest.cli import ENV_PREFIX, api_settings_from, build_parser, settings_from
from ingest.config import parse_mqtt_url
from ingest.errors import ConfigError
from tests.test_config_cli import subparser

ROOT = Path(__file__).resolve().parent.parent
K8S = ROOT / "deploy" / "k8s"
SERVICEMONITOR_SCHEMA = Path(__file__).parent / "support" / "servicemonitor_v1.schema.json"
NAMESPACE = "iot-ingest"
# The oldest Kubernetes minor we claim (PDB unhealthyPodEvictionPolicy is GA in 1.31) and
# the newest the installed kubernetes-validate knows.
K8S_VERSIONS = ("1.31.0", kubernetes_validate.utils.latest_version())
# Example files are validated too, but must stay out of kustomization.yaml.
EXAMPLES = {"secret.example.yaml"}
MODES = {"ingest-bucket": "bucket", "ingest-timeseries": "timeseries"}
API = "ingest-api"
# The daemon's MQTT disconnect comes out of the shutdown budget (ingest/pipeline/app.py); this is
# the margin on top of it for closing the MongoDB client and exiting.
EXIT_MARGIN_SECONDS = 5

type Doc = dict[str, Any]


def _load(path: Path) -> list[Doc]:
    return [doc for doc in yaml.safe_load_all(path.read_text(encoding="utf-8")) if doc]


def _manifest_files() -> list[Path]:
    return sorted(p for p in K8S.glob("*.yaml") if p.name != "kustomization.yaml")


def _all_docs() -> list[Doc]:
    return [doc for path in _manifest_files() for doc in _load(path)]


def _of_kind(kind: str) -> list[Doc]:
    return [doc for doc in _all_docs() if doc["kind"] == kind]


def _one(kind: str, name: str) -> Doc:
    found = [doc for doc in _of_kind(kind) if doc["metadata"]["name"] == name]
    assert len(found) == 1, f"expected one {kind}/{name}, found {len(found)}"
    return found[0]


def _validate(doc: Doc) -> None:
    """Raise if ``doc`` does not match its schema (every version in K8S_VERSIONS)."""
    if doc["apiVersion"] == "monitoring.coreos.com/v1" and doc["kind"] == "ServiceMonitor":
        schema = json.loads(SERVICEMONITOR_SCHEMA.read_text(encoding="utf-8"))
        jsonschema.Draft202012Validator(schema).validate(doc)
        return
    for version in K8S_VERSIONS:
        # SchemaNotFoundError (an unknown kind or apiVersion) fails the test too.
        kubernetes_validate.validate(doc, version, strict=True)


def _workloads() -> list[Doc]:
    return [_one("StatefulSet", name) for name in MODES]


def _pod_labels(workload: Doc) -> dict[str, str]:
    labels = workload["spec"]["template"]["metadata"]["labels"]
    assert isinstance(labels, dict)
    return labels


def _container(workload: Doc) -> Doc:
    containers = workload["spec"]["template"]["spec"]["containers"]
    assert len(containers) == 1
    assert isinstance(containers[0], dict)
    return containers[0]


def _matches(selector: dict[str, Any], labels: dict[str, str]) -> bool:
    """A label selector (matchLabels only, as the manifests use) against labels."""
    assert set(selector) <= {"matchLabels"}, "extend _matches for matchExpressions"
    return all(labels.get(key) == value for key, value in selector["matchLabels"].items())


def _pod_env(workload: Doc, pod_name: str) -> dict[str, str]:
    """The container's environment as the kubelet builds it for a pod of that name."""
    container = _container(workload)
    env: dict[str, str] = {}
    for source in container.get("envFrom", []):
        env.update(_one("ConfigMap", source["configMapRef"]["name"])["data"])
    for var in container.get("env", []):
        if "value" in var:
            env[var["name"]] = var["value"]
        else:
            assert var["valueFrom"] == {"fieldRef": {"fieldPath": "metadata.name"}}, var
            env[var["name"]] = pod_name
    return env


def _cli_env_vars() -> set[str]:
    """Every INGEST_* variable ``ingest run`` reads, from its parser's help texts."""
    run = subparser({}, "run")
    names = set()
    for action in run._actions:
        names.update(re.findall(rf"\[env ({ENV_PREFIX}[A-Z0-9_]+)", action.help or ""))
    assert f"{ENV_PREFIX}MQTT_URL" in names  # the help format is what we think it is
    return names


# --- schemas ---------------------------------------------------------------------------


@pytest.mark.parametrize("path", _manifest_files(), ids=lambda p: p.name)
def test_every_manifest_is_valid_for_kubernetes(path: Path) -> None:
    docs = _load(path)
    assert docs, f"{path.name} is empty"
    for doc in docs:
        _validate(doc)


def test_the_validators_reject_broken_manifests() -> None:
    """The schema checks can fail: typos and wrong types in each kind are caught."""
    broken = []
    statefulset = copy.deepcopy(_one("StatefulSet", "ingest-bucket"))
    _container(statefulset)["readinesProbe"] = {"httpGet": {"path": "/readyz", "port": 9108}}
    broken.append(statefulset)
    statefulset = copy.deepcopy(_one("StatefulSet", "ingest-bucket"))
    statefulset["spec"]["replicas"] = "three"
    broken.append(statefulset)
    hpa = copy.deepcopy(_one("HorizontalPodAutoscaler", "ingest-bucket"))
    hpa["spec"]["metrics"][0]["resource"]["target"]["averageUtilisation"] = 70
    broken.append(hpa)
    monitor = copy.deepcopy(_one("ServiceMonitor", "iot-ingest"))
    monitor["spec"]["endpoints"][0]["scheme"] = "tcp"
    broken.append(monitor)
    monitor = copy.deepcopy(_one("ServiceMonitor", "iot-ingest"))
    monitor["spec"]["endpoint"] = monitor["spec"].pop("endpoints")
    broken.append(monitor)
    for doc in broken:
        with pytest.raises(jsonschema.ValidationError):
            _validate(doc)


def test_kustomization_lists_every_manifest_in_the_namespace() -> None:
    kustomization = _load(K8S / "kustomization.yaml")[0]
    assert kustomization["apiVersion"] == "kustomize.config.k8s.io/v1beta1"
    assert kustomization["kind"] == "Kustomization"
    assert kustomization["namespace"] == NAMESPACE
    listed = kustomization["resources"]
    assert len(listed) == len(set(listed))
    assert set(listed) == {p.name for p in _manifest_files()} - EXAMPLES
    assert set(listed).isdisjoint(EXAMPLES)
    for doc in _all_docs():
        if doc["kind"] == "Namespace":
            assert doc["metadata"]["name"] == NAMESPACE
        else:
            assert doc["metadata"].get("namespace") == NAMESPACE, doc["metadata"]["name"]


# --- wiring ----------------------------------------------------------------------------


def test_selectors_match_the_pods_of_their_mode() -> None:
    for workload in _workloads():
        name, labels = workload["metadata"]["name"], _pod_labels(workload)
        others = [_pod_labels(w) for w in _workloads() if w["metadata"]["name"] != name]
        assert _matches(workload["spec"]["selector"], labels)
        assert not any(_matches(workload["spec"]["selector"], o) for o in others)
        service = _one("Service", workload["spec"]["serviceName"])
        assert service["metadata"]["name"] == name
        assert _matches({"matchLabels": service["spec"]["selector"]}, labels)
        assert not any(_matches({"matchLabels": service["spec"]["selector"]}, o) for o in others)
        pdb = _one("PodDisruptionBudget", name)
        assert _matches(pdb["spec"]["selector"], labels)
        assert not any(_matches(pdb["spec"]["selector"], o) for o in others)
        assert pdb["spec"]["maxUnavailable"] < workload["spec"]["replicas"]


def _daemon_services() -> list[Doc]:
    return [s for s in _of_kind("Service") if s["metadata"]["name"] in MODES]


def test_servicemonitor_scrapes_both_services_on_their_metrics_port() -> None:
    monitor = _one("ServiceMonitor", "iot-ingest")
    services = _daemon_services()
    assert {s["metadata"]["name"] for s in services} == set(MODES)
    # the read API's /metrics needs a token: the daemons' monitor leaves its Service alone
    assert not _matches(monitor["spec"]["selector"], _one("Service", API)["metadata"]["labels"])
    for service in services:
        assert _matches(monitor["spec"]["selector"], service["metadata"]["labels"])
        port_names = {p["name"] for p in service["spec"]["ports"]}
        for endpoint in monitor["spec"]["endpoints"]:
            assert endpoint["port"] in port_names
            assert endpoint["path"] == "/metrics"
    for label in monitor["spec"].get("targetLabels", []):
        assert all(label in s["metadata"]["labels"] for s in services)


def test_hpa_scales_the_workload_of_its_mode_on_cpu() -> None:
    for workload in _workloads():
        name = workload["metadata"]["name"]
        hpa = _one("HorizontalPodAutoscaler", name)
        target = hpa["spec"]["scaleTargetRef"]
        assert (target["apiVersion"], target["kind"], target["name"]) == (
            workload["apiVersion"],
            workload["kind"],
            name,
        )
        assert hpa["spec"]["minReplicas"] == workload["spec"]["replicas"] == 3
        assert hpa["spec"]["maxReplicas"] >= hpa["spec"]["minReplicas"]
        assert [m["resource"]["name"] for m in hpa["spec"]["metrics"]] == ["cpu"]
        # CPU utilisation is relative to the request: without one the HPA cannot act.
        assert _container(workload)["resources"]["requests"]["cpu"]


def test_every_env_var_is_one_the_daemon_reads() -> None:
    known = _cli_env_vars()
    used = set(_one("ConfigMap", "ingest-config")["data"])
    for workload in _workloads():
        used |= {var["name"] for var in _container(workload).get("env", [])}
    assert used, "no INGEST_* settings found"
    assert used <= known, f"not read by ingest run: {sorted(used - known)}"


def test_the_daemon_accepts_each_pods_configuration(tmp_path: Path) -> None:
    """The pods' args and environment through ingest's own CLI, secrets from their mount."""
    example_secret = _load(K8S / "secret.example.yaml")[0]
    for workload in _workloads():
        name = workload["metadata"]["name"]
        container, pod_spec = _container(workload), workload["spec"]["template"]["spec"]
        assert container["image"] == "iot-ingest:latest"
        # ENTRYPOINT ["ingest"] (deploy/Dockerfile): args are the subcommand and flags.
        assert container["args"][0] == "run"
        mounts = {m["name"]: m["mountPath"] for m in container["volumeMounts"]}
        volumes = {v["name"]: v for v in pod_spec["volumes"]}
        secret_dir = mounts["secrets"]
        secret = volumes["secrets"]["secret"]
        assert secret["secretName"] == example_secret["metadata"]["name"]
        # Mounted path -> the value the example Secret gives that key.
        mounted = {
            f"{secret_dir}/{item['path']}": example_secret["stringData"][item["key"]]
            for item in secret["items"]
        }
        args, files = [], {}
        for arg in container["args"]:
            flag, _, value = arg.partition("=")
            if flag not in {"--mongodb-uri-file", "--mqtt-password-file"}:
                args.append(arg)
                continue
            assert value in mounted, f"{name}: {flag} reads {value}, which is not mounted"
            local = tmp_path / name / Path(value).name
            local.parent.mkdir(exist_ok=True)
            local.write_text(mounted[value] + "\n", encoding="utf-8")
            files[flag] = mounted[value]
            args.append(f"{flag}={local}")
        assert set(files) == {"--mongodb-uri-file", "--mqtt-password-file"}, name

        pod_name = f"{name}-0"
        env = _pod_env(workload, pod_name)
        settings = settings_from(build_parser(env).parse_args(args), env)
        assert settings.mode == MODES[name]
        assert settings.shared_group == name
        assert settings.subscriptions == (f"$share/{name}/sensors/#",)
        # Unique and stable per pod: StatefulSet pod names, from the downward API.
        assert workload["kind"] == "StatefulSet"
        assert settings.client_id == pod_name
        assert settings.mongodb_uri == files["--mongodb-uri-file"]
        assert settings.mqtt.password == files["--mqtt-password-file"]
        assert settings.qos == 1

        # Explicit per mode, never the daemon's default (which differs by mode and version).
        assert f"{ENV_PREFIX}METRICS_PORT" in {e["name"] for e in container["env"]}, name
        ports = {p["name"]: p["containerPort"] for p in container["ports"]}
        assert ports == {"metrics": settings.metrics_port}
        assert settings.metrics_host == "0.0.0.0"
        readiness, liveness = container["readinessProbe"], container["livenessProbe"]
        assert readiness["httpGet"]["path"] == "/readyz"
        assert liveness["httpGet"]["path"] == "/healthz"
        for probe in (readiness, liveness):
            assert ports.get(probe["httpGet"]["port"], probe["httpGet"]["port"]) == (
                settings.metrics_port
            )
        annotations = workload["spec"]["template"]["metadata"]["annotations"]
        assert annotations["prometheus.io/scrape"] == "true"
        assert int(annotations["prometheus.io/port"]) == settings.metrics_port
        assert annotations["prometheus.io/path"] == "/metrics"
        for service in _daemon_services():
            for port in service["spec"]["ports"]:
                assert port["targetPort"] in ports or port["targetPort"] == (settings.metrics_port)

        assert pod_spec["terminationGracePeriodSeconds"] >= (
            settings.shutdown_timeout + EXIT_MARGIN_SECONDS
        )


def test_the_read_api_pod_reads_its_tokens_from_its_secret(tmp_path: Path) -> None:
    """The API's args and environment through ingest's own CLI, its Secret's files mounted:
    on all the pod's addresses, it starts only with the tokens file, and only the API's
    pods are behind its Service."""
    deployment, service = _one("Deployment", API), _one("Service", API)
    container, pod_spec = _container(deployment), deployment["spec"]["template"]["spec"]
    labels = _pod_labels(deployment)
    assert _matches(deployment["spec"]["selector"], labels)
    assert _matches({"matchLabels": service["spec"]["selector"]}, labels)
    assert not any(
        _matches({"matchLabels": service["spec"]["selector"]}, _pod_labels(w)) for w in _workloads()
    )
    assert service["spec"].get("type", "ClusterIP") == "ClusterIP"
    example = next(
        d
        for d in _load(K8S / "secret.example.yaml")
        if d["metadata"]["name"] == "ingest-api-secrets"
    )
    secret = next(v for v in pod_spec["volumes"] if v["name"] == "secrets")["secret"]
    assert secret["secretName"] == example["metadata"]["name"]
    mount = next(m for m in container["volumeMounts"] if m["name"] == "secrets")
    mounted = {f"{mount['mountPath']}/{item['path']}": item["key"] for item in secret["items"]}
    token = "t" * 43
    local = {"mongodb-uri": "mongodb://reader@db:27017/iot", "tokens": f"{token}\n"}
    args = []
    for arg in container["args"]:
        flag, _, value = arg.partition("=")
        if value in mounted:
            (tmp_path / mounted[value]).write_text(local[mounted[value]])
        args.append(f"{flag}={tmp_path / mounted[value]}" if value in mounted else arg)
    assert set(mounted.values()) == set(example["stringData"]) == {"mongodb-uri", "tokens"}
    env = {var["name"]: var["value"] for var in container["env"]}
    settings = api_settings_from(build_parser(env).parse_args(args), env)
    assert settings.host == "0.0.0.0"
    assert [t.name for t in settings.tokens] == ["line-1"]
    assert settings.mongodb_uri == local["mongodb-uri"]
    without = [a for a in args if not a.startswith("--api-tokens-file")]
    with pytest.raises(ConfigError, match="not a loopback address"):
        api_settings_from(build_parser(env).parse_args(without), env)
    # the example's placeholder is refused as a token
    (tmp_path / "tokens").write_text(example["stringData"]["tokens"])
    with pytest.raises(ConfigError, match="shorter than 16 characters"):
        api_settings_from(build_parser(env).parse_args(args), env)
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    assert ports == {"http": settings.port}
    assert container["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": "http"}
    assert container["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": "http"}
    assert [p["targetPort"] for p in service["spec"]["ports"]] == ["http"]
    assert pod_spec["securityContext"]["runAsNonRoot"] is True
    assert container["securityContext"]["readOnlyRootFilesystem"] is True


def test_no_secret_outside_the_secret() -> None:
    data = _one("ConfigMap", "ingest-config")["data"]
    assert parse_mqtt_url(data[f"{ENV_PREFIX}MQTT_URL"]).password is None
    assert not {f"{ENV_PREFIX}MONGODB_URI", f"{ENV_PREFIX}MQTT_PASSWORD_FILE"} & set(data)
    example = _load(K8S / "secret.example.yaml")[0]
    assert all("REPLACE-ME" in value for value in example["stringData"].values())


def test_pods_run_locked_down() -> None:
    for workload in _workloads():
        pod_spec = workload["spec"]["template"]["spec"]
        container = _container(workload)
        assert pod_spec["securityContext"]["runAsNonRoot"] is True
        # The image's user (deploy/Dockerfile: USER 10001:10001) and the group that may
        # read the secret files.
        assert pod_spec["securityContext"]["runAsUser"] == 10001
        assert pod_spec["securityContext"]["fsGroup"] == 10001
        assert pod_spec["volumes"][0]["secret"]["defaultMode"] & 0o040
        context = container["securityContext"]
        assert context["readOnlyRootFilesystem"] is True
        assert context["allowPrivilegeEscalation"] is False
        assert context["capabilities"]["drop"] == ["ALL"]
        resources = container["resources"]
        assert set(resources["requests"]) == set(resources["limits"]) == {"cpu", "memory"}
    dockerfile = (ROOT / "deploy" / "Dockerfile").read_text(encoding="utf-8")
    assert "USER 10001:10001" in dockerfile
    assert 'ENTRYPOINT ["ingest"]' in dockerfile


def test_auto_workers_is_one_per_cpu_of_the_pods_limit(tmp_path: Path) -> None:
    """No INGEST_WORKERS: the daemon reads the CPU limit as its cgroup quota."""
    from ingest.pipeline.workers import cgroup_cpus  # noqa: PLC0415

    for workload in _workloads():
        container = _container(workload)
        env = {e["name"] for e in container.get("env", [])}
        assert "INGEST_WORKERS" not in env
        cpu = str(container["resources"]["limits"]["cpu"])
        millis = int(cpu.removesuffix("m")) if cpu.endswith("m") else int(float(cpu) * 1000)
        (tmp_path / "cpu.max").write_text(f"{millis * 100} 100000\n")  # as the kubelet sets it
        assert cgroup_cpus(tmp_path) == 1, "one worker per pod: scale with replicas"


def test_the_qos_setting_says_what_the_broker_must_hold_for_qos_0() -> None:
    """The broker is not deployed here, so the ConfigMap says, where the QoS is chosen,
    what mosquitto needs before a fleet is switched to QoS 0 (docs/delivery.md)."""
    lines = (K8S / "configmap.yaml").read_text(encoding="utf-8").splitlines()
    at = next(i for i, line in enumerate(lines) if line.strip().startswith("INGEST_QOS:"))
    comment: list[str] = []
    for line in reversed(lines[:at]):
        if not line.strip().startswith("#"):
            break
        comment.insert(0, line.strip().lstrip("# "))
    text = " ".join(comment)
    assert "max_queued_messages" in text
    assert "stops reading" in text  # why: the daemon pushes back, the broker drops
    assert "x the longest pause" in text  # how much
    assert "docs/delivery.md" in text
