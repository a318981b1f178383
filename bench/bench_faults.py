"""The faults a run directory meets, each provoked for real through `orch launch` (tiny preset, 2 local ranks,
float64, AdamW): what orch should do, and what it did.

    python bench/bench_faults.py [--keep DIR]

A reference run trains 6 steps uninterrupted; a base run trains 4 steps saving every 2 (step_2, step_4). Each
resume case copies the base run, breaks it, relaunches for 6 steps and compares every loss of metrics.jsonl
with the reference's (1e-12 relative: a resume must recompute nothing differently). The full disk is a 8 MB
tmpfs (needs root; said `not run` otherwise). Prints a table and writes bench/out/faults.json; exit 1 if a
case did not behave.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import pickle
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

ORCH = str(Path(sys.executable).with_name("orch"))
RTOL = 1e-12


@dataclass
class Case:
    name: str
    expected: str
    observed: str = ""
    ok: bool = False
    seconds: float = 0.0


class Payload:
    """A pickle that, loaded, writes a marker file: what a crafted checkpoint or task file would run."""

    def __init__(self, marker: str) -> None:
        self.marker = marker

    def __reduce__(self) -> tuple:
        return (exec, (f"open({self.marker!r}, 'w').write('ran')",))


def plans(out: Path) -> dict[str, Path]:
    from orch.planner.loading import load_data
    from orch.planner.plan import Layout
    from orch.runtime.models.registry import load_model
    from orch.runtime.plans import hand_plan

    model = load_model("tiny")
    data = load_data("tiny-mix").model_copy(update={"global_batch": 4, "seq_len": 64})
    small = dict(model.modules)
    small["llm"] = small["llm"].model_copy(update={"layers": 2})
    files = {}
    for name, llm, m in (
        ("dp", Layout(dp=2), model),
        ("tp", Layout(tp=2), model),
        ("llm2", Layout(dp=2), model.model_copy(update={"modules": small})),
    ):
        plan = hand_plan(m, data, {"llm": (llm, [0, 1]), "vision": (Layout(dp=2), [0, 1])})
        files[name] = out / f"plan-{name}.json"
        files[name].write_text(plan.model_dump_json())
    return files


class Runs:
    def __init__(self, out: Path) -> None:
        self.out = out
        self.plans = plans(out)
        self.config = out / "every2.yaml"
        self.config.write_text("checkpoint_every: 2\nlr: 0.01\nbalance: none\n")
        self.plain = out / "plain.yaml"
        self.plain.write_text("lr: 0.01\nbalance: none\n")

    def args(self, workdir: Path, steps: int, plan: str = "dp", every2: bool = False, *extra: str) -> list[str]:
        cfg = self.config if every2 else self.plain
        return [ORCH, "launch", str(self.plans[plan]), "--workdir", str(workdir), "--steps", str(steps),
                "--dtype", "float64", "--seed", "7", "--config", str(cfg), *extra]  # fmt: skip

    def launch(self, workdir: Path, steps: int, plan: str = "dp", every2: bool = False, *extra: str) -> tuple[int, str]:
        done = subprocess.run(self.args(workdir, steps, plan, every2, *extra), capture_output=True, text=True)
        return done.returncode, done.stdout + done.stderr

    def start(self, workdir: Path, steps: int, *extra: str) -> subprocess.Popen[str]:
        return subprocess.Popen(
            self.args(workdir, steps, "dp", False, *extra),
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            text=True,
            start_new_session=True,  # its ranks in its process group: killed with it
        )


def losses(workdir: Path) -> list[tuple[int, float, float]]:
    """(step, loss, setup_s) per metrics line."""
    out = []
    for line in (workdir / "metrics.jsonl").read_text().splitlines():
        r = json.loads(line)
        out.append((r["step"], r["loss"], r.get("setup_s", 0.0)))
    return out


def max_rel(got: list[tuple[int, float, float]], want: list[tuple[int, float, float]]) -> float:
    if [g[0] for g in got] != [w[0] for w in want]:
        return float("inf")
    return max(abs(g[1] - w[1]) / abs(w[1]) for g, w in zip(got, want, strict=True))


def orch_lines(text: str) -> list[str]:
    return [ln for ln in text.splitlines() if ln.startswith(("orch:", "error:"))]


def flip(path: Path, n: int = 4096) -> None:
    with open(path, "r+b") as f:
        f.seek(64)
        data = f.read(n)
        f.seek(64)
        f.write(bytes(b ^ 0xFF for b in data))


def wait_for(cond: Callable[[], bool], timeout_s: float = 120.0) -> None:
    t0 = time.monotonic()
    while not cond():
        if time.monotonic() - t0 > timeout_s:
            raise TimeoutError
        time.sleep(0.1)


def kill(proc: subprocess.Popen[str]) -> None:
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()


def resume_case(runs: Runs, base: Path, ref: list, name: str, expected: str, want_from: int,
                break_it: Callable[[Path], None], said: str, plan: str = "dp", tol: float = RTOL) -> Case:  # fmt: skip
    """Copy the base run, break it, relaunch for 6 steps: resumed from `want_from`, `said` in the output, every
    loss equal to the reference's."""
    case = Case(name, expected)
    work = runs.out / name.replace(" ", "-")
    shutil.copytree(base, work)
    break_it(work)
    rc, text = runs.launch(work, 6, plan)
    got = losses(work)
    restarted = [s for s, _, setup in got if setup > 0]
    rel = max_rel(got, ref)
    lines = orch_lines(text)
    case.observed = f"rc {rc}; " + " | ".join(lines) + f"; resumed at step {restarted}; max rel diff {rel:.1e}"
    case.ok = rc == 0 and restarted == [0, want_from] and rel <= tol and sum(said in ln for ln in lines) == 1
    return case


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--keep", default=None, help="write the runs here (default: a temporary directory)")
    args = parser.parse_args()
    out = Path(args.keep or tempfile.mkdtemp(prefix="orch-faults-"))
    out.mkdir(parents=True, exist_ok=True)
    runs = Runs(out)
    cases: list[Case] = []

    def timed(fn: Callable[[], Case]) -> None:
        t0 = time.perf_counter()
        case = fn()
        case.seconds = time.perf_counter() - t0
        cases.append(case)
        print(f"{'ok ' if case.ok else 'BAD'} {case.name}: {case.observed}", flush=True)

    ref_dir, tp_dir, base = out / "reference", out / "reference-tp", out / "base"
    assert runs.launch(ref_dir, 6)[0] == 0 and runs.launch(tp_dir, 6, "tp")[0] == 0
    assert runs.launch(base, 4, "dp", True)[0] == 0
    ref, ref_tp = losses(ref_dir), losses(tp_dir)

    def final_checkpoint() -> Case:
        case = Case(
            "final checkpoint", "a run without checkpoint_every ends with step_00000006 (what orch export reads)"
        )
        saved = sorted(p.name for p in (ref_dir / "checkpoints").glob("step_*"))
        case.observed = f"checkpoints: {saved}"
        case.ok = saved == ["step_00000006"]
        return case

    timed(final_checkpoint)
    ckpt = "checkpoints"
    timed(lambda: resume_case(
        runs, base, ref, "latest garbage", "scan the step folders, resume from step_4", 4,
        lambda w: (w / ckpt / "latest").write_bytes(os.urandom(24)), "is not a step folder's name"))  # fmt: skip
    timed(lambda: resume_case(
        runs, base, ref, "latest names a deleted folder", "scan, resume from step_2", 2,
        lambda w: shutil.rmtree(w / ckpt / "step_00000004"), "names step_00000004, which is missing"))  # fmt: skip
    timed(lambda: resume_case(
        runs, base, ref, "4 KB flipped in a shard", "step_4 skipped (checksum), resume from step_2", 2,
        lambda w: flip(w / ckpt / "step_00000004" / "__1_0.distcp"),
        "skipping step_00000004: shard __1_0.distcp: checksum mismatch"))  # fmt: skip
    timed(lambda: resume_case(
        runs, base, ref, "truncated shard", "step_4 skipped (size), resume from step_2", 2,
        lambda w: os.truncate(w / ckpt / "step_00000004" / "__0_0.distcp", 1000),
        "skipping step_00000004: shard __0_0.distcp: 1000 bytes"))  # fmt: skip
    timed(lambda: resume_case(
        runs, base, ref, "deleted shard", "step_4 skipped (missing), resume from step_2", 2,
        lambda w: (w / ckpt / "step_00000004" / "__1_0.distcp").unlink(),
        "skipping step_00000004: shard __1_0.distcp: missing"))  # fmt: skip
    timed(lambda: resume_case(
        runs, base, ref, "bad .metadata", "step_4 skipped (.metadata), resume from step_2", 2,
        lambda w: flip(w / ckpt / "step_00000004" / ".metadata", 256),
        "skipping step_00000004: metadata .metadata: "))  # fmt: skip

    def torn(w: Path) -> None:
        with open(w / "metrics.jsonl", "a") as f:
            f.write('{"version": 1, "step": 4, "lo')

    timed(lambda: resume_case(
        runs, base, ref, "torn metrics line", "dropped with one line, resume from step_4", 4, torn,
        "line 5 is torn"))  # fmt: skip
    timed(lambda: resume_case(
        runs, base, ref_tp, "new layout (DP -> TP)", "same model: resume step_4 re-sharded onto TP", 4,
        lambda w: None, "the same model on a new layout", plan="tp"))  # fmt: skip

    def other_model() -> Case:
        case = Case("another model into the workdir", "refused in one line naming what differs; plan.json kept")
        work = out / "other-model"
        shutil.copytree(base, work)
        before = (work / "plan.json").read_bytes()
        rc, text = runs.launch(work, 6, "llm2")
        lines = orch_lines(text)
        case.observed = f"rc {rc}; " + " | ".join(lines)
        case.ok = (
            rc != 0
            and lines == [ln for ln in lines if ln.startswith("error:")]
            and len(lines) == 1
            and "modules.llm.layers: 4 then, 2 now" in lines[0]
            and (work / "plan.json").read_bytes() == before
            and "Traceback" not in text
        )
        return case

    timed(other_model)

    def two_launches() -> Case:
        case = Case("two launches, one workdir", "the second refused naming the holder; a killed holder's lock "
                    "taken over")  # fmt: skip
        work = out / "two-launches"
        first = runs.start(work, 400)
        try:
            wait_for(lambda: (work / "metrics.jsonl").exists())
            rc, text = runs.launch(work, 2)
        finally:
            kill(first)
        rc2, text2 = runs.launch(work, 2)
        lines, lines2 = orch_lines(text), orch_lines(text2)
        rel = max_rel(losses(work), ref[:2])  # killed before any checkpoint: the relaunch starts at step 0
        case.observed = (
            f"second: rc {rc}; {' | '.join(lines)}; after kill -9: rc {rc2}; {' | '.join(lines2)}; "
            f"max rel diff {rel:.1e}"
        )
        case.ok = (
            rc != 0
            and len(lines) == 1
            and f"in use by pid {first.pid} on" in lines[0]
            and rc2 == 0
            and any(f"stale lock of pid {first.pid}" in ln for ln in lines2)
            and rel <= RTOL
        )
        return case

    timed(two_launches)

    def no_resume_crash() -> Case:
        case = Case("--no-resume, crash before its first checkpoint", "old run moved aside (named); a plain relaunch "
                    "starts at step 0, not at the old step_4")  # fmt: skip
        work = out / "no-resume"
        shutil.copytree(base, work)
        proc = runs.start(work, 400, "--no-resume")
        try:
            # the old run moved aside by the new launch, then the new run's first step recorded
            wait_for(lambda: any(work.glob("previous-*")) and (work / "metrics.jsonl").exists())
        finally:
            kill(proc)
        moved = sorted(p.name for p in work.glob("previous-*"))
        rc, text = runs.launch(work, 2)
        got = losses(work)
        rel = max_rel(got, ref[:2])
        case.observed = (
            f"moved to {moved}; relaunch rc {rc}: {' | '.join(orch_lines(text))}; steps {[s for s, _, _ in got]}, "
            f"max rel diff {rel:.1e}"
        )
        case.ok = (
            len(moved) == 1
            and (work / moved[0] / "checkpoints" / "step_00000004").is_dir()
            and rc == 0
            and [s for s, _, setup in got if setup > 0] == [0]
            and rel <= RTOL
        )
        return case

    timed(no_resume_crash)

    def full_disk() -> Case:
        case = Case("full disk during a checkpoint", "one line naming the path and the bytes needed, rc != 0; the "
                    "relaunch while still full: the same line, no traceback")  # fmt: skip
        mount = out / "tmpfs"
        mount.mkdir()
        done = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=8m", "tmpfs", str(mount)], capture_output=True)
        if done.returncode != 0:
            case.observed = f"not run: cannot mount a tmpfs ({done.stderr.decode().strip()})"
            return case
        try:
            work = mount / "run"
            every1 = out / "every1.yaml"
            every1.write_text("checkpoint_every: 1\nlr: 0.01\nbalance: none\n")
            cmd = [*runs.args(work, 4)[:-2], "--config", str(every1)]
            first = subprocess.run(cmd, capture_output=True, text=True)
            again = subprocess.run(cmd, capture_output=True, text=True)
        finally:
            subprocess.run(["umount", str(mount)], check=False)
        a, b = orch_lines(first.stdout + first.stderr), orch_lines(again.stdout + again.stderr)
        case.observed = f"rc {first.returncode}: {' | '.join(a)}; relaunch rc {again.returncode}: {' | '.join(b)}"
        said = [
            re.search(r"\S+/checkpoints: no space left on device: a checkpoint needs about .*? bytes\)", ln)
            for ln in a + b
        ]
        case.ok = (
            first.returncode != 0
            and again.returncode != 0
            and len(a) == len(b) == 1
            and all(said)
            and said[0].group(0) == said[1].group(0)  # type: ignore[union-attr]
            and "Traceback" not in again.stdout + again.stderr
        )
        return case

    timed(full_disk)

    marker = out / "marker-ran"

    def craft_metadata(w: Path, manifest: str) -> None:
        """The newest checkpoint's .metadata replaced by a pickle that runs code; its manifest recomputed (an
        unkeyed sha256 anyone can redo) or deleted."""
        folder = w / ckpt / "step_00000004"
        (folder / ".metadata").write_bytes(pickle.dumps(Payload(str(marker))))
        if manifest == "deleted":
            (folder / "manifest.json").unlink()
            return
        record = json.loads((folder / "manifest.json").read_text())
        data = (folder / ".metadata").read_bytes()
        record["files"][".metadata"] = {"bytes": len(data), "sha256": hashlib.sha256(data).hexdigest()}
        (folder / "manifest.json").write_text(json.dumps(record))

    for manifest in ("recomputed", "deleted"):

        def crafted(manifest: str = manifest) -> Case:
            case = resume_case(
                runs, base, ref, f"crafted .metadata, manifest {manifest}", "runs nothing; step_4 passed over, "
                "resume from step_2", 2, lambda w: craft_metadata(w, manifest), "step_00000004")  # fmt: skip
            ran = marker.exists()
            marker.unlink(missing_ok=True)
            case.observed += f"; code ran: {ran}"
            case.ok = case.ok and not ran
            return case

        timed(crafted)

    def unverified_flipped() -> Case:
        def break_it(w: Path) -> None:
            (w / ckpt / "step_00000004" / "manifest.json").unlink()
            flip(w / ckpt / "step_00000004" / "__0_0.distcp", 1)

        return resume_case(runs, base, ref, "no manifest, a byte flipped", "an older verified checkpoint preferred: "
                           "resume from step_2, said", 2, break_it, "passing over step_00000004")  # fmt: skip

    timed(unverified_flipped)

    def lock_link() -> Case:
        case = Case("run.lock a link out of the workdir", "refused in one line; the link's target untouched")
        work, target = out / "lock-link", out / "lock-target"
        work.mkdir(mode=0o700)
        target.write_text("keep me")
        (work / "run.lock").symlink_to(target)
        rc, text = runs.launch(work, 2)
        lines = orch_lines(text)
        case.observed = f"rc {rc}; " + " | ".join(lines) + f"; target reads {target.read_text()!r}"
        case.ok = rc != 0 and len(lines) == 1 and "symbolic link" in lines[0] and target.read_text() == "keep me"
        return case

    timed(lock_link)

    def umask_002() -> Case:
        case = Case("a new workdir under umask 002", "created 0700: no one else can plant a checkpoint")
        work = out / "umask"
        done = subprocess.run(["sh", "-c", 'umask 002 && exec "$@"', "sh", *runs.args(work, 1)], capture_output=True)
        mode = oct(work.stat().st_mode & 0o777) if work.exists() else "missing"
        case.observed = f"rc {done.returncode}; mode {mode}"
        case.ok = done.returncode == 0 and mode == "0o700"
        return case

    timed(umask_002)

    def read_only() -> Case:
        case = Case("a read-only workdir", "one line naming it, rc != 0, no traceback")
        work = out / "read-only"
        work.mkdir(mode=0o700)
        mounted = subprocess.run(["mount", "--bind", str(work), str(work)], capture_output=True).returncode == 0
        if mounted:
            subprocess.run(["mount", "-o", "remount,ro,bind", str(work)], check=True)
        else:
            work.chmod(0o500)
        try:
            rc, text = runs.launch(work, 2)
        finally:
            if mounted:
                subprocess.run(["umount", str(work)], check=False)
            work.chmod(0o700)
        lines = orch_lines(text)
        case.observed = f"rc {rc}; " + " | ".join(lines)
        case.ok = rc != 0 and len(lines) == 1 and "not writable" in lines[0] and "Traceback" not in text
        return case

    timed(read_only)

    def diverging(optimizer: str, lr: str) -> Case:
        case = Case(f"diverging run ({optimizer}, lr {lr}, fp32)", "stops at the step in one line naming it, its "
                    "record written, the last good checkpoint kept latest; rc != 0")  # fmt: skip
        work = out / f"diverge-{optimizer}"
        cfg = out / f"{optimizer}-every1.yaml"
        cfg.write_text(f"optimizer: {optimizer}\ncheckpoint_every: 1\nbalance: none\n")
        cmd = [*runs.args(work, 6)[:-2], "--config", str(cfg)]
        cmd[cmd.index("float64")] = "float32"
        done = subprocess.run([*cmd, "--lr", lr], capture_output=True, text=True)
        lines = orch_lines(done.stdout + done.stderr)
        records = (work / "metrics.jsonl").read_text().splitlines() if (work / "metrics.jsonl").exists() else []
        latest = (work / ckpt / "latest").read_text().strip() if (work / ckpt / "latest").exists() else None
        case.observed = f"rc {done.returncode}; " + " | ".join(lines) + f"; {len(records)} records; latest {latest}"
        step = len(records)
        case.ok = (
            done.returncode != 0
            and len(lines) == 1
            and f"step {step}/6" in lines[0]
            and "the run diverged" in lines[0]
            and "pydantic" not in done.stdout + done.stderr
            and latest == f"step_{step - 1:08d}"
        )
        return case

    timed(lambda: diverging("sgd", "1e4"))
    timed(lambda: diverging("adamw", "1e30"))

    def bad_settings() -> Case:
        case = Case("non-finite settings", "--lr inf, min_lr .inf, module_lr nan: each refused in one line before "
                    "anything runs")  # fmt: skip
        results = []
        for name, extra, text in (
            ("--lr inf", ("--lr", "inf"), None),
            ("min_lr .inf", (), "min_lr: .inf\n"),
            ("module_lr nan", (), "module_lr: {vision: .nan}\n"),
        ):
            cmd = runs.args(out / "bad-settings", 2)
            if text is not None:
                cfg = out / f"bad-{len(results)}.yaml"
                cfg.write_text(text)
                cmd[cmd.index(str(runs.plain))] = str(cfg)
            done = subprocess.run([*cmd, *extra, "--dry-run"], capture_output=True, text=True)
            lines = orch_lines(done.stdout + done.stderr)
            results.append((name, done.returncode, lines))
        case.observed = "; ".join(f"{n}: rc {rc} {' | '.join(ln)}" for n, rc, ln in results)
        case.ok = all(rc != 0 and len(ln) == 1 and "finite" in ln[0] for _, rc, ln in results)
        return case

    timed(bad_settings)

    def settings_changed() -> Case:
        case = Case("settings changed on resume", "each changed setting said by name, old -> new")
        work = out / "settings-changed"
        shutil.copytree(base, work)
        cmd = runs.args(work, 6)
        cmd[cmd.index("float64")] = "float32"
        cmd[cmd.index("--seed") + 1] = "4"
        done = subprocess.run([*cmd, "--lr", "0.02"], capture_output=True, text=True)
        said = [ln for ln in orch_lines(done.stdout + done.stderr) if "changed since" in ln]
        case.observed = f"rc {done.returncode}; " + " | ".join(said)
        want = ("seed changed since step_00000004: 7 -> 4", "dtype changed since step_00000004: float64 -> float32",
                "lr changed since step_00000004: 0.01 -> 0.02")  # fmt: skip
        case.ok = done.returncode == 0 and all(any(w in ln for ln in said) for w in want)
        return case

    timed(settings_changed)

    def huge_yaml() -> Case:
        case = Case("a 50 MB YAML line", "refused in one line naming the file and the limit, before parsing (< 5 s)")
        big = out / "big.yaml"
        big.write_text("name: " + "a" * 50_000_000 + "\n")
        t0 = time.perf_counter()
        done = subprocess.run([*runs.args(out / "huge", 2)[:-2], "--config", str(big), "--dry-run"],
                              capture_output=True, text=True)  # fmt: skip
        took = time.perf_counter() - t0
        big.unlink()
        lines = orch_lines(done.stdout + done.stderr)
        case.observed = f"rc {done.returncode} in {took:.1f} s; " + " | ".join(lines)
        case.ok = done.returncode != 0 and len(lines) == 1 and "big.yaml" in lines[0] and took < 5
        return case

    timed(huge_yaml)

    def group_signal(sig: signal.Signals, during_save: bool) -> Case:
        when = "during a save" if during_save else "mid-run"
        case = Case(f"{sig.name} to the whole process group {when}", "stops at one step with a checkpoint, rc 0, "
                    "said once; the relaunch's losses equal the reference's")  # fmt: skip
        work = out / f"group-{sig.name}-{'save' if during_save else 'run'}-{len(cases)}"
        proc = subprocess.Popen([*runs.args(work, 400)[:-2], "--config", str(every1)], stdout=subprocess.PIPE,
                                stderr=subprocess.STDOUT, text=True, start_new_session=True)  # fmt: skip

        def saving() -> bool:
            for beat in (work / ".heartbeat").glob("rank*.json"):
                try:
                    if json.loads(beat.read_text()).get("phase") == "checkpoint":
                        return True
                except (OSError, ValueError):
                    pass
            return False

        def two_steps() -> bool:
            path = work / "metrics.jsonl"
            return path.exists() and len(path.read_text().splitlines()) >= 2

        try:
            wait_for(lambda: two_steps() and (saving() if during_save else True), 180)
            os.killpg(proc.pid, sig)
            text = proc.communicate(timeout=120)[0]
        except (TimeoutError, subprocess.TimeoutExpired):
            kill(proc)
            case.observed = "hung (no stop within the time allowed)"
            return case
        stopped = [ln for ln in text.splitlines() if "stopped at step" in ln]
        steps = len(losses(work))
        rc2, _ = runs.launch(work, steps + 2)
        rel = max_rel(losses(work), long_ref[: steps + 2])
        case.observed = f"rc {proc.returncode}; {' | '.join(stopped)}; relaunch rc {rc2}; max rel diff {rel:.1e}"
        case.ok = proc.returncode == 0 and len(stopped) == 1 and rc2 == 0 and rel <= RTOL
        return case

    every1 = out / "every1.yaml"
    every1.write_text("checkpoint_every: 1\nlr: 0.01\nbalance: none\n")
    assert runs.launch(out / "reference-long", 12)[0] == 0
    long_ref = losses(out / "reference-long")
    timed(lambda: group_signal(signal.SIGTERM, False))
    timed(lambda: group_signal(signal.SIGINT, False))
    for k in range(3):
        timed(lambda k=k: group_signal(signal.SIGINT if k % 2 == 0 else signal.SIGTERM, True))

    def data_edited() -> Case:
        case = Case("a data file edited after orch plan", "the launch refused before any rank, one line naming the "
                    "file and what changed")  # fmt: skip
        from orch.cli.data_cmd import conversation_data
        from orch.planner.loading import load_model
        from orch.planner.plan import Layout
        from orch.runtime.data.demo_data import make_dataset, make_tokenizer
        from orch.runtime.plans import hand_plan

        root = out / "edited"
        data = make_dataset(root / "users", images=3, tones=1)
        tok = make_tokenizer(root / "tok" / "tokenizer.json")
        model = load_model("tiny")
        spec, _ = conversation_data(model, str(data), 4, None, str(tok))
        plan = hand_plan(model, spec, {"llm": (Layout(dp=2), [0, 1]), "vision": (Layout(dp=2), [0, 1])})
        path = root / "plan.json"
        path.write_text(plan.model_dump_json())
        with data.open("a") as f:
            f.write(data.read_text().splitlines()[0] + "\n")
        done = subprocess.run([ORCH, "launch", str(path), "--workdir", str(root / "run"), "--steps", "2"],
                              capture_output=True, text=True)  # fmt: skip
        lines = orch_lines(done.stdout + done.stderr)
        case.observed = f"rc {done.returncode}; " + " | ".join(lines)
        case.ok = (
            done.returncode != 0
            and len(lines) == 1
            and "changed since it was indexed" in lines[0]
            and not (root / "run" / "metrics.jsonl").exists()
        )
        return case

    timed(data_edited)

    width = max(len(c.name) for c in cases)
    print()
    print(f"{'case':<{width}}  ok   seconds  expected")
    for c in cases:
        print(f"{c.name:<{width}}  {'yes' if c.ok else 'NO ':<3}  {c.seconds:7.1f}  {c.expected}")
    target = Path(__file__).parent / "out" / "faults.json"
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_text(json.dumps([c.__dict__ for c in cases], indent=1) + "\n")
    print(f"\nwritten to {target}; runs in {out}")
    if not args.keep:
        shutil.rmtree(out, ignore_errors=True)
    sys.exit(0 if all(c.ok for c in cases) else 1)


if __name__ == "__main__":
    main()
