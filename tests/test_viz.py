"""memkit.viz: trace HTML/widget and attention-mask figures, on hand-built trajectories."""
from __future__ import annotations

import html as html_lib
import re

import numpy as np
import pytest
import torch

from memkit.rollout.trajectory import Call, Trajectory
from memkit.viz import PALETTE, MaskViewer, TraceViewer, color_for, plot_mask, render_call_html, to_html
from memkit.viz.html import diff_html, part_counts, render_spans


def parts(*pieces):
    """Text and char spans from (kind|None, text) pieces."""
    text, spans, pos = "", {}, 0
    for kind, piece in pieces:
        if kind is not None:
            spans.setdefault(kind, []).append((pos, pos + len(piece)))
        text += piece
        pos += len(piece)
    return text, spans


def make_call(turn, ctx_pieces, out_pieces, role="act", obs=None, token_spans=None, n_ctx=None):
    ctx, cspans = parts(*ctx_pieces)
    out, ospans = parts(*out_pieces)
    return Call(turn=turn, role=role, context_ids=list(range(n_ctx if n_ctx is not None else len(ctx.split()))),
                output_ids=list(range(len(out.split()))), logprobs=[0.0] * len(out.split()),
                context_text=ctx, output_text=out, context_char_spans=cspans, output_char_spans=ospans,
                context_spans=token_spans or {}, observation_text=obs)


@pytest.fixture
def memsearcher_traj():
    q = (("system", "You are a search agent.\n"), ("question", "Q: where was Ada born?\n"))
    c0 = make_call(0, [*q, ("memory", "Memory: (empty)\n")],
                   [("think", "<think>need to search</think>"), ("search", "<search>Ada birthplace</search>")],
                   obs="<information>Ada was born in London.</information>",
                   token_spans={"system": [(0, 5)], "question": [(5, 11)], "memory": [(11, 13)]}, n_ctx=14)
    c1 = make_call(1, [*q, ("memory", "Memory: Ada was born in London.\n"), ("information", "x")],
                   [("answer", "<answer>London <script>alert(1)</script></answer>")])
    return Trajectory(task_id="t1", method="memsearcher", calls=[c0, c1], answer="London",
                      golds=[["London"]], reward=1.0)


@pytest.fixture
def memact_traj():
    calls = []
    for i in range(3):
        recs = [("record", f"[r{j}] fact number {j}\n") for j in range(i + 1)]
        calls.append(make_call(i, [("system", "sys\n"), *recs], [("tool_call", f"<prune>r{i}</prune>")]))
    return Trajectory(task_id="t2", method="memact", calls=calls, info={"pruned": [[], ["r0"], ["r1", 7]]})


def test_call_html_has_each_kind_class_and_colour(memsearcher_traj):
    page = render_call_html(memsearcher_traj, 0) + render_call_html(memsearcher_traj, 1)
    call_kinds = {k for c in memsearcher_traj.calls for k in [*c.context_char_spans, *c.output_char_spans]}
    for kind in call_kinds:
        assert re.search(rf'class="mk-span mk-{kind}"[^>]*style="background:{color_for(kind)}"', page), kind
    assert len({PALETTE[k] for k in ("system", "question", "memory", "search", "answer")}) == 5


def test_text_is_escaped(memsearcher_traj):
    page = render_call_html(memsearcher_traj, 1)
    assert "<script>alert(1)" not in page
    assert html_lib.escape("<script>alert(1)</script>") in page
    static = to_html(memsearcher_traj)
    assert "<script>alert(1)" not in static


def test_render_spans_nested_innermost_wins():
    out = render_spans("abcdef", {"record": [(0, 6)], "information": [(2, 4)]})
    assert re.findall(r"mk-(\w+)\"[^>]*>([^<]*)<", out) == [("record", "ab"), ("information", "cd"), ("record", "ef")]


def test_memory_diff_marks_inserted_fact(memsearcher_traj):
    page = render_call_html(memsearcher_traj, 1)
    ins = re.findall(r'<ins class="mk-ins">(.*?)</ins>', page)
    dels = re.findall(r'<del class="mk-del">(.*?)</del>', page)
    assert "London" in "".join(ins) and "Ada" in "".join(ins)
    assert "empty" in "".join(dels)
    assert "<ins" not in diff_html("same text", "same text")


def test_diff_against_previous_call_of_same_role():
    mem = lambda i, m, role: make_call(i, [("memory", m)], [("mem", "x")], role=role)
    traj = Trajectory("t", "memsearcher", calls=[mem(0, "A", "act"), mem(1, "A B", "memory"), mem(2, "A C", "act")])
    page = render_call_html(traj, 2)
    assert "against call 0" in page
    assert re.findall(r'<ins class="mk-ins">(.*?)</ins>', page) == [" C"]


def test_token_counts_by_kind_and_char_fallback(memsearcher_traj):
    assert part_counts({"a": [(0, 5)], "b": [(5, 11)]}, 14) == [("a", 5), ("b", 6), ("(untagged)", 3)]
    page0 = render_call_html(memsearcher_traj, 0)
    assert re.search(r"mk-question\"[^>]*>question</span></td><td>6</td><td>tokens", page0)
    page1 = render_call_html(memsearcher_traj, 1)
    assert "<td>chars</td>" in page1  # no token spans on call 1


def test_slider_range_and_value_changes_html(memsearcher_traj):
    v = TraceViewer(memsearcher_traj)
    assert v.slider.description == "turn"
    assert v.slider.max == len(memsearcher_traj.calls) - 1
    first = v.html.value
    assert first == v.render_call_html(0)
    v.slider.value = 1
    assert v.html.value != first and v.html.value == v.render_call_html(1)
    assert "&lt;answer&gt;London" in v.html.value


def test_viewer_with_several_trajectories(memsearcher_traj, memact_traj):
    v = TraceViewer([memsearcher_traj, memact_traj])
    v.slider.value = 1
    v.selector.value = 1
    assert v.slider.max == 2 and v.slider.value == 0
    assert "memact" in v.html.value


def test_memact_pruned_ids_appear(memact_traj):
    page = render_call_html(memact_traj, 2)
    assert re.search(r"pruned by this call: .*r1.*7", page)
    assert '<tr class="mk-pruned"><td>r1</td>' in page
    assert '<tr><td>r0</td>' in page  # kept records are not struck out
    assert "pruned by this call: none" in render_call_html(memact_traj, 0)
    assert "3 record(s) in context" in page


def test_to_html_writes_a_self_contained_file(tmp_path, memsearcher_traj, memact_traj):
    path = tmp_path / "sub" / "trace.html"
    page = to_html([memsearcher_traj, memact_traj], path=path)
    assert path.read_text(encoding="utf-8") == page
    assert page.startswith("<!DOCTYPE html>") and "<style>" in page and "<script>" in page
    assert 'id="t0-c1"' in page and 'id="t1-c2"' in page and 'href="#t1-c2"' in page
    assert "http://" not in page and "https://" not in page  # nothing external to load
    assert not list(path.parent.glob(".*.tmp"))


def test_plot_mask_image_equals_mask(tmp_path):
    mask = torch.tril(torch.ones(6, 6, dtype=torch.bool))
    mask[4, :2] = False
    fig = plot_mask(mask, tokens=list("abcdef"), title="m", boundaries=[3])
    img = fig.axes[0].images[0].get_array()
    np.testing.assert_array_equal(np.asarray(img).astype(bool), mask.numpy())
    assert [t.get_text() for t in fig.axes[0].get_xticklabels()] == list("abcdef")
    fig.savefig(tmp_path / "m.png")
    assert (tmp_path / "m.png").stat().st_size > 0
    with pytest.raises(ValueError):
        plot_mask(np.ones((2, 1, 3, 3), dtype=bool))


def test_mask_viewer_batch_selector():
    masks = np.zeros((2, 1, 4, 4), dtype=bool)
    masks[0, 0] = np.tril(np.ones((4, 4), dtype=bool))
    masks[1, 0] = np.eye(4, dtype=bool)
    v = MaskViewer(torch.from_numpy(masks), tokens=["a", "b", "c", "d"])
    assert v.slider.max == 1 and v.slider in v.children
    png0 = v.image.value
    assert png0[:4] == b"\x89PNG"
    v.slider.value = 1
    np.testing.assert_array_equal(v.figure.axes[0].images[0].get_array().astype(bool), np.eye(4, dtype=bool))
    assert v.image.value != png0 and "batch 1" in v.info.value
    assert MaskViewer(np.eye(3)).slider not in MaskViewer(np.eye(3)).children
