"""Save -> SIGKILL -> resume on Miles' real ``FullyAsyncRolloutFn`` and real data source (a local
tokenizer, a 200-prompt JSONL file), through the two command-line plugins: the run
(tests/helpers/miles_resume_child.py) is killed with SIGKILL at seeded moments after it has saved, resumed
from its last checkpoint each time, and finally runs to the end. In the lineage of the weights
that survive, every prompt is trained exactly once."""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import time
from collections import Counter

import pytest
from helpers.miles_snapshot import REPO, require_miles

MILES = require_miles()

from helpers.miles_run import make_tokenizer_dir, write_prompts  # noqa: E402

pytestmark = [pytest.mark.torch, pytest.mark.slow]

N_PROMPTS = 200
CHILD = REPO / "tests" / "helpers" / "miles_resume_child.py"


def start(work, tok, prompts, seed):
    env = {**os.environ, "PYTHONDONTWRITEBYTECODE": "1", "PYTHONPATH": str(REPO)}
    return subprocess.Popen(
        [sys.executable, str(CHILD), str(work), str(tok), str(prompts), str(seed)],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env=env,
    )


def test_every_prompt_trained_exactly_once_across_sigkills(tmp_path):
    tok = make_tokenizer_dir(tmp_path / "tokenizer")
    prompts = write_prompts(tmp_path / "prompts.jsonl", N_PROMPTS)
    work = tmp_path / "run"
    rng = random.Random(18)
    kills = 0
    for attempt in range(3):
        proc = start(work, tok, prompts, seed=attempt)
        saves = 0
        lines = []
        # Kill at a seeded moment after the run has saved at least once (mid-generation, mid-drain,
        # or during the next save's background write).
        for line in proc.stdout:
            lines.append(line)
            if line.startswith("saved step"):
                saves += 1
                if saves == 1:
                    time.sleep(rng.uniform(0.0, 0.4))
                    break
            if line.startswith("done"):
                break
        if proc.poll() is None:
            proc.send_signal(signal.SIGKILL)
            kills += 1
        proc.wait(timeout=60)
        assert saves or (work / "final.json").exists(), "".join(lines[-30:])
        if (work / "final.json").exists():
            break
    proc = start(work, tok, prompts, seed=99)
    out, _ = proc.communicate(timeout=600)
    assert proc.returncode == 0, out[-4000:]
    lineage = json.loads((work / "final.json").read_text())
    counts = Counter(lineage)
    twice = sorted(g for g, n in counts.items() if n > 1)
    missing = sorted(set(range(N_PROMPTS)) - set(counts))
    assert kills >= 2
    assert (twice, missing) == ([], []), f"trained twice: {twice}, never: {missing}"
    once = sum(1 for g in range(N_PROMPTS) if counts[g] == 1)
    print(f"exactly once: {once} of {N_PROMPTS} prompts, after {kills} SIGKILLs")
    assert once == N_PROMPTS
