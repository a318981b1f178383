"""The three input specs users write: model, cluster and data (docs/design.md, Spec files).

Field names fixed by docs/design.md are kept; the others have defaults so the short forms
there stay valid. Every model forbids unknown fields and checks its own invariants.
"""

from __future__ import annotations

from enum import StrEnum
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

SPEC_VERSION = 1


class _Spec(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class ModuleKind(StrEnum):
    ENCODER = "encoder"
    LLM = "llm"


class Modality(StrEnum):
    VISION = "vision"
    AUDIO = "audio"
    TEXT = "text"

    @property
    def frames_per_token(self) -> int:
        """Rows of input features (input_dim wide) per encoder token: the data counts an encoder's
        lengths in tokens, and the audio stem (Whisper-style, a stride-2 conv) merges 2 frames into
        one token, so a clip of n tokens is 2n frames. A patch or a text token is one row."""
        return 2 if self == Modality.AUDIO else 1

    @property
    def default_input_dim(self) -> int | None:
        """An encoder's features per input row when its spec names none: the pixels of one RGB 14x14
        patch (3·14·14 = 588: CLIP ViT-L/14, SigLIP so400m/14) for vision, Whisper large-v3's 128 mel
        bins for audio; a text encoder has no such default."""
        return {Modality.VISION: 3 * 14 * 14, Modality.AUDIO: 128}.get(self)


class HFPart(_Spec):
    """Where a module's weights and classes come from: a Hugging Face model directory and which of its
    towers the module is (planner/hf_config.py derives the rest of the ModuleSpec from its config.json)."""

    path: str = Field(description="the model directory (config.json, optional *.safetensors)")
    part: Literal["vision", "audio", "text"] = Field(description="the tower of that model this module is")
    feature_layer: int | list[int] | None = Field(
        default=None,
        description="a bare vision tower's layer(s) whose hidden states feed the projector (LLaVA's "
        "vision_feature_layer); default -2 for CLIP, -1 for SigLIP",
    )


def projected_len(tokens: int, downsample: int) -> int:
    """LLM tokens a projector merging `downsample` encoder tokens into one gives for `tokens` (the last partial
    group counts)."""
    return -(-tokens // downsample)


class ModuleSpec(_Spec):
    """One transformer module: an encoder or the LLM backbone."""

    kind: ModuleKind
    layers: int = Field(gt=0, description="transformer blocks")
    hidden: int = Field(gt=0, description="model width")
    heads: int = Field(gt=0, description="attention heads")
    kv_heads: int | None = Field(default=None, gt=0, description="key/value heads (GQA); default: heads")
    head_dim: int | None = Field(
        default=None,
        gt=0,
        description="width of one attention head where it is not hidden / heads (Qwen3: 128 at any width; q and o "
        "are then heads x head_dim wide); a module built from a Hugging Face directory only; default hidden / heads",
    )
    ffn: int = Field(gt=0, description="MLP inner width")
    mlp: Literal["swiglu", "gelu"] | None = Field(
        default=None, description="MLP kind; default swiglu for the LLM, gelu for encoders"
    )
    vocab: int | None = Field(default=None, gt=0, description="vocabulary size (LLM only)")
    experts: int = Field(default=1, gt=0, description="MoE experts per layer (1 = dense)")
    top_k: int = Field(default=1, gt=0, description="experts each token is routed to")
    expert_ffn: int | None = Field(
        default=None,
        gt=0,
        description="inner width of one expert's MLP where it is not ffn (Qwen3-MoE's moe_intermediate_size; "
        "ffn is then the width of the dense blocks' MLP); default ffn",
    )
    dense_blocks: tuple[int, ...] | None = Field(
        default=None,
        description="with experts: the blocks (0-based) whose MLP is one dense MLP of ffn width, not experts "
        "(Qwen3-MoE's mlp_only_layers and the blocks decoder_sparse_step skips); default none: every block",
    )
    aux_loss_coef: float = Field(
        default=0.0,
        ge=0,
        description="with experts: the router's load-balancing loss is added to the LM loss times this (HF's "
        "router_aux_loss_coef where output_router_logits is set; runtime/train/aux_loss.py says over which tokens); "
        "0: none",
    )
    feeds: str | None = Field(default=None, description="module this encoder feeds through a projector")
    modality: Modality | None = Field(
        default=None,
        description="input modality; default: the module's name if vision/audio, else text (llm) or vision (encoder)",
    )
    input_dim: int | None = Field(
        default=None,
        gt=0,
        description="features per input row (patch pixels, mel bins); encoders only; default by modality: "
        "588 for vision (an RGB 14x14 patch), 128 for audio (mel bins)",
    )
    downsample: int = Field(default=1, gt=0, description="encoder tokens merged into one LLM token by the projector")
    trainable: bool = Field(
        default=True,
        description="false freezes the module's weights (no gradients, no optimizer state); an encoder's "
        "projector still trains (LLaVA's stage 1 trains only the projectors)",
    )
    image_tokens: int | None = Field(
        default=None,
        gt=0,
        description="encoder tokens per image of a fixed-size vision tower: lengths are whole images and attention "
        "stays inside one image (so the module takes no context parallelism)",
    )
    clip_tokens: int | None = Field(
        default=None,
        gt=0,
        description="encoder tokens of a full clip of an audio tower that runs fixed windows (Qwen2-Audio: 1500, "
        "30 s): a sample's audio is cut into clips, each attending within itself (so no context parallelism)",
    )
    item_attention: bool = Field(
        default=False,
        description="a native-resolution vision tower (Qwen-VL): images and videos of any size (so no "
        "image_tokens), every block attending only inside one image or one video frame (or inside windows of "
        "it: window_tokens); the module takes no context parallelism, and its attention is priced per patch "
        "(pairs only from its full-attention blocks)",
    )
    window_tokens: int | None = Field(
        default=None,
        gt=0,
        description="with item_attention: patches per attention window of the blocks that attend inside windows "
        "(Qwen2.5-VL: window_size / patch_size patches a side, 8 x 8 = 64), every block but "
        "full_attention_blocks; default none: every block attends over the whole image or frame. With clip_tokens: "
        "an audio tower's tokens per chunk (Qwen2.5-Omni: n_window), its attention priced per chunk",
    )
    full_attention_blocks: tuple[int, ...] | None = Field(
        default=None,
        description="with window_tokens: the blocks (0-based) that attend over the whole image or frame instead "
        "(Qwen2.5-VL's fullatt_block_indexes)",
    )
    deepstack_blocks: tuple[int, ...] | None = Field(
        default=None,
        description="blocks (0-based) whose outputs also feed the LLM, each through a projector of its own, "
        "added into the LLM's first layers (Qwen3-VL's deepstack_visual_indexes); priced as that many more "
        "projectors",
    )
    projector_hidden: int | None = Field(
        default=None,
        gt=0,
        description="inner width of the projector's two-layer MLP from hidden x downsample to the LLM's width "
        "(Qwen-VL's merger: hidden x downsample); default none: the projector is priced as one linear layer",
    )
    max_tp: int | None = Field(
        default=None,
        gt=0,
        description="the largest tensor-parallel degree to shard this module over (a user's bound: every module "
        "orch builds, towers included, shards over any degree that splits its heads and FFN); default: any such "
        "degree",
    )
    tied_embeddings: bool = Field(
        default=False,
        description="the LLM's input embedding and output head are one matrix (tie_word_embeddings: Qwen2-0.5B, "
        "Llama-3.2-1B): both stay on one pipeline stage, so the module takes no pipeline parallelism",
    )
    hf: HFPart | None = Field(default=None, description="the Hugging Face directory this module is built from")

    @model_validator(mode="after")
    def _check_shape(self) -> ModuleSpec:
        if self.head_dim is None and self.hidden % self.heads:
            raise ValueError(f"heads ({self.heads}) must divide hidden ({self.hidden})")
        if self.head_dim is not None and self.head_dim * self.heads != self.hidden and self.hf is None:
            raise ValueError(
                f"head_dim ({self.head_dim}) x heads ({self.heads}) is not hidden ({self.hidden}): orch's own "
                "modules have heads of hidden / heads; only a module built from a Hugging Face directory (hf) may"
            )
        self._check_attention()
        if self.heads % self.num_kv_heads:
            raise ValueError(f"kv_heads ({self.num_kv_heads}) must divide heads ({self.heads})")
        if self.top_k > self.experts:
            raise ValueError(f"top_k ({self.top_k}) must be at most experts ({self.experts})")
        if self.experts == 1 and (self.expert_ffn is not None or self.dense_blocks or self.aux_loss_coef):
            raise ValueError("expert_ffn, dense_blocks and aux_loss_coef describe experts: set experts > 1")
        bad = [b for b in self.dense_blocks or () if not 0 <= b < self.layers]
        if bad:
            raise ValueError(f"dense_blocks: {bad[0]} is not a block of {self.layers}")
        if self.kind == ModuleKind.LLM:
            if self.vocab is None:
                raise ValueError("an llm module needs vocab")
            if self.feeds is not None:
                raise ValueError("an llm module feeds nothing; remove feeds")
        elif self.feeds is None:
            raise ValueError("an encoder needs feeds: the llm module it feeds")
        return self

    def _check_attention(self) -> None:
        """The per-item attention fields: an encoder's, consistent with each other and its blocks."""
        tower = ("item_attention", "window_tokens", "full_attention_blocks", "deepstack_blocks", "projector_hidden")
        if self.kind == ModuleKind.LLM:
            for name in tower:
                if getattr(self, name) not in (None, False):
                    raise ValueError(f"{name} describes an encoder; an llm module has none")
        if self.item_attention and (self.image_tokens or self.clip_tokens):
            raise ValueError("item_attention is a tower of images of any size: no image_tokens or clip_tokens")
        if self.item_attention and self.hf is None:
            raise ValueError(
                "item_attention: orch's own modules attend over whole samples; only a module built from a Hugging "
                "Face directory (hf) attends per image"
            )
        if self.window_tokens is not None and not (self.item_attention or self.clip_tokens):
            raise ValueError(
                "window_tokens needs item_attention (windows inside each image) or clip_tokens (chunks of a clip)"
            )
        if self.full_attention_blocks is not None and self.window_tokens is None:
            raise ValueError("full_attention_blocks needs window_tokens (the other blocks attend in windows)")
        for name in ("full_attention_blocks", "deepstack_blocks"):
            blocks = getattr(self, name) or ()
            bad = [b for b in blocks if not 0 <= b < self.layers]
            if bad:
                raise ValueError(f"{name}: {bad[0]} is not a block of {self.layers}")
            if len(set(blocks)) != len(blocks):
                raise ValueError(f"{name}: a block is named twice")

    @property
    def expert_width(self) -> int:
        """One expert MLP's inner width: expert_ffn, else ffn."""
        return self.expert_ffn or self.ffn

    @property
    def moe_blocks(self) -> int:
        """Blocks whose MLP is experts (every block of a MoE module but dense_blocks); 0 for a dense module."""
        return self.layers - len(set(self.dense_blocks or ())) if self.experts > 1 else 0

    def is_moe_block(self, block: int) -> bool:
        return self.experts > 1 and block not in (self.dense_blocks or ())

    @property
    def num_kv_heads(self) -> int:
        return self.kv_heads or self.heads

    @property
    def head_width(self) -> int:
        """One attention head's width: head_dim, else hidden / heads."""
        return self.head_dim or self.hidden // self.heads

    @property
    def attention_width(self) -> int:
        """Width of the queries (and of the attention output before o): heads x head_width."""
        return self.heads * self.head_width

    @property
    def full_attention_layers(self) -> int:
        """Blocks whose attention meets every token of its sequence (a sample, or an image or frame under
        item_attention): all but the windowed blocks of a tower with window_tokens."""
        if self.window_tokens is None:
            return self.layers
        return len(self.full_attention_blocks or ())

    def splits_over(self, tp: int) -> bool:
        """Whether tensor parallelism of degree tp gives every rank whole heads, whole KV heads and an
        equal slice of the FFN (the runtime shards all three; KV heads are not replicated), and is no more
        than the runtime can shard the module over (max_tp)."""
        if self.max_tp is not None and tp > self.max_tp:
            return False
        return self.heads % tp == 0 and self.num_kv_heads % tp == 0 and self.ffn % tp == 0

    def refuses(self, axis: str, degree: int) -> str | None:
        """Why the runtime cannot run this module at `degree` on `axis` (tp, cp, pp), or None: the one list of
        the module-shape rules that the planner's pins, its search and the runtime's launch check all apply."""
        if degree <= 1:
            return None
        if axis == "tp" and self.max_tp is not None and degree > self.max_tp:
            return f"this module takes tensor parallelism up to {self.max_tp} (its max_tp)"
        if axis == "tp" and not self.splits_over(degree):
            return f"does not split {self.heads} heads, {self.num_kv_heads} KV heads and FFN {self.ffn} evenly"
        if axis == "cp" and self.windowed:
            return (
                "a tower of fixed windows (whole images, audio clips, a native-resolution tower's images) attends "
                "within each and takes no context parallelism"
            )
        if axis == "pp" and self.tied_embeddings:
            return (
                "the model ties its embedding and head (tie_word_embeddings), which a pipeline would split over "
                "two stages"
            )
        if axis == "pp" and degree > self.layers:
            return f"more stages than its {self.layers} layers"
        if axis == "pp" and self.aux_loss_coef:
            return (
                f"the router's auxiliary loss (aux_loss_coef {self.aux_loss_coef:g}) takes every layer's choices of a "
                "micro-batch on one stage; set output_router_logits false in config.json to pipeline it"
            )
        return None

    @property
    def windowed(self) -> bool:
        """Attention stays inside windows of a sample (whole images, audio clips, a native-resolution tower's
        images and frames): no context parallelism."""
        return bool(self.image_tokens or self.clip_tokens or self.item_attention)

    def round_length(self, tokens: int) -> int:
        """A sample's encoder tokens as the module takes them: whole images of `image_tokens` (at least one
        where there are any tokens), whole LLM tokens of a clip tower or a native-resolution tower (a multiple
        of `downsample`, which its pooling or patch merger needs); unchanged otherwise."""
        if tokens <= 0:
            return tokens
        unit = self.image_tokens or (self.downsample if self.clip_tokens or self.item_attention else 1)
        return max(1, round(tokens / unit)) * unit

    @property
    def mlp_kind(self) -> str:
        return self.mlp or ("swiglu" if self.kind == ModuleKind.LLM else "gelu")


class ModelSpec(_Spec):
    version: Literal[1] = 1
    name: str
    modules: dict[str, ModuleSpec]
    data: str | None = Field(default=None, description="data preset or file used when --data is not given")

    @model_validator(mode="after")
    def _check_graph(self) -> ModelSpec:
        llms = [n for n, m in self.modules.items() if m.kind == ModuleKind.LLM]
        if len(llms) != 1:
            raise ValueError(f"exactly one module of kind llm is expected, found {len(llms)}")
        for name, mod in self.modules.items():
            if mod.feeds is not None and mod.feeds != llms[0]:
                raise ValueError(f"modules.{name}.feeds: '{mod.feeds}' is not the llm module '{llms[0]}'")
        # An encoder without input_dim gets its modality's default, recorded in the spec (and so in the plan).
        filled = dict(self.modules)
        for name, mod in self.modules.items():
            if mod.kind != ModuleKind.ENCODER or mod.input_dim is not None:
                continue
            default = self.modality(name).default_input_dim
            if default is None:
                raise ValueError(f"modules.{name}.input_dim: a {self.modality(name)} encoder needs input_dim")
            filled[name] = mod.model_copy(update={"input_dim": default})
        if filled != self.modules:
            object.__setattr__(self, "modules", filled)  # frozen: set once, while validating
        return self

    @property
    def llm_name(self) -> str:
        return next(n for n, m in self.modules.items() if m.kind == ModuleKind.LLM)

    @property
    def llm(self) -> ModuleSpec:
        return self.modules[self.llm_name]

    @property
    def prefix_width(self) -> int:
        """Values per encoder row an encoder hands the LLM: the LLM's width, times 1 + the deepstack blocks of a
        tower whose intermediate features ride along (Qwen3-VL: each added into one of the LLM's first layers)."""
        extra = max((len(self.modules[e].deepstack_blocks or ()) for e in self.encoder_names), default=0)
        return self.llm.hidden * (1 + extra)

    @property
    def encoder_names(self) -> list[str]:
        return [n for n, m in self.modules.items() if m.kind == ModuleKind.ENCODER]

    def modality(self, name: str) -> Modality:
        """Module `name`'s input modality: its `modality` field; else text for the LLM, and for an
        encoder its name if that is vision or audio, else vision (a patch stem)."""
        spec = self.modules[name]
        if spec.modality is not None:
            return spec.modality
        if spec.kind == ModuleKind.LLM:
            return Modality.TEXT
        return Modality(name) if name in (Modality.VISION, Modality.AUDIO) else Modality.VISION


# Memory per device a plan leaves unused, by device kind, where the cluster spec names none (GpuSpec.reserve_gb):
# on a GPU the CUDA context, NCCL's buffers, the caching allocator's fragmentation and kernel workspaces; on a CPU
# rank the Python process with torch and gloo loaded.
RESERVE_GB = {"cuda": 3.0, "cpu": 0.5}


class GpuSpec(_Spec):
    memory_gb: float = Field(gt=0, description="device memory, GB (a CPU rank: its share of the host's RAM)")
    peak_tflops: float = Field(gt=0, description="peak dense bf16 TFLOP/s")
    device: Literal["cuda", "cpu"] = Field(default="cuda", description="what a rank computes on: a GPU or a CPU")
    reserve_gb: float | None = Field(
        default=None,
        ge=0,
        description="memory per device that plans leave unused (CUDA context, NCCL buffers, allocator "
        "fragmentation, workspaces): a plan fits memory_gb less this; default by device: "
        + ", ".join(f"{gb:g} for {kind}" for kind, gb in RESERVE_GB.items()),
    )

    @model_validator(mode="after")
    def _leaves_memory(self) -> GpuSpec:
        if self.reserve >= self.memory_gb:
            raise ValueError(
                f"reserve_gb ({self.reserve:g}) leaves nothing of memory_gb ({self.memory_gb:g}) to plan with; "
                "lower reserve_gb"
            )
        return self

    @property
    def reserve(self) -> float:
        """GB per device a plan leaves unused: reserve_gb, else the device kind's default (RESERVE_GB)."""
        return self.reserve_gb if self.reserve_gb is not None else RESERVE_GB[self.device]

    @property
    def usable_gb(self) -> float:
        """GB per device a plan may fill: memory_gb less the reserve."""
        return self.memory_gb - self.reserve


class LinkSpec(_Spec):
    intra_node_gbps: float = Field(gt=0, description="GB/s per GPU, one direction, inside a node")
    inter_node_gbps: float = Field(gt=0, description="GB/s per GPU, one direction, between nodes")
    intra_node_latency_us: float = Field(default=5.0, ge=0, description="per-hop latency inside a node, µs")
    inter_node_latency_us: float = Field(default=15.0, ge=0, description="per-hop latency between nodes, µs")


class ClusterSpec(_Spec):
    version: Literal[1] = 1
    name: str
    nodes: int = Field(gt=0)
    gpus_per_node: int = Field(gt=0)
    gpu: GpuSpec
    links: LinkSpec
    mfu: float = Field(default=0.5, gt=0, le=1, description="achievable fraction of peak on large GEMMs")
    cpus_per_gpu: int | None = Field(
        default=None,
        gt=0,
        description="CPU cores per GPU task (Slurm cpus_per_task); default: the partition's CPUs per node over "
        "its tasks, read with sinfo at launch (8 where no Slurm answers, as in a dry run elsewhere)",
    )

    @property
    def world_size(self) -> int:
        return self.nodes * self.gpus_per_node


class TaskSpec(_Spec):
    """One kind of training sample: its share of the mix and its tokens per module."""

    name: str = ""
    weight: float = Field(gt=0)
    tokens: dict[str, int] = Field(description="mean tokens per sample per module (missing: 0)")
    max: dict[str, int] = Field(default_factory=dict, description="cap per module; lengths vary up to it")
    spread: float | None = Field(
        default=None, ge=0, le=3, description="log-normal sigma of lengths; default 0.5 with max, else 0"
    )

    @field_validator("tokens", "max")
    @classmethod
    def _non_negative(cls, value: dict[str, int]) -> dict[str, int]:
        for module, n in value.items():
            if n < 0:
                raise ValueError(f"{module}: expected a token count >= 0, got {n}")
        return value

    @model_validator(mode="after")
    def _max_above_mean(self) -> TaskSpec:
        for module, cap in self.max.items():
            if cap < self.tokens.get(module, 0):
                raise ValueError(f"max.{module} ({cap}) is below tokens.{module} ({self.tokens.get(module, 0)})")
        return self

    @property
    def sigma(self) -> float:
        if self.spread is not None:
            return self.spread
        return 0.5 if self.max else 0.0


class DataSpec(_Spec):
    version: Literal[1] = 1
    name: str = ""
    global_batch: int = Field(gt=0, description="samples per optimizer step")
    seq_len: int = Field(gt=0, description="cap on LLM tokens per sample")
    tasks: list[TaskSpec] = Field(default_factory=list)
    manifest: str | None = Field(
        default=None, description="JSONL of per-sample token counts per module, instead of tasks"
    )
    source: str | None = Field(
        default=None,
        description="the conversation data file (or mix file) `manifest` indexes (orch data index): trained on",
    )
    tokenizer: str | None = Field(
        default=None, description="tokenizer.json of the source's text (else the LLM's HF dir)"
    )

    @model_validator(mode="after")
    def _one_source(self) -> DataSpec:
        if not self.tasks and self.manifest is None:
            raise ValueError("give tasks or a manifest")
        if self.tasks and self.manifest is not None:
            raise ValueError("give tasks or a manifest, not both")
        if self.source is not None and self.manifest is None:
            raise ValueError("a source needs its index as the manifest (orch data index)")
        return self
