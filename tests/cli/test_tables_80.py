"""Every table orch prints is readable in an 80-column terminal: no line past 80, no header or word cut."""

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
CUT = re.compile(r"\w…")  # rich's ellipsis after a letter: a header or a word cut short


def _run(*args: str, code: str | None = None) -> str:
    """The command's stderr (where tables go), run as a user's terminal 80 columns wide."""
    env = {**os.environ, "COLUMNS": "80", "LINES": "50"}
    cmd = (
        [sys.executable, "-c", code] if code else [sys.executable, "-c", "from orch.cli.app import main; main()", *args]
    )
    done = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=ROOT)
    assert done.returncode == 0, done.stderr
    return done.stderr


def _assert_readable(text: str, *headers: str) -> None:
    for line in text.splitlines():
        assert len(line) <= 80, f"{len(line)} columns: {line!r}"
        assert not CUT.search(line), f"cut short: {line!r}"
    for h in headers:
        assert re.search(rf"(^|\s){re.escape(h)}(\s|$)", text, re.M), f"header {h!r} missing in\n{text}"


def test_plan_tables_fit_80_columns(tmp_path):
    out = _run(
        "plan", "-m", "omni-84b", "-c", "h200-141g", "--nodes", "16", "-d", "omni-mix", "--top", "3",
        "--out", str(tmp_path / "plan.yaml"),
    )  # fmt: skip
    _assert_readable(out, "module", "layout", "micro", "recompute", "GB/GPU", "busy s", "placement", "layouts")


def test_presets_analyze_and_balance_tables_fit_80_columns(tmp_path):
    _assert_readable(_run("presets"), "kind", "name", "summary")
    manifest = str(ROOT / "templates" / "manifests" / "omni-sample.jsonl")
    analyze = _run("analyze", manifest, "--dp", "64", "--ranks-per-node", "8", "--micro-batch", "8", "--steps", "2")
    _assert_readable(analyze, "phase", "mode", "max cost", "mean cost", "wasted", "x-node", "ms/step")
    from test_cli_balance import BATCH  # the CLI test's batch

    batch = tmp_path / "batch.json"
    batch.write_text(json.dumps(BATCH))
    _assert_readable(_run("balance", str(batch)), "phase", "max", "max/mean", "max/LB", "intra", "inter")


def test_profile_and_validate_tables_fit_80_columns(tmp_path, plan_file):
    from orch.planner.profile import CollectiveRow, ComputeFit, LinkFit, ModuleProfile, Profile

    fit = ComputeFit(constant=1e-4, linear=2e-6, quadratic=1e-9, call=5e-4, rel_error=0.05, memory_bytes_per_token=4096)
    rows = [
        CollectiveRow(op=op, link=link, ranks=8, bytes=16 << 20, time_s=1e-3, algbw_gbps=123.456, busbw_gbps=234.567)
        for op in ("reduce_scatter", "all_to_all") for link in ("intra_node", "inter_node")
    ]  # fmt: skip
    prof = Profile(
        device="NVIDIA H200", backend="nccl", torch_version="2.13.0", date="2026-01-01T00:00:00+00:00",
        model="omni-84b", nproc=16, ranks_per_node=8,
        modules={n: ModuleProfile(block={1: fit, 8: fit}, rest=fit, step_overhead_s=0.01) for n in ("vision", "llm")},
        links={"intra_node": LinkFit(alpha_s=1e-5, gbps=400.0), "inter_node": LinkFit(alpha_s=2e-5, gbps=45.0)},
        collectives=rows,
    )  # fmt: skip
    path = tmp_path / "profile.json"
    path.write_text(prof.model_dump_json())
    code = (
        "from orch.cli.profile_cmd import render_profile; from orch.planner.profile import Profile; "
        f"render_profile(Profile.model_validate_json(open({str(path)!r}).read()))"
    )
    _assert_readable(_run(code=code), "module", "part", "call", "c2", "B/tok", "op", "link", "algbw", "busbw")
    assert "reduce_scatter" in _run(code=code) and "inter_node" in _run(code=code)

    plan_path, _, _ = plan_file
    metrics = tmp_path / "metrics.jsonl"
    ranks = {"0": {"vision.fwd": 0.1, "vision.bwd": 0.1, "llm.fwd_bwd": 0.2, "grad_sync": 0.05, "step": 0.5}}
    metrics.write_text(
        "".join(
            json.dumps({"step": k, "loss": 1.0, "tokens": 8, "step_time_s": 0.5, "ranks": ranks}) + "\n"
            for k in range(3)
        )
    )
    plan = yaml.safe_load(plan_path.read_text())
    assert plan["modules"]
    _assert_readable(
        _run("validate", "--plan", str(plan_path), "--metrics", str(metrics)), "phase", "predicted", "measured", "error"
    )


@pytest.mark.parametrize("width", [80])
def test_the_check_itself_catches_a_cut_header(width):
    from rich.console import Console
    from rich.table import Table

    console = Console(width=width, record=True, file=open(os.devnull, "w"))  # noqa: SIM115
    t = Table()
    for h in (
        "a-very-long-header-one",
        "a-very-long-header-two",
        "a-very-long-header-three",
        "a-very-long-header-four",
    ):
        t.add_column(h, no_wrap=True)
    t.add_row("x" * 20, "y" * 20, "z" * 20, "w" * 20)
    console.print(t)
    with pytest.raises(AssertionError, match="cut short"):
        _assert_readable(console.export_text())
