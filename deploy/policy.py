"""The chart's rules, checked on rendered Kubernetes objects (plain dicts, as YAML loads them).

`check(objects)` returns one `Finding` per broken rule; an empty list means the objects keep them:

- `plain-secret`: no secret value in the rendered YAML. A Secret object carrying data, a ConfigMap
  key named like a secret or holding a key-like value, a container variable named like a secret
  with a literal value (a `file:` reference or a path is fine), a secret-named variable taken from
  a ConfigMap, and any literal that looks like a private key, a PEM key or a URL with a password.
- `probe`: every long-running container (Deployment, StatefulSet, DaemonSet) has a liveness and a
  readiness probe.
- `non-root`: every container runs as non-root with no privilege escalation, every capability
  dropped and a read-only root filesystem; never privileged. An object that must run as root says
  why in its `intellect/root-reason` annotation, and only those rules are waived for it.
- `resources`: every container, init containers too, has CPU and memory requests and limits.
- `api-token`: no pod mounts a service account token (none of them talks to the Kubernetes API).
- `network-policy`: every pod is selected by a NetworkPolicy that governs both its ingress and its
  egress.

Standard library only: the tests run it in the project's environment, `deploy/check.py` beside the
renderer.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

ROOT_REASON = "intellect/root-reason"
"""Annotation of a workload object that must run as root; its value says why (never empty)."""

WORKLOADS = frozenset({"Deployment", "StatefulSet", "DaemonSet", "ReplicaSet", "Job", "CronJob", "Pod"})
LONG_RUNNING = frozenset({"Deployment", "StatefulSet", "DaemonSet", "ReplicaSet"})

# A name that says "secret": KEY, TOKEN, PASSWORD... as a whole word of an environment variable
# (INTELLECT_ORCH_MANAGER_KEY, DB_PASSWORD) or of a ConfigMap key (admin-token, manager.key).
SECRET_NAME = re.compile(
    r"(^|[-_.])(key|private[-_]?key|token|password|passwd|secret|passphrase|mnemonic|credentials?|api[-_]?key)"
    r"($|[-_.])",
    re.IGNORECASE,
)
PRIVATE_KEY = re.compile(r"(?<![0-9a-fA-F])(?<!sha256:)(0x)?[0-9a-fA-F]{64}(?![0-9a-fA-F])")
PEM_KEY = re.compile(r"-----BEGIN [A-Z ]*PRIVATE KEY-----")
URL_PASSWORD = re.compile(r"[a-zA-Z][a-zA-Z0-9+.-]*://[^/\s:@]*:(?P<password>[^@\s/]+)@")
ENV_REFERENCE = re.compile(r"^\$\([A-Za-z_][A-Za-z0-9_]*\)$")


@dataclass(frozen=True)
class Finding:
    rule: str
    object: str
    detail: str

    def __str__(self) -> str:
        return f"{self.rule}: {self.object}: {self.detail}"


def check(objects: Iterable[Mapping[str, Any]]) -> list[Finding]:
    """Every broken rule of `objects` (rendered manifests), in a stable order."""
    items = [o for o in objects if isinstance(o, Mapping) and o.get("kind")]
    findings: list[Finding] = []
    for obj in items:
        findings += _secrets_in_object(obj)
        pod = pod_spec(obj)
        if pod is not None:
            findings += _pod_rules(obj, pod)
    findings += _network_rules(items)
    return findings


def name_of(obj: Mapping[str, Any]) -> str:
    return f"{obj.get('kind')}/{(obj.get('metadata') or {}).get('name', '?')}"


def pod_spec(obj: Mapping[str, Any]) -> Mapping[str, Any] | None:
    """The pod spec of a workload object (None for anything else)."""
    kind = obj.get("kind")
    if kind not in WORKLOADS:
        return None
    spec = obj.get("spec") or {}
    if kind == "Pod":
        return spec
    if kind == "CronJob":
        spec = (spec.get("jobTemplate") or {}).get("spec") or {}
    return ((spec.get("template") or {}).get("spec")) or {}


def pod_labels(obj: Mapping[str, Any]) -> Mapping[str, str]:
    if obj.get("kind") == "Pod":
        return (obj.get("metadata") or {}).get("labels") or {}
    spec = obj.get("spec") or {}
    if obj.get("kind") == "CronJob":
        spec = (spec.get("jobTemplate") or {}).get("spec") or {}
    return ((spec.get("template") or {}).get("metadata") or {}).get("labels") or {}


def containers(pod: Mapping[str, Any], *, init: bool = True) -> Iterator[Mapping[str, Any]]:
    yield from pod.get("containers") or []
    if init:
        yield from pod.get("initContainers") or []


# ---- plain-secret ----

def secret_like_value(text: str) -> str | None:
    """Why `text` looks like a secret value, or None."""
    if PEM_KEY.search(text):
        return "a PEM private key"
    if PRIVATE_KEY.search(text):
        return "a 32-byte hex key"
    match = URL_PASSWORD.search(text)
    if match and not ENV_REFERENCE.match(match.group("password")):
        return "a URL with a password"
    return None


def _literal_is_reference(value: str) -> bool:
    """A value that names where a secret is, not the secret: file:PATH, a path, $(VAR), or nothing."""
    return value == "" or value.startswith(("file:", "/")) or bool(ENV_REFERENCE.match(value))


def _secrets_in_object(obj: Mapping[str, Any]) -> list[Finding]:
    where = name_of(obj)
    kind = obj.get("kind")
    found: list[Finding] = []
    if kind == "Secret" and (obj.get("data") or obj.get("stringData")):
        keys = sorted({*(obj.get("data") or {}), *(obj.get("stringData") or {})})
        found.append(Finding("plain-secret", where, f"a Secret with values in the rendered YAML "
                             f"({', '.join(keys)}): reference an existing Secret instead"))
    if kind == "ConfigMap":
        for key, value in {**(obj.get("data") or {}), **(obj.get("binaryData") or {})}.items():
            if SECRET_NAME.search(str(key)):
                found.append(Finding("plain-secret", where, f"ConfigMap key {key!r} is named like a secret"))
            why = secret_like_value(str(value))
            if why:
                found.append(Finding("plain-secret", where, f"ConfigMap key {key!r} holds {why}"))
    pod = pod_spec(obj)
    if pod is not None:
        for container in containers(pod):
            found += _secrets_in_container(where, container)
    return found


def _secrets_in_container(where: str, container: Mapping[str, Any]) -> list[Finding]:
    found: list[Finding] = []
    cname = container.get("name", "?")
    for env in container.get("env") or []:
        name = str(env.get("name", ""))
        if "value" in env:
            value = str(env.get("value") if env.get("value") is not None else "")
            why = secret_like_value(value)
            if SECRET_NAME.search(name) and not _literal_is_reference(value):
                found.append(Finding("plain-secret", where, f"container {cname}: {name} is a literal value: "
                                     "take it from a Secret (secretKeyRef or a file: reference)"))
            elif why:
                found.append(Finding("plain-secret", where, f"container {cname}: {name} holds {why}"))
        source = env.get("valueFrom") or {}
        if "configMapKeyRef" in source and SECRET_NAME.search(name):
            found.append(Finding("plain-secret", where, f"container {cname}: {name} comes from a ConfigMap"))
    for part in ("command", "args"):
        for arg in container.get(part) or []:
            why = secret_like_value(str(arg))
            if why:
                found.append(Finding("plain-secret", where, f"container {cname}: its {part} hold {why}"))
    return found


# ---- pods: probes, non-root, resources, token ----

def _pod_rules(obj: Mapping[str, Any], pod: Mapping[str, Any]) -> list[Finding]:
    where = name_of(obj)
    found: list[Finding] = []
    if obj.get("kind") in LONG_RUNNING:
        for container in containers(pod, init=False):
            for probe in ("livenessProbe", "readinessProbe"):
                if not container.get(probe):
                    found.append(Finding("probe", where, f"container {container.get('name')} has no {probe}"))
    annotations = (obj.get("metadata") or {}).get("annotations") or {}
    root_reason = str(annotations.get(ROOT_REASON) or "").strip()
    if ROOT_REASON in annotations and not root_reason:
        found.append(Finding("non-root", where, f"{ROOT_REASON} is empty: say why it must run as root"))
    pod_ctx = pod.get("securityContext") or {}
    for container in containers(pod):
        found += _container_security(where, pod_ctx, container, waived=bool(root_reason))
        found += _container_resources(where, container)
    if pod.get("automountServiceAccountToken") is not False:
        found.append(Finding("api-token", where, "automountServiceAccountToken is not false: no pod here "
                             "calls the Kubernetes API"))
    return found


def _container_security(where: str, pod_ctx: Mapping[str, Any], container: Mapping[str, Any], *,
                        waived: bool) -> list[Finding]:
    ctx = container.get("securityContext") or {}
    cname = container.get("name", "?")

    def effective(field: str) -> Any:
        return ctx[field] if field in ctx else pod_ctx.get(field)

    problems: list[str] = []
    if ctx.get("privileged"):
        problems.append("privileged")  # never waived
    if not waived:
        if effective("runAsNonRoot") is not True:
            problems.append("runAsNonRoot is not true")
        if effective("runAsUser") == 0:
            problems.append("runAsUser is 0")
        if ctx.get("allowPrivilegeEscalation") is not False:
            problems.append("allowPrivilegeEscalation is not false")
        if "ALL" not in ((ctx.get("capabilities") or {}).get("drop") or []):
            problems.append("capabilities do not drop ALL")
        if ctx.get("readOnlyRootFilesystem") is not True:
            problems.append("the root filesystem is writable")
    return [Finding("non-root", where, f"container {cname}: {p}") for p in problems]


def _container_resources(where: str, container: Mapping[str, Any]) -> list[Finding]:
    resources = container.get("resources") or {}
    missing = [f"{part}.{what}" for part in ("requests", "limits") for what in ("cpu", "memory")
               if not (resources.get(part) or {}).get(what)]
    if not missing:
        return []
    return [Finding("resources", where, f"container {container.get('name')} has no {', '.join(missing)}")]


# ---- network policies ----

def selects(selector: Mapping[str, Any] | None, labels: Mapping[str, str]) -> bool:
    """Whether a label selector matches `labels` (matchLabels and the matchExpressions operators)."""
    selector = selector or {}
    if any(labels.get(k) != v for k, v in (selector.get("matchLabels") or {}).items()):
        return False
    for expr in selector.get("matchExpressions") or []:
        key, op, values = expr.get("key"), expr.get("operator"), expr.get("values") or []
        ok = {"In": labels.get(key) in values, "NotIn": labels.get(key) not in values,
              "Exists": key in labels, "DoesNotExist": key not in labels}.get(op, False)
        if not ok:
            return False
    return True


def _network_rules(items: list[Mapping[str, Any]]) -> list[Finding]:
    policies = [p for p in items if p.get("kind") == "NetworkPolicy"]
    found: list[Finding] = []
    for obj in items:
        if pod_spec(obj) is None:
            continue
        labels = pod_labels(obj)
        namespace = (obj.get("metadata") or {}).get("namespace")
        governed: set[str] = set()
        for policy in policies:
            if (policy.get("metadata") or {}).get("namespace") != namespace:
                continue
            spec = policy.get("spec") or {}
            if selects(spec.get("podSelector"), labels):
                governed.update(spec.get("policyTypes") or ["Ingress"])
        for direction in ("Ingress", "Egress"):
            if direction not in governed:
                found.append(Finding("network-policy", name_of(obj),
                                     f"no NetworkPolicy governs its pods' {direction.lower()}"))
    return found
