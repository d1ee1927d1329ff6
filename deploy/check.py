"""Render the Helm chart and check what it renders, offline: `make k8s-tools` installs what it needs.

    .venv-k8s/bin/python -m deploy.check [--out DIR] [--json REPORT]   # everything below, exit 1 on a problem
    .venv-k8s/bin/python -m deploy.check render [VALUES.yaml] [--set-json JSON]   # the YAML, or the error

For each values set (the chart's defaults, ci/production-values.yaml, ci/provider-values.yaml):
1. `helm lint --strict` and the render, both by Helm's own Go SDK (the helm-python-sdk wheel);
2. every rendered object against the Kubernetes API's JSON schemas of each version in
   KUBE_VERSIONS, strict (an unknown field is an error), by kubernetes-validate;
3. the chart's rules (deploy/policy.py: no secret in plain text, probes, non-root, resources, ...);
4. checkov's Kubernetes checks over the rendered files: no failed check, and every skip the chart
   annotates carries its reason.
No cluster is contacted: nothing here can say the pods start, only that the objects are what a
cluster accepts and what the rules ask.
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import subprocess
import sys
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import yaml

from deploy import policy

CHART = Path(__file__).resolve().parent / "helm" / "intellect"
VALUE_SETS: dict[str, Path | None] = {
    "defaults": None,
    "production": CHART / "ci" / "production-values.yaml",
    "provider": CHART / "ci" / "provider-values.yaml",
}
KUBE_VERSIONS = ("1.30.0", "1.33.0", "1.37.0")
"""The oldest Kubernetes the chart supports (Chart.yaml kubeVersion), one between, and the newest
that kubernetes-validate bundles."""
RELEASE, NAMESPACE = "intellect", "intellect"
CHECKOV_ENV = {"BC_SKIP_MAPPING": "TRUE", "CHECKOV_NO_VERSION_CHECK": "1", "LOG_LEVEL": "ERROR"}
"""checkov offline: no guideline download, no version check (no network here, nor in CI)."""


def load_values(path: Path | None, extra: Mapping[str, Any] | None = None) -> dict[str, Any]:
    values: dict[str, Any] = (yaml.safe_load(path.read_text()) or {}) if path else {}
    return merge(values, dict(extra or {}))


def merge(base: dict[str, Any], override: dict[str, Any]) -> dict[str, Any]:
    out = dict(base)
    for key, value in override.items():
        nested = isinstance(value, dict) and isinstance(out.get(key), dict)
        out[key] = merge(out[key], value) if nested else value
    return out


def render_text(values: dict[str, Any]) -> str:
    """The chart rendered for `values` (over the chart's defaults), as `helm template` prints it."""
    import helm_python

    chart = helm_python.Chart.load(str(CHART))
    manifests = chart.render(values, name=RELEASE, namespace=NAMESPACE, is_install=True)
    parts = [f"---\n# Source: {path}\n{text.strip()}\n" for path, text in sorted(manifests.items())
             if path.endswith((".yaml", ".yml")) and text.strip()]  # not NOTES.txt
    return "".join(parts)


def objects_of(text: str) -> list[dict[str, Any]]:
    return [doc for doc in yaml.safe_load_all(text) if doc]


def render(values: dict[str, Any]) -> list[dict[str, Any]]:
    """The chart's objects for `values`."""
    return objects_of(render_text(values))


def lint(values: dict[str, Any]) -> list[str]:
    import helm_python

    report = helm_python.lint(str(CHART), values, strict=True, namespace=NAMESPACE)
    messages = [f"{m['path']}: {m['error']}" for m in report.get("messages", []) if m.get("severity", 0) >= 2]
    return messages + list(report.get("errors") or [])


def validate_schemas(objects: list[dict[str, Any]], versions: tuple[str, ...] = KUBE_VERSIONS) -> list[str]:
    """One line per object that a version's API schema (strict) refuses; an unknown kind is refused too."""
    import kubernetes_validate
    from kubernetes_validate import utils

    # The library reads and parses a version's definitions (megabytes) for every object: once is enough.
    if not hasattr(utils.schema_contents, "cache_info"):
        utils.schema_contents = functools.lru_cache(maxsize=None)(utils.schema_contents)
    errors: list[str] = []
    for version in versions:
        for obj in objects:
            try:
                kubernetes_validate.validate(obj, version, strict=True)
            except kubernetes_validate.ValidationError as exc:
                where = ".".join(str(p) for p in exc.path)
                errors.append(f"{version}: {policy.name_of(obj)}: {where}: {exc.message}")
            except kubernetes_validate.SchemaNotFoundError as exc:
                errors.append(f"{version}: {policy.name_of(obj)}: {exc.message}")
    return errors


def checkov(files: list[Path]) -> dict[str, Any]:
    """checkov's Kubernetes checks over rendered files: its failed checks, and the skips it honoured."""
    binary = Path(sys.executable).with_name("checkov")
    cmd = [str(binary), "--framework", "kubernetes", "--skip-download", "--compact", "-o", "json"]
    for f in files:
        cmd += ["-f", str(f)]
    proc = subprocess.run(cmd, capture_output=True, text=True, env=os.environ | CHECKOV_ENV, timeout=300)
    try:
        data = json.loads(proc.stdout)
    except json.JSONDecodeError:
        return {"error": f"checkov exit {proc.returncode}: {proc.stderr[-2000:] or proc.stdout[-2000:]}"}
    reports = data if isinstance(data, list) else [data]
    failed: list[dict[str, str]] = []
    skipped: list[dict[str, str]] = []
    passed = 0
    for report in reports:
        results = report.get("results") or {}
        passed += int((report.get("summary") or {}).get("passed", 0))
        for check in results.get("failed_checks") or []:
            failed.append({"check": check["check_id"], "name": check.get("check_name", ""),
                           "resource": check.get("resource", ""),
                           "file": Path(str(check.get("file_path", ""))).name})
        for check in results.get("skipped_checks") or []:
            skipped.append({"check": check["check_id"], "resource": check.get("resource", ""),
                            "file": Path(str(check.get("file_path", ""))).name,
                            "reason": str((check.get("check_result") or {}).get("suppress_comment") or "")
                            .strip()})
    return {"passed": passed, "failed": failed, "skipped": skipped}


def check_all(out: Path) -> dict[str, Any]:
    """Everything in the module's docstring, for every values set; the rendered YAML lands in `out`."""
    out.mkdir(parents=True, exist_ok=True)
    report: dict[str, Any] = {"versions": list(KUBE_VERSIONS), "sets": {}, "seconds": {}}
    files: list[Path] = []
    started = time.monotonic()
    for name, path in VALUE_SETS.items():
        values = load_values(path)
        text = render_text(values)
        objects = objects_of(text)
        target = out / f"{name}.yaml"
        target.write_text(text)
        files.append(target)
        report["sets"][name] = {
            "file": str(target),
            "objects": len(objects),
            "kinds": sorted({f"{o['kind']}/{o['metadata']['name']}" for o in objects}),
            "lint": lint(values),
            "schema_errors": validate_schemas(objects),
            "policy": [str(f) for f in policy.check(objects)],
        }
    report["seconds"]["render_lint_schemas_policy"] = round(time.monotonic() - started, 2)
    started = time.monotonic()
    report["checkov"] = checkov(files)
    report["seconds"]["checkov"] = round(time.monotonic() - started, 2)
    report["problems"] = problems(report)
    return report


def problems(report: dict[str, Any]) -> list[str]:
    found: list[str] = []
    for name, result in report["sets"].items():
        found += [f"{name}: lint: {m}" for m in result["lint"]]
        found += [f"{name}: schema: {m}" for m in result["schema_errors"]]
        found += [f"{name}: policy: {m}" for m in result["policy"]]
    scan = report["checkov"]
    if "error" in scan:
        found.append(f"checkov: {scan['error']}")
    found += [f"checkov: {f['check']} {f['name']}: {f['resource']} ({f['file']})"
              for f in scan.get("failed", [])]
    found += [f"checkov: skip of {s['check']} on {s['resource']} has no reason"
              for s in scan.get("skipped", []) if not s["reason"]]
    return found


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m deploy.check", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command")
    one = sub.add_parser("render", help="print the rendered YAML of one values file (or the error)")
    one.add_argument("values", nargs="?", type=Path, help="values file (default: the chart's defaults)")
    one.add_argument("--set-json", default="{}", help="values merged over the file, as JSON")
    parser.add_argument("--out", type=Path, default=Path("/tmp/intellect-chart"), help="rendered YAML here")
    parser.add_argument("--json", type=Path, help="write the whole report here as JSON")
    args = parser.parse_args(argv)
    if args.command == "render":
        import helm_python

        try:
            text = render_text(load_values(args.values, json.loads(args.set_json)))
        except helm_python.HelmError as exc:
            print(f"render failed: {exc}", file=sys.stderr)
            return 1
        print(text, end="")
        return 0
    report = check_all(args.out)
    if args.json:
        args.json.write_text(json.dumps(report, indent=1))
    for name, result in report["sets"].items():
        print(f"{name}: {result['objects']} objects; schemas of Kubernetes {', '.join(report['versions'])}")
    scan = report["checkov"]
    print(f"checkov: {scan.get('passed', 0)} passed, {len(scan.get('failed', []))} failed, "
          f"{len(scan.get('skipped', []))} skipped (each with its reason)")
    for line in report["problems"]:
        print("PROBLEM", line)
    return 1 if report["problems"] else 0


if __name__ == "__main__":
    sys.exit(main())
