"""`orch launch --balance`: the mode reaches the runtime (orch by default); a bad one is one clear line."""

import pytest

import orch.runtime.launch.local


@pytest.mark.parametrize(
    ("args", "want"), [((), "orch"), (("--balance", "none"), "none"), (("--balance", "lpt"), "lpt")]
)
def test_launch_passes_the_balance_mode(cli, plan_file, monkeypatch, tmp_path, args, want):
    path, _, _ = plan_file
    seen = {}

    class Finished:
        def result(self):
            return []

    def fake_submit(self, task):
        seen["cfg"] = task.cfg
        return Finished()

    monkeypatch.setattr(orch.runtime.launch.local.LocalLauncher, "submit", fake_submit)
    result = cli("launch", str(path), "--workdir", str(tmp_path / "run"), *args)
    assert result.exit_code == 0, result.output
    assert seen["cfg"].balance == want


def test_launch_bad_balance_mode(cli, plan_file):
    path, _, _ = plan_file
    result = cli("launch", str(path), "--balance", "random")
    assert result.exit_code == 1
    assert "error: --balance: expected one of orch, paper, lpt, none, got 'random'" in result.output
