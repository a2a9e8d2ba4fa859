"""Inputs for tests that run Miles' real data source and rollout function (import after
``helpers.miles_snapshot.require_miles()``): a small local tokenizer, a JSONL prompt file, the arguments
Miles' classes read, and a scripted engine in place of SGLang generation."""

from __future__ import annotations

import asyncio
import json
import random
from argparse import Namespace
from pathlib import Path
from typing import Any

WORDS = ["[UNK]", "[PAD]", "[EOS]", "click", "open", "the", "settings", "window", "ok", "type", "prompt"]


def make_tokenizer_dir(path: Path) -> Path:
    """A word-level tokenizer saved with ``PreTrainedTokenizerFast.save_pretrained``: what
    ``--hf-checkpoint`` points at, offline."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {w: i for i, w in enumerate(WORDS)}
    vocab.update({str(i): len(WORDS) + i for i in range(1000)})
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok, unk_token="[UNK]", pad_token="[PAD]", eos_token="[EOS]"
    )
    fast.save_pretrained(path)
    return path


def write_prompts(path: Path, n: int) -> Path:
    """``n`` prompts, one JSON object a line (``text``, ``label``, ``metadata.prompt_id``)."""
    with path.open("w") as f:
        for i in range(n):
            f.write(
                json.dumps(
                    {"text": f"open the settings window {i}", "label": str(i), "metadata": {"prompt_id": i}}
                )
                + "\n"
            )
    return path


def miles_args(tokenizer_dir: Path, prompts: Path, **overrides: Any) -> Namespace:
    """The options Miles' ``RolloutDataSourceWithBuffer``, ``FullyAsyncRolloutFn`` and
    ``DefaultDataBuffer`` read, with Miles' defaults (``miles/utils/arguments.py``)."""
    args = dict(
        # data source
        rollout_global_dataset=True,
        hf_checkpoint=str(tokenizer_dir),
        chat_template_path=None,
        dump_details=None,
        prompt_data=str(prompts),
        rollout_max_prompt_len=None,
        input_key="text",
        multimodal_keys=None,
        label_key="label",
        metadata_key="metadata",
        tool_key=None,
        apply_chat_template=False,
        apply_chat_template_kwargs=None,
        rollout_seed=42,
        rollout_shuffle=False,
        buffer_filter_path=None,
        n_samples_per_prompt=2,
        save=None,
        load=None,
        # fully-async rollout and its buffer
        fully_async=True,
        rollout_batch_size=4,
        max_weight_staleness=None,
        async_max_concurrent_samples=None,
        async_data_buffer_capacity_factor=2.0,  # 8 groups: the worker stays ahead, bounded
        async_unused_samples_handler="retry",
        custom_async_data_buffer_path="trainer_hooks.miles.BundledDataBuffer",
        rollout_submission_granularity=None,
        dynamic_sampling_filter_path=None,
        rollout_sample_filter_path=None,
        sglang_router_ip="127.0.0.1",
        sglang_router_port=30000,
        eval_num_gpus=0,
        start_rollout_id=None,
        # ours: the bundle-protocol tests run without the rollout journal (tests that want it
        # pass rollout_journal_interval > 0)
        rollout_journal_interval=0.0,
    )
    args.update(overrides)
    return Namespace(**args)


class FakeGenerateState:
    """Stands in for Miles' ``GenerateState`` (which connects to SGLang), as Miles' tests do."""

    def __init__(self, args: Namespace) -> None:
        self.args = args
        self.sampling_params: dict[str, Any] = {}
        self.aborted = False


def scripted_engine(seed: int = 0, max_delay: float = 0.004, abort_first_try: float = 0.0):
    """``generate_and_rm_group`` for a scripted engine: mutates the group in place as generation
    does (tokens, response, reward, status), after a random delay; aborts a group's first try
    with probability ``abort_first_try`` (Miles then recycles it, with ``retry``)."""
    from miles.utils.types import Sample

    rng = random.Random(seed)

    async def generate(state, group, sampling_params, evaluation=False, sample_done_callback=None):
        await asyncio.sleep(rng.random() * max_delay)
        first_try = group[0].metadata.get("tries", 0) == 0
        abort = first_try and rng.random() < abort_first_try
        for i, s in enumerate(group):
            s.metadata["tries"] = s.metadata.get("tries", 0) + 1
            s.tokens = [3, 4, 5, 6, 7 + i]
            s.response = f"click {s.group_index}"
            s.response_length = 2
            s.loss_mask = [1, 1]
            s.rollout_log_probs = [-0.5, -0.25]
            s.reward = float(i)
            s.status = Sample.Status.ABORTED if abort else Sample.Status.COMPLETED
            if sample_done_callback is not None:
                sample_done_callback()
        return group

    return generate


def install_scripted_engine(monkeypatch: Any = None, **kwargs: Any) -> None:
    import miles.rollout.fully_async_rollout as fully_async

    engine = scripted_engine(**kwargs)
    if monkeypatch is None:
        fully_async.GenerateState = FakeGenerateState
        fully_async.generate_and_rm_group = engine
    else:
        monkeypatch.setattr(fully_async, "GenerateState", FakeGenerateState)
        monkeypatch.setattr(fully_async, "generate_and_rm_group", engine)
