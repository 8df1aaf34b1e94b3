"""The contracts compile and the committed generated code matches them."""

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]


def test_generated_code_is_up_to_date():
    result = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "gen_protos.py"), "--check"], capture_output=True, text=True
    )
    assert result.returncode == 0, result.stdout + result.stderr


def test_a_broken_proto_fails_to_compile(tmp_path):
    from grpc_tools import protoc

    (tmp_path / "bad.proto").write_text('syntax = "proto3";\nmessage A { strin x = 1; }\n')
    assert protoc.main(["protoc", f"-I{tmp_path}", f"--python_out={tmp_path}", "bad.proto"]) != 0


def test_every_service_has_its_contract():
    from meshrl.api.databuffer.v1 import databuffer_pb2
    from meshrl.api.rollout.v1 import rollout_pb2
    from meshrl.api.scheduler.v1 import scheduler_pb2
    from meshrl.api.trainer.v1 import trainer_pb2

    names = {
        m.DESCRIPTOR.services_by_name.keys().__iter__().__next__()
        for m in (databuffer_pb2, rollout_pb2, scheduler_pb2, trainer_pb2)
    }
    assert names == {"DataBuffer", "Rollout", "Scheduler", "Trainer"}
