"""docker-compose.yml brought up for real, as the README shows it: `intellect compose env`, then
`docker-compose up -d` with the locally built images (`make images`). The chain is deployed by the
compose job, both workers join the pool, validator, trainer and broadcast origin answer, a task
posted with the SDK (the real inference workload, one batch) runs in a container started by each
worker through the host's engine, its rollout files go on chain and the validator accepts them; then
the RL task file docs/compose.md prints runs until the trainer has taken two steps on accepted files;
`docker-compose down -v` leaves no container, volume or task container behind.

Needs a Docker engine, Debian's docker-compose (or `docker compose`) and the RL images; without them
the test skips with the reason, unless INTELLECT_REQUIRE_DOCKER=1 (CI), where it fails."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

import httpx
import pytest

from intellect.client import OrchestratorClient
from tests.support.testing import docker_problem

REPO = Path(__file__).resolve().parents[2]
SERVICE_IMAGE = "intellect-service:latest"
WORKLOAD_IMAGE = "intellect-workload:latest"


def compose_command() -> list[str] | None:
    if shutil.which("docker-compose"):
        return ["docker-compose"]
    probe = subprocess.run(["docker", "compose", "version"], capture_output=True)
    return ["docker", "compose"] if probe.returncode == 0 else None


def problem() -> str | None:
    if compose_command() is None:
        return "neither docker-compose nor `docker compose` is installed (scripts/ci-docker.sh installs it)"
    return docker_problem(SERVICE_IMAGE) or docker_problem(WORKLOAD_IMAGE)


@pytest.fixture
def requirements() -> None:
    reason = problem()
    if reason is None:
        return
    if os.environ.get("INTELLECT_REQUIRE_DOCKER") == "1":
        pytest.fail(f"compose test cannot run: {reason} (run make docker && make images)")
    pytest.skip(reason)


STALE_SECONDS = 2 * 3600  # far past this test's own timeout: no run of it still owns such a project


def remove_stale_projects() -> list[str]:
    """Projects an earlier run of this test left behind (a runner killed before its `down`): their
    services restart forever (`restart: unless-stopped`) and take the cores every later test needs.
    Seen: one killed with its session crash-looped for three hours beside the next suite."""
    listed = subprocess.run(["docker", "ps", "-a", "--filter", "label=com.docker.compose.project",
                             "--format", '{{.Label "com.docker.compose.project"}} {{.ID}}'],
                            capture_output=True, text=True).stdout.split("\n")  # fmt: skip
    projects = {line.split()[0] for line in listed if line.startswith("intellect-test-")}
    removed = []
    for project in sorted(projects):
        ids = docker_ids("ps", f"com.docker.compose.project={project}")
        created = subprocess.run(["docker", "inspect", "--format", "{{.Created}}", *ids], capture_output=True,
                                 text=True).stdout.split()  # fmt: skip
        ages = [time.time() - _unix(stamp) for stamp in created]
        if ages and min(ages) > STALE_SECONDS:
            subprocess.run(["docker", "rm", "-f", *ids], capture_output=True)
            volumes = docker_ids("volume", f"com.docker.compose.project={project}")
            if volumes:
                subprocess.run(["docker", "volume", "rm", *volumes], capture_output=True)
            removed.append(project)
    return removed


def _unix(stamp: str) -> float:
    from datetime import datetime

    return datetime.fromisoformat(stamp[:26].rstrip("Z") + "+00:00").timestamp()


def read_env(path: Path) -> dict[str, str]:
    lines = path.read_text().splitlines()
    return dict(line.split("=", 1) for line in lines if "=" in line and not line.startswith("#"))


def docker_ids(kind: str, label: str) -> list[str]:
    """Containers (`ps`) or volumes (`volume`) carrying `label`, running or not."""
    argv = ["docker", "ps", "-aq"] if kind == "ps" else ["docker", "volume", "ls", "-q"]
    found = subprocess.run([*argv, "--filter", f"label={label}"], capture_output=True, text=True)
    return found.stdout.split()


def wait(what: str, predicate, timeout: float):  # noqa: ANN001, ANN201
    deadline = time.monotonic() + timeout
    last: object = None
    while time.monotonic() < deadline:
        try:
            last = predicate()
            if last:
                return last
        except (httpx.HTTPError, subprocess.CalledProcessError) as exc:
            last = exc
        time.sleep(1)
    raise AssertionError(f"timed out after {timeout}s waiting for {what} (last: {last!r})")


def compose_doc_task(ports: dict[str, str]) -> dict:
    """The RL task file of docs/compose.md, with this stack's trainer and broadcast ports."""
    text = (REPO / "docs" / "compose.md").read_text()
    block = text.split("```json\n", 1)[1].split("```", 1)[0]
    block = block.replace("127.0.0.1:8092", f"127.0.0.1:{ports['TRAINER_PORT']}")
    block = block.replace("127.0.0.1:8093", f"127.0.0.1:{ports['BROADCAST_PORT']}")
    return json.loads(block)


@pytest.mark.timeout(1500)
def test_compose_up_runs_a_task_and_down_leaves_nothing(requirements: None, tmp_path: Path) -> None:
    remove_stale_projects()
    env_file = tmp_path / "compose.env"
    intellect = str(Path(sys.executable).parent / "intellect")
    made = subprocess.run([intellect, "compose", "env", "--out", str(env_file), "--free-ports"],
                          capture_output=True, text=True)  # fmt: skip
    assert made.returncode == 0, made.stderr
    ports = read_env(env_file)
    project = f"intellect-test-{uuid.uuid4().hex[:8]}"
    # A short root: each worker's bridge socket lives under its state dir only while that path fits
    # AF_UNIX's 107 bytes, else in the worker container's own /tmp, which the host's engine cannot
    # mount into the task container (seen under a pytest-xdist worker's longer tmp_path).
    root = Path(tempfile.mkdtemp(prefix="icr-", dir="/tmp"))
    shell_env = {**os.environ, "INTELLECT_COMPOSE_ROOT": str(root), "INTELLECT_COMPOSE_ENV": str(env_file)}
    compose = [*(compose_command() or []), "-p", project, "--env-file", str(env_file),
               "-f", str(REPO / "docker-compose.yml")]  # fmt: skip

    def run(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        return subprocess.run([*compose, *args], capture_output=True, text=True, env=shell_env, cwd=tmp_path,
                              check=check, timeout=600)  # fmt: skip

    task_id: str | None = None
    try:
        up = run("up", "-d", check=False)
        assert up.returncode == 0, up.stderr[-3000:]
        orchestrator = f"http://127.0.0.1:{ports['ORCHESTRATOR_PORT']}"
        up_ok = lambda: httpx.get(f"{orchestrator}/health", timeout=2).status_code == 200  # noqa: E731
        wait("the orchestrator", up_ok, 240)
        token = run("exec", "-T", "orchestrator", "cat", "/state/orchestrator/admin-token").stdout.strip()
        with OrchestratorClient(orchestrator, token=token) as client:
            healthy = lambda: sum(n.state == "Healthy" for n in client.nodes().nodes) == 2  # noqa: E731
            wait("both workers Healthy", healthy, 300)
            # The real inference workload from the workload image, one batch: a rollout file uploaded,
            # submitted on chain and judged by the validator with the task's own settings (the
            # workload plug-in, found through the image's entry points).
            env = {"INTELLECT_INFER_NODE_ADDRESS": "${NODE_ADDRESS}"}
            workload = {"type": "inference", "settings": {"max_batches": 1, "batch_size": 4}}
            task = client.submit({"name": "compose-rollouts", "image": WORKLOAD_IMAGE, "env_vars": env,
                                  "workload": workload})
            task_id = task.id
            done = client.wait(task.id, "completed", nodes=2, timeout=300, poll=1)
            assert done.count("completed") == 2  # type: ignore[arg-type]
        validator = f"http://127.0.0.1:{ports['VALIDATOR_PORT']}"

        def judged() -> list[dict]:
            items = httpx.get(f"{validator}/verdicts", timeout=5).json()["items"]
            return items if len(items) == 2 else []

        verdicts = wait("the validator's two verdicts", judged, 240)
        assert [v["verdict"] for v in verdicts] == ["accept", "accept"], verdicts

        # A short RL run from the task file docs/compose.md prints (its ports made this stack's): the
        # workers' task containers follow the trainer's step and fetch checkpoints from the broadcast,
        # on loopback, and the trainer steps on the files the validator accepted.
        with OrchestratorClient(orchestrator, token=token) as client:
            client.delete(task_id)
            rl_task = client.submit(compose_doc_task(ports))
            task_id = rl_task.id
            trainer = f"http://127.0.0.1:{ports['TRAINER_PORT']}"
            stepped = lambda: httpx.get(f"{trainer}/step", timeout=5).json()["step"] >= 2  # noqa: E731
            wait("the trainer's step 2", stepped, 600)
            page = httpx.get(f"{validator}/verdicts", params={"limit": 1000}, timeout=5).json()
            accepted = [v for v in page["items"] if v["verdict"] == "accept"]
            assert len(accepted) > 2  # files of the RL task judged and accepted beyond the first batch
        for name in ("DASHBOARD", "VALIDATOR", "TRAINER", "BROADCAST"):  # the learning side is up too
            url = f"http://127.0.0.1:{ports[name + '_PORT']}/health"
            wait(name.lower(), lambda url=url: httpx.get(url, timeout=2).status_code == 200, 240)
    finally:
        logs = run("logs", "--no-color", "--tail", "40", check=False).stdout
        down = run("down", "-v", "--remove-orphans", check=False)
        shutil.rmtree(root, ignore_errors=True)
    assert down.returncode == 0, down.stderr
    left = docker_ids("ps", f"com.docker.compose.project={project}")
    assert left == [], f"containers left behind: {left}\n{logs[-3000:]}"
    assert docker_ids("volume", f"com.docker.compose.project={project}") == []
    if task_id is not None:  # the workers stopped and removed their task container on the way down
        assert docker_ids("ps", f"org.intellect.task_id={task_id}") == []
