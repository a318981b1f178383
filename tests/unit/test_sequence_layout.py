"""Placeholders expanded in place (runtime/sample.py, runtime/data/expansion.py): where a sample's
encoder rows and text go, which logits are scored, and the LLM over an interleaved layout equals the same
rows run as one plain sequence."""

import pytest
import torch

from orch.planner.specs import ModelSpec
from orch.runtime.data.conversations import Conversation
from orch.runtime.data.expansion import conversation_layout, expanded, media_rows
from orch.runtime.data.index import IGNORE
from orch.runtime.models.registry import load_model
from orch.runtime.sample import SequenceLayout, score_rows, scored_labels


def test_interleaved_places_rows_before_their_tokens_and_scores_the_row_before_each_token():
    # 4 text tokens; 3 prefix rows before token 1, 2 rows after the last token
    lay = SequenceLayout.interleaved(5, 4, [(1, 0, 3), (4, 3, 2)])
    assert lay.source.tolist() == [5, 0, 1, 2, 6, 7, 8, 3, 4]  # rows of cat([prefix, text]) per position
    assert lay.score.tolist() == [-1, 3, 4, 5]  # token 1 by the prefix's last row, token 0 by none
    assert [t.tolist() for t in lay.scored] == [[3, 4, 5], [1, 2, 3]]
    first = SequenceLayout.interleaved(3, 4, [(0, 0, 3)])
    assert first.source is None and first.score.tolist() == [2, 3, 4, 5]  # in order: no gather
    assert SequenceLayout.prefix_first(3, 4).score.tolist() == [3, 4, 5, 6]  # synthetic: its own position
    with pytest.raises(ValueError, match="rows"):
        SequenceLayout.interleaved(5, 4, [(1, 0, 3)])


def test_score_rows_and_labels_over_a_packed_micro_batch():
    a = SequenceLayout.interleaved(2, 3, [(1, 0, 2)])  # positions: t0 p p t1 t2
    b = SequenceLayout.prefix_first(1, 2)
    rows = score_rows([5, 3], [a, b], torch.device("cpu"))
    assert rows.tolist() == [2, 3, 5 + 1, 5 + 2]
    labels = scored_labels([torch.tensor([10, 11, 12]), torch.tensor([20, 21])], [a, b])
    assert [y.tolist() for y in labels] == [[11, 12], [20, 21]]


def _two_tower_model() -> ModelSpec:
    tiny = load_model("tiny")
    vision = tiny.modules["vision"].model_copy(update={"downsample": 2})
    return tiny.model_copy(update={"modules": {**tiny.modules, "vision": vision, "vision2": tiny.modules["vision"]}})


def test_media_rows_split_one_encoders_pooled_rows_over_its_images():
    spec = load_model("tiny").modules["vision"].model_copy(update={"downsample": 2})
    assert media_rows([4, 6], spec) == [2, 3]  # whole multiples: each image's own
    assert media_rows([3, 3], spec) == [2, 1]  # pooled as one sequence: 3 rows, cut where image 1 ends
    assert media_rows([], spec) == []


def test_conversation_layout_puts_each_image_and_clip_where_its_placeholder_stood():
    model = _two_tower_model()
    # text of 6 tokens: <image> before token 2, <audio> before 4, a second <image> at the end
    marks = [(2, "<image>"), (4, "<audio>"), (6, "<image>")]
    media = {"vision": [4, 2], "vision2": [3, 1], "audio": [4]}
    lay = conversation_layout(model, marks, 6, media)
    # prefix (encoder after encoder, by name): audio 2 rows (pooled by 2), vision 2+1, vision2 3+1
    assert lay.prefix == 2 + 3 + 4
    src = lay.source.tolist()
    text = [p for p, s in enumerate(src) if s >= lay.prefix]
    assert [src[p] - lay.prefix for p in text] == list(range(6))
    assert src[2:7] == [2, 3, 5, 6, 7]  # image 1: vision's rows then vision2's, before token 2
    assert src[9:11] == [0, 1]  # the clip before token 4
    assert src[13:] == [4, 8]  # image 2 after the text
    ids, labels = expanded(model, lay, media, [1, 2, 3, 4, 5, 6], [IGNORE, IGNORE, 3, 4, IGNORE, 6],
                           {"<image>": 90, "<audio>": 91}, IGNORE)  # fmt: skip
    assert ids == [1, 2, 90, 90, 90, 90, 90, 3, 4, 91, 91, 5, 6, 90, 90]
    assert labels == [IGNORE, IGNORE, *[IGNORE] * 5, 3, 4, IGNORE, IGNORE, IGNORE, 6, IGNORE, IGNORE]


def test_text_tokens_mark_placeholders_at_their_token_offsets(tmp_path):
    from orch.runtime.data.demo_data import make_tokenizer
    from orch.runtime.data.index import TextCounter

    tok = make_tokenizer(tmp_path / "tokenizer.json")
    template = "{% for m in messages %}{{ m['role'] }} : {{ m['content'] }} ?\n{% endfor %}"
    counter = TextCounter(str(tok), template)
    conv = Conversation("x:1", (("user", "what is <image> in <audio>"), ("assistant", "here is <image>a tone")),
                        ("a.png", "b.png"), ("c.wav",))  # fmt: skip
    got = counter.tokens(conv)
    words = [counter.tokenizer.id_to_token(i) for i in got.ids]
    assert words == ["[UNK]", "[UNK]", "what", "is", "in", "?", "[UNK]", "[UNK]", "here", "is", "a", "tone", "?"]
    assert got.marks == [(4, "<image>"), (5, "<audio>"), (10, "<image>")]
    trained = [w for w, y in zip(words, got.labels, strict=True) if y != IGNORE]
    assert trained == ["here", "is", "a", "tone"]  # the assistant's content only, its placeholder cut out
    assert counter.count([conv]) == [len(got.ids)]


def test_the_llm_over_an_interleaved_layout_is_the_plain_sequence_of_the_same_rows():
    from orch.runtime.models.reference import build_module

    model = load_model("tiny")
    torch.manual_seed(0)
    llm = build_module("llm", model).to(torch.float64)
    hidden = model.llm.hidden
    prefix = torch.randn(5, hidden, dtype=torch.float64)
    text = torch.randint(0, model.llm.vocab, (4,))
    lay = SequenceLayout.interleaved(5, 4, [(1, 0, 3), (4, 3, 2)])
    got = llm([prefix], [text], None, [lay])
    rows = torch.cat([prefix, llm.embed(text)])[lay.source]  # the same sequence, built by hand
    x = llm.run_blocks(rows, [9])
    want = llm.head(llm.norm(x))[[3, 4, 5]]  # the rows before tokens 1..3
    torch.testing.assert_close(got, want, rtol=1e-12, atol=1e-12)
