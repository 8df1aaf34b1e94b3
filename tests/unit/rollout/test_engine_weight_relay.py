"""The SGLang / vLLM adapters' relay mode: the adapter is the one rank of a meshrl weight group, receives a
version over gloo and hands the engine a verified local folder. Before the fix every such update failed
(`.items()` on the received list) and the replica went stale."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import pytest
import torch
from _rollout_fake_servers import FakeSGLang, perturbed
from safetensors.torch import load_file

from meshrl.common import weights as W
from meshrl.common.net import free_port
from meshrl.rollout.config import EngineConfig
from meshrl.rollout.sglang_engine import SGLangEngine
from meshrl.rollout.types import GroupUpdate


@pytest.fixture
def relay_engine(model_dir):
    """SGLang's adapter (vLLM's relay runs against the real engine in tests/integration/vllm)."""
    fake = FakeSGLang()
    engine = SGLangEngine(EngineConfig(kind="sglang", model_path=str(model_dir), sglang={"url": fake.url}))
    yield fake, engine
    engine.shutdown()
    fake.close()


def test_relay_receives_over_the_group_and_the_engine_loads_the_folder(relay_engine, model_dir):
    fake, engine = relay_engine
    port = free_port()

    def spec(rank: int) -> W.GroupSpec:
        return W.GroupSpec("127.0.0.1", port, 2, rank, "relay-weights", "gloo", 60.0)

    with ThreadPoolExecutor(1) as pool:
        trainer_f = pool.submit(W.WeightGroup.join, spec(0))
        assert engine.init_weight_update_group(spec(1)) == 1
        trainer = trainer_f.result(timeout=60)
    try:
        new = perturbed(model_dir, 3)
        with ThreadPoolExecutor(1) as pool:
            sent = pool.submit(trainer.send, list(new.items()), 1, bucket_bytes=20_000)
            result = engine.update_weights_from_distributed(GroupUpdate("relay-weights", 1, timeout_seconds=60))
            sent.result(timeout=60)
        assert result.version == 1 and engine.weight_version == 1 and result.bytes > 0
        body = fake.calls("/update_weights_from_disk")[-1]
        folder, version = body["model_path"], body["weight_version"]
        assert version == "1"
        written = load_file(f"{folder}/model.safetensors")
        assert sorted(written) == sorted(new) and all(torch.equal(written[n], t) for n, t in new.items())
        assert engine.weight_checksums()[1] == W.tensor_checksums(new)
    finally:
        engine.destroy_weight_update_group("relay-weights")
        trainer.destroy()
