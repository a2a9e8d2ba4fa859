"""Prefill payload parity with Miles (issue 18 item 4): our ``build_prefill_scoring_payload`` and
Miles' own ``_build_prefill_scoring_payload`` (``miles/rollout/generate_utils/prefill_logprobs.py``)
called side by side on the same samples give the same request, key for key and byte for byte,
except ``mm_token_expansion_start_len`` (token space only, counted in token positions). Images
go as Miles sends them: RGB (RGBA, P, L converted), PNG, base64 data URLs, also when they come
back from a bundle (directory or packed file read in place, PIL images or ``MediaRef`` paths), so
the payload works against a remote engine. Skips in one line without the snapshot."""

from __future__ import annotations

import base64
import io
from argparse import Namespace
from pathlib import Path

import pytest
from helpers.miles_snapshot import require_miles

require_miles()
Image = pytest.importorskip("PIL.Image")

from miles.rollout.generate_utils.prefill_logprobs import (  # noqa: E402
    _build_prefill_scoring_payload as miles_payload,
)
from miles.utils.types import AdapterRef as MilesAdapterRef  # noqa: E402
from miles.utils.types import Sample as MilesSample  # noqa: E402

from bundles import MediaRef, open_bundle, pack_bundle, write_bundle  # noqa: E402
from trainer_hooks import Sample, build_prefill_scoring_payload  # noqa: E402
from trainer_hooks.replay._media import MediaReader  # noqa: E402

PAD = 151655
TOKENS = [151644, 872, 198, 151652, PAD, PAD, PAD, PAD, 151653, 9707, 11, 151645]


def images() -> list:
    """One image per mode Miles converts, plus RGB (left as it is)."""
    rgba = Image.new("RGBA", (30, 20), (200, 10, 30, 90))
    p = Image.new("P", (30, 20), 3)
    p.putpalette([i % 256 for i in range(768)])
    gray = Image.linear_gradient("L").resize((30, 20))
    rgb = Image.new("RGB", (30, 20), (1, 2, 3))
    return [rgba, p, gray, rgb]


def both(args: Namespace, imgs: list | None, **fields) -> tuple[dict, dict]:
    common = dict(index=3, tokens=list(TOKENS), response_length=3, status="completed", **fields)
    mm = {"images": imgs} if imgs is not None else None
    ours = Sample(**{**common, "status": Sample.Status.COMPLETED}, multimodal_inputs=mm)
    theirs = MilesSample(**{**common, "status": MilesSample.Status.COMPLETED}, multimodal_inputs=mm)
    return build_prefill_scoring_payload(args, ours, {"top_p": 0.9}), miles_payload(
        args, theirs, {"top_p": 0.9}
    )


def test_images_go_as_miles_sends_them_outside_token_space():
    ours, theirs = both(Namespace(), images())
    assert ours == theirs  # every key, the base64 PNGs byte for byte
    assert len(ours["image_data"]) == 4 and all(
        u.startswith("data:image/png;base64,") for u in ours["image_data"]
    )
    for url in ours["image_data"]:
        with Image.open(io.BytesIO(base64.b64decode(url.split(",", 1)[1]))) as im:
            assert im.mode == "RGB"


def test_token_space_adds_only_the_expanded_prefix_length_in_token_positions():
    args = Namespace(enable_token_space_processor=True)
    ours, theirs = both(args, images())
    assert ours.pop("mm_token_expansion_start_len") == len(TOKENS)  # token space: the whole input is expanded
    assert ours == theirs
    text_ours, text_theirs = both(args, None)
    assert text_ours == text_theirs and "mm_token_expansion_start_len" not in text_ours


@pytest.mark.parametrize(
    "args, adapter",
    [
        (Namespace(lora_rank=8), None),
        (Namespace(lora_rank=8, lora_train_only=True), None),
        (Namespace(lora_adapter_path="/a"), None),
        (Namespace(), ("tenant", 4)),
    ],
)
def test_lora_path_as_miles_names_it(args, adapter):
    ours = Sample(index=0, tokens=list(TOKENS), response_length=3, status=Sample.Status.COMPLETED)
    theirs = MilesSample(index=0, tokens=list(TOKENS), response_length=3, status=MilesSample.Status.COMPLETED)
    if adapter is not None:
        from trainer_hooks import AdapterRef

        ours.adapter, theirs.adapter = AdapterRef(*adapter), MilesAdapterRef(*adapter)
    assert build_prefill_scoring_payload(args, ours, {}) == miles_payload(args, theirs, {})


def test_images_read_back_from_a_bundle_go_as_miles_sends_the_originals(tmp_path: Path):
    """PIL images stored in a dump and ``MediaRef`` paths, read back from the directory and from
    the packed file in place: the payload carries the same base64 PNGs Miles makes of the
    original images, never a local path a remote engine cannot open."""
    originals = images()
    run = tmp_path / "run"
    run.mkdir()
    ref_path = run / "shot.png"
    originals[0].save(ref_path)
    stored = [*originals, MediaRef.from_file(ref_path)]
    sample = {"index": 3, "tokens": list(TOKENS), "response_length": 3, "status": "completed",
              "multimodal_inputs": {"images": stored}}  # fmt: skip
    bundle = write_bundle(tmp_path / "dump", [sample], media_roots=[run], kind="debug_dump")
    packed = pack_bundle(bundle, tmp_path / "dump.rbundle")
    with Image.open(ref_path) as im:
        want_ref = im.copy()
    theirs = MilesSample(
        index=3, tokens=list(TOKENS), response_length=3, status=MilesSample.Status.COMPLETED,
        multimodal_inputs={"images": [*originals, want_ref]},
    )  # fmt: skip
    expected = miles_payload(Namespace(), theirs, {})
    for path in (bundle, packed):
        with open_bundle(path) as b:
            (ours,) = b.samples(Sample)
            payload = build_prefill_scoring_payload(Namespace(), ours, {}, media=MediaReader(b))
        assert payload == expected, path
        assert str(tmp_path) not in str(payload)
