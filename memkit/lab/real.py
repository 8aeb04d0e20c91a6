"""Real questions over a real corpus, for the same rollouts and metrics as the synthetic world.

MEM1 trains and tests on NQ + HotpotQA over Wikipedia; memkit's lab lives in a synthetic world. This
module swaps the two parts a rollout takes from the world, and nothing else:

* the **search env**: :func:`real_kit` keeps the kit's tokenizer and puts a retriever over a real
  corpus behind the search tool (``"offline"``: the 10,033 Wikipedia leads; a wiki-18 style
  ``.jsonl``; ovos' ``summaries_en-us.json``: :func:`memkit.world.load_real_corpus`);
* the **tasks**: :func:`real_task_sets` reads questions from any source
  :func:`memkit.world.load_real_tasks` reads (``"offline"``, a FlashRAG / Search-R1 file or hub id,
  DPR topics, HotpotQA JSON, memkit's ``tasks.jsonl``) and composes MEM1's ``k``-question tasks
  (Prompt 1) at each ``k``. With ``answerable=True`` only questions the corpus holds evidence for
  are kept (:func:`memkit.world.answerable`), each with the one-hop decomposition the scripted
  teacher follows; the offline set is answerable already.

``memkit eval --tasks ... --corpus ...`` and ``memkit rollout --tasks ... --corpus ...`` call these.
"""

from __future__ import annotations

from dataclasses import replace

from memkit.envs import SearchEnv, make_retriever

#: passages per search on a real corpus: the answerable filter's own top k (memkit.world.offline), so
#: a kept question's evidence is in the first search's observation
REAL_K_DOCS = 5


def real_kit(kit, corpus: str, retriever: str = "bm25", k_docs: int = REAL_K_DOCS):
    """``kit`` with its search env over the passages of ``corpus`` (any source of
    :func:`memkit.world.load_real_corpus`), ``k_docs`` passages per search; the tokenizer is kept.
    Returns ``(kit, passages)``."""
    from memkit.world import load_real_corpus

    passages = load_real_corpus(corpus)
    if not passages:
        raise ValueError(
            f"corpus {corpus!r} holds no passages; give a wiki-18 style .jsonl, a .json of leads or 'offline'"
        )
    env = SearchEnv(make_retriever(retriever, passages), k=k_docs)
    return replace(kit, env=env, _envs_by_k={}), passages


def real_task_sets(
    source: str,
    objectives,
    n_tasks: int,
    seed: int = 0,
    retriever=None,
    answerable: bool = False,
    question_split: str | None = "auto",
) -> dict[int, list]:
    """``{k: tasks}``: ``n_tasks`` MEM1 composites of ``k`` questions of ``source`` for each ``k``
    (:func:`memkit.world.compose_multi_objective`, seeded by ``seed + k``).

    ``answerable``: keep the questions ``retriever`` (the corpus's) finds evidence for, with their
    one-hop decompositions. ``question_split``: the questions the tasks draw
    (:func:`memkit.world.question_split`); "auto" = "test" for the offline set (its other questions
    are SFT's and RL's) and all of them for a file or hub split (held out by its own split)."""
    from memkit.world import answerable as keep_answerable, compose_multi_objective, load_real_tasks, question_pool

    if question_split == "auto":
        question_split = "test" if str(source) == "offline" else None
    pool = question_pool(load_real_tasks(source))
    if answerable:
        if retriever is None:
            raise ValueError("answerable=True needs the corpus's retriever (real_kit(...)[0].env.retriever)")
        pool = keep_answerable(pool, retriever)
    if not pool:
        raise ValueError(f"no usable questions in {source!r}" + (" that the corpus can answer" if answerable else ""))
    return {k: compose_multi_objective(pool, n_tasks, k, seed=seed + k, split=question_split) for k in objectives}


__all__ = ["REAL_K_DOCS", "real_kit", "real_task_sets"]
