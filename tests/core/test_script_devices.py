"""A script's device string (api2): load_model_file(device="gpu9") showed torch's own error ("Invalid device
string: 'gpu9'"; "cuda:7" an AssertionError "Torch not compiled with CUDA enabled" on a machine without CUDA).
One ValueError names the device and the devices this machine has, by the rule --device meets
(core.devices.device_problem)."""
from __future__ import annotations

import pytest

from desktop_app.core.checkpoints import load_model_folder
from desktop_app.core.devices import available_devices
from desktop_app.core.formats import load_model_file
from desktop_app.paths import resources_dir

pytestmark = pytest.mark.usefixtures("one_torch_thread")


def _demo():
    return resources_dir() / "demo-model"


@pytest.mark.parametrize("load", [load_model_file, load_model_folder], ids=["load_model_file", "load_model_folder"])
@pytest.mark.parametrize("name,problem", [
    ("gpu9", "must be cpu, cuda, cuda:N or mps, got 'gpu9'"),
    ("cuda:x", "must be cpu, cuda, cuda:N or mps, got 'cuda:x'"),
    ("CPU", "must be cpu, cuda, cuda:N or mps, got 'CPU'"),
    ("cuda:\u0663", "must be cpu, cuda, cuda:N or mps, got 'cuda:\u0663'"),  # not cuda:3
    ("cuda:77", "cuda:77 is not available on this machine"),
])
def test_a_bad_device_string_is_one_line_naming_it_and_the_devices_there_are(load, name, problem):
    have = ", ".join(available_devices())
    with pytest.raises(ValueError) as exc:
        load(_demo(), device=name)
    message = str(exc.value)
    assert message.startswith(f"device: {problem}") and message.endswith(f"{have})"), message


def test_several_devices_are_each_checked_and_the_cpu_loads():
    with pytest.raises(ValueError, match=r"^device: must be cpu, cuda, cuda:N or mps, got 'gpu'"):
        load_model_file(_demo(), device="cpu,gpu")
    assert load_model_file(_demo(), device="cpu").model.device.type == "cpu"
