"""The reference MLLM: vision and audio encoders with projectors, and a decoder-only LLM.

Shapes come from a ModelSpec. Every module works on *packed* variable-length sequences: a
micro-batch is one tensor of all its samples' tokens, `x_TD`, plus the per-sample lengths;
attention is computed per sample so it never crosses a sample boundary (correctness first;
a block-diagonal varlen kernel is an optimisation of the same contract).

Blocks are written for DTensor tensor parallelism (`block_tp_plan`, applied by runtime/parallel/tensor.py):
q/k/v/gate/up/fc1 are column-parallel and o/down/fc2 row-parallel, so the head count a rank holds is read
from the local output width (heads / tp), never from the spec. Both modules implement the contract of
runtime/models/contract.py.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

import torch
import torch.nn.functional as F
from torch import nn

from orch.planner.specs import Modality, ModelSpec, ModuleKind, ModuleSpec, projected_len
from orch.runtime.models.staged import StagedDecoder
from orch.runtime.seeds import stable_seed

if TYPE_CHECKING:
    from torch.distributed.tensor.parallel import ParallelStyle

    from orch.runtime.models.contract import ExpertBlock, ExpertExchange
    from orch.runtime.parallel.context import CPShard

# The audio stem is a Whisper-style strided conv merging `Modality.frames_per_token` frames into one
# encoder token (planner/specs.py); the DataSpec's audio length counts encoder tokens.


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float = 1e-6) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * self.weight


class Attention(nn.Module):
    def __init__(self, hidden: int, heads: int, kv_heads: int, causal: bool) -> None:
        super().__init__()
        self.head_dim = hidden // heads
        self.causal = causal
        self.q = nn.Linear(hidden, heads * self.head_dim, bias=False)
        self.k = nn.Linear(hidden, kv_heads * self.head_dim, bias=False)
        self.v = nn.Linear(hidden, kv_heads * self.head_dim, bias=False)
        self.o = nn.Linear(heads * self.head_dim, hidden, bias=False)

    def forward(self, x_TD: torch.Tensor, seqlens: list[int], cp: CPShard | None = None) -> torch.Tensor:
        # Local head counts from the local widths: under TP each rank holds heads/tp of them.
        # (unflatten, not view(t, -1, d): a CP rank may hold t = 0 rows)
        q_THd = self.q(x_TD).unflatten(-1, (-1, self.head_dim))
        k_THd = self.k(x_TD).unflatten(-1, (-1, self.head_dim))
        v_THd = self.v(x_TD).unflatten(-1, (-1, self.head_dim))
        group = q_THd.shape[1] // k_THd.shape[1]
        kv_lens, q_pos = seqlens, [None] * len(seqlens)
        if cp is not None:  # CP: my query rows against every sample's whole K/V (runtime/parallel/context.py)
            k_THd, v_THd = cp.gather_kv(k_THd, v_THd)
            kv_lens, q_pos = cp.lens, [cp.mine_on_device(i) for i in range(len(seqlens))]
        outs = []
        for q, k, v, qp in zip(q_THd.split(seqlens), k_THd.split(kv_lens), v_THd.split(kv_lens), q_pos, strict=True):
            outs.append(attend(q, k, v, group, self.causal, q_offset=0, q_pos=qp))
        y_THd = torch.cat(outs) if outs else q_THd
        return self.o(y_THd.flatten(1))


def attend(
    q_QHd: torch.Tensor,
    k_KHd: torch.Tensor,
    v_KHd: torch.Tensor,
    group: int,
    causal: bool,
    q_offset: int,
    q_pos: torch.Tensor | None = None,
    scale: float | None = None,
    window: int | None = None,
) -> torch.Tensor:
    """Softmax attention of one sample; query i sits at key position q_pos[i] (CP shards), else q_offset + i.

    `scale`: the scores' factor (default 1/sqrt(head dim)); `window`: a causal sliding window (Mistral's),
    a query seeing only the `window` keys ending at its own position. Through torch's fused attention
    (scaled_dot_product_attention: flash or memory-efficient kernels where the device has them, never the
    Q x K scores kept for backward), a plain causal square as `is_causal`, any other pattern as a mask.
    """
    if group > 1:  # GQA: query heads [g*j, g*j+g) share kv head j, also on a TP shard
        k_KHd = k_KHd.repeat_interleave(group, dim=1)
        v_KHd = v_KHd.repeat_interleave(group, dim=1)
    factor = scale if scale is not None else 1.0 / math.sqrt(q_QHd.shape[-1])
    square = q_pos is None and q_offset == 0 and window is None and q_QHd.shape[0] == k_KHd.shape[0]
    allowed = None
    if causal and not square:
        dev = q_QHd.device  # positions on the activations' device (CP positions arrive on the CPU)
        qpos = q_pos.to(dev) if q_pos is not None else torch.arange(q_QHd.shape[0], device=dev) + q_offset
        qpos = qpos.unsqueeze(1)
        kpos = torch.arange(k_KHd.shape[0], device=dev).unsqueeze(0)
        allowed = kpos <= qpos
        if window is not None:
            allowed = allowed & (qpos - kpos < window)
    # (1, heads, rows, dim): the 4-d layout torch's fused kernels take (a 3-d call falls back to the math path)
    out_1HQd = F.scaled_dot_product_attention(
        q_QHd.transpose(0, 1).unsqueeze(0),
        k_KHd.transpose(0, 1).unsqueeze(0),
        v_KHd.transpose(0, 1).unsqueeze(0),
        attn_mask=allowed,
        is_causal=causal and square,
        scale=factor,
    )
    return out_1HQd[0].transpose(0, 1)


class SwiGLU(nn.Module):
    def __init__(self, hidden: int, ffn: int) -> None:
        super().__init__()
        self.gate = nn.Linear(hidden, ffn, bias=False)
        self.up = nn.Linear(hidden, ffn, bias=False)
        self.down = nn.Linear(ffn, hidden, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down(F.silu(self.gate(x)) * self.up(x))


class GeluMLP(nn.Module):
    def __init__(self, hidden: int, ffn: int) -> None:
        super().__init__()
        self.fc1 = nn.Linear(hidden, ffn, bias=False)
        self.fc2 = nn.Linear(ffn, hidden, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(F.gelu(self.fc1(x)))


def dense_mlp(spec: ModuleSpec, width: int | None = None) -> nn.Module:
    """The module's MLP kind at `width` (default ffn; one expert of a MoE block is one of these at expert_width)."""
    width = width or spec.ffn
    return SwiGLU(spec.hidden, width) if spec.mlp_kind == "swiglu" else GeluMLP(spec.hidden, width)


class MoE(nn.Module):
    """Dropless top-k Mixture-of-Experts MLP: a replicated router and `experts` MLPs of the module's kind.

    Per token t: p = softmax(router(x_t)) over all experts; the k largest (torch.topk, so ties go
    to the lower expert index) are chosen and their gates renormalised over the chosen k,
    g_j = p_j / sum_chosen p (Mixtral convention); y_t = sum_j g_j * expert_j(x_t). No capacity
    and no dropped tokens, so a token's output never depends on which tokens share its micro-batch
    or rank: any grouping gives the reference result. Its router logits are kept for the load-balancing
    auxiliary loss where the spec asks for it (runtime/train/aux_loss.py: per micro-batch, a whole-batch
    statistic otherwise).

    Experts live in a ModuleDict keyed by their global index, so parameter names (and the
    name-seeded init) are the same whichever experts a rank holds. `exchange` is None when every
    expert is local; expert parallelism (runtime/parallel/expert.py) keeps only this rank's
    experts and sets `exchange` to the all_to_all that carries rows to their owners and back.
    Under TP the experts stay unsharded: every TP rank sees the same tokens and computes the same
    experts (apply_tp leaves MoE blocks alone; only attention is TP-sharded).
    """

    def __init__(self, spec: ModuleSpec) -> None:
        super().__init__()
        self.num_experts, self.top_k = spec.experts, spec.top_k
        self.router = nn.Linear(spec.hidden, spec.experts, bias=False)
        self.experts = nn.ModuleDict({str(e): dense_mlp(spec, spec.expert_width) for e in range(spec.experts)})
        self.exchange: ExpertExchange | None = None
        self.router_logits: torch.Tensor | None = None  # the last call's, kept for the router's aux loss
        self.keeps_logits = False  # set by runtime/train/aux_loss.py when the model asks for the aux loss

    def take_router_logits(self) -> torch.Tensor | None:
        logits, self.router_logits = self.router_logits, None
        return logits

    def keep_experts(self, local: list[int], mesh: Any) -> None:
        """Hold only experts `local` (expert parallelism); the others are deleted (names are global indices)."""
        keep = {str(e) for e in local}
        for key in [k for k in self.experts if k not in keep]:
            del self.experts[key]

    def route(self, x_TD: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(chosen experts [T, k], renormalised gates [T, k]) of every token."""
        logits_TE = self.router(x_TD)
        if self.keeps_logits:
            self.router_logits = logits_TE
        probs_TE = logits_TE.softmax(-1)
        top_TK, idx_TK = probs_TE.topk(self.top_k, dim=-1)
        return idx_TK, top_TK / top_TK.sum(-1, keepdim=True)

    def run_experts(self, x_ND: torch.Tensor, counts: list[int], experts: list[int]) -> torch.Tensor:
        """Rows grouped by expert (counts[i] rows for experts[i], in that order) through their experts."""
        parts = x_ND.split(counts)
        outs = [self._expert(str(e), part) for e, part in zip(experts, parts, strict=True)]
        return torch.cat(outs) if outs else x_ND

    def _expert(self, key: str, x_ND: torch.Tensor) -> torch.Tensor:
        """One expert on its rows, in its weights' dtype: under EP with bf16 compute the experts stay fp32
        masters outside FSDP2's casts (runtime/parallel/fsdp.py), so their rows are cast to them and back."""
        expert = self.experts[key]
        dtype = next(expert.parameters()).dtype
        return expert(x_ND.to(dtype)).to(x_ND.dtype) if dtype != x_ND.dtype else expert(x_ND)

    def forward(self, x_TD: torch.Tensor) -> torch.Tensor:
        idx_TK, gates_TK = self.route(x_TD)
        return run_routed(self, x_TD, idx_TK, gates_TK)


def run_routed(block: ExpertBlock, x_TD: torch.Tensor, idx_TK: torch.Tensor, gates_TK: torch.Tensor) -> torch.Tensor:
    """A MoE block's output from its routing (the reference MoE's and HF's sparse blocks alike): one row per
    (token, choice), sorted by expert (stable: token order within an expert), run on the block's experts here
    or through its `exchange` (expert parallelism), put back in token order and summed with the gates."""
    t, d = x_TD.shape
    order_N = torch.argsort(idx_TK.reshape(-1), stable=True)
    x_ND = x_TD[order_N // block.top_k]
    counts_E = torch.bincount(idx_TK.reshape(-1), minlength=block.num_experts)
    if block.exchange is None:
        y_ND = block.run_experts(x_ND, counts_E.tolist(), list(range(block.num_experts)))
    else:
        y_ND = block.exchange(block, x_ND, counts_E)
    y_TKD = y_ND[inverse_permutation(order_N)].view(t, block.top_k, d)
    return (gates_TK.unsqueeze(-1).to(y_TKD.dtype) * y_TKD).sum(1)


def inverse_permutation(perm: torch.Tensor) -> torch.Tensor:
    inv = torch.empty_like(perm)
    inv[perm] = torch.arange(perm.numel(), dtype=perm.dtype, device=perm.device)
    return inv


class Block(nn.Module):
    def __init__(self, spec: ModuleSpec, causal: bool, index: int = 0) -> None:
        super().__init__()
        self.attn_norm = RMSNorm(spec.hidden)
        self.attn = Attention(spec.hidden, spec.heads, spec.num_kv_heads, causal)
        self.mlp_norm = RMSNorm(spec.hidden)
        self.mlp = MoE(spec) if spec.is_moe_block(index) else dense_mlp(spec)

    def forward(self, x_TD: torch.Tensor, seqlens: list[int], cp: CPShard | None = None) -> torch.Tensor:
        if x_TD.shape[0] == 0 and cp is None:  # an empty micro-batch (EP ranks run them): the MoE exchange runs
            return x_TD + self.mlp(self.mlp_norm(x_TD))
        x_TD = x_TD + self.attn(self.attn_norm(x_TD), seqlens, cp)
        return x_TD + self.mlp(self.mlp_norm(x_TD))


def block_tp_plan(module: nn.Module) -> dict[str, ParallelStyle]:
    """Megatron's TP plan of every reference Block inside `module` (itself included), keyed by its path: q/k/v
    and the MLP's first projections colwise, o and the last projection rowwise. MoE blocks keep router and
    experts unsharded (every TP rank runs the same experts on the same tokens); only their attention splits."""
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel

    plan: dict[str, ParallelStyle] = {}
    for path, block in module.named_modules():
        if not isinstance(block, Block):
            continue
        at = f"{path}." if path else ""
        plan |= {f"{at}attn.{p}": ColwiseParallel() for p in ("q", "k", "v")} | {f"{at}attn.o": RowwiseParallel()}
        if isinstance(block.mlp, GeluMLP):
            plan |= {f"{at}mlp.fc1": ColwiseParallel(), f"{at}mlp.fc2": RowwiseParallel()}
        elif not isinstance(block.mlp, MoE):
            plan |= {f"{at}mlp.{p}": ColwiseParallel() for p in ("gate", "up")} | {f"{at}mlp.down": RowwiseParallel()}
    return plan


class Projector(nn.Module):
    """Merges `downsample` consecutive encoder tokens (zero-padded at a sample's end) into one LLM token."""

    def __init__(self, enc_hidden: int, llm_hidden: int, downsample: int) -> None:
        super().__init__()
        self.downsample = downsample
        self.proj = nn.Linear(enc_hidden * downsample, llm_hidden)

    def forward(self, x_TD: torch.Tensor, seqlens: list[int]) -> torch.Tensor:
        ds = self.downsample
        if ds > 1:
            parts = []
            for s in x_TD.split(seqlens):
                pad = projected_len(s.shape[0], ds) * ds - s.shape[0]
                parts.append(F.pad(s, (0, 0, 0, pad)).reshape(-1, ds * s.shape[1]))
            x_TD = torch.cat(parts) if parts else x_TD.reshape(0, ds * x_TD.shape[1])
        return self.proj(x_TD)


class Encoder(nn.Module):
    """Stem (patch embedding or conv subsampling) + blocks + norm + projector into the LLM width."""

    def __init__(self, spec: ModuleSpec, llm_hidden: int, modality: Modality) -> None:
        super().__init__()
        if spec.input_dim is None:  # ModelSpec fills it by modality; a bare ModuleSpec may lack it
            raise ValueError("an encoder needs input_dim (ModelSpec gives each encoder its modality's default)")
        self.modality = modality
        self.is_audio = self.modality == Modality.AUDIO
        if self.is_audio:
            stride = modality.frames_per_token
            self.stem = nn.Conv1d(spec.input_dim, spec.hidden, stride, stride=stride)
        else:
            self.stem = nn.Linear(spec.input_dim, spec.hidden)
        self.blocks = nn.ModuleList(Block(spec, causal=False, index=i) for i in range(spec.layers))
        self.norm = RMSNorm(spec.hidden)
        self.projector = Projector(spec.hidden, llm_hidden, spec.downsample)
        self.output_dim = llm_hidden

    def tp_plan(self) -> dict[str, ParallelStyle]:
        return block_tp_plan(self)

    def forward(self, feats_TF: torch.Tensor, seqlens: list[int], cp: CPShard | None = None) -> torch.Tensor:
        """feats_TF: packed input features; seqlens: encoder tokens per sample. Returns packed LLM-width tokens.

        With `cp` (sharded in units of the projector's downsample): my tokens' features in, every
        rank's projected rows out (runtime/parallel/context.py).
        """
        if cp is not None:
            feats_TF = cp.take(feats_TF, self.modality.frames_per_token)
            seqlens = cp.local_lens
        if self.is_audio and feats_TF.shape[0] == 0:  # a CP rank without tokens here: the conv refuses 0 frames
            x_TD = feats_TF.new_zeros(0, self.stem.out_channels)
        elif self.is_audio:
            # Every sample has frames_per_token x tokens frames, so the strided conv never straddles two samples.
            x_TD = self.stem(feats_TF.t().unsqueeze(0)).squeeze(0).t()
        else:
            x_TD = self.stem(feats_TF)
        for block in self.blocks:
            x_TD = block(x_TD, seqlens, cp)
        out = self.projector(self.norm(x_TD), seqlens)
        return cp.gather_units(out) if cp is not None else out


class LLM(StagedDecoder):
    """Decoder-only LLM in three pieces, so a pipeline stage runs only its share:
    `embed_inputs` (first stage), `run_blocks` (every stage, its layers), `text_logits` (last).

    Blocks live in a ModuleDict keyed by layer index, so parameter names ("blocks.3.attn.q.weight")
    are the same in the full model and in a stage that keeps layers 2-3 (`keep_stage`).
    """

    PARTS = ("embed", "blocks", "norm", "head")

    def __init__(self, spec: ModuleSpec) -> None:
        super().__init__()
        assert spec.vocab is not None
        self.embed: nn.Embedding | None = nn.Embedding(spec.vocab, spec.hidden)
        self.blocks = nn.ModuleDict({str(i): Block(spec, causal=True, index=i) for i in range(spec.layers)})
        self.norm: RMSNorm | None = RMSNorm(spec.hidden)
        self.head: nn.Linear | None = nn.Linear(spec.hidden, spec.vocab, bias=False)

    def tp_plan(self) -> dict[str, ParallelStyle]:
        return block_tp_plan(self)

    def run_blocks(self, x_TD: torch.Tensor, seqlens: list[int], cp: CPShard | None = None) -> torch.Tensor:
        """`seqlens`: rows per sample as packed in x_TD (this CP rank's counts under CP)."""
        for block in self.blocks.values():
            x_TD = block(x_TD, seqlens, cp)
        return x_TD


def build_module(name: str, model: ModelSpec) -> nn.Module:
    spec = model.modules[name]
    if spec.kind == ModuleKind.LLM:
        return LLM(spec)
    return Encoder(spec, model.llm.hidden, model.modality(name))


@torch.no_grad()
def init_module(module: nn.Module, name: str, seed: int) -> None:
    """Fill every parameter from (seed, module name, parameter name) alone: layout-independent.

    Call before tensor parallelism: full tensors are generated on every rank, then sharded.
    """
    for pname, p in module.named_parameters():
        gen = torch.Generator().manual_seed(stable_seed(seed, name, pname))
        if pname.endswith("norm.weight"):
            # Near one, not exactly one, so a norm weight's gradient path is checked too.
            p.copy_(1.0 + 0.1 * torch.randn(p.shape, generator=gen, dtype=torch.float64))
        elif p.ndim >= 2:
            fan_in = p[0].numel()
            p.copy_(torch.randn(p.shape, generator=gen, dtype=torch.float64) / math.sqrt(fan_in))
        else:
            p.copy_(0.02 * torch.randn(p.shape, generator=gen, dtype=torch.float64))


def build_model(
    model: ModelSpec, seed: int, dtype: torch.dtype, names: list[str] | None = None
) -> dict[str, nn.Module]:
    """Full (unsharded) modules by name, initialised from the seed."""
    out = {}
    for name in names if names is not None else list(model.modules):
        module = build_module(name, model).to(dtype)
        init_module(module, name, seed)
        out[name] = module
    return out
