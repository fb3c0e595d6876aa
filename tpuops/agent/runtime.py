"""Pick the device the run trains on, and refuse to train anywhere it should not.

On a TPU VM: ``TPUClusterResolver(tpu="local")`` -> ``experimental_connect_to_cluster`` ->
``initialize_tpu_system`` -> ``TPUStrategy``. On worker 0 of a pod slice (``TPU_NAME`` names the
node, as the pod image sets it) the resolver is ``TPUClusterResolver(tpu=TPU_NAME)``: TensorFlow
asks the Cloud TPU API for the slice's workers, and this process is the single client of all of
them; tpuops never builds the cluster itself. Without TPU chips (the emulator's slices, whose
workers serve TensorFlow's gRPC server on 8470) the single client trains with TF's
``CentralStorageStrategy`` over every worker's CPU: each worker computes its share of every
step's batch, the variables and the gradient reduction live on worker 0 (where the save op runs),
the CPU stand-in for TPUStrategy's replication. TF 2.9's ``MirroredStrategy`` refuses devices
on several workers in eager mode ("In-graph multi-worker training with `MirroredStrategy` is not
supported in eager mode"), which is why it is not used. Without a TPU the agent refuses (user-error)
unless the spec sets ``allow_cpu_fallback``: a job that quietly trains on the CPU of a paid
TPU VM burns money for nothing, the worst thing this product can do. A machine that has TPU
hardware (``/dev/accel*``, ``/dev/vfio/N``) whose TPU cannot be initialised is a crash, never a
reason to fall back: the usual cause is a previous process still holding the chips, and a
restart fixes it.
"""

import glob
import logging
import os
from typing import Any, Optional, Tuple

import tensorflow as tf

from tpuops.contract.exits import UserError
from tpuops.contract.runspec import RunSpec

log = logging.getLogger(__name__)

REQUIRED_TF = "2.9"
MIN_PER_CORE_BATCH_ON_TPU = 128
_TPU_DEVICE_GLOBS = ("/dev/accel*", "/dev/vfio/[0-9]*")


class Runtime:
    """The strategy the run uses and the facts about it that the loops need."""

    def __init__(self, strategy: Any, device: str, deterministic: bool, hosts: int = 1,
                 workers: Tuple[str, ...] = ()) -> None:
        self.strategy = strategy
        self.device = device
        self.deterministic = deterministic
        self.hosts = hosts  # the workers this process drives: more than 1 on a pod slice
        self.workers = workers  # their runtimes' host:port on a pod slice (what ``profiles`` traces); else empty

    @property
    def on_tpu(self) -> bool:
        return self.device == "TPU"

    @property
    def replicas(self) -> int:
        return int(self.strategy.num_replicas_in_sync)

    def distribute(self, dataset: Any) -> Any:
        """``dataset``'s batches split across the replicas.

        On a slice without TPUs the batches stay on worker 0's host until a replica takes its share
        (``experimental_fetch_to_device=False``): fetched ahead to every worker, the run's second dataset
        failed in TF 2.9 ("Attempting to add a duplicate function with name: __inference__finalize_func_N").
        TF 2.9's ``CentralStorageStrategy.experimental_distribute_dataset`` cannot take options (it reads
        ``options.experimental_replication_moden``), so the base class's method is called.
        """
        if self.hosts == 1 or self.on_tpu:
            return self.strategy.experimental_distribute_dataset(dataset)
        options = tf.distribute.InputOptions(experimental_fetch_to_device=False)
        return tf.distribute.Strategy.experimental_distribute_dataset(self.strategy, dataset, options)

    def batches(self, per_replica: int, global_batch: Optional[int] = None) -> Tuple[int, int]:
        """(global batch, accumulation) of an optimizer step on this slice; warns when a TPU core gets too little.

        Without ``global_batch`` (the spec's ``train.global_batch``) a step is one micro-batch:
        ``per_replica x replicas``. With it, the accumulation is derived from the slice, so that the
        same run keeps its global batch on any size: ``per_replica x replicas x accumulation = global``.

        Raises:
            UserError: the slice's ``per_replica x replicas`` does not divide ``global_batch``.
        """
        if self.on_tpu and per_replica < MIN_PER_CORE_BATCH_ON_TPU:
            log.warning(
                "per-core batch %d is under %d: the TPU's matrix units will idle; raise per_replica_batch_size",
                per_replica,
                MIN_PER_CORE_BATCH_ON_TPU,
            )
        micro = per_replica * self.replicas
        if global_batch is None:
            return micro, 1
        if global_batch % micro:
            raise UserError(
                f"train.global_batch {global_batch} cannot be split over this slice: a micro-batch is "
                f"per_replica_batch_size {per_replica} x {self.replicas} replicas = {micro} examples, which must "
                f"divide the global batch (use a multiple of {micro})"
            )
        return global_batch, global_batch // micro


def check_tensorflow(version: Optional[str] = None) -> None:
    """Refuse any TensorFlow but 2.9: the agent, the pins and the TPU runtime are built for it."""
    version = tf.__version__ if version is None else version
    if version != REQUIRED_TF and not version.startswith(REQUIRED_TF + "."):
        raise UserError(
            f"tpuops agent needs TensorFlow {REQUIRED_TF}.x, found {version}: use a tpu-vm-tf-2.9.x runtime version"
        )


MAX_SEED = 2**32 - 1


def check_seed(seed: int) -> None:
    """Refuse a seed TensorFlow cannot take (``set_random_seed`` wants 0 .. 2**32 - 1): a user error, not a crash."""
    if not 0 <= seed <= MAX_SEED:
        raise UserError(f"seed {seed} is out of range: TensorFlow takes seeds from 0 to 2**32 - 1 ({MAX_SEED})")


def tpu_hardware_present() -> bool:
    """True when the machine exposes TPU chips (v2-v4 as /dev/accel*, later ones through vfio)."""
    return any(glob.glob(pattern) for pattern in _TPU_DEVICE_GLOBS)


def _tpu_strategy() -> Any:
    resolver = tf.distribute.cluster_resolver.TPUClusterResolver(tpu="local")
    tf.config.experimental_connect_to_cluster(resolver)
    tf.tpu.experimental.initialize_tpu_system(resolver)
    return tf.distribute.TPUStrategy(resolver)


def slice_name() -> Optional[str]:
    """The pod slice this process drives as TensorFlow's single client: ``TPU_NAME`` as the pod image sets it
    on worker 0 (unset or ``local``: this host alone)."""
    name = os.environ.get("TPU_NAME", "")
    return None if name in ("", "local") else name


def _slice_strategy(name: str, allow_cpu: bool) -> Tuple[Any, str, Tuple[str, ...]]:
    """The strategy over every worker of slice ``name``, found through TensorFlow's own resolver; its device
    kind and the workers' runtime addresses."""
    resolver = tf.distribute.cluster_resolver.TPUClusterResolver(tpu=name)
    tf.config.experimental_connect_to_cluster(resolver)
    job = resolver.get_job_name() or "worker"
    workers = tuple(resolver.cluster_spec().job_tasks(job))
    hosts = len(workers)
    if tpu_hardware_present():
        tf.tpu.experimental.initialize_tpu_system(resolver)
        return tf.distribute.TPUStrategy(resolver), "TPU", workers
    if not allow_cpu:
        raise UserError(f"slice {name} has no TPU chips on worker 0 (no /dev/accel* or /dev/vfio devices): refusing "
                        "to run on its CPUs; set allow_cpu_fallback: true in the run spec to run without a TPU")
    devices = [f"/job:{job}/replica:0/task:{task}/device:CPU:0" for task in range(hosts)]
    log.warning("no TPU on slice %s: training on the CPUs of its %d workers (allow_cpu_fallback)", name, hosts)
    return tf.distribute.experimental.CentralStorageStrategy(devices, parameter_device=devices[0]), "CPU", workers


CPU_REPLICAS_ENV = "TPUOPS_CPU_REPLICAS"


def _cpu_strategy() -> Any:
    """One host's CPU: the default strategy, or ``TPUOPS_CPU_REPLICAS`` = N replicas over N logical CPUs.

    N replicas are the CPU stand-in for the cores of one TPU host (8 on a v2-8): ``MirroredStrategy``
    over N logical devices splits every batch N ways and sums the gradients across them as TPUStrategy
    does, so that a run's replica count, and with it its accumulation (``Runtime.batches``), is what a
    TPU host would have. The emulator and the agent tests set it; on a TPU VM it is never read.
    """
    wanted = os.environ.get(CPU_REPLICAS_ENV, "")
    if not wanted:
        return tf.distribute.get_strategy()
    if not wanted.isdigit() or int(wanted) < 1:
        raise UserError(f"{CPU_REPLICAS_ENV}={wanted!r}: expected a number of replicas >= 1")
    cpu = tf.config.list_physical_devices("CPU")[0]
    tf.config.set_logical_device_configuration(cpu, [tf.config.LogicalDeviceConfiguration()] * int(wanted))
    devices = [device.name for device in tf.config.list_logical_devices("CPU")]
    return tf.distribute.MirroredStrategy(devices)


def connect(spec: RunSpec) -> Runtime:
    """Check TensorFlow, choose TPU or (only if allowed) CPU, then seed and set precision.

    Raises:
        UserError: wrong TensorFlow, a seed out of range, or no TPU and ``allow_cpu_fallback`` is false.
        RuntimeError: TPU hardware is present but TensorFlow cannot initialise it, or the slice's workers cannot
            be reached (a crash: a restart on a recreated slice fixes it).
    """
    check_tensorflow()
    check_seed(spec.seed)
    name, workers = slice_name(), ()
    if name is not None:
        try:
            strategy, device, workers = _slice_strategy(name, spec.allow_cpu_fallback)
        except (tf.errors.OpError, ValueError, RuntimeError) as err:
            raise RuntimeError(f"TensorFlow cannot reach the workers of slice {name}: {err}") from err
    elif tpu_hardware_present():
        try:
            strategy = _tpu_strategy()
        except (tf.errors.OpError, ValueError) as err:
            raise RuntimeError(f"this machine has TPU chips but TensorFlow cannot initialise them: {err}") from err
        device = "TPU"
    elif spec.allow_cpu_fallback:
        log.warning("no TPU found on this machine; training on the CPU because the spec sets allow_cpu_fallback")
        strategy = _cpu_strategy()
        device = "CPU"
    else:
        raise UserError(
            "no TPU found on this machine (no /dev/accel* or /dev/vfio devices): refusing to run on the CPU; "
            "set allow_cpu_fallback: true in the run spec to run without a TPU"
        )
    deterministic = spec.deterministic if spec.deterministic is not None else device == "CPU"
    if deterministic:
        tf.config.experimental.enable_op_determinism()
    tf.keras.utils.set_random_seed(spec.seed)
    if spec.mixed_precision and device == "TPU":
        tf.keras.mixed_precision.set_global_policy("mixed_bfloat16")
    elif spec.mixed_precision:
        log.warning("mixed_precision ignored on the CPU: TF 2.9's CPU kernels have no bfloat16 convolutions")
    hosts = max(1, len(workers))
    runtime = Runtime(strategy, device, deterministic, hosts, workers)
    log.info(
        "runtime: TensorFlow %s, %s x%d on %d host(s), deterministic=%s, precision policy %s",
        tf.__version__,
        device,
        runtime.replicas,
        hosts,
        deterministic,
        tf.keras.mixed_precision.global_policy().name,
    )
    return runtime
