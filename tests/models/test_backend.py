"""The rollout-backend seam (memkit.models.backend): the protocol, and that the Trainer, the
evaluation and LoadedModel roll out through the backend they are given and hand it the new
weights after every update and after a resume.

The test engine keeps its own copy of the weights, as vLLM does, so a missed sync is visible: it
would sample from a stale policy. A backend that ignores sync_weights shows the check can fail."""

from __future__ import annotations

import copy

import pytest
import torch

from memkit.models import HFBackend, RolloutBackend, check_backend
from memkit.rl.config import TrainConfig


def fingerprint(model) -> float:
    """A number that moves with any weight (sum of |w|, float64)."""
    return float(sum(p.detach().double().abs().sum() for p in model.parameters()))


class CopyingBackend:
    """An engine with its own copy of the policy: decodes with memkit's HF loop over the copy, records
    the weights each ``generate`` used, and loads the trained ``state_dict`` on ``sync_weights``
    (unless ``sync=False``: a stale engine)."""

    def __init__(self, model, tokenizer, sync: bool = True):
        self.copy = copy.deepcopy(model).eval()
        self.inner = HFBackend(self.copy, tokenizer)
        self.sync, self.syncs, self.generated_with = sync, 0, []

    def generate(self, prompts, max_new_tokens, stop=(), temperature=1.0, top_p=1.0, generator=None):
        self.generated_with.append(fingerprint(self.copy))
        return self.inner.generate(prompts, max_new_tokens, stop, temperature, top_p, generator)

    def sync_weights(self, model) -> None:
        self.syncs += 1
        if self.sync:
            self.copy.load_state_dict(model.state_dict())


def _cfg(out=None, **over) -> TrainConfig:
    kw = dict(
        algo="ppo",
        method="mem1",
        init="tiny",
        steps=2,
        tasks_per_step=2,
        n_samples=2,
        micro_batch_size=2,
        lr=1e-3,
        entropy_coef=0.01,
        warmup_steps=1,
        eval_every=0,
        max_turns=2,
        objectives=(1,),
        n_train_tasks=64,
        save_every=1,
        keep_checkpoints=1,
        out_dir=str(out) if out else None,
    )
    kw.update(over)
    return TrainConfig.from_flags(**kw)


def _trainer(kit, cfg, backend, seed: int = 0):
    from memkit.lab.policies import fresh_tiny
    from memkit.rl.trainer import Trainer

    loaded = fresh_tiny(kit, seed)
    return Trainer(cfg, loaded.model, loaded.tokenizer, loaded.wrap, kit, backend=backend)


def test_protocol():
    assert isinstance(HFBackend.__new__(HFBackend), RolloutBackend)
    assert isinstance(CopyingBackend.__new__(CopyingBackend), RolloutBackend)
    with pytest.raises(TypeError, match="lacks sync_weights"):
        check_backend(type("GenerateOnly", (), {"generate": lambda self, *a, **k: []})())


def test_hf_backend_sync_points_at_a_new_model(kit):
    from memkit.lab.policies import fresh_tiny

    a, b = fresh_tiny(kit, 0), fresh_tiny(kit, 1)
    backend = a.backend()
    assert backend.model is a.model
    backend.sync_weights(a.model)  # the same model: nothing to do
    assert backend.model is a.model
    backend.sync_weights(b.model)
    assert backend.model is b.model


@pytest.mark.parametrize("sync", [True, False])
def test_trainer_rolls_out_through_its_backend_with_the_updated_weights(kit, sync):
    """Every step's rollouts come from the engine; after step 1's update the engine holds the new
    weights, so step 2 samples from them. A stale engine (no sync) still samples from step 0's."""
    built = []

    def factory(model, tokenizer):
        built.append(CopyingBackend(model, tokenizer, sync=sync))
        return built[-1]

    t = _trainer(kit, _cfg(), factory)
    start = fingerprint(t.policy)
    t.train_step()
    after_1 = fingerprint(t.policy)
    assert len(built) == 1 and built[0].syncs == 1 and built[0].generated_with
    assert abs(after_1 - start) > 1e-3  # the update moved the policy
    n = len(built[0].generated_with)
    t.train_step()
    assert len(built) == 1 and built[0].syncs == 2  # one engine, synced after each update
    used = built[0].generated_with[n]  # the weights step 2's first rollout call decoded with
    if sync:
        assert used == pytest.approx(after_1, abs=0) and fingerprint(built[0].copy) == fingerprint(t.policy)
    else:
        assert used == pytest.approx(start, abs=0) and used != after_1


def test_resume_hands_the_loaded_weights_to_the_backend(kit, tmp_path):
    first = _trainer(kit, _cfg(tmp_path / "run", steps=1), CopyingBackend)
    first.train_step()
    saved = fingerprint(first.policy)
    other = _trainer(kit, _cfg(tmp_path / "run", steps=1), CopyingBackend, seed=7)
    engine = other.backend  # built before the resume, over seed 7's weights
    assert fingerprint(engine.copy) != pytest.approx(saved)
    other.resume()
    assert fingerprint(other.policy) == pytest.approx(saved, rel=1e-12)
    assert fingerprint(engine.copy) == pytest.approx(saved, rel=1e-12) and engine.syncs == 1


def test_evaluation_and_loaded_model_use_the_given_backend(kit):
    from memkit.lab.evaluation import evaluate, rollout
    from memkit.lab.policies import fresh_tiny
    from memkit.world import make_tasks

    built = []

    def factory(model, tokenizer):
        built.append(CopyingBackend(model, tokenizer))
        return built[-1]

    tasks = make_tasks(kit.world, n=2, k=1, seed=3)
    trajs = rollout("mem1", tasks, kit, policy="tiny", backend=factory, max_turns=2)
    assert len(trajs) == 2 and len(built) == 1 and built[0].generated_with
    evaluate("mem1", kit, objectives=(1,), n_tasks=2, policy="tiny", backend=factory, max_turns=2)
    assert len(built) == 2 and built[1].generated_with  # one engine for the whole evaluation
    loaded = fresh_tiny(kit, 0)
    loaded.backend_factory = factory
    engine = loaded.backend()
    assert engine is built[-1] and loaded.backend() is engine  # built once
    with torch.no_grad():
        next(loaded.model.parameters()).add_(1.0)  # trained in place
    assert fingerprint(engine.copy) != pytest.approx(fingerprint(loaded.model))
    loaded.sync_backend()
    assert fingerprint(engine.copy) == pytest.approx(fingerprint(loaded.model))


def test_compare_engines_on_the_same_tasks(kit, one_thread):
    """Two engines over one policy (the HF loop, and an engine with its own copy of the weights): the same
    greedy trajectories, both recording the policy's log-probs; an engine whose copy drifted records
    another policy's, so both checks can fail."""
    import functools

    from memkit.lab.evaluation import compare_engines, same_ids
    from memkit.world import make_tasks

    def drifted(model, tokenizer, scale):
        engine = CopyingBackend(model, tokenizer)
        with torch.no_grad():
            for p in engine.copy.parameters():
                p.add_(torch.randn(p.shape, generator=torch.Generator().manual_seed(p.numel())) * scale)
        return engine

    tasks = make_tasks(kit.world, n=4, k=1, seed=3)
    engines = {"hf": None, "copy": CopyingBackend, "drifted": functools.partial(drifted, scale=0.5)}
    runs = compare_engines("mem1", tasks, kit, "tiny", engines, seed=5, max_turns=2)
    hf, same, off = runs["hf"], runs["copy"], runs["drifted"]
    assert [len(r.greedy) for r in runs.values()] == [len(r.sampled) for r in runs.values()] == [4, 4, 4]
    assert same_ids(hf.greedy, same.greedy) == 4 and same_ids(hf.sampled, same.sampled) == 4  # one sampler
    assert hf.logprob_gap <= 1e-4 and same.logprob_gap <= 1e-4
    assert same_ids(hf.greedy, off.greedy) < 4 and off.logprob_gap > 1e-2
    for r in runs.values():
        assert r.tokens == sum(len(c.output_ids) for t in r.greedy + r.sampled for c in t.calls) > 0
        assert r.generate_seconds > 0 and r.tokens_per_second > 0 and r.start_seconds >= 0
    with pytest.raises(ValueError, match="same tasks"):
        same_ids(hf.greedy, same.greedy[:2])
    with pytest.raises(ValueError, match="model policy"):
        compare_engines("mem1", tasks, kit, "oracle", engines)
