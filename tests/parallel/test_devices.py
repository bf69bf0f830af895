"""One GPU per rank (tf_dlrm.parallel.devices), checked against a stand-in for ``tf.config`` that lists
devices as a host with GPUs would: no GPU exists on this project's machines."""

from __future__ import annotations

import os

import pytest

from tf_dlrm.parallel.devices import select_devices
from tf_dlrm.parallel.env import DistributedEnv


class Device:
    def __init__(self, name):
        self.name = name


class FakeConfig:
    """Records what select_devices asks of tf.config, for a host with ``count`` GPUs."""

    def __init__(self, count):
        self.gpus = [Device(f"/physical_device:GPU:{i}") for i in range(count)]
        self.visible, self.growth = None, []
        self.experimental = self

    def list_physical_devices(self, kind):
        return list(self.gpus) if kind == "GPU" else [Device("/physical_device:CPU:0")]

    def set_visible_devices(self, devices, kind):
        assert kind == "GPU"
        self.visible = [d.name for d in devices]

    def set_memory_growth(self, device, enabled):
        self.growth.append((device.name, enabled))


@pytest.fixture(autouse=True)
def kernels_setting():
    """select_devices switches the kernels off through the environment: give later tests of this process theirs back."""
    saved = os.environ.pop("TF_DLRM_DISABLE_KERNELS", None)
    yield
    os.environ.pop("TF_DLRM_DISABLE_KERNELS", None)
    if saved is not None:
        os.environ["TF_DLRM_DISABLE_KERNELS"] = saved


def test_each_rank_sees_its_local_gpu_with_memory_growth():
    for local_rank in range(4):
        config = FakeConfig(4)
        line = select_devices(DistributedEnv(rank=4 + local_rank, world_size=8, local_rank=local_rank, local_size=4),
                              tf_config=config)
        assert config.visible == [f"/physical_device:GPU:{local_rank}"]
        assert config.growth == [(f"/physical_device:GPU:{local_rank}", True)]
        assert line.startswith(f"devices: GPU {local_rank} of 4") and "not yet verified" in line
    assert os.environ["TF_DLRM_DISABLE_KERNELS"] == "1"  # CPU kernels off on a GPU placement


def test_cpu_flag_hides_the_gpus_and_no_gpu_changes_nothing():
    config = FakeConfig(2)
    assert select_devices(DistributedEnv(), use_gpu=False, tf_config=config) == "devices: CPU (--cpu; 2 GPU(s) hidden)"
    assert config.visible == [] and config.growth == []
    assert "TF_DLRM_DISABLE_KERNELS" not in os.environ
    config = FakeConfig(0)
    assert select_devices(DistributedEnv(), tf_config=config) == "devices: CPU (no GPU)" and config.visible is None


def test_more_ranks_than_gpus_is_refused():
    with pytest.raises(ValueError, match=r"local rank 2 of 3 ranks here, 2 GPU\(s\). Run at most 2 ranks per host, or pass --cpu"):
        select_devices(DistributedEnv(rank=2, world_size=3, local_rank=2, local_size=3), tf_config=FakeConfig(2))


def test_this_machine_has_no_gpu_and_keeps_its_kernels():
    assert select_devices(DistributedEnv()) == "devices: CPU (no GPU)"
