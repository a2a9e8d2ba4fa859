"""A training run on Miles' real classes, killed and resumed by tests/test_miles_resume.py.

    python tests/helpers/miles_resume_child.py WORK TOKENIZER PROMPTS SEED

Builds the data source as ``RolloutManager`` does (``load_function(args.data_source_path)(args)``
with ``--data-source-path trainer_hooks.miles.BundledDataSource``), Miles' own
``FullyAsyncRolloutFn`` (``--custom-async-data-buffer-path trainer_hooks.miles.BundledDataBuffer``)
called through Miles' ``call_rollout_function`` on Miles' background event loop, and drives it
like ``train_async.py``: the drain of step N+1 runs while step N "trains". Generation is a
scripted engine that aborts some first tries (recycled with ``retry``).

The "weights" are the lineage: ``WORK/weights/iter_<N>.json`` lists every group index trained up
to step N, written atomically. Every third step the driver saves the weights, then calls
``data_source.save(N)`` (``RolloutManager.save``), and marks N as ``WORK/weights/latest`` once
both are committed. On start it resumes from ``latest``: the weights' lineage, and
``data_source.load(N)`` (``RolloutManager.load(start_rollout_id - 1)``). It stops when every one of
the prompts has been trained and writes ``WORK/final.json``.
"""

from __future__ import annotations

import json
import os
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

sys.path[:0] = [
    str(Path(__file__).resolve().parents[1]),
    str(Path(__file__).resolve().parents[2]),
]  # tests/, the repo

from helpers.miles_snapshot import add_miles_to_path  # noqa: E402

add_miles_to_path()

from helpers.miles_run import install_scripted_engine, miles_args  # noqa: E402


def write_json_atomic(path: Path, value: object) -> None:
    tmp = path.with_suffix(".tmp")
    with tmp.open("w") as f:
        json.dump(value, f)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def main() -> int:
    work, tokenizer, prompts, seed = Path(sys.argv[1]), Path(sys.argv[2]), Path(sys.argv[3]), int(sys.argv[4])
    n_prompts = sum(1 for _ in prompts.open())
    install_scripted_engine(seed=seed, max_delay=0.01, abort_first_try=0.15)

    import miles.rollout.fully_async_rollout as fully_async
    from miles.rollout.base_types import RolloutFnConstructorInput, RolloutFnTrainInput
    from miles.rollout.inference_rollout.compatibility import call_rollout_function
    from miles.utils.misc import load_function

    weights = work / "weights"
    weights.mkdir(parents=True, exist_ok=True)
    ckpt = work / "ckpt"
    latest = weights / "latest"
    start, trained = 0, []
    if latest.exists():
        n = int(latest.read_text())
        trained = json.loads((weights / f"iter_{n}.json").read_text())
        start = n + 1
    args = miles_args(
        tokenizer,
        prompts,
        save=str(ckpt),
        load=str(ckpt) if start else None,
        data_source_path="trainer_hooks.miles.BundledDataSource",
        start_rollout_id=start,
    )
    data_source = load_function(args.data_source_path)(args)
    data_source.load(start - 1)
    fn = fully_async.FullyAsyncRolloutFn(RolloutFnConstructorInput(args=args, data_source=data_source))
    print(f"start at step {start}, {len(trained)} groups trained in the restored weights", flush=True)

    pool = ThreadPoolExecutor(1)

    def drain(step: int):
        return call_rollout_function(fn, RolloutFnTrainInput(rollout_id=step)).samples

    next_batch = pool.submit(drain, start)
    step = start
    while True:
        batch = next_batch.result()
        next_batch = pool.submit(drain, step + 1)  # the asynchronous driver: step N+1 rolls out now
        trained += [g[0].group_index for g in batch]
        time.sleep(0.01)  # training
        if step % 3 == 2:
            write_json_atomic(weights / f"iter_{step}.json", trained)
            data_source.save(step)
            data_source.flush()
            write_json_atomic(latest, step)
            print(f"saved step {step}", flush=True)
        if set(range(n_prompts)) <= set(trained):
            write_json_atomic(work / "final.json", trained)
            print(f"done at step {step}", flush=True)
            data_source.close()
            os._exit(0)
        step += 1


if __name__ == "__main__":
    sys.exit(main())
