"""The values the RL knobs take (``TrainConfig``'s ``choices``), in a module that imports nothing:
:mod:`memkit.rl.config` builds its fields from them without torch, so ``memkit train`` parses and
names a bad value in a fraction of a second, and the modules that implement each choice import
the same tuple from here (one definition).
"""

#: packings of training units (:func:`memkit.rl.packing.pack`)
PACKING_MODES = ("separate", "mem1_mask", "mem1_exact")
#: attention paths of a 2D-masked packed forward (:mod:`memkit.rl.block_attention`)
ATTENTION_PATHS = ("auto", "dense", "blocks", "flex")
#: loss aggregations and KL estimators (:mod:`memkit.rl.losses`)
AGG_MODES = ("token-mean", "seq-mean-token-sum", "seq-mean-token-mean")
KL_KINDS = ("k1", "kl", "abs", "k2", "mse", "k3", "low_var_kl")
#: MemPO's memory-reward choices (:mod:`memkit.rl.memory_reward`): what conditions P, the bias
#: subtracted, the answer opener, how the answer is scored, how R_M is normalised (the ``mempo``
#: credit rule), the probes' packing (exact layouts only: the same P either way)
MEM_CONTEXTS = ("question", "call")
MEM_BIASES = ("previous", "call", "none")
MEM_OPENERS = ("think", "answer")
MEM_SCORES = ("joint", "per_slot")
MEM_NORMS = ("pooled", "per_step")
PROBE_PACKINGS = ("separate", "mem1_exact")
#: how MoT-GRPO combines A_intra and A_inter (:mod:`memkit.rl.mot`)
MOT_COMBINES = ("sum", "sequential")
