"""A corpus on disk: Search-R1 / FlashRAG JSONL rows, read one passage at a time.

Search-R1's wiki-18 corpus (``wiki-18.jsonl``, 21M rows of ``{"id": "0", "contents":
"\\"Aaron\\"\\nAaron is a prophet ..."}``) is the row order of its prebuilt E5 faiss index:
row ``i`` of the index is line ``i`` of the file. Loading 21M ``Passage`` objects costs tens of
GB, so :class:`JsonlPassages` keeps only the byte offset of each line (8 bytes a row) and
parses a row when a search returns it.

The title is the first line of ``contents`` with one pair of surrounding quotes removed, the
inverse of :func:`memkit.world.loaders.save_corpus_jsonl` (Search-R1's own observations keep
the quotes: ``Doc 1(Title: "Aaron") ...``). Rows with ``title`` and ``text`` fields are read as
they are.
"""

from __future__ import annotations

import json
import mmap
from pathlib import Path
from typing import Iterable, Sequence

import numpy as np

from memkit.world.schema import Passage

CHUNK = 1 << 26  # bytes scanned for newlines at a time (bounds the scan's memory on a 13 GB file)


def line_offsets(path: str | Path) -> np.ndarray:
    """Byte offset of every non-empty line's start, plus the file size at the end (int64)."""
    size = Path(path).stat().st_size
    if size == 0:
        return np.zeros(1, dtype=np.int64)
    data = np.memmap(path, dtype=np.uint8, mode="r")
    ends = [np.flatnonzero(data[s : s + CHUNK] == 10) + s for s in range(0, size, CHUNK)]
    newlines = np.concatenate(ends).astype(np.int64)
    starts = np.concatenate([[0], newlines + 1])
    stops = np.concatenate([newlines, [size]])
    keep = stops > starts  # drops the empty tail after a final newline (and blank lines)
    return np.concatenate([starts[keep], [size]]).astype(np.int64)


def parse_row(row: dict, i: int) -> Passage:
    """One JSONL row as a Passage: Search-R1 ``{"id", "contents"}`` or ``{"id", "title", "text"}``."""
    pid = str(row.get("id", i))
    if isinstance(row.get("contents"), str):
        title, _, text = row["contents"].partition("\n")
        if len(title) >= 2 and title[0] == title[-1] == '"':
            title = title[1:-1]
        return Passage(pid, title, text)
    if isinstance(row.get("text"), str):
        return Passage(pid, str(row.get("title") or ""), row["text"])
    raise ValueError(f"row {i} has neither 'contents' nor 'text': {json.dumps(row)[:80]}")


class JsonlPassages(Sequence[Passage]):
    """The passages of a JSONL corpus, parsed on access (row ``i`` = the ``i``-th non-empty line)."""

    def __init__(self, path: str | Path):
        self.path = Path(path)
        if not self.path.is_file():
            raise FileNotFoundError(
                f"corpus file {self.path} does not exist; pass a JSONL file with one "
                '{"id", "contents": "\\"Title\\"\\ntext"} row per line (Search-R1 wiki-18.jsonl, '
                "or memkit.world.loaders.save_corpus_jsonl's output)"
            )
        self._offsets = line_offsets(self.path)
        self._file = open(self.path, "rb")
        self._map = mmap.mmap(self._file.fileno(), 0, access=mmap.ACCESS_READ) if len(self) else None

    def __len__(self) -> int:
        return len(self._offsets) - 1

    def __getitem__(self, i):
        if isinstance(i, slice):
            return [self[j] for j in range(*i.indices(len(self)))]
        n = len(self)
        i = int(i)
        if not -n <= i < n:
            raise IndexError(f"passage {i} out of range for a corpus of {n}")
        i %= n
        line = self._map[self._offsets[i] : self._offsets[i + 1]]
        try:
            return parse_row(json.loads(line), i)
        except (json.JSONDecodeError, UnicodeDecodeError, AttributeError) as e:
            raise ValueError(f"{self.path}: row {i} is not a JSON object ({e})") from None

    def __iter__(self):
        return (self[i] for i in range(len(self)))

    def __getstate__(self):  # a memory map does not pickle: reopen it in the new process
        return {"path": self.path}

    def __setstate__(self, state):
        self.__init__(state["path"])


def write_passages_jsonl(passages: Iterable[Passage], path: str | Path) -> int:
    """Write ``{"id", "title", "text"}`` rows, streaming (no whole-corpus string); returns the count."""
    n = 0
    with open(path, "w", encoding="utf-8") as f:
        for p in passages:
            f.write(json.dumps({"id": p.id, "title": p.title, "text": p.text}, ensure_ascii=False) + "\n")
            n += 1
    return n


def as_passages(corpus) -> Sequence[Passage]:
    """A list of Passages as it is; a path (str or Path) to a JSONL corpus as :class:`JsonlPassages`."""
    if isinstance(corpus, (str, Path)):
        return JsonlPassages(corpus)
    return corpus
