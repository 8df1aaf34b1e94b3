"""Screens warm-up settings in one process: meshrl's warm-up step (`TrainerCore.train_step` with
policy_loss sft, the rates of `warmup.schedule_for`, batches from `PromptSampler` seeded as the job runner seeds
them) run from a task's initial weights over several data orders, then held-out greedy accuracy of each result
(transformers' greedy decoding of the trained weights, scored by the task's reward; accuracy = share with
reward 1, as the job's evaluation counts it). Seconds per setting instead of a `meshrl run` per order (issue 41:
whether a warm-up default crosses `add`'s transition whatever the order). Used by hand, not by run.py:

  .venv/bin/python bench/vs_trl/warmup_screen.py --task add --orders 0-7 --settings linear,linear_ramp30,constant
  .venv/bin/python bench/vs_trl/warmup_screen.py --task add --set warmup.warmup_ratio=0.1 --set optimizer.adam_beta2=0.98

A setting is a set of `section.field=value` overrides of the warm-up (`warmup.*`: WarmupSection), the actor's
optimizer (`optimizer.*`: OptimizerConfig) or the loss (`loss.aggregation`); `--settings` names ready ones
(SETTINGS), `--set` adds one ad-hoc setting. Prints one JSON line per (setting, order) and a summary per setting.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import numpy as np
import torch

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from bench.vs_trl.budget import Budget  # noqa: E402
from bench.vs_trl.tasks import TASKS, Task, write_task_data  # noqa: E402
from meshrl.common.codec import Ragged  # noqa: E402
from meshrl.scheduler.config.warmup import WarmupSection  # noqa: E402
from meshrl.scheduler.step.job.warmup import call_plan, schedule_for  # noqa: E402
from meshrl.scheduler.step.prompts.data import PromptEncoder, PromptSampler, Record, load_records  # noqa: E402
from meshrl.trainer.core import TrainerCore  # noqa: E402
from meshrl.trainer.losses import LossConfig  # noqa: E402
from meshrl.trainer.optim import OptimizerConfig  # noqa: E402

# The settings screened for issue 41 (bench/vs_trl/README.md). Each names its ramp: the default `warmup_ratio`
# depends on the schedule (WarmupSection.ramp_ratio). "linear" is the default before the ramp (TRL's SFT default).
_NO_RAMP = {"warmup.warmup_ratio": "0"}
SETTINGS: dict[str, dict[str, str]] = {
    "default": {},
    "linear": _NO_RAMP,
    "constant": {"warmup.schedule": "constant", **_NO_RAMP},
    "cosine": {"warmup.schedule": "cosine", **_NO_RAMP},
    **{f"linear_ramp{round(r * 100)}": {"warmup.warmup_ratio": str(r)} for r in (0.03, 0.05, 0.1, 0.2, 0.3, 0.5, 0.7)},
    "linear_ramp10_beta2_0.98": {"warmup.warmup_ratio": "0.1", "optimizer.adam_beta2": "0.98"},
    "cosine_ramp10": {"warmup.schedule": "cosine", "warmup.warmup_ratio": "0.1"},
    "constant_ramp10": {"warmup.schedule": "constant", "warmup.warmup_ratio": "0.1"},
    "constant_ramp30": {"warmup.schedule": "constant", "warmup.warmup_ratio": "0.3"},
    "linear_min10": {"warmup.min_lr": "3e-4", **_NO_RAMP},
    "beta2_0.95": {"optimizer.adam_beta2": "0.95", **_NO_RAMP},
    "beta2_0.98": {"optimizer.adam_beta2": "0.98", **_NO_RAMP},
    "wd_0.1": {"optimizer.weight_decay": "0.1", **_NO_RAMP},
    "clip_0": {"optimizer.clip_grad": "0", **_NO_RAMP},
    "seq_mean": {"loss.aggregation": "seq-mean-token-mean", **_NO_RAMP},
}


def _parse_setting(pairs: dict[str, str], peak: float) -> tuple[WarmupSection, OptimizerConfig, LossConfig]:
    warm: dict[str, object] = {}
    opt: dict[str, object] = {}
    loss: dict[str, object] = {"policy_loss": "sft"}
    for key, value in pairs.items():
        section, _, name = key.partition(".")
        target = {"warmup": warm, "optimizer": opt, "loss": loss}.get(section)
        if target is None or not name:
            raise SystemExit(f"setting {key}={value}: use warmup.<field>, optimizer.<field> or loss.<field>")
        target[name] = value
    if "lr" in warm:
        peak = float(warm.pop("lr"))
    return (
        WarmupSection.model_validate({"lr": peak, **warm}),
        OptimizerConfig.model_validate({"lr": 1e-4, **opt}),
        LossConfig(**{k: (v if k in ("policy_loss", "aggregation") else float(v)) for k, v in loss.items()}),
    )


def _columns(encoder: PromptEncoder, records: list[Record]) -> dict[str, Ragged]:
    targets = [r.response if r.response is not None else r.answer for r in records]
    return {
        "prompt_ids": Ragged.from_rows([encoder.encode_prompt(r.prompt) for r in records], dtype=np.int32),
        "response_ids": Ragged.from_rows([encoder.encode_response(t) for t in targets], dtype=np.int32),
    }


@torch.no_grad()
def greedy_accuracy(hf_model, encoder: PromptEncoder, task: Task, records: list[Record], max_tokens: int):
    """(accuracy, mean reward) of greedy answers; prompts batched by length, so no padding is involved."""
    tok = encoder.tokenizer
    by_len: dict[int, list[int]] = {}
    prompts = [encoder.encode_prompt(r.prompt) for r in records]
    for i, p in enumerate(prompts):
        by_len.setdefault(len(p), []).append(i)
    responses = [""] * len(records)
    for length, rows in by_len.items():
        ids = torch.tensor([prompts[i] for i in rows])
        out = hf_model.generate(
            ids,
            attention_mask=torch.ones_like(ids),
            max_new_tokens=max_tokens,
            do_sample=False,
            eos_token_id=tok.eos_token_id,
            pad_token_id=tok.pad_token_id,
        )
        for i, row in zip(rows, out[:, length:], strict=True):
            responses[i] = encoder.decode([t for t in row.tolist() if t != tok.pad_token_id])
    scores = task.score([r.prompt for r in records], responses, [r.answer for r in records])
    return float(np.mean([s >= 1.0 for s in scores])), float(np.mean(scores))


def run_order(
    model_dir: Path,
    encoder: PromptEncoder,
    records: list[Record],
    warm: WarmupSection,
    opt: OptimizerConfig,
    loss: LossConfig,
    steps: int,
    order: int,
) -> tuple[TrainerCore, list[float], float]:
    """The warm-up of `steps` steps in data order `order` (the job's data.shuffle_seed): (core, losses, seconds)."""
    core = TrainerCore(micro_batch_tokens=4096)
    core.load_model("actor", str(model_dir), optimizer=opt)
    schedule, sampler = schedule_for(warm, steps), PromptSampler(records, order + 1)  # as SupervisedWarmup seeds it
    losses: list[float] = []
    started = time.perf_counter()
    for call in call_plan(warm, steps):
        cols = _columns(encoder, sampler.next_batch(warm.batch_size * len(call)))
        result = core.train_step("actor", cols, loss, step_lrs=[schedule.at(i) for i in call])
        losses += list(result.step_losses)
    return core, losses, time.perf_counter() - started


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--task", required=True, choices=list(TASKS))
    p.add_argument("--orders", default="0-7", help="data orders (shuffle seeds): 0-7 or 0,3,5")
    p.add_argument("--settings", default="default", help=f"comma-separated names of {list(SETTINGS)}")
    p.add_argument("--set", action="append", default=[], help="section.field=value of one ad-hoc setting")
    p.add_argument("--seed", type=int, default=0, help="data and initial-weight seed (run.py's --seeds)")
    p.add_argument("--steps", type=int, default=0, help="warm-up steps (default: the task's sft_steps)")
    p.add_argument("--work", type=Path, default=ROOT / "runs" / "warmup_screen")
    p.add_argument("--out", type=Path, help="append the JSON lines here too")
    args = p.parse_args(argv)
    torch.set_num_threads(1)
    from transformers import AutoModelForCausalLM

    task, b = TASKS[args.task], Budget(seed=args.seed)
    steps = args.steps or task.sft_steps
    work = args.work / f"{task.name}-seed{args.seed}"
    write_task_data(task, work / "data", b.seed, b.n_train, b.n_eval)
    model_dir = b.build_model(work / "model")
    encoder = PromptEncoder(str(model_dir))
    train = load_records(work / "data" / "train.jsonl", "prompt", "answer", "solution")
    heldout = load_records(work / "data" / "eval.jsonl", "prompt", "answer", "solution")
    lo, _, hi = args.orders.partition("-")
    orders = list(range(int(lo), int(hi) + 1)) if hi else [int(x) for x in args.orders.split(",")]
    named = {n: SETTINGS[n] for n in args.settings.split(",") if n}
    if args.set:
        named[" ".join(args.set)] = dict(s.split("=", 1) for s in args.set)
    hf = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    for name, pairs in named.items():
        warm, opt, loss = _parse_setting(pairs, b.sft_lr)
        accs = []
        for order in orders:
            core, losses, seconds = run_order(model_dir, encoder, train, warm, opt, loss, steps, order)
            missing, _ = hf.load_state_dict(dict(core.iter_hf_tensors("actor")), strict=False)
            if [m for m in missing if m != "lm_head.weight"]:
                raise SystemExit(f"weights not exported: {missing}")
            acc, reward = greedy_accuracy(hf, encoder, task, heldout, b.max_tokens)
            accs.append(acc)
            quarter = max(1, steps // 8)
            line = {
                "task": task.name,
                "seed": args.seed,
                "setting": name,
                "order": order,
                "accuracy": acc,
                "reward": reward,
                "loss_every_eighth": [
                    round(float(np.mean(losses[i : i + quarter])), 3) for i in range(0, steps, quarter)
                ],
                "seconds": round(seconds, 1),
            }
            print(json.dumps(line), flush=True)
            if args.out:
                with args.out.open("a") as f:
                    f.write(json.dumps(line) + "\n")
        spread = statistics.pstdev(accs)
        print(
            f"== {task.name} seed {args.seed} {name}: mean {statistics.mean(accs):.3f} sd {spread:.3f} "
            f"min {min(accs):.3f} max {max(accs):.3f} ({' '.join(f'{a:.3f}' for a in accs)})",
            flush=True,
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
