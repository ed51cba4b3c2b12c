"""Behaviour unchanged by a refactor: every testbed preset's first steps, bit for bit.

Not a test module: a script kept for restructurings, run by hand (a few minutes on 2 cores).
For each preset in `ppo.presets.PRESETS` it builds the testbed run (`preset(name,
testbed=True)`, the committed warm start), takes `STEPS` training steps and records every
logged metric except wall-clock times, plus a SHA-256 of the policy's and the critic's
weights after the last step. Two records are equal only if every float is bit-identical.

    python tests/bit_identity.py check --against HEAD~3     # this tree against a commit
    python tests/bit_identity.py record out.json [--root DIR]   # one side only

``check`` records the commit in a temporary ``git worktree`` (this script runs there with
that tree first on ``sys.path``, so the commit need not contain the script), records the
working tree, and prints every preset, metric or digest that differs; exit status 1 if any
does. It uses only the public entry points (`ppo.config.preset`, `ppo.trainer.RLTrainer`,
``train_step``, ``policy`` and ``value_model``), which every layout keeps.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import subprocess
import sys
import tempfile
from pathlib import Path

STEPS = 3
ROOT = Path(__file__).resolve().parents[1]


def weights_digest(*models) -> str:
    """SHA-256 over the named tensors of the models (None skipped), in name order."""
    import torch

    digest = hashlib.sha256()
    for index, model in enumerate(models):
        if model is None:
            continue
        for name, tensor in sorted(model.state_dict().items()):
            digest.update(f"{index}.{name}".encode())
            digest.update(tensor.detach().cpu().contiguous().view(-1).view(torch.uint8).numpy().tobytes())
    return digest.hexdigest()


def record(root: Path) -> dict:
    """Each preset's `STEPS` metrics (wall-clock keys dropped) and final weights digest."""
    sys.path.insert(0, str(root))
    from ppo.config import preset
    from ppo.presets import PRESETS
    from ppo.trainer import RLTrainer

    out = {}
    with tempfile.TemporaryDirectory() as tmp:
        for name in PRESETS:
            config = preset(name, testbed=True, total_steps=STEPS, eval_every=0, save_every=0, progress=False,
                            threads=1, output_dir=str(Path(tmp) / name))
            trainer = RLTrainer(config)
            steps = []
            for _ in range(STEPS):
                metrics = trainer.train_step()
                steps.append({k: v for k, v in sorted(metrics.items()) if not k.startswith("time_")})
            out[name] = {"steps": steps, "weights": weights_digest(trainer.policy, trainer.value_model)}
            print(f"{name}: {STEPS} steps, weights {out[name]['weights'][:12]}", file=sys.stderr, flush=True)
    return out


def differences(before: dict, after: dict) -> list[str]:
    """Every preset, step metric or digest that is not bit-identical (NaN equals NaN)."""
    lines = []
    for name in sorted(set(before) | set(after)):
        if name not in before or name not in after:
            lines.append(f"{name}: only {'after' if name in after else 'before'}")
            continue
        a, b = before[name], after[name]
        if a["weights"] != b["weights"]:
            lines.append(f"{name}: weights differ after {STEPS} steps")
        for step, (x, y) in enumerate(zip(a["steps"], b["steps"]), start=1):
            for key in sorted(set(x) | set(y)):
                if json.dumps(x.get(key, "<missing>")) != json.dumps(y.get(key, "<missing>")):
                    lines.append(f"{name} step {step} {key}: {x.get(key, '<missing>')} -> {y.get(key, '<missing>')}")
    return lines


def record_commit(commit: str) -> dict:
    """`record` run in a temporary worktree of `commit`, in its own process."""
    with tempfile.TemporaryDirectory() as tmp:
        tree, out = Path(tmp) / "tree", Path(tmp) / "record.json"
        subprocess.run(["git", "worktree", "add", "--detach", "--quiet", str(tree), commit], cwd=ROOT, check=True)
        try:
            subprocess.run([sys.executable, str(Path(__file__).resolve()), "record", str(out), "--root", str(tree)],
                           cwd=tree, check=True)
            return json.loads(out.read_text())
        finally:
            subprocess.run(["git", "worktree", "remove", "--force", str(tree)], cwd=ROOT, check=False)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    commands = parser.add_subparsers(dest="command", required=True)
    rec = commands.add_parser("record", help="record one tree's first steps into a JSON file")
    rec.add_argument("out", type=Path)
    rec.add_argument("--root", type=Path, default=ROOT, help="the tree to import the project from")
    chk = commands.add_parser("check", help="compare this tree with a commit")
    chk.add_argument("--against", required=True, help="a commit (hash, branch, HEAD~N)")
    args = parser.parse_args(argv)
    if args.command == "record":
        args.out.write_text(json.dumps(record(args.root.resolve()), indent=1, sort_keys=True))
        return 0
    before = record_commit(args.against)
    with tempfile.TemporaryDirectory() as tmp:  # in its own process too, like the commit's side
        out = Path(tmp) / "record.json"
        subprocess.run([sys.executable, str(Path(__file__).resolve()), "record", str(out)], cwd=ROOT, check=True)
        after = json.loads(out.read_text())
    lines = differences(before, after)
    for line in lines:
        print(line)
    print(f"{len(before)} presets x {STEPS} steps against {args.against}: "
          + ("bit-identical" if not lines else f"{len(lines)} differences"))
    return 1 if lines else 0


if __name__ == "__main__":
    sys.exit(main())
