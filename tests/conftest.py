import pytest
from typer.testing import CliRunner

from orch.cli.app import app


@pytest.fixture
def cli():
    runner = CliRunner()

    def invoke(*args: str):
        return runner.invoke(app, list(args))

    return invoke
