"""The GPU measurement path, on the parts that run without a GPU: NVML board matching by PCI bus id (a fake
NVML), the profile option and ``timings_synchronised``, the allocator release between methods, data-parallel GPU
shares for device-mapped targets, where draft heads read the target's features."""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest
import torch

from harness.measure.records import read_records
from harness.measure.trackers import Nvml, Tracker, model_devices, pci_bus_id
from harness.run.config import ConfigError, MethodSpec, RunConfig, config_from_dict
from harness.run.runner import process_device, process_gpus, run
from tests.support.helpers import tiny_target


class FakeNvml:
    """pynvml's calls used by :class:`Nvml`, over boards named by bus id (NVML's own order: index in ``boards``)."""

    def __init__(self, boards: dict[str, dict]):
        self.boards = boards
        self.looked_up: list[str] = []

    def nvmlDeviceGetHandleByIndex(self, index):  # what the old code used: the wrong board under CUDA_VISIBLE_DEVICES
        return list(self.boards)[index]

    def nvmlDeviceGetHandleByPciBusId(self, bus):
        self.looked_up.append(bus)
        if bus not in self.boards:
            raise RuntimeError(f"NVML_ERROR_NOT_FOUND {bus}")
        return bus

    def nvmlDeviceGetTotalEnergyConsumption(self, handle):
        return self.boards[handle]["energy_mj"]

    def nvmlDeviceGetMemoryInfo(self, handle):
        return SimpleNamespace(used=self.boards[handle]["used"])

    def nvmlDeviceGetName(self, handle):
        return b"Fake GPU"

    def nvmlSystemGetDriverVersion(self):
        return "1.0"

    def nvmlDeviceGetEnforcedPowerLimit(self, handle):
        return 700_000


BOARDS = {"00000000:18:00.0": {"energy_mj": 1000, "used": 10},
          "00000000:3B:00.0": {"energy_mj": 5000, "used": 20},
          "00000000:86:00.0": {"energy_mj": 7000, "used": 40}}


def props(bus: int):
    return SimpleNamespace(pci_domain_id=0, pci_bus_id=bus, pci_device_id=0)


def test_pci_bus_id_format():
    """NVML's bus id spelling: an 8-digit domain, hex bus, device, function 0; None when torch does not say."""
    assert pci_bus_id(props(0x3B)) == "00000000:3B:00.0"
    assert pci_bus_id(SimpleNamespace(name="x")) is None


def test_nvml_reads_the_board_torch_uses_not_nvml_index_0():
    """CUDA_VISIBLE_DEVICES=1 makes NVML's board 1 torch's cuda:0. Matching by PCI bus id reads board 1's
    counters; matching by index (the old code) would read board 0's."""
    fake = FakeNvml(BOARDS)
    nvml = Nvml([0], nvml=fake, properties=lambda i: props(0x3B))  # torch's cuda:0 is the board at bus 3B
    assert nvml.devices == ["00000000:3B:00.0"]
    assert (nvml.energy_mj(), nvml.used_bytes()) == (5000, 20)
    assert fake.nvmlDeviceGetHandleByIndex(0) == "00000000:18:00.0"  # what index 0 would have read
    assert nvml.info()["nvml_devices"] == ["00000000:3B:00.0"] and nvml.info()["power_limit_w"] == 700


def test_nvml_sums_the_boards_of_a_device_map_and_refuses_an_unmatched_board():
    """A target spread over cuda:0 and cuda:1 uses two boards: energy and memory are their sums, and the bus ids
    say which. A device NVML cannot match gives no reading at all (not another board's)."""
    buses = {0: 0x3B, 1: 0x86, 2: 0x99}
    both = Nvml([0, 1], nvml=FakeNvml(BOARDS), properties=lambda i: props(buses[i]))
    assert (both.energy_mj(), both.used_bytes()) == (12000, 60)
    assert both.devices == ["00000000:3B:00.0", "00000000:86:00.0"]
    missing = Nvml([0, 2], nvml=FakeNvml(BOARDS), properties=lambda i: props(buses[i]))
    assert (missing.energy_mj(), missing.used_bytes(), missing.devices) == (None, None, [])
    assert "NOT_FOUND 00000000:99:00.0" in missing.info()["nvml_error"]


def test_tracker_on_cpu_reads_energy_through_the_given_nvml():
    """The tracker turns the energy counter difference into joules over the turn (none of the CUDA calls run on
    a CPU device)."""
    fake = FakeNvml({"00000000:3B:00.0": {"energy_mj": 1000, "used": 1}})
    tracker = Tracker("cpu", nvml=Nvml([0], nvml=fake, properties=lambda i: props(0x3B)))
    with tracker.track() as m:
        fake.boards["00000000:3B:00.0"]["energy_mj"] = 3500
    assert m.energy_j == pytest.approx(2.5) and m.mean_power_w > 0
    assert m.cuda_peak_allocated_bytes is None and m.rss_bytes > 0


def test_process_gpus_are_disjoint_and_cover_every_gpu():
    """Data parallel + device map: each process spreads its target over its own GPUs (before, every process
    spread over all of them). Too few GPUs is a one-line error naming the option."""
    assert [process_gpus(r, 3, 8) for r in range(3)] == [[0, 1, 2], [3, 4, 5], [6, 7]]
    assert [process_gpus(r, 2, 2) for r in range(2)] == [[0], [1]]
    with pytest.raises(ConfigError, match="run.device_map: 4 data-parallel processes need at least 4 GPUs"):
        process_gpus(0, 4, 2)


def test_process_device_names_a_device_the_loader_takes():
    """Data parallel with ``device: auto``: accelerate names a CPU process's device ``cpu:0``; passed on as it was,
    the loader refused it and both processes of `accelerate launch ... --preset long_context` (no device in the
    preset) died before the first question. A GPU process keeps its own index."""
    assert process_device(torch.device("cpu", 0)) == "cpu"
    assert process_device("cpu") == "cpu"
    assert process_device(torch.device("cuda", 3)) == "cuda:3"
    assert process_device("mps") == "mps"


def test_model_devices_lists_every_shard():
    """The tracker sums over the devices holding parameters; a CPU model is one device."""
    assert model_devices(torch.nn.Linear(2, 2), "cpu") == [torch.device("cpu")]


def test_features_go_to_the_lm_head_device():
    """With a device map the embedding sits on the first GPU and lm_head on the last: draft heads live, and get
    the target's features, where lm_head is (a head on the embedding's GPU met features from the last one)."""
    from harness.engine.speculative import SpeculativeMethod

    target = tiny_target()
    assert target.output_device == torch.device("cpu")
    target.model.get_output_embeddings = lambda: SimpleNamespace(weight=SimpleNamespace(device=torch.device("cuda", 1)))
    assert target.output_device == torch.device("cuda", 1)
    assert SpeculativeMethod(target).feature_device == torch.device("cuda", 1)


# ---- the profile option and what the records say ----------------------------------------------------------------
@pytest.fixture()
def suite_file(tmp_path):
    p = tmp_path / "q.jsonl"
    p.write_text(json.dumps({"question_id": 1, "category": "x", "turns": ["Say hi."]}) + "\n")
    return p


@pytest.mark.parametrize("profile, synced", [("on", True), ("off", False), ("auto", True)])
def test_profile_option_reaches_the_method_and_the_record(tmp_path, suite_file, profile, synced, monkeypatch):
    """profile on/off decides whether the draft/verify/overhead split is synchronised (auto: on for CPU), and each
    record says which; vanilla has no split (None). The allocator is released before every method, so a
    method's peak memory cannot include what the one before it cached."""
    import harness.run.runner as runner

    released = []
    monkeypatch.setattr(runner, "release_cached_memory", lambda devices: released.append(list(devices)))
    cfg = RunConfig(methods=[MethodSpec("vanilla"), MethodSpec("pld")], suites=[str(suite_file)], max_new_tokens=6,
                    warmup=0, output_dir=str(tmp_path / "r"), profile=profile)
    recs = read_records(run(cfg, target=tiny_target(eos=False), progress=False))
    by_label = {r["label"]: r for r in recs}
    assert by_label["pld"]["timings_synchronised"] is synced
    assert by_label["vanilla"]["timings_synchronised"] is None
    assert len(by_label["pld"]["logit_margins"]) == by_label["pld"]["new_tokens"]  # greedy: margins recorded
    assert released == [[torch.device("cpu")], [torch.device("cpu")]]


def test_profile_option_is_validated_and_yaml_on_off_work():
    """YAML reads on/off as booleans; anything else names the field."""
    assert config_from_dict({"profile": True}).profile == "on"
    assert config_from_dict({"profile": False}).profile == "off"
    with pytest.raises(ConfigError, match="run.profile: must be auto, on or off"):
        RunConfig(profile="sometimes")


def test_versions_older_than_the_checked_ones_are_refused_in_one_line():
    """A torch or transformers older than any draftbench was checked with (torch 2.11 on CUDA, transformers 5.24)
    is refused before a model loads, with one line naming the package and both versions; the checked ones and newer
    (local builds like +cu130 and .dev suffixes included) pass. Letting 5.17 through would fail later, inside
    transformers, with a traceback about caches."""
    from harness.measure.env import check_versions, release

    assert release("2.11.0+cu130") == (2, 11, 0) and release("5.24.0.dev0") == (5, 24, 0)
    assert release("2.13.0a1") == (2, 13, 0)
    check_versions({"torch": "2.11.0+cu130", "transformers": "5.24.0"})
    check_versions({"torch": "2.15.1", "transformers": "5.30.0.dev0"})
    with pytest.raises(ValueError, match=r"^transformers 5\.17\.0 is older than 5\.24, the oldest draftbench was "
                                         r"checked with .*; install a newer one$"):
        check_versions({"torch": "2.11.0+cu130", "transformers": "5.17.0"})
    with pytest.raises(ValueError, match=r"^torch 2\.9\.1 is older than 2\.11"):
        check_versions({"torch": "2.9.1", "transformers": "5.24.0"})
