"""Encoder phases balanced by item (runtime/train/pieces.py, post_balance.py): a sample's images, or runs of its
video's temporal patch groups, run on several ranks and their rows are gathered back to its LLM rank, with the
results of the unsplit run.

In float64 on 4 ranks, ONE launch: a tiny Qwen2.5-VL on a data file with one long video (several times a rank's
mean vision work) beside images and text, and a LLaVA on samples of up to five images; `encoder_balance: item` and
`sample` give the single-process reference's losses (1e-9) and gradients (1e-9; a key bias's, zero in exact
arithmetic, against a millionth of the largest gradient: equivalence.gradient_errors), under homogeneous (FSDP keep
and reshard), colocated (vision DP4, LLM TP2 DP2), LLM CP2 and disaggregated plans. The item runs really cut:
the video's runs (the LLaVA sample's images) ran on more than one rank.
"""

import pytest
import torch
from equivalence import gradient_errors, merged
from hf_models import make_llava, save_processor
from launching import train_tasks
from qwen_vl_data import turn, write_conversations, write_image, write_video
from qwen_vl_models import make_qwen_vl

from orch.cli.data_cmd import conversation_data
from orch.planner.plan import DataParallel, Layout, Sharding
from orch.runtime.data.demo_data import make_tokenizer
from orch.runtime.models.registry import model_spec_from_dir
from orch.runtime.plans import hand_plan
from orch.runtime.train.config import TrainConfig
from orch.runtime.train.single_process import run_reference

SEED, LR = 4, 0.1
ALL = [0, 1, 2, 3]
PLANS = {
    "homogeneous_dp4": ({"llm": (Layout(dp=4), ALL)}, Sharding.KEEP),
    "homogeneous_dp4_reshard": ({"llm": (Layout(dp=4), ALL)}, Sharding.RESHARD),
    "vision_dp4_llm_tp2_dp2": ({"llm": (Layout(tp=2, dp=2), ALL), "vision": (Layout(dp=4), ALL)}, Sharding.KEEP),
    "vision_dp4_llm_cp2_dp2": ({"llm": (Layout(cp=2, dp=2), ALL), "vision": (Layout(dp=4), ALL)}, Sharding.KEEP),
    "disaggregated_vision_dp2_llm_dp2": (
        {"llm": (Layout(dp=2), [2, 3]), "vision": (Layout(dp=2), [0, 1])},
        Sharding.KEEP,
    ),
}
QWEN_BY_SAMPLE = ("homogeneous_dp4", "vision_dp4_llm_tp2_dp2")  # `sample` beside `item` (the rest: item only)
LLAVA_PLANS = ("homogeneous_dp4", "disaggregated_vision_dp2_llm_dp2")


def qwen_data(root):
    for i, (w, h) in enumerate([(56, 56), (84, 56), (56, 112)]):
        write_image(root / f"i{i}.png", w, h, seed=i)
    write_video(root / "v.mp4", frames=40, width=112, height=112, rate=4)
    records = [
        turn("what happens <video>", "it moves", videos=["v.mp4"]),
        turn("<image>what is it", "a red circle", images=["i0.png"]),
        turn("compare <image> with <image>", "the second", images=["i1.png", "i2.png"]),
        turn("just text here", "fine"),
        turn("<image>", "small", images=["i2.png"]),
        turn("no image", "right"),
        turn("and this <image>", "here", images=["i1.png"]),
        turn("more text", "yes"),
    ]
    return write_conversations(root / "data.jsonl", records)


def llava_data(root):
    for i in range(5):
        write_image(root / f"i{i}.png", 40 + 8 * i, 32 + 4 * i, seed=10 + i)
    five = [f"i{i}.png" for i in range(5)]
    records = [
        turn("<image><image><image><image><image> five", "many", images=five),
        turn("<image>one", "a", images=["i0.png"]),
        turn("text only", "b"),
        turn("<image> and <image>", "two", images=["i1.png", "i2.png"]),
        turn("more", "c"),
        turn("<image>", "d", images=["i3.png"]),
        turn("words", "e"),
        turn("last <image>", "f", images=["i4.png"]),
    ]
    return write_conversations(root / "data.jsonl", records)


def _plans(model, data, names):
    return {
        n: hand_plan(model, data, PLANS[n][0], data_parallel=DataParallel.FSDP, sharding=PLANS[n][1]) for n in names
    }


@pytest.fixture(scope="module")
def launched(tmp_path_factory):
    root = tmp_path_factory.mktemp("item-balance")
    qdir = make_qwen_vl(root / "qwen", "qwen2_5_vl", seed=1)
    qmodel = model_spec_from_dir(qdir)
    qdata, _ = conversation_data(qmodel, str(qwen_data(root / "qdata")), 8, None, None)
    ldir = make_llava(root / "llava", "clip", "llama")
    save_processor(ldir, make_tokenizer(root / "tok" / "tokenizer.json"))
    lmodel = model_spec_from_dir(ldir)
    ldata, _ = conversation_data(lmodel, str(llava_data(root / "ldata")), 8, None, None)
    plans, data, cfgs = {}, {}, {}
    for balance in ("item", "sample"):
        cfg = TrainConfig(
            optimizer="sgd", lr=LR, steps=1, seed=SEED, dtype="float64", calibrate=False, encoder_balance=balance
        )
        for name, plan in _plans(qmodel, qdata, PLANS if balance == "item" else QWEN_BY_SAMPLE).items():
            plans[f"qwen/{name}/{balance}"], data[f"qwen/{name}/{balance}"] = plan, qdata
            cfgs[f"qwen/{name}/{balance}"] = cfg
        for name, plan in _plans(lmodel, ldata, LLAVA_PLANS if balance == "item" else LLAVA_PLANS[:1]).items():
            plans[f"llava/{name}/{balance}"], data[f"llava/{name}/{balance}"] = plan, ldata
            cfgs[f"llava/{name}/{balance}"] = cfg
    out = root / "runs"
    records = train_tasks(plans, data, cfgs, out)
    refs = {
        family: run_reference(model, d, seed=SEED, steps=1, dtype=torch.float64, optimizer="sgd", lr=LR)
        for family, model, d in (("qwen", qmodel, qdata), ("llava", lmodel, ldata))
    }
    return records, out, refs


@pytest.mark.slow
def test_item_and_sample_balance_give_the_reference(launched):
    records, out, refs = launched
    for name, recs in records.items():
        ref = refs[name.split("/")[0]]
        assert [r.loss for r in recs] == pytest.approx(ref.losses, rel=1e-9), name
        got = merged(out / name, "grads")
        assert set(got) == set(ref.grads), name
        bad = {k: e for k, e in gradient_errors(got, ref.grads).items() if e[0] > 1e-9 * e[1]}
        assert not bad, f"{name}: {bad}"
        assert recs[0].balance["encoder_balance"] == name.rsplit("/", 1)[1]


@pytest.mark.slow
def test_by_item_the_long_video_and_the_five_images_run_on_several_ranks(launched):
    records, _, _ = launched
    for name, recs in records.items():
        vision = recs[0].balance["vision"]
        samples = 8
        if name.endswith("/sample"):
            assert vision["pieces"] == samples, name
        elif name.startswith("qwen/") or "dp4" in name:
            # the video is several ranks' mean work; LLaVA's five images are more than one of 4 ranks' mean
            # (at DP 2 they are one rank's mean: whole samples reach the bound, and nothing is cut)
            assert vision["pieces"] > samples, name  # some sample's items ran on more than one rank
            assert vision["max_cost"] < vision["max_cost_before"], name
    # by item the vision phase's slowest rank is lower than whole samples allow
    for family, plan in (("qwen", "homogeneous_dp4"), ("llava", "homogeneous_dp4")):
        item = records[f"{family}/{plan}/item"][0].balance["vision"]
        sample = records[f"{family}/{plan}/sample"][0].balance["vision"]
        assert item["max_cost"] < sample["max_cost"], family
