"""Accelerator types and the TF 2.9 runtime rules."""

from __future__ import annotations

import pytest

from tpuops.core.errors import UsageError
from tpuops.core.resources import TF_VERSION, TF_VERSION_PREFIX
from tpuops.providers.cloud_tpu.accelerators import (
    check_runtime_version,
    default_runtime_version,
    parse_accelerator,
    resolve_runtime_version,
)
from tpuops.providers.offers import AcceleratorShape

pytestmark = pytest.mark.unit


@pytest.mark.parametrize(
    ("text", "generation", "replicas", "chips", "hosts"),
    [
        ("v2-8", "v2", 8, 4, 1),
        ("v2-32", "v2", 32, 16, 4),
        ("v2-512", "v2", 512, 256, 64),
        ("v3-8", "v3", 8, 4, 1),
        ("v3-32", "v3", 32, 16, 4),
        ("v3-2048", "v3", 2048, 1024, 256),
        ("v4-8", "v4", 8, 4, 1),
        ("v4-16", "v4", 16, 8, 2),
        ("v5p-8", "v5p", 8, 4, 1),
        ("v5litepod-1", "v5e", 1, 1, 1),
        ("v5litepod-8", "v5e", 8, 8, 1),
        ("v5litepod-16", "v5e", 16, 16, 4),
        ("v6e-8", "v6e", 8, 8, 1),
        ("v6e-256", "v6e", 256, 256, 64),
    ],
)
def test_parse_counts_chips_and_hosts(text: str, generation: str, replicas: int, chips: int, hosts: int) -> None:
    acc = parse_accelerator(text)

    assert acc == AcceleratorShape(type=text, generation=generation, chips=chips, hosts=hosts, replicas=replicas)
    assert acc.multi_host is (hosts > 1)
    assert str(acc) == text


def test_accelerator_is_frozen() -> None:
    acc = parse_accelerator("v3-8")
    with pytest.raises(AttributeError):
        acc.hosts = 16  # type: ignore[misc]


@pytest.mark.parametrize("text", ["v9-8", "tpu", "", "v3", "v3-", "V3-8", "v3_8", "v3-8 ", "v5e-8", "gpu-8"])
def test_garbage_is_not_a_cloud_tpu_type(text: str) -> None:
    with pytest.raises(UsageError) as err:
        parse_accelerator(text)
    assert str(err.value) == (
        f"accelerator {text!r} is not a Cloud TPU type (expected e.g. v2-8, v3-8, v3-32, v4-8)"
    )


@pytest.mark.parametrize("text", ["v2-4", "v2-1024", "v3-12", "v3-4096", "v4-24", "v4-8192", "v5p-4",
                                  "v5litepod-3", "v5litepod-512", "v6e-0", "v3-08"])
def test_sizes_must_be_powers_of_two_in_range(text: str) -> None:
    with pytest.raises(UsageError, match=r"is not a Cloud TPU type") as err:
        parse_accelerator(text)
    assert "\n" not in str(err.value)


@pytest.mark.parametrize(
    ("text", "runtime"),
    [
        ("v2-8", "tpu-vm-tf-2.9.3"),
        ("v3-8", "tpu-vm-tf-2.9.3"),
        ("v2-32", "tpu-vm-tf-2.9.3-pod"),
        ("v3-32", "tpu-vm-tf-2.9.3-pod"),
        ("v4-8", "tpu-vm-tf-2.9.3-v4"),
        ("v4-16", "tpu-vm-tf-2.9.3-pod-v4"),
    ],
)
def test_default_runtime_version(text: str, runtime: str) -> None:
    assert default_runtime_version(text) == runtime
    assert default_runtime_version(parse_accelerator(text)) == runtime
    assert check_runtime_version(text, runtime) == runtime


def test_runtime_names_derive_from_the_one_tf_version() -> None:
    assert TF_VERSION.startswith(TF_VERSION_PREFIX + ".")
    assert default_runtime_version("v4-32") == f"tpu-vm-tf-{TF_VERSION}-pod-v4"


@pytest.mark.parametrize("text", ["v5litepod-8", "v5p-8", "v6e-8"])
def test_new_generations_have_no_tf29_runtime(text: str) -> None:
    with pytest.raises(UsageError, match=r"no TensorFlow 2\.9 runtime.*TF >= 2\.15 with PJRT") as err:
        default_runtime_version(text)
    assert "\n" not in str(err.value)


@pytest.mark.parametrize(
    ("text", "runtime", "right"),
    [
        ("v3-8", "tpu-vm-tf-2.9.3-pod", "tpu-vm-tf-2.9.3"),
        ("v3-32", "tpu-vm-tf-2.9.3", "tpu-vm-tf-2.9.3-pod"),
        ("v4-8", "tpu-vm-tf-2.9.3", "tpu-vm-tf-2.9.3-v4"),
        ("v4-16", "tpu-vm-tf-2.9.1-v4", "tpu-vm-tf-2.9.1-pod-v4"),
        ("v2-8", "tpu-vm-tf-2.9.2-v4", "tpu-vm-tf-2.9.2"),
    ],
)
def test_mismatched_tf29_runtime_names_the_right_one(text: str, runtime: str, right: str) -> None:
    with pytest.raises(UsageError, match=f"use '{right}'"):
        check_runtime_version(text, runtime)


def test_tf29_runtime_on_a_new_generation_is_refused() -> None:
    with pytest.raises(UsageError, match="v5p"):
        check_runtime_version("v5p-8", "tpu-vm-tf-2.9.3")


@pytest.mark.parametrize(
    ("text", "runtime"),
    [
        ("v3-8", "tpu-vm-tf-2.9.1"),
        ("v4-16", "tpu-vm-tf-2.9.3-pod-v4"),
        ("v4-8", "tpu-vm-tf-2.16.1-pjrt"),
        ("v5litepod-8", "v2-alpha-tpuv5-lite"),
        ("v3-8", "tpu-ubuntu2204-base"),
    ],
)
def test_fitting_and_foreign_runtimes_pass_through(text: str, runtime: str) -> None:
    assert check_runtime_version(text, runtime) == runtime




def test_resolve_runtime_version() -> None:
    assert resolve_runtime_version("v3-32") == "tpu-vm-tf-2.9.3-pod"
    assert resolve_runtime_version("v3-32", "tpu-vm-tf-2.9.1-pod") == "tpu-vm-tf-2.9.1-pod"
    with pytest.raises(UsageError):
        resolve_runtime_version("v3-32", "tpu-vm-tf-2.9.1")


def test_hosts_of_a_type_and_one_for_a_type_this_version_does_not_know() -> None:
    from tpuops.providers.cloud_tpu.offers import CLOUD_TPU
    from tpuops.providers.offers import hosts_of

    types = ("v3-8", "v2-32", "v3-32", "v4-32", "v9-8", "unknown")
    assert [hosts_of(CLOUD_TPU, t) for t in types] == [1, 4, 4, 4, 1, 1]


def test_a_slice_goes_only_to_the_zones_that_offer_it_and_a_single_host_is_left_to_the_api() -> None:
    from tpuops.providers.cloud_tpu.accelerators import offered_zones

    assert offered_zones("v2-32", ["us-central1-b", "us-central1-a"]) == ["us-central1-a"]
    assert offered_zones("v2-8", ["us-central1-a", "us-central1-b"]) == ["us-central1-a", "us-central1-b"]
    with pytest.raises(UsageError, match=r"slice 'v4-32' is not offered in us-central1-a: us-central2-b offers it"):
        offered_zones("v4-32", ["us-central1-a"])
