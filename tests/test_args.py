"""Options, their validation, and the parse-time check that every engine group shares the
processor settings."""

from __future__ import annotations

import argparse
import json
import os
import re
from pathlib import Path

import pytest
import yaml

from trainer_hooks import (
    RolloutEngineProcessorArgs,
    UnsafeRunDirError,
    add_arguments,
    parse_args,
    validate_args,
)

TSP = "--enable-token-space-processor"
BASE = {
    "model_path": "/models/qwen2-vl",
    "image_processor_backend": "pil",
    "mm_process_config": {"image": {"max_pixels": 1003520}},
}
OTHER = {
    "model_path": "/models/other-vl",
    "image_processor_backend": "torchvision",
    "mm_process_config": {"image": {"max_pixels": 12845056}},
}


def _base_argv(**overrides: object) -> list[str]:
    values = {**BASE, **overrides}
    argv = []
    for key, value in values.items():
        if value is None:
            continue
        flag = "--sglang-" + key.replace("_", "-")
        argv += [flag, json.dumps(value) if isinstance(value, dict) else str(value)]
    return argv


def _config(tmp_path: Path, models: list[dict]) -> str:
    path = tmp_path / "sglang.yaml"
    path.write_text(yaml.safe_dump({"sglang": models}))
    return str(path)


def _group(worker_type: str = "regular", **overrides: object) -> dict:
    group: dict = {"worker_type": worker_type, "num_gpus": 2}
    if overrides:
        group["overrides"] = overrides
    return group


# ---------------------------------------------------------------- plain options


def test_defaults() -> None:
    args = parse_args([])
    assert re.fullmatch(r"[0-9a-f]{32}", args.run_uuid)
    assert parse_args([]).run_uuid != args.run_uuid  # a new run per parse
    assert args.shared_media_dir is None
    assert args.bundle_link_mode == "auto" and args.bundle_verify == "fast"
    assert args.keep_rollout_checkpoints is None
    assert args.rollout_processor_args is None
    assert not (
        args.fp16 or args.bf16 or args.enable_token_space_processor or args.recompute_logprobs_via_prefill
    )


def test_every_option_parses(tmp_path: Path) -> None:
    argv = [
        "--shared-media-dir", "rel/media",
        "--run-uuid", "my-run",
        "--save", "/ckpt", "--load", "/ckpt",
        "--save-debug-rollout-data", "/dumps/{rollout_id}",
        "--load-debug-rollout-data", "/dumps/{rollout_id}",
        "--load-debug-rollout-data-subsample", "0.5",
        "--bf16",
        "--rollout-external-engine-addrs", "10.0.0.1:30000", "[::1]:30001",
        "--custom-inference-engine-provider-path", "my.provider",
        "--recompute-logprobs-via-prefill",
        "--bundle-link-mode", "hardlink", "--keep-rollout-checkpoints", "3", "--bundle-verify", "full",
        "--sglang-mm-process-config", '{"image": {"max_pixels": 10}}',
    ]  # fmt: skip
    args = parse_args(argv)
    assert Path(args.shared_media_dir).is_absolute() and args.shared_media_dir.endswith("rel/media")
    assert args.run_uuid == "my-run"
    assert args.load_debug_rollout_data_subsample == 0.5
    assert args.rollout_external_engine_addrs == ["10.0.0.1:30000", "[::1]:30001"]
    assert args.sglang_mm_process_config == {"image": {"max_pixels": 10}}
    assert (args.bundle_link_mode, args.keep_rollout_checkpoints, args.bundle_verify) == (
        "hardlink",
        3,
        "full",
    )


@pytest.mark.parametrize(
    "argv, option",
    [
        (["--fp16", "--bf16"], "--fp16 and --bf16"),
        (["--run-uuid", "../x"], "--run-uuid"),
        (["--load-debug-rollout-data-subsample", "0.5"], "--load-debug-rollout-data-subsample: requires"),
        (["--load-debug-rollout-data", "d", "--load-debug-rollout-data-subsample", "1.5"], "0 < r <= 1"),
        (["--keep-rollout-checkpoints", "0"], "--keep-rollout-checkpoints"),
        (["--sglang-mm-process-config", "{not json"], "--sglang-mm-process-config: expected a JSON object"),
        (["--sglang-mm-process-config", "[1]"], "--sglang-mm-process-config: expected a JSON object"),
        (
            ["--rollout-external-engine-addrs", "nohost"],
            "--rollout-external-engine-addrs: expected HOST:PORT",
        ),
        (["--num-rollout", "0"], "--num-rollout"),
    ],
)
def test_validation_errors_name_the_option(argv: list[str], option: str) -> None:
    with pytest.raises(ValueError, match=re.escape(option)):
        parse_args(argv)


def test_bad_run_uuid_is_an_unsafe_run_dir_error() -> None:
    with pytest.raises(UnsafeRunDirError):
        parse_args(["--run-uuid", "a/b"])


def test_choices_are_enforced_by_argparse_and_by_validate_args() -> None:
    with pytest.raises(SystemExit):
        parse_args(["--bundle-link-mode", "symlink"])
    args = parse_args([])
    args.bundle_verify = "paranoid"
    with pytest.raises(
        ValueError, match="--bundle-verify: expected one of none, fast, full, found 'paranoid'"
    ):
        validate_args(args)


def test_shared_media_dir_that_is_a_file_is_refused(tmp_path: Path) -> None:
    (tmp_path / "f").write_text("")
    with pytest.raises(ValueError, match=r"--shared-media-dir .*expected a directory"):
        parse_args(["--shared-media-dir", str(tmp_path / "f")])


def test_add_arguments_skips_options_the_parser_already_has() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--save", default="miles-default")
    parser.add_argument("--fp16", action="store_true")
    add_arguments(parser)
    args = validate_args(parser.parse_args(["--shared-media-dir", "/m"]))
    assert args.save == os.path.abspath("miles-default") and args.shared_media_dir == "/m"


# ---------------------------------------------------------------- processor agreement


def test_no_sglang_config_resolves_one_implicit_group() -> None:
    args = parse_args([TSP, *_base_argv()])
    pa = args.rollout_processor_args
    assert isinstance(pa, RolloutEngineProcessorArgs)
    assert (pa.model_path, pa.image_processor_backend, pa.mm_process_config) == (
        BASE["model_path"],
        BASE["image_processor_backend"],
        BASE["mm_process_config"],
    )
    assert len(pa.engine_groups) == 1
    assert json.loads(json.dumps(pa.to_dict())) == {
        **BASE, "engine_groups": list(pa.engine_groups), "image_token_id": None,
    }  # fmt: skip
    assert RolloutEngineProcessorArgs.from_dict(pa.to_dict()) == pa


def test_agreeing_groups_resolve_with_overrides_over_model_over_base(tmp_path: Path) -> None:
    cfg = _config(
        tmp_path,
        [
            {
                "name": "actor",
                "model_path": OTHER["model_path"],  # model level beats the base value
                "server_groups": [
                    _group("prefill", image_processor_backend="torchvision"),
                    _group(
                        "decode", image_processor_backend="torchvision", mm_process_config='{"b": 2, "a": 1}'
                    ),
                    _group("placeholder", image_processor_backend="ignored: runs no engine"),
                ],
            },
            {"name": "judge", "model_path": OTHER["model_path"], "image_processor_backend": "torchvision"},
        ],
    )
    args = parse_args([TSP, *_base_argv(mm_process_config={"a": 1, "b": 2}), "--sglang-config", cfg])
    pa = args.rollout_processor_args
    assert pa.model_path == OTHER["model_path"]
    assert pa.image_processor_backend == "torchvision"
    assert pa.mm_process_config == {"a": 1, "b": 2}  # JSON string and mapping compare as parsed
    assert pa.engine_groups == (
        "actor.server_groups[0] (prefill)",
        "actor.server_groups[1] (decode)",
        "judge",
    )


FIELDS = ["model_path", "image_processor_backend", "mm_process_config"]


@pytest.mark.parametrize("field", FIELDS)
@pytest.mark.parametrize("level", ["override", "model"])
def test_every_processor_disagreement_fails_at_parse_time_naming_the_field(
    tmp_path: Path, field: str, level: str
) -> None:
    if level == "override":
        models = [
            {
                "name": "actor",
                "server_groups": [_group("regular"), _group("regular", **{field: OTHER[field]})],
            }
        ]
        disagreeing = ["actor.server_groups[0] (regular)", "actor.server_groups[1] (regular)"]
        source = f"sglang[0].server_groups[1].overrides.{field}"
    else:
        models = [
            {"name": "actor", "server_groups": [_group("regular")]},
            {"name": "ref", field: OTHER[field], "server_groups": [_group("regular")]},
        ]
        disagreeing = ["actor.server_groups[0] (regular)", "ref.server_groups[0] (regular)"]
        source = f"sglang[1].{field}"
    cfg = _config(tmp_path, models)
    with pytest.raises(ValueError) as info:
        parse_args([TSP, *_base_argv(), "--sglang-config", cfg])
    msg = str(info.value)
    assert f"disagree on {field}," in msg
    assert cfg in msg
    for label in disagreeing:
        assert label in msg
    assert repr(BASE[field]) in msg and repr(OTHER[field]) in msg
    assert source in msg and f"--sglang-{field.replace('_', '-')}" in msg
    # Without --enable-token-space-processor the engines process their own inputs: no check.
    assert parse_args([*_base_argv(), "--sglang-config", cfg]).rollout_processor_args is None


@pytest.mark.parametrize("field", FIELDS)
def test_a_value_set_for_only_one_group_disagrees_with_the_unset_default(tmp_path: Path, field: str) -> None:
    cfg = _config(tmp_path, [{"name": "actor", "server_groups": [_group(), _group(**{field: OTHER[field]})]}])
    with pytest.raises(ValueError, match=f"disagree on {field},.*= None"):
        parse_args([TSP, "--sglang-config", cfg])


@pytest.mark.parametrize(
    "extra, option",
    [
        (["--rollout-external-engine-addrs", "10.0.0.1:30000"], "--rollout-external-engine-addrs"),
        (
            ["--custom-inference-engine-provider-path", "my_pkg.engines:Provider"],
            "--custom-inference-engine-provider-path",
        ),
    ],
)
def test_external_engines_are_refused_with_token_space_processing(extra: list[str], option: str) -> None:
    with pytest.raises(ValueError, match=f"--enable-token-space-processor cannot be used with {option}"):
        parse_args([TSP, *_base_argv(), *extra])
    assert parse_args([*_base_argv(), *extra]).rollout_processor_args is None


@pytest.mark.parametrize(
    "content, message",
    [
        ("sglang: 3", "expected a mapping with a list under 'sglang'"),
        ("sglang: [{model_path: x}]", r"sglang\[0\]: expected a mapping with a string 'name'"),
        ("sglang: [{name: a, server_groups: {}}]", r"sglang\[0\].server_groups: expected a list"),
        (
            "sglang: [{name: a, server_groups: [{worker_type: regular, overrides: [1]}]}]",
            "overrides: expected a mapping",
        ),
        ("sglang: [{name: a, server_groups: [{worker_type: placeholder}]}]", "no engine group runs engines"),
        (
            "sglang: [{name: a, image_processor_backend: 3}]",
            r"sglang\[0\].image_processor_backend: expected a string",
        ),
        ("sglang: [unclosed", "not valid YAML"),
    ],
)
def test_malformed_sglang_config_names_the_file_and_key(tmp_path: Path, content: str, message: str) -> None:
    path = tmp_path / "cfg.yaml"
    path.write_text(content)
    with pytest.raises(ValueError, match=message) as info:
        parse_args([TSP, "--sglang-config", str(path)])
    assert f"--sglang-config {path}" in str(info.value)


def test_missing_sglang_config_file(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match=r"--sglang-config .*missing\.yaml: cannot read it"):
        parse_args([TSP, "--sglang-config", str(tmp_path / "missing.yaml")])


def test_rollout_paths_are_made_absolute_at_parse_time(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    args = parse_args(["--save", "ckpt", "--load", "old", "--save-debug-rollout-data", "dumps/r_{rollout_id}"])
    assert args.save == str(tmp_path / "ckpt") and args.load == str(tmp_path / "old")
    assert args.save_debug_rollout_data == str(tmp_path / "dumps" / "r_{rollout_id}")
