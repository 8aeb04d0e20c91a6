"""Layer 5, assembly: the kit (world + tokenizer, :mod:`memkit.lab.kit`), the policy specs and
their caches (:mod:`memkit.lab.policies`), rollouts scored as tables (:mod:`memkit.lab.evaluation`),
SFT/RL runs from a spec (:mod:`memkit.lab.runs`), the RL lab's recipes the notebooks and
``memkit reproduce`` share (:mod:`memkit.lab.recipes`), and Mem-T's lab (:mod:`memkit.lab.memt`)."""
