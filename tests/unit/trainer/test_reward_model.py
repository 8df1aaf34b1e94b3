"""The learned reward model: the trainer service (`python -m meshrl.trainer`, 2 data-parallel ranks, a real
data buffer) scores each sequence as an in-process transformers AutoModelForSequenceClassification does, and
refuses a folder that is no reward model, a role without a score head and a call before the model is loaded."""

from __future__ import annotations

import os
from pathlib import Path

import grpc
import numpy as np
import pytest
import torch
from transformers import AutoModelForSequenceClassification, Qwen2Config, Qwen2ForSequenceClassification

from meshrl.api.trainer.v1 import trainer_pb2 as pb
from meshrl.common.batch_key import batch_key
from meshrl.common.codec import Ragged
from meshrl.common.errors import InvalidArgument, NotFound
from meshrl.trainer.core import TrainerCore

REDIS_URL = os.environ.get("MESHRL_TEST_REDIS_URL", "redis://127.0.0.1:6379/0")
VOCAB, PAD = 96, 0


def build_reward_model(root: Path, *, num_labels: int = 1, seed: int = 3) -> Path:
    """A tiny random Qwen2 sequence classifier saved as a HF folder (safetensors)."""
    torch.manual_seed(seed)
    config = Qwen2Config(
        vocab_size=VOCAB,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=128,
        num_labels=num_labels,
        pad_token_id=PAD,
        tie_word_embeddings=False,
    )
    model = Qwen2ForSequenceClassification(config).eval()
    with torch.no_grad():  # a visible head: random init at std 0.02 would give scores near 0
        model.score.weight.normal_(0.0, 1.0)
    model.save_pretrained(root)
    return root


@pytest.fixture(scope="module")
def rm_dir(tmp_path_factory) -> Path:
    return build_reward_model(tmp_path_factory.mktemp("rm"))


def score_batch(seed: int = 0, rows: int = 7) -> dict[str, Ragged]:
    """Rows of varied length; row 1's response ends with the pad id (HF pools at the token before it),
    row 2 has an empty response."""
    rng = np.random.default_rng(seed)
    prompts = [rng.integers(1, VOCAB, rng.integers(2, 9)) for _ in range(rows)]
    responses = [rng.integers(1, VOCAB, rng.integers(1, 12)) for _ in range(rows)]
    responses[1] = np.concatenate([responses[1], [PAD]])
    responses[2] = np.zeros(0, dtype=np.int64)
    return {"prompt_ids": Ragged.from_rows(prompts, np.int32), "response_ids": Ragged.from_rows(responses, np.int32)}


def hf_scores(model_dir: Path, batch: dict[str, Ragged]) -> np.ndarray:
    """transformers in-process: the batch right-padded with the pad id, one forward, logits [rows, 1]."""
    model = AutoModelForSequenceClassification.from_pretrained(model_dir, dtype=torch.float32).eval()
    seqs = [
        np.concatenate([batch["prompt_ids"].row(i), batch["response_ids"].row(i)])
        for i in range(len(batch["prompt_ids"]))
    ]
    width = max(len(s) for s in seqs)
    ids = torch.full((len(seqs), width), PAD, dtype=torch.long)
    mask = torch.zeros((len(seqs), width), dtype=torch.long)
    for i, s in enumerate(seqs):
        ids[i, : len(s)] = torch.as_tensor(s)
        mask[i, : len(s)] = 1
    with torch.no_grad():
        return model(input_ids=ids, attention_mask=mask).logits[:, 0].numpy()


def test_the_service_scores_like_transformers_in_process(two_rank_trainer, rm_dir):
    stub, buffer = two_rank_trainer.stub, two_rank_trainer.buffer
    request = pb.ComputeScoresRequest(inputs=[batch_key("job", 0, "rollout")], output=batch_key("job", 0, "rm"))
    with pytest.raises(grpc.RpcError) as err:  # nothing loaded yet: no model for the role, nothing written
        stub.ComputeScores(request, timeout=60)
    assert err.value.code() == grpc.StatusCode.FAILED_PRECONDITION and "role 'reward'" in err.value.details()

    reply = stub.LoadModel(pb.LoadModelRequest(role=pb.ROLE_REWARD, model_path=str(rm_dir)), timeout=180)
    assert reply.architecture == "Qwen2ForSequenceClassification" and reply.vocab_size == VOCAB
    batch = score_batch()
    buffer.put(batch_key("job", 0, "rollout"), batch)
    request.micro_batch_tokens = 24  # several micro-batches per rank
    out = stub.ComputeScores(request, timeout=120)
    assert out.micro_batches >= 2 and out.tokens == int(sum(len(v.values) for v in batch.values()))
    scores = np.asarray(buffer.get_many([batch_key("job", 0, "rm")])["rm_scores"])
    expected = hf_scores(rm_dir, batch)
    assert scores.shape == (7,) and scores.dtype == np.float32
    np.testing.assert_allclose(scores, expected, atol=1e-4, rtol=0)
    assert np.ptp(expected) > 0.1  # the scores differ by row, so a wrong readout position would show

    wrong = pb.ComputeScoresRequest(role=pb.ROLE_ACTOR, inputs=request.inputs, output=batch_key("job", 0, "x"))
    with pytest.raises(grpc.RpcError) as err:
        stub.ComputeScores(wrong, timeout=60)
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT and "no score head" in err.value.details()
    logprobs = pb.ComputeLogProbsRequest(role=pb.ROLE_REWARD, inputs=request.inputs, output=batch_key("job", 0, "x"))
    with pytest.raises(grpc.RpcError) as err:
        stub.ComputeLogProbs(logprobs, timeout=60)
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT and "ComputeScores" in err.value.details()
    train = pb.TrainStepRequest(role=pb.ROLE_REWARD, inputs=request.inputs)
    with pytest.raises(grpc.RpcError) as err:
        stub.TrainStep(train, timeout=60)
    assert err.value.code() == grpc.StatusCode.FAILED_PRECONDITION and "frozen" in err.value.details()
    with pytest.raises(NotFound):  # no refused call wrote anything
        buffer.get_many([batch_key("job", 0, "x")])


def test_a_folder_that_is_no_reward_model_is_refused_and_nothing_is_loaded(tmp_path, rm_dir, qwen2_dir):
    core = TrainerCore()
    with pytest.raises(NotFound, match="has no config.json"):
        core.load_model("reward", str(tmp_path / "missing"))
    with pytest.raises(InvalidArgument, match="not a \\*ForSequenceClassification"):
        core.load_model("reward", str(qwen2_dir))  # a causal LM
    with pytest.raises(InvalidArgument, match="has 2 labels"):
        core.load_model("reward", str(build_reward_model(tmp_path / "two", num_labels=2)))
    headless = build_reward_model(tmp_path / "headless")
    from safetensors.torch import load_file, save_file

    tensors = load_file(headless / "model.safetensors")
    del tensors["score.weight"]
    save_file(tensors, headless / "model.safetensors", metadata={"format": "pt"})
    with pytest.raises(InvalidArgument, match="holds no 'score.weight'"):
        core.load_model("reward", str(headless))
    with pytest.raises(InvalidArgument, match="copy_from is not allowed"):
        core.load_model("reward", str(rm_dir), copy_from="actor")
    assert "reward" not in core.roles
