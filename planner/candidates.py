"""Candidate layouts per module and placement, their costs, and the dominance pre-filter.

The search (planner/search.py) picks one candidate per module; everything it needs to know
about a candidate is precomputed here so the CP-SAT model stays linear.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterator
from dataclasses import dataclass, field

from orch.planner.costs import (
    BF16,
    GB,
    CostConfig,
    Links,
    ModuleBasis,
    ModuleCost,
    layout_cost,
    layout_memory_gb,
    module_basis,
    shardings,
    workload,
)
from orch.planner.errors import SpecError
from orch.planner.plan import Layout, Placement, Recompute, Sharding
from orch.planner.profile import Profile, busy_ratio
from orch.planner.specs import ClusterSpec, DataSpec, ModelSpec, ModuleSpec

AXES = ("tp", "cp", "pp", "dp", "ep", "gpus")
MICRO_BATCHES = (1, 2, 4, 8)
MAX_PP = 16
MAX_CP = 8


@dataclass(frozen=True)
class Pin:
    """`--fix MODULE.AXIS=N`: a degree the search must keep."""

    module: str
    axis: str
    value: int

    @classmethod
    def parse(cls, text: str, model: ModelSpec) -> Pin:
        head, sep, value = text.partition("=")
        module, dot, axis = head.partition(".")
        if not sep or not dot:
            raise SpecError("--fix", text, "expected MODULE.AXIS=N, e.g. llm.tp=4")
        if module not in model.modules:
            raise SpecError("--fix", text, f"no module '{module}'; expected one of {sorted(model.modules)}")
        if axis not in AXES:
            raise SpecError("--fix", text, f"no axis '{axis}'; expected one of {', '.join(AXES)}")
        if not value.isdigit() or int(value) <= 0:
            raise SpecError("--fix", text, f"expected a positive integer degree, got '{value}'")
        return cls(module, axis, int(value))


@dataclass(frozen=True)
class SearchInput:
    """The fully preprocessed instance the search works on."""

    model: ModelSpec
    cluster: ClusterSpec
    data: DataSpec
    profile: Profile | None = None
    pins: tuple[Pin, ...] = ()
    placements: tuple[Placement, ...] = tuple(Placement)
    cfg: CostConfig = field(default_factory=CostConfig)
    # colocated: also allow DP ratios that are not integers. Disaggregated islands always may (their P2P
    # boundary runs any ratio: runtime/parallel/boundary.py, tests/distributed 'enc_dp2_llm_dp3'); a colocated
    # edge keeps DP_src/DP_dst or its inverse an integer unless this is set
    uneven_boundary: bool = False

    @property
    def world(self) -> int:
        return self.cluster.world_size

    @property
    def capacity_gb(self) -> float:
        return self.cluster.gpu.usable_gb

    def pinned(self, module: str, axis: str) -> int | None:
        for p in self.pins:
            if p.module == module and p.axis == axis:
                return p.value
        return None


@dataclass(frozen=True)
class Candidate:
    """One module under one layout in one placement, with every number the search needs."""

    module: str
    placement: Placement
    layout: Layout
    micro_batch: int
    recompute: Recompute
    cost: ModuleCost
    num_micro_batches: int = 1  # per DP rank per step
    send_s: float = 0.0  # encoder: its outputs out and their gradients back in
    recv_s: tuple[tuple[str, float], ...] = ()  # llm: per encoder, receiving outputs (and broadcast)

    @property
    def gpus(self) -> int:
        return self.layout.gpus

    @property
    def time_s(self) -> float:
        return self.cost.time_s

    @property
    def memory_gb(self) -> float:
        return self.cost.memory_gb

    def recv_for(self, encoder: str) -> float:
        return dict(self.recv_s).get(encoder, 0.0)

    def describe(self) -> str:
        reshard = " reshard" if self.cost.sharding == Sharding.RESHARD else ""
        return f"{self.layout.short()} mb{self.micro_batch} {self.recompute.value}{reshard}"


@dataclass(frozen=True)
class HomogeneousOption:
    """The Megatron-LM baseline: encoders inherit the LLM's TP/CP/DP and run in its first stage."""

    llm: Candidate
    encoders: tuple[Candidate, ...]
    step_s: float
    memory_gb: float  # first pipeline stage: LLM stage 0 plus every encoder
    boundary_s: float = 0.0  # the encoders' output moves into the LLM's layout, all of them


def _divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


def _powers_of_two(limit: int) -> list[int]:
    out, v = [], 1
    while v <= limit:
        out.append(v)
        v *= 2
    return out


def tp_degrees(m: ModuleSpec, gpus_per_node: int, nodes: int = 1) -> list[int]:
    """The TP degrees a module may take: every degree up to a node's GPUs that the runtime shards it over (whole
    heads and KV heads and an equal FFN slice per rank, within its max_tp: ModuleSpec.refuses), not only powers of
    two: InternViT-6B's 25 heads split 5 ways. On several nodes a degree that does not divide a node's GPUs has
    groups that straddle two nodes (priced on the inter-node link: costs.Links.axis), so it is tried only where no
    degree above 1 divides them (InternViT-6B's 5 on 8-GPU nodes; not a 20-head tower's 5 beside its 2 and 4)."""
    splits = [t for t in range(1, min(gpus_per_node, m.heads) + 1) if m.refuses("tp", t) is None]
    aligned = [t for t in splits if gpus_per_node % t == 0]
    return aligned if nodes > 1 and len(aligned) > 1 else splits


def _allowed(inp: SearchInput, module: str, axis: str, value: int) -> bool:
    pin = inp.pinned(module, axis)
    return pin is None or pin == value


@dataclass(frozen=True)
class Degrees:
    """The TP, CP and PP degrees a module may take, whatever its GPU count (the pins included)."""

    tp: tuple[int, ...]
    cp: tuple[int, ...]
    pp: tuple[int, ...]


def degrees(inp: SearchInput, module: str, allow_pp: bool) -> Degrees:
    m = inp.model.modules[module]
    tps = tp_degrees(m, inp.cluster.gpus_per_node, inp.cluster.nodes)
    pps = [p for p in _divisors(m.layers) if p <= MAX_PP and not m.refuses("pp", p)] if allow_pp else [1]
    cps = [c for c in _powers_of_two(MAX_CP) if not m.refuses("cp", c)]
    return Degrees(
        tuple(t for t in tps if _allowed(inp, module, "tp", t)),
        tuple(c for c in cps if _allowed(inp, module, "cp", c)),
        tuple(p for p in pps if _allowed(inp, module, "pp", p)),
    )


def layouts(inp: SearchInput, module: str, gpus: int, allow_pp: bool) -> Iterator[Layout]:
    """Every layout of `module` on exactly `gpus` GPUs that the divisibility rules admit."""
    m = inp.model.modules[module]
    batch = inp.data.global_batch
    if not _allowed(inp, module, "gpus", gpus):
        return
    deg = degrees(inp, module, allow_pp)
    for tp in deg.tp:
        for cp in deg.cp:
            if tp * cp > gpus:
                continue
            for pp in deg.pp:
                if gpus % (tp * cp * pp):
                    continue
                dp = gpus // (tp * cp * pp)
                # Any batch runs on any dp (ranks hold floor or ceil of batch/dp samples before balancing;
                # the loss is normalised by the global token count), but not more ranks than samples.
                if dp > batch or not _allowed(inp, module, "dp", dp):
                    continue
                eps = [e for e in _divisors(dp) if m.experts % e == 0] if m.experts > 1 else [1]
                for ep in eps:
                    if _allowed(inp, module, "ep", ep):
                        yield Layout(tp=tp, cp=cp, pp=pp, dp=dp, ep=ep)


def samples_per_dp(inp: SearchInput, layout: Layout) -> int:
    """Samples the fullest DP rank holds before balancing: ceil(batch / dp) (runtime/data/batch.py deals
    sample i to DP index i % dp)."""
    return -(-inp.data.global_batch // layout.dp)


def _micro_batches(inp: SearchInput, layout: Layout) -> list[int]:
    per_dp = samples_per_dp(inp, layout)
    return [b for b in MICRO_BATCHES if per_dp % b == 0]


@dataclass(frozen=True)
class Pricing:
    """What pricing a candidate reads that does not depend on its layout, computed once per search input
    (`pricing`) and shared by every placement's candidates: each module's ModuleBasis (planner/costs.py),
    the links, and each encoder's boundary bytes per step."""

    bases: dict[str, ModuleBasis]
    links: Links
    boundary_bytes: dict[str, float]


def pricing(inp: SearchInput) -> Pricing:
    bases = {
        n: module_basis(inp.model, inp.data, inp.cluster, n, profile=inp.profile, cfg=inp.cfg)
        for n in inp.model.modules
    }
    return Pricing(
        bases, Links.build(inp.cluster, inp.profile), {e: _boundary_bytes(inp, e) for e in inp.model.encoder_names}
    )


def _boundary_bytes(inp: SearchInput, encoder: str) -> float:
    """Encoder outputs (after the projector) per step, in bytes; gradients come back the same size."""
    return workload(inp.model, inp.data, encoder).out_tokens * inp.model.llm.hidden * BF16


def _boundary_inter(inp: SearchInput, placement: Placement) -> bool:
    return inp.cluster.nodes > 1 and placement != Placement.HOMOGENEOUS


def _measured_move_s(inp: SearchInput, encoder: str, dp: int) -> float | None:
    """The profile's measured boundary move (transport.move forward and backward, one encoder per step) for
    a side holding the encoder outputs over `dp` indices; None without a measured fit (datasheet p2p)."""
    fit = inp.profile.boundary if inp.profile is not None else None
    if fit is None:
        return None
    share = workload(inp.model, inp.data, encoder).out_tokens * inp.model.llm.hidden * fit.elem_bytes / dp
    return fit.alpha_s + share / (fit.gbps * GB)


def _replica_bcast_s(inp: SearchInput, encoder: str, layout: Layout, pr: Pricing | None = None) -> float:
    if layout.tp * layout.cp <= 1:
        return 0.0
    links = pr.links if pr is not None else Links.build(inp.cluster, inp.profile)
    nbytes = pr.boundary_bytes[encoder] if pr is not None else _boundary_bytes(inp, encoder)
    return links.ring(nbytes / layout.dp, 1, layout.tp * layout.cp)


def homogeneous_boundary_s(inp: SearchInput, layout: Layout) -> float:
    """The runtime moves encoder outputs also in a homogeneous plan (transport.move, a collective every
    rank joins): the measured move when the profile has one, else 0 (the datasheet model's assumption)."""
    total = 0.0
    for e in inp.model.encoder_names:
        measured = _measured_move_s(inp, e, layout.dp)
        if measured is not None:
            total += measured + _replica_bcast_s(inp, e, layout)
    return total


def _send_s(inp: SearchInput, encoder: str, layout: Layout, placement: Placement, pr: Pricing | None = None) -> float:
    if placement == Placement.HOMOGENEOUS:
        return 0.0
    pr = pr if pr is not None else pricing(inp)
    measured = _measured_move_s(inp, encoder, layout.dp)
    if measured is not None:
        return measured
    return 2 * pr.links.p2p(pr.boundary_bytes[encoder] / layout.dp, _boundary_inter(inp, placement))


def _recv_s(
    inp: SearchInput, layout: Layout, placement: Placement, pr: Pricing | None = None
) -> tuple[tuple[str, float], ...]:
    if placement == Placement.HOMOGENEOUS:
        return ()
    pr = pr if pr is not None else pricing(inp)
    links = pr.links
    out = []
    for e in inp.model.encoder_names:
        measured = _measured_move_s(inp, e, layout.dp)
        if measured is not None:
            out.append((e, measured + _replica_bcast_s(inp, e, layout, pr)))
            continue
        share = pr.boundary_bytes[e] / layout.dp
        bcast = links.ring(share, 1, layout.tp * layout.cp) if layout.tp * layout.cp > 1 else 0.0
        out.append((e, 2 * links.p2p(share, _boundary_inter(inp, placement)) + bcast))
    return tuple(out)


def module_candidates(
    inp: SearchInput, module: str, gpus: int, placement: Placement, prune: bool = True, pr: Pricing | None = None
) -> list[Candidate]:
    """All candidates of one module on `gpus` GPUs in `placement` that fit memory on their own.

    `pr`: the input's `pricing`, when the caller prices many GPU counts (computed here otherwise)."""
    pr = pr if pr is not None else pricing(inp)
    basis = pr.bases[module]
    is_llm = module == inp.model.llm_name
    out = []
    for layout in layouts(inp, module, gpus, allow_pp=is_llm):
        if is_llm:
            recv = _recv_s(inp, layout, placement, pr)
        else:
            send = _send_s(inp, module, layout, placement, pr)
        for mb in _micro_batches(inp, layout):
            num_mb = samples_per_dp(inp, layout) // mb
            in_flight = layout.pp if is_llm else num_mb
            for rc in Recompute:
                held = min(in_flight, num_mb)
                keep_gb = layout_memory_gb(basis, layout, mb, rc, held)
                for sh in shardings(basis, layout, keep_gb, inp.capacity_gb):
                    if sh != Sharding.KEEP and layout_memory_gb(basis, layout, mb, rc, held, sh) > inp.capacity_gb:
                        continue
                    if sh == Sharding.KEEP and keep_gb > inp.capacity_gb:
                        continue  # does not fit: not worth pricing its time
                    cost = layout_cost(basis, layout, mb, rc, held, sh)
                    if is_llm:
                        c = Candidate(module, placement, layout, mb, rc, cost, num_mb, recv_s=recv)
                    else:
                        c = Candidate(module, placement, layout, mb, rc, cost, num_mb, send_s=send)
                    out.append(c)
    return prune_dominated(out, is_llm) if prune else out


def _key(c: Candidate, is_llm: bool) -> tuple[float, ...]:
    """Every term of the candidate that the search's objective or constraints read, each the smaller the better
    (planner/evaluate.py; search.LayoutModel).

    Colocated: the module's time (work and fixed alike enter the step's sum), its boundary moves (an encoder's
    send is the same for every layout of one DP degree), and the GPU memory the modules share. Disaggregated:
    an island's pipelined work (passes and sends), its once-a-step fixed work, and the memory an island's
    encoders share; for the LLM its pipelined work with every receive, its gradient sync and optimizer, the
    orchestrator, and its micro-batch count, of which the graph-aware 1F1B wants more (more of the islands'
    work overlaps). The LLM's memory and the encoders' micro-batch counts enter no formula."""
    if c.placement == Placement.DISAGGREGATED:
        if is_llm:
            recv = sum(v for _, v in c.recv_s)
            return (c.cost.work_s + recv, c.cost.overhead_s, c.cost.orchestrator_s, -c.num_micro_batches)
        return (c.cost.work_s + c.send_s, c.cost.fixed_s, c.memory_gb)
    return (c.cost.time_s + c.send_s, *(v for _, v in c.recv_s), c.memory_gb)


def prune_dominated(cands: list[Candidate], is_llm: bool = False) -> list[Candidate]:
    """Keep, per (GPUs, DP), the candidates no other beats on every term the search reads (`_key`).

    Same GPUs and DP means the same divisibility and boundary interplay with other modules,
    so a candidate that is no faster and no smaller than another can never be chosen. A disaggregated
    candidate's DP meets no rule (any ratio crosses its boundary): per GPUs alone. Of candidates equal on
    every term, the first by layout, micro-batch and recompute is kept.
    """
    groups: dict[tuple[int, int], list[tuple[tuple[float, ...], Candidate]]] = defaultdict(list)
    for c in cands:
        groups[(c.gpus, 0 if c.placement == Placement.DISAGGREGATED else c.layout.dp)].append((_key(c, is_llm), c))
    kept: list[Candidate] = []
    for group in groups.values():
        group.sort(key=lambda kc: (kc[0], kc[1].describe()))
        front: list[tuple[float, ...]] = []
        for k, c in group:
            # sorted: a candidate can only be dominated by one before it
            if any(all(a <= b for a, b in zip(f, k, strict=True)) for f in front):
                continue
            front.append(k)
            kept.append(c)
    return kept


def homogeneous_options(inp: SearchInput, pr: Pricing | None = None) -> list[HomogeneousOption]:
    """Joint options of the baseline: one per LLM layout, encoders on its first stage."""
    n = inp.world
    model = inp.model
    pr = pr if pr is not None else pricing(inp)
    out = []
    for layout in layouts(inp, model.llm_name, n, allow_pp=True):
        stage0 = Layout(tp=layout.tp, cp=layout.cp, pp=1, dp=layout.dp)
        if any(
            model.modules[e].refuses(axis, getattr(layout, axis)) for e in model.encoder_names for axis in ("tp", "cp")
        ):
            continue  # the encoders share the LLM's grid (TP and CP)
        for mb in _micro_batches(inp, layout):
            num_mb = samples_per_dp(inp, layout) // mb
            best: HomogeneousOption | None = None
            encs = []
            for e in model.encoder_names:
                # the encoder runs inside stage 0's 1F1B: pp micro-batches in flight
                opts = []
                held = min(layout.pp, num_mb)
                for erc in Recompute:
                    for sh in _shardings_of(pr.bases[e], stage0, mb, erc, held, inp.capacity_gb):
                        ec = layout_cost(pr.bases[e], stage0, mb, erc, held, sh)
                        # stage 0 alone does the encoder's math: its GPU count is n / pp
                        opts.append(Candidate(e, Placement.HOMOGENEOUS, stage0, mb, erc, ec, num_mb))
                encs.append(opts)
            front = _encoder_front(encs)
            moves = homogeneous_boundary_s(inp, layout)
            # while one stage works alone (the encoders, the fill and drain) ranks sharing cores run faster
            alone = busy_ratio(inp.profile, n, n // layout.pp)
            llm_basis = pr.bases[model.llm_name]
            for rc in Recompute:
                for sh in _shardings_of(llm_basis, layout, mb, rc, min(layout.pp, num_mb), inp.capacity_gb):
                    llm_cost = layout_cost(llm_basis, layout, mb, rc, min(layout.pp, num_mb), sh)
                    llm = Candidate(model.llm_name, Placement.HOMOGENEOUS, layout, mb, rc, llm_cost, num_mb)
                    room = inp.capacity_gb - llm.memory_gb
                    for combo in (c for c, mem in front if mem <= room):
                        option = _homogeneous(llm, combo, num_mb, moves, alone)
                        if best is None or option.step_s < best.step_s:
                            best = option
            if best is not None:
                out.append(best)
    return out


def _shardings_of(
    b: ModuleBasis, layout: Layout, micro_batch: int, recompute: Recompute, in_flight: int, capacity_gb: float
) -> tuple[Sharding, ...]:
    """`costs.shardings` of a layout, from its keep memory."""
    return shardings(b, layout, layout_memory_gb(b, layout, micro_batch, recompute, in_flight), capacity_gb)


def _encoder_front(encs: list[list[Candidate]]) -> list[tuple[tuple[Candidate, ...], float]]:
    """The encoders' joint choices (one option each) no other beats on all of: their pipelined work, their
    per-step work (gradient sync, fixed) and their memory, each with its memory. `_homogeneous`'s step grows with
    the first two and the memory decides the fit, so the best option beside any LLM candidate is among these;
    computed once per LLM layout and micro-batch instead of the whole product per LLM candidate."""
    import itertools

    keyed = []
    for combo in itertools.product(*encs):
        work = sum(c.cost.work_s - c.cost.dp_s for c in combo)
        step = sum(c.cost.dp_s + c.cost.fixed_s for c in combo)
        keyed.append(((work, step, sum(c.memory_gb for c in combo)), combo))
    keyed.sort(key=lambda kc: kc[0])  # a choice can only be beaten by one before it (stable: product order on ties)
    front: list[tuple[tuple[float, float, float], tuple[Candidate, ...]]] = []
    for key, combo in keyed:
        if not any(all(a <= b for a, b in zip(k, key, strict=True)) for k, _ in front):
            front.append((key, combo))
    return [(combo, key[2]) for key, combo in front]


def _homogeneous(
    llm: Candidate, encs: tuple[Candidate, ...], num_mb: int, boundary_s: float = 0.0, alone: float = 1.0
) -> HomogeneousOption:
    """`alone`: a stage's pace working alone relative to every rank busy (profile.busy_ratio; 1 unless the ranks
    share a machine's cores)."""
    pp = llm.layout.pp
    # encoder work joins stage 0's per-micro-batch time: the slowest stage sets the 1F1B pace
    enc_work = sum(c.cost.work_s - c.cost.dp_s for c in encs)
    llm_stage = llm.cost.compute_s + llm.cost.tp_s + llm.cost.cp_s + llm.cost.ep_s + llm.cost.pp_p2p_s
    per_mb = (llm_stage + enc_work) / num_mb
    pipeline = per_mb * (num_mb + pp - 1)
    if alone < 1.0:
        # Ranks sharing cores: a stage that waits frees them for the others, so the pipeline takes at least its
        # critical path at the freed pace and at least the mean rank's work (every core busy throughout).
        pipeline = max(alone * pipeline, llm_stage + enc_work / pp)
    fixed = llm.cost.fixed_s + sum(c.cost.fixed_s for c in encs)
    step = pipeline + llm.cost.dp_s + sum(c.cost.dp_s for c in encs) + boundary_s + fixed
    return HomogeneousOption(llm, encs, step, llm.memory_gb + sum(c.memory_gb for c in encs), boundary_s)
