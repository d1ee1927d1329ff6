"""scripts/function_length.py, the `make lint` step that holds product functions to 80 lines: it fails
naming a function one line over, passes one at the limit, and counts and skips what its docstring
says. On made-up trees only: whether the real one passes is `make lint`'s to say."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

import pytest

REPO = Path(__file__).resolve().parents[2]


def _script() -> ModuleType:
    """The script as a module, in this process (scripts/ is not a package)."""
    spec = importlib.util.spec_from_file_location("function_length", REPO / "scripts" / "function_length.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


function_length = _script()


def function(name: str, lines: int, indent: str = "") -> str:
    """A function of exactly `lines` lines, its `def` line included."""
    body = "".join(f"{indent}    x{i} = {i}\n" for i in range(lines - 2))
    return f"{indent}def {name}():\n{body}{indent}    return None\n"


def test_a_function_of_81_lines_fails_naming_it(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "mod.py").write_text("import os\n\n\n" + function("too_long", 81))
    assert function_length.main([str(tmp_path)]) == 1
    out, err = capsys.readouterr()
    assert "mod.py:4 too_long (81 lines)" in out
    assert "1 function(s) over 80 lines" in err


def test_a_function_of_80_lines_passes(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "mod.py").write_text(function("at_the_limit", 80))
    assert function_length.main([str(tmp_path)]) == 0
    assert capsys.readouterr().out == ""


def test_methods_and_nested_functions_are_named_decorators_not_counted(tmp_path: Path) -> None:
    decorated = "".join(f"    @staticmethod{i}\n" for i in range(5)) + function("method", 80, indent="    ")
    outer = "def outer():\n" + function("inner", 81, indent="    ") + "    return inner\n"
    (tmp_path / "mod.py").write_text("class Thing:\n" + decorated + "\n\n" + outer)
    found = function_length.long_functions([tmp_path], base=tmp_path)
    assert [(f.name, f.lines) for f in found] == [("outer", 83), ("outer.inner", 81)]


def test_tests_benches_examples_and_migrations_are_not_checked(tmp_path: Path) -> None:
    for folder in ("tests", "bench", "examples", "pkg/migrations/versions"):
        (tmp_path / folder).mkdir(parents=True)
        (tmp_path / folder / "mod.py").write_text(function("long", 200))
    (tmp_path / "pkg" / "mod.py").write_text(function("long", 81))
    found = function_length.long_functions([tmp_path], base=tmp_path)
    assert [str(f) for f in found] == ["pkg/mod.py:1 long (81 lines)"]
