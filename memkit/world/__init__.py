"""Worlds and tasks: the synthetic generator and its vocabulary, the shared task schema, and file IO/loaders.

Typical use::

    from memkit.world import make_world, make_tasks, save_tasks_jsonl
    world = make_world(seed=0)
    tasks = make_tasks(world, n=200, k=2, seed=0)   # MEM1 2-objective tasks
    convs = make_conversations(world, 4, size="full")  # Mem-T's conversation streams (LoCoMo schema)

Real questions (MEM1 §3.3 on NQ / TriviaQA / HotpotQA), in the same task schema::

    tasks = load_real_tasks("offline", k=2, n=100, question_split="test")  # no network: NQ + TriviaQA
    tasks = load_real_tasks("PeterJinGo/nq_hotpotqa_train", split="train", k=2, n=1000)  # MEM1's pool
    corpus = load_real_corpus("offline")  # 10,033 Wikipedia leads; iter_corpus_jsonl streams wiki-18
"""

from memkit.world.composite import compose_multi_objective, question_pool
from memkit.world.conversation import CATEGORIES, Conversation, ConvQA, Session, Turn
from memkit.world.generator import KINDS, Entity, World, aliases, make_questions, make_tasks, make_world
from memkit.world.loaders import (
    load_dpr_topics,
    load_hotpotqa_json,
    load_tasks_jsonl,
    load_wiki_summaries,
    save_corpus_jsonl,
    save_tasks_jsonl,
    tasks_from_dataset,
    tasks_to_dataset,
    world_texts,
)
from memkit.world.locomo import load_locomo, save_locomo
from memkit.world.offline import OfflineSet, answerable, find_evidence, offline_real_set
from memkit.world.qa_sets import (
    FLASHRAG_CONFIGS,
    iter_corpus_jsonl,
    load_flashrag_jsonl,
    load_qa,
    load_real_corpus,
    load_real_tasks,
)
from memkit.world.schema import MULTI_OBJECTIVE_TEMPLATE, Passage, Question, SubQuestion, Task, compose_prompt
from memkit.world.splits import SPLITS, question_split
from memkit.world.streams import SIZES, make_conversation, make_conversations
from memkit.world.task_sets import EVAL_SEEDS, held_out_tasks, training_seed, training_tasks
from memkit.world.vocab import ATTRS, TYPES, Attr

__all__ = [
    "ATTRS",
    "KINDS",
    "SPLITS",
    "TYPES",
    "Attr",
    "Entity",
    "World",
    "aliases",
    "make_questions",
    "make_tasks",
    "make_world",
    "question_split",
    "load_dpr_topics",
    "load_flashrag_jsonl",
    "load_hotpotqa_json",
    "load_tasks_jsonl",
    "load_wiki_summaries",
    "save_corpus_jsonl",
    "save_tasks_jsonl",
    "tasks_from_dataset",
    "tasks_to_dataset",
    "world_texts",
    "FLASHRAG_CONFIGS",
    "iter_corpus_jsonl",
    "load_qa",
    "load_real_corpus",
    "load_real_tasks",
    "compose_multi_objective",
    "question_pool",
    "OfflineSet",
    "answerable",
    "find_evidence",
    "offline_real_set",
    "MULTI_OBJECTIVE_TEMPLATE",
    "Passage",
    "Question",
    "SubQuestion",
    "Task",
    "compose_prompt",
    "EVAL_SEEDS",
    "held_out_tasks",
    "training_seed",
    "training_tasks",
    "CATEGORIES",
    "Conversation",
    "ConvQA",
    "Session",
    "Turn",
    "load_locomo",
    "save_locomo",
    "SIZES",
    "make_conversation",
    "make_conversations",
]
