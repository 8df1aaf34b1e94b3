"""Research probe for the default example's recipe: SFT warm-up, then GRPO, all in one process with no services.

Builds the tiny model with `meshrl.trainer.model_builder.build_small_model`, writes the countdown puzzles with
`examples.countdown.make_data`, runs a supervised warm-up stopped early, evaluates greedily on the held-out set
(the RL step-0 evaluation), then runs GRPO (n samples per prompt, group-normalised advantages, PPO-clip loss over
`mini_batches` consecutive row chunks, token-mean, optional k3 KL to the step-0 policy) with evaluations every K
steps. One AdamW (betas 0.9/0.999, grad clip 1.0) serves both phases, like the trainer's actor. Prints accuracies
(before SFT, at RL step 0, after RL), the reward curve and wall / CPU seconds per phase; `--json-out` writes them
as JSON. examples/countdown/config.yaml was tuned with it; `recipe_from_config` reads that file back so the two
can be compared (tests/unit/example checks that the defaults here equal the config).
`--staleness K` emulates the asynchronous modes: samples come from the weights K versions behind the
trainer's and the loss weighs each token by pi_old / pi_behaviour (`--tis-cap`, `--mis-cap`, `--is-level`), so
a loss of accuracy can be told apart from anything the services' pipeline does. It screens corrections for stale
samples besides (`--lag-lr-scale` the trainer's step size scaled by staleness, `--mis-low` / `--seq-mask` /
`--m2-cap` masking in stale_corrections.py, `--neg-cap` a cap on negative-advantage tokens' weights only,
`--prox approx` pi_old interpolated without a pass, `--rl-beta1` Adam's momentum in RL) and prints the drift per
version lag beside the accuracies; bench/async/README.md has what each measured. A stale run samples what the sync
run of its seed samples until their weights differ (the behaviour model is a copy, which draws nothing from torch's
stream); `--rl-stream K` reruns a seed on another sampling stream: one seed's finals spread by ~0.16 over streams,
so a screen needs several streams or seeds before it says anything about a 0.05 bar.

Run: `.venv/bin/python bench/e2e/recipe_probe.py --seeds 0 1 2` (about 2 minutes per seed on 2 idle cores).
`--threads 1` matches the services (one torch thread per replica / trainer on this machine) and gives steadier
timings on a busy machine than the default 2, whose OpenMP barriers stall when other processes hold the cores.
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import copy
import json
import os
import random
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
import torch.nn.functional as F
import yaml
from transformers import AutoModelForCausalLM, AutoTokenizer
from transformers.utils import logging as hf_logging

ROOT = Path(__file__).resolve().parents[2]
CONFIG = ROOT / "examples" / "countdown" / "config.yaml"
for _path in (ROOT, ROOT / "bench" / "e2e"):
    if str(_path) not in sys.path:
        sys.path.insert(0, str(_path))

from stale_corrections import cap_negative, screened_mask  # noqa: E402

from examples.countdown import make_data, reward  # noqa: E402
from meshrl.trainer.losses import LossConfig, importance_weights, per_sequence_sum  # noqa: E402
from meshrl.trainer.model_builder import build_small_model  # noqa: E402


@dataclass
class Recipe:
    # model
    hidden_size: int = 64
    num_layers: int = 2
    num_heads: int = 4
    num_kv_heads: int = 2
    intermediate_size: int = 0  # 0 = builder default (2 x hidden)
    # data
    count: int = 3
    max_num: int = 9
    ops: str = "+-"
    max_target: int = 99
    n_train: int = 4000
    n_eval: int = 256
    # sft
    sft_steps: int = 150
    sft_batch: int = 64
    sft_lr: float = 3e-3
    # rollout
    prompts_per_step: int = 128
    n: int = 8
    temperature: float = 1.0
    max_tokens: int = 12
    # algorithm
    rl_steps: int = 60
    rl_lr: float = 1e-3
    clip: float = 0.2
    kl_coef: float = 0.0
    mini_batches: int = 4
    format_reward: float = 0.0
    # off-policy emulation (training.mode one_step_off / async): samples come from weights `staleness` versions
    # behind the trainer's; the loss takes pi_old from the current weights (in-train) and weighs each token by
    # pi_old / pi_behaviour, truncated at tis_cap and masked above mis_cap (the job's async defaults)
    staleness: int = 0
    tis_cap: float = 2.0
    mis_cap: float = 4.0
    is_level: str = "token"  # token: a weight per token; sequence: exp(sum of the tokens' log-ratios) per sequence
    # screened corrections for stale samples (0 = off): tokens whose pi_old / pi_behaviour is below mis_low leave
    # the loss (two-sided masking with mis_cap); a sequence whose geometric-mean ratio lies outside
    # [1 / seq_mask, seq_mask] leaves it; m2_cap masks the tokens of largest squared log-ratio until their
    # mean over the batch is at most m2_cap (a trust region on the second moment, M2PO)
    mis_low: float = 0.0
    # pi_old of the ratio: "exact" (a forward pass before the update) or "approx" (no pass: interpolated between
    # pi_behaviour and the current policy by version, log pi_old = log pi_b + a (log pi - log pi_b),
    # a = lag / (lag + 1), AReaL's proximal approximation; the exact pass still runs, for the drift figures only)
    prox: str = "exact"
    # step size scaled by staleness (the trainer's lag_lr_scale c): the RL lr is rl_lr / (1 + c * staleness)
    lag_lr_scale: float = 0.0
    seq_mask: float = 0.0
    m2_cap: float = 0.0
    # a cap on the importance weight of negative-advantage tokens only (0 = off): stale samples that the update
    # pushes down weigh at most this much (TOPR's asymmetric truncation takes 1)
    neg_cap: float = 0.0
    # Adam's beta1 in the RL phase (the warm-up keeps 0.9): how much momentum carries a stale step into the next
    rl_beta1: float = 0.9
    # the RL phase's sampling stream: -1 continues the seed's own torch stream from the warm-up; k >= 0 reseeds
    # torch with k at RL step 0, so one seed's data and warm-up can be rerun on other draws (run-to-run noise)
    rl_stream: int = -1
    eval_every: int = 10
    seed: int = 0


def recipe_from_config(path: str | Path = CONFIG, seed: int = 0) -> Recipe:
    """The recipe written in an example's job config (the numbers `meshrl run` uses), for side-by-side checks."""
    cfg = yaml.safe_load(Path(path).read_text())
    build, spec = cfg["model"]["build"], make_data.PuzzleSpec()
    return Recipe(
        hidden_size=build["hidden_size"],
        num_layers=build["num_layers"],
        num_heads=build["num_heads"],
        num_kv_heads=build["num_kv_heads"],
        intermediate_size=build.get("intermediate_size", 0),
        count=spec.count,
        max_num=spec.max_num,
        ops=spec.ops,
        max_target=spec.max_target,
        sft_steps=cfg["warmup"]["steps"],
        sft_batch=cfg["warmup"]["batch_size"],
        sft_lr=cfg["warmup"]["lr"],
        prompts_per_step=cfg["data"]["prompts_per_step"],
        n=cfg["rollout"]["n"],
        temperature=cfg["rollout"]["temperature"],
        max_tokens=cfg["rollout"]["max_tokens"],
        rl_steps=cfg["job"]["steps"],
        rl_lr=cfg["trainer"]["optimizer"]["lr"],
        clip=cfg["algorithm"]["loss"]["clip_low"],
        kl_coef=cfg["algorithm"]["loss"]["kl_coef"],
        mini_batches=cfg["trainer"]["mini_batches"],
        eval_every=cfg["eval"]["every"],
        n_eval=cfg["eval"]["max_prompts"],
        seed=seed,
    )


class Clock:
    """Wall and process-CPU seconds per phase (CPU seconds / threads approximates an idle machine's wall time)."""

    def __init__(self) -> None:
        self.wall: dict[str, float] = {}
        self.cpu: dict[str, float] = {}

    @contextlib.contextmanager
    def phase(self, name: str):
        w0, c0 = time.perf_counter(), time.process_time()
        try:
            yield
        finally:
            self.wall[name] = self.wall.get(name, 0.0) + time.perf_counter() - w0
            self.cpu[name] = self.cpu.get(name, 0.0) + time.process_time() - c0


class Task:
    """Tokenised train/eval sets of one seed."""

    def __init__(self, tok, recipe: Recipe, data_dir: Path) -> None:
        spec = make_data.PuzzleSpec(
            count=recipe.count, max_num=recipe.max_num, ops=recipe.ops, max_target=recipe.max_target
        )
        train_path, eval_path = make_data.write_dataset(data_dir, recipe.seed, recipe.n_train, recipe.n_eval, spec)
        self.train = [json.loads(line) for line in train_path.open()]
        self.eval = [json.loads(line) for line in eval_path.open()]
        self.tok = tok
        self.eos = tok.convert_tokens_to_ids("<|im_end|>")
        self.pad = tok.pad_token_id
        for row in self.train + self.eval:
            row["prompt_ids"] = self.encode_prompt(row["prompt"])
            row["solution_ids"] = tok(row["solution"], add_special_tokens=False)["input_ids"] + [self.eos]

    def encode_prompt(self, prompt: str) -> list[int]:
        enc = self.tok.apply_chat_template([{"role": "user", "content": prompt}], add_generation_prompt=True)
        return list(enc["input_ids"] if hasattr(enc, "keys") else enc)


def right_padded(seqs: list[list[int]], pad: int) -> tuple[torch.Tensor, torch.Tensor]:
    width = max(len(s) for s in seqs)
    ids = torch.full((len(seqs), width), pad, dtype=torch.long)
    mask = torch.zeros((len(seqs), width), dtype=torch.long)
    for i, s in enumerate(seqs):
        ids[i, : len(s)] = torch.tensor(s)
        mask[i, : len(s)] = 1
    return ids, mask


def token_logprobs(model, prompts: list[list[int]], responses: list[list[int]], pad: int):
    """Per-token log-probs of each response given its prompt: [B, T_resp_max] float32 and mask [B, T_resp_max]."""
    seqs = [p + r for p, r in zip(prompts, responses)]
    ids, mask = right_padded(seqs, pad)
    logits = model(input_ids=ids, attention_mask=mask).logits[:, :-1].float()
    logp_all = torch.log_softmax(logits, dim=-1).gather(-1, ids[:, 1:, None]).squeeze(-1)
    rmask = torch.zeros((len(seqs), max(len(r) for r in responses)))
    rows = []
    for i, (p, r) in enumerate(zip(prompts, responses)):
        rows.append(logp_all[i, len(p) - 1 : len(p) - 1 + len(r)])
        rmask[i, : len(r)] = 1
    return torch.nn.utils.rnn.pad_sequence(rows, batch_first=True), rmask


@torch.no_grad()
def generate(model, task: Task, prompts: list[list[int]], *, temperature: float, max_tokens: int) -> list[list[int]]:
    """Batched left-padded decoding with the KV cache; each response ends at (and includes) its first EOS."""
    width = max(len(p) for p in prompts)
    ids = torch.full((len(prompts), width), task.pad, dtype=torch.long)
    mask = torch.zeros_like(ids)
    for i, p in enumerate(prompts):
        ids[i, width - len(p) :] = torch.tensor(p)
        mask[i, width - len(p) :] = 1
    kwargs = dict(temperature=temperature, top_k=0, top_p=1.0) if temperature > 0 else {}
    out = model.generate(
        input_ids=ids,
        attention_mask=mask,
        max_new_tokens=max_tokens,
        eos_token_id=[task.eos, task.pad],
        pad_token_id=task.pad,
        do_sample=temperature > 0,
        **kwargs,
    )[:, width:]
    responses = []
    for row in out.tolist():
        resp = []
        for t in row:
            resp.append(t)
            if t in (task.eos, task.pad):
                break
        responses.append(resp)
    return responses


def decode(task: Task, response: list[int]) -> str:
    return task.tok.decode([t for t in response if t not in (task.eos, task.pad)], skip_special_tokens=True)


def evaluate(model, task: Task, recipe: Recipe, batch: int = 256) -> float:
    model.eval()
    correct = 0
    for start in range(0, len(task.eval), batch):
        rows = task.eval[start : start + batch]
        resp = generate(model, task, [r["prompt_ids"] for r in rows], temperature=0.0, max_tokens=recipe.max_tokens)
        correct += sum(reward.is_correct(decode(task, x), r["answer"]) for x, r in zip(resp, rows))
    return correct / len(task.eval)


def make_optimizer(model, recipe: Recipe) -> torch.optim.AdamW:
    """One AdamW for warm-up and RL, like the trainer's actor (betas 0.9/0.999, no weight decay, clip 1.0)."""
    return torch.optim.AdamW(model.parameters(), lr=recipe.sft_lr, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.0)


def optimizer_step(model, opt, loss: torch.Tensor, lr: float) -> float:
    for group in opt.param_groups:
        group["lr"] = lr
    opt.zero_grad()
    loss.backward()
    norm = torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    opt.step()
    return float(norm)


class Batches:
    """Deterministic epochs over the train rows, consumed in order."""

    def __init__(self, rows: list[dict], rng: random.Random) -> None:
        self.rows, self.rng = rows, rng
        self.order: list[int] = []

    def next(self, size: int) -> list[dict]:
        if len(self.order) < size:
            fresh = list(range(len(self.rows)))
            self.rng.shuffle(fresh)
            self.order += fresh
        take, self.order = self.order[:size], self.order[size:]
        return [self.rows[i] for i in take]


def sft(model, opt, task: Task, recipe: Recipe, batches: Batches) -> list[float]:
    """Supervised warm-up at a constant lr on (prompt, solution + EOS); loss on the response tokens."""
    model.train()
    losses = []
    for _ in range(recipe.sft_steps):
        rows = batches.next(recipe.sft_batch)
        logp, rmask = token_logprobs(
            model, [r["prompt_ids"] for r in rows], [r["solution_ids"] for r in rows], task.pad
        )
        loss = -(logp * rmask).sum() / rmask.sum()
        optimizer_step(model, opt, loss, recipe.sft_lr)
        losses.append(loss.item())
    return losses


def rollout(model, task: Task, recipe: Recipe, rows: list[dict], behaviour=None) -> dict:
    """n samples per prompt, rewards, group-normalised advantages (rows of a group are consecutive). With a
    `behaviour` model (an older copy of the weights) the samples are its own, with its log-probs."""
    model.eval()
    sampler = model if behaviour is None else behaviour
    prompts = [r["prompt_ids"] for r in rows for _ in range(recipe.n)]
    answers = [r["answer"] for r in rows for _ in range(recipe.n)]
    responses = generate(sampler, task, prompts, temperature=recipe.temperature, max_tokens=recipe.max_tokens)
    behaviour_logp = None
    if behaviour is not None:
        with torch.no_grad():
            behaviour_logp = token_logprobs(behaviour, prompts, responses, task.pad)[0]
    texts = [decode(task, x) for x in responses]
    rewards = torch.tensor([reward.score_one(t, a, recipe.format_reward) for t, a in zip(texts, answers)])
    grouped = rewards.view(-1, recipe.n)
    adv = ((grouped - grouped.mean(1, keepdim=True)) / (grouped.std(1, keepdim=True) + 1e-6)).view(-1)
    return {
        "prompts": prompts,
        "responses": responses,
        "rewards": rewards,
        "advantages": adv,
        "mixed_groups": (grouped.std(1) > 0).float().mean().item(),
        "accuracy": sum(reward.is_correct(t, a) for t, a in zip(texts, answers)) / len(texts),
        "length": sum(len(r) for r in responses) / len(responses),
        "behaviour_logp": behaviour_logp,
    }


def is_weights(old_logp: torch.Tensor, behaviour_logp: torch.Tensor, recipe: Recipe) -> torch.Tensor:
    """pi_old / pi_behaviour per token (or per sequence, on each of its tokens) with the trainer's own
    correction (`importance_weights` at `is_level`: truncated at tis_cap, 0 above mis_cap); with both caps 0,
    the plain ratio. Padding carries log-probs 0 on both sides, so it adds nothing to a sequence's sum."""
    cfg = LossConfig(tis_cap=recipe.tis_cap, mis_cap=recipe.mis_cap, is_level=recipe.is_level)
    weights = importance_weights(cfg, old_logp, behaviour_logp)
    if weights is not None:
        return weights
    if recipe.is_level == "sequence":
        old_logp, behaviour_logp = per_sequence_sum(old_logp, None), per_sequence_sum(behaviour_logp, None)
    return torch.exp((old_logp - behaviour_logp).clamp(max=20.0))


def screens(recipe: Recipe) -> dict:
    return {"mis_low": recipe.mis_low, "seq_mask": recipe.seq_mask, "m2_cap": recipe.m2_cap}


def ppo_update(model, opt, ref, task: Task, recipe: Recipe, batch: dict) -> dict:
    """Old (and reference) log-probs, then `mini_batches` PPO-clip steps over consecutive row chunks, token-mean."""
    prompts, responses, adv = batch["prompts"], batch["responses"], batch["advantages"]
    with torch.no_grad():
        old_logp, rmask = token_logprobs(model, prompts, responses, task.pad)
        ref_logp = token_logprobs(ref, prompts, responses, task.pad)[0] if ref is not None else None
    behaviour = batch.get("behaviour_logp")
    weights, drift = None, {}
    if behaviour is not None:
        weights = is_weights(old_logp, behaviour, recipe) * screened_mask(old_logp, behaviour, rmask, **screens(recipe))
        tokens = rmask.sum()
        drift = {  # what one version lag (here: `staleness` versions) did to the sampled tokens
            "drift": ((old_logp - behaviour).abs() * rmask).sum().item() / tokens.item(),
            "is_weight": (weights * rmask).sum().item() / tokens.item(),
            "masked": (((weights == 0).float()) * rmask).sum().item() / tokens.item(),
        }
    model.train()
    clip_frac, kls, norms = [], [], []
    for chunk in torch.arange(len(prompts)).chunk(recipe.mini_batches):
        lo, hi = int(chunk[0]), int(chunk[-1]) + 1
        logp, _ = token_logprobs(model, prompts[lo:hi], responses[lo:hi], task.pad)
        logp = F.pad(logp, (0, old_logp.shape[1] - logp.shape[1]))
        m = rmask[lo:hi]
        prox, w = old_logp[lo:hi], None if weights is None else weights[lo:hi]
        if recipe.prox == "approx" and behaviour is not None:
            b = behaviour[lo:hi]
            prox = b + recipe.staleness / (recipe.staleness + 1) * (logp.detach() - b)
            w = is_weights(prox, b, recipe) * screened_mask(prox, b, m, **screens(recipe))
        ratio = torch.exp(logp - prox)
        a = adv[lo:hi, None]
        loss_tok = -torch.minimum(ratio * a, ratio.clamp(1 - recipe.clip, 1 + recipe.clip) * a)
        if w is not None:
            loss_tok = loss_tok * cap_negative(w, a, recipe.neg_cap)
        if ref_logp is not None:
            d = ref_logp[lo:hi] - logp
            kl = torch.exp(d) - d - 1  # k3
            loss_tok = loss_tok + recipe.kl_coef * kl
            kls.append(((kl * m).sum() / m.sum()).item())
        lr = recipe.rl_lr / (1.0 + recipe.lag_lr_scale * recipe.staleness)
        norms.append(optimizer_step(model, opt, (loss_tok * m).sum() / m.sum(), lr))
        clip_frac.append((((ratio - 1).abs() > recipe.clip).float() * m).sum().item() / m.sum().item())
    return {
        "clip_fraction": sum(clip_frac) / len(clip_frac),
        "kl": sum(kls) / len(kls) if kls else 0.0,
        "grad_norm": sum(norms) / len(norms),
        **drift,
    }


def grpo(model, opt, task: Task, recipe: Recipe, batches: Batches, clock: Clock, log) -> dict:
    for group in opt.param_groups:
        group["betas"] = (recipe.rl_beta1, group["betas"][1])
    ref = None
    if recipe.kl_coef > 0:
        ref = copy.deepcopy(model).eval()
    curve, evals = [], []
    behaviour = versions = None
    if recipe.staleness > 0:  # the last staleness + 1 weight versions; samples come from the oldest
        behaviour = copy.deepcopy(model).eval()  # a copy draws nothing from torch's stream: runs stay paired
        versions = collections.deque([copy.deepcopy(model.state_dict())], maxlen=recipe.staleness + 1)
    if recipe.rl_stream >= 0:
        torch.manual_seed(recipe.rl_stream)
    with clock.phase("eval"):
        evals.append((0, evaluate(model, task, recipe)))
    log(f"  rl step 0 eval acc {evals[-1][1]:.3f}")
    for step in range(1, recipe.rl_steps + 1):
        with clock.phase("rollout"):
            if versions is not None:
                behaviour.load_state_dict(versions[0])
            batch = rollout(model, task, recipe, batches.next(recipe.prompts_per_step), behaviour)
        with clock.phase("train"):
            stats = ppo_update(model, opt, ref, task, recipe, batch)
        if versions is not None:
            versions.append(copy.deepcopy(model.state_dict()))
        curve.append(
            {
                "step": step,
                "reward": batch["rewards"].mean().item(),
                "length": batch["length"],
                "mixed_groups": batch["mixed_groups"],
                **stats,
            }
        )
        if step % recipe.eval_every == 0 or step == recipe.rl_steps:
            with clock.phase("eval"):
                evals.append((step, evaluate(model, task, recipe)))
            log(
                f"  rl step {step} reward {curve[-1]['reward']:.3f} len {batch['length']:.1f}"
                f" mixed {batch['mixed_groups']:.2f} clip {stats['clip_fraction']:.3f} kl {stats['kl']:.4f} grad {stats['grad_norm']:.2f}"
                f" eval acc {evals[-1][1]:.3f}"
                + (
                    f" drift {stats['drift']:.3f} w {stats['is_weight']:.3f} masked {stats['masked']:.3f}"
                    if "drift" in stats
                    else ""
                )
            )
    return {"curve": curve, "evals": evals}


def run(recipe: Recipe, log=print) -> dict:
    torch.manual_seed(recipe.seed)
    rng = random.Random(recipe.seed)
    with tempfile.TemporaryDirectory() as tmp:
        clock = Clock()
        build = clock.phase("build")
        build.__enter__()
        model_dir = build_small_model(
            Path(tmp) / "model",
            hidden_size=recipe.hidden_size,
            num_layers=recipe.num_layers,
            num_heads=recipe.num_heads,
            num_kv_heads=recipe.num_kv_heads,
            intermediate_size=recipe.intermediate_size or None,
            seed=recipe.seed,
        )
        tok = AutoTokenizer.from_pretrained(model_dir)
        model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
        task = Task(tok, recipe, Path(tmp) / "data")
        build.__exit__(None, None, None)
    n_params = sum(p.numel() for p in model.parameters())
    with clock.phase("eval_init"):
        acc_init = evaluate(model, task, recipe)
    opt = make_optimizer(model, recipe)
    batches = Batches(task.train, rng)
    with clock.phase("sft"):
        losses = sft(model, opt, task, recipe, batches)
    log(f"  params {n_params}, sft loss {losses[0]:.3f} -> {losses[-1]:.3f} in {clock.wall['sft']:.1f}s")
    rl = grpo(model, opt, task, recipe, batches, clock, log)
    result = {
        "recipe": asdict(recipe),
        "params": n_params,
        "acc_before_sft": acc_init,
        "acc_rl_step0": rl["evals"][0][1],
        "acc_final": rl["evals"][-1][1],
        "acc_best": max(a for _, a in rl["evals"]),
        "evals": rl["evals"],
        "reward_curve": [round(c["reward"], 4) for c in rl["curve"]],
        "sft_loss": [round(x, 4) for x in losses[:: max(1, len(losses) // 10)]] + [round(losses[-1], 4)],
        "drift": {  # means over the RL steps: |log pi_old - log pi_behaviour| per token, weight, masked fraction
            key: round(sum(c[key] for c in rl["curve"]) / len(rl["curve"]), 4)
            for key in ("drift", "is_weight", "masked")
            if key in rl["curve"][0]
        },
        "seconds": clock.wall,
        "cpu_seconds": clock.cpu,
        "load": os.getloadavg(),
    }
    return result


def summarize(result: dict) -> str:
    curve = result["reward_curve"]
    k = max(1, len(curve) // 10)
    smooth = [round(sum(curve[i : i + k]) / len(curve[i : i + k]), 3) for i in range(0, len(curve), k)]
    s, c = result["seconds"], result["cpu_seconds"]
    gain = result["acc_final"] - result["acc_rl_step0"]
    return (
        f"seed {result['recipe']['seed']}: acc init {result['acc_before_sft']:.3f} | rl step0 {result['acc_rl_step0']:.3f}"
        f" | final {result['acc_final']:.3f} (gain {gain:+.3f}, best {result['acc_best']:.3f})"
        + (f" | per lag {result['recipe']['staleness']}: {result['drift']}" if result["drift"] else "")
        + "\n"
        f"  evals {[(st, round(a, 3)) for st, a in result['evals']]}\n"
        f"  reward (mean per {k} steps) {smooth}\n"
        f"  wall s: " + ", ".join(f"{k2} {v:.1f}" for k2, v in s.items()) + f" | total {sum(s.values()):.1f}\n"
        f"  cpu s: " + ", ".join(f"{k2} {v:.1f}" for k2, v in c.items()) + f" | total {sum(c.values()):.1f}"
        f" | load {tuple(round(x, 2) for x in result['load'])}"
    )


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--seeds", type=int, nargs="+", default=[0])
    parser.add_argument("--threads", type=int, default=2, help="torch intra-op threads")
    parser.add_argument("--json-out", default="")
    defaults = Recipe()
    for name, value in asdict(defaults).items():
        if name == "seed":
            continue
        parser.add_argument("--" + name.replace("_", "-"), type=type(value), default=value)
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    hf_logging.set_verbosity_error()
    hf_logging.disable_progress_bar()
    results = []
    for seed in args.seeds:
        fields = {k: getattr(args, k) for k in asdict(defaults) if k != "seed"}
        recipe = Recipe(seed=seed, **fields)
        print(f"== seed {seed} load {os.getloadavg()[0]:.2f}", flush=True)
        results.append(run(recipe, log=lambda m: print(m, flush=True)))
        print(summarize(results[-1]), flush=True)
    gains = [r["acc_final"] - r["acc_rl_step0"] for r in results]
    print(f"RL gains {[round(g, 3) for g in gains]} min {min(gains):+.3f} mean {sum(gains) / len(gains):+.3f}")
    finals = [r["acc_final"] for r in results]
    print(f"final acc {[round(a, 3) for a in finals]} mean {sum(finals) / len(finals):.3f}")
    if args.json_out:
        Path(args.json_out).write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
