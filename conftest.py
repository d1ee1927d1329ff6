"""The README's and docs/' code blocks as tests (Sybil): ```bash blocks run as written in a scratch
folder (the README's against a devnet it starts), ```python blocks run in one namespace per
document, and a block that cannot run here is preceded by a visible note and a
`<!-- skip: next "why" -->` marker. Run with the rest: `make test` (they are slow-tier tests)."""

from __future__ import annotations

from typing import Any

import pytest
from sybil import Sybil
from sybil.parsers.markdown import CodeBlockParser, PythonCodeBlockParser, SkipParser

from tests.docs.shell import doc_devnet, doc_shell, run_readme_python, run_shell_block

__all__ = ["doc_devnet", "doc_shell"]


def _parsers(python: Any = None) -> list[Any]:
    return [SkipParser(), CodeBlockParser("bash", run_shell_block), python or PythonCodeBlockParser()]


readme_python = CodeBlockParser("python", run_readme_python)
readme = Sybil(parsers=_parsers(readme_python), patterns=["README.md"], fixtures=["doc_devnet"])
docs = Sybil(parsers=_parsers(), patterns=["docs/*.md"], fixtures=["doc_shell"])
pytest_collect_file = (readme + docs).pytest()


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if item.path.suffix == ".md":
            item.add_marker(pytest.mark.slow)  # a devnet, anvil, subprocesses
