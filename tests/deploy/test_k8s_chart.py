"""The Helm chart (deploy/helm/intellect) rendered and checked offline, as CI does it.

One run of `deploy/check.py` in the chart's own environment (.venv-k8s, `make k8s-tools`) renders the
defaults, ci/production-values.yaml and ci/provider-values.yaml with Helm's SDK, lints them, validates
every object against three Kubernetes versions' API schemas and runs checkov; the tests read its
report and the rendered YAML. No cluster runs here: what a pod does once started is not tested.
"""

from __future__ import annotations

import copy
import json
import os
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from deploy import policy

pytestmark = pytest.mark.slow  # other interpreters: the renderer's and checkov's

ROOT = Path(__file__).resolve().parents[2]
K8S_PYTHON = ROOT / ".venv-k8s" / "bin" / "python"
KEY = "0x" + "cd" * 32

# What the chart may ask checkov to skip, each with the reason it writes beside it (docs/kubernetes.md).
IMAGE_BY_TAG = {"CKV_K8S_14", "CKV_K8S_15", "CKV_K8S_43"}  # values without digests: never production
ENV_SECRET = {"CKV_K8S_35"}  # the RPC URL, the Redis password, the keystore passphrase
WORKER_ROOT = {"CKV_K8S_20", "CKV_K8S_23", "CKV_K8S_25", "CKV_K8S_37", "CKV_K8S_39", "CKV_K8S_40"}


@pytest.fixture(scope="module")
def tools() -> Path:
    if not K8S_PYTHON.exists():
        message = "the chart's tools are not installed: run `make k8s-tools`"
        if os.environ.get("INTELLECT_REQUIRE_K8S"):
            pytest.fail(message)  # .ci/run installs them and sets this: missing there is a broken set-up
        pytest.skip(message)
    return K8S_PYTHON


@pytest.fixture(scope="module")
def report(tools: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    out = tmp_path_factory.mktemp("chart")
    command = [str(tools), "-m", "deploy.check", "--out", str(out), "--json", str(out / "report.json")]
    proc = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert (out / "report.json").exists(), proc.stdout + proc.stderr
    result: dict[str, Any] = json.loads((out / "report.json").read_text())
    result["exit"], result["output"] = proc.returncode, proc.stdout + proc.stderr
    return result


@pytest.fixture(scope="module")
def rendered(report: dict[str, Any]) -> dict[str, list[dict[str, Any]]]:
    return {name: [d for d in yaml.safe_load_all(Path(s["file"]).read_text()) if d]
            for name, s in report["sets"].items()}


def find(objects: list[dict[str, Any]], kind: str, name: str) -> dict[str, Any]:
    matches = [o for o in objects if o["kind"] == kind and o["metadata"]["name"] == name]
    assert len(matches) == 1, f"{kind}/{name}: {len(matches)} found"
    return matches[0]


def pod(obj: dict[str, Any]) -> dict[str, Any]:
    spec = policy.pod_spec(obj)
    assert spec is not None
    return dict(spec)


def env_of(container: dict[str, Any]) -> dict[str, Any]:
    return {e["name"]: e.get("value", e.get("valueFrom")) for e in container.get("env", [])}


def test_every_values_set_renders_lints_validates_and_scans_clean(report: dict[str, Any]) -> None:
    assert report["problems"] == [], "\n".join(report["problems"])
    assert report["exit"] == 0, report["output"]
    assert len(report["versions"]) >= 2
    assert set(report["sets"]) == {"defaults", "production", "provider"}
    for name, result in report["sets"].items():
        assert result["objects"] > 0, name
        assert result["lint"] == [] and result["schema_errors"] == [] and result["policy"] == [], name
    scan = report["checkov"]
    assert scan["passed"] > 1000 and scan["failed"] == []
    assert all(s["reason"] and "=" not in s["reason"] for s in scan["skipped"])


def test_the_rules_hold_on_the_rendered_yaml(rendered: dict[str, list[dict[str, Any]]]) -> None:
    for name, objects in rendered.items():
        assert policy.check(objects) == [], name
        assert not [o for o in objects if o["kind"] == "Secret"], f"{name}: the chart renders no Secret"


def test_a_rendered_object_with_a_plain_secret_or_no_probe_fails(
    rendered: dict[str, list[dict[str, Any]]],
) -> None:
    objects = rendered["production"]
    orchestrator = find(objects, "Deployment", "intellect-orchestrator")
    others = [o for o in objects if o is not orchestrator]

    def broken(change: Any) -> list[policy.Finding]:
        copied = copy.deepcopy(orchestrator)
        change(pod(copied)["containers"][0])
        return policy.check([copied, *others])

    def literal_key(c: dict[str, Any]) -> None:
        next(e for e in c["env"] if e["name"] == "INTELLECT_ORCH_MANAGER_KEY")["value"] = KEY

    def password_url(c: dict[str, Any]) -> None:
        next(e for e in c["env"] if e["name"] == "INTELLECT_ORCH_REDIS_URL")["value"] = "rediss://:pw123@redis/0"

    assert [f.rule for f in broken(literal_key)] == ["plain-secret"]
    assert [f.rule for f in broken(password_url)] == ["plain-secret"]
    assert [f.rule for f in broken(lambda c: c.pop("readinessProbe"))] == ["probe"]
    assert [f.rule for f in broken(lambda c: c["securityContext"].update(runAsUser=0))] == ["non-root"]


def test_every_service_probes_its_health_route(rendered: dict[str, list[dict[str, Any]]]) -> None:
    for objects in rendered.values():
        for obj in objects:
            if obj["kind"] not in policy.LONG_RUNNING:
                continue
            for container in pod(obj)["containers"]:
                ports = {p["name"] for p in container.get("ports", [])}
                for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
                    spec = container[probe]
                    component = obj["metadata"]["labels"]["app.kubernetes.io/component"]
                    if component in {"redis", "postgres", "s3"}:  # the trial's servers: no HTTP health route
                        assert spec["tcpSocket"]["port"] in ports
                    else:
                        assert spec["httpGet"]["path"] == "/health", (obj["metadata"]["name"], probe)
                        assert spec["httpGet"]["port"] in ports


def test_orchestrator_replicas_over_external_databases(rendered: dict[str, list[dict[str, Any]]]) -> None:
    default = find(rendered["defaults"], "Deployment", "intellect-orchestrator")
    assert default["spec"]["replicas"] >= 2
    production = rendered["production"]
    hpa = find(production, "HorizontalPodAutoscaler", "intellect-orchestrator")
    assert hpa["spec"]["minReplicas"] >= 2
    assert hpa["spec"]["scaleTargetRef"]["name"] == "intellect-orchestrator"
    assert find(production, "PodDisruptionBudget", "intellect-orchestrator")["spec"]["minAvailable"] == 1
    env = env_of(pod(find(production, "Deployment", "intellect-orchestrator"))["containers"][0])
    assert env["INTELLECT_ORCH_REDIS_URL"] == "rediss://:$(REDIS_PASSWORD)@redis.pool.internal:6380/0"
    assert env["INTELLECT_ORCH_DATABASE_URL"].startswith("postgresql+psycopg://intellect@postgres.pool.internal:")
    assert env["PGPASSFILE"] == "/run/keys/pgpass" and env["INTELLECT_ORCH_MANAGER_KEY"].startswith("file:")
    assert env["INTELLECT_ORCH_RPC_URL"] == {"secretKeyRef": {"name": "intellect-chain", "key": "rpc-url"}}
    names = {o["metadata"]["name"] for o in production}
    assert not names & {"intellect-redis", "intellect-postgres", "intellect-s3"}  # the trial servers are off


def test_each_validator_has_its_own_key_and_volume(rendered: dict[str, list[dict[str, Any]]]) -> None:
    production = rendered["production"]
    for i in range(3):
        sts = find(production, "StatefulSet", f"intellect-validator-{i}")
        assert sts["spec"]["replicas"] == 1
        volumes = {v["name"]: v for v in pod(sts)["volumes"]}
        sources = volumes["secrets"]["projected"]["sources"]
        assert [s["secret"]["name"] for s in sources] == [f"intellect-validator-{i}"]  # its key alone
        assert [t["metadata"]["name"] for t in sts["spec"]["volumeClaimTemplates"]] == ["data"]
        assert env_of(pod(sts)["containers"][0])["INTELLECT_VALIDATOR_KEY"] == "file:/run/keys/validator.key"
    job = find(production, "Job", "intellect-slashing-policy")
    assert job["metadata"]["annotations"]["helm.sh/hook"] == "post-install,post-upgrade"
    container = pod(job)["containers"][0]
    assert env_of(container)["QUORUM"] == "2"
    assert [a for a in container["command"] if a.startswith("0x")] == [f"0x{d * 40}" for d in "123"]


@pytest.mark.parametrize(("values", "message"), [
    ({"validators": {"count": 2, "quorum": 3}}, "validators.quorum must be 1..2"),
    ({"validators": {"quorum": 0}}, "validators.quorum must be 1..1"),
    ({"orchestrator": {"replicas": 1}}, "orchestrator.replicas must be at least 2"),
    ({"validators": {"count": 2, "policy": {"apply": True, "addresses": ["0x" + "1" * 40]}}},
     "validators.policy.addresses must name all 2 validators"),
    ({"trial": {"redis": {"enabled": False}}}, "redis.url is required"),
])
def test_values_that_make_no_sense_fail_to_render(tools: Path, values: dict[str, Any], message: str) -> None:
    proc = subprocess.run([str(tools), "-m", "deploy.check", "render", "--set-json", json.dumps(values)],
                          cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 1 and message in proc.stderr, proc.stderr


def test_the_worker_runs_on_gpu_nodes_and_alone_as_root(rendered: dict[str, list[dict[str, Any]]]) -> None:
    provider = rendered["provider"]
    worker = find(provider, "DaemonSet", "intellect-worker")
    spec = pod(worker)
    container = spec["containers"][0]
    assert container["resources"]["limits"]["nvidia.com/gpu"] == 4
    assert spec["nodeSelector"]["nvidia.com/gpu.present"] == "true"
    assert {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"} in spec["tolerations"]
    assert container["command"][:5] == ["intellect-worker", "start", "--yes", "--runtime", "process"]
    env = env_of(container)
    assert env["INTELLECT_WORKER_TASK_ISOLATION"] == "require"
    assert env["INTELLECT_WORKER_PROVIDER_KEY"] == "file:/run/secrets-in/provider-key"
    assert container["securityContext"]["capabilities"]["drop"] == ["ALL"]
    assert worker["metadata"]["annotations"][policy.ROOT_REASON]
    everywhere = [o for objects in rendered.values() for o in objects]
    as_root = [o for o in everywhere if policy.ROOT_REASON in o["metadata"].get("annotations", {})]
    assert [o["metadata"]["name"] for o in as_root] == ["intellect-worker"]


def test_only_what_must_talk_talks(rendered: dict[str, list[dict[str, Any]]]) -> None:
    objects = rendered["defaults"]
    deny = find(objects, "NetworkPolicy", "intellect-default-deny")["spec"]
    assert deny["policyTypes"] == ["Ingress", "Egress"] and "ingress" not in deny and "egress" not in deny

    def callers(name: str) -> set[str]:
        spec = find(objects, "NetworkPolicy", f"intellect-{name}-traffic")["spec"]
        found = set()
        for rule in spec["ingress"]:
            for peer in rule["from"]:
                if "podSelector" in peer:
                    found.add(peer["podSelector"]["matchLabels"]["app.kubernetes.io/component"])
                else:
                    found.add(peer["ipBlock"]["cidr"])
        return found

    assert callers("redis") == {"discovery", "orchestrator"}
    assert callers("postgres") == {"orchestrator"}
    assert callers("validator") == {"trainer", "dashboard"}
    assert callers("dashboard") == set()  # reached by `kubectl port-forward` unless made public
    assert "0.0.0.0/0" in callers("orchestrator")  # workers heartbeat from anywhere
    narrowed = find(rendered["production"], "NetworkPolicy", "intellect-validator-traffic")["spec"]["egress"]
    assert {"ipBlock": {"cidr": "10.40.0.0/24"}} in [peer for rule in narrowed for peer in rule.get("to", [])]


def test_checkov_skips_are_only_the_documented_ones(report: dict[str, Any]) -> None:
    by_file: dict[str, set[str]] = {}
    for skip in report["checkov"]["skipped"]:
        by_file.setdefault(skip["file"], set()).add(skip["check"])
    assert by_file["production.yaml"] <= ENV_SECRET  # production pins digests: no image skip
    assert by_file["provider.yaml"] <= ENV_SECRET | WORKER_ROOT
    assert by_file["defaults.yaml"] <= IMAGE_BY_TAG
    worker_skips = {s["check"] for s in report["checkov"]["skipped"]
                    if s["resource"].endswith("intellect-worker")}
    assert worker_skips == ENV_SECRET | WORKER_ROOT
