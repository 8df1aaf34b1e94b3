"""The recipe probe's pieces on a tiny run: generation and scoring agree on log-probs, and a few SFT + GRPO
steps run end to end with finite numbers and the documented result fields."""

import math
import random
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(ROOT / "bench" / "e2e"))
import recipe_probe as rp  # noqa: E402

sys.path.remove(str(ROOT / "bench" / "e2e"))


def _tiny_rl(**overrides) -> rp.Recipe:
    """A recipe small enough to warm up and train in a second or two, with `overrides` on top."""
    fields = dict(
        hidden_size=32,
        num_layers=1,
        num_heads=2,
        num_kv_heads=1,
        n_train=64,
        n_eval=8,
        sft_steps=2,
        sft_batch=8,
        prompts_per_step=4,
        n=4,
        max_tokens=6,
        rl_steps=2,
        mini_batches=2,
        eval_every=2,
    )
    return rp.Recipe(**{**fields, **overrides})


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    root = tmp_path_factory.mktemp("probe")
    torch.manual_seed(0)
    rp.build_small_model(root / "model", hidden_size=32, num_layers=1, num_heads=2, num_kv_heads=1)
    tok = AutoTokenizer.from_pretrained(root / "model")
    model = AutoModelForCausalLM.from_pretrained(root / "model")
    recipe = rp.Recipe(n_train=32, n_eval=8, max_tokens=6)
    return model, rp.Task(tok, recipe, root / "data"), recipe


def test_sampled_tokens_score_the_same_as_generation_saw_them(tiny):
    model, task, _ = tiny
    prompts = [row["prompt_ids"] for row in task.train[:5]]  # different lengths: left padding is exercised
    torch.manual_seed(1)
    width = max(len(p) for p in prompts)
    ids = torch.full((5, width), task.pad)
    mask = torch.zeros_like(ids)
    for i, p in enumerate(prompts):
        ids[i, width - len(p) :], mask[i, width - len(p) :] = torch.tensor(p), 1
    out = model.generate(
        input_ids=ids,
        attention_mask=mask,
        max_new_tokens=4,
        do_sample=True,
        top_k=0,
        eos_token_id=[],
        pad_token_id=task.pad,
        output_scores=True,
        return_dict_in_generate=True,
    )
    sampled = out.sequences[:, width:]
    seen = torch.stack(out.scores, 1).log_softmax(-1).gather(-1, sampled[..., None]).squeeze(-1)
    scored, rmask = rp.token_logprobs(model, prompts, sampled.tolist(), task.pad)
    assert rmask.sum() == sampled.numel()
    assert torch.allclose(seen, scored, atol=1e-4)


def test_responses_stop_at_the_first_end_of_turn(tiny):
    model, task, _ = tiny
    responses = rp.generate(model, task, [r["prompt_ids"] for r in task.eval], temperature=1.0, max_tokens=6)
    for resp in responses:
        assert 1 <= len(resp) <= 6
        ends = [i for i, t in enumerate(resp) if t in (task.eos, task.pad)]
        assert ends in ([], [len(resp) - 1])


def test_a_tiny_run_reports_every_field():
    recipe = _tiny_rl(sft_steps=3, kl_coef=0.01, eval_every=1)
    result = rp.run(recipe, log=lambda _: None)
    assert [step for step, _ in result["evals"]] == [0, 1, 2]
    assert len(result["reward_curve"]) == 2
    for key in ("acc_before_sft", "acc_rl_step0", "acc_final"):
        assert 0.0 <= result[key] <= 1.0
    assert all(math.isfinite(x) for x in result["sft_loss"]) and result["sft_loss"][-1] < result["sft_loss"][0]
    assert {"build", "sft", "rollout", "train", "eval"} <= set(result["seconds"])
    assert "seed 0" in rp.summarize(result)


def test_batches_cover_an_epoch_before_repeating():
    batches = rp.Batches([{"i": i} for i in range(10)], random.Random(0))
    first = [r["i"] for r in batches.next(4) + batches.next(4)]
    assert len(set(first)) == 8
    rest = [r["i"] for r in batches.next(2)]
    assert sorted(first + rest) == list(range(10))


def test_importance_weights_truncate_mask_and_sum_per_sequence():
    old = torch.log(torch.tensor([[0.5, 0.5, 1.0], [0.9, 0.1, 1.0]]))
    behaviour = torch.log(torch.tensor([[0.5, 0.1, 1.0], [0.3, 0.3, 1.0]]))  # ratios 1, 5, 1 | 3, 1/3, 1
    token = rp.is_weights(old, behaviour, rp.Recipe(tis_cap=2.0, mis_cap=4.0))
    assert torch.allclose(token, torch.tensor([[1.0, 0.0, 1.0], [2.0, 1 / 3, 1.0]]))
    uncapped = rp.is_weights(old, behaviour, rp.Recipe(tis_cap=0.0, mis_cap=0.0))
    assert torch.allclose(uncapped, torch.tensor([[1.0, 5.0, 1.0], [3.0, 1 / 3, 1.0]]))
    sequence = rp.is_weights(old, behaviour, rp.Recipe(tis_cap=0.0, mis_cap=4.0, is_level="sequence"))
    assert torch.allclose(sequence, torch.tensor([[0.0] * 3, [1.0] * 3]))  # products 5 (masked) and 1


def test_stale_sampling_trains_from_older_weights():
    recipe = _tiny_rl(rl_steps=3, eval_every=3, staleness=1)
    result = rp.run(recipe, log=lambda _: None)
    assert [step for step, _ in result["evals"]] == [0, 3]
    assert len(result["reward_curve"]) == 3 and all(math.isfinite(r) for r in result["reward_curve"])


_ROLLOUT = rp.rollout


def _sampled(monkeypatch, recipe: "rp.Recipe") -> list[list[list[int]]]:
    """Runs the recipe and returns each RL step's sampled responses."""
    seen = []

    def recording(*args, **kwargs):
        batch = _ROLLOUT(*args, **kwargs)
        seen.append(batch["responses"])
        return batch

    monkeypatch.setattr(rp, "rollout", recording)
    rp.run(recipe, log=lambda _: None)
    return seen


def test_a_stale_run_draws_what_the_sync_run_draws_until_the_weights_differ(monkeypatch):
    """The behaviour copy takes nothing from torch's stream, so at step 1 (both sample the step-0 weights) the
    stale run's samples are the sync run's; at step 2 the stale run samples the step-0 weights again."""
    sync = _sampled(monkeypatch, _tiny_rl())  # the seed's own stream, continued from the warm-up
    stale = _sampled(monkeypatch, _tiny_rl(staleness=1))
    assert stale[0] == sync[0]
    assert len(stale) == len(sync) == 2


def test_the_rl_stream_reseeds_the_sampling_and_leaves_the_warm_up_alone(monkeypatch):
    first, again, other = (_sampled(monkeypatch, _tiny_rl(rl_stream=s)) for s in (1, 1, 2))
    assert first == again
    assert first != other
