"""Mem-T's lab (notebook 06): streaming evaluation on conversations
(:mod:`memkit.lab.memt.evaluation`), the retrieval clone and its MoT-GRPO recipe
(:mod:`memkit.lab.memt.retrieval`), and the construction clone taught by hindsight SFT
(:mod:`memkit.lab.memt.construction`)."""
