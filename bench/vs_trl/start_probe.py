"""What RL depends on in a warm start, measured in seconds on a model folder: per-token entropy and calibration of
the gold answers on held-out prompts (teacher forced), the probability of the end-of-sequence token right after a
complete gold answer, and what GRPO would see from it: samples at temperature 1 in groups of n, their reward
distribution, the share of groups whose samples all get the same reward (no advantage, no gradient) and the mean
entropy and negative log-prob of the sampled tokens. Compares meshrl's warm-up model with TRL's SFT model of
the same data (issue 41); used by hand, not by run.py:

  .venv/bin/python bench/vs_trl/start_probe.py --task add --data runs/vs_trl/add/data \\
      runs/vs_trl/add/trl-sft/final runs/vs_trl/add/meshrl-runs/<run>/weights/v000014
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import asdict, dataclass
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from bench.vs_trl.tasks import TASKS, Task  # noqa: E402
from meshrl.scheduler.step.prompts.data import load_records  # noqa: E402


@dataclass
class StartReport:
    greedy_accuracy: float
    gold_nll: float  # mean negative log-prob per gold answer token (eos included), teacher forced
    gold_entropy: float  # mean entropy of the next-token distribution along the gold answers
    calibration_error: float  # |mean max-prob - share of argmax hits| over the gold answers' positions (ECE, 10 bins)
    eos_after_answer: float  # mean p(eos | prompt + complete gold answer)
    eos_mid_answer: float  # mean p(eos) at the gold answer's other positions (stopping too early)
    sample_reward_mean: float  # samples at temperature 1
    sample_accuracy: float
    sample_length: float  # tokens per sample, eos included
    sample_entropy: float  # mean entropy of the sampling distribution at the sampled positions
    sample_nll: float  # mean -log p of the sampled tokens
    zero_variance_groups: float  # share of groups of n samples that all got the same reward
    reward_histogram: dict[str, float]  # share of samples per reward bin (0, (0, .25], ..., 1)


def _templated(tok, prompt: str) -> list[int]:
    ids = tok.apply_chat_template([{"role": "user", "content": prompt}], add_generation_prompt=True, tokenize=True)
    return list(ids["input_ids"] if hasattr(ids, "keys") else ids)


def _ece(conf: torch.Tensor, hit: torch.Tensor, bins: int = 10) -> float:
    edges = torch.linspace(0, 1, bins + 1)
    err = 0.0
    for lo, hi in zip(edges[:-1], edges[1:], strict=True):
        sel = (conf > lo) & (conf <= hi)
        if sel.any():
            err += float(sel.float().mean()) * abs(float(conf[sel].mean()) - float(hit[sel].float().mean()))
    return err


@torch.no_grad()
def _teacher_forced(model, tok, prompts: list[list[int]], answers: list[str]) -> dict[str, float]:
    eos = tok.eos_token_id
    nll, ent, conf, hits, eos_end, eos_mid = [], [], [], [], [], []
    for p, a in zip(prompts, answers, strict=True):
        target = tok.encode(a, add_special_tokens=False) + [eos]
        ids = torch.tensor([p + target])
        logp = torch.log_softmax(model(ids).logits[0, len(p) - 1 : -1].float(), -1)  # [len(target), V]
        tgt = torch.tensor(target)
        nll += (-logp.gather(1, tgt[:, None])[:, 0]).tolist()
        ent += (-(logp.exp() * logp).sum(-1)).tolist()
        top = logp.max(-1)
        conf += top.values.exp().tolist()
        hits += (top.indices == tgt).tolist()
        eos_end.append(float(logp[-1, eos].exp()))
        eos_mid += logp[:-1, eos].exp().tolist()
    mean = lambda xs: sum(xs) / len(xs)  # noqa: E731
    return {
        "gold_nll": mean(nll),
        "gold_entropy": mean(ent),
        "eos_after_answer": mean(eos_end),
        "eos_mid_answer": mean(eos_mid),
        "calibration_error": _ece(torch.tensor(conf), torch.tensor(hits)),
    }


@torch.no_grad()
def _generate(model, tok, prompt: list[int], n: int, max_tokens: int, sample: bool):
    """n continuations of one prompt: (texts, lengths with eos, per-token entropies, per-token -log p)."""
    ids = torch.tensor([prompt] * n)
    out = model.generate(
        ids,
        attention_mask=torch.ones_like(ids),
        max_new_tokens=max_tokens,
        do_sample=sample,
        temperature=1.0 if sample else None,
        top_p=1.0,
        top_k=0,
        output_scores=True,
        return_dict_in_generate=True,
        eos_token_id=tok.eos_token_id,
        pad_token_id=tok.pad_token_id,
    )
    new = out.sequences[:, len(prompt) :]
    logp = torch.log_softmax(torch.stack(out.scores, 1).float(), -1)  # [n, steps, V]
    live = torch.ones(new.shape, dtype=torch.bool)
    done = torch.zeros(n, dtype=torch.bool)
    for t in range(new.shape[1]):
        live[:, t] = ~done
        done |= new[:, t] == tok.eos_token_id
    ent = -(logp.exp() * logp.nan_to_num(0.0)).sum(-1)[live]
    nll = -logp.gather(2, new[:, :, None])[:, :, 0][live]
    texts = tok.batch_decode(new, skip_special_tokens=True)
    return texts, live.sum(1).tolist(), ent.tolist(), nll.tolist()


def probe(
    model_dir: str | Path,
    task: Task,
    data: Path,
    *,
    n_prompts: int = 64,
    n: int = 8,
    max_tokens: int = 10,
    seed: int = 0,
    split: str = "eval",
) -> StartReport:
    """The report of one model folder on the first prompts of `data`'s split (eval.jsonl: held out; train.jsonl:
    the prompts RL samples, which the warm-up saw)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    torch.manual_seed(seed)
    tok = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    records = load_records(data / f"{split}.jsonl", "prompt", "answer")[:n_prompts]
    prompts = [_templated(tok, r.prompt) for r in records]
    answers = [r.answer for r in records]
    forced = _teacher_forced(model, tok, prompts, answers)
    greedy = [_generate(model, tok, p, 1, max_tokens, False)[0][0] for p in prompts]
    scores = task.score([r.prompt for r in records], greedy, answers)
    rewards, lengths, ents, nlls, zero = [], [], [], [], 0
    for rec, p in zip(records, prompts, strict=True):
        texts, lens, ent, nll = _generate(model, tok, p, n, max_tokens, True)
        group = task.score([rec.prompt] * n, texts, [rec.answer] * n)
        zero += max(group) - min(group) < 1e-9
        rewards += group
        lengths += lens
        ents += ent
        nlls += nll
    mean = lambda xs: sum(xs) / max(len(xs), 1)  # noqa: E731
    bins = {"0": 0.0, "(0,.25]": 0.25, "(.25,.5]": 0.5, "(.5,.75]": 0.75, "(.75,1)": 1.0 - 1e-9, "1": 1.0}
    hist = dict.fromkeys(bins, 0.0)
    for r in rewards:
        hist[next(k for k, hi in bins.items() if r <= hi)] += 1 / len(rewards)
    return StartReport(
        greedy_accuracy=mean([s >= 1.0 for s in scores]),
        sample_reward_mean=mean(rewards),
        sample_accuracy=mean([r >= 1.0 for r in rewards]),
        sample_length=mean(lengths),
        sample_entropy=mean(ents),
        sample_nll=mean(nlls),
        zero_variance_groups=zero / len(records),
        reward_histogram=hist,
        **forced,
    )


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("models", nargs="+", help="model folders (Hugging Face) to compare")
    p.add_argument("--task", required=True, choices=list(TASKS))
    p.add_argument("--data", required=True, type=Path, help="the task's data folder (eval.jsonl)")
    p.add_argument("--prompts", type=int, default=64)
    p.add_argument("--n", type=int, default=8)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--split", choices=["eval", "train"], default="eval", help="held-out prompts, or RL's")
    args = p.parse_args(argv)
    torch.set_num_threads(1)
    for model in args.models:
        report = probe(
            model, TASKS[args.task], args.data, n_prompts=args.prompts, n=args.n, seed=args.seed, split=args.split
        )
        print(json.dumps({"model": str(model), "split": args.split, **asdict(report)}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
