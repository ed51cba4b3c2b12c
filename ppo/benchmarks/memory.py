"""Memory of LoRA against full fine-tuning: peak RSS and the bytes of training state.

Each variant runs a few GRPO steps on a randomly initialised Llama of the chosen size (the
testbed's tokenizer and arithmetic prompts) in its own process, so peak resident memory
(``ru_maxrss``) is that variant's alone. Next to it, the training state is counted tensor
by tensor: policy weights, a reference copy, gradients and AdamW's moments. On a GPU the
CUDA allocator's peak is reported too.

    python -m ppo.benchmarks memory [--hidden 512 --layers 8] [--steps 2] [--lora-r 8]
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import tempfile
from pathlib import Path

import torch


def _tensor_bytes(tensors) -> int:
    seen, total = set(), 0
    for tensor in tensors:
        if tensor is None or tensor.data_ptr() in seen:
            continue
        seen.add(tensor.data_ptr())
        total += tensor.numel() * tensor.element_size()
    return total


def state_bytes(models) -> dict[str, int]:
    """Bytes held by the policy, the reference, the gradients and the optimizer state of a
    run's `models` (`ppo.models.setup.Models`)."""
    from ppo.models.lora import AdapterDisabledReference

    policy = models.policy_module
    reference = models.ref_policy
    optimizer_state = [value for optimizer in models.optimizers.all()
                       for state in optimizer.state.values() for value in state.values()
                       if torch.is_tensor(value) and value.dim() > 0]
    trainable = [p for p in policy.parameters() if p.requires_grad]
    return {
        "policy_weights": _tensor_bytes(policy.parameters()),
        "reference_weights": 0 if reference is None or isinstance(reference, AdapterDisabledReference)
        else _tensor_bytes(reference.parameters()),
        "gradients": _tensor_bytes(trainable),  # one fp32 gradient per trainable weight during the update
        "optimizer_state": _tensor_bytes(optimizer_state),
        "trainable_parameters": sum(p.numel() for p in trainable),
        "parameters": sum(p.numel() for p in policy.parameters()),
    }


def child(spec: dict) -> dict:
    """One variant in this process: build, train `steps` steps, measure."""
    from ppo.config import preset
    from ppo.trainer import RLTrainer

    torch.set_num_threads(spec["threads"])
    config = preset("grpo", testbed=True, model_path=spec["model_dir"], output_dir=spec["output_dir"],
                    rollout_batch_size=spec["batch"], group_size=4, response_length=spec["response_length"],
                    total_steps=spec["steps"], progress=False, threads=spec["threads"], lora_r=spec["lora_r"],
                    lr=1e-3 if spec["lora_r"] else 1e-4)
    trainer = RLTrainer(config)
    if torch.cuda.is_available():
        torch.cuda.reset_peak_memory_stats()
    for _ in range(spec["steps"]):
        trainer.train_step()
    result = {"lora_r": spec["lora_r"], **state_bytes(trainer.models),
              "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}
    if torch.cuda.is_available():
        result["peak_cuda_mb"] = torch.cuda.max_memory_allocated() / 2**20
    return result


def build_model(path: Path, hidden: int, layers: int) -> Path:
    from ppo.models.tiny_model import TinyModelConfig, build_char_tokenizer, build_tiny_model

    tokenizer = build_char_tokenizer()
    torch.manual_seed(0)
    model = build_tiny_model(TinyModelConfig(hidden_size=hidden, num_layers=layers, num_heads=max(1, hidden // 64),
                                             intermediate_size=hidden * 8 // 3), tokenizer)
    model.save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path


def compare(hidden: int = 512, layers: int = 8, steps: int = 2, lora_r: int = 8, threads: int = 2,
            batch: int = 16, response_length: int = 32) -> list[dict]:
    with tempfile.TemporaryDirectory() as tmp:
        model_dir = build_model(Path(tmp) / "model", hidden, layers)
        results = []
        for rank in (0, lora_r):
            spec = dict(model_dir=str(model_dir), output_dir=str(Path(tmp) / f"run_r{rank}"), steps=steps,
                        lora_r=rank, threads=threads, batch=batch, response_length=response_length)
            done = subprocess.run([sys.executable, "-m", "ppo.benchmarks", "memory", "--child", json.dumps(spec)],
                                  capture_output=True, text=True, check=True)
            results.append(json.loads(done.stdout.strip().splitlines()[-1]))
    return results


def format_table(results: list[dict]) -> str:
    mb = 2**20
    rows = ["| variant | trainable params | policy MB | reference MB | gradients MB | Adam state MB | state total MB "
            "| peak RSS MB |", "|---|---|---|---|---|---|---|---|"]
    for r in results:
        total = r["policy_weights"] + r["reference_weights"] + r["gradients"] + r["optimizer_state"]
        name = f"LoRA r={r['lora_r']}" if r["lora_r"] else "full fine-tuning"
        rows.append(f"| {name} | {r['trainable_parameters']:,} of {r['parameters']:,} | {r['policy_weights'] / mb:.1f} "
                    f"| {r['reference_weights'] / mb:.1f} | {r['gradients'] / mb:.1f} | {r['optimizer_state'] / mb:.1f} "
                    f"| {total / mb:.1f} | {r['peak_rss_mb']:.0f} |")
    return "\n".join(rows)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m ppo.benchmarks memory", description=__doc__.split("\n\n")[0])
    parser.add_argument("--hidden", type=int, default=512)
    parser.add_argument("--layers", type=int, default=8)
    parser.add_argument("--steps", type=int, default=2)
    parser.add_argument("--lora-r", type=int, default=8)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        print(json.dumps(child(json.loads(args.child))))
        return 0
    print(format_table(compare(args.hidden, args.layers, args.steps, args.lora_r, args.threads)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
