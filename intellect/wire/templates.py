"""Template variables (`${NAME}`) in task specs: which exist where, and strict expansion."""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping

VARIABLE = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)\}")

# Expanded by the worker in env_vars, cmd and entrypoint.
TASK_VARIABLES = frozenset(
    {
        "TASK_ID",
        "NODE_ADDRESS",
        "GROUP_ID",
        "GROUP_INDEX",
        "GROUP_SIZE",
        "NEXT_P2P_ADDRESS",
        "P2P_INBOX",
        "P2P_OUTBOX",
        "GROUP_SECRET",
        "MEMBER_SECRET",
        "GROUP_KEYS",
        "GROUP_MEMBERS",
        "WORKER_P2P_SEED",
        "WORKER_P2P_PORT",
        "SOCKET_PATH",
        "TIMESTAMP",
    }
)
# Expanded by the orchestrator in storage_config.file_name_template. Never a secret: file names are
# public (validators, the ledger's readers); nor the members' public keys, which name no file.
_GROUP_ONLY = {"GROUP_SECRET", "MEMBER_SECRET", "GROUP_KEYS", "GROUP_MEMBERS"}
FILE_NAME_VARIABLES = (TASK_VARIABLES - _GROUP_ONLY) | frozenset(
    {
        "NODE_GROUP_ID",
        "NODE_GROUP_SIZE",
        "NODE_GROUP_INDEX",
        "CURRENT_FILE_INDEX",
        "ORIGINAL_NAME",
    }
)


class UnknownTemplateVariable(ValueError):
    def __init__(self, message: str, name: str | None = None) -> None:
        super().__init__(message)
        self.name = name  # the variable that had no value (expand), for a reason that names the cause


def variables_in(text: str) -> set[str]:
    return set(VARIABLE.findall(text))


def check_variables(texts: Iterable[str], allowed: frozenset[str], where: str) -> None:
    for text in texts:
        unknown = sorted(variables_in(text) - allowed)
        if unknown:
            names = ", ".join("${" + name + "}" for name in unknown)
            raise UnknownTemplateVariable(
                f"unknown template variable {names} in {where}; allowed: " + ", ".join(sorted(allowed))
            )


def expand(text: str, values: Mapping[str, str]) -> str:
    """Replace every ${NAME}; a variable with no value is an error, never an empty string."""

    def substitute(match: re.Match[str]) -> str:
        name = match.group(1)
        if name not in values:
            raise UnknownTemplateVariable(f"template variable ${{{name}}} has no value here", name)
        return str(values[name])

    return VARIABLE.sub(substitute, text)
