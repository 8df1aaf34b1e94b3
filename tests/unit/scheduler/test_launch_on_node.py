"""A service placed on a Ray node binds its node's address and sees only its bundle's GPUs."""

from meshrl.scheduler.launch.launcher import on_node


def test_a_placed_service_binds_its_node_and_sees_its_bundles_gpus():
    args, env = on_node(["--set", "a=1"], {"X": "1"}, "127.0.0.3", [2.0, 3])
    assert args == ["--set", "a=1", "--host", "127.0.0.3"]
    assert env == {"X": "1", "CUDA_VISIBLE_DEVICES": "2,3"}


def test_a_host_named_by_the_args_wins_and_no_gpus_means_none_visible():
    args, env = on_node(["--set", "server.host=0.0.0.0"], {}, "127.0.0.3", [])
    assert args == ["--set", "server.host=0.0.0.0"]
    assert env["CUDA_VISIBLE_DEVICES"] == ""
