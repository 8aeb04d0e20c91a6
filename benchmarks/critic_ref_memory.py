"""What PPO's shared LoRA critic and full fine-tuning's bf16 reference save, and what the bf16 reference costs.

    python benchmarks/critic_ref_memory.py [--model smollm2-135m] [--device cpu] [--r 16]

* critic: parameter bytes a critic adds to a LoRA policy, as a second adapter on the policy's model
  (``memkit.rl.critic.ValueModel``, the default) against a copied backbone (``share=False``, what every
  LoRA critic was before and what a multi-process run still builds), for LoRA on the attention
  projections and on every linear layer;
* reference: parameter bytes of the KL reference of full fine-tuning in bfloat16 against float32
  (``memkit.models.frozen_copy``, ``RuntimeConfig.ref_dtype``), and how far its log-probs move:
  max and mean |log pi_ref(bf16) - log pi_ref(fp32)| over the tokens of a few plain texts, and the
  k3 KL it gives at the first step (where the policy is the float32 reference).

Figures: docs/findings.md, 'A shared LoRA critic and a bf16 reference'.
"""

from __future__ import annotations

import argparse

import torch

from memkit.models import LORA_TARGETS, LoraSpec, apply_lora, frozen_copy, load_policy
from memkit.rl.critic import ValueModel
from memkit.rl.losses import token_logprobs

TEXTS = [
    "The capital of France is Paris. It lies on the Seine and has about two million inhabitants.",
    "def add(a, b):\n    return a + b\n\nprint(add(2, 3))  # prints 5, the sum of two and three",
]


def nbytes(params) -> int:
    return sum(p.numel() * p.element_size() for p in params)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="smollm2-135m", help="a policy spec (memkit.models.load_policy)")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--r", type=int, default=16, help="LoRA rank (alpha = 2r)")
    args = ap.parse_args()
    for targets in ("attention", "all-linear"):
        model = load_policy(args.model).model.to(args.device)
        model = apply_lora(model, LoraSpec(r=args.r, alpha=2 * args.r, target_modules=LORA_TARGETS[targets]))
        copied = nbytes(ValueModel(model, share=False).parameters())
        shared = nbytes(ValueModel(model).parameters())
        print(
            f"critic, LoRA r={args.r} on {targets}: shared {shared:,} B vs copied {copied:,} B ({copied / shared:.0f}x)"
        )
    policy = load_policy(args.model)
    model, tok = policy.model.to(args.device), policy.tokenizer
    tok.padding_side = "right"
    enc = tok(TEXTS, return_tensors="pt", padding=True).to(args.device)
    ids, mask = enc["input_ids"], enc["attention_mask"]
    ref = frozen_copy(model, torch.bfloat16)
    with torch.no_grad():
        fp32, bf16 = token_logprobs(model, ids, mask), token_logprobs(ref, ids, mask)
    scored = mask.bool() & torch.roll(mask.bool(), 1, 1)  # a token with a real predecessor
    scored[:, 0] = False
    gap = (bf16 - fp32).abs()[scored]
    d = (bf16 - fp32)[scored]  # log pi_ref - log pi at the first step, where pi is the reference's float32 self
    k3 = torch.exp(d) - d - 1  # memkit.rl.losses.kl_penalty's low_var_kl
    print(
        f"reference: bf16 {nbytes(ref.parameters()):,} B vs fp32 {nbytes(model.parameters()):,} B; "
        f"|log-prob gap| max {float(gap.max()):.3e}, mean {float(gap.mean()):.3e} over {int(scored.sum())} tokens "
        f"(mean log-prob {float(fp32[scored].mean()):.2f}); the first step's k3 KL {float(k3.mean()):.2e}"
    )


if __name__ == "__main__":
    main()
