"""memkit.viz: trace HTML/widget and attention-mask figures, on hand-built trajectories and,
for MemAct's pruned records, on real oracle rollouts (``fixtures.traces``)."""

from __future__ import annotations

import html as html_lib
import re

import numpy as np
import pytest
import torch
from fixtures.traces import oracle_traces

from memkit.agents import get_method
from memkit.core.trajectory import Call, Trajectory, load_jsonl, save_jsonl
from memkit.viz import PALETTE, MaskViewer, TraceViewer, color_for, plot_mask, render_call_html, to_html
from memkit.viz.html import diff_html, part_counts, record_spans, render_spans


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
    return Call(
        turn=turn,
        role=role,
        context_ids=list(range(n_ctx if n_ctx is not None else len(ctx.split()))),
        output_ids=list(range(len(out.split()))),
        logprobs=[0.0] * len(out.split()),
        context_text=ctx,
        output_text=out,
        context_char_spans=cspans,
        output_char_spans=ospans,
        context_spans=token_spans or {},
        observation_text=obs,
    )


@pytest.fixture
def memsearcher_traj():
    q = (("system", "You are a search agent.\n"), ("question", "Q: where was Ada born?\n"))
    c0 = make_call(
        0,
        [*q, ("memory", "Memory: (empty)\n")],
        [("think", "<think>need to search</think>"), ("search", "<search>Ada birthplace</search>")],
        obs="<information>Ada was born in London.</information>",
        token_spans={"system": [(0, 5)], "question": [(5, 11)], "memory": [(11, 13)]},
        n_ctx=14,
    )
    c1 = make_call(
        1,
        [*q, ("memory", "Memory: Ada was born in London.\n"), ("information", "x")],
        [("answer", "<answer>London <script>alert(1)</script></answer>")],
    )
    return Trajectory(
        task_id="t1", method="memsearcher", calls=[c0, c1], answer="London", golds=[["London"]], reward=1.0
    )


def memact_real_traces():
    """MemAct oracle rollouts on 4-question tasks: each trajectory makes 2-3 Prune&Writes."""
    return oracle_traces("memact", k=4, n_tasks=2)


@pytest.fixture
def memact_traj():
    """A real MemAct trajectory (oracle policy through the rollout engine) with >= 2 prunes."""
    return next(t for t in memact_real_traces() if sum(map(bool, t.info["pruned_ids"])) >= 2)


def pruned_by_call(traj):
    """call index -> record ids its Prune&Write deleted, read from the outputs alone (the
    method's parser), not from ``traj.info``."""
    memact = get_method("memact")
    out = {}
    for i, c in enumerate(traj.calls):
        parsed = memact.parse(c.output_text, c.role)
        if c.valid and parsed.action == "prune_write":
            out[i] = parsed.prune_ids
    return out


def marked_rows(page):
    """(record ids struck out as pruned, record ids kept) in a call's records table."""
    table = re.search(r'<table class="mk-counts mk-records">(.*?)</table>', page)
    rows = table.group(1) if table else ""
    return re.findall(r'<tr class="mk-pruned"><td>([^<]*)</td>', rows), re.findall(r"<tr><td>([^<]*)</td>", rows)


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
    def mem(i, m, role):
        return make_call(i, [("memory", m)], [("mem", "x")], role=role)

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
    assert v.slider.max == len(memact_traj.calls) - 1 and v.slider.value == 0
    assert "memact" in v.html.value
    i = next(iter(pruned_by_call(memact_traj)))
    v.slider.value = i
    assert 'class="mk-pruned"' in v.html.value


def test_memact_pruned_records_marked_on_real_rollouts():
    """Every call that pruned (by its own output) strikes out exactly the records it deleted;
    no other call marks anything."""
    trajs = memact_real_traces()
    n_pruning = 0
    for traj in trajs:
        expected = pruned_by_call(traj)
        assert len(expected) >= 2, traj.info  # the fixture exercises several prunes per trajectory
        for i, call in enumerate(traj.calls):
            page = render_call_html(traj, i, include_css=False)
            struck, kept = marked_rows(page)
            live = [rid for rid, _ in record_spans(call)]
            if i in expected:
                n_pruning += 1
                ids = expected[i]
                assert ids and sorted(struck) == sorted(ids), (i, struck, ids)
                assert set(ids) <= set(live)  # the records it deleted were in its context
                assert sorted(kept) == sorted(set(live) - set(ids))
                listed = re.search(r"pruned by this call: (.*?)</div>", page).group(1)
                assert re.findall(r'<span class="mk-pruned">([^<]*)</span>', listed) == ids
            else:
                assert 'class="mk-pruned"' not in page, i
                assert "pruned by this call: none" in page
                assert sorted(kept) == sorted(live)
            assert f"{len(live)} record(s) in context" in page or not live
    assert n_pruning == sum(len(pruned_by_call(t)) for t in trajs) >= 4


def test_memact_prunes_survive_the_jsonl_round_trip(tmp_path, memact_traj):
    """A trace saved by ``memkit rollout --out`` and viewed later still shows its prunes."""
    save_jsonl([memact_traj], tmp_path / "trace.jsonl")
    (back,) = load_jsonl(tmp_path / "trace.jsonl")
    struck = lambda page: re.findall(r'<tr class="mk-pruned"><td>([^<]*)</td>', page)  # noqa: E731
    assert struck(to_html(back)) == struck(to_html(memact_traj))
    assert sorted(struck(to_html(back))) == sorted(r for ids in pruned_by_call(memact_traj).values() for r in ids)


def test_to_html_writes_a_self_contained_file(tmp_path, memsearcher_traj, memact_traj):
    path = tmp_path / "sub" / "trace.html"
    page = to_html([memsearcher_traj, memact_traj], path=path)
    assert path.read_text(encoding="utf-8") == page
    assert page.startswith("<!DOCTYPE html>") and "<style>" in page and "<script>" in page
    last = len(memact_traj.calls) - 1
    assert 'id="t0-c1"' in page and f'id="t1-c{last}"' in page and f'href="#t1-c{last}"' in page
    assert '<tr class="mk-pruned">' in page
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
