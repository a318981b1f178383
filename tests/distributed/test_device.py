"""runtime/device.py: "auto" | "cpu" | "cuda" -> (device, backend), and `orch launch --device`.

No GPU is needed: CUDA's presence is monkeypatched, and `set_device` is recorded instead of called,
so nothing is initialised.
"""

import pytest
import torch

from orch.runtime.device import DeviceConfig, DeviceError, device_kind, rank_device


@pytest.fixture
def gpus(monkeypatch):
    """Pretend this machine has `n` GPUs; returns the list of devices `set_device` was given."""
    calls: list[torch.device] = []

    def have(n: int) -> list[torch.device]:
        monkeypatch.setattr(torch.cuda, "is_available", lambda: n > 0)
        monkeypatch.setattr(torch.cuda, "device_count", lambda: n)
        monkeypatch.setattr(torch.cuda, "set_device", lambda d: calls.append(torch.device(d)))
        return calls

    return have


def test_cpu_is_gloo_whatever_the_machine(gpus):
    calls = gpus(8)
    assert device_kind("cpu", 4) == "cpu"
    assert rank_device("cpu", 3, 4) == DeviceConfig(torch.device("cpu"), "gloo")
    assert calls == []


def test_auto_without_cuda_is_cpu(gpus):
    gpus(0)
    assert device_kind("auto", 1) == "cpu"
    dev = rank_device("auto", 0, 2)
    assert dev.device == torch.device("cpu") and dev.backend == "gloo" and dev.type == "cpu"


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has CUDA")
def test_auto_on_this_machine_is_cpu():
    assert device_kind("auto", 2) == "cpu"
    assert rank_device("auto", 1, 2).backend == "gloo"


def test_auto_picks_cuda_with_a_gpu_per_local_rank(gpus):
    calls = gpus(4)
    assert device_kind("auto", 4) == "cuda"
    dev = rank_device("auto", 2, 4)
    assert dev == DeviceConfig(torch.device("cuda", 2), "nccl")
    assert calls == [torch.device("cuda", 2)]  # the rank's GPU is the current device


def test_auto_falls_back_to_cpu_with_too_few_gpus(gpus):
    """Every rank decides from the machine's rank count, not its own index: all agree on the backend."""
    calls = gpus(2)
    assert device_kind("auto", 4) == "cpu"
    assert rank_device("auto", 0, 4).backend == "gloo"
    assert rank_device("auto", 3, 4).backend == "gloo"
    assert calls == []


def test_cuda_without_cuda_is_one_clear_line(gpus):
    gpus(0)
    with pytest.raises(DeviceError, match="cuda: CUDA is not available here") as info:
        device_kind("cuda", 1)
    assert "\n" not in str(info.value)
    with pytest.raises(DeviceError):
        rank_device("cuda", 0, 1)


def test_cuda_with_too_few_gpus_is_refused(gpus):
    gpus(1)
    with pytest.raises(DeviceError, match="4 local ranks need one GPU each, this machine has 1"):
        device_kind("cuda", 4)
    assert device_kind("cuda", 1) == "cuda"


def test_explicit_cuda_is_nccl_on_the_local_rank(gpus):
    calls = gpus(2)
    assert rank_device("cuda", 1, 2) == DeviceConfig(torch.device("cuda", 1), "nccl")
    assert calls == [torch.device("cuda", 1)]


def test_unknown_device_and_bad_local_rank(gpus):
    gpus(0)
    with pytest.raises(DeviceError, match="expected one of auto, cpu, cuda, got 'tpu'"):
        device_kind("tpu", 1)
    with pytest.raises(DeviceError, match="local rank 2 of 2"):
        rank_device("cpu", 2, 2)


def test_local_launcher_refuses_cuda_before_starting(gpus, tmp_path):
    """The local launcher resolves the device before starting: no process starts for an impossible device."""
    from launching import train_local

    from orch.planner.loading import load_data
    from orch.planner.plan import Layout
    from orch.runtime.models.registry import load_model
    from orch.runtime.plans import hand_plan
    from orch.runtime.train.config import TrainConfig

    gpus(0)
    model = load_model("tiny")
    data = load_data("tiny-mix").model_copy(update={"global_batch": 2, "seq_len": 32})
    plan = hand_plan(model, data, {"llm": (Layout(dp=1), [0]), "vision": (Layout(dp=1), [0])})
    with pytest.raises(DeviceError, match="CUDA is not available"):
        train_local(plan, data, TrainConfig(device="cuda"), tmp_path)
    assert not (tmp_path / "metrics.jsonl").exists()


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has CUDA")
def test_launch_device_cuda_without_cuda_is_one_line(cli, plan_file, tmp_path):
    path, _, _ = plan_file
    result = cli("launch", str(path), "--device", "cuda", "--workdir", str(tmp_path / "run"))
    assert result.exit_code == 1
    lines = result.output.strip().splitlines()
    assert len(lines) == 1, result.output
    assert lines[0].startswith("error: --device: cuda: CUDA is not available here")
    assert not (tmp_path / "run" / "metrics.jsonl").exists()


def test_launch_bad_device_value(cli, plan_file):
    path, _, _ = plan_file
    result = cli("launch", str(path), "--device", "tpu")
    assert result.exit_code == 1
    assert result.output.strip() == "error: --device: expected one of auto, cpu, cuda, got 'tpu'"


def test_train_step_threads_its_device_through(tmp_path):
    """One gloo rank in this process: the TrainStep hands its device to every part that creates tensors."""
    import torch.distributed as dist

    from orch.planner.loading import load_data
    from orch.planner.plan import Layout
    from orch.runtime.launch.procgroup import free_port, init_rank
    from orch.runtime.models.registry import load_model
    from orch.runtime.plans import hand_plan
    from orch.runtime.train.config import TrainConfig
    from orch.runtime.train.step import TrainStep

    model = load_model("tiny")
    data = load_data("tiny-mix").model_copy(update={"global_batch": 2, "seq_len": 32})
    plan = hand_plan(model, data, {"llm": (Layout(), [0])})
    dev = rank_device("auto", 0, 1)
    init_rank(0, 1, master="127.0.0.1", port=free_port(), timeout_s=30, backend=dev.backend, device=dev.device)
    try:
        ex = TrainStep(plan, data, TrainConfig(device="cpu", balance="orch", calibrate=False), 0, 1, device=dev.device)
        assert ex.device == dev.device
        assert ex.ctx.stage is not None and ex.ctx.stage.device == dev.device
        assert ex.ctx.device == dev.device
        assert ex.balancer.device == dev.device
        assert {g.device for g in ex.grids.values()} == {dev.type}
        assert {p.device for m in ex.modules.values() for p in m.parameters()} == {dev.device}
        assert ex.step(0).loss > 0
        ex.finish()
    finally:
        dist.destroy_process_group()
