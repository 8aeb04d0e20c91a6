"""``memkit rollout``: roll out a method with a policy and write JSONL traces."""
from __future__ import annotations

from memkit.cli.args import methods, positive
from memkit.cli.world import add_common

HELP = "roll out a method and write JSONL traces"


def add_arguments(sp) -> None:
    from memkit.agents import METHODS

    add_common(sp)
    sp.add_argument("--method", type=lambda s: methods(s, streams=False)[0], required=True, help=", ".join(METHODS))
    add_policy(sp)
    sp.add_argument("--tasks", help="a tasks JSONL (from `memkit world`) instead of generated tasks")
    sp.add_argument("--n", type=int, default=1, help="trajectories per task (group size)")
    sp.add_argument("--temperature", type=float, default=1.0)
    sp.add_argument("--retriever", default="bm25", help="bm25 or dense")
    sp.add_argument("--out", default="traces.jsonl")
    add_context_options(sp)


#: the policy specs :func:`memkit.lab.policies.resolve_policy` reads (the ``--policy`` help lists them)
POLICY_SPECS = ("oracle", "tiny", "tiny-sft", "tiny-sft:<tag>", "smollm2-135m",
                "<local checkpoint dir or memkit train run dir>", "<HF model id>")


def add_policy(sp) -> None:
    sp.add_argument("--policy", default="oracle", help="policy: " + ", ".join(POLICY_SPECS))


def add_context_options(sp) -> None:
    """``--prompt`` and ``--k-docs``: the context a policy is rolled out with."""
    from memkit.agents.base import PROMPTS

    sp.add_argument("--prompt", choices=PROMPTS, default="auto",
                    help="paper = the paper's instruction, compact = the tiny model's one-line prompt; "
                         "auto = compact for tiny models, paper otherwise")
    sp.add_argument("--k-docs", type=positive, default=None,
                    help="passages per search (default: what the model was SFT'd with, e.g. 1 for tiny-sft; "
                         "else 3)")


def run(args) -> int:
    from memkit.core.trajectory import save_jsonl
    from memkit.lab.evaluation import rollout
    from memkit.lab.kit import load_kit
    from memkit.world import load_tasks_jsonl, make_tasks

    kit = load_kit(args.world_seed, retriever=args.retriever)
    tasks = load_tasks_jsonl(args.tasks) if args.tasks else make_tasks(kit.world, n=args.n_tasks, k=args.objectives[0], seed=args.seed)
    trajs = rollout(args.method, tasks, kit, policy=args.policy, n=args.n, temperature=args.temperature, seed=args.seed,
                    progress=True, prompt=args.prompt, k_docs=args.k_docs)
    save_jsonl(trajs, args.out)
    ok = sum(t.valid for t in trajs)
    print(f"wrote {len(trajs)} trajectories ({ok} valid) to {args.out}")
    return 0
