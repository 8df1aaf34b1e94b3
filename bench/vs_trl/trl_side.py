"""TRL's side of the harness: `SFTTrainer` then `GRPOTrainer` on the same model folder, data and budget as
meshrl, with only model, data, reward, steps, batch and peak learning rates given, everything else TRL's
defaults except precision (fp32 and no gradient checkpointing, like meshrl's side) (AdamW, linear decay to 0, completion-only loss with the end-of-sequence token appended, GRPO with
group-scaled rewards, `dapo` token normalisation, no KL). A callback evaluates held-out greedy accuracy and mean reward with
`transformers.generate` every K steps; its time is excluded from the curve's seconds. Needs `make setup-trl`.
Called by bench/vs_trl/run.py.
"""

from __future__ import annotations

import logging
import time
from pathlib import Path

import torch
from datasets import Dataset
from transformers import AutoModelForCausalLM, AutoTokenizer, TrainerCallback
from trl import GRPOConfig, GRPOTrainer, SFTConfig, SFTTrainer

from bench.vs_trl.budget import Budget, Curve
from bench.vs_trl.tasks import Task, trl_reward
from meshrl.scheduler.step.prompts.data import load_records


def templated(tokenizer, prompt: str) -> str:
    """The prompt as meshrl sends it: the model's chat template with the generation prompt."""
    messages = [{"role": "user", "content": prompt}]
    return tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)


class HeldoutEval(TrainerCallback):
    """Greedy accuracy on the held-out prompts at step 0, every `every` steps and at the end."""

    def __init__(self, task: Task, tokenizer, data: Path, b: Budget, every: int, samples_per_step: int, curve: Curve):
        self.task, self.every, self.per_step, self.curve, self.max_tokens = (
            task,
            every,
            samples_per_step,
            curve,
            b.max_tokens,
        )
        self.tok = AutoTokenizer.from_pretrained(tokenizer.name_or_path, padding_side="left")
        records = load_records(data / "eval.jsonl", "prompt", "answer")[: b.n_eval]
        self.prompts = [r.prompt for r in records]
        self.answers = [r.answer for r in records]
        self.inputs = self.tok([templated(self.tok, p) for p in self.prompts], return_tensors="pt", padding=True)
        self.started, self.eval_seconds = 0.0, 0.0

    @torch.no_grad()
    def score(self, model) -> tuple[float, float]:
        """(greedy accuracy, mean partial-credit reward) on the held-out prompts."""
        was_training = model.training
        model.eval()
        out = model.generate(
            **self.inputs.to(model.device),
            max_new_tokens=self.max_tokens,
            do_sample=False,
            eos_token_id=self.tok.eos_token_id,
            pad_token_id=self.tok.pad_token_id,
        )
        model.train(was_training)
        texts = self.tok.batch_decode(out[:, self.inputs["input_ids"].shape[1] :], skip_special_tokens=True)
        scores = self.task.score(self.prompts, texts, self.answers)
        return sum(s >= 1.0 for s in scores) / len(scores), sum(scores) / len(scores)

    def _record(self, step: int, model) -> None:
        now = time.perf_counter()
        accuracy, reward = self.score(model)
        seconds = now - self.started - self.eval_seconds if step else 0.0
        self.curve.add(step * self.per_step, seconds, accuracy, reward)
        self.eval_seconds += time.perf_counter() - now

    def on_train_begin(self, args, state, control, model=None, **_):
        self.started = time.perf_counter()
        self._record(0, model)

    def on_step_end(self, args, state, control, model=None, **_):
        if state.global_step % self.every == 0 or state.global_step == state.max_steps:
            self._record(state.global_step, model)


def _common(b: Budget, out: Path) -> dict:
    logging.getLogger("transformers").setLevel(logging.ERROR)
    return {
        "output_dir": str(out),
        "save_strategy": "no",
        "report_to": [],
        "use_cpu": True,
        "seed": b.seed,
        "logging_steps": 10,
        "disable_tqdm": True,
        "dataloader_num_workers": 0,
        # fp32 like meshrl's side: TRL's configs default to bf16 autocast and gradient checkpointing, on the
        # CPU too, which cost 3.5x the SFT time here (30.2 s vs 8.7 s, 95 steps, same accuracy 0.383)
        "bf16": False,
        "gradient_checkpointing": False,
    }


def trl_sft(task: Task, b: Budget, model_dir: Path, data: Path, out: Path) -> tuple[Curve, Path]:
    """SFT from the initial weights; returns its curve and the folder of its final weights."""
    tok = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    rows = load_records(data / "train.jsonl", "prompt", "answer", "solution")
    ds = Dataset.from_list([{"prompt": templated(tok, r.prompt), "completion": r.response} for r in rows])
    args = SFTConfig(
        max_steps=b.sft_steps,
        per_device_train_batch_size=b.sft_batch,
        learning_rate=b.sft_lr,
        **_common(b, out / "trl-sft"),
    )
    curve = Curve("trl", "sft")
    callback = HeldoutEval(task, tok, data, b, b.sft_eval_every, b.sft_batch, curve)
    trainer = SFTTrainer(model=model, args=args, train_dataset=ds, processing_class=tok, callbacks=[callback])
    started = time.perf_counter()
    trainer.train()
    curve.extra["process_seconds"] = time.perf_counter() - started
    weights = out / "trl-sft" / "final"
    trainer.save_model(str(weights))
    tok.save_pretrained(str(weights))
    return curve, weights


def trl_grpo(task: Task, b: Budget, start: Path, data: Path, out: Path, phase: str) -> Curve:
    """GRPO from `start` (a model folder): prompts_per_step x n completions, one optimizer step per step."""
    tok = AutoTokenizer.from_pretrained(start)
    model = AutoModelForCausalLM.from_pretrained(start, dtype=torch.float32)
    rows = load_records(data / "train.jsonl", "prompt", "answer")
    ds = Dataset.from_list([{"prompt": templated(tok, r.prompt), "answer": r.answer} for r in rows])
    args = GRPOConfig(
        max_steps=b.rl_steps,
        per_device_train_batch_size=b.rl_samples_per_step,
        num_generations=b.n,
        learning_rate=b.rl_lr,
        max_completion_length=b.max_tokens,
        temperature=b.temperature,
        top_p=1.0,
        **_common(b, out / f"trl-{phase}"),
    )
    curve = Curve("trl", phase)
    callback = HeldoutEval(task, tok, data, b, b.rl_eval_every, b.rl_samples_per_step, curve)
    trainer = GRPOTrainer(
        model=model,
        reward_funcs=[trl_reward(task)],
        args=args,
        train_dataset=ds,
        processing_class=tok,
        callbacks=[callback],
    )
    started = time.perf_counter()
    trainer.train()
    curve.extra["process_seconds"] = time.perf_counter() - started
    return curve
