import signal

import pytest
import yaml
from typer.testing import CliRunner

from orch.cli.app import app


@pytest.fixture
def cli():
    runner = CliRunner()

    def invoke(*args: str):
        return runner.invoke(app, list(args))

    return invoke


@pytest.fixture
def plan_file(tmp_path):
    """A 2-rank colocated plan of the tiny model (LLM TP2, vision DP2), with its specs."""
    from orch.planner.loading import load_data
    from orch.planner.plan import Layout
    from orch.runtime.models.registry import load_model
    from orch.runtime.plans import hand_plan

    model = load_model("tiny")
    data = load_data("tiny-mix").model_copy(update={"global_batch": 4, "seq_len": 64})
    plan = hand_plan(model, data, {"llm": (Layout(tp=2), [0, 1]), "vision": (Layout(dp=2), [0, 1])})
    path = tmp_path / "plan.yaml"
    path.write_text(yaml.safe_dump(plan.model_dump(mode="json")))
    return path, model, data


@pytest.fixture
def train_config(tmp_path):
    """`write(**fields)`: a training config file (`orch launch --config`) of these fields; its path."""
    count = iter(range(1_000_000))

    def write(**fields) -> str:
        path = tmp_path / f"train-{next(count)}.yaml"
        path.write_text(yaml.safe_dump(fields))
        return str(path)

    return write


@pytest.fixture
def launched_tasks(monkeypatch):
    """The local launch boundary patched: each task `orch launch` submits is recorded, and none runs."""
    import orch.runtime.launch.local

    tasks = []

    class Finished:
        stopped_by = stopped_at = None

        def wait(self, on_poll=None):
            pass

        def result(self):
            return []

    def fake_submit(self, task):
        tasks.append(task)
        return Finished()

    monkeypatch.setattr(orch.runtime.launch.local.LocalLauncher, "submit", fake_submit)
    return tasks


@pytest.fixture
def forked_ranks(monkeypatch):
    """`orch launch --executor local` (and `orch profile`) fork their ranks from the tests' forkserver
    (tests/launching.py), which imported torch, the trainer and transformers once, instead of spawning fresh
    interpreters that each import them: for tests of what a run computes, writes and says, not of how its processes
    start. A forked rank's environment and stderr are the forkserver's; tests/cli/test_cli_launch.py, the signal
    and device tests and one family of tests/cli/test_cli_families.py keep the spawn users run."""
    from dataclasses import dataclass

    import orch.runtime.launch.local

    @dataclass
    class ForkedLauncher(orch.runtime.launch.local.LocalLauncher):
        start_method: str = "forkserver"

    monkeypatch.setattr(orch.runtime.launch.local, "LocalLauncher", ForkedLauncher)


@pytest.fixture
def harmless_signals():
    """SIGTERM/SIGINT/SIGUSR1 caught by a no-op here, so one that lands after the launcher's handlers are gone
    cannot end pytest; the launcher installs its own while it waits and puts these back."""
    old = {s: signal.signal(s, lambda *_: None) for s in (signal.SIGTERM, signal.SIGINT, signal.SIGUSR1)}
    yield
    for s, handler in old.items():
        signal.signal(s, handler)
