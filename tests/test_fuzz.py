"""Property tests: tag spans, HTML escaping of model text, answer scoring.

Default depth keeps ``make test`` fast; ``make test-fuzz`` runs every test marked ``fuzz`` (here and
the parser fuzzers of ``test_agents.py``) with ``MEMKIT_FUZZ_EXAMPLES=10000`` examples each.
"""

from __future__ import annotations

import html
import os
import re
from html.parser import HTMLParser

import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from memkit.metrics.qa import exact_match, normalize_answer, score_multi, split_answers
from memkit.rollout.context import tag_char_spans

pytestmark = pytest.mark.fuzz


def depth(default: int, fuzz: int | None = None) -> int:
    """Examples per property: ``default``, or under ``make test-fuzz`` ``$MEMKIT_FUZZ_EXAMPLES`` (capped
    at ``fuzz`` for a property that runs whole rollouts per example)."""
    deep = int(os.environ.get("MEMKIT_FUZZ_EXAMPLES") or 0)
    return max(default, min(deep, fuzz) if fuzz else deep)


FUZZ = dict(deadline=None, suppress_health_check=[HealthCheck.too_slow])
TAGS = ["think", "search", "answer", "mem", "memory", "information", "tool_call", "prune"]
PIECES = st.sampled_from(
    [f"<{t}>" for t in TAGS] + [f"</{t}>" for t in TAGS] + ["<", ">", "</", "/>", "a", " ", "\n", "x y"]
)
TAGGED = st.lists(st.one_of(PIECES, st.text(max_size=4)), max_size=25).map("".join)
INJECT = st.lists(
    st.one_of(
        st.sampled_from(
            [
                "<script>alert(1)</script>",
                '<img src=x onerror="alert(1)">',
                '"',
                "'",
                "&amp;",
                "&",
                "</td></tr></table>",
                "<!--",
                "-->",
                "]]>",
                "</span>",
                '<a href="javascript:alert(1)">x</a>',
                "<think>",
                "</think>",
            ]
        ),
        st.text(max_size=6),
    ),
    max_size=12,
).map("".join)


@settings(max_examples=depth(300), **FUZZ)
@given(text=TAGGED)
def test_tag_spans_cover_their_tags(text):
    """Every span starts at its opening tag, ends at its closing tag (or, unclosed, at the end of the
    text), lies inside the text, and every closed <t>...</t> pair whose inside opens no other <t> is found."""
    spans = tag_char_spans(text)
    for tag, lst in spans.items():
        for s, e in lst:
            assert 0 <= s < e <= len(text)
            assert text.startswith(f"<{tag}>", s)
            assert text[:e].endswith(f"</{tag}>") or e == len(text)
    for tag in TAGS:
        for m in re.finditer(rf"<{tag}>((?:(?!<{tag}>|</{tag}>).)*)</{tag}>", text, re.S):
            assert (m.start(), m.end()) in spans.get(tag, []), (tag, m.group(0), spans)


class _Tags(HTMLParser):
    def __init__(self):
        super().__init__(convert_charrefs=True)
        self.tags, self.attrs, self.text = [], [], []

    def handle_starttag(self, tag, attrs):
        self.tags.append(tag)
        self.attrs += [(tag, k, v) for k, v in attrs]

    def handle_data(self, data):
        self.text.append(data)


@settings(max_examples=depth(200), **FUZZ)
@given(text=INJECT, cut=st.integers(0, 40))
def test_rendered_model_text_cannot_inject_markup(text, cut):
    """render_spans escapes model text: the only tags are memkit's own spans, no attribute carries
    model text, and the text reads back unchanged."""
    from memkit.viz.html import render_spans

    out = render_spans(text, {"think": [(0, cut)], "answer": [(cut // 2, cut + 3)]})
    p = _Tags()
    p.feed(out)
    p.close()
    own = _Tags()
    own.feed(render_spans("ab", {"think": [(0, 1)], "answer": [(1, 2)]}))
    assert set(p.tags) <= {"span"} and set(p.attrs) <= set(own.attrs)  # memkit's own attributes only
    assert "".join(p.text) == text


_KIT: dict = {}


def _world_env():
    if not _KIT:
        from memkit.envs import SearchEnv, make_retriever
        from memkit.world import make_world

        world = make_world(seed=0)
        _KIT.update(world=world, env=SearchEnv(make_retriever("bm25", world.passages), k=2))
    return _KIT["world"], _KIT["env"]


class _Replay:
    def __init__(self, texts):
        self.texts = list(texts)

    def generate_calls(self, states, specs, contexts):
        from memkit.models.generation import Generation

        return [
            Generation(ids=[ord(c) for c in t], logprobs=[0.0] * len(t), text=t)
            for t in (self.texts.pop(0) for _ in states)
        ]


class _CharTok:
    def encode(self, text, add_special_tokens=False):
        return [ord(c) for c in text]

    def decode(self, ids):
        return "".join(chr(i) for i in ids)


@settings(max_examples=depth(25, fuzz=1000), **FUZZ)
@given(think=INJECT, query=INJECT, answer=INJECT)
def test_trajectory_page_escapes_model_text(think, query, answer):
    """A whole trace page (to_html) of a real MEM1 rollout whose model wrote hostile text (its think,
    its query, echoed into the next context, its answer): the page holds exactly memkit's own script
    and tags, and no event-handler or javascript: attribute."""
    from memkit.agents import get_method
    from memkit.rollout.engine import RolloutConfig, run_rollouts
    from memkit.viz.html import to_html
    from memkit.world import make_tasks

    world, env = _world_env()
    task = make_tasks(world, 1, k=1, seed=3)

    def page(texts):
        trajs = run_rollouts(get_method("mem1"), task, env, _Replay(texts), _CharTok(), RolloutConfig(max_turns=3))
        p = _Tags()
        p.feed(to_html(trajs))
        p.close()
        return p

    benign = page(["<think>a</think><search>b</search>", "<think>c</think><answer>d</answer>"])
    hostile = page(
        [f"<think>{think}</think><search>{query}</search>", f"<think>{think}</think><answer>{answer}</answer>"]
    )
    assert hostile.tags.count("script") == benign.tags.count("script") == 1
    assert set(hostile.tags) <= set(benign.tags) | {"span"}
    assert not [a for a in hostile.attrs if a[1].startswith("on") or "javascript:" in (a[2] or "")]


ANSWER = st.text(alphabet=st.sampled_from(list("ab ;,.'-A1")), max_size=20)


@settings(max_examples=depth(300), **FUZZ)
@given(
    pred=st.one_of(st.none(), ANSWER), golds=st.lists(st.lists(ANSWER, min_size=1, max_size=3), min_size=1, max_size=4)
)
def test_answer_scoring_properties(pred, golds):
    """Scores lie in [0, 1] per question and add up; the right count of answers is needed for any
    credit at k > 1; a gold alias scores itself 1 (if it normalises to something)."""
    for metric in ("em", "f1"):
        r = score_multi(pred, golds, metric)
        assert len(r["per_question"]) == len(golds) and all(0.0 <= v <= 1.0 for v in r["per_question"])
        assert r["sum"] == pytest.approx(sum(r["per_question"])) and r["mean"] == pytest.approx(r["sum"] / len(golds))
        if len(golds) > 1 and len(split_answers(pred)) != len(golds):
            assert r["sum"] == 0.0
    for aliases in golds:
        for a in aliases:
            assert exact_match(a, aliases) == (1.0 if normalize_answer(a) else 0.0)
    right = "; ".join(g[0] for g in golds)
    if all(normalize_answer(g[0]) and ";" not in g[0] for g in golds):
        assert score_multi(right, golds)["sum"] == len(golds)


def test_escaping_is_what_the_viewer_uses():
    """The property above is about the function the viewers call (not a copy of it)."""
    from memkit.viz import html as viz_html

    assert viz_html.html is html and "render_spans" in viz_html.__dict__


# ----------------------------------------------------------------------------- packing of random layouts
PROMPT = 1  # call 0's context opens with a literal prompt every later context repeats (MEM1, MemAct, ReAct)


@st.composite
def call_layouts(draw):
    """A random trajectory: calls whose contexts are the prompt then any in-order mix of earlier
    outputs / observations (as refs) and literal chat tokens; ids from a tiny vocabulary so that
    coincidental repeats test the trie's sharing. Returns (trajectory, chosen call indices)."""
    from memkit.core.trajectory import Call, Trajectory

    ids = st.integers(5, 12)
    prompt = draw(st.lists(ids, min_size=1, max_size=4))
    calls: list[Call] = []
    for t in range(draw(st.integers(1, 5))):
        # mostly the shared prompt; sometimes a context that opens differently (a new conversation's turn)
        ctx, refs = (
            list(prompt if t == 0 or draw(st.integers(0, 3)) else draw(st.lists(ids, min_size=1, max_size=4))),
            [],
        )
        if t:
            for j in range(t):
                for kind, src in (("output", calls[j].output_ids), ("observation", calls[j].observation_ids)):
                    if src and draw(st.booleans()):
                        refs.append((len(ctx), len(ctx) + len(src), j, kind))
                        ctx += src
                if draw(st.booleans()):
                    ctx += draw(st.lists(ids, min_size=1, max_size=2))  # a chat suffix, not a ref
        out = draw(st.lists(ids, min_size=1, max_size=4))
        obs = draw(st.lists(ids, max_size=3))
        lp = [-0.01 * (len(calls) * 10 + i + 1) for i in range(len(out))]  # distinct per token
        calls.append(
            Call(
                turn=t, role="act", context_ids=ctx, output_ids=out, logprobs=lp, context_refs=refs, observation_ids=obs
            )
        )
    chosen = sorted(draw(st.sets(st.integers(0, len(calls) - 1), min_size=1)))
    return Trajectory(task_id="fuzz", method="fuzz", calls=calls), tuple(chosen)


def _attended(batch, b: int, q: int) -> list[int]:
    """Row indices query q of row b attends to, in row order (causal implied for ``separate``)."""
    if batch.attention_mask.dim() == 2:
        return [k for k in range(q + 1) if batch.attention_mask[b, k]]
    return [int(i) for i in batch.attention_mask[b, 0, q].nonzero().flatten()]


@settings(max_examples=depth(60, fuzz=10000), **FUZZ)
@given(layout=call_layouts())
def test_packing_random_layouts(layout):
    """Every packing trains each chosen output token once with its own sampling log-prob, and the
    query predicting it sees exactly the call's context and output prefix. ``separate`` and
    ``mem1_exact`` are exact all the way down: positions are the rollout's, and every key's own view
    is the prefix of the query's (so its hidden state is what the rollout computed)."""
    from memkit.core.trajectory import TrainingUnit
    from memkit.rl.packing import MODES, pack

    traj, chosen = layout
    unit = TrainingUnit(traj, chosen)
    for mode in MODES:
        batch = pack([unit], mode)
        trained = batch.loss_mask > 0
        assert int(trained.sum()) == sum(traj.calls[t].n_output for t in chosen), mode
        for t in chosen:
            call = traj.calls[t]
            seq = list(call.context_ids) + list(call.output_ids)
            where = [(b, i) for b, i in (trained & (batch.call_ids == t)).nonzero().tolist()]
            where.sort(key=lambda bi: (bi[0], int(batch.position_ids[bi])))
            assert [int(batch.input_ids[bi]) for bi in where] == list(call.output_ids), (mode, t)
            assert [float(batch.old_logprobs[bi]) for bi in where] == pytest.approx(call.logprobs), (mode, t)
            for j, (b, i) in enumerate(where):
                if mode == "mem1_mask":
                    # the paper's approximation: a token placed for call t sees call t's whole context (as a
                    # set: positions are contiguous over the stitched row, App. B.7); reused tokens keep their
                    # own rows, so only from the second output token on is the predicting query one of them
                    own = sorted(int(batch.input_ids[b, k]) for k in _attended(batch, b, i))
                    assert own == sorted(seq[: call.n_context + j + 1]), (mode, t, j)
                    assert j == 0 or int(batch.pred_index[b, i]) == where[j - 1][1], (mode, t, j)
                    continue
                p = int(batch.pred_index[b, i])
                view = _attended(batch, b, p)
                assert [int(batch.input_ids[b, k]) for k in view] == seq[: call.n_context + j], (mode, t, j)
                assert [int(batch.position_ids[b, k]) for k in view] == list(range(call.n_context + j))
                for k in view:
                    assert _attended(batch, b, k) == [v for v in view if v <= k], (mode, t, j, k)
