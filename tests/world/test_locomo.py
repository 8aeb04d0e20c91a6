"""The LoCoMo loader: the real schema loads, round-trips, and bad files fail naming the field."""

from __future__ import annotations

import copy
import json
import re
from pathlib import Path

import pytest

from memkit.world.conversation import NOT_MENTIONED, Conversation
from memkit.world.locomo import check_locomo_sample, load_locomo, save_locomo

FIXTURE = Path(__file__).parents[1] / "fixtures" / "locomo_small.json"


@pytest.fixture
def data() -> list:
    return json.loads(FIXTURE.read_text(encoding="utf-8"))


def _write(tmp_path, obj, name="locomo10.json") -> Path:
    path = tmp_path / name
    path.write_text(json.dumps(obj), encoding="utf-8")
    return path


def test_fixture_loads():
    a, b = load_locomo(FIXTURE)
    assert (a.sample_id, a.speaker_a, a.speaker_b) == ("conv-101", "Priya", "Marcus")
    assert [len(s.turns) for s in a.sessions] == [6, 5, 4] and [len(s.turns) for s in b.sessions] == [4, 5]
    assert [s.index for s in a.sessions] == [1, 2, 3]
    assert a.sessions[0].date_time == "1:56 pm on 8 May, 2023"
    assert a.turn("D1:5").text.startswith("That's amazing")  # the image turn keeps its own text
    assert (len(a.qa), len(b.qa)) == (6, 5)
    assert {q.category for q in a.qa} == {q.category for q in b.qa} == {1, 2, 3, 4, 5}
    assert a.qa[1].answer == "2022"  # the int answer
    assert a.qa[3].evidence == ["D2:3", "D3:2"]
    adv = a.qa[5]
    assert (adv.category_name, adv.answer, adv.adversarial_answer) == ("adversarial", NOT_MENTIONED, "Biscuit")
    assert set(a.extra) == {"observation", "session_summary", "event_summary"}
    assert a.extra["observation"]["session_1_observation"]["Marcus"][1] == [
        "Marcus started running in 2022 after moving to Denver.",
        "D1:4",
    ]
    assert a.facts == [] and all(not q.hops for q in a.qa)


def test_round_trip(tmp_path):
    convs = load_locomo(FIXTURE)
    out = tmp_path / "deep" / "dir" / "locomo.json"
    save_locomo(convs, out)
    assert load_locomo(out) == convs
    saved = json.loads(out.read_text(encoding="utf-8"))
    assert isinstance(saved, list) and all("memkit" not in s for s in saved)
    for c in convs:
        assert Conversation.from_locomo(c.to_locomo()) == c


def test_top_level_object_is_one_sample(tmp_path, data):
    (c,) = load_locomo(_write(tmp_path, data[1]))
    assert c.sample_id == "conv-102"


def test_limit(data):
    assert [c.sample_id for c in load_locomo(FIXTURE, limit=1)] == ["conv-101"]
    assert load_locomo(FIXTURE, limit=0) == []
    assert len(load_locomo(FIXTURE, limit=10)) == 2
    with pytest.raises(ValueError, match="limit"):
        load_locomo(FIXTURE, limit=-1)


def test_missing_file(tmp_path):
    with pytest.raises(FileNotFoundError, match="snap-research/locomo"):
        load_locomo(tmp_path / "locomo10.json")


def test_invalid_json(tmp_path):
    path = tmp_path / "locomo10.json"
    path.write_text("[{not json", encoding="utf-8")
    with pytest.raises(ValueError, match="not valid JSON"):
        load_locomo(path)


def test_lenient_where_real_data_varies(tmp_path, data):
    d = data[0]
    conv = d["conversation"]
    conv["session_5"], conv["session_5_date_time"] = conv.pop("session_3"), conv.pop("session_3_date_time")  # a gap
    conv["session_1"][2] = {
        "speaker": "Priya",
        "dia_id": "D1:3",
        "blip_caption": "a photo of a trail map",
        "img_url": ["https://example.com/x.jpg"],
    }  # image-only turn, no text
    d["qa"][0]["evidence"] = ["D2:1; D2:3"]  # odd evidence is kept verbatim
    d["qa"][5]["adversarial_answer"] = 7
    d["qa"][4]["answer"] = 1.5
    d["qa"][0]["extra_key"] = {"anything": True}
    before = copy.deepcopy(d)
    (c,) = load_locomo(_write(tmp_path, d))
    assert d == before  # the caller's data is not mutated
    assert [s.index for s in c.sessions] == [1, 2, 5]
    assert c.turn("D1:3").text == "[shared a photo of a trail map]"
    assert c.qa[0].evidence == ["D2:1; D2:3"]
    assert (c.qa[4].answer, c.qa[5].adversarial_answer) == ("1.5", "7")
    check_locomo_sample(d, "here")  # returns None: valid


def _pop(keys):
    def f(d):
        *path, last = keys
        for k in path:
            d = d[k]
        del d[last]

    return f


def _set(keys, value):
    def f(d):
        *path, last = keys
        for k in path:
            d = d[k]
        d[last] = value

    return f


MUTATIONS = {
    "no speaker_a": (_pop(["conversation", "speaker_a"]), r"conversation\.speaker_a: expected a non-empty string"),
    "empty speaker_b": (_set(["conversation", "speaker_b"], " "), r"conversation\.speaker_b: expected"),
    "no sample_id": (_pop(["sample_id"]), r"sample_id: expected a string, got nothing"),
    "conversation a list": (_set(["conversation"], []), r": conversation: expected an object"),
    "no sessions": (
        _set(["conversation"], {"speaker_a": "A", "speaker_b": "B"}),
        r'conversation: expected at least one "session_N"',
    ),
    "session not a list": (_set(["conversation", "session_2"], {}), r"conversation\.session_2: expected a list"),
    "session without date_time": (
        _pop(["conversation", "session_2_date_time"]),
        r"conversation\.session_2_date_time: expected a string",
    ),
    "turn not a dict": (_set(["conversation", "session_1", 0], "hi"), r"conversation\.session_1\[0\]: expected a turn"),
    "turn without dia_id": (
        _pop(["conversation", "session_2", 4, "dia_id"]),
        r'conversation\.session_2\[4\]\.dia_id: expected a string like "D2:5", got nothing',
    ),
    "dia_id not a string": (
        _set(["conversation", "session_2", 4, "dia_id"], None),
        r'conversation\.session_2\[4\]\.dia_id: expected a string like "D2:5", got None',
    ),
    "turn without speaker": (
        _pop(["conversation", "session_3", 1, "speaker"]),
        r"conversation\.session_3\[1\]\.speaker: expected a string",
    ),
    "turn without text": (_pop(["conversation", "session_1", 0, "text"]), r"conversation\.session_1\[0\]\.text"),
    "qa not a list": (_set(["qa"], {}), r": qa: expected a list"),
    "qa without question": (_pop(["qa", 2, "question"]), r"qa\[2\]\.question: expected a string"),
    "category 7": (_set(["qa", 0, "category"], 7), r"qa\[0\]\.category: expected an int in 1\.\.5"),
    'category "2"': (
        _set(["qa", 1, "category"], "2"),
        r"qa\[1\]\.category: expected an int in 1\.\.5 \(1 multi-hop, .*\), got '2' \(str\)",
    ),
    "category True": (_set(["qa", 1, "category"], True), r"qa\[1\]\.category: expected an int"),
    "no category": (_pop(["qa", 1, "category"]), r"qa\[1\]\.category: expected an int"),
    "evidence not a list": (_set(["qa", 3, "evidence"], "D2:3"), r"qa\[3\]\.evidence: expected a list"),
    "evidence item not a string": (_set(["qa", 3, "evidence", 1], 3), r"qa\[3\]\.evidence\[1\]: expected a dia_id"),
    "category-1 without answer": (_pop(["qa", 3, "answer"]), r"qa\[3\]\.answer: expected a string or number"),
    "answer a list": (_set(["qa", 0, "answer"], ["Biscuit"]), r"qa\[0\]\.answer: expected a string or number"),
    "category-5 without any answer": (
        _pop(["qa", 5, "adversarial_answer"]),
        r'qa\[5\]\.answer: expected a string or number \(or an "adversarial_answer"\)',
    ),
}


@pytest.mark.parametrize("name", list(MUTATIONS))
def test_malformed_sample_names_the_field(tmp_path, data, name):
    mutate, field = MUTATIONS[name]
    mutate(data[0])
    path = _write(tmp_path, data)
    with pytest.raises(ValueError, match=field) as e:
        load_locomo(path)
    assert str(e.value).startswith(f"{path}: sample 0")
    with pytest.raises(ValueError, match=field):
        check_locomo_sample(data[0], "locomo10.json: sample 0")


def test_error_names_file_sample_and_id(tmp_path, data):
    _set(["conversation", "session_2", 4, "dia_id"], None)(data[1])
    path = _write(tmp_path, data)
    want = (
        f"""{path}: sample 1 ('conv-102'): conversation.session_2[4].dia_id: expected a string like "D2:5", got None"""
    )
    with pytest.raises(ValueError, match=re.escape(want)):
        load_locomo(path)


@pytest.mark.parametrize(
    "top, match",
    [
        ("a string", "got a JSON str"),
        (3, "got a JSON int"),
        ([["not", "a", "sample"]], r"sample 0: expected a LoCoMo sample object"),
    ],
)
def test_bad_top_level(tmp_path, top, match):
    with pytest.raises(ValueError, match=match):
        load_locomo(_write(tmp_path, top))
