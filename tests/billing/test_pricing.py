"""The price catalog: packaged data, chips per type, capacities, region and user overrides, clear errors."""

from __future__ import annotations

from datetime import date

import pytest

from tpuops.billing.pricing import Catalog, catalog_of, region_of
from tpuops.core.errors import UsageError
from tpuops.core.kinds import Capacity
from tpuops.providers.cloud_tpu.offers import CLOUD_TPU

pytestmark = pytest.mark.unit

US, EU, ELSEWHERE = "us-central1-b", "europe-west4-a", "asia-east1-c"


@pytest.fixture
def catalog() -> Catalog:
    return catalog_of(CLOUD_TPU)


def test_the_packaged_catalog_says_where_its_prices_come_from(catalog: Catalog) -> None:
    assert "Cloud Billing Catalog" in catalog.source
    assert isinstance(catalog.retrieved, date)
    assert (catalog.currency, catalog.base_region) == ("USD", "us-central1")
    assert catalog.generations == ["v2", "v3", "v4", "v5e", "v5p", "v6e"]


@pytest.mark.parametrize(
    ("accelerator", "on_demand", "spot"),
    [
        ("v2-8", 4.50, 1.35),  # 4 chips
        ("v3-8", 8.00, 2.04),
        ("v3-32", 32.00, 8.16),  # 16 chips
        ("v4-8", 12.88, 3.686),
        ("v5p-8", 16.80, 3.36),
        ("v5litepod-8", 9.60, 1.96),  # v5e counts chips
        ("v5litepod-16", 19.20, 3.92),
        ("v6e-1", 2.70, 0.544),
        ("v6e-8", 21.60, 4.352),
    ],
)
def test_node_price_is_chips_times_the_chip_hour_price(catalog: Catalog, accelerator: str, on_demand: float,
                                                       spot: float) -> None:
    assert catalog.price_per_hour(accelerator, Capacity.ON_DEMAND, US) == pytest.approx(on_demand)
    assert catalog.price_per_hour(accelerator, "spot", US) == pytest.approx(spot)


def test_preemptible_is_priced_like_spot(catalog: Catalog) -> None:
    assert catalog.price_per_hour("v3-8", "preemptible", US) == catalog.price_per_hour("v3-8", Capacity.SPOT, US)
    assert catalog.price_per_hour("v3-8", "preemptible", US) < catalog.price_per_hour("v3-8", "on-demand", US)


def test_region_overrides_replace_only_the_fields_they_give(catalog: Catalog) -> None:
    assert catalog.price_per_hour("v3-8", "on-demand", EU) == pytest.approx(8.80)
    assert catalog.price_per_hour("v3-8", "spot", EU) == pytest.approx(2.244)
    assert catalog.price_per_hour("v6e-1", "on-demand", EU) == pytest.approx(2.97)
    assert catalog.price_per_hour("v6e-1", "spot", EU) == pytest.approx(0.544)  # no EU spot price: base
    assert catalog.price_per_hour("v2-8", "on-demand", EU) == pytest.approx(4.50)  # no v2 override in EU


def test_a_region_without_overrides_is_priced_like_the_base_region(catalog: Catalog) -> None:
    assert catalog.price_per_hour("v4-8", "spot", ELSEWHERE) == catalog.price_per_hour("v4-8", "spot", US)


def test_user_overrides_replace_our_prices_in_every_region(catalog: Catalog) -> None:
    mine = catalog.with_overrides({"v3": {"spot": 0.40}, "v6e": {"on_demand": 2.0, "spot": 0.3}})
    assert mine.price_per_hour("v3-8", "spot", US) == pytest.approx(1.60)
    assert mine.price_per_hour("v3-8", "spot", EU) == pytest.approx(1.60)
    assert mine.price_per_hour("v3-8", "on-demand", US) == pytest.approx(8.00)  # not overridden
    assert mine.price_per_hour("v3-8", "on-demand", EU) == pytest.approx(8.80)
    assert mine.price_per_hour("v6e-8", "on-demand", EU) == pytest.approx(16.0)
    assert catalog.price_per_hour("v3-8", "spot", US) == pytest.approx(2.04)  # the original is unchanged
    assert catalog.with_overrides({}) is catalog


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"v9": {"spot": 1.0}}, r"prices\.v9: unknown TPU generation \(known: v2, v3, v4, v5e, v5p, v6e\)"),
        ({"v3": {"ondemand": 1.0}}, r"prices\.v3: unknown key 'ondemand' \(allowed: on_demand, spot\)"),
        ({"v3": {"spot": -1}}, r"prices\.v3\.spot = -1 is not allowed"),
        ({"v3": {"spot": "cheap"}}, r"prices\.v3\.spot = 'cheap' is not allowed"),
        ({"v3": {"spot": True}}, r"prices\.v3\.spot = True is not allowed"),
        ({"v3": 2.0}, r"prices\.v3: expected a table"),
    ],
)
def test_bad_user_overrides_are_one_usage_error(catalog: Catalog, overrides: dict, message: str) -> None:
    with pytest.raises(UsageError, match=message) as caught:
        catalog.with_overrides(overrides)
    assert "\n" not in str(caught.value)


@pytest.mark.parametrize(
    ("accelerator", "capacity", "zone", "message"),
    [
        ("v7-8", "spot", US, "accelerator 'v7-8' is not a Cloud TPU type"),
        ("v3-12", "spot", US, "v3 comes in sizes"),
        ("tpu", "spot", US, "accelerator 'tpu' is not a Cloud TPU type"),
        ("v3-8", "reserved", US, "capacity 'reserved' is not one of spot, preemptible, on-demand"),
        ("v3-8", "spot", "us-central1", "zone 'us-central1' is not a zone name"),
    ],
)
def test_what_cannot_be_priced_is_a_clear_usage_error(catalog: Catalog, accelerator: str, capacity: str, zone: str,
                                                      message: str) -> None:
    with pytest.raises(UsageError, match=message):
        catalog.price_per_hour(accelerator, capacity, zone)


def test_a_generation_missing_from_the_catalog_is_named(catalog: Catalog) -> None:
    partial = Catalog.from_toml({"source": "test", "retrieved": date(2024, 1, 1), "currency": "USD",
                                 "base_region": "us-central1", "chip_hour": {"v2": {"on_demand": 1, "spot": 0.5}}},
                                CLOUD_TPU)
    assert partial.price_per_hour("v2-8", "on-demand", US) == 4.0
    with pytest.raises(UsageError, match=r"no price for TPU generation 'v3' \(priced: v2\)"):
        partial.price_per_hour("v3-8", "spot", US)


@pytest.mark.parametrize(
    ("data", "message"),
    [
        ({"chip_hour": {}}, "'source' is missing"),
        ({"chip_hour": {"v2": {"on_demand": 1.0}}}, r"chip_hour\.v2: spot is missing"),
        ({"chip_hour": {"v2": {"on_demand": 1.0, "spot": 0.5}}, "regions": {"eu-west9": {"v3": {"spot": 1.0}}}},
         r"regions\.eu-west9\.v3: no base price for generation 'v3'"),
    ],
)
def test_a_malformed_catalog_is_refused(data: dict, message: str) -> None:
    with pytest.raises(UsageError, match=message):
        Catalog.from_toml(data, CLOUD_TPU)


def test_region_of_a_zone() -> None:
    assert region_of("europe-west4-a") == "europe-west4"
    assert region_of("us-central1-f") == "us-central1"


@pytest.mark.parametrize("region_zone", [US, EU])
@pytest.mark.parametrize("capacity", list(Capacity))
@pytest.mark.parametrize(("slice_", "host"), [("v2-32", "v2-8"), ("v3-32", "v3-8"), ("v4-32", "v4-8")])
def test_a_4_host_slice_costs_4_times_its_one_host_type_on_every_capacity(
        catalog: Catalog, slice_: str, host: str, capacity: Capacity, region_zone: str) -> None:
    assert catalog.price_per_hour(slice_, capacity, region_zone) == pytest.approx(
        4 * catalog.price_per_hour(host, capacity, region_zone))
