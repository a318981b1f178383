"""`orch profile`'s compute cases on one rank: a module's block, its parts outside the blocks, its step overhead.

What is timed is what the runtime executes (runtime/train/step.py), through its functions: a Block of
runtime/models/reference.py, or a Hugging Face module's own layer (runtime/models/hf/parts.py), (a
DTensor TP shard over a real TP group when tp > 1) forward and backward
on a packed micro-batch of k samples with per-sample attention; the module with no blocks, fed as
training feeds it (runtime/train/compute.py `encode`, `text_loss`); and the module's fixed work per
step, its coalesced gradient all_reduce (runtime/train/grad_sync.py `all_reduce_flat`) and the
optimizer step.
"""

from __future__ import annotations

from typing import Any

from orch.planner.specs import ModelSpec, ModuleKind
from orch.runtime.profile.cases import BlockCase, OverheadCase, ProfileConfig, RestCase
from orch.runtime.profile.timing import Timer


class ModuleCases:
    """Times one rank's compute cases; each module is built on first use and kept over lengths and sizes.

    `tp_meshes`: the TP submesh of each degree above 1 (built by every rank, in the same order).
    Inputs are drawn from one generator per rank, in case order.
    """

    def __init__(self, model: ModelSpec, cfg: ProfileConfig, timer: Timer, tp_meshes: dict[int, Any], rank: int):
        import torch

        self.model, self.cfg, self.timer, self.tp_meshes = model, cfg, timer, tp_meshes
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

        from orch.runtime.data.synthetic import Sample
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
        """The whole module's gradients summed over every rank (DP over the world), then an optimizer step."""
        import torch

        from orch.runtime.models.reference import build_module
        from orch.runtime.train.grad_sync import all_reduce_flat

        full = build_module(case.module, self.model).to(self.dtype).to(self.device)
        params = list(full.parameters())
        for p in params:
            p.grad = torch.zeros_like(p)
        opt = torch.optim.SGD(params, lr=0.0, foreach=False)  # foreach=False as the runtime's optimizers

        def step() -> None:
            all_reduce_flat([p.grad for p in params], None)
            opt.step()
            opt.zero_grad(set_to_none=False)

        return self.timer.time(step)

    def _block(self, name: str, tp: int) -> Any:
        from orch.runtime.models.reference import Block, init_module
        from orch.runtime.parallel.tensor import apply_tp

        if (name, tp) not in self._blocks:
            spec = self.model.modules[name]
            if spec.hf is not None:  # the HF model's own layer (runtime/models/hf/parts.py)
                from orch.runtime.models.hf.parts import layer_case

                mesh = self.tp_meshes[tp] if tp > 1 else None
                self._blocks[(name, tp)] = layer_case(self.model, name, self.dtype, self.device, self.cfg.seed, mesh)
                return self._blocks[(name, tp)]
            blk = Block(spec, causal=spec.kind == ModuleKind.LLM).to(self.dtype)
            init_module(blk, name, self.cfg.seed)
            if tp > 1:
                apply_tp(blk, tp_mesh=self.tp_meshes[tp])
            self._blocks[(name, tp)] = blk.to(self.device)
        return self._blocks[(name, tp)]

    def _rest(self, name: str) -> Any:
        """The module with no blocks: stem, norm and projector of an encoder; embedding and head of the LLM."""
        from orch.runtime.models.reference import LLM, Encoder, init_module

        if name not in self._rests:
            spec = self.model.modules[name]
            if spec.hf is not None:
                from orch.runtime.models.hf.parts import bare_module

                self._rests[name] = bare_module(self.model, name, self.dtype, self.device, self.cfg.seed, None)
                return self._rests[name]
            bare = spec.model_copy(update={"layers": 0})
            if spec.kind == ModuleKind.LLM:
                mod = LLM(bare)
            else:
                mod = Encoder(bare, self.model.llm.hidden, self.model.modality(name))
            init_module(mod.to(self.dtype), name, self.cfg.seed)
            self._rests[name] = mod.to(self.device)
        return self._rests[name]


__all__ = ["ModuleCases"]
