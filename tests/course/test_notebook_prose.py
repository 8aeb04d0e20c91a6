"""Guard: a notebook's markdown types no measured figure; measured numbers come from the run's records.

A number typed into prose goes stale the moment a run changes (issue 52: "mean P from ~0.006 to
~0.015" described a 60-step study the notebook does not run). So the prose says the shape in words
("both arms lift EM above the start; MemPO does not beat GRPO beyond the seed spread") and a code
cell prints the numbers from the variables the notebook computed (and records with
``memkit.course.nb.record`` / ``record_all``). This module scans the markdown cells of every
``notebooks/*.ipynb`` (no execution) for measured-figure patterns, outside ``$...$`` / ``$$...$$``
math, ```code``` spans and URLs:

* a decimal: ``0.47``, ``.015``;
* a percentage: ``73.1%``, ``65 %``;
* an approximation: ``~0.6``, ``≈ 0.6``, ``about 0.6`` (also around / roughly / nearly / approximately);
* a range of figures: ``from 0.44 to 0.6``, ``from 300 to 900``.

A hit is allowed only in these contexts (the whole list):

1. **reference**: right after ``§``, ``eq.``, ``Fig.``, ``Tab.``, ``Table``, ``App.``, ``Alg.``,
   ``Section`` or ``line`` (``§3.2``, ``App. B.7``); a number glued to a letter (``Qwen2.5``, ``B.7``)
   is a name, not a figure, and never matches;
2. **setting**: the same line, up to 40 characters before the number, holds ``=`` or one of
   ``lr``, ``temperature``, ``coefficient``, ``coef``, ``rate``, ``weight`` (``T = 0.5``,
   ``lr 3e-4``, ``flaw rate 0.65``): values the notebook *sets*, not measures;
3. **paper**: the word ``paper`` occurs up to 80 characters before the number in the same paragraph
   (``paper: 1.0``, ``the paper sees a rise in the first ~25 steps``): the paper's own, attributed;
4. **model size**: ``1.2M-parameter``;
5. **duration**: the figure is followed by a time unit (``~2 min``, ``~17 minutes``): the planning
   times of a notebook's **Time** line;
6. **counted range**: ``from 1 to 16 questions`` (objectives, questions, steps, turns, hops, seeds).

Rules 2 and 3 trust the writer not to hide a measurement behind ``=`` or "paper"; they keep the
list short. A measured figure that must appear in prose belongs in a code cell's output.
"""

from __future__ import annotations

import re
from pathlib import Path

import nbformat
import pytest

NOTEBOOKS = sorted((Path(__file__).resolve().parents[2] / "notebooks").glob("*.ipynb"))

# what is not prose: display math first (it may contain single $), inline math, code spans, URLs
_NOT_PROSE = re.compile(r"\$\$.*?\$\$|\$[^$\n]+\$|`[^`\n]*`|https?://\S+", re.S)
_NUM = r"(?:\d+(?:\.\d+)?|\.\d+)"
_APPROX = r"(?:~\s?|≈\s?|\b(?:about|around|roughly|nearly|approximately)\s+)"
_FIGURE = re.compile(
    rf"(?<![\w.§/-])(?:"
    rf"(?P<range>from\s+{_APPROX}?{_NUM}\s+to\s+{_APPROX}?{_NUM})"  # from X to Y
    rf"|(?P<approx>{_APPROX}{_NUM}\s?%?)"  # ~0.6, about 0.6
    rf"|(?P<pct>{_NUM}\s?%)"  # 73.1%
    rf"|(?P<dec>\d*\.\d+)(?![\w.])"  # 0.47, .015
    rf")",
    re.I,
)
_REFERENCE = re.compile(r"(?:§|\b(?:eqs?|Eqs?|Fig|Figs|Tab|Table|App|Alg|Section|line)\.?)\s*$")
_SETTING = re.compile(r"=|\b(?:lr|temperature|coefficient|coef|rate|weight)\b", re.I)
_UNIT_AFTER = re.compile(r"\s*(?:min|minutes?|s\b|sec|seconds?|h\b|hours?)", re.I)
_COUNTED = re.compile(r"\s*(?:objectives?|questions?|steps?|turns?|hops?|seeds?)\b", re.I)


def measured_figures(markdown: str) -> list[str]:
    """The measured-figure patterns in ``markdown`` that no allow rule (module docstring) covers."""
    masked = _NOT_PROSE.sub(lambda m: " " * len(m.group()), markdown)
    hits = []
    for m in _FIGURE.finditer(masked):
        start, end, text = m.start(), m.end(), m.group()
        before, after = markdown[:start], markdown[end:]
        line_before = before[before.rfind("\n") + 1 :][-40:]
        paragraph_before = before[before.rfind("\n\n") + 1 :][-80:]
        if _REFERENCE.search(before[-12:]):  # 1. reference
            continue
        if _SETTING.search(line_before):  # 2. setting
            continue
        if "paper" in paragraph_before.lower():  # 3. the paper's number, attributed
            continue
        if after.startswith("M-parameter"):  # 4. model size
            continue
        if _UNIT_AFTER.match(after):  # 5. duration
            continue
        if m.group("range") and _COUNTED.match(after):  # 6. counted range
            continue
        hits.append(text.strip())
    return hits


def notebook_hits(nb) -> list[tuple[int, str]]:
    """(cell index, figure) for every unallowed figure in the markdown cells of ``nb``."""
    return [
        (i, h) for i, cell in enumerate(nb.cells) if cell.cell_type == "markdown" for h in measured_figures(cell.source)
    ]


@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.stem for p in NOTEBOOKS])
def test_notebook_markdown_types_no_measured_figure(path):
    hits = notebook_hits(nbformat.read(path, as_version=4))
    assert not hits, (
        f"{path.name}: measured figures typed into markdown (cell, figure): {hits}. Print them "
        "from the run's variables or records in a code cell, or say the shape in words."
    )


def test_guard_catches_a_planted_measured_figure():
    nb = nbformat.v4.new_notebook(
        cells=[
            nbformat.v4.new_markdown_cell(
                "## 5. Results\n\n**What you should see**: both arms lift EM "
                "from the start's 0.44 to about 0.6, and MemPO wins 73.1% of the seeds."
            ),
            nbformat.v4.new_code_cell("print(0.44)  # code cells may print any number"),
            nbformat.v4.new_markdown_cell("Measured at 60 steps: 0.47 without pooling, mean P from ~0.006 to ~0.015."),
        ]
    )
    hits = notebook_hits(nb)
    assert {h for _, h in hits} >= {"0.44", "about 0.6", "73.1%", "0.47", "from ~0.006 to ~0.015"}, hits
    assert {i for i, _ in hits} == {0, 2}


def test_guard_passes_settings_references_and_the_papers_numbers():
    nb = nbformat.v4.new_notebook(
        cells=[
            nbformat.v4.new_markdown_cell(
                "**Time** on 2 CPU cores: SMOKE ~2 min; lab mode ~17 minutes.\n"
                "1. A 1.2M-parameter Llama, not Qwen2.5-7B; lr 3e-4, rollouts at T = 0.5, alpha = 0.5, flaw rate 0.65.\n"
                "2. As §3.2 and App. B.7 say (eq. 4, Fig. 3, Tab. 2); the paper reports 67.6% fewer tokens (paper: 1.0).\n"
                "3. Math and code are not prose: $p = 0.47$, $$\\beta = 0.001$$, `kl_coef=0.001`, `0.64`.\n"
                "4. Compare RL with SFT from 1 to 16 questions."
            )
        ]
    )
    assert notebook_hits(nb) == []
