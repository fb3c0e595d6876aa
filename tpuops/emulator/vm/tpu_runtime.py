"""The TPU runtime stand-in of a ``-pod`` image: TensorFlow 2.9's own gRPC server on this worker's address:8470.

Run by the emulator when a worker of a ``-pod`` slice boots, with the VM image's python (TensorFlow 2.9),
as the image's ``tpu-runtime`` service runs on every worker of a real slice. It is task N of job
``worker`` in the cluster the slice's workers form, which is what ``TPUClusterResolver`` builds from the
node's ``networkEndpoints``; TensorFlow's client on worker 0 connects to it as to a TPU worker.

When it is stopped (SIGTERM: the node is deleted or preempted) it logs the CPU seconds it spent serving,
its start-up excluded: what shows that the slice's job computed on this worker (an idle server spent 0.03 CPU
seconds over 20 s on this machine).

Usage: ``python tpu_runtime.py ADDR0:8470,ADDR1:8470,... N`` (stdlib and TensorFlow only: it runs in the image).
"""

import signal
import sys
import time


def main() -> None:
    import tensorflow as tf

    workers, index = sys.argv[1].split(","), int(sys.argv[2])
    server = tf.distribute.Server(
        tf.train.ClusterSpec({"worker": workers}), job_name="worker", task_index=index, protocol="grpc", start=True
    )
    serving_since = time.process_time()
    print(f"TPU runtime stand-in: task {index} serving {server.target}", flush=True)

    def stop(signum: int, _frame: object) -> None:
        print(f"TPU runtime stand-in: task {index} stopped; {time.process_time() - serving_since:.3f} CPU seconds "
              "serving", flush=True)
        sys.exit(128 + signum)

    signal.signal(signal.SIGTERM, stop)
    while True:  # the server serves from its own threads; this thread waits for the signal
        signal.pause()


if __name__ == "__main__":
    main()
