"""The supervised warm-up's optimizer step (policy_loss sft, one rate per step) is the textbook SFT step that TRL's
SFTTrainer takes: negative log-likelihood of the response tokens only (end-of-sequence included), averaged over
every response token of the batch, global grad-norm clipping at 1.0, AdamW without weight decay. Checked step by
step against transformers + torch.optim.AdamW on the same batches (issue 41: the warm-up as an RL start)."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from transformers import AutoModelForCausalLM

from meshrl.common.codec import Ragged
from meshrl.trainer.core import TrainerCore
from meshrl.trainer.losses import LossConfig
from meshrl.trainer.optim import OptimizerConfig


def _batches(vocab: int, steps: int, rows: int = 6) -> list[tuple[list[list[int]], list[list[int]]]]:
    rng = np.random.default_rng(7)
    return [
        (
            [rng.integers(0, vocab, rng.integers(3, 9)).tolist() for _ in range(rows)],
            [rng.integers(0, vocab, rng.integers(1, 6)).tolist() for _ in range(rows)],
        )
        for _ in range(steps)
    ]


def _hf_step(model, opt, prompts, responses, lr: float) -> float:
    """Right-padded rows, labels only on the response tokens, mean over all of them, clip 1.0, AdamW."""
    width = max(len(p) + len(r) for p, r in zip(prompts, responses, strict=True))
    ids = torch.zeros((len(prompts), width), dtype=torch.long)
    labels = torch.full_like(ids, -100)
    mask = torch.zeros_like(ids)
    for i, (p, r) in enumerate(zip(prompts, responses, strict=True)):
        ids[i, : len(p) + len(r)] = torch.tensor(p + r)
        labels[i, len(p) : len(p) + len(r)] = torch.tensor(r)
        mask[i, : len(p) + len(r)] = 1
    logits = model(input_ids=ids, attention_mask=mask).logits[:, :-1]
    loss = torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), labels[:, 1:].reshape(-1))
    opt.zero_grad()
    loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    for group in opt.param_groups:
        group["lr"] = lr
    opt.step()
    return float(loss)


def test_warm_up_steps_equal_transformers_sft_steps(qwen2_dir):
    core = TrainerCore(micro_batch_tokens=4096)
    core.load_model("actor", str(qwen2_dir), optimizer=OptimizerConfig(lr=1e-3))
    hf = AutoModelForCausalLM.from_pretrained(qwen2_dir, dtype=torch.float32)
    opt = torch.optim.AdamW(hf.parameters(), lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.0)
    lrs = [3e-3, 2.5e-3, 2e-3, 1.5e-3]  # decaying, as the warm-up's: Adam's moments carry over
    ordinary = core.role("actor").spec.vocab_size - 3  # transformers never trains the pad row (padding_idx)
    for (prompts, responses), lr in zip(_batches(ordinary, len(lrs)), lrs, strict=True):
        columns = {
            "prompt_ids": Ragged.from_rows(prompts, np.int32),
            "response_ids": Ragged.from_rows(responses, np.int32),
        }
        got = core.train_step("actor", columns, LossConfig(policy_loss="sft"), step_lrs=[lr]).step_losses[0]
        assert got == pytest.approx(_hf_step(hf, opt, prompts, responses, lr), rel=1e-5)
    ids = torch.tensor([prompts[0] + responses[0]])
    want = torch.log_softmax(hf(input_ids=ids).logits[0, len(prompts[0]) - 1 : -1], -1)
    want = want.gather(1, torch.tensor(responses[0])[:, None])[:, 0]
    one = {
        "prompt_ids": Ragged.from_rows(prompts[:1], np.int32),
        "response_ids": Ragged.from_rows(responses[:1], np.int32),
    }
    after = core.compute_logprobs("actor", one).values.values  # the weights after three steps, both sides
    np.testing.assert_allclose(np.asarray(after), want.detach().numpy(), atol=1e-4)
