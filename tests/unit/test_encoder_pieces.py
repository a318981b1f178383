"""A sample's encoder items (runtime/data/batch.py encoder_items) and an encoder phase's pieces
(runtime/train/pieces.py): runs of a video's temporal patch groups, images, the boundary table of pieces."""

from dataclasses import dataclass

import torch

from orch.planner.balance.items import VIDEO_RUNS
from orch.planner.specs import HFPart, ModelSpec
from orch.runtime.data.batch import EncoderItem, MediaItem, Sample, encoder_items
from orch.runtime.train.pieces import item_pieces, piece_sample, whole_pieces


def _model(**vision) -> ModelSpec:
    """A tiny spec; `vision` set past validation (item_attention is an HF tower's: here only its items matter)."""
    spec = ModelSpec.model_validate(
        {
            "name": "m",
            "modules": {
                "llm": {"kind": "llm", "layers": 1, "hidden": 8, "heads": 2, "ffn": 16, "vocab": 32},
                "vision": {
                    "kind": "encoder",
                    "modality": "vision",
                    "layers": 1,
                    "hidden": 8,
                    "heads": 2,
                    "ffn": 16,
                    "input_dim": 6,
                    "feeds": "llm",
                },
            },
        }
    )
    modules = dict(spec.modules, vision=spec.modules["vision"].model_copy(update=vision))
    return spec.model_copy(update={"modules": modules})


@dataclass
class _Batch:
    model: ModelSpec
    tokens: list[int]
    media: list[tuple[MediaItem, ...]]

    @property
    def enc_tokens(self):
        return tuple({"vision": n} for n in self.tokens)

    def items(self, encoder, i):
        return self.media[i]

    def input_rows(self, encoder, i):
        return self.tokens[i]

    def projected(self, encoder, i):
        d = self.model.modules[encoder].downsample
        return -(-self.tokens[i] // d)


def test_a_long_video_is_cut_into_contiguous_runs_of_its_temporal_groups():
    model = _model(item_attention=True, downsample=4)
    video = MediaItem((40, 4, 6), seconds=1.0)
    image = MediaItem((1, 2, 4))
    batch = _Batch(model, [40 * 24 + 8, 0], [(image, video), ()])
    items = encoder_items(batch, "vision", 0)
    assert items[0] == EncoderItem(8, 8, 2, (image,))
    runs = [it.media[0].grid for it in items[1:]]
    assert len(runs) == VIDEO_RUNS and sum(t for t, _, _ in runs) == 40
    assert all(g[1:] == (4, 6) and g[0] in (2, 3) for g in runs)
    assert sum(it.rows for it in items) == batch.input_rows("vision", 0)
    assert sum(it.projected for it in items) == batch.projected("vision", 0)
    assert encoder_items(batch, "vision", 1) == ()


def test_a_fixed_size_hf_towers_items_are_its_images():
    batch = _Batch(_model(image_tokens=9, hf=HFPart(path="dir", part="vision")), [27, 5], [(), ()])
    assert encoder_items(batch, "vision", 0) == (EncoderItem(9, 9, 9),) * 3
    assert encoder_items(batch, "vision", 1) == (EncoderItem(5, 5, 5),)  # not whole images: the sample whole
    own = _Batch(_model(image_tokens=9), [27], [()])  # orch's own tower attends over the whole sample
    assert encoder_items(own, "vision", 0) == (EncoderItem(27, 27, 27),)


def test_pieces_are_runs_of_items_on_one_rank_and_route_to_the_samples_llm_rank():
    items = [
        (EncoderItem(4, 4, 1),) * 4,  # sample 0: items on ranks 1, 1, 0, 1 -> three pieces
        (),  # sample 1: no vision
        (EncoderItem(8, 8, 2),),
    ]
    pieces = item_pieces((0, 1, 0), [[1, 1, 0, 1], [], [0]], items)
    assert pieces.sample == (0, 0, 0, 1, 2)
    assert (pieces.first, pieces.count) == ((0, 2, 3, 0, 0), (2, 1, 1, 0, 1))
    assert pieces.dest == (1, 0, 1, 1, 0) and pieces.origin == (0, 0, 0, 1, 0)
    assert (pieces.rows, pieces.projected) == ((8, 4, 4, 0, 8), (2, 1, 1, 0, 2))
    assert pieces.cut
    table = pieces.boundary_table((1, 0, 1), dp=2, llm_dp=2)  # LLM ranks of the samples
    assert table.src == (1, 0, 1, 1, 0) and table.dst == (1, 1, 1, 0, 1)
    assert table.held(1) == [0, 1, 2, 4]  # ascending: sample 0's pieces in order, then sample 2's
    assert not whole_pieces((0, 1, 0), (0, 1, 0), items).cut


def test_a_piece_is_its_items_rows_and_media():
    items = (EncoderItem(2, 2, 1, (MediaItem((1, 1, 2)),)), EncoderItem(3, 3, 1, (MediaItem((1, 1, 3)),)))
    whole = Sample(0, {"vision": torch.arange(5.0)[:, None]}, torch.tensor([1]), torch.tensor([2]))
    pieces = item_pieces((0,), [[0, 1]], [items])
    second = piece_sample(whole, 1, pieces, "vision", items)
    assert second.id == 1 and second.feats["vision"].flatten().tolist() == [2.0, 3.0, 4.0]
    assert second.items == {"vision": (MediaItem((1, 1, 3)),)}
