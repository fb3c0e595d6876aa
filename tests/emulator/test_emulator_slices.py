"""A pod slice on the emulator is its hosts: every worker boots, has its address, metadata, guest attributes and log.

A v3-32 is 4 workers. Each runs the startup script in a process group of its own, sees its own metadata
(``agent-worker-number``, ``worker-network-endpoints``, ``tpu-env`` ...) and writes its own guest
attributes; the Node lists the workers' addresses in ``networkEndpoints``, in worker order, and is
preempted whole. With the VM image's TensorFlow, every worker of a ``-pod`` runtime serves TensorFlow's
gRPC server on its address:8470 (the TPU runtime stand-in), and ``health`` follows those servers.
Startup scripts are bash and curl, as on a VM image.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from google.cloud import tpu_v2
from google.oauth2.credentials import Credentials
from helpers import TF_PYTHON

from tpuops.emulator import control
from tpuops.emulator.vm.sandbox import live_groups
from tpuops.emulator.vm.workers import runtime_answers

PROJECT = "proj-test"
ZONE = "europe-west4-a"
PARENT = f"projects/{PROJECT}/locations/{ZONE}"

pytestmark = [pytest.mark.emulator,
              pytest.mark.skipif(not Path("/proc").is_dir(), reason="the emulator's sandboxes need Linux /proc")]

# Every worker records what its metadata server tells it, publishes a guest attribute, and stays up.
WORKER_SCRIPT = """
md() { curl -s --noproxy '*' -H 'Metadata-Flavor: Google' "http://$GCE_METADATA_HOST/computeMetadata/v1/$1"; }
for key in agent-worker-number worker-network-endpoints accelerator-type instance-id tpu-env; do
  md "instance/attributes/$key" > "$key.txt"
done
curl -s --noproxy '*' -X PUT -H 'Metadata-Flavor: Google' --data "worker-$(cat agent-worker-number.txt)" \\
  "http://$GCE_METADATA_HOST/computeMetadata/v1/instance/guest-attributes/tpuops/who"
echo "booted worker $(cat agent-worker-number.txt)"
echo $$ > script.pid
exec sleep 600
"""


def _client(info: control.EmulatorInfo) -> tpu_v2.TpuClient:
    return tpu_v2.TpuClient(credentials=Credentials(info.token), transport="rest",
                            client_options={"api_endpoint": info.endpoint})


def _create(client: tpu_v2.TpuClient, finish: Callable[..., Any], node_id: str, accelerator: str = "v3-32",
            runtime: str = "tpu-vm-tf-2.9.3-pod") -> tpu_v2.Node:
    node = tpu_v2.Node(accelerator_type=accelerator, runtime_version=runtime, scheduling_config={"spot": True},
                       metadata={"startup-script": WORKER_SCRIPT})
    return finish(client.create_node(parent=PARENT, node_id=node_id, node=node))


def _workers(admin: control.AdminClient, node_id: str) -> list[dict[str, Any]]:
    return next(node for node in admin.nodes() if node["name"] == f"{PARENT}/nodes/{node_id}")["workers"]


def _read(path: Path) -> str:
    return path.read_text() if path.exists() else ""


def _booted(admin: control.AdminClient, node_id: str) -> list[dict[str, Any]]:
    """The node's workers once each has written all it learned (its script reached ``exec sleep``)."""
    workers = _workers(admin, node_id)
    return workers if all((Path(w["sandbox"]) / "script.pid").exists() for w in workers) else []


def test_a_v3_32_is_four_workers_each_with_its_own_address_metadata_and_log(
    tpu_client: tpu_v2.TpuClient, emulator_admin: control.AdminClient, finish: Callable[..., Any],
    wait_until: Callable[..., Any],
) -> None:
    created = _create(tpu_client, finish, "slice")
    one_host = _create(tpu_client, finish, "single", "v3-8", "tpu-vm-tf-2.9.3")
    workers = wait_until(lambda: _booted(emulator_admin, "slice"))

    addresses = [endpoint.ip_address for endpoint in created.network_endpoints]
    assert addresses == [worker["address"] for worker in workers], "networkEndpoints are the workers, in order"
    assert len(set(addresses)) == 4 and all(a.startswith("127.0.") and not a.startswith("127.0.0.") for a in addresses)
    assert {endpoint.port for endpoint in created.network_endpoints} == {8470}
    assert [e.ip_address for e in one_host.network_endpoints] == ["127.0.0.1"], "a single host is as before"
    assert created.health == tpu_v2.Node.Health.HEALTHY, "no runtime to ask without the image's TensorFlow"

    groups = [worker["pgid"] for worker in workers]
    assert len(set(groups)) == 4 and set(groups) <= live_groups(), "one live process group per worker"
    endpoints = _read(Path(workers[0]["sandbox"]) / "worker-network-endpoints.txt")
    uid = str(created.id)
    for number, worker in enumerate(workers):
        home = Path(worker["sandbox"])
        assert _read(home / "agent-worker-number.txt") == str(number)
        assert _read(home / "accelerator-type.txt") == "v3-32"
        assert _read(home / "instance-id.txt") == f"{uid}-w-{number}"
        assert _read(home / "worker-network-endpoints.txt") == endpoints
        env = _read(home / "tpu-env.txt")
        for line in (f"WORKER_ID: '{number}'", "ACCELERATOR_TYPE: 'v3-32'", "NODE_ID: 'slice'", f"ZONE: '{ZONE}'",
                     "TOPOLOGY: '4x4'"):
            assert line in env.splitlines(), env
        assert f"booted worker {number}" in _read(home / "startup-script.log"), "each worker has its own log"
    assert [entry.split(":")[1:] for entry in endpoints.split(",")] == [[uid, address] for address in addresses]

    answer = tpu_client.get_guest_attributes(request={"name": created.name, "query_path": "tpuops/who"})
    assert [[item.value for item in worker.query_value.items] for worker in answer.guest_attributes] == [
        [f"worker-{n}"] for n in range(4)
    ]


def test_v4_32_slices_have_four_hosts_each_and_share_no_address(
    emulator: control.EmulatorInfo, finish: Callable[..., Any], wait_until: Callable[..., Any],
) -> None:
    """Hosts come from the topology (v4-32: 2x2x4 chips, 4 per host); no address serves two workers."""
    client, admin = _client(emulator), control.AdminClient(emulator.endpoint, token=emulator.token)
    parent = f"projects/{PROJECT}/locations/us-central2-b"
    nodes = [
        finish(client.create_node(parent=parent, node_id=node_id, node=tpu_v2.Node(
            accelerator_type="v4-32", runtime_version="tpu-vm-tf-2.9.3-pod-v4", scheduling_config={"spot": True},
            metadata={"startup-script": WORKER_SCRIPT})))
        for node_id in ("v4-a", "v4-b")
    ]
    addresses = [endpoint.ip_address for node in nodes for endpoint in node.network_endpoints]
    assert len(addresses) == 8 and len(set(addresses)) == 8
    workers = wait_until(lambda: (w := next(n for n in admin.nodes() if n["name"] == nodes[0].name)["workers"])
                         and all((Path(x["sandbox"]) / "script.pid").exists() for x in w) and w)
    env = _read(Path(workers[3]["sandbox"]) / "tpu-env.txt").splitlines()
    assert {"WORKER_ID: '3'", "TOPOLOGY: '2x2x4'", "HOST_BOUNDS: '1,1,4'", "ACCELERATOR_TYPE: 'v4-32'"} <= set(env)


def test_preempting_a_slice_ends_every_workers_processes(
    tpu_client: tpu_v2.TpuClient, emulator_admin: control.AdminClient, finish: Callable[..., Any],
    wait_until: Callable[..., Any],
) -> None:
    """By hand and by the random preemption rate: the whole slice goes, every worker's group with it."""
    for node_id in ("by-hand", "by-chance"):
        _create(tpu_client, finish, node_id)
        workers = wait_until(lambda node_id=node_id: _booted(emulator_admin, node_id))
        if node_id == "by-hand":
            emulator_admin.preempt(PROJECT, ZONE, node_id, grace_s=0.5)
        else:
            emulator_admin.set_faults(preempt_rate_per_s=100.0, seed=1)
        name = f"{PARENT}/nodes/{node_id}"
        wait_until(lambda name=name: tpu_client.get_node(name=name).state == tpu_v2.Node.State.PREEMPTED)
        emulator_admin.clear_faults()
        assert not {worker["pgid"] for worker in workers} & live_groups(), "no worker's processes survive"


def test_a_worker_that_never_boots_runs_nothing(
    tpu_client: tpu_v2.TpuClient, emulator_admin: control.AdminClient,
    finish: Callable[..., Any], wait_until: Callable[..., Any],
) -> None:
    emulator_admin.set_faults(never_boot_workers=["late/2"])
    _create(tpu_client, finish, "late", "v2-32", "tpu-vm-tf-2.9.3-pod")
    booted = [0, 1, 3]
    workers = wait_until(lambda: (w := _workers(emulator_admin, "late"))
                         and all((Path(w[n]["sandbox"]) / "script.pid").exists() for n in booted) and w)
    assert workers[2]["never_boots"] and workers[2]["script_runs"] == []
    assert not (Path(workers[2]["sandbox"]) / "startup-script.log").exists()
    assert emulator_admin.set_faults()["never_boot_workers"] == [], "the fault acts once"


def test_fault_entries_must_name_a_node_and_a_worker(emulator_admin: control.AdminClient) -> None:
    from tpuops.core import errors

    with pytest.raises(errors.InvalidRequest, match="NODE/WORKER"):
        emulator_admin.set_faults(kill_runtimes=["slice"])
    with pytest.raises(errors.InvalidRequest, match="NODE/WORKER"):
        emulator_admin.set_faults(never_boot_workers=["Slice/x"])


# ----- with the VM image's TensorFlow: the TPU runtime stand-in on every worker

@pytest.fixture
def tf_emulator(tmp_path: Path) -> Iterator[control.EmulatorInfo]:
    """An emulator whose nodes' image python is TensorFlow 2.9 (``.venv-tf29``), as ``tpuops`` starts it."""
    if not os.access(TF_PYTHON, os.X_OK):
        pytest.skip(f"no TF 2.9 runtime at {TF_PYTHON}")
    state_dir = tmp_path / "emulator"
    info = control.start_background(state_dir, port=0, boot_delay_s=0.2, grace_s=2.0, image_python=str(TF_PYTHON),
                                    timeout_s=30.0)
    try:
        yield info
    finally:
        control.stop(state_dir)


@pytest.mark.tf
def test_every_worker_serves_tensorflows_runtime_and_health_follows_it(
    tf_emulator: control.EmulatorInfo, finish: Callable[..., Any], wait_until: Callable[..., Any],
) -> None:
    client, admin = _client(tf_emulator), control.AdminClient(tf_emulator.endpoint, token=tf_emulator.token)
    admin.set_faults(never_boot_workers=["absent/3"])
    slice_ = _create(client, finish, "slice")
    absent = _create(client, finish, "absent")
    healthy = wait_until(lambda: (n := client.get_node(name=slice_.name)).health == tpu_v2.Node.Health.HEALTHY
                         and n, timeout=180)
    workers = _workers(admin, "slice")
    assert all(runtime_answers(endpoint.ip_address) for endpoint in healthy.network_endpoints)
    for number, worker in enumerate(workers):
        log = _read(Path(worker["sandbox"]) / "tpu-runtime.log")
        assert f"task {number} serving grpc://{worker['address']}:8470" in log, log

    admin.set_faults(kill_runtimes=["slice/2"])
    sick = wait_until(lambda: (n := client.get_node(name=slice_.name)).health
                      == tpu_v2.Node.Health.UNHEALTHY_TENSORFLOW and n)
    assert sick.state == tpu_v2.Node.State.READY, "a worker's runtime dying leaves the slice READY, unhealthy"
    assert [(s.worker_id, s.symptom_type) for s in sick.symptoms] == [("2", tpu_v2.Symptom.SymptomType.MESH_BUILD_FAIL)]
    assert not runtime_answers(workers[2]["address"]) and runtime_answers(workers[1]["address"])

    timed_out = wait_until(lambda: (n := client.get_node(name=absent.name)).health == tpu_v2.Node.Health.TIMEOUT
                           and n, timeout=180)
    assert [s.worker_id for s in timed_out.symptoms] == ["3"]

    admin.preempt(PROJECT, ZONE, "slice", grace_s=0.5)
    wait_until(lambda: client.get_node(name=slice_.name).state == tpu_v2.Node.State.PREEMPTED)
    assert not any(runtime_answers(worker["address"]) for worker in workers), "preemption ends every runtime"
    assert {w["runtime_pgid"] for w in workers} & live_groups() == set()


# ----- TensorFlow's own resolver, on worker 0, finds the slice through the API

RESOLVE = """
import json, sys
import tensorflow as tf
resolver = tf.distribute.cluster_resolver.TPUClusterResolver(tpu=sys.argv[1])
print(json.dumps(resolver.cluster_spec().as_dict()))
"""


@pytest.mark.tf
def test_tensorflows_resolver_on_worker_0_finds_the_four_workers(
    tf_emulator: control.EmulatorInfo, finish: Callable[..., Any], wait_until: Callable[..., Any],
) -> None:
    """``TPUClusterResolver(tpu=NAME)`` as a pod job calls it: discovery document, v1 nodes.get with the VM's
    token, project and zone from the metadata server; its ClusterSpec is the workers' ip:8470, in order. The TF
    runtime has TF's TPU client libraries from the pin file, as a TPU VM image has them."""
    client, admin = _client(tf_emulator), control.AdminClient(tf_emulator.endpoint, token=tf_emulator.token)
    script = f"""
md() {{ curl -s --noproxy '*' -H 'Metadata-Flavor: Google' "http://$GCE_METADATA_HOST/computeMetadata/v1/$1"; }}
if [ "$(md instance/attributes/agent-worker-number)" = 0 ]; then
  until [ "$(cat go 2>/dev/null)" = go ]; do sleep 0.2; done
  python3 -c '{RESOLVE}' resolved > cluster.json 2> resolver.log
  echo $? > resolver.rc
fi
exec sleep 600
"""
    node = tpu_v2.Node(accelerator_type="v3-32", runtime_version="tpu-vm-tf-2.9.3-pod",
                       scheduling_config={"spot": True}, metadata={"startup-script": script})
    created = finish(client.create_node(parent=PARENT, node_id="resolved", node=node))
    wait_until(lambda: client.get_node(name=created.name).health == tpu_v2.Node.Health.HEALTHY, timeout=180)
    home = Path(_workers(admin, "resolved")[0]["sandbox"])
    admin.reset_stats()
    (home / "go").write_text("go")
    wait_until(lambda: _read(home / "resolver.rc"), timeout=180)
    expected = [f"{endpoint.ip_address}:8470" for endpoint in created.network_endpoints]
    assert _read(home / "resolver.rc").strip() == "0", _read(home / "resolver.log")[-3000:]
    assert json.loads(_read(home / "cluster.json")) == {"worker": expected}
    assert admin.stats().get("GetNode", 0) >= 1, "the resolver asked the API for the node"
