"""`orch balance` and `orch analyze` through the CLI: the JSON contract, bad input, tables."""

import json

import pytest

BATCH = {
    "num_ranks": 4,
    "ranks_per_node": 2,
    "phases": {
        "vision": {"linear": 1.0, "quadratic": 0.000244, "padded": False, "max_tokens": None},
        "audio": {"linear": 1.0, "quadratic": 0.0, "padded": True},
        "llm": {"linear": 1.0, "quadratic": 0.000122, "padded": False},
    },
    "samples": [
        {
            "origin": i % 4 if i < 8 else 0,
            "lengths": {"vision": v, "audio": a, "llm": t},
            "bytes": {"vision": v * 2048, "audio": a * 2560, "llm": t * 2048},
        }
        for i, (v, a, t) in enumerate(
            [
                (576, 0, 700),
                (0, 1500, 900),
                (4096, 0, 2000),
                (0, 0, 300),
                (1152, 800, 1200),
                (0, 3000, 400),
                (576, 0, 500),
                (8192, 0, 2300),
                (0, 0, 800),
                (2304, 1500, 1800),
            ]
        )
    ],
}
PHASE_KEYS = {"dest", "max_cost", "mean_cost", "lower_bound", "inter_node_bytes", "intra_node_bytes", "seconds"}


def _write(tmp_path, data, name="batch.json"):
    path = tmp_path / name
    path.write_text(json.dumps(data))
    return str(path)


@pytest.mark.parametrize("mode", ["orch", "paper", "lpt", "none"])
def test_json_is_exactly_the_contract(cli, tmp_path, mode):
    path = _write(tmp_path, BATCH)
    result = cli("balance", path, "--json", "--mode", mode)
    assert result.exit_code == 0, result.output
    out = json.loads(result.stdout)
    assert set(out) == {"phases", "routes"}
    assert set(out["phases"]) == {"vision", "audio", "llm"}
    n = len(BATCH["samples"])
    for phase in out["phases"].values():
        assert set(phase) == PHASE_KEYS
        assert len(phase["dest"]) == n and all(type(d) is int and 0 <= d < 4 for d in phase["dest"])
        assert all(type(phase[k]) is float for k in ("max_cost", "mean_cost", "lower_bound", "seconds"))
        assert type(phase["inter_node_bytes"]) is int and type(phase["intra_node_bytes"]) is int
        assert phase["max_cost"] >= phase["lower_bound"] * (1 - 1e-9)
    assert set(out["routes"]) == {"vision", "audio"}
    for name, route in out["routes"].items():
        assert route == [[a, b] for a, b in zip(out["phases"][name]["dest"], out["phases"]["llm"]["dest"], strict=True)]
    if mode == "none":
        assert all(p["dest"] == [s["origin"] for s in BATCH["samples"]] for p in out["phases"].values())


def test_orch_balances_better_than_none(cli, tmp_path):
    path = _write(tmp_path, BATCH)
    orch = json.loads(cli("balance", path, "--json").stdout)
    none = json.loads(cli("balance", path, "--json", "--mode", "none").stdout)
    assert orch["phases"]["llm"]["max_cost"] < none["phases"]["llm"]["max_cost"]
    # vision: the 8,192-token sample alone sets the bound and none already meets it: nothing crosses nodes
    assert orch["phases"]["vision"]["max_cost"] == none["phases"]["vision"]["max_cost"]
    assert orch["phases"]["vision"]["inter_node_bytes"] == 0
    # zero-length samples keep their origin
    for i, s in enumerate(BATCH["samples"]):
        if s["lengths"]["vision"] == 0:
            assert orch["phases"]["vision"]["dest"][i] == s["origin"]


def test_table_mode_writes_people_output_to_stderr(cli, tmp_path):
    path = _write(tmp_path, BATCH)
    result = cli("balance", path)
    assert result.exit_code == 0, result.output
    assert result.stdout == ""
    assert "vision" in result.stderr and "none" in result.stderr and "orch" in result.stderr


def _bad(data_change):
    data = json.loads(json.dumps(BATCH))
    data_change(data)
    return data


BAD = {
    "undeclared phase": (lambda d: d["samples"][0]["lengths"].update(depth=5), "samples.0.lengths.depth"),
    "origin out of range": (lambda d: d["samples"][3].update(origin=4), "samples.3.origin"),
    "negative length": (lambda d: d["samples"][2]["lengths"].update(llm=-1), "samples.2.lengths.llm"),
    "ranks not divisible": (lambda d: d.update(num_ranks=5), "num_ranks"),
    "sample over the token cap": (
        lambda d: d["phases"]["vision"].update(max_tokens=4096),
        "samples.7.lengths.vision",
    ),
    "total over the token cap": (lambda d: d["phases"]["llm"].update(max_tokens=2400), "phases.llm.max_tokens"),
    "padded cap too small": (
        lambda d: (
            d["phases"]["audio"].update(max_tokens=3000),
            d["samples"].extend({"origin": 0, "lengths": {"audio": 2900}} for _ in range(4)),
        ),
        "phases.audio.max_tokens",
    ),
}


@pytest.mark.parametrize("case", sorted(BAD))
def test_bad_input_is_one_line_naming_file_and_field(cli, tmp_path, case):
    change, field = BAD[case]
    path = _write(tmp_path, _bad(change))
    result = cli("balance", path, "--json")
    assert result.exit_code == 1, result.output
    assert result.stdout == ""
    lines = [ln for ln in result.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith(f"error: {path}: {field}: "), lines[0]
    assert "Traceback" not in result.output


def test_missing_file_and_bad_mode(cli, tmp_path):
    result = cli("balance", str(tmp_path / "nope.json"))
    assert result.exit_code == 1 and "no such file" in result.stderr
    result = cli("balance", _write(tmp_path, BATCH), "--mode", "fast")
    assert result.exit_code == 1 and "--mode" in result.stderr


def test_schema_batch_is_the_input_model(cli):
    result = cli("schema", "batch")
    assert result.exit_code == 0, result.output
    assert {"num_ranks", "ranks_per_node", "phases", "samples"} <= set(json.loads(result.stdout)["properties"])


def _manifest():
    from importlib import resources

    return str(resources.files("orch.templates") / "manifests" / "omni-sample.jsonl")


def test_analyze_json_reports_waste_and_speedup(cli):
    args = ("analyze", _manifest(), "--dp", "16", "--ranks-per-node", "8", "--micro-batch", "4", "--steps", "2")
    result = cli(*args, "--json")
    assert result.exit_code == 0, result.output
    out = json.loads(result.stdout)
    assert set(out["phases"]) == {"vision", "audio", "llm"}
    for per_mode in out["phases"].values():
        assert set(per_mode) == {"none", "lpt", "paper", "orch"}
        assert per_mode["orch"]["max_cost"] <= per_mode["none"]["max_cost"] + 1e-9
        assert 0.0 <= per_mode["none"]["wasted"] < 1.0
    assert out["speedup"]["none"] == 1.0 and out["speedup"]["orch"] >= 1.0
    again = json.loads(cli(*args, "--json").stdout)  # same seed, same numbers
    assert again["phases"]["llm"]["orch"]["max_cost"] == out["phases"]["llm"]["orch"]["max_cost"]
    table = cli(*args)
    assert table.exit_code == 0, table.output
    assert "speed-up" in table.stderr and table.stdout == ""


def test_analyze_bad_input(cli, tmp_path):
    result = cli("analyze", _manifest(), "--dp", "12", "--ranks-per-node", "8", "--micro-batch", "4")
    assert result.exit_code == 1 and "--dp" in result.stderr
    bad = tmp_path / "m.jsonl"
    bad.write_text('{"llm": 5}\n{"llm": -3}\n')
    result = cli("analyze", str(bad), "--dp", "8", "--micro-batch", "2")
    assert result.exit_code == 1 and "line 2" in result.stderr


def test_samples_listing_items_are_balanced_by_item_or_whole(cli, tmp_path):
    # one video of 8 runs of frame groups on rank 0, two-image samples elsewhere
    samples = [{"origin": 0, "lengths": {"vision": [1024] * 8, "llm": 3000}}]
    samples += [{"origin": r, "lengths": {"vision": [256, 256], "llm": 400}} for r in range(4)]
    data = {"num_ranks": 4, "ranks_per_node": 2, "phases": {"vision": {"quadratic": 1 / 1024}, "llm": {}}}
    path = _write(tmp_path, {**data, "samples": samples})
    by_item = json.loads(cli("balance", path, "--json").stdout)["phases"]["vision"]
    whole = json.loads(cli("balance", path, "--json", "--encoder-balance", "sample").stdout)["phases"]["vision"]
    assert len(by_item["dest"][0]) == 8 and len(set(by_item["dest"][0])) > 1
    assert len(set(whole["dest"][0])) == 1
    assert by_item["max_cost"] < whole["max_cost"] and by_item["lower_bound"] < whole["lower_bound"]
    table = cli("balance", path)
    assert table.exit_code == 0 and "encoders by item" in " ".join(table.output.split())
    bad = cli("balance", path, "--encoder-balance", "frame")
    assert bad.exit_code == 1 and bad.stderr.strip().startswith("error: --encoder-balance")


def test_analyze_balances_a_manifests_listed_items_by_item(cli, tmp_path):
    # the index's rows of a native-resolution tower: one long video (96 frame groups of 8 x 8 patches) among
    # small images; its items (16 runs of 6 groups) let orch spread it where a whole sample cannot be
    video = {"lengths": {"vision": 96 * 64, "llm": 2000}, "items": {"vision": [[96, 8, 8, 1.0]]}}
    image = {"lengths": {"vision": 64, "llm": 100}, "items": {"vision": [[1, 8, 8, 0.0]]}}
    listed = tmp_path / "listed.jsonl"
    listed.write_text("".join(json.dumps(r) + "\n" for r in [video] + [image] * 7))
    bare = tmp_path / "bare.jsonl"
    bare.write_text("".join(json.dumps({"lengths": r["lengths"]}) + "\n" for r in [video] + [image] * 7))
    args = ("--dp", "4", "--ranks-per-node", "4", "--micro-batch", "4", "--steps", "3", "--json")
    by_item = json.loads(cli("analyze", str(listed), *args).stdout)["phases"]["vision"]
    whole = json.loads(cli("analyze", str(bare), *args).stdout)["phases"]["vision"]
    # (by item a sample costs the sum of its items': attention inside each, so less than one long sequence)
    assert by_item["orch"]["wasted"] < 0.01 < 0.1 < whole["orch"]["wasted"]  # a drawn video sets a whole rank
    assert by_item["orch"]["max_cost"] < 0.5 * by_item["none"]["max_cost"]
