"""The shared Cloud TPU catalog (package data) and the validation that reads it."""

from __future__ import annotations

import json
import re
from importlib import resources

import pytest

from tpuops.core.errors import UsageError
from tpuops.providers.cloud_tpu.accelerators import check_runtime_version, parse_accelerator, zones_offering
from tpuops.providers.cloud_tpu.catalog import DATA_FILE, load, parse

pytestmark = pytest.mark.unit


def test_the_file_names_its_source_and_date():
    raw = json.loads(resources.files("tpuops.providers.cloud_tpu").joinpath(DATA_FILE).read_text())
    assert "regions and zones" in raw["source"] and "software versions" in raw["source"]
    assert re.fullmatch(r"\d{4}-\d{2}-\d{2}", raw["retrieved"])


def test_inputs_of_googles_samples_are_offered():
    catalog = load()
    assert catalog.offers("us-south1-a", "v5litepod-1")
    assert "tpu-vm-tf-2.17.0-pjrt" in catalog.runtime_versions
    assert catalog.from_config("V2", "2x2").name == "v2-8"
    assert catalog.offers("us-central1-b", "v2-8")


@pytest.mark.parametrize("version", ["tpu-vm-tf-2.9.3-pod-v4", "tpu-vm-tf-2.15.0-se", "tpu-vm-tf-2.16.1-pod-pjrt",
                                     "tpu-ubuntu2204-base", "v2-alpha-tpuv6e", "tpu-vm-pt-2.0", "tpu-vm-base"])
def test_runtime_families(version):
    assert version in load().runtime_versions


def test_every_zone_offers_only_known_types_and_each_type_has_one_topology():
    catalog = load()
    assert len(catalog.zones) >= 17
    for names in catalog.zones.values():
        assert names and names <= set(catalog.accelerators)
    pairs = [(spec.config_type, spec.topology) for spec in catalog.accelerators.values()]
    assert len(pairs) == len(set(pairs))
    assert catalog.zones_offering("v4-8") == ["us-central2-b"]


def test_a_zone_naming_an_unknown_type_is_refused():
    raw = json.loads(resources.files("tpuops.providers.cloud_tpu").joinpath(DATA_FILE).read_text())
    raw["zones"]["us-central1-a"].append("v3-9")
    with pytest.raises(ValueError, match="v3-9"):
        parse(raw)


def test_validation_uses_the_catalog():
    assert parse_accelerator("v5p-12288").hosts == 1536
    with pytest.raises(UsageError, match=r"v5litepod comes in sizes \(chips\) 1, 4, 8"):
        parse_accelerator("v5litepod-2")
    assert zones_offering("v5litepod-1") == ["asia-southeast1-b", "europe-west4-b", "us-central1-a", "us-south1-a",
                                             "us-west1-c", "us-west4-a"]
    with pytest.raises(UsageError, match=r"'tpu-vm-tf-2\.9\.4' is not a Cloud TPU runtime version"):
        check_runtime_version("v3-8", "tpu-vm-tf-2.9.4")
    assert check_runtime_version("v5litepod-1", "tpu-vm-tf-2.17.0-pjrt") == "tpu-vm-tf-2.17.0-pjrt"
