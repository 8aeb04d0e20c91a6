"""The ``memkit`` command line: flags generated from the config dataclasses, and every command
line the docs and notebooks show parses with the real parser."""

from __future__ import annotations

import dataclasses
import json
import re
import shlex
import typing
from pathlib import Path

import pytest

from memkit.cli import build_parser
from memkit.cli.args import config_from_args, field_docs
from memkit.cli.train import train_config
from memkit.core.fields import flat_names
from memkit.rl.config import TrainConfig
from memkit.train.sft import SFTConfig

REPO = Path(__file__).resolve().parents[2]
NEEDS_METHOD = ("sft", "train", "rollout")


def _parse(argv):
    return build_parser().parse_args(argv)


def _leaves(cls, prefix=""):
    """``(dest, field, type)`` of every flag-backed field, nested dataclasses flattened."""
    hints = typing.get_type_hints(cls)
    for f in dataclasses.fields(cls):
        tp = hints[f.name]
        inner = [a for a in typing.get_args(tp) if a is not type(None)] or [tp]
        if dataclasses.is_dataclass(inner[0]):
            yield from _leaves(inner[0], prefix + f.name + ".")
        else:
            yield prefix + f.name, f, tp


def _other_value(f, tp, default):
    """A command-line string for a value other than ``default``, and that value."""
    if f.metadata.get("choices"):
        value = next(c for c in f.metadata["choices"] if c != default)
        return value, value
    args = [a for a in typing.get_args(tp) if a is not type(None)]
    base = args[0] if args and typing.get_origin(tp) is not tuple else tp
    if default is None and base is not bool:
        base = base if base in (int, float, str) else int
        return "7", base("7")
    if base is bool or (typing.get_origin(tp) is not None and bool in args):
        return None, not default
    if base is int:
        return str(default + 3), default + 3
    if base is float:
        return str(default * 0.5 + 0.25), default * 0.5 + 0.25
    if base is str:
        return "other/dir", "other/dir"
    if typing.get_origin(tp) is tuple:
        return "3,5", (3, 5)
    if tp is dict or typing.get_origin(tp) is dict:
        return '{"reward_metric": "em"}', {"reward_metric": "em"}
    raise AssertionError(f"no test value for {f.name}: {tp}")


@pytest.mark.parametrize("command, cls", [("train", TrainConfig), ("sft", SFTConfig)])
def test_every_config_field_has_a_flag_that_sets_it(command, cls):
    """One definition per knob: each field (nested ones too) has a flag named by its flat name
    (``--field-name``; a group's ``--group-field`` unless the group names it otherwise) with the field's
    docstring as help, and giving it changes exactly that field of the built config."""
    base = [command, "--method", "memsearcher"]
    default = config_from_args(cls, _parse(base))
    expect = cls(method="memsearcher")
    if command == "train":
        expect.out_dir = None  # the command computes runs/<method>-<algo> after parsing
    assert default == expect
    docs = dict(field_docs(cls))
    for f in dataclasses.fields(cls):  # the nested configs' fields (SFT's oracle, the credit rules' knobs)
        if dataclasses.is_dataclass(inner := getattr(cls(), f.name)):
            docs.update({f"{f.name}.{k}": v for k, v in field_docs(type(inner)).items()})
    flat = {path: name for path, name, _ in flat_names(cls)}  # the flag of a grouped knob: --eval-every, --gamma
    for dest, f, tp in _leaves(cls):
        if dest == "method":
            continue
        assert docs.get(dest), f"{cls.__name__}.{dest} has no docstring, so its flag would have no help"
        flag = "--" + flat[dest].replace("_", "-")
        current = default
        for part in dest.split(".")[:-1]:
            current = getattr(current, part)
        text, value = _other_value(f, tp, getattr(current, f.name))
        if text is None:  # a bool: --flag / --no-flag
            argv = [flag if value else "--no-" + flag[2:]]
        else:
            argv = [flag, text]
        built = config_from_args(cls, _parse(base + argv))
        got = built
        for part in dest.split("."):
            got = getattr(got, part)
        assert got == value, (dest, argv, got)


def test_optional_fields_accept_none_and_aliases_keep_working():
    args = _parse(
        [
            "train",
            "--method",
            "mem1",
            "--clip-high",
            "0.28",
            "--vf-clip",
            "none",
            "--n",
            "6",
            "--out",
            "runs/x",
            "--max-minutes",
            "2",
            "--objectives",
            "1,2",
            "--method-kwargs",
            "{}",
        ]
    )
    cfg = train_config(args)
    assert (cfg.clip.high, cfg.critic.vf_clip, cfg.n_samples, cfg.out_dir, cfg.budget.seconds, cfg.objectives) == (
        0.28,
        None,
        6,
        "runs/x",
        120.0,
        (1, 2),
    )
    assert train_config(_parse(["train", "--method", "mem1", "--algo", "ppo"])).out_dir == "runs/mem1-ppo"
    sft = config_from_args(SFTConfig, _parse(["sft", "--method", "mem1", "--max-minutes", "0", "--show-comparison"]))
    assert (
        sft.max_seconds is None
        and sft.oracle.show_comparison
        and sft.oracle.p_drop_fact == SFTConfig().oracle.p_drop_fact
    )
    assert config_from_args(SFTConfig, _parse(["sft", "--method", "mem1"])).max_seconds == SFTConfig.max_seconds


def _documented_commands() -> list[tuple[str, str]]:
    """``(where, command line)`` for every runnable ``memkit ...`` line in README.md, docs/*.md
    (fenced code) and inline in the notebooks and docs (those without placeholders)."""
    found = []
    for path in [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]:
        if not path.exists():
            continue
        text = path.read_text(encoding="utf-8")
        for block in re.findall(r"```[a-z]*\n(.*?)```", text, flags=re.S):
            for line in block.replace("\\\n", " ").splitlines():
                line = line.split("#")[0].strip()
                if line.startswith("memkit "):
                    found.append((path.name, line))
    sources = [
        (p.name, p.read_text(encoding="utf-8"))
        for p in [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
        if p.exists()
    ]
    for path in sorted((REPO / "notebooks").glob("*.ipynb")):
        cells = json.loads(path.read_text(encoding="utf-8"))["cells"]
        sources.append((path.name, "".join("".join(c["source"]) for c in cells)))
    for name, text in sources:
        for span in re.findall(r"`(memkit (?:world|rollout|eval|sft|train|reproduce)\b[^`]*)`", text):
            span = " ".join(span.split())
            words = span.split()
            if "<" in span or any(re.fullmatch(r"[A-Z]", w) for w in words) or "..." in span:
                continue
            if words[1] in NEEDS_METHOD and "--method" not in words:
                continue  # a bare mention of a flag, not a command
            found.append((name, span))
    return found


def test_every_documented_command_line_parses():
    commands = _documented_commands()
    assert any(c.startswith("memkit train") for _, c in commands)
    for where, line in commands:
        try:
            args = _parse(shlex.split(line)[1:])
        except SystemExit:
            pytest.fail(f"{where}: `{line}` does not parse")
        if args.command == "train":
            train_config(args)
        elif args.command == "sft":
            config_from_args(SFTConfig, args)


@pytest.mark.parametrize(
    "argv",
    [
        ["--help"],
        ["world", "--help"],
        ["eval", "--help"],
        ["eval", "--n", "5"],
        ["rollout", "--method", "nope"],
        ["reproduce", "--help"],
        ["results", "--help"],
        ["nope"],
        ["train", "--help"],
        ["train", "--method", "nope"],
        ["train", "--method", "mem1", "--steps", "0"],
        ["train", "--method", "mem1", "--lr", "-1"],
        ["sft", "--help"],
        ["sft", "--method", "mem1", "--decay-fraction", "0"],
        ["sft", "--method", "mem1", "--tag", "a/b"],
        ["pretrain", "--copy-fraction", "2"],
    ],
)
def test_help_and_argument_errors_import_no_torch(argv):
    """``memkit --help`` and every command's argument errors build only their subcommand's flags from
    torch-free configs (memkit.rl.config, memkit.train.config) and check them before anything heavy
    loads: no torch, no transformers (the start-up that made ``memkit --help`` take 6 s). Timed in
    no test: the import set is what decides it. (A bad ``--credit`` loads the rule registry.)"""
    import subprocess
    import sys

    code = (
        "import sys\nfrom memkit.cli import main\ntry:\n    main(%r)\nexcept SystemExit as e:\n    code = e.code\n"
        "print('HEAVY', sorted(m for m in ('torch', 'transformers') if m in sys.modules))" % (argv,)
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert "HEAVY []" in out.stdout, (argv, out.stdout[-500:], out.stderr[-500:])


def test_eval_n_names_the_two_counts(capsys):
    from memkit.cli import main

    with pytest.raises(SystemExit) as e:
        main(["eval", "--n", "5"])
    assert e.value.code == 2
    err = capsys.readouterr().err
    assert "--n-tasks" in err and "--n-conversations" in err and "ambiguous" not in err


def test_eval_takes_the_formats_keyword_arguments(capsys, tmp_path):
    """``memkit eval --method-kwargs``: the format a model was cloned in (here MEM1 answering one question
    at a time); the oracle's traces show one <answer> per question, and a bad value is one clear error."""
    import json

    from memkit.cli import main

    argv = ["eval", "--method", "mem1", "--policy", "oracle", "--objectives", "3", "--n-tasks", "2"]
    assert main([*argv, "--method-kwargs", '{"answers": "each"}', "--out-dir", str(tmp_path)]) == 0
    rows = [line.split() for line in capsys.readouterr().out.splitlines() if line.strip().startswith("mem1")]
    assert [(r[1], r[2], r[3]) for r in rows] == [("3", "2", "1.000")]  # k, n, em
    (trace,) = tmp_path.glob("mem1-*-k3.jsonl")
    for line in trace.read_text().splitlines():
        assert sum("<answer>" in c["output_text"] for c in json.loads(line)["calls"]) == 3
    with pytest.raises(SystemExit):
        main([*argv, "--method-kwargs", "answers=each"])
    assert "JSON" in capsys.readouterr().err


def test_eval_on_real_questions_over_a_real_corpus(capsys):
    """``memkit eval --tasks <questions> --corpus <passages> --answerable``: the real fixtures (DPR topics
    lines, Wikipedia leads) composed into MEM1 tasks; the oracle answers every kept question. Without
    ``--corpus``, ``--answerable`` is one clear error."""
    from memkit.cli import main

    real = REPO / "tests" / "fixtures" / "real"
    argv = ["eval", "--tasks", str(real / "topics.dpr.nq.test.txt"), "--corpus", str(real / "summaries_en-us.json")]
    assert main([*argv, "--answerable", "--method", "mem1", "--objectives", "1,2", "--n-tasks", "3"]) == 0
    rows = [line.split() for line in capsys.readouterr().out.splitlines() if line.strip().startswith("mem1")]
    assert [(r[1], r[2], r[3]) for r in rows] == [("1", "3", "1.000"), ("2", "3", "1.000")]  # k, n, em
    assert main(["eval", "--tasks", str(real / "topics.dpr.nq.test.txt"), "--answerable"]) != 0
    assert "give --corpus too" in capsys.readouterr().err


def test_rollout_keeps_a_memkit_task_file_as_written(tmp_path, capsys):
    """``memkit rollout --tasks world/tasks.jsonl``: `memkit world`'s tasks as written (k = 1 and 2 here),
    not recomposed into new MEM1 tasks as real questions are."""
    from memkit.cli import main
    from memkit.core.trajectory import load_jsonl

    assert main(["world", "--out", str(tmp_path / "w"), "--objectives", "1,2", "--n-tasks", "2"]) == 0
    out = tmp_path / "traces.jsonl"
    argv = ["rollout", "--method", "mem1", "--tasks", str(tmp_path / "w" / "tasks.jsonl"), "--out", str(out)]
    assert main(argv) == 0
    trajs = load_jsonl(out)
    assert sorted(t.task_id for t in trajs) == sorted(
        json.loads(line)["id"] for line in (tmp_path / "w" / "tasks.jsonl").read_text().splitlines()
    )


def test_sft_and_train_on_real_questions_over_a_real_corpus(tmp_path, capsys):
    """``memkit sft`` and ``memkit train`` take ``--tasks --corpus --answerable`` (DataConfig): the oracle's
    data and RL's tasks are composed of the fixture's real questions, searched in its real leads, and
    the evaluations after each are on real composites; the config records the data."""
    import shutil

    from memkit.cli import main

    real = REPO / "tests" / "fixtures" / "real"
    data = ["--tasks", str(real / "topics.dpr.nq.test.txt"), "--corpus", str(real / "summaries_en-us.json")]
    data += ["--answerable"]
    sft = ["sft", "--method", "mem1", *data, "--objectives", "1", "--n-tasks", "4", "--steps", "2"]
    sft += ["--max-minutes", "0", "--eval-tasks", "2", "--eval-objectives", "1", "--tag", f"clitest-{tmp_path.name}"]
    assert main(sft) == 0
    out = capsys.readouterr().out
    path = Path(re.search(r"checkpoint: (\S+)", out).group(1))
    try:
        meta = json.loads((path / "memkit.json").read_text())
        assert "k=1: EM per question" in out
        assert meta["sft"]["data"]["answerable"] is True and meta["sft"]["k_docs"] == 5  # REAL_K_DOCS
        run = tmp_path / "run"
        train = ["train", "--method", "mem1", "--init", str(path), *data, "--objectives", "1", "--steps", "1"]
        train += ["--tasks-per-step", "2", "--n", "2", "--eval-tasks", "2", "--eval-objectives", "1"]
        assert main([*train, "--out", str(run)]) == 0  # a file is a split already: RL draws all of it
        out = capsys.readouterr().out
        assert "eval step 1 k=1:" in out and (run / "metrics.csv").exists()
        cfg = json.loads(next(run.rglob("memkit.json")).read_text())["config"]
        assert cfg["data"]["corpus"].endswith("summaries_en-us.json") and cfg["data"]["answerable"] is True
    finally:
        shutil.rmtree(path, ignore_errors=True)
