"""Template values of a task (pure: no runtime runs): the group secret and the worker's p2p port."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path

import pytest

from intellect.wire.tasks import AssignedTask, GroupContext, Task, TaskSpec
from worker.runtime.base import RuntimeConfig, TaskSetupError, prepare, template_values

SECRET = "ab" * 32


def assigned(env_vars: dict[str, str], group: GroupContext | None = None) -> AssignedTask:
    spec = TaskSpec(name="t", image="img", cmd=["run"], env_vars=env_vars)
    return AssignedTask(task=Task(id="t-1", spec=spec, created_at=datetime.now(UTC)), group=group)


def config(tmp_path: Path, **fields: object) -> RuntimeConfig:
    return RuntimeConfig(node_address="0xabc", storage_root=tmp_path / "s", state_dir=tmp_path / "r",
                         **fields)


def group(secret: str | None = SECRET, member_secret: str | None = None) -> GroupContext:
    return GroupContext(group_id="g1", group_index=0, group_size=2, next_p2p_address="10.0.0.2:7001",
                        secret=secret, member_secret=member_secret,
                        group_keys=["01" * 32, "02" * 32] if member_secret else None,
                        members=["0x" + "01" * 20, "0x" + "02" * 20] if member_secret else None)


def test_a_members_own_secret_and_every_public_key_expand(tmp_path: Path) -> None:
    desired = assigned({"OWN": "${MEMBER_SECRET}", "ALL": "${GROUP_KEYS}", "WHO": "${GROUP_MEMBERS}"},
                       group(member_secret="cd" * 32))  # fmt: skip
    prepared = prepare(desired, config(tmp_path), None, "/data")
    assert prepared.env["OWN"] == "cd" * 32 and prepared.env["ALL"] == f"{'01' * 32},{'02' * 32}"
    assert prepared.env["WHO"] == f"0x{'01' * 20},0x{'02' * 20}"


def test_group_secret_and_p2p_port_expand(tmp_path: Path) -> None:
    desired = assigned({"PEER": "--secret=${GROUP_SECRET} --listen=0.0.0.0:${WORKER_P2P_PORT} "
                                "--next=${NEXT_P2P_ADDRESS}"}, group())
    values = template_values(desired, config(tmp_path, p2p_port=7000), None)
    assert values["GROUP_SECRET"] == SECRET and values["WORKER_P2P_PORT"] == "7000"
    prepared = prepare(desired, config(tmp_path, p2p_port=7000), None, "/data")
    assert prepared.env["PEER"] == f"--secret={SECRET} --listen=0.0.0.0:7000 --next=10.0.0.2:7001"


@pytest.mark.parametrize(
    ("env", "desired_group", "fields", "why"),
    [
        ("${GROUP_SECRET}", None, {}, "not in a node group"),
        ("${GROUP_SECRET}", group(secret=None), {}, "its group has no secret"),
        ("${MEMBER_SECRET}", group(), {}, "derives no member keys"),
        ("${GROUP_KEYS}", None, {}, "not in a node group"),
        ("${WORKER_P2P_PORT}", group(), {}, "INTELLECT_WORKER_P2P_PORT"),
    ],
)
def test_a_missing_value_fails_the_task_naming_why(
    tmp_path: Path, env: str, desired_group: GroupContext | None, fields: dict[str, object], why: str
) -> None:
    desired = assigned({"X": env}, desired_group)
    assert env[2:-1] not in template_values(desired, config(tmp_path, **fields), None)
    with pytest.raises(TaskSetupError) as info:
        prepare(desired, config(tmp_path, **fields), None, "/data")
    assert f"template variable {env} has no value here" in str(info.value) and why in str(info.value)


def test_the_p2p_port_is_a_port(tmp_path: Path) -> None:
    for bad in (0, 65536):
        with pytest.raises(ValueError, match="p2p_port"):
            config(tmp_path, p2p_port=bad)


def test_how_a_member_opens_its_links_follows_who_can_be_called(tmp_path: Path) -> None:
    env = {"LINKS": "${P2P_INBOX} ${P2P_OUTBOX}"}
    plain = prepare(assigned(env, group()), config(tmp_path), None, "/data")
    assert plain.env["LINKS"] == "listen 10.0.0.2:7001"  # as before NAT-ed members existed
    behind = GroupContext(group_id="g1", group_index=1, group_size=2, next_p2p_address="10.0.0.1:7000",
                          prev_p2p_address="10.0.0.1:7001")  # fmt: skip
    assert prepare(assigned(env, behind), config(tmp_path), None, "/data").env["LINKS"] == (
        "10.0.0.1:7001 10.0.0.1:7000")  # it dials both of its links
    before = GroupContext(group_id="g1", group_index=0, group_size=2, next_p2p_address="192.168.1.5:7000",
                          next_dials_in=True)  # fmt: skip
    assert prepare(assigned(env, before), config(tmp_path), None, "/data").env["LINKS"] == "listen listen"
