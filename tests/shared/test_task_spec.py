"""The task spec refuses at the API what a worker could never run, and accepts the SYNTHETIC-2 body."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from pydantic import ValidationError

from intellect.wire.tasks import MAX_SPEC_BYTES, TaskSpec

SEED_BODY = Path(__file__).parents[1] / "fixtures" / "synthetic2_task.json"


def spec(**fields: object) -> dict[str, object]:
    return {"name": "t", "image": "img:latest"} | fields


def refused(body: dict[str, object], words: str) -> None:
    with pytest.raises(ValidationError) as info:
        TaskSpec.model_validate(body)
    assert words in str(info.value), str(info.value)


def test_seed_body_is_accepted_with_host_path_under_the_root() -> None:
    task = TaskSpec.model_validate(json.loads(SEED_BODY.read_text()))
    assert task.volume_mounts[0].host_path == "group-${GROUP_ID}-state"
    assert task.allowed_topologies == ["1x1128GB", "2x640GB"]
    assert "${WORKER_P2P_SEED}" in task.cmd


@pytest.mark.parametrize(
    "host_path",
    ["../x", "a/../../x", "/../etc", "${GROUP_ID}/../../x", "/", ".", "a\x00b"],
)
def test_host_paths_that_escape_or_name_the_root_are_refused(host_path: str) -> None:
    refused(spec(volume_mounts=[{"host_path": host_path, "container_path": "/state"}]), "host_path")


def test_unknown_variable_in_host_path_is_refused() -> None:
    refused(spec(volume_mounts=[{"host_path": "x-${HOME}", "container_path": "/s"}]), "${HOME}")


@pytest.mark.parametrize(
    "container_path",
    ["/", "/data", "/data/", "/data/x", "/run/intellect", "/run/intellect/s", "/shared", "rel", "/a/../data"],
)
def test_reserved_or_relative_container_paths_are_refused(container_path: str) -> None:
    refused(spec(volume_mounts=[{"host_path": "x", "container_path": container_path}]), "container_path")


@pytest.mark.parametrize("key", ["A=B", "1X", "", "A B", "A\x00"])
def test_invalid_env_names_are_refused(key: str) -> None:
    refused(spec(env_vars={key: "v"}), "env var name")


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("env_vars", {"A": "x\x00y"}),
        ("cmd", ["ok", "x\x00"]),
        ("entrypoint", ["\x00"]),
    ],
)
def test_nul_bytes_are_refused(field: str, value: object) -> None:
    refused(spec(**{field: value}), "NUL")


@pytest.mark.parametrize("template", ["../../x", "/etc/passwd", "a/../../b", "a\\b"])
def test_file_name_templates_that_escape_are_refused(template: str) -> None:
    refused(spec(storage_config={"file_name_template": template}), "file_name_template")


@pytest.mark.parametrize(
    ("fields", "words"),
    [
        ({"cmd": ["x" * (32 * 1024 + 1)]}, "longer than"),
        ({"cmd": ["x"] * 100_000}, "at most 1024"),
        ({"env_vars": {f"K{i}": "v" for i in range(50_000)}}, "at most 256"),
        (
            {"volume_mounts": [{"host_path": f"v{i}", "container_path": f"/m{i}"} for i in range(10_000)]},
            "at most 32",
        ),
        ({"cmd": ["y" * 30_000] * 10}, f"at most {MAX_SPEC_BYTES}"),
        ({"name": "a\nb"}, "control characters"),
    ],
)
def test_sizes_are_bounded(fields: dict[str, object], words: str) -> None:
    refused(spec(**fields), words)


def test_ordinary_spec_still_round_trips() -> None:
    body = spec(
        env_vars={"A_1": "${TASK_ID}"},
        cmd=["python3", "-c", "print(1)"],
        volume_mounts=[{"host_path": "cache", "container_path": "/cache"}],
    )
    task = TaskSpec.model_validate(body)
    assert TaskSpec.model_validate(task.model_dump(mode="json")) == task


def test_group_secret_and_p2p_port_are_task_variables_but_the_secret_never_names_a_file() -> None:
    body = spec(env_vars={"S": "${GROUP_SECRET}"}, cmd=["--port", "${WORKER_P2P_PORT}"])
    task = TaskSpec.model_validate(body)
    assert task.env_vars["S"] == "${GROUP_SECRET}"
    # file names are public: the secret may not be rendered into one
    refused(spec(storage_config={"file_name_template": "${TASK_ID}/${GROUP_SECRET}-${ORIGINAL_NAME}"}),
            "${GROUP_SECRET}")
    assert TaskSpec.model_validate(spec(env_vars={"S": "${MEMBER_SECRET}", "K": "${GROUP_KEYS}"}))
    refused(spec(storage_config={"file_name_template": "${MEMBER_SECRET}-${ORIGINAL_NAME}"}),
            "${MEMBER_SECRET}")


def test_a_group_hands_one_public_key_per_member() -> None:
    from intellect.wire.tasks import GroupContext

    keys = ["0f" * 32, "1e" * 32]
    assert GroupContext(group_id="g", group_index=1, group_size=2, member_secret="ab" * 32,
                        group_keys=keys).group_keys == keys  # fmt: skip
    for bad in (keys[:1], [*keys, "2d" * 32], [keys[0], "AB" * 32]):
        with pytest.raises(ValidationError, match="one key of 64 lowercase hex characters per member"):
            GroupContext(group_id="g", group_index=1, group_size=2, group_keys=bad)
    with pytest.raises(ValidationError, match="member_secret"):
        GroupContext(group_id="g", group_index=1, group_size=2, member_secret="ab" * 31)
    members = ["0x" + "ab" * 20, "0x" + "CD" * 20]
    assert GroupContext(group_id="g", group_index=0, group_size=2, members=members).members == members
    for bad in (members[:1], [members[0], "not-an-address"]):
        with pytest.raises(ValidationError, match="one node address per member"):
            GroupContext(group_id="g", group_index=0, group_size=2, members=bad)


@pytest.mark.parametrize("secret", ["ab" * 31, "AB" * 32, "zz" * 32, "ab" * 33])
def test_a_group_secret_is_64_lowercase_hex_characters(secret: str) -> None:
    from intellect.wire.tasks import GroupContext

    assert GroupContext(group_id="g", group_index=0, group_size=1, secret="0f" * 32).secret == "0f" * 32
    with pytest.raises(ValidationError, match="secret"):
        GroupContext(group_id="g", group_index=0, group_size=1, secret=secret)
