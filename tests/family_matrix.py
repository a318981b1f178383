"""The family matrix: every multimodal family the registry lists (runtime/models/registry.py, role MODEL), and LLaVA with
other towers and LLMs, under every plan kind, held in float64 against the HF model's own step 0
(tests/hf_references.py): the loss over the whole batch to 1e-9 relative and every parameter's gradient to 1e-9
of the tensor's largest entry (tests/equivalence.py). tests/distributed/test_family_matrix.py runs the cells
`TESTED` names; bench/bench_family_matrix.py runs them all.

A row is a tiny model (tests/families.py builds the registry's), its data and how its plans keep state; a plan
kind is the same layouts for every family. A cell whose layout the family's modules refuse
(`ModuleSpec.refuses`: a tower that takes no TP, a tied head that PP would split) is "n/a" with the reason.
A family newly registered is a row without any edit here; it fails until tests/families.py builds a tiny one
and tests/hf_references.py has a reference for its family class.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from families import FAMILY_MODELS, OMNI_DATA
from hf_models import make_llava
from hf_references import REFERENCES

from orch.planner.model_dir import Role, types_of
from orch.planner.plan import DataParallel, Layout, Recompute, Sharding
from orch.planner.specs import DataSpec, ModelSpec, TaskSpec
from orch.runtime.models.registry import FAMILIES

ALL = [0, 1, 2, 3]
SEED = 5  # the HF data's (test_hf_composed.py shares it)
QWEN_VL_SEED = 4
OMNI_SEED = 9  # a batch of text alone, speech, an image, and image with speech


def data_spec() -> DataSpec:
    """Text, image and speech samples: a model without one of the encoders sees those samples as text."""
    return DataSpec(
        global_batch=6,
        seq_len=80,
        tasks=[
            TaskSpec(name="text", weight=0.2, tokens={"llm": 30}, max={"llm": 60}),
            TaskSpec(name="image", weight=0.5, tokens={"vision": 24, "llm": 56}, max={"vision": 40, "llm": 80}),
            TaskSpec(name="asr", weight=0.3, tokens={"audio": 30, "llm": 50}, max={"audio": 56, "llm": 80}),
        ],
    )


def qwen_vl_data_spec() -> DataSpec:
    """Text-only samples and native-resolution images of 4 to 64 merged tokens (16 to 256 patches)."""
    return DataSpec(
        global_batch=6,
        seq_len=120,
        tasks=[
            TaskSpec(name="text", weight=0.25, tokens={"llm": 30}, max={"llm": 60}),
            TaskSpec(name="image", weight=0.75, tokens={"vision": 80, "llm": 70}, max={"vision": 256, "llm": 120}),
        ],
    )


def omni_data_spec() -> DataSpec:
    """Text, image, speech, and image with speech (both towers in one sample): the Qwen-Omni thinkers'."""
    return DataSpec.model_validate(OMNI_DATA)


@dataclass(frozen=True)
class Row:
    """One model of the matrix: a registered family's tiny model, or LLaVA with another tower or LLM."""

    name: str
    model_type: str  # its family in runtime/models/registry.py
    make: Callable[[Path], Path] | None  # builds it under a folder; what model_spec_from_dir reads
    data: DataSpec
    seed: int
    data_parallel: DataParallel = DataParallel.FSDP
    recompute: Recompute = Recompute.NONE

    @property
    def missing(self) -> str | None:
        """What the tests lack to hold this row against HF, or None."""
        if self.make is None:
            return f"{self.model_type} is registered: add a tiny one to tests/families.py FAMILY_MODELS"
        kind = family_kind(self.model_type)
        if kind not in REFERENCES:
            return f"{self.model_type} is a {kind} family: add its HF reference to tests/hf_references.py"
        return None

    def reference(self, directory: Path, model: ModelSpec) -> tuple[float, dict]:
        """The HF model's (loss, {HF name: gradient}) of step 0 on this row's batch."""
        family = FAMILIES[self.model_type]
        return REFERENCES[family_kind(self.model_type)](
            directory, family.transformers_class, model, self.data, self.seed
        )


# How a registered family's plans keep their state (today's choices: LLaVA replicated, the audio model sharded and
# recomputed, Qwen-VL sharded), and its data, by family class; a new family's rows take FSDP on the HF data.
RUNTIME_ROWS = {
    "Llava": {"data_parallel": DataParallel.REPLICATE},
    "Qwen2Audio": {"recompute": Recompute.SELECTIVE},
    "QwenVL": {"data": qwen_vl_data_spec(), "seed": QWEN_VL_SEED},
    "QwenOmni": {"data": omni_data_spec(), "seed": OMNI_SEED},
    "QwenOmni3": {"data": omni_data_spec(), "seed": OMNI_SEED},
}


def family_kind(model_type: str) -> str:
    """The class of a registered family (runtime/models/*/family.py): what its HF reference and row options key by."""
    return type(FAMILIES[model_type]).__name__


def registered_row(model_type: str) -> Row:
    options = {"data": data_spec(), "seed": SEED, **RUNTIME_ROWS.get(family_kind(model_type), {})}
    return Row(model_type, model_type, FAMILY_MODELS.get(model_type), **options)


ROWS: dict[str, Row] = {t: registered_row(t) for t in types_of(FAMILIES, Role.MODEL)}
# LLaVA with the registry's other towers and LLMs: SigLIP (no class token) with Qwen2 (q/k/v biases) and tied
# embeddings; Mistral with a sliding window shorter than the samples (the window holds under CP too).
ROWS["llava_siglip_qwen2_tied"] = Row(
    "llava_siglip_qwen2_tied", "llava",
    lambda root: make_llava(root / "llava_siglip_qwen2_tied", "siglip", "qwen2", tie_word_embeddings=True),
    data_spec(), SEED,
)  # fmt: skip
ROWS["llava_clip_mistral_window"] = Row(
    "llava_clip_mistral_window", "llava",
    lambda root: make_llava(root / "llava_clip_mistral_window", "clip", "mistral", sliding_window=12),
    data_spec(), SEED,
)  # fmt: skip


@dataclass(frozen=True)
class PlanKind:
    """The same layouts for every family: the LLM's, and every encoder's (the LLM's where None: homogeneous)."""

    title: str
    llm: tuple[Layout, list[int]]
    tower: tuple[Layout, list[int]] | None = None
    data_parallel: DataParallel | None = None  # the row's where None
    sharding: Sharding = Sharding.KEEP
    by_modality: dict[str, tuple[Layout, list[int]]] | None = None  # a tower's own, by its modality (vision, audio)

    def layouts(self, model: ModelSpec) -> dict[str, tuple[Layout, list[int]]]:
        towers = dict.fromkeys(model.encoder_names, self.tower) if self.tower else {}
        for name in model.encoder_names if self.by_modality else ():
            towers[name] = self.by_modality.get(model.modality(name).value, towers.get(name) or self.llm)
        return {model.llm_name: self.llm, **towers}

    @property
    def world_size(self) -> int:
        own = [r for _, ranks in (self.by_modality or {}).values() for r in ranks]
        return max(self.llm[1] + (self.tower[1] if self.tower else []) + own) + 1

    def refusal(self, model: ModelSpec) -> str | None:
        """Why `model`'s modules cannot run this plan kind (the first refusal, named), or None."""
        for name, (layout, _) in self.layouts(model).items():
            for axis in ("tp", "cp", "pp"):
                why = model.modules[name].refuses(axis, getattr(layout, axis))
                if why:
                    return f"{name} {axis.upper()}{getattr(layout, axis)}: {why}"
            if layout.ep > 1 and model.modules[name].experts % layout.ep:
                return f"{name} EP{layout.ep}: {model.modules[name].experts} experts (a dense module has none to split)"
        return None


PLAN_KINDS: dict[str, PlanKind] = {
    "homogeneous": PlanKind("homogeneous DP4", (Layout(dp=4), ALL)),
    "llm_tp2": PlanKind("tower DP4, LLM TP2 DP2", (Layout(tp=2, dp=2), ALL), (Layout(dp=4), ALL)),
    "llm_cp2": PlanKind("tower DP4, LLM CP2 DP2", (Layout(cp=2, dp=2), ALL), (Layout(dp=4), ALL)),
    "llm_pp2": PlanKind("tower DP4, LLM PP2 DP2", (Layout(pp=2, dp=2), ALL), (Layout(dp=4), ALL)),
    # on 5 ranks, replicated: the graph schedule's P2P edge with DDP
    "disaggregated": PlanKind(
        "disaggregated tower DP2 -> LLM DP3", (Layout(dp=3), [2, 3, 4]), (Layout(dp=2), [0, 1]), DataParallel.REPLICATE
    ),
    "tower_tp2_llm_cp2": PlanKind("tower TP2 DP2, LLM CP2 DP2", (Layout(cp=2, dp=2), ALL), (Layout(tp=2, dp=2), ALL)),
    "tower_tp2_llm_pp2": PlanKind("tower TP2 DP2, LLM PP2 DP2", (Layout(pp=2, dp=2), ALL), (Layout(tp=2, dp=2), ALL)),
    "llm_cp2_tp2": PlanKind("tower DP4, LLM CP2 TP2", (Layout(cp=2, tp=2), ALL), (Layout(dp=4), ALL)),
    "disaggregated_llm_cp3": PlanKind(
        "disaggregated tower DP1 -> LLM CP3", (Layout(cp=3), [1, 2, 3]), (Layout(dp=1), [0])
    ),
    # ZeRO-3 (runtime/parallel/fsdp.py): 6 samples over DP4, some without media, so ranks pad with empty chunks
    # that run a tower on nothing
    "zero3_homogeneous": PlanKind(
        "ZeRO-3 homogeneous DP4", (Layout(dp=4), ALL), data_parallel=DataParallel.FSDP, sharding=Sharding.RESHARD
    ),
    # expert parallelism (a MoE LLM): EP2 carved out of DP4, so each expert's gradient is summed over an EDP group
    # of 2; its tokens cross the EP group by all_to_all, ranks without tokens for an expert still exchanging
    "llm_ep2": PlanKind("tower DP4, LLM DP4 EP2", (Layout(dp=4, ep=2), ALL), (Layout(dp=4), ALL)),
    "zero3_llm_ep2": PlanKind(
        "ZeRO-3 tower DP4, LLM DP4 EP2",
        (Layout(dp=4, ep=2), ALL),
        (Layout(dp=4), ALL),
        data_parallel=DataParallel.FSDP,
        sharding=Sharding.RESHARD,
    ),
    "zero3_llm_tp2": PlanKind(
        "ZeRO-3 tower DP4, LLM TP2 DP2",
        (Layout(tp=2, dp=2), ALL),
        (Layout(dp=4), ALL),
        data_parallel=DataParallel.FSDP,
        sharding=Sharding.RESHARD,
    ),
    # two towers, each its own layout: an island each before the LLM's (replicated, as "disaggregated"), or
    # beside it on every rank, the audio tower at TP2 and the vision tower DP4
    "island_per_tower": PlanKind(
        "disaggregated audio DP1, vision DP1 -> LLM DP3", (Layout(dp=3), [2, 3, 4]),
        data_parallel=DataParallel.REPLICATE,
        by_modality={"audio": (Layout(dp=1), [0]), "vision": (Layout(dp=1), [1])},
    ),
    "towers_own_layouts": PlanKind(
        "audio TP2 DP2, vision DP4, LLM CP2 DP2", (Layout(cp=2, dp=2), ALL), (Layout(dp=4), ALL),
        by_modality={"audio": (Layout(tp=2, dp=2), ALL)},
    ),
}  # fmt: skip

# The cells `make test` runs, in about the time the two modules it replaced took (the whole matrix takes ~3x as
# long: the bench runs it): every cell a family was held under before the matrix, and every registered family
# homogeneous. LLaVA (whole images) and Qwen2.5-VL (windows, M-RoPE) run every plain kind (homogeneous; the
# LLM's TP, CP and PP beside a tower; disaggregated), Qwen2-Audio (clips) each in a richer cell (PP2 beside a
# tower at TP2, CP3 after a lone tower rank); every family with a tower that cannot run on zero rows (whole images,
# clips, grids) under ZeRO-3, where a rank without media runs its placeholder (in the DP4 launch: no launch more).
# Qwen2.5-Omni (two towers) every plain kind and each tower's own placement: an island each, or its own layout.
TESTED: dict[str, tuple[str, ...]] = {
    "llava": (
        "homogeneous",
        "llm_tp2",
        "llm_cp2",
        "llm_pp2",
        "disaggregated",
        "tower_tp2_llm_cp2",
        "zero3_homogeneous",
    ),
    "qwen2_audio": ("homogeneous", "llm_tp2", "tower_tp2_llm_pp2", "disaggregated_llm_cp3", "zero3_homogeneous"),
    "qwen2_vl": ("homogeneous", "llm_tp2", "llm_cp2"),
    "qwen2_5_vl": (
        "homogeneous",
        "llm_tp2",
        "llm_cp2",
        "llm_pp2",
        "disaggregated",
        "zero3_homogeneous",
        "zero3_llm_tp2",
    ),
    "qwen3_vl": ("homogeneous", "llm_pp2", "llm_cp2_tp2"),
    "qwen3_vl_moe": ("homogeneous", "llm_tp2", "llm_cp2", "llm_pp2", "disaggregated", "llm_ep2", "zero3_llm_ep2"),
    "qwen2_5_omni": (
        "homogeneous",
        "llm_tp2",
        "llm_cp2",
        "llm_pp2",
        "island_per_tower",
        "towers_own_layouts",
        "zero3_homogeneous",
    ),
    # Qwen3-Omni: its MoE decoder's aux loss off in the tiny model (as qwen3_vl_moe's); EP2 over its 4 experts
    "qwen3_omni_moe": ("homogeneous", "island_per_tower", "llm_tp2", "llm_cp2", "llm_pp2", "llm_ep2"),
    # tiles: whole images of a fixed size, any number of them an image; ZeRO-3: a rank without images runs one
    # black tile (its placeholder)
    "internvl": (
        "homogeneous",
        "llm_tp2",
        "llm_cp2",
        "llm_pp2",
        "disaggregated",
        "tower_tp2_llm_cp2",
        "zero3_homogeneous",
    ),
    "llava_siglip_qwen2_tied": ("llm_tp2", "tower_tp2_llm_cp2"),
    "llava_clip_mistral_window": ("llm_tp2", "tower_tp2_llm_cp2"),
}
DEFAULT_TESTED = ("homogeneous", "llm_tp2")  # a row TESTED does not name yet: a family just registered


def cells_under_test() -> list[tuple[str, str]]:
    """(row, plan kind) of every cell the test module runs."""
    return [(row, kind) for row in ROWS for kind in TESTED.get(row, DEFAULT_TESTED)]


def cell_name(row: str, kind: str) -> str:
    return f"{row}-{kind}"


@dataclass
class Built:
    """A row's model on disk, its spec, and its HF reference: (orch name -> HF name, loss, {HF name: grad})."""

    directory: Path
    model: ModelSpec
    want: tuple[dict[str, str], float, dict] = field(repr=False)


def build_row(row: Row, root: Path) -> Built:
    """`row`'s tiny model under `root` and the HF model's own step 0 on its batch."""
    from equivalence import orch_keys

    from orch.runtime.models.registry import model_spec_from_dir

    assert row.make is not None, row.missing
    directory = row.make(root)
    model = model_spec_from_dir(directory)
    return Built(directory, model, (orch_keys(model), *row.reference(directory, model)))


def cell_plan(row: Row, kind: PlanKind, model: ModelSpec):
    """The hand-built plan of one cell."""
    from orch.runtime.plans import hand_plan

    mode = kind.data_parallel or row.data_parallel
    return hand_plan(
        model, row.data, kind.layouts(model), data_parallel=mode, recompute=row.recompute, sharding=kind.sharding
    )


def train_config(row: Row):
    from orch.runtime.train.config import TrainConfig

    return TrainConfig(optimizer="sgd", steps=1, seed=row.seed, dtype="float64", lr=0.0, calibrate=False)


def run_cells(cells: list[tuple[str, str]], built: dict[str, Built], out: Path) -> tuple[dict, dict[str, Path]]:
    """Every cell through the trainer, ONE launch per world size (process start-up dominates otherwise):
    (cell name -> StepRecords, cell name -> the folder its tensors are under)."""
    from launching import train_tasks

    by_world: dict[int, list[tuple[str, str]]] = {}
    for row, kind in cells:
        by_world.setdefault(PLAN_KINDS[kind].world_size, []).append((row, kind))
    records, folders = {}, {}
    for world, group in sorted(by_world.items()):
        names = {cell_name(r, k): (ROWS[r], PLAN_KINDS[k]) for r, k in group}
        plans = {n: cell_plan(row, kind, built[row.name].model) for n, (row, kind) in names.items()}
        data = {n: row.data for n, (row, _) in names.items()}
        cfgs = {n: train_config(row) for n, (row, _) in names.items()}
        records |= train_tasks(plans, data, cfgs, out / f"world{world}")
        folders |= dict.fromkeys(names, out / f"world{world}")
    return records, folders
