"""The peers' real QA sets and corpus through ``datasets``: FlashRAG, Search-R1, wiki-18.

Search-R1, MEM1, MemSearcher and their peers all train and test on the same files:

* ``RUC-NLPIR/FlashRAG_datasets``, one config per benchmark (nq, triviaqa, popqa, hotpotqa,
  2wikimultihopqa, musique, bamboogle), splits train / dev / test, rows
  ``{"id": "test_0", "question": str, "golden_answers": [str, ...], "metadata": {...}}``
  (``metadata`` only where the benchmark has more: HotpotQA's ``supporting_facts`` and
  ``context``, MuSiQue's ``question_decomposition``, ...);
* ``PeterJinGo/nq_hotpotqa_train``, Search-R1's ``train.parquet`` (NQ + HotpotQA) and
  ``test.parquet``: the FlashRAG rows plus ``data_source``, ``prompt`` (chat messages),
  ``ability``, ``reward_model: {"style": "rule", "ground_truth": {"target": [...]}}`` and
  ``extra_info: {"split", "index"}`` (its ``scripts/data_process/nq_search.py``);
* ``PeterJinGo/wiki-18-corpus``, the Wikipedia-2018 passages, one JSON line
  ``{"id", "contents": "\\"Title\\"\\ntext"}`` each (21M lines, 13 GB: read it as a stream).

One code path reads them: ``datasets.load_dataset`` by hub id when online and
``load_dataset("json" | "parquet", data_files=path)`` on a downloaded file offline, so a test on a
fixture exercises what a run on the hub does. Question ids are ``<source>-<row id>`` (the row's
``data_source``, or the FlashRAG config), because every FlashRAG config numbers its rows from
``test_0``: NQ and HotpotQA questions would otherwise collide in one pool, and the held-out split
(:func:`~memkit.world.splits.question_split`, a hash of the id) would differ between the hub and a
local copy of the same file.
"""

from __future__ import annotations

import gzip
import json
from pathlib import Path
from typing import Iterator

from memkit.world.composite import compose_multi_objective, question_pool
from memkit.world.loaders import (
    _limit,
    _real_task,
    load_dpr_topics,
    load_hotpotqa_json,
    load_tasks_jsonl,
    load_wiki_summaries,
)
from memkit.world.schema import Passage, Task, compose_prompt

FLASHRAG_HUB = "RUC-NLPIR/FlashRAG_datasets"
SEARCH_R1_HUB = "PeterJinGo/nq_hotpotqa_train"
WIKI18_HUB = "PeterJinGo/wiki-18-corpus"
#: The FlashRAG configs the papers evaluate on (MEM1 trains on nq + hotpotqa via Search-R1's file).
FLASHRAG_CONFIGS = ("nq", "triviaqa", "popqa", "hotpotqa", "2wikimultihopqa", "musique", "bamboogle")
QA_SCHEMA = (
    'FlashRAG rows {"id", "question": str, "golden_answers": [str, ...], "metadata"?} or Search-R1 rows '
    'that add {"data_source", "prompt", "reward_model": {"ground_truth": {"target": [str, ...]}}} '
    "(.jsonl, .json or .parquet)"
)
QA_GET = (
    f"download a split from the Hugging Face dataset {FLASHRAG_HUB} (e.g. nq/test.jsonl) or "
    f"{SEARCH_R1_HUB} (train.parquet, test.parquet) and pass its path"
)
CORPUS_GET = f"download wiki-18.jsonl.gz from the Hugging Face dataset {WIKI18_HUB} and pass its path"
_BUILDERS = {".jsonl": "json", ".json": "json", ".parquet": "parquet"}


def _hub_rows(repo: str, config: str | None, split: str):
    """``datasets.load_dataset`` on the hub; no network reads as ``FileNotFoundError`` with the offline route."""
    import datasets

    try:
        return datasets.load_dataset(repo, config, split=split)
    except Exception as e:  # ConnectionError, OfflineModeIsEnabled, DatasetNotFoundError, ...
        where = f"{repo}" + (f" (config {config!r})" if config else "") + f" split {split!r}"
        raise FileNotFoundError(
            f"could not load {where} from the Hugging Face hub ({type(e).__name__}: {e}); offline, {QA_GET}"
        ) from None


def _file_rows(path: Path):
    """The same ``load_dataset`` on a local file (``json`` or ``parquet`` builder by suffix)."""
    import datasets

    suffixes = [s for s in path.suffixes if s != ".gz"]
    builder = _BUILDERS.get(suffixes[-1] if suffixes else "")
    if builder is None:
        raise ValueError(f"{path}: unknown file type; expected {QA_SCHEMA}")
    try:
        return datasets.load_dataset(builder, data_files=str(path), split="train")
    except Exception as e:  # DatasetGenerationError wraps the JSON / Arrow error
        cause = e.__cause__ or e
        raise ValueError(
            f"{path} is not a readable {builder} file ({type(cause).__name__}: {cause}); expected {QA_SCHEMA}"
        ) from None


def _answers(row: dict) -> list[str] | None:
    """``golden_answers`` (FlashRAG), else ``reward_model.ground_truth.target`` (Search-R1)."""
    gold = row.get("golden_answers")
    if gold is None:
        truth = (row.get("reward_model") or {}).get("ground_truth")
        gold = truth.get("target") if isinstance(truth, dict) else truth
    if isinstance(gold, str):
        gold = [gold]
    if not isinstance(gold, (list, tuple)) or not gold or not all(isinstance(g, (str, int, float)) for g in gold):
        return None
    return [str(g) for g in gold]


def _question_text(row: dict) -> str | None:
    """``question``; a Search-R1 row without it keeps the question after ``Question:`` in its prompt."""
    if isinstance(row.get("question"), str):
        return row["question"].strip()
    prompt = row.get("prompt")
    if isinstance(prompt, list) and prompt and isinstance(prompt[-1], dict):
        content = str(prompt[-1].get("content", ""))
        if "Question:" in content:
            return content.rsplit("Question:", 1)[1].strip()
    return None


def _supporting_titles(metadata) -> list[str]:
    """HotpotQA / 2Wiki ``supporting_facts`` (``{"title": [...]}`` or ``[[title, sent], ...]``) and
    MuSiQue ``question_decomposition[*].support_paragraph.title``, unique, in order."""
    if not isinstance(metadata, dict):
        return []
    titles: list[str] = []
    facts = metadata.get("supporting_facts")
    if isinstance(facts, dict):
        titles += [str(t) for t in facts.get("title") or []]
    elif isinstance(facts, list):
        titles += [str(f[0]) for f in facts if isinstance(f, (list, tuple)) and f]
    for step in metadata.get("question_decomposition") or []:
        para = step.get("support_paragraph") if isinstance(step, dict) else None
        if isinstance(para, dict) and para.get("title"):
            titles.append(str(para["title"]))
    return list(dict.fromkeys(titles))


def rows_to_tasks(rows, where: str, source: str | None = None, limit: int | None = None) -> list[Task]:
    """FlashRAG / Search-R1 rows (any iterable of dicts) as single-question tasks.

    ``source`` prefixes ids that carry no ``data_source`` of their own (see the module docstring);
    a row without a question or a non-empty answer list raises ``ValueError`` naming ``where`` and
    the row."""
    limit = _limit(limit)
    out = []
    for i, row in enumerate(rows):
        if limit is not None and len(out) >= limit:
            break
        text = _question_text(row) if isinstance(row, dict) else None
        gold = _answers(row) if isinstance(row, dict) else None
        if not text or gold is None:
            missing = "a question" if not text else "golden_answers (or reward_model.ground_truth.target)"
            raise ValueError(f"{where}: row {i} has no {missing}; expected {QA_SCHEMA}")
        prefix = row.get("data_source") or source
        rid = str(row["id"]) if row.get("id") is not None else f"row{i}"
        qid = f"{prefix}-{rid}" if prefix else rid
        out.append(_real_task(qid, text, gold, _supporting_titles(row.get("metadata"))))
    return out


def load_qa(source, split: str = "test", config: str | None = None, limit: int | None = None) -> list[Task]:
    """Single-question tasks from a FlashRAG / Search-R1 file path or hub id.

    ``source``: a local ``.jsonl`` / ``.json`` / ``.parquet`` (``split`` is then the file itself;
    a file at ``.../<config>/<split>.jsonl``, FlashRAG's own layout, takes its config as id
    prefix), a FlashRAG config name (``"nq"``, ``"hotpotqa"``, ...), ``"RUC-NLPIR/FlashRAG_datasets"``
    with ``config``, or ``"PeterJinGo/nq_hotpotqa_train"`` (splits ``train`` / ``test``). A
    ``"repo:config"`` string is the same as passing ``config``.
    """
    path = Path(source)
    if path.is_file():
        prefix = config or (path.parent.name if path.parent.name in FLASHRAG_CONFIGS else None)
        return rows_to_tasks(_file_rows(path), str(path), prefix, limit)
    text = str(source)
    if text in FLASHRAG_CONFIGS:
        text, config = FLASHRAG_HUB, text
    elif ":" in text and "/" in text.split(":")[0]:
        text, config = text.split(":", 1)
    if text.count("/") != 1 or Path(text).suffix in _BUILDERS or text.startswith((".", "/")):
        raise FileNotFoundError(
            f"{source} does not exist; `memkit world --out DIR` writes synthetic tasks to DIR/tasks.jsonl, "
            f"and for real questions {QA_GET}"
        )
    if text == FLASHRAG_HUB and not config:
        raise ValueError(f"{FLASHRAG_HUB} needs a config, one of {FLASHRAG_CONFIGS} (or another FlashRAG config)")
    rows = _hub_rows(text, config, split)
    return rows_to_tasks(rows, f"{text}:{config or ''}[{split}]", config, limit)


def load_flashrag_jsonl(path, limit: int | None = None) -> list[Task]:
    """A downloaded FlashRAG / Search-R1 split (.jsonl or .parquet): :func:`load_qa` on a path."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"{path} does not exist; to get it, {QA_GET}")
    return load_qa(path, limit=limit)


# ---------------------------------------------------------------- wiki-18, as a stream
def _passage(line: str, where: str) -> Passage:
    try:
        row = json.loads(line)
        contents = row["contents"]
        if not isinstance(contents, str):
            raise TypeError("contents is not a str")
    except (json.JSONDecodeError, KeyError, TypeError) as e:
        raise ValueError(
            f'{where} is not a corpus line ({type(e).__name__}: {e}); expected {{"id", "contents": "\\"Title\\"\\ntext"}}'
        ) from None
    title, _, text = contents.partition("\n")
    title = title.strip()
    if len(title) >= 2 and title[0] == title[-1] == '"':
        title = title[1:-1]
    return Passage(id=str(row.get("id", "")), title=title, text=text.strip())


def iter_corpus_jsonl(path, limit: int | None = None) -> Iterator[Passage]:
    """Passages of a Search-R1 / FlashRAG corpus (``wiki-18.jsonl`` or ``.jsonl.gz``, or
    :func:`~memkit.world.loaders.save_corpus_jsonl`'s output), one line at a time.

    A generator: memory stays flat however large the file (wiki-18 is 21M passages), and the
    first passages come before the file is read to its end. ``contents`` is ``"Title"``, a
    newline, then the text; the title's quotes are dropped.
    """
    path, limit = Path(path), _limit(limit)
    if not path.is_file():
        raise FileNotFoundError(f"{path} does not exist; to get it, {CORPUS_GET}")
    opener = gzip.open if path.suffix == ".gz" else open
    n = 0
    with opener(path, "rt", encoding="utf-8", newline="\n") as f:
        for i, line in enumerate(f, 1):
            if limit is not None and n >= limit:
                return
            if line.strip():
                yield _passage(line, f"{path}:{i}")
                n += 1


# ---------------------------------------------------------------- one door for the CLI
def _peek(path: Path, n: int = 4096) -> str:
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rt", encoding="utf-8", errors="replace") as f:
        return f.read(n)


def is_task_file(path) -> bool:
    """Whether ``path`` is memkit's own tasks.jsonl (``memkit world --out``: ``{"id", "questions",
    "prompt"}`` lines, tasks as composed) rather than a file of questions."""
    path = Path(path)
    if path.suffix != ".jsonl" or not path.is_file():
        return False
    with open(path, encoding="utf-8", errors="replace") as f:
        first = f.readline()  # the whole line: a many-question task's "prompt" comes after its questions
    return '"questions"' in first and '"prompt"' in first


def _questions_from(source, split: str, config: str | None, limit: int | None) -> list[Task]:
    if str(source) == "offline":
        from memkit.world.offline import offline_real_set

        limit = _limit(limit)
        return [Task(q.id, [q], compose_prompt([q])) for q in offline_real_set().questions[:limit]]
    path = Path(source)
    if path.is_file():
        head = _peek(path)
        if path.suffix in (".txt", ".jar"):
            return load_dpr_topics(path, name="trivia" if "trivia" in path.name else "nq", limit=limit)
        if path.suffix == ".json" and head.lstrip().startswith("[") and '"_id"' in head:
            return load_hotpotqa_json(path, limit=limit)
        if is_task_file(path):
            tasks = load_tasks_jsonl(path)  # memkit's own task file (`memkit world --out`)
            return tasks[: _limit(limit)]
    return load_qa(source, split=split, config=config, limit=limit)


def load_real_tasks(
    source,
    *,
    split: str = "test",
    config: str | None = None,
    limit: int | None = None,
    k: int = 1,
    n: int | None = None,
    seed: int = 0,
    question_split: str | None = None,
) -> list[Task]:
    """Real tasks from one ``source`` string, the function ``--tasks`` calls.

    ``source``: ``"offline"`` (the answerable NQ + TriviaQA set of :mod:`memkit.world.offline`), a
    file (FlashRAG / Search-R1 ``.jsonl`` / ``.parquet``, HotpotQA's ``.json``, a DPR topics
    ``.txt`` or Anserini ``.jar``, memkit's own ``tasks.jsonl``) or a hub id (:func:`load_qa`:
    ``"nq"``, ``"RUC-NLPIR/FlashRAG_datasets:hotpotqa"``, ``"PeterJinGo/nq_hotpotqa_train"``;
    ``split`` and ``config`` go there). ``limit`` caps the questions read.

    ``k == 1`` with no ``n`` and no ``question_split`` returns the questions as read, one task each.
    Otherwise the questions are a pool for :func:`~memkit.world.composite.compose_multi_objective`:
    ``n`` tasks (default: as many as the pool fills once) of ``k`` questions, seeded by ``seed``,
    drawn from ``question_split`` ("sft", "rl", "test", "train" or None) only.
    """
    tasks = _questions_from(source, split, config, limit)
    if k == 1 and n is None and question_split is None:
        return tasks
    pool = question_pool(tasks)
    if n is None:
        n = max(1, len(pool) // k)
    return compose_multi_objective(pool, n, k, seed=seed, split=question_split)


def load_real_corpus(source, limit: int | None = None) -> list[Passage]:
    """Passages from one ``source`` string, the function ``--corpus`` calls: ``"offline"`` (the
    10,033 Wikipedia leads), ovos' ``summaries_en-us.json``, or a corpus ``.jsonl`` / ``.jsonl.gz``
    (wiki-18, or ``save_corpus_jsonl``'s output; for all of wiki-18 iterate
    :func:`iter_corpus_jsonl` instead of holding a list)."""
    if str(source) == "offline":
        from memkit.world.offline import offline_files

        return load_wiki_summaries(offline_files()["wiki"], limit=limit)
    path = Path(source)
    if path.suffix == ".json":
        return load_wiki_summaries(path, limit=limit)
    return list(iter_corpus_jsonl(path, limit=limit))
