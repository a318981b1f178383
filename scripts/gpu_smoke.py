"""GPU smoke test of the runtime's CUDA/NCCL path (runtime/device.py): run it on a machine with a GPU.

    PYTHONPATH=... python scripts/gpu_smoke.py            # or: scripts/gpu-smoke.sh
    python scripts/gpu_smoke.py --quick                   # equivalence only, no step-time table
    python scripts/gpu_smoke.py --device cpu --quick      # the same script on CPU/gloo (tests the script itself)

What it checks (and prints, one line per check; exit 1 if any fails, 2 without CUDA):

1. In process, one NCCL rank on cuda:0: the TrainStep puts every parameter, the step's loss and the
   gradients on the GPU, and a step runs (the device is really used, not silently the CPU).
2. float64 equivalence, through `the local launcher` (the launcher's spawned ranks, `device="cuda"`):
   the tiny model and tiny-moe on 1 GPU against `run_reference` on the CPU: loss at every step
   within 1e-9 relative, step-0 gradients within 1e-9 and parameters after 3 SGD steps within 1e-8
   (of each tensor's largest entry), as tests/distributed/test_runtime_equivalence.py does on gloo. With 2 or
   more GPUs also TP2, PP2, CP2 and a disaggregated (graph-aware 1F1B, point-to-point) plan; with 4,
   two of the 4-rank plans of the tests. NCCL puts one rank per GPU, so more ranks need more GPUs.
3. Step time: a short run per (model, device, dtype) through `the local launcher`, median step time of the
   steps after the first, printed as a table (the CPU row is the same plan on gloo for comparison).

Budget: about 3-6 minutes on one GPU (each the local launcher starts fresh processes: ~10-20 s each).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

from orch.planner.loading import load_data
from orch.planner.plan import Layout
from orch.planner.specs import DataSpec, ModelSpec
from orch.runtime.launch.local import LocalLauncher
from orch.runtime.models.registry import load_model
from orch.runtime.plans import hand_plan
from orch.runtime.train.config import TrainConfig
from orch.runtime.train.debug import DebugConfig
from orch.runtime.train.single_process import ReferenceResult, run_reference
from orch.runtime.train.trainer import TrainTask

SEED, STEPS = 7, 3
FAILED: list[str] = []


def check(name: str, ok: bool, detail: str = "") -> None:
    print(f"[{'ok' if ok else 'FAIL'}] {name}" + (f": {detail}" if detail else ""), flush=True)
    if not ok:
        FAILED.append(name)


def max_rel_error(got: dict[str, torch.Tensor], want: dict[str, torch.Tensor]) -> float:
    """Largest |got - want| over every tensor, relative to that tensor's largest reference entry."""
    if set(got) != set(want):
        missing, extra = sorted(set(want) - set(got))[:3], sorted(set(got) - set(want))[:3]
        raise AssertionError(f"tensor names differ: missing {missing}, extra {extra}")
    worst = 0.0
    for name, ref in want.items():
        scale = max(ref.abs().max().item(), 1e-300)
        worst = max(worst, (got[name].cpu() - ref).abs().max().item() / scale)
    return worst


def merged(workdir: Path, what: str) -> dict[str, torch.Tensor]:
    out: dict[str, torch.Tensor] = {}
    for f in sorted(workdir.glob(f"{what}.rank*.pt")):
        out.update(torch.load(f, map_location="cpu"))
    return out


def in_process_device_check(model: ModelSpec, data: DataSpec, device: str) -> None:
    """One NCCL rank in this process: parameters, loss and gradients live on cuda:0."""
    import torch.distributed as dist

    from orch.runtime.device import rank_device
    from orch.runtime.launch.procgroup import free_port, init_rank
    from orch.runtime.train.step import TrainStep

    plan = hand_plan(model, data, {"llm": (Layout(), [0])})
    dev = rank_device(device, 0, 1)
    init_rank(0, 1, master="127.0.0.1", port=free_port(), timeout_s=60, backend=dev.backend, device=dev.device)
    backend = "nccl" if device == "cuda" else "gloo"
    try:
        check(f"backend is {backend}", dist.get_backend() == backend, dist.get_backend())
        cfg = TrainConfig(optimizer="sgd", lr=0.1, steps=2, seed=SEED, dtype="float32", device=device, balance="orch")
        ex = TrainStep(plan, data, cfg, 0, 1, device=dev.device)
        where = {p.device.type for m in ex.modules.values() for p in m.parameters()}
        check(f"parameters on {device}", where == {device}, str(sorted(where)))
        grids = {g.device for g in ex.grids.values()}
        check(f"DeviceMesh device type is {device}", grids == {device}, str(sorted(grids)))
        metrics = ex.step(0)
        grads = {p.grad.device.type for m in ex.modules.values() for p in m.parameters() if p.grad is not None}
        check(f"gradients on {device} after a step", grads == {device}, str(sorted(grads)))
        check("step 0 loss is finite", bool(torch.isfinite(torch.tensor(metrics.loss))), f"{metrics.loss:.6f}")
        ex.finish()
    finally:
        dist.destroy_process_group()


def equivalence(label: str, model: ModelSpec, data: DataSpec, ref: ReferenceResult, layouts: dict, device: str) -> None:
    plan = hand_plan(model, data, layouts)
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        cfg = TrainConfig(
            optimizer="sgd", lr=0.1, steps=STEPS, seed=SEED, dtype="float64", device=device, balance="orch"
        )
        task = TrainTask(plan, data, cfg, str(work), DebugConfig(dump_dir=str(work)), timeout_s=120)
        t = time.perf_counter()
        try:
            records = LocalLauncher().submit(task).result()
        except Exception as exc:
            check(f"{label}: run on {device}", False, f"{type(exc).__name__}: {exc}")
            return
        losses = [r.loss for r in records]
        loss_err = max(abs(a - b) / abs(b) for a, b in zip(losses, ref.losses, strict=True))
        grad_err = max_rel_error(merged(work, "grads"), ref.grads)
        param_err = max_rel_error(merged(work, "params"), ref.params)
    ok = len(losses) == STEPS and loss_err <= 1e-9 and grad_err <= 1e-9 and param_err <= 1e-8
    detail = (
        f"{plan.world_size} rank(s), {time.perf_counter() - t:.0f} s; rel. errors loss {loss_err:.1e} (<=1e-9), "
        f"grads {grad_err:.1e} (<=1e-9), params after {STEPS} steps {param_err:.1e} (<=1e-8)"
    )
    check(f"{label}: float64 {device} == cpu reference", ok, detail)


def bigger(model: ModelSpec) -> ModelSpec:
    """The tiny model widened so a GPU has something to do (still a few seconds a step on a CPU)."""
    raw = model.model_dump(mode="json")
    raw["name"] = "tiny-wide"
    raw["modules"]["llm"].update(hidden=1024, heads=16, kv_heads=4, ffn=4096, layers=8, vocab=32000)
    for enc in ("vision", "audio"):
        raw["modules"][enc].update(hidden=512, heads=8, ffn=2048, layers=4)
    return ModelSpec.model_validate(raw)


def step_times(rows: list[tuple[str, ModelSpec, DataSpec, str, str]]) -> None:
    print("\nstep time (the local launcher, 1 rank, median of steps 1..; the first step warms up)")
    print(f"{'model':<12} {'device':<7} {'dtype':<9} {'steps':>5} {'median s':>10} {'label tok/s':>12}")
    for label, model, data, device, dtype in rows:
        plan = hand_plan(model, data, {"llm": (Layout(), [0])})
        cfg = TrainConfig(optimizer="sgd", lr=0.1, steps=6, seed=0, dtype=dtype, device=device, balance="none")
        with tempfile.TemporaryDirectory() as tmp:
            try:
                records = LocalLauncher().submit(TrainTask(plan, data, cfg, tmp, timeout_s=300)).result()
            except Exception as exc:
                check(f"step time {label} {device} {dtype}", False, f"{type(exc).__name__}: {exc}")
                continue
        times = [r.step_time_s for r in records[1:]]
        med = statistics.median(times)
        tokens = statistics.median(r.tokens for r in records[1:])
        print(f"{label:<12} {device:<7} {dtype:<9} {len(records):>5} {med:>10.4f} {tokens / med:>12.0f}", flush=True)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="equivalence only, no step-time table")
    parser.add_argument("--device", default="cuda", choices=("cuda", "cpu"), help="cpu: check the script itself")
    args = parser.parse_args()
    dev = args.device
    if dev == "cuda" and not torch.cuda.is_available():
        print(f"no CUDA here (torch {torch.__version__}): nothing checked; run this on a machine with a GPU")
        return 2
    if dev == "cuda":
        gpus = torch.cuda.device_count()
        print(f"torch {torch.__version__}, CUDA {torch.version.cuda}, {gpus} GPU(s): {torch.cuda.get_device_name(0)}")
    else:
        gpus = 1  # the CPU path of the same checks: one rank
        print(f"torch {torch.__version__}, device cpu (gloo): the script's own check, not the CUDA path")
    start = time.perf_counter()
    model, moe = load_model("tiny"), load_model("tiny-moe")
    data = load_data("tiny-mix").model_copy(update={"global_batch": 8, "seq_len": 96})

    in_process_device_check(model, data, dev)

    ref = run_reference(model, data, seed=SEED, steps=STEPS, dtype=torch.float64, optimizer="sgd", lr=0.1)
    equivalence("tiny, 1 rank", model, data, ref, {"llm": (Layout(), [0])}, dev)
    moe_ref = run_reference(moe, data, seed=SEED, steps=STEPS, dtype=torch.float64, optimizer="sgd", lr=0.1)
    equivalence("tiny-moe, 1 rank", moe, data, moe_ref, {"llm": (Layout(), [0])}, dev)
    if gpus >= 2:
        equivalence(
            "tiny, llm tp2", model, data, ref, {"llm": (Layout(tp=2), [0, 1]), "vision": (Layout(dp=2), [0, 1])}, dev
        )
        equivalence(
            "tiny, llm pp2", model, data, ref, {"llm": (Layout(pp=2), [0, 1]), "vision": (Layout(dp=2), [0, 1])}, dev
        )
        equivalence(
            "tiny, llm cp2", model, data, ref, {"llm": (Layout(cp=2), [0, 1]), "vision": (Layout(dp=2), [0, 1])}, dev
        )
        equivalence(
            "tiny, disaggregated enc1 | llm1 (graph 1F1B, p2p)",
            model,
            data,
            ref,
            {"llm": (Layout(), [1]), "vision": (Layout(), [0]), "audio": (Layout(), [0])},
            dev,
        )
        equivalence("tiny-moe, dp2 ep2", moe, data, moe_ref, {"llm": (Layout(dp=2, ep=2), [0, 1])}, dev)
    if gpus >= 4:
        enc4 = {"vision": (Layout(dp=4), [0, 1, 2, 3]), "audio": (Layout(dp=4), [0, 1, 2, 3])}
        equivalence("tiny, llm pp2 tp2", model, data, ref, {"llm": (Layout(pp=2, tp=2), [0, 1, 2, 3]), **enc4}, dev)
        equivalence("tiny, llm cp2 dp2", model, data, ref, {"llm": (Layout(cp=2, dp=2), [0, 1, 2, 3]), **enc4}, dev)

    if not args.quick:
        wide = bigger(model)
        wide_data = load_data("tiny-mix").model_copy(update={"global_batch": 32, "seq_len": 1024})
        rows = [("tiny", model, data, "cpu", "float32")]
        if dev == "cuda":
            rows += [
                ("tiny", model, data, "cuda", "float32"),
                ("tiny-wide", wide, wide_data, "cuda", "float32"),
                ("tiny-wide", wide, wide_data, "cuda", "bfloat16"),
            ]
        step_times(rows)
    print(f"\n{len(FAILED)} check(s) failed" + (f": {', '.join(FAILED)}" if FAILED else ""), end="")
    print(f" ({time.perf_counter() - start:.0f} s)")
    return 1 if FAILED else 0


if __name__ == "__main__":
    sys.exit(main())
