"""The agents tests' world and search environment: the synthetic world of seed 0, BM25 top 3."""

from __future__ import annotations

import pytest

from memkit.envs import SearchEnv, make_retriever
from memkit.world import make_world


@pytest.fixture(scope="module")
def world():
    return make_world(seed=0)


@pytest.fixture(scope="module")
def env(world):
    return SearchEnv(make_retriever("bm25", world.passages), k=3)
