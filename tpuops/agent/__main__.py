"""``python -m tpuops.agent {train,infer} SPEC [--attempt N]``: the agent's command line.

SPEC is the run spec's local path or gs:// URI (schema: ``runspec``). ``--attempt`` overrides
the attempt number, which otherwise counts up from the one in the run's previous status.json.
Exit codes: ``exits``. The SIGTERM handler goes in before TensorFlow is imported, so a
preemption notice during the slow import is not lost; so does ``prefetch``, which reads the
spec, the last status and the newest checkpoint while TensorFlow imports.
"""

import argparse
import sys
from typing import List, Optional

from tpuops.agent.preemption import PreemptionNotice
from tpuops.agent.prefetch import Prefetch


def main(argv: Optional[List[str]] = None) -> int:
    notice = PreemptionNotice()
    notice.install_signal_handler()
    parser = argparse.ArgumentParser(prog="python -m tpuops.agent", description="tpuops data-plane agent (TF 2.9)")
    commands = parser.add_subparsers(dest="command", required=True)
    for name, text in (
        ("train", "train a model, resuming from the newest valid checkpoint"),
        ("infer", "batch prediction into sharded JSON Lines and a manifest"),
    ):
        command = commands.add_parser(name, help=text)
        command.add_argument("spec", help="run spec: local path or gs:// URI")
        command.add_argument("--attempt", type=int, default=None, help="attempt number to report in status.json")
    args = parser.parse_args(argv)
    fetched = Prefetch(args.spec, args.command).start()

    from tpuops.agent import job  # imports TensorFlow: seconds

    return job.run(args.command, args.spec, args.attempt, notice, then_exit=True, fetched=fetched)


if __name__ == "__main__":
    sys.exit(main())
