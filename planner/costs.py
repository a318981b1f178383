"""Cost model: parameters, FLOPs, time and memory of one module under one layout.

Pure arithmetic over specs; the search (planner/search.py) only compares these numbers.
Sources: Narayanan et al. 2021 (Megatron-LM PTD-P: 1F1B bubble, communication volumes),
Korthikanti et al. 2022 (activation memory under fused attention, sequence parallelism, selective
recompute; per block as the runtime's blocks save it, `block_activation_bytes`); state memory as FSDP2 holds it
(`state_bytes_per_param`, `gathered_bytes`).
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass, field
from typing import NamedTuple

from orch.planner.data import TokenStats, module_draws, most_held, token_stats
from orch.planner.imbalance import item_tokens, residual_imbalance
from orch.planner.plan import DataParallel, Layout, Recompute, Sharding
from orch.planner.profile import Profile
from orch.planner.sample_cost import SampleCost
from orch.planner.specs import ClusterSpec, DataSpec, ModelSpec, ModuleKind, ModuleSpec

BF16 = 2
FP32 = 4
GB = 1e9


@dataclass(frozen=True)
class CostConfig:
    """Knobs of the cost model that no spec carries."""

    gemm_width_knee: float = 256.0  # shard width where GEMM efficiency falls to 1/2 (narrow TP shards)
    gemm_tokens_knee: float = 256.0  # tokens per GPU per micro-batch where efficiency falls to 1/2 (CP, tiny batches)
    dp_overlap: float = 0.7  # share of DP gradient/parameter traffic hidden behind backward/forward
    grad_bytes: int = FP32  # bytes per gradient element reduced over DP
    data_parallel: DataParallel | None = None  # every module's, when the user chose; else `choose_data_parallel`
    replicate_below_params: float = 20e6  # a module with fewer parameters per GPU replicates its state
    sharding: Sharding | None = None  # every fsdp module's, when the user chose; else the search prices both
    sharding_of: tuple[tuple[str, Sharding], ...] = ()  # (module, sharding) the user chose for one module
    # Under fsdp the search also prices reshard for a layout whose keep memory passes this share of the GPU
    # (below it keep leaves a third of the GPU to the modules beside it, and is faster): the candidates grow
    # only where memory binds (at half, `orch plan` on 2,560 GPUs took 50% longer; at 0.65, 8%).
    reshard_above_share: float = 0.65


def choose_data_parallel(m: ModuleSpec, layout: Layout, cfg: CostConfig) -> DataParallel:
    """fsdp unless there is nothing to shard over (dp x cp of 1) or the module is small, where one all-reduce
    beats a gather and a reduce-scatter and the replicated state costs little memory."""
    return _choose_mode(_local_params(m, layout), layout, cfg)


def _choose_mode(params_local: float, layout: Layout, cfg: CostConfig) -> DataParallel:
    if cfg.data_parallel is not None:
        return cfg.data_parallel
    if layout.dp * layout.cp == 1 or params_local < cfg.replicate_below_params:
        return DataParallel.REPLICATE
    return DataParallel.FSDP


def state_bytes_per_param(
    mode: DataParallel,
    trainable: bool,
    shards: int,
    compute_bytes: int = BF16,
    sharding: Sharding = Sharding.KEEP,
) -> float:
    """Peak bytes per local parameter of a step's training state, as FSDP2 holds it (runtime/parallel/fsdp.py).

    The parameters are fp32 masters (sharded over `shards` ranks under fsdp). keep: for the step they are
    gathered once into the compute dtype, and the gradients accumulate at full size in fp32 until the step's
    one reduction. reshard: only shards: the fp32 master, the fp32 gradient each micro-batch's reduce-scatter
    adds to, and the moments, 16/d; the blocks gathered at a time are `gathered_bytes` beside it. AdamW's two
    moments follow the masters. A frozen module has no gradient or moments. With a compute dtype of fp32 the
    gathered copy is the master itself under replicate (nothing to cast).
    """
    d = shards if mode == DataParallel.FSDP else 1
    if mode == DataParallel.FSDP and sharding == Sharding.RESHARD:
        return (FP32 + (FP32 + 2 * FP32 if trainable else 0)) / d
    if not trainable:
        return compute_bytes + FP32 / d if mode == DataParallel.FSDP or compute_bytes != FP32 else FP32
    copy = compute_bytes if mode == DataParallel.FSDP or compute_bytes != FP32 else 0
    return copy + FP32 + (FP32 + 2 * FP32) / d


def gathered_bytes(root: float, block: float, trainable: bool, compute_bytes: int = BF16, part: float = 0.0) -> float:
    """Bytes a resharding module holds gathered at its peak, beside its shards (`state_bytes_per_param`), from its
    local parameters gathered for the whole step (`root`: an encoder's stem, norm and projector; a tied LLM's
    embedding and head; runtime/parallel/fsdp.py), in one block, and in an LLM's largest part gathered per call
    (`part`: its embedding or head). The root holds its gathered copy, its gradient in the compute dtype and, at
    the step's end, the fp32 reduce-scatter input. A block or part in backward holds its copy and its gradient, then
    frees the copy before it allocates the fp32 reduce-scatter input (FSDP2's post_backward reshards first, and
    waits for the previous unit's reduce-scatter before it takes another input buffer): the larger of the two
    moments; a block's neighbour, prefetched, its gathered copy beside it. A part and the blocks are gathered at
    different moments: the larger of the two."""
    root_per_param = compute_bytes + (compute_bytes + FP32 if trainable else 0)
    unit_per_param = compute_bytes + (max(compute_bytes, FP32) if trainable else 0)
    return root * root_per_param + max(part * unit_per_param, block * (unit_per_param + compute_bytes))


def mlp_params(m: ModuleSpec, width: int) -> float:
    """One MLP of the module's kind from its width to an inner `width` and back."""
    return (3 if m.mlp_kind == "swiglu" else 2) * m.hidden * width


def moe_share(m: ModuleSpec) -> float:
    """The fraction of the module's blocks whose MLP is experts (dense_blocks are not): per-block costs are
    averages over the blocks."""
    return m.moe_blocks / m.layers


def layer_params(m: ModuleSpec, active: bool = False) -> float:
    """Parameters of one transformer block, averaged over the blocks (active=True: the experts a token actually
    uses). A MoE block: a router and `experts` MLPs of expert_width; a dense block of a MoE module
    (dense_blocks): one MLP of ffn width."""
    h = m.hidden
    attn = 2 * h * m.attention_width + 2 * h * m.num_kv_heads * m.head_width
    if m.experts == 1:
        return attn + mlp_params(m, m.ffn) + 2 * h
    experts = m.top_k if active else m.experts
    moe = experts * mlp_params(m, m.expert_width) + h * m.experts
    share = moe_share(m)
    return attn + share * moe + (1 - share) * mlp_params(m, m.ffn) + 2 * h


def _expert_params(m: ModuleSpec) -> float:
    """The experts' parameters of one block, averaged over the blocks."""
    return moe_share(m) * m.experts * mlp_params(m, m.expert_width) if m.experts > 1 else 0.0


def module_params(m: ModuleSpec) -> float:
    embed = 2 * m.vocab * m.hidden if m.vocab else 0
    stem = (m.input_dim or 0) * m.hidden
    return m.layers * layer_params(m) + embed + stem


def projector_params(m: ModuleSpec, llm: ModuleSpec) -> float:
    """An encoder's projector from hidden x downsample to the LLM's width: one linear layer, or a two-layer MLP
    of `projector_hidden` inner width (Qwen-VL's merger); one more of it per deepstack block (Qwen3-VL)."""
    if m.kind != ModuleKind.ENCODER:
        return 0.0
    width = m.hidden * m.downsample
    one = width * llm.hidden if m.projector_hidden is None else m.projector_hidden * (width + llm.hidden)
    return one * (1 + len(m.deepstack_blocks or ()))


@dataclass(frozen=True)
class Workload:
    """What one step asks of a module: samples, tokens and Σlen² (attention), from the data."""

    samples: int
    tokens: float  # per step
    tokens_sq: float  # Σ len² per step
    max_len: int
    stats: TokenStats
    out_tokens: float  # encoder output tokens into the LLM per step (after downsample)
    scored: float = 1.0  # the LLM's: share of its tokens that get logits (text; not the encoders' prefix rows)

    draws: tuple[int, ...] = ()  # the module's tokens per drawn sample (planner/data.py module_draws)
    _held: dict[int, int] = field(default_factory=dict, compare=False, repr=False)  # most_held by samples
    _held_by_layout: dict[tuple[int, int, int], float] = field(default_factory=dict, compare=False, repr=False)

    def held_tokens(self, micro_batch: int, in_flight: int = 1, dp: int = 1) -> float:
        """Tokens of `in_flight` micro-batches of `micro_batch` samples a GPU holds at once (an encoder's under the
        three-phase schedule, a first pipeline stage's) on one of `dp` ranks the post-balancer evens out: the most
        that many samples of all the ranks hold together over the drawn samples (planner/data.py most_held), shared
        by the ranks, and about one sample of the mix more as whole samples are dealt (never more than the most
        this rank's own samples could hold), at least the longest sample: a run's peak. Not the longest sample in
        each micro-batch where long samples are rare; not the mean where lengths spread (bench/bench_memory_shapes.py:
        one of 8 steps of its mix, a quarter long videos, draws 9 videos of 16)."""
        key = (micro_batch, in_flight, dp)
        if key not in self._held_by_layout:  # the search asks the same few shapes of every layout
            self._held_by_layout[key] = self._held_tokens(micro_batch * in_flight, dp)
        return self._held_by_layout[key]

    def _held_tokens(self, mine: int, dp: int) -> float:
        n = mine * dp
        # the balancer deals whole samples: a rank's share of the step and about one sample of the mix more
        extra = self.stats.mean * (1 - 1 / dp)
        if len(self.draws) < 4 * n:  # too few groups of n to show a tail: so many samples hold about their mean
            return max(n * self.stats.mean / dp + extra, float(self.max_len))
        return float(max(min(self._most(n) / dp + extra, self._most(mine)), self.max_len))

    def _most(self, n: int) -> int:
        if n not in self._held:
            self._held[n] = most_held(self.draws, n)
        return self._held[n]


def workload(model: ModelSpec, data: DataSpec, module: str) -> Workload:
    stats = token_stats(data, module, model.llm_name)
    m = model.modules[module]
    tokens = data.global_batch * stats.mean
    scored = 1.0
    if m.kind == ModuleKind.LLM and stats.mean > 0:
        prefix = sum(
            token_stats(data, e, model.llm_name).mean / model.modules[e].downsample for e in model.encoder_names
        )
        scored = min(max(1.0 - prefix / stats.mean, 0.0), 1.0)
    return Workload(
        samples=data.global_batch,
        tokens=tokens,
        tokens_sq=data.global_batch * stats.mean_sq,
        max_len=stats.max,
        stats=stats,
        out_tokens=tokens / m.downsample if m.kind == ModuleKind.ENCODER else 0.0,
        scored=scored,
        draws=module_draws(data, module, model.llm_name),
    )


class ForwardFlops(NamedTuple):
    """FLOPs of one module's forward on a sample of n tokens: per_token · n + per_pair · n²."""

    per_token: float  # every weight a token meets (linear in the sample's length)
    per_pair: float  # attention, per pair of tokens of one sample


def attention_coefficients(m: ModuleSpec) -> ForwardFlops:
    """FLOPs of QKᵀ and PV over all blocks, 4 · attention_width per pair of tokens that meet (no causal half).

    A block that attends over its whole sequence gives a per-pair term; one attending inside windows of
    `window_tokens` (Qwen2.5-VL's windowed blocks, Qwen2.5-Omni's audio chunks) is linear: each token meets its
    window, so 4 · attention_width · window_tokens per token. A tower of fixed-size images (`image_tokens`: LLaVA's
    images, InternVL's tiles) attends inside each one, so it too is linear: 4 · attention_width · image_tokens per
    token in every block, however many images or tiles a sample has. The sequence of a tower with item_attention
    is one image or video frame, but a sample's items are not known here: its full-attention blocks are priced over
    the sample's patches (Σlen², an upper bound of Σ over its images and frames)."""
    width = m.attention_width
    if m.image_tokens and not m.clip_tokens:
        return ForwardFlops(per_token=4 * width * m.image_tokens * m.layers, per_pair=0.0)
    windowed = m.layers - m.full_attention_layers
    return ForwardFlops(
        per_token=4 * width * (m.window_tokens or 0) * windowed, per_pair=4 * width * m.full_attention_layers
    )


def forward_coefficients(m: ModuleSpec, llm: ModuleSpec) -> ForwardFlops:
    """Per-token and per-pair FLOPs of module m's forward, 2 FLOPs per multiply-add.

    Per token: every block's weights once (a MoE block: its router and the top_k experts the token
    is routed to, not all of them; layer_params(active=True)), the LLM's head, an encoder's stem
    and its projector (which merges `downsample` tokens into one), and windowed attention. Per pair:
    QKᵀ and PV of the full-attention blocks (`attention_coefficients`), half of it for the causal LLM.
    The planner prices a step with these (forward_flops) and the runtime's dispatcher a sample
    (runtime/train/post_balance.py).
    """
    head = 2 * m.hidden * m.vocab if m.vocab else 0.0
    stem = 2 * (m.input_dim or 0) * m.hidden
    proj = 2 * projector_params(m, llm) / m.downsample
    causal = 0.5 if m.kind == ModuleKind.LLM else 1.0
    attn = attention_coefficients(m)
    return ForwardFlops(
        per_token=2 * layer_params(m, active=True) * m.layers + attn.per_token + head + stem + proj,
        per_pair=attn.per_pair * causal,
    )


def forward_flops(m: ModuleSpec, llm: ModuleSpec, w: Workload) -> float:
    """Model FLOPs of one forward pass over a step's tokens (what MFU counts)."""
    flops = forward_coefficients(m, llm)
    return flops.per_token * w.tokens + flops.per_pair * w.tokens_sq


def train_flops(m: ModuleSpec, llm: ModuleSpec, w: Workload) -> float:
    """Forward + backward model FLOPs (3x forward when trainable, 1x when frozen)."""
    return forward_flops(m, llm, w) * (3.0 if m.trainable else 1.0)


def _ring(bytes_total: float, n: int, gbps: float, alpha_s: float) -> float:
    """All-gather or reduce-scatter of bytes_total over n ranks on a ring."""
    if n <= 1 or bytes_total <= 0:
        return 0.0
    return (n - 1) * alpha_s + (n - 1) / n * bytes_total / (gbps * GB)


@dataclass(frozen=True)
class Links:
    """Alpha-beta figures of both link kinds, from the cluster spec or a profile."""

    intra_gbps: float
    inter_gbps: float
    intra_alpha: float
    inter_alpha: float
    gpus_per_node: int
    nodes: int = 1

    @classmethod
    def build(cls, cluster: ClusterSpec, profile: Profile | None) -> Links:
        intra = (cluster.links.intra_node_gbps, cluster.links.intra_node_latency_us * 1e-6)
        inter = (cluster.links.inter_node_gbps, cluster.links.inter_node_latency_us * 1e-6)
        if profile is not None:
            if "intra_node" in profile.links:
                intra = (profile.links["intra_node"].gbps, profile.links["intra_node"].alpha_s)
            if "inter_node" in profile.links:
                inter = (profile.links["inter_node"].gbps, profile.links["inter_node"].alpha_s)
        return cls(intra[0], inter[0], intra[1], inter[1], cluster.gpus_per_node, cluster.nodes)

    def axis(self, stride: int, size: int) -> tuple[float, float]:
        """(GB/s, alpha) of a group of `size` ranks `stride` apart; any node crossing is the bottleneck. The groups
        tile consecutive blocks of stride x size ranks: on a cluster of several nodes, a block that does not
        divide a node's GPUs (TP 5 on 8-GPU nodes) has some groups straddling two nodes, which set the pace."""
        span = stride * size
        if span <= self.gpus_per_node and (self.nodes == 1 or self.gpus_per_node % span == 0):
            return self.intra_gbps, self.intra_alpha
        return self.inter_gbps, self.inter_alpha

    def ring(self, bytes_total: float, stride: int, size: int) -> float:
        gbps, alpha = self.axis(stride, size)
        return _ring(bytes_total, size, gbps, alpha)

    def p2p(self, nbytes: float, inter: bool) -> float:
        if nbytes <= 0:
            return 0.0
        gbps, alpha = (self.inter_gbps, self.inter_alpha) if inter else (self.intra_gbps, self.intra_alpha)
        return alpha + nbytes / (gbps * GB)


@dataclass(frozen=True)
class ModuleCost:
    """Predicted busy time and per-GPU memory of one module under one layout, for one step."""

    compute_s: float  # forward+backward math on one GPU (incl. recompute)
    tp_s: float
    cp_s: float
    ep_s: float
    pp_p2p_s: float
    dp_s: float  # exposed DP gradient/parameter traffic
    bubble_s: float  # pipeline fill/drain
    forward_s: float  # the forward share of compute+comm (three-phase schedule splits it)
    params_gb: float
    activations_gb: float
    model_flops: float  # train FLOPs of the step (no recompute), for MFU
    overhead_s: float = 0.0  # measured fixed work per step: gradient sync and optimizer
    # measured runtime work per step: orchestrator (announce, dispatch, routes), batch bookkeeping
    orchestrator_s: float = 0.0
    data_parallel: DataParallel = DataParallel.REPLICATE
    sharding: Sharding = Sharding.KEEP

    @property
    def work_s(self) -> float:
        """The module's forward and backward passes with their collectives and pipeline bubble."""
        return self.compute_s + self.tp_s + self.cp_s + self.ep_s + self.pp_p2p_s + self.dp_s + self.bubble_s

    @property
    def fixed_s(self) -> float:
        """Work once per step whatever the micro-batching: not stretched by a pipeline's fill."""
        return self.overhead_s + self.orchestrator_s

    @property
    def time_s(self) -> float:
        return self.work_s + self.fixed_s

    @property
    def memory_gb(self) -> float:
        return self.params_gb + self.activations_gb


def gemm_efficiency(m: ModuleSpec, tp: int, tokens_per_gpu: float, cfg: CostConfig) -> float:
    """Small GEMMs run below peak: narrow TP shards (width) and few tokens per GPU (CP, small
    micro-batches) each cost a factor x/(x + knee)."""
    width = min(m.hidden, m.ffn) / tp
    return width / (width + cfg.gemm_width_knee) * tokens_per_gpu / (tokens_per_gpu + cfg.gemm_tokens_knee)


def packed_calls(per_rank: float, present: float, micro_batch: int, ep: int = 1) -> float:
    """Packed calls of a module on its busiest DP rank in a step (runtime/train/inputs.py `InputRouter.chunks`): its
    samples with this module's tokens cut into at most the micro-batch count, so a modality few samples carry runs
    one call per such sample, not one per micro-batch; under EP every micro-batch runs, empty or not (its
    all_to_alls need the same count on every rank)."""
    micro_batches = max(per_rank / max(micro_batch, 1), 1.0)
    if ep > 1:
        return micro_batches
    return min(micro_batches, max(1.0, math.ceil(per_rank * present - 1e-9)))


def _compute_seconds(
    b: ModuleBasis, layout: Layout, micro_batch: int, recompute: Recompute
) -> tuple[float, float, float]:
    """(forward+backward seconds, measured fixed seconds per step, orchestrator seconds per step)."""
    m, w, cluster, profile, name = b.m, b.w, b.cluster, b.profile, b.name
    fwd = b.fwd
    layer_share, extra, passes, scale = b.per_recompute[recompute]
    mod = profile.modules.get(name) if profile is not None else None
    fit = mod.block.get(layout.tp) if mod is not None else None
    if mod is not None and fit is not None:
        # measured: per-block seconds for this TP shard, tokens split over the other axes
        per_gpu_tokens = w.tokens / (layout.dp * layout.cp)
        # attention: a CP rank's 1/cp of the queries meets every key of its sequence, so it does 1/cp of
        # the Σlen² work (the zigzag shard evens out the causal half), not that of a sequence cp times shorter
        per_gpu_sq = w.tokens_sq / (layout.dp * layout.cp)
        samples = w.samples * w.stats.present / layout.dp
        calls = packed_calls(w.samples / layout.dp, w.stats.present, micro_batch, layout.ep)
        # the slowest DP rank sets the pace: the balanced batch's residual max/mean (planner/imbalance.py)
        dp_per_node = max(cluster.gpus_per_node // (layout.tp * layout.cp), 1)
        items = item_tokens(m) if m.kind == ModuleKind.ENCODER else None  # balanced by item, as the runtime does
        slowest = residual_imbalance(b.data, name, b.llm_name, layout.dp, dp_per_node, fit.terms(), items)
        block = fit.total(samples, per_gpu_tokens, per_gpu_sq) * slowest + fit.call * calls
        layers = m.layers / layout.pp
        if mod.rest is not None:
            # measured stem/projector (encoders) or embedding/head/loss (LLM), on the first/last stage only
            r = mod.rest
            rest_s = (r.total(samples, per_gpu_tokens, per_gpu_sq) * slowest + r.call * calls) * passes / 3.0
        else:
            rest = fwd - layer_share
            rest_s = rest * passes / layout.gpus / (cluster.gpu.peak_tflops * 1e12 * cluster.mfu)
        # the runtime's measured per-step work outside the modules (orchestrator, batch bookkeeping): the LLM's row
        balance_s = 0.0
        if profile is not None and m.kind == ModuleKind.LLM:
            balance_s = profile.balance_step_s + profile.step_bookkeeping_s
        overhead = mod.step_overhead(layout.dp * layout.cp, profile.nproc if profile is not None else 1)
        return block * layers * scale + max(rest_s, 0.0), overhead, balance_s
    if fwd * passes + extra == 0:  # no sample of the mix has this module's modality: no work
        return 0.0, 0.0, 0.0
    tokens_per_gpu = micro_batch * w.stats.mean / layout.cp
    eff = cluster.mfu * gemm_efficiency(m, layout.tp, tokens_per_gpu, b.cfg)
    # TP leaves the experts whole: every TP rank runs them on the same rows (runtime/models/reference.py MoE)
    experts = expert_flops(m, w) * passes * (layout.tp - 1)
    return (fwd * passes + extra + experts) / layout.gpus / (cluster.gpu.peak_tflops * 1e12 * eff), 0.0, 0.0


def expert_flops(m: ModuleSpec, w: Workload) -> float:
    """Forward FLOPs of the experts a step's tokens are routed to (top_k per token, in every MoE block)."""
    if m.experts == 1:
        return 0.0
    return 2 * m.top_k * mlp_params(m, m.expert_width) * m.moe_blocks * w.tokens


def _recompute_flops(m: ModuleSpec, w: Workload, recompute: Recompute) -> tuple[float, float]:
    """(forward FLOPs of the blocks over a step, the extra forward FLOPs its recompute runs again)."""
    attn = attention_coefficients(m)
    layer_share = (
        2 * layer_params(m, active=True) * m.layers * w.tokens + attn.per_token * w.tokens + attn.per_pair * w.tokens_sq
    )
    extra = {Recompute.NONE: 0.0, Recompute.SELECTIVE: 0.1 * layer_share, Recompute.FULL: layer_share}[recompute]
    return layer_share, extra


def _passes(m: ModuleSpec, fwd: float, extra: float) -> tuple[float, float]:
    """(passes, block scale): forward+backward is 3 forwards (1 when frozen), and a block's measured
    forward+backward is stretched by its recompute's `extra` forward FLOPs over the step's `fwd`."""
    passes = 3.0 if m.trainable else 1.0
    return passes, (passes + (extra / fwd if fwd else 0)) / 3.0


def profiled_sample_cost(
    model: ModelSpec, data: DataSpec, name: str, layout: Layout, recompute: Recompute, profile: Profile | None
) -> SampleCost | None:
    """Seconds one sample costs module `name` on one DP index of `layout`, from the profile's fits as
    `module_cost` prices them: every block (the fit of the layout's TP shard, stretched by recompute) and
    the module's other parts, all pipeline stages summed, per rank of the TP x CP group (a CP rank does
    1/cp of a sample's tokens and pairs, its per-sample and per-call work whole). What the plan records
    for the runtime's dispatcher (ModulePlan.sample_cost). None: the profile has no fit for this TP degree."""
    mod = profile.modules.get(name) if profile is not None else None
    fit = mod.block.get(layout.tp) if mod is not None else None
    if mod is None or fit is None:
        return None
    m = model.modules[name]
    w = workload(model, data, name)
    fwd = forward_flops(m, model.llm, w)
    _, extra = _recompute_flops(m, w, recompute)
    passes, scale = _passes(m, fwd, extra)
    cost = fit.terms().scaled(m.layers * scale, 1.0 / layout.cp)
    if mod.rest is not None:
        cost = cost.plus(mod.rest.terms().scaled(passes / 3.0, 1.0 / layout.cp))
    return cost


@dataclass(frozen=True)
class ModuleBasis:
    """What `module_cost` reads of one module whatever its layout: the specs, the step's workload, the links,
    the FLOPs and the parameter counts. Built once per module (`module_basis`), then priced per layout
    (`layout_cost`): the search prices thousands of layouts of each module (planner/candidates.py)."""

    name: str
    m: ModuleSpec
    llm_name: str
    w: Workload
    links: Links
    cluster: ClusterSpec
    data: DataSpec
    profile: Profile | None
    cfg: CostConfig
    fwd: float  # forward FLOPs of the step
    model_flops: float  # train FLOPs of the step (no recompute)
    per_recompute: dict[Recompute, tuple[float, float, float, float]]  # (layer_share, extra, passes, scale)
    dense_params: float  # every parameter but the experts' and the two embeddings', over all blocks
    expert_params: float  # the experts' of every block
    block_params: float = 0.0  # one block's, its experts' excluded
    block_expert_params: float = 0.0  # one block's experts'


def module_basis(
    model: ModelSpec,
    data: DataSpec,
    cluster: ClusterSpec,
    name: str,
    *,
    profile: Profile | None = None,
    cfg: CostConfig = CostConfig(),
) -> ModuleBasis:
    m = model.modules[name]
    llm = model.llm
    w = workload(model, data, name)
    fwd = forward_flops(m, llm, w)
    per_recompute = {}
    for rc in Recompute:
        layer_share, extra = _recompute_flops(m, w, rc)
        per_recompute[rc] = (layer_share, extra, *_passes(m, fwd, extra))
    experts = _expert_params(m) * m.layers
    return ModuleBasis(
        name=name,
        m=m,
        llm_name=model.llm_name,
        w=w,
        links=Links.build(cluster, profile),
        cluster=cluster,
        data=data,
        profile=profile,
        cfg=cfg,
        fwd=fwd,
        model_flops=train_flops(m, llm, w),
        per_recompute=per_recompute,
        dense_params=module_params(m) - experts - (2 * m.vocab * m.hidden if m.vocab else 0),
        expert_params=experts,
        block_params=layer_params(m) - _expert_params(m),
        block_expert_params=_expert_params(m),
    )


def module_cost(
    model: ModelSpec,
    data: DataSpec,
    cluster: ClusterSpec,
    name: str,
    layout: Layout,
    micro_batch: int,
    recompute: Recompute,
    *,
    in_flight: int,
    profile: Profile | None = None,
    cfg: CostConfig = CostConfig(),
    sharding: Sharding = Sharding.KEEP,
) -> ModuleCost:
    """Time and memory of module `name` on its own grid (`sharding`: an fsdp module's).

    `in_flight` is how many micro-batches of activations a GPU holds at peak: pp for the
    LLM's first 1F1B stage, every micro-batch of the step for an encoder under the
    three-phase schedule.
    """
    basis = module_basis(model, data, cluster, name, profile=profile, cfg=cfg)
    return layout_cost(basis, layout, micro_batch, recompute, in_flight, sharding)


def layout_cost(
    b: ModuleBasis,
    layout: Layout,
    micro_batch: int,
    recompute: Recompute,
    in_flight: int,
    sharding: Sharding = Sharding.KEEP,
) -> ModuleCost:
    """`module_cost` of the module of `b` (module_basis) under one layout; `sharding`: an fsdp module's (ignored
    under replicate)."""
    m, w, links, cfg, cluster, profile, name = b.m, b.w, b.links, b.cfg, b.cluster, b.profile, b.name
    tp, cp, pp, dp, ep = layout.tp, layout.cp, layout.pp, layout.dp, layout.ep
    per_dp = w.samples // dp
    num_mb = max(per_dp // micro_batch, 1)

    compute, overhead, orchestrator = _compute_seconds(b, layout, micro_batch, recompute)

    # tokens one GPU group (one DP index) handles per micro-batch, and per step
    tokens_mb = micro_batch * w.stats.mean
    layers_local = m.layers / pp
    passes_fwd = 2 if recompute == Recompute.FULL else 1
    passes = (passes_fwd + 1) if m.trainable else 1

    # TP with sequence parallelism: 2 all-gathers + 2 reduce-scatters of the activations per
    # block per pass (Korthikanti et al. §4.2.2), over the innermost axis.
    act_bytes = tokens_mb / cp * m.hidden * BF16
    tp_s = 4 * links.ring(act_bytes, 1, tp) * layers_local * num_mb * passes if tp > 1 else 0.0
    if _measured_with_tp(profile, name, tp):
        tp_s = 0.0  # the profiled TP shard ran its real TP collectives: they are in the block fit

    # CP: all-gather K and V forward, reduce-scatter dK and dV backward (query stays sharded).
    kv_bytes = tokens_mb * 2 * m.num_kv_heads * m.head_width * BF16 / max(1, min(tp, m.num_kv_heads))
    cp_s = links.ring(kv_bytes, tp, cp) * layers_local * num_mb * passes if cp > 1 else 0.0

    # EP: dispatch and combine all-to-alls per MoE block per pass.
    ep_s = 0.0
    if ep > 1 and m.experts > 1:
        a2a_bytes = tokens_mb / cp * m.top_k * m.hidden * BF16
        ep_s = 2 * links.ring(a2a_bytes, tp * cp, ep) * layers_local * moe_share(m) * num_mb * passes

    # PP: one activation send and one gradient send per micro-batch per stage boundary.
    pp_p2p_s = 0.0
    if pp > 1:
        inter = tp * cp * dp >= cluster.gpus_per_node or tp * cp * dp * pp > cluster.gpus_per_node
        pp_p2p_s = 2 * num_mb * links.p2p(act_bytes / tp, inter)

    # DP over dp x cp: fsdp keep gathers the parameters (bf16) and reduce-scatters the gradients (fp32) once
    # per step; reshard gathers each block (an LLM's embedding and head too) twice per micro-batch (forward,
    # backward) and reduce-scatters its gradients per micro-batch (an encoder's own unit: one gather);
    # replicate all-reduces the gradients (twice a reduce-scatter's traffic on a ring).
    # Under EP the experts stay outside FSDP2 (runtime/parallel/fsdp.py): never gathered, their gradients summed
    # over their expert-data-parallel group (dp / ep ranks, then CP: runtime/train/grad_sync.py).
    params_local = _local_params_of(b.dense_params, b.expert_params, m, layout)
    experts_local = _ep_experts_local(b, layout)
    dp_group = dp * cp
    mode = _choose_mode(params_local, layout, cfg)
    sharding = sharding if mode == DataParallel.FSDP else Sharding.KEEP
    params_gb, act_gb = _memory_gb(b, layout, micro_batch, recompute, in_flight, params_local, mode, sharding)
    dp_s = 0.0
    edp_group = dp // ep * cp
    if experts_local and edp_group > 1 and m.trainable:
        dp_s += 2 * links.ring(experts_local * cfg.grad_bytes, tp * ep, edp_group) * (1 - cfg.dp_overlap)
    params_local -= experts_local
    if dp_group > 1:
        grads = links.ring(params_local * cfg.grad_bytes, tp, dp_group) if m.trainable else 0.0
        gather = links.ring(params_local * BF16, tp, dp_group)
        if sharding == Sharding.RESHARD:
            # the share gathered per call: the blocks, and an (untied) LLM's embedding and head as well
            per_call = 1.0 if m.vocab and not m.tied_embeddings else _blocks_local(b, layout) / max(params_local, 1.0)
            traffic = num_mb * grads + gather * (1 + per_call * (2 * num_mb - 1))
        elif mode == DataParallel.FSDP:
            traffic = grads + gather
        else:
            traffic = 2 * grads
        dp_s += traffic * (1 - cfg.dp_overlap)

    work = compute + tp_s + cp_s + ep_s + pp_p2p_s
    bubble = work * (pp - 1) / num_mb if pp > 1 else 0.0
    forward_share = (1.0 / 3.0) if m.trainable else 1.0
    return ModuleCost(
        compute_s=compute,
        tp_s=tp_s,
        cp_s=cp_s,
        ep_s=ep_s,
        pp_p2p_s=pp_p2p_s,
        dp_s=dp_s,
        bubble_s=bubble,
        forward_s=(compute + tp_s + cp_s + ep_s) * forward_share,
        params_gb=params_gb,
        activations_gb=act_gb,
        model_flops=b.model_flops,
        overhead_s=overhead,
        orchestrator_s=orchestrator,
        data_parallel=mode,
        sharding=sharding,
    )


def layout_memory_gb(
    b: ModuleBasis,
    layout: Layout,
    micro_batch: int,
    recompute: Recompute,
    in_flight: int,
    sharding: Sharding = Sharding.KEEP,
) -> float:
    """`layout_cost(...).memory_gb` without pricing the time: the search drops layouts that do not fit first."""
    params_local = _local_params_of(b.dense_params, b.expert_params, b.m, layout)
    mode = _choose_mode(params_local, layout, b.cfg)
    params_gb, act_gb = _memory_gb(b, layout, micro_batch, recompute, in_flight, params_local, mode, sharding)
    return params_gb + act_gb


def shardings(b: ModuleBasis, layout: Layout, keep_gb: float, capacity_gb: float) -> tuple[Sharding, ...]:
    """The shardings worth pricing for an fsdp layout whose keep memory is `keep_gb`: the user's, or keep alone
    while it takes at most `reshard_above_share` of the GPU (reshard would only add gathers), both beyond that
    (the search weighs reshard's memory against its time), reshard alone where keep does not fit."""
    pinned = dict(b.cfg.sharding_of).get(b.name, b.cfg.sharding)
    if pinned is not None:
        return (pinned,)
    if _choose_mode(_local_params_of(b.dense_params, b.expert_params, b.m, layout), layout, b.cfg) != DataParallel.FSDP:
        return (Sharding.KEEP,)
    if keep_gb <= b.cfg.reshard_above_share * capacity_gb:
        return (Sharding.KEEP,)
    return (Sharding.KEEP, Sharding.RESHARD) if keep_gb <= capacity_gb else (Sharding.RESHARD,)


def _memory_gb(
    b: ModuleBasis,
    layout: Layout,
    micro_batch: int,
    recompute: Recompute,
    in_flight: int,
    params_local: float,
    mode: DataParallel,
    sharding: Sharding = Sharding.KEEP,
) -> tuple[float, float]:
    """(training state, activations) per GPU, GB; under reshard the state counts the gathered blocks too."""
    reshard = mode == DataParallel.FSDP and sharding == Sharding.RESHARD
    per_param = state_bytes_per_param(mode, b.m.trainable, layout.dp * layout.cp, sharding=sharding)
    # EP's experts: whole fp32 masters, gradients and moments on each rank that holds them (outside FSDP2)
    experts = _ep_experts_local(b, layout)
    params_local -= experts
    state = params_local * per_param + experts * state_bytes_per_param(
        DataParallel.REPLICATE, b.m.trainable, 1, compute_bytes=FP32
    )
    if reshard:
        blocks = _blocks_local(b, layout)
        block = blocks / max(b.m.layers / layout.pp, 1.0)
        own = max(params_local - blocks, 0.0)
        if b.m.vocab and not b.m.tied_embeddings:  # an LLM's embedding and head: units of their own, per call
            state += gathered_bytes(0.0, block, b.m.trainable, part=b.m.vocab * b.m.hidden / layout.tp)
        else:
            state += gathered_bytes(own, block, b.m.trainable)
    return state / GB, activation_gb(b.m, b.w, layout, micro_batch, recompute, in_flight)


def _blocks_local(b: ModuleBasis, layout: Layout) -> float:
    """Parameters of this GPU's blocks that FSDP2 holds (its pipeline stage's, TP shards; the experts but under
    EP, which keeps them outside FSDP2), experts whole under TP."""
    per_block = b.block_params / layout.tp + (b.block_expert_params if layout.ep == 1 else 0.0)
    return per_block * b.m.layers / layout.pp


def _ep_experts_local(b: ModuleBasis, layout: Layout) -> float:
    """The experts' parameters on one GPU under EP (its stage's share of its EP rank's experts); 0 without EP."""
    return b.expert_params / (layout.pp * layout.ep) if layout.ep > 1 and b.m.experts > 1 else 0.0


def _measured_with_tp(profile: Profile | None, name: str, tp: int) -> bool:
    mod = profile.modules.get(name) if profile is not None else None
    return tp > 1 and mod is not None and tp in mod.block


def _local_params(m: ModuleSpec, layout: Layout) -> float:
    """Parameters on one GPU: blocks split by TP and PP, experts by PP and EP (TP leaves them whole: every TP rank
    runs them on the same rows), embeddings on one stage."""
    experts = _expert_params(m) * m.layers
    return _local_params_of(module_params(m) - experts - (2 * m.vocab * m.hidden if m.vocab else 0), experts, m, layout)


def _local_params_of(dense_params: float, experts: float, m: ModuleSpec, layout: Layout) -> float:
    """`_local_params` from the module's dense and expert parameter counts (module_basis)."""
    dense = dense_params / layout.pp
    embed = m.vocab * m.hidden if m.vocab else 0.0  # the first (or last) stage holds one of the two
    if layout.pp == 1 and m.vocab:
        embed *= 2
    return (dense + embed) / layout.tp + experts / (layout.pp * layout.ep)


def block_activation_bytes(m: ModuleSpec) -> float:
    """Bytes one block keeps for backward per token, in bf16, as the runtime's blocks save them
    (runtime/models/reference.py; measured with runtime/memory.py's saved-tensor meter, bench/bench_memory_shapes.py):
    its two RMSNorms their input, the normalised rows and the weighted output (3 x hidden each); attention its
    queries, its keys and values at the full head count (grouped KV heads are repeated for the fused kernel), the
    kernel's output and the contiguous copy o reads (5 x heads x head width), and an fp32 log-sum-exp per head; the
    MLP what its activation and product keep: SwiGLU the gate, its SiLU, the up projection and their product
    (4 x ffn), GELU the first projection and its GELU (2 x ffn); a MoE block the top_k experts a token meets.
    (Korthikanti et al.'s 34 x hidden is one shape of this: fused norms, ffn 4 x hidden, GELU.)"""
    return _block_activation_bytes(
        m.mlp_kind, m.ffn, m.top_k if m.experts > 1 else 1, m.hidden, m.attention_width, m.heads
    )


@functools.cache  # the search asks it of every layout of the same few modules
def _block_activation_bytes(
    mlp_kind: str, ffn: int, top_k: int, hidden: int, attention_width: int, heads: int
) -> float:
    mlp = (4 if mlp_kind == "swiglu" else 2) * ffn * top_k
    return BF16 * (6 * hidden + 5 * attention_width + mlp) + FP32 * heads


def activation_gb(
    m: ModuleSpec, w: Workload, layout: Layout, micro_batch: int, recompute: Recompute, in_flight: int
) -> float:
    """Activation memory of the peak GPU (Korthikanti et al., with SP: everything divided by tp).

    Attention runs fused (runtime/models/reference.py `attend`: flash or memory-efficient kernels), so the
    5as/h term of the stored scores and softmax is not kept: a block stores `block_activation_bytes` per token
    with or without selective recompute, which then only costs time. The tokens are those of the `in_flight`
    micro-batches a GPU holds at once (`Workload.held_tokens`: the most that many samples of the mix hold, not the
    longest sample in each), of one for the block being recomputed and the logits."""
    one = w.held_tokens(micro_batch, 1, layout.dp)
    held = w.held_tokens(micro_batch, in_flight, layout.dp)
    shard = layout.tp * layout.cp
    per_token = block_activation_bytes(m) / shard  # none and selective alike: no scores are stored
    per_token_ckpt = 2 * m.hidden / shard
    layers = m.layers / layout.pp
    if recompute == Recompute.FULL:
        # each block's input for every micro-batch held, one block re-materialised at a time
        total = per_token_ckpt * layers * held + per_token * one
    else:
        total = per_token * layers * held
    if m.vocab:
        # logits of the scored (text) rows of one micro-batch on the last stage, counted as fp32
        total += one * w.scored / layout.cp * m.vocab * FP32 / layout.tp
    if not m.trainable:
        total = per_token * one  # forward only, nothing kept for backward
    return total / GB
