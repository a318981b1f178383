"""The Qwen-VL family's modules (Qwen2-VL, Qwen2.5-VL, Qwen3-VL with its deepstack) against transformers' own model, in one
process, float64: orch's vision tower
over the packed images and videos of several samples, and its M-RoPE LLM over the layouts those samples have,
give the loss of Qwen2-VL's / Qwen2.5-VL's `ForConditionalGeneration` forward on the same ids, pixels and
grids (1e-9), and the same gradient for every parameter; the M-RoPE positions equal HF's `get_rope_index`."""

import pytest
import torch
import torch.nn.functional as F
from equivalence import assert_same_gradients
from qwen_vl_models import make_qwen_vl

from orch.runtime.models.qwen_vl.rope import mrope_positions
from orch.runtime.sample import MediaItem, SequenceLayout, grid_items

CLASSES = {"qwen2_vl": "Qwen2VLForConditionalGeneration", "qwen2_5_vl": "Qwen2_5_VLForConditionalGeneration",
           "qwen3_vl": "Qwen3VLForConditionalGeneration"}  # fmt: skip
PATCH_VALUES = {"qwen2_vl": 1176, "qwen2_5_vl": 1176, "qwen3_vl": 1536}
# Per sample: (text pieces, items between them); an item is (t, h, w, seconds) in patches.
SAMPLES = [
    ([5, 3, 4], [(1, 4, 6, 0.0), (1, 8, 8, 0.0)]),  # two images
    ([7], []),  # text only
    ([2, 6], [(2, 6, 4, 1.0)]),  # a video of two temporal grids, 1 s each
    ([3, 2, 5], [(1, 16, 16, 0.0), (3, 4, 4, 0.5)]),  # an image of 64 merged tokens, a video
]
# Shapes unlike SAMPLES': images of 4 to 48 merged tokens at many aspect ratios, most larger than Qwen2.5-VL's
# window (2x2 merged units at window_size 56, 4x4 at 112) and of merged sides it does not divide (3, 5, 7, 1 x 12),
# up to three images in a sample, an image after a video.
ODD_SAMPLES = [
    ([4, 2], [(1, 6, 10, 0.0)]),  # 3 x 5 merged
    ([3, 1, 6], [(1, 14, 4, 0.0), (1, 2, 24, 0.0)]),  # 7 x 2, then 1 x 12
    ([6], []),  # text only
    ([2, 0, 3, 4], [(1, 10, 6, 0.0), (1, 4, 4, 0.0), (1, 12, 14, 0.0)]),  # 5 x 3, one window, 6 x 7
    ([1, 2, 3], [(2, 6, 10, 1.0), (1, 8, 12, 0.0)]),  # a video of 3 x 5 merged, an image of 4 x 6
]
# The models the odd shapes run on: each family's, and a Qwen2.5-VL of 4x4-unit windows whose full-attention
# blocks are not the tests' usual [1, 3].
ODD_MODELS = {"qwen2_vl": ("qwen2_vl", None), "qwen2_5_vl": ("qwen2_5_vl", None),
              "qwen2_5_vl_window112": ("qwen2_5_vl", {"window_size": 112, "fullatt_block_indexes": [0, 2]}),
              "qwen3_vl": ("qwen3_vl", None)}  # fmt: skip


@pytest.fixture(scope="module", params=list(CLASSES))
def family(request, tmp_path_factory):
    return request.param, make_qwen_vl(tmp_path_factory.mktemp(request.param), request.param, seed=3)


@pytest.fixture(scope="module")
def odd_models(tmp_path_factory):
    """key of ODD_MODELS -> (family, directory), each model written once on first use."""
    made = {}

    def get(key):
        if key not in made:
            name, vision = ODD_MODELS[key]
            made[key] = name, make_qwen_vl(tmp_path_factory.mktemp(key), name, seed=5, vision_extra=vision)
        return made[key]

    return get


def _hf(directory, family, attention=None):
    import transformers

    model = getattr(transformers, CLASSES[family]).from_pretrained(directory, dtype=torch.float64)
    if attention is not None:
        model.config.text_config._attn_implementation = attention
    return model


def _samples(family, samples=SAMPLES):
    """`samples`; Qwen3-VL's videos are frames between timestamps in the text (tests/unit/test_qwen3_vl_video.py):
    images only here."""
    if family != "qwen3_vl":
        return samples
    return [(pieces, [(1, h, w, 0.0) for _, h, w, _ in items]) for pieces, items in samples]


def _sequences(config, gen, family, samples=SAMPLES):
    """Per sample: its HF input_ids, token types, labels; its orch text ids, layout inserts, items and pixels."""
    start, end = config.vision_start_token_id, config.vision_end_token_id
    out = []
    for pieces, items in _samples(family, samples):
        text: list[int] = []
        ids: list[int] = []
        types: list[int] = []
        inserts, prefix = [], 0
        for k, n in enumerate(pieces):
            words = torch.randint(1, 20, (n,), generator=gen).tolist()
            text += words
            ids += words
            types += [0] * n
            if k < len(items):
                t, h, w, s = items[k]
                rows = t * h * w // 4
                pad = config.video_token_id if s else config.image_token_id
                text += [start]
                ids += [start, *[pad] * rows]
                types += [0, *[2 if s else 1] * rows]
                inserts.append((len(text), prefix, rows))
                prefix += rows
                text += [end]
                ids += [end]
                types += [0]
        media = [MediaItem((t, h, w), s) for t, h, w, s in items]
        width = PATCH_VALUES[family]
        pixels = [torch.randn(it.patches, width, generator=gen, dtype=torch.float64) for it in media]
        out.append((ids, types, text, inserts, prefix, media, pixels))
    return out


def test_mrope_positions_equal_hf_get_rope_index(family):
    _check_positions(*family, SAMPLES)


@pytest.mark.parametrize("key", list(ODD_MODELS))
def test_mrope_positions_on_odd_shapes_equal_hf_get_rope_index(odd_models, key):
    """Several images of other aspect ratios in a sample: each later image's positions start where HF's do."""
    _check_positions(*odd_models(key), ODD_SAMPLES)


def _check_positions(name, directory, samples):
    hf = _hf(directory, name)
    gen = torch.Generator().manual_seed(0)
    tps = getattr(hf.config.vision_config, "tokens_per_second", None) if name == "qwen2_5_vl" else None
    for ids, types, text, inserts, prefix, media, _ in _sequences(hf.config, gen, name, samples):
        layout = SequenceLayout.interleaved(prefix, len(text), inserts)
        got = mrope_positions(layout, media, 2, tps)
        images = [it.grid for it in media if not it.is_video]
        videos = [it.grid for it in media if it.is_video]
        kwargs = {"second_per_grid_ts": torch.tensor([it.seconds for it in media if it.is_video])} if videos else {}
        if name == "qwen2_vl":
            kwargs = {}
        want, _ = hf.model.get_rope_index(
            torch.tensor([ids]),
            mm_token_type_ids=torch.tensor([types]),
            image_grid_thw=torch.tensor(images) if images else None,
            video_grid_thw=torch.tensor(videos) if videos else None,
            **kwargs,
        )
        assert torch.equal(got, want[:, 0]), (got, want[:, 0])


def test_grid_items_cover_the_patches_in_merge_windows():
    assert grid_items(0, 4) == ()
    assert grid_items(24, 4) == (MediaItem((1, 4, 6)),)
    assert grid_items(28, 4) == (MediaItem((1, 2, 14)),)  # 7 units: a prime
    with pytest.raises(ValueError, match="merge windows"):
        grid_items(10, 4)


def test_loss_and_gradients_equal_hf(family):
    _check_loss_and_gradients(*family, SAMPLES)


@pytest.mark.parametrize("key", ["qwen2_5_vl", "qwen2_5_vl_window112"])
def test_loss_and_gradients_on_odd_shapes_equal_hf(odd_models, key):
    """Images larger than Qwen2.5-VL's window, of grids it does not divide, up to three per sample at different
    aspect ratios, full-attention blocks elsewhere than [1, 3]: HF's loss and every gradient (1e-9). (Qwen2-VL's
    and Qwen3-VL's towers have no windows: their odd shapes are held by the tower and position tests.)"""
    _check_loss_and_gradients(*odd_models(key), ODD_SAMPLES)


@pytest.mark.parametrize("key", list(ODD_MODELS))
def test_tower_on_odd_shapes_equals_hf_per_image(odd_models, key):
    """orch's tower over every item of several samples at once gives, per item, HF's tower on that item alone
    (its merged rows; Qwen3-VL's deepstack features beside them), 1e-9 of the largest entry."""
    from orch.runtime.models.qwen_vl.vision import QwenVisionTower

    name, directory = odd_models(key)
    hf = _hf(directory, name)
    tower = QwenVisionTower(hf.model.visual, hf.config)
    seqs = _sequences(hf.config, torch.Generator().manual_seed(2), name, ODD_SAMPLES)
    with torch.no_grad():
        got = tower(torch.cat([p for s in seqs for p in s[6]]), [sum(p.shape[0] for p in s[6]) for s in seqs],
                    items=[s[5] for s in seqs])  # fmt: skip
        want = []
        for *_, media, pixels in seqs:
            for item, p in zip(media, pixels, strict=True):
                out = hf.model.visual(p, grid_thw=torch.tensor([item.grid]))
                want.append(torch.cat([out.pooler_output, *(getattr(out, "deepstack_features", None) or [])], -1))
    want_all = torch.cat(want)
    assert got.shape == want_all.shape == (sum(s[4] for s in seqs), tower.output_dim)
    assert (got - want_all).abs().max() <= 1e-9 * want_all.abs().max()


def _check_loss_and_gradients(name, directory, samples):
    from orch.runtime.models.hf.attention import register
    from orch.runtime.models.qwen_vl.language import DeepstackCausalLM, MRopeCausalLM
    from orch.runtime.models.qwen_vl.vision import QwenVisionTower
    from orch.runtime.sample import scored_labels

    hf = _hf(directory, name)
    mine = _hf(directory, name, attention=register())
    tower = QwenVisionTower(mine.model.visual, mine.config)
    deepstack = len(getattr(mine.config.vision_config, "deepstack_visual_indexes", None) or ())
    if deepstack:  # Qwen3-VL: the tower's deepstack features ride along each row into the LLM's first layers
        llm = DeepstackCausalLM(mine.model.language_model, mine.lm_head, mine.config.text_config, deepstack)
    else:
        llm = MRopeCausalLM(mine.model.language_model, mine.lm_head, mine.config.text_config)
    tps = getattr(hf.config.vision_config, "tokens_per_second", None) if name == "qwen2_5_vl" else None
    gen = torch.Generator().manual_seed(1)
    seqs = _sequences(hf.config, gen, name, samples)
    labels_all = []
    total = torch.zeros((), dtype=torch.float64)
    count = 0
    for ids, types, _, _, _, media, pixels in seqs:  # HF: sample by sample, its own forward
        labels = [i if k % 3 else -100 for k, i in enumerate(ids)]  # some positions untrained
        labels = [y if t == 0 else -100 for y, t in zip(labels, types, strict=True)]
        labels_all.append(labels)
        images = [(it, p) for it, p in zip(media, pixels, strict=True) if not it.is_video]
        videos = [(it, p) for it, p in zip(media, pixels, strict=True) if it.is_video]
        kwargs = {}
        if images:
            kwargs |= {"pixel_values": torch.cat([p for _, p in images]),
                       "image_grid_thw": torch.tensor([it.grid for it, _ in images])}  # fmt: skip
        if videos:
            kwargs |= {"pixel_values_videos": torch.cat([p for _, p in videos]),
                       "video_grid_thw": torch.tensor([it.grid for it, _ in videos])}  # fmt: skip
            if name == "qwen2_5_vl":
                kwargs["second_per_grid_ts"] = torch.tensor([it.seconds for it, _ in videos])
        logits = hf(input_ids=torch.tensor([ids]), mm_token_type_ids=torch.tensor([types]), **kwargs).logits[0]
        target = torch.tensor([*labels[1:], -100])
        total = total + F.cross_entropy(logits, target, reduction="sum", ignore_index=-100)
        count += int((target != -100).sum())
    (total / count).backward()

    # orch: every sample's items through the tower at once, then the LLM over the packed samples.
    feats = torch.cat([p for *_, pixels in seqs for p in pixels])
    out = tower(feats, [sum(p.shape[0] for p in s[6]) for s in seqs], items=[s[5] for s in seqs])
    prefixes = list(out.split([s[4] for s in seqs]))
    layouts, texts, text_labels = [], [], []
    for (_, types, text, inserts, prefix, media, _), labels in zip(seqs, labels_all, strict=True):
        layout = SequenceLayout.interleaved(prefix, len(text), inserts)
        layouts.append(SequenceLayout(layout.prefix, layout.text, layout.source, layout.score,
                                      mrope_positions(layout, media, 2, tps)))  # fmt: skip
        texts.append(torch.tensor(text))
        text_labels.append(torch.tensor([y for y, t in zip(labels, types, strict=True) if t == 0]))
    logits = llm(prefixes, texts, None, layouts)
    loss = F.cross_entropy(logits, torch.cat(scored_labels(text_labels, layouts)), reduction="sum") / count
    loss.backward()
    assert abs(loss.item() - (total / count).item()) <= 1e-9 * abs(loss.item())
    assert_same_gradients(mine, hf)


def test_a_tower_takes_tp2_and_is_refused_cp2_in_one_line(family):
    """The tower at TP 2 passes the launch check (its heads and FFN split); CP 2 is refused in one line, and so
    is TP 2 where the user bounds the tower to TP 1 (max_tp)."""
    from orch.planner.plan import Layout
    from orch.planner.specs import DataSpec, TaskSpec
    from orch.runtime.models.registry import model_spec_from_dir
    from orch.runtime.plans import hand_plan
    from orch.runtime.train.support import UnsupportedPlan, check_supported

    _, directory = family
    model = model_spec_from_dir(directory)
    bounded = model.model_copy(
        update={"modules": {**model.modules, "vision": model.modules["vision"].model_copy(update={"max_tp": 1})}}
    )
    data = DataSpec(global_batch=4, seq_len=64, tasks=[TaskSpec(weight=1, tokens={"vision": 16, "llm": 32})])

    def plan_of(spec, layout):
        return hand_plan(spec, data, {"llm": (Layout(dp=4), [0, 1, 2, 3]), "vision": (layout, [0, 1, 2, 3])})

    check_supported(plan_of(model, Layout(tp=2, dp=2)))
    for spec, layout, want in (
        (bounded, Layout(tp=2, dp=2), "modules.vision.layout.tp: 2: this module takes tensor parallelism up to 1"),
        (model, Layout(cp=2, dp=2), "modules.vision.layout.cp: 2: a tower of fixed windows"),
    ):
        with pytest.raises(UnsupportedPlan, match=want.replace(".", r"\.").replace("(", r"\(")):
            check_supported(plan_of(spec, layout))


def test_the_start_up_calibration_times_the_familys_own_modules(family):
    """The dispatcher's calibrated costs come from the tower as it runs (Qwen2.5-VL's windows), not from orch's
    reference module of the same shape; lengths as the tower takes them (whole merge windows); the LLM as the
    family builds it."""
    from orch.runtime.models.qwen_vl.language import MRopeCausalLM
    from orch.runtime.models.qwen_vl.vision import QwenVisionTower
    from orch.runtime.models.registry import model_spec_from_dir
    from orch.runtime.train.calibration import _time_module, whole_module

    _, directory = family
    model = model_spec_from_dir(directory)
    tower = whole_module(model, "vision", torch.float64, torch.device("cpu"))
    assert isinstance(tower, QwenVisionTower) and len(tower.visual.blocks) == model.modules["vision"].layers
    llm = whole_module(model, "llm", torch.float64, torch.device("cpu"))
    assert isinstance(llm, MRopeCausalLM)
    assert model.modules["vision"].round_length(2) == 4 and model.modules["vision"].round_length(65) == 64
    assert _time_module(model, "vision", tower, 2, 64, torch.float64) > 0
    # the LLM timed on inputs as wide as the executors feed it (Qwen3-VL's rows carry its deepstack features)
    assert _time_module(model, "llm", llm, 2, 16, torch.float64) > 0
