"""Tool environments the agents act in."""

from memkit.envs.search import RETRIEVERS, SearchEnv, make_retriever

__all__ = ["RETRIEVERS", "SearchEnv", "make_retriever"]
