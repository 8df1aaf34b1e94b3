"""The replica's collective receive keeps its sink between updates (so an unchanged bucket's checks
are not redone) only while the engine's parameters are the very same tensors; a verify-only disk read
checks the mapped files and keeps nothing."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import torch

from meshrl.common import weights as W
from meshrl.common.net import free_port
from meshrl.rollout.weight_receiver import WeightReceiver


def tensors(seed: int) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return {
        "model.embed_tokens.weight": torch.randn(64, 16, generator=g),
        "lm_head.weight": torch.randn(8, generator=g),
    }


def test_the_sink_is_kept_for_the_same_parameters_and_rebuilt_for_new_ones():
    params = {n: torch.zeros_like(t) for n, t in tensors(0).items()}
    receiver = WeightReceiver(lambda: dict(params))  # a fresh mapping each call, as engines return
    port = free_port()
    spec = lambda rank: W.GroupSpec("127.0.0.1", port, 2, rank, "g", "gloo", 30.0)  # noqa: E731
    with ThreadPoolExecutor(2) as pool:
        trainer_f = pool.submit(W.WeightGroup.join, spec(0))
        receiver.join_group(spec(1))
        trainer = trainer_f.result(timeout=30)
        try:
            sinks = []
            for version in (1, 2, 3):
                if version == 3:
                    params["lm_head.weight"] = torch.zeros(8)  # the engine re-allocated a parameter
                sent = pool.submit(trainer.send, list(tensors(version).items()), version)
                assert receiver.receive_into_model("g", version - 1, version, 30, lambda: None)[1] is None
                sent.result(timeout=30)
                sinks.append(receiver._sinks["g"])
                assert all(torch.equal(params[n], t) for n, t in tensors(version).items())
            assert sinks[0] is sinks[1] and sinks[2] is not sinks[1]
        finally:
            receiver.close()
            trainer.destroy()


def test_read_disk_without_loading_verifies_the_mapped_files_and_keeps_nothing(tmp_path, monkeypatch):
    from meshrl.common.errors import DataLoss
    from meshrl.rollout.weight_receiver import read_disk

    folder = W.write_version(str(tmp_path), 1, list(tensors(1).items()), keep_last=0).path
    monkeypatch.setattr(W.VersionReader, "__iter__", lambda self: (_ for _ in ()).throw(AssertionError("read")))
    staged = read_disk(folder, 1, load=False)
    assert staged.version == 1 and staged.tensors == []
    data = next(p for p in Path(folder).iterdir() if p.suffix == ".safetensors")
    raw = bytearray(data.read_bytes())
    raw[-1] ^= 0xFF  # one flipped bit in the last tensor's bytes
    data.write_bytes(bytes(raw))
    with pytest.raises(DataLoss):
        read_disk(folder, 1, load=False)
