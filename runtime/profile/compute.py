"""`orch profile`'s compute cases on one rank: a module's block, its parts outside the blocks, its step overhead.

What is timed is what the runtime executes (runtime/train/step.py), through its functions: a Block of
runtime/models/reference.py, or a Hugging Face module's own layer (runtime/models/hf/parts.py), (a
DTensor TP shard over a real TP group when tp > 1) under the data parallelism training wraps it in
(runtime/parallel/fsdp.py: FSDP2 `replicate` or `fully_shard` over the other ranks, gathered for the
step, so each call pays FSDP2's hooks and no collective, as in a step), forward and backward on a packed
micro-batch of k samples with per-sample attention; the module with no blocks, fed as training feeds it
(runtime/train/compute.py `encode`, `text_loss`); and the module's fixed work per step as the step does
it: every FSDP2 unit's gather and reduction (`DataParallelSteps.begin`, `finish`) over every rank, the
gradient norm's all_reduce and the optimizer step.
"""

from __future__ import annotations

from typing import Any

from orch.planner.specs import ModelSpec, ModuleKind
from orch.runtime.profile.cases import BlockCase, OverheadCase, ProfileConfig, RestCase
from orch.runtime.profile.timing import Timer


class ModuleCases:
    """Times one rank's compute cases; each module is built on first use and kept over lengths and sizes.

    `meshes`: per TP degree, its (dp, tp) submeshes, tp None for a degree of 1; `alone`: this rank's mesh of
    itself (built by every rank, in the same order). Inputs are drawn from one generator per rank, in case order.
    """

    def __init__(
        self,
        model: ModelSpec,
        cfg: ProfileConfig,
        timer: Timer,
        meshes: dict[int, tuple[Any, Any]],
        rank: int,
        alone: Any,
    ):
        import torch

        self.model, self.cfg, self.timer, self.meshes = model, cfg, timer, meshes
        self.alone = alone
        self.dtype, self.device = cfg.torch_dtype, timer.device
        self.gen = torch.Generator().manual_seed(cfg.seed + rank)
        self._blocks: dict[tuple[str, int], Any] = {}
        self._rests: dict[str, Any] = {}

    def block(self, case: BlockCase) -> tuple[float, float | None]:
        """Seconds of one forward+backward, and activation bytes per token where `case.peak`."""
        import torch

        blk = self._block(case.module, case.tp)
        hidden = self.model.modules[case.module].hidden
        x = torch.randn(case.k * case.length, hidden, generator=self.gen, dtype=self.dtype)
        x = x.to(self.device).requires_grad_()
        seqlens = [case.length] * case.k
        seconds = self.timer.time(lambda: blk(x, seqlens).sum().backward())
        if not case.peak:
            return seconds, None
        return seconds, self.timer.peak_bytes(lambda: blk(x, seqlens)) / (case.k * case.length)

    def rest(self, case: RestCase) -> float:
        import torch

        from orch.runtime.data.batch import Sample
        from orch.runtime.train.compute import encode, text_loss

        n, k, dev = case.module, case.k, self.device
        spec, mod = self.model.modules[n], self._rest(n)
        length = spec.round_length(case.length)  # whole images or clips where the module takes only those
        empty = torch.zeros(0, dtype=torch.int64, device=dev)
        if spec.kind == ModuleKind.LLM:
            texts = [torch.randint(0, spec.vocab or 1, (length,), generator=self.gen).to(dev) for _ in range(k)]
            prefixes = [torch.zeros(0, spec.hidden, dtype=self.dtype, device=dev) for _ in range(k)]
            samples = [Sample(i, {}, text, text) for i, text in enumerate(texts)]
            return self.timer.time(lambda: text_loss(mod, prefixes, samples, label_tokens=k * length).backward())
        fpt = self.model.modality(n).frames_per_token
        feats = torch.randn(k * length * fpt, spec.input_dim or 1, generator=self.gen, dtype=self.dtype).to(dev)
        samples = [Sample(i, {n: f}, empty, empty) for i, f in enumerate(feats.split(length * fpt))]
        return self.timer.time(lambda: encode(mod, n, samples, self.dtype, fpt).sum().backward())

    def overhead(self, case: OverheadCase) -> float:
        """The whole module's step-end work with DP over every rank (or over this rank alone): its units gathered
        and their gradients reduced (zeros: a rank that ran none of the module's samples does the same), the
        norm, an SGD step."""
        import torch
        import torch.distributed as dist

        from orch.runtime.parallel.tensor import local_part

        name, spec = case.module, self.model.modules[case.module]
        if spec.hf is not None:
            from orch.runtime.models.hf.parts import build_part

            full = build_part(self.model, name, spec.layers, self._master, self.device, self.cfg.seed, None)
        else:
            from orch.runtime.models.reference import build_module, init_module

            full = build_module(name, self.model).to(self._master)
            init_module(full, name, self.cfg.seed)
            full = full.to(self.device)
        for p in full.parameters():
            p.requires_grad_(spec.trainable)
        steps = self._data_parallel(name, full, 1, self.alone if case.alone else None)
        params = [p for p in full.parameters() if p.requires_grad]
        opt = torch.optim.SGD(params, lr=0.0, foreach=False) if params else None  # as build_optimizer
        norm = torch.zeros((), dtype=torch.float64, device=self.device)

        def step() -> None:
            steps.begin()
            steps.finish()
            norm.zero_()
            for p in params:
                if p.grad is not None:
                    norm.add_(local_part(p.grad).double().pow(2).sum())
            dist.all_reduce(norm)
            if opt is not None:
                opt.step()
                opt.zero_grad(set_to_none=True)

        return self.timer.time(step)

    @property
    def _master(self) -> Any:
        from orch.runtime.parallel.fsdp import master_dtype

        return master_dtype(self.dtype)

    def _data_parallel(self, name: str, module: Any, tp: int, mesh: Any = None) -> Any:
        """`module` wrapped as training wraps it over the ranks outside its TP group (or `mesh`), in the mode the
        planner picks for a module of its size on that many ranks, and the driver of its step (`begin`, `finish`)."""
        from orch.planner.costs import CostConfig, choose_data_parallel
        from orch.planner.plan import Layout
        from orch.runtime.parallel.fsdp import DataParallelSteps, apply_fsdp

        dp_mesh = mesh if mesh is not None else self.meshes[tp][0]
        spec = self.model.modules[name]
        mode = choose_data_parallel(spec, Layout(tp=tp, dp=dp_mesh.size()), CostConfig())
        return DataParallelSteps({name: apply_fsdp(module, name=name, mesh=dp_mesh, mode=mode, dtype=self.dtype)})

    def _block(self, name: str, tp: int) -> Any:
        from orch.runtime.models.reference import Block, init_module
        from orch.runtime.parallel.tensor import apply_tp
        from orch.runtime.profile.one_block import OneBlock

        if (name, tp) not in self._blocks:
            spec = self.model.modules[name]
            tp_mesh = self.meshes[tp][1]
            if spec.hf is not None:  # the HF model's own layer (runtime/models/hf/parts.py)
                from orch.runtime.models.hf.parts import layer_case

                unit = layer_case(self.model, name, self._master, self.device, self.cfg.seed, tp_mesh)
            else:
                blk = Block(spec, causal=spec.kind == ModuleKind.LLM).to(self._master)
                init_module(blk, name, self.cfg.seed)
                if tp_mesh is not None:
                    apply_tp(blk, tp_mesh=tp_mesh)
                unit = OneBlock(blk.to(self.device))
            self._data_parallel(name, unit, tp).begin()  # gathered, no gradient sync: each call is a step's
            self._blocks[(name, tp)] = unit
        return self._blocks[(name, tp)]

    def _rest(self, name: str) -> Any:
        """The module with no blocks: stem, norm and projector of an encoder; embedding and head of the LLM;
        wrapped and gathered as training runs it (its root FSDP2 unit)."""
        from orch.runtime.models.reference import LLM, Encoder, init_module

        if name not in self._rests:
            spec = self.model.modules[name]
            if spec.hf is not None:
                from orch.runtime.models.hf.parts import bare_module

                mod = bare_module(self.model, name, self._master, self.device, self.cfg.seed, None)
            else:
                bare = spec.model_copy(update={"layers": 0})
                if spec.kind == ModuleKind.LLM:
                    mod = LLM(bare)
                else:
                    mod = Encoder(bare, self.model.llm.hidden, self.model.modality(name))
                init_module(mod.to(self._master), name, self.cfg.seed)
                mod = mod.to(self.device)
            self._data_parallel(name, mod, 1).begin()
            self._rests[name] = mod
        return self._rests[name]


__all__ = ["ModuleCases"]
