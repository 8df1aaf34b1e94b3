"""The Rollout gRPC service in-process, over a real data buffer (the machine's Redis, unique prefix):
GenerateBatch writes one row per sample with the schema's columns; bad input is INVALID_ARGUMENT
with the reason and the replica keeps serving; control RPCs."""

from __future__ import annotations

import grpc
import numpy as np
import pytest
from _rollout_served import serve_replica

from meshrl.api.rollout.v1 import rollout_pb2 as pb
from meshrl.common import batch_schema as S
from meshrl.common.batch_key import batch_key
from meshrl.common.codec import Ragged
from meshrl.common.errors import InvalidArgument
from meshrl.rollout.replica import RolloutReplica
from meshrl.rollout.types import GenerationRequest, SamplingParams
from meshrl.scheduler.fleet.router import sampling_params
from tests._databuffer import served_client


@pytest.fixture(scope="module")
def buffer():
    with served_client("rollout") as client:
        yield client


@pytest.fixture(scope="module")
def stub(engine, buffer):
    replica = RolloutReplica(engine, replica_id="unit-0", capacity=16, databuffer=buffer, buffer_wait_s=5)
    with serve_replica(replica) as served:
        yield served


def stream(stub, prompt, **sampling):
    req = pb.GenerateRequest(prompt_ids=prompt, sampling=pb.SamplingParams(**sampling))
    return list(stub.GenerateStream(req, timeout=60))


def test_generate_batch_writes_one_row_per_sample(stub, buffer, engine):
    prompts = [[1, 2, 3], [4, 5], [6, 7, 8, 9]]
    answers = [b"a", b"bb", b""]
    source = batch_key("job-s", 3, "data")
    buffer.put(
        source,
        {
            S.PROMPT_IDS: Ragged.from_rows(prompts, dtype=np.int32),
            S.ANSWER: Ragged.from_rows([np.frombuffer(a, np.uint8) for a in answers], dtype=np.uint8),
        },
    )
    out = batch_key("job-s", 3, "rollout")
    sampling = pb.SamplingParams(temperature=0, max_tokens=6, ignore_eos=True)
    reply = stub.GenerateBatch(
        pb.GenerateBatchRequest(input=source, output=out, sampling=sampling, n=2, job_id="job-s", step=3), timeout=60
    )
    assert reply.samples == 6 and reply.generated_tokens == 36 and reply.prompt_tokens == 18
    batch = buffer.get(out)
    assert batch.num_rows() == 6
    assert batch[S.GROUP_INDEX].tolist() == [0, 0, 1, 1, 2, 2]
    assert [r.tolist() for r in batch[S.PROMPT_IDS].rows()] == [p for p in prompts for _ in range(2)]
    assert [bytes(r) for r in batch[S.ANSWER].rows()] == [a for a in answers for _ in range(2)]
    assert batch[S.RESPONSE_IDS].values.dtype == np.int32
    assert batch[S.ROLLOUT_LOGPROBS].values.dtype == np.float32
    assert batch[S.RESPONSE_VERSIONS].values.dtype == np.int32  # 4 bytes a token: the versions are small
    expected = engine.generate(
        [GenerationRequest(p, SamplingParams(temperature=0, max_tokens=6, ignore_eos=True)) for p in prompts]
    )
    for i, row in enumerate(batch[S.RESPONSE_IDS].rows()):
        assert row.tolist() == expected[i // 2].token_ids
        assert np.allclose(batch[S.ROLLOUT_LOGPROBS].row(i), expected[i // 2].logprobs, atol=1e-5)
    meta = batch.samples
    assert [m.index_in_group for m in meta] == [0, 1] * 3
    assert meta[2].group_id == meta[3].group_id != meta[0].group_id
    assert all(m.job_id == "job-s" and m.step == 3 and m.finish_reason == 2 for m in meta)
    # a prompt range, as a router sends it: the replica reads only those rows of its declared columns
    shard = batch_key("job-s", 3, "rollout", shard=1)
    before = buffer.stats()
    reply = stub.GenerateBatch(
        pb.GenerateBatchRequest(
            input=source, output=shard, sampling=sampling, n=1, row_begin=1, row_end=3, columns=[S.PROMPT_IDS]
        ),
        timeout=60,
    )
    after = buffer.stats()
    assert (after.get_calls - before.get_calls, after.get_rows - before.get_rows) == (1, 2)
    assert after.get_bytes - before.get_bytes == sum(np.asarray(p, np.int32).nbytes for p in prompts[1:3])
    got = buffer.get(shard)
    assert reply.samples == 2 and got[S.GROUP_INDEX].tolist() == [1, 2] and S.ANSWER not in got.columns
    assert [r.tolist() for r in got[S.PROMPT_IDS].rows()] == prompts[1:3]


BAD = [
    ({"prompt": [], "max_tokens": 4}, "empty"),
    ({"prompt": [1, 2], "max_tokens": 0}, "max_tokens"),
    ({"prompt": [1, 2], "max_tokens": -3}, "max_tokens"),
    ({"prompt": list(range(96)), "max_tokens": 4}, "context"),
    ({"prompt": [1, 99999], "max_tokens": 4}, "vocabulary"),
    ({"prompt": [1, 2], "max_tokens": 4, "top_p": 1.5}, "top_p"),
    ({"prompt": [1, 2], "max_tokens": 4, "temperature": -1}, "temperature"),
]


@pytest.mark.parametrize("case,reason", BAD)
def test_bad_input_is_invalid_argument_and_the_replica_keeps_serving(stub, case, reason):
    case = dict(case)
    prompt = case.pop("prompt")
    with pytest.raises(grpc.RpcError) as err:
        stream(stub, prompt, **case)
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert reason in err.value.details()
    chunks = stream(stub, [1, 2, 3], temperature=0, max_tokens=3, ignore_eos=True)
    assert sum(len(c.token_ids) for c in chunks) == 3


def test_bad_batch_requests(stub, buffer):
    source = batch_key("job-b", 0, "data")
    buffer.put(source, {S.PROMPT_IDS: Ragged.from_rows([[1, 2], [], [3]], dtype=np.int32)})
    ok = pb.SamplingParams(temperature=0, max_tokens=2)
    cases = [
        (dict(n=1, row_begin=0, row_end=9), "rows"),
        (dict(n=-1), "n = -1"),
        (dict(n=1), "prompt row 1"),  # the empty prompt is named
    ]
    for kwargs, reason in cases:
        with pytest.raises(grpc.RpcError) as err:
            stub.GenerateBatch(
                pb.GenerateBatchRequest(input=source, output=batch_key("job-b", 0, "out"), sampling=ok, **kwargs),
                timeout=30,
            )
        assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT, kwargs
        assert reason in err.value.details()


def test_unknown_sampling_keys_are_refused_with_the_closest_name():
    with pytest.raises(InvalidArgument, match="did you mean 'max_tokens'"):
        SamplingParams.from_dict({"max_token": 5})
    with pytest.raises(InvalidArgument, match="did you mean 'temperature'"):
        sampling_params({"temprature": 0.5})
    assert SamplingParams.from_dict({"max_tokens": 5, "stop_token_ids": [1]}).stop_token_ids == (1,)
    assert sampling_params({"max_tokens": 5}).max_tokens == 5


def test_control_rpcs(stub):
    status = stub.GetStatus(pb.GetStatusRequest(), timeout=10)
    assert status.replica_id == "unit-0" and status.engine == "transformers" and status.capacity == 16
    assert status.state == pb.REPLICA_STATE_SERVING
    stub.Pause(pb.PauseRequest(mode=2), timeout=10)
    assert stub.GetStatus(pb.GetStatusRequest(), timeout=10).state == pb.REPLICA_STATE_PAUSED
    stub.Continue(pb.ContinueRequest(), timeout=10)
    assert stub.GetStatus(pb.GetStatusRequest(), timeout=10).state == pb.REPLICA_STATE_SERVING
    assert stub.FlushCache(pb.FlushCacheRequest(), timeout=10).flushed
    sums = stub.GetWeightChecksums(pb.GetWeightChecksumsRequest(names=["model.norm.weight"]), timeout=10)
    assert len(sums.sha256["model.norm.weight"]) == 64
    with pytest.raises(grpc.RpcError) as err:
        stub.GetWeightChecksums(pb.GetWeightChecksumsRequest(names=["nope"]), timeout=10)
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    chunks = list(
        stub.GenerateStream(
            pb.GenerateRequest(prompt_text="12+3=", sampling=pb.SamplingParams(max_tokens=3, temperature=0)), timeout=30
        )
    )
    assert sum(len(c.token_ids) for c in chunks) >= 1 and chunks[-1].finish_reason in (1, 2)
