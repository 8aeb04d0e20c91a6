"""Real questions over a real corpus, for the same rollouts, training and metrics as the synthetic world.

MEM1 trains and tests on NQ + HotpotQA over Wikipedia; memkit's lab lives in a synthetic world. A
:class:`~memkit.rl.groups.DataConfig` (``--tasks --corpus --answerable --retriever`` of ``memkit
sft / train / eval / rollout``) swaps the two parts a kit takes from the world, and nothing else:

* the **search env**: the kit's tokenizer is kept and a retriever over a real corpus stands behind
  the search tool (``"offline"``: the 10,033 Wikipedia leads; a wiki-18 style ``.jsonl``; ovos'
  ``summaries_en-us.json``: :func:`memkit.world.load_real_corpus`), ``REAL_K_DOCS`` passages a search;
* the **world**: a :class:`~memkit.world.composite.QuestionSet` of the source's questions
  (:func:`memkit.world.load_real_tasks`: ``"offline"``, a FlashRAG / Search-R1 file or hub id, DPR
  topics, HotpotQA JSON, memkit's ``tasks.jsonl``). ``make_tasks`` composes MEM1's ``k``-question
  tasks (Prompt 1) from it, so ``training_tasks`` (SFT's sft questions, RL's rl ones),
  ``held_out_tasks`` (evaluation's test ones) and the trainer draw real tasks unchanged. With
  ``answerable`` only questions the corpus holds evidence for are kept
  (:func:`memkit.world.answerable`), each with the one-hop decomposition the scripted oracle
  follows; the offline set is answerable already.
"""

from __future__ import annotations

from dataclasses import replace

from memkit.envs import SearchEnv, make_retriever
from memkit.rl.groups import REAL_K_DOCS, DataConfig


def data_kit(kit, data: DataConfig, k_docs: int | None = None):
    """``kit`` with ``data``'s corpus behind its search tool (``k_docs`` passages a search, default
    ``REAL_K_DOCS``) and ``data``'s questions as its world; unchanged parts stay the synthetic world's."""
    data.check()
    if data.corpus:
        kit, _ = real_kit(kit, data.corpus, data.retriever, k_docs or REAL_K_DOCS)
    if data.tasks:
        kit = replace(kit, world=question_set(data.tasks, kit.env.retriever if data.answerable else None))
    return kit


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


def question_set(source: str, retriever=None):
    """The :class:`~memkit.world.composite.QuestionSet` of ``source``'s questions; with a
    ``retriever`` (the corpus's), only those it finds evidence for, with their one-hop decompositions.

    "offline" is one pool split by a hash of the id (sft / rl / test questions); a file or hub split is
    a split already and is used whole (train on a training file, evaluate on a test file)."""
    from memkit.world import answerable, load_real_tasks, question_pool
    from memkit.world.composite import QuestionSet

    pool = question_pool(load_real_tasks(source))
    if retriever is not None:
        pool = answerable(pool, retriever)
    if not pool:
        raise ValueError(f"no usable questions in {source!r}" + (" that the corpus can answer" if retriever else ""))
    return QuestionSet(str(source), tuple(pool), hash_splits=str(source) == "offline")


__all__ = ["REAL_K_DOCS", "data_kit", "question_set", "real_kit"]
