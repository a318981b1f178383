"""The package maps the repo's folders into orch.*; nothing heavy is imported at CLI start."""

import os
import re
import subprocess
import sys
import tomllib
from importlib.metadata import version
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
MAPPED = {"planner": "orch.planner", "runtime": "orch.runtime", "cli": "orch.cli", "templates": "orch.templates"}


def test_every_subpackage_is_listed_in_pyproject():
    listed = set(tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"])
    found = set()
    for folder, namespace in MAPPED.items():
        for init in (ROOT / folder).rglob("__init__.py"):
            rel = init.parent.relative_to(ROOT / folder)
            found.add(".".join([namespace, *rel.parts]))
    assert found == listed


def test_no_orch_folder_at_root_shadows_the_namespace():
    assert not (ROOT / "orch").exists()


def test_version_comes_from_metadata():
    assert re.fullmatch(r"\d+\.\d+\.\d+.*", version("orch"))


def test_cli_import_does_not_import_torch_or_ortools():
    code = "import sys, orch.cli.app; print(sorted(m for m in ('torch', 'ortools', 'numpy') if m in sys.modules))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


def test_cli_import_loads_no_runtime_and_no_pydantic():
    """`orch --help` builds no pydantic model (the training config's alone took ~80 ms) and imports nothing
    of runtime/: each command imports what it needs inside itself (docs/architecture.md)."""
    code = (
        "import sys, orch.cli.app\n"
        "print(sorted(m for m in sys.modules if m == 'pydantic' or m.startswith('orch.runtime')))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


def test_launchers_know_tasks_only_through_base_task():
    """runtime/launch/ never imports train/ at module level: a task is a `rank.Task` (docs/architecture.md)."""
    launchers = ("base", "rank", "local", "slurm", "torchrun", "torchrun_rank", "sbatch", "jobs", "diagnose")
    code = (
        f"import sys\nfor m in {launchers!r}: __import__('orch.runtime.launch.' + m)\n"
        "print(sorted(m for m in sys.modules if m.startswith('orch.runtime.train') or m == 'torch'))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


@pytest.mark.parametrize("verb", ["status", "logs", "cancel"])
def test_job_commands_do_not_import_torch(verb, tmp_path):
    """`orch status/logs/cancel` read a JSON record and call Slurm's commands: no torch, no numpy at start-up."""
    code = (
        "import sys\n"
        "from orch.cli.app import app\n"
        f"try:\n    app([{verb!r}, '999999'])\nexcept SystemExit:\n    pass\n"
        "print(sorted(m for m in ('torch', 'numpy', 'ortools') if m in sys.modules))"
    )
    env = {**os.environ, "ORCH_STATE_DIR": str(tmp_path)}
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, check=True)
    assert "no record" in done.stderr  # it ran the command: job 999999 has no record here
    assert done.stdout.strip().splitlines()[-1] == "[]"


def test_orch_help_runs_as_a_console_script():
    exe = Path(sys.executable).with_name("orch")
    result = subprocess.run([str(exe), "--help"], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    for verb in ("plan", "presets", "schema", "balance", "analyze", "launch"):
        assert verb in result.stdout


def test_presets_ship_as_package_data():
    from orch.planner.loading import preset_names

    assert {"tiny", "omni-84b", "llava-1b-70b", "vit-12b-120b"} <= set(preset_names("model"))
    assert {"h100-80g", "h200-141g", "local-cpu"} <= set(preset_names("cluster"))
