"""A pod run whose store worker 0's host cannot reach is refused before anything is made.

On a slice the checkpoint and output ops run on worker 0 (``/job:worker/task:0``), so the store must be
Cloud Storage, or a path worker 0 shares: only an emulator on this machine shares this machine's paths
(``tpuops.launch.jobs.check_slice_store``). The CLI in-process, in the bad-input sandbox, whose API port
refuses connections: a refusal that reached for the API would show as a failure of the world, not exit 2.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from fuzzing import REPO, Sandbox, run_case, verdict

pytestmark = pytest.mark.unit


def _sandbox(tmp_path: Path, endpoint: str) -> Sandbox:
    sandbox = Sandbox.make(tmp_path / "case")
    (sandbox.root / "work" / "experiments" / "models.py").write_text((REPO / "experiments" / "models.py").read_text())
    config = Path(sandbox.env["TPUOPS_CONFIG"])
    config.write_text(f'provider = "local"\ntpu_endpoint = "{endpoint}"\napi_deadline_s = 0.3\n'
                      f'store = "{sandbox.root / "store"}"\n')
    return sandbox


def test_a_slice_with_a_local_store_and_an_emulator_elsewhere_is_refused_in_one_line(tmp_path: Path) -> None:
    sandbox = _sandbox(tmp_path, "http://10.0.0.9:8470")
    before = sandbox.listing()
    outcome = run_case(sandbox, ["train", "experiments/digits_cnn.yaml", "--accelerator", "v2-32", "--name", "far"])
    assert verdict(outcome) is None, outcome.stderr
    assert outcome.code == 2
    last = outcome.stderr.strip().splitlines()[-1]
    assert last.startswith("error: v2-32 is a pod slice") and "use a gs://BUCKET/PREFIX store" in last, last
    assert sandbox.listing() == before, "nothing written"


@pytest.mark.parametrize(("accelerator", "endpoint"), [("v3-8", "http://10.0.0.9:8470"),
                                                       ("v2-32", "http://127.0.0.1:9")])
def test_a_single_host_or_a_local_emulators_slice_is_not_refused_for_its_store(
    tmp_path: Path, accelerator: str, endpoint: str,
) -> None:
    """Both go on to the next check (the dataset, absent here): the store rule is the slice's, on a far host."""
    sandbox = _sandbox(tmp_path, endpoint)
    outcome = run_case(sandbox, ["train", "experiments/digits_cnn.yaml", "--accelerator", accelerator, "--dry-run"])
    assert outcome.code == 2 and "pod slice" not in outcome.stderr
    assert "dataset 'data/digits/train'" in outcome.stderr.strip().splitlines()[-1]
