"""``memkit rollout``: roll out a method with a policy and write JSONL traces."""

from __future__ import annotations

from memkit.cli.args import methods, positive
from memkit.cli.world import add_common

HELP = "roll out a method and write JSONL traces"


def add_arguments(sp) -> None:
    from memkit.agents import QA_METHODS

    add_common(sp, world_seed=False)
    sp.add_argument("--method", type=lambda s: methods(s, streams=False)[0], required=True, help=", ".join(QA_METHODS))
    add_policy(sp)
    sp.add_argument("--n", type=int, default=1, help="trajectories per task (group size)")
    sp.add_argument("--temperature", type=float, default=1.0)
    sp.add_argument("--out", default="traces.jsonl")
    add_context_options(sp)
    add_real_data(sp)


def add_real_data(sp) -> None:
    """``--world-seed --tasks --corpus --answerable --retriever``: the synthetic world or real questions over
    a real corpus, the fields of :class:`memkit.rl.groups.DataConfig` (``memkit sft`` and ``train`` take the
    same); here ``--tasks`` also reads ``memkit world``'s tasks.jsonl, whose tasks are kept as written."""
    from memkit.cli.args import add_config_flags
    from memkit.rl.groups import DataConfig

    add_config_flags(sp.add_argument_group("real data (memkit.lab.real)"), DataConfig)


def data_config(args):
    """The checked :class:`memkit.rl.groups.DataConfig` of ``--tasks --corpus --answerable --retriever``."""
    from memkit.cli.args import config_from_args
    from memkit.rl.groups import DataConfig

    return config_from_args(DataConfig, args).check()


def kit_and_tasks(args, kit, data):
    """``(kit, own tasks or None)``: ``kit`` with ``data``'s corpus behind its search tool and its
    questions as its world (:func:`memkit.lab.real.data_kit`: the caller's ``held_out_tasks`` /
    ``make_tasks`` compose them); a ``memkit world`` tasks.jsonl is kept as written instead: its
    tasks, read once, are returned."""
    from dataclasses import replace

    from memkit.lab.real import data_kit

    own = memkit_task_file(data.tasks) if data.tasks else None
    kit = data_kit(kit, data if own is None else replace(data, tasks=None), args.k_docs)
    return kit, own


def memkit_task_file(source: str):
    """The tasks of a ``memkit world`` tasks.jsonl (``{"id", "questions", "prompt"}`` lines) as written;
    None for any other source (questions to compose into MEM1 tasks)."""
    from memkit.world import load_tasks_jsonl
    from memkit.world.qa_sets import is_task_file

    return load_tasks_jsonl(source) if is_task_file(source) else None


#: the policy specs :func:`memkit.lab.policies.resolve_policy` reads (the ``--policy`` help lists them)
POLICY_SPECS = (
    "oracle",
    "tiny",
    "tiny-sft",
    "tiny-sft:<tag>",
    "smollm2-135m",
    "<local checkpoint dir or memkit train run dir>",
    "<HF model id>",
)


def add_policy(sp) -> None:
    sp.add_argument("--policy", default="oracle", help="policy: " + ", ".join(POLICY_SPECS))


def add_context_options(sp) -> None:
    """``--prompt``, ``--k-docs``, ``--min-new-tokens``: the context and output budget a policy is rolled
    out with; ``--device``, ``--dtype``: where its model runs."""
    from memkit.agents.base import PROMPTS

    sp.add_argument(
        "--prompt",
        choices=PROMPTS,
        default="auto",
        help="paper = the paper's instruction, compact = the tiny model's one-line prompt; "
        "auto = compact for tiny models, paper otherwise",
    )
    sp.add_argument(
        "--k-docs",
        type=positive,
        default=None,
        help="passages per search (default: what the model was SFT'd with, e.g. 1 for tiny-sft; else 3)",
    )
    sp.add_argument(
        "--min-new-tokens",
        type=int,
        default=None,
        help="every call may write at least this many tokens (default: the format's budget for tiny "
        "models, 512 for a pretrained chat model)",
    )
    sp.add_argument(
        "--device",
        choices=("auto", "cpu", "cuda"),
        default="auto",
        help="where a model policy runs (auto = cuda when present)",
    )
    sp.add_argument(
        "--dtype",
        choices=("auto", "float32", "bfloat16"),
        default="auto",
        help="parameter dtype of a model policy (auto = bfloat16 on a GPU, float32 on the CPU)",
    )


def placed_policy(args, method: str, kit):
    """``args.policy`` loaded once (a model spec) on ``--device`` in ``--dtype``; "oracle" unchanged."""
    import torch

    from memkit.lab.policies import load_spec

    policy = load_spec(args.policy, method, kit, args.seed)
    if isinstance(policy, str):
        return policy
    device = args.device if args.device != "auto" else "cuda" if torch.cuda.is_available() else "cpu"
    dtype = args.dtype if args.dtype != "auto" else "bfloat16" if device == "cuda" else "float32"
    policy.model.to(device=device, dtype=getattr(torch, dtype))
    return policy


def run(args) -> int:
    from memkit.core.trajectory import save_jsonl
    from memkit.lab.evaluation import rollout
    from memkit.lab.kit import load_kit
    from memkit.world import make_tasks

    data = data_config(args)  # a bad combination is named before the world loads
    kit, own = kit_and_tasks(args, load_kit(args.world_seed, retriever=args.retriever), data)
    if own is not None:  # memkit world's tasks.jsonl: every task of the file, whatever its k
        tasks = own
    else:
        tasks = make_tasks(kit.world, n=args.n_tasks, k=args.objectives[0], seed=args.seed)
    trajs = rollout(
        args.method,
        tasks,
        kit,
        policy=placed_policy(args, args.method, kit),
        n=args.n,
        temperature=args.temperature,
        seed=args.seed,
        progress=True,
        prompt=args.prompt,
        k_docs=args.k_docs,
        min_new_tokens=args.min_new_tokens,
    )
    save_jsonl(trajs, args.out)
    ok = sum(t.valid for t in trajs)
    print(f"wrote {len(trajs)} trajectories ({ok} valid) to {args.out}")
    return 0
