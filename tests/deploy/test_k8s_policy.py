"""The chart's rules (deploy/policy.py) on objects made here: a good pod passes, and each way of
breaking a rule (a secret in plain text, a missing probe, root, no limits, no NetworkPolicy) fails.

The rendered chart itself is checked in test_k8s_chart.py; these run without the chart's tools."""

from __future__ import annotations

import copy
import importlib.util
import os
import stat
from pathlib import Path
from typing import Any

import pytest

from deploy import policy

KEY = "0x" + "ab" * 32  # a 32-byte hex private key, as Intellect's keys are written


def good_deployment() -> dict[str, Any]:
    container = {
        "name": "orchestrator",
        "image": "intellect-service@sha256:" + "1" * 64,
        "env": [{"name": "INTELLECT_ORCH_MANAGER_KEY", "value": "file:/run/keys/manager.key"},
                {"name": "INTELLECT_ORCH_REDIS_URL", "value": "redis://:$(REDIS_PASSWORD)@redis:6379/0"},
                {"name": "REDIS_PASSWORD", "valueFrom": {"secretKeyRef": {"name": "r", "key": "password"}}},
                {"name": "AWS_SHARED_CREDENTIALS_FILE", "value": "/run/keys/aws-credentials"}],
        "readinessProbe": {"httpGet": {"path": "/health", "port": "http"}},
        "livenessProbe": {"httpGet": {"path": "/health", "port": "http"}},
        "resources": {"requests": {"cpu": "100m", "memory": "128Mi"},
                      "limits": {"cpu": "1", "memory": "1Gi"}},
        "securityContext": {"runAsNonRoot": True, "runAsUser": 10001, "allowPrivilegeEscalation": False,
                            "readOnlyRootFilesystem": True, "capabilities": {"drop": ["ALL"]}},
    }
    return {
        "apiVersion": "apps/v1", "kind": "Deployment",
        "metadata": {"name": "orch", "namespace": "pool"},
        "spec": {"selector": {"matchLabels": {"app": "orch"}}, "template": {
            "metadata": {"labels": {"app": "orch", "part": "intellect"}},
            "spec": {"automountServiceAccountToken": False, "containers": [container]}}},
    }


def deny_all() -> dict[str, Any]:
    return {"apiVersion": "networking.k8s.io/v1", "kind": "NetworkPolicy",
            "metadata": {"name": "deny", "namespace": "pool"},
            "spec": {"podSelector": {"matchLabels": {"part": "intellect"}},
                     "policyTypes": ["Ingress", "Egress"]}}


def container_of(obj: dict[str, Any]) -> dict[str, Any]:
    container: dict[str, Any] = obj["spec"]["template"]["spec"]["containers"][0]
    return container


def rules(objects: list[dict[str, Any]]) -> set[str]:
    return {f.rule for f in policy.check(objects)}


def test_a_good_deployment_passes() -> None:
    assert policy.check([good_deployment(), deny_all()]) == []


@pytest.mark.parametrize("env", [
    {"name": "INTELLECT_ORCH_MANAGER_KEY", "value": KEY},                       # a key by name
    {"name": "INTELLECT_ORCH_ADMIN_TOKEN", "value": "s3cr3t-admin-token-value"},  # a token, no pattern
    {"name": "SOMETHING", "value": KEY[2:]},  # a key by its shape
    {"name": "INTELLECT_ORCH_DATABASE_URL", "value": "postgresql://pool:hunter2@db/pool"},  # a URL password
    {"name": "DB_PASSWORD", "valueFrom": {"configMapKeyRef": {"name": "cm", "key": "pw"}}},  # a ConfigMap
])
def test_a_secret_in_plain_text_fails(env: dict[str, Any]) -> None:
    bad = good_deployment()
    container_of(bad)["env"].append(env)
    findings = policy.check([bad, deny_all()])
    assert [f.rule for f in findings] == ["plain-secret"], findings
    assert env["name"] in findings[0].detail


def test_a_key_in_the_command_line_fails() -> None:
    bad = good_deployment()
    container_of(bad)["args"] = ["--private-key", KEY]
    assert rules([bad, deny_all()]) == {"plain-secret"}


def test_secret_objects_and_configmaps_with_secrets_fail() -> None:
    secret = {"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "keys", "namespace": "pool"},
              "data": {"manager-key": "MHhhYg=="}}
    named = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "cm", "namespace": "pool"},
             "data": {"admin-token": "x"}}
    shaped = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "cm2", "namespace": "pool"},
              "data": {"settings.env": f"INTELLECT_VALIDATOR_KEY={KEY}\n"}}
    pem = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "cm3", "namespace": "pool"},
           "data": {"tls": "-----BEGIN EC PRIVATE KEY-----\nMHc...\n-----END EC PRIVATE KEY-----\n"}}
    findings = policy.check([secret, named, shaped, pem])
    assert sorted(f.object for f in findings) == [
        "ConfigMap/cm", "ConfigMap/cm2", "ConfigMap/cm3", "Secret/keys"]
    assert {f.rule for f in findings} == {"plain-secret"}
    # a Secret the chart only names (no data in the YAML) and public addresses are fine
    empty = {"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "ref", "namespace": "pool"}}
    public = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "chain", "namespace": "pool"},
              "data": {"deployment.json": '{"addresses": {"ComputePool": "0x' + "12" * 20 + '"}}'}}
    assert policy.check([empty, public]) == []


def test_image_digests_are_not_keys() -> None:
    ok = good_deployment()
    container_of(ok)["env"].append({"name": "IMAGE", "value": "intellect-workload@sha256:" + "ab" * 32})
    assert policy.check([ok, deny_all()]) == []


@pytest.mark.parametrize("probe", ["readinessProbe", "livenessProbe"])
def test_a_missing_probe_fails(probe: str) -> None:
    bad = good_deployment()
    del container_of(bad)[probe]
    findings = policy.check([bad, deny_all()])
    assert [(f.rule, f.detail) for f in findings] == [("probe", f"container orchestrator has no {probe}")]


def test_jobs_need_no_probes() -> None:
    job = good_deployment()
    job["kind"], job["apiVersion"] = "Job", "batch/v1"
    for probe in ("readinessProbe", "livenessProbe"):
        del container_of(job)[probe]
    assert policy.check([job, deny_all()]) == []


@pytest.mark.parametrize("change", [
    {"runAsUser": 0},
    {"runAsNonRoot": False},
    {"allowPrivilegeEscalation": True},
    {"readOnlyRootFilesystem": False},
    {"capabilities": {"drop": ["NET_RAW"]}},
])
def test_root_and_its_relatives_fail(change: dict[str, Any]) -> None:
    bad = good_deployment()
    container_of(bad)["securityContext"].update(change)
    assert rules([bad, deny_all()]) == {"non-root"}


def test_root_with_a_stated_reason_passes_but_never_privileged() -> None:
    root = good_deployment()
    container_of(root)["securityContext"] = {"runAsUser": 0, "capabilities": {"add": ["SYS_ADMIN"]}}
    assert rules([root, deny_all()]) == {"non-root"}
    root["metadata"]["annotations"] = {policy.ROOT_REASON: ""}
    assert rules([root, deny_all()]) == {"non-root"}  # an empty reason is no reason
    root["metadata"]["annotations"] = {policy.ROOT_REASON: "confines its tasks in namespaces"}
    assert policy.check([root, deny_all()]) == []
    container_of(root)["securityContext"]["privileged"] = True
    assert rules([root, deny_all()]) == {"non-root"}


def test_init_containers_are_held_to_the_same_rules() -> None:
    bad = good_deployment()
    init = copy.deepcopy(container_of(bad))
    init["name"] = "keys"
    del init["resources"]["limits"]
    init["securityContext"]["runAsUser"] = 0
    bad["spec"]["template"]["spec"]["initContainers"] = [init]
    assert rules([bad, deny_all()]) == {"resources", "non-root"}


def test_a_pod_without_limits_a_token_or_a_network_policy_fails() -> None:
    bad = good_deployment()
    del container_of(bad)["resources"]["limits"]["memory"]
    bad["spec"]["template"]["spec"]["automountServiceAccountToken"] = True
    findings = policy.check([bad])
    assert {f.rule for f in findings} == {"resources", "api-token", "network-policy"}
    ingress_only = deny_all()
    ingress_only["spec"]["policyTypes"] = ["Ingress"]
    assert [f.detail for f in policy.check([good_deployment(), ingress_only])] == [
        "no NetworkPolicy governs its pods' egress"]
    other_namespace = deny_all()
    other_namespace["metadata"]["namespace"] = "elsewhere"
    assert rules([good_deployment(), other_namespace]) == {"network-policy"}


def test_selectors() -> None:
    labels = {"app": "orch", "tier": "api"}
    assert policy.selects({}, labels)
    def expression(op: str) -> dict[str, Any]:
        return {"matchExpressions": [{"key": "tier", "operator": op, "values": ["api"]}]}

    assert policy.selects(expression("In"), labels)
    assert not policy.selects(expression("NotIn"), labels)
    assert not policy.selects({"matchLabels": {"app": "other"}}, labels)


# ---- the chart's init script (deploy/helm/intellect/files/keys.py), run as the pods run it ----

def keys_script() -> Any:
    path = Path(__file__).resolve().parents[2] / "deploy" / "helm" / "intellect" / "files" / "keys.py"
    spec = importlib.util.spec_from_file_location("chart_keys", path)
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_init_script_writes_private_files_in_each_format(tmp_path: Path) -> None:
    keys = keys_script()
    src = tmp_path / "in"
    src.mkdir()
    (src / "key").write_text(KEY + "\n")
    (src / "pw").write_text("pa:ss\\word\n")
    (src / "id").write_text("AKID\n")
    (src / "secret").write_text("SECRET\n")
    out = tmp_path / "out"
    specs = [f"copy:{src}/key:{out}/state/manager.key", f"pgpass:{src}/pw:{out}/pgpass",
             f"aws:{src}/id,{src}/secret:{out}/aws", f"seaweedfs:{src}/id,{src}/secret:{out}/s3.json"]
    assert keys.main(specs) == 0
    assert keys.main(specs) == 0  # a restarted init container rewrites its own 0400 files
    assert (out / "state" / "manager.key").read_text() == KEY + "\n"
    assert (out / "pgpass").read_text() == "*:*:*:*:pa\\:ss\\\\word\n"
    assert "aws_secret_access_key = SECRET" in (out / "aws").read_text()
    assert '"secretKey": "SECRET"' in (out / "s3.json").read_text()
    for name in ("state/manager.key", "pgpass", "aws", "s3.json"):
        assert stat.S_IMODE(os.stat(out / name).st_mode) == 0o400, name
    with pytest.raises(SystemExit, match="unknown kind"):
        keys.main([f"plain:{src}/key:{out}/x"])
