"""The config's `balance`: the mode reaches the runtime (orch by default); a bad one is one clear line."""

import pytest


@pytest.mark.parametrize(("fields", "want"), [({}, "orch"), ({"balance": "none"}, "none"), ({"balance": "lpt"}, "lpt")])
def test_launch_passes_the_balance_mode(cli, plan_file, launched_tasks, tmp_path, train_config, fields, want):
    path, _, _ = plan_file
    args = ("--config", train_config(**fields)) if fields else ()
    result = cli("launch", str(path), "--workdir", str(tmp_path / "run"), *args)
    assert result.exit_code == 0, result.output
    assert launched_tasks[-1].cfg.balance == want


def test_launch_bad_balance_mode(cli, plan_file, train_config):
    path, _, _ = plan_file
    config = train_config(balance="random")
    result = cli("launch", str(path), "--config", config)
    assert result.exit_code == 1
    (line,) = result.output.strip().splitlines()
    assert line.startswith(f"error: {config}: balance: ") and "'orch', 'paper', 'lpt' or 'none'" in line, line
    assert "'random'" in line
