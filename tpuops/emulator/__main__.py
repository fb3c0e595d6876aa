"""``python -m tpuops.emulator serve --port P --state-dir D [--token-file F] [--gcs-bucket B] [--grace S] ...``.

Runs the emulator in the foreground and prints ``tpuops emulator listening on
http://127.0.0.1:PORT`` once it accepts requests (``--port 0`` picks a free port).
``tpuops.emulator.control`` starts this as a background process.
"""

from __future__ import annotations

import argparse
import logging
import sys
from pathlib import Path

from tpuops.emulator.cloud.state import EmulatorConfig
from tpuops.emulator.server import run


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m tpuops.emulator", description="Local Cloud TPU v2 API emulator.")
    commands = parser.add_subparsers(dest="command", required=True)
    serve = commands.add_parser("serve", help="run the emulator in the foreground")
    serve.add_argument("--port", type=int, default=0, help="port on 127.0.0.1 (0: any free port)")
    serve.add_argument("--state-dir", type=Path, required=True, help="sandboxes, billing.json, logs")
    serve.add_argument("--boot-delay", type=float, default=1.0, help="seconds from CREATING/STARTING to READY")
    serve.add_argument("--grace", type=float, default=30.0, help="seconds from SIGTERM to SIGKILL on preemption")
    serve.add_argument("--image-python", default=None, help="interpreter that plays the VM image's python3")
    serve.add_argument("--token-file", default=None, help="bearer token every request must carry (omit: no auth)")
    serve.add_argument("--gcs-bucket", action="append", default=[],
                       help="serve this bucket to the nodes as storage.googleapis.com (repeatable; needs root)")
    return parser


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    state_dir = args.state_dir.absolute()
    state_dir.mkdir(parents=True, exist_ok=True)
    config = EmulatorConfig(
        state_dir=state_dir, boot_delay_s=args.boot_delay, grace_s=args.grace, image_python=args.image_python
    )
    return run(config, args.port, args.token_file, args.gcs_bucket)


if __name__ == "__main__":
    sys.exit(main())
