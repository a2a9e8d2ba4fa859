"""Options, their validation, and the parse-time check that every engine group shares the
processor settings."""

from __future__ import annotations

import argparse
import itertools
import json
import os
import re
from pathlib import Path

import pytest
import yaml

from trainer_hooks import (
    MILES_OPTIONS,
    OWN_OPTIONS,
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
    args = parse_args(["--rollout-batch-size", "1"])
    assert re.fullmatch(r"[0-9a-f]{32}", args.run_uuid)
    assert parse_args(["--rollout-batch-size", "1"]).run_uuid != args.run_uuid  # a new run per parse
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
        "--rollout-batch-size", "4",
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
        (["--load-debug-rollout-data", "d", "--load-debug-rollout-data-subsample", "1.5"], "0 <= r <= 1"),
        (["--load-debug-rollout-data", "d", "--load-debug-rollout-data-subsample", "-0.1"], "0 <= r <= 1"),
        (["--keep-rollout-checkpoints", "0"], "--keep-rollout-checkpoints"),
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
        parse_args(["--rollout-batch-size", "1", *argv])


def test_bad_run_uuid_is_an_unsafe_run_dir_error() -> None:
    with pytest.raises(UnsafeRunDirError):
        parse_args(["--rollout-batch-size", "1", "--run-uuid", "a/b"])


def test_choices_are_enforced_by_argparse_and_by_validate_args() -> None:
    with pytest.raises(SystemExit):
        parse_args(["--rollout-batch-size", "1", "--bundle-link-mode", "symlink"])
    args = parse_args(["--rollout-batch-size", "1"])
    args.bundle_verify = "paranoid"
    with pytest.raises(
        ValueError, match="--bundle-verify: expected one of none, fast, full, found 'paranoid'"
    ):
        validate_args(args)


def test_shared_media_dir_that_is_a_file_is_refused(tmp_path: Path) -> None:
    (tmp_path / "f").write_text("")
    with pytest.raises(ValueError, match=r"--shared-media-dir .*expected a directory"):
        parse_args(["--rollout-batch-size", "1", "--shared-media-dir", str(tmp_path / "f")])


def test_add_arguments_skips_options_the_parser_already_has() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--save", default="miles-default")
    parser.add_argument("--fp16", action="store_true")
    add_arguments(parser)
    args = validate_args(parser.parse_args(["--shared-media-dir", "/m", "--rollout-batch-size", "1"]))
    assert args.save == os.path.abspath("miles-default") and args.shared_media_dir == "/m"


# ---------------------------------------------------------------- processor agreement


def test_no_sglang_config_resolves_one_implicit_group() -> None:
    args = parse_args(["--rollout-batch-size", "1", TSP, *_base_argv()])
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
    args = parse_args(
        [
            "--rollout-batch-size",
            "1",
            TSP,
            *_base_argv(mm_process_config={"a": 1, "b": 2}),
            "--sglang-config",
            cfg,
        ]
    )
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
        parse_args(["--rollout-batch-size", "1", TSP, *_base_argv(), "--sglang-config", cfg])
    msg = str(info.value)
    assert f"disagree on {field}," in msg
    assert cfg in msg
    for label in disagreeing:
        assert label in msg
    assert repr(BASE[field]) in msg and repr(OTHER[field]) in msg
    assert source in msg and f"--sglang-{field.replace('_', '-')}" in msg
    # Without --enable-token-space-processor the engines process their own inputs: no check.
    assert (
        parse_args(
            ["--rollout-batch-size", "1", *_base_argv(), "--sglang-config", cfg]
        ).rollout_processor_args
        is None
    )


@pytest.mark.parametrize("field", FIELDS)
def test_a_value_set_for_only_one_group_disagrees_with_the_unset_default(tmp_path: Path, field: str) -> None:
    cfg = _config(tmp_path, [{"name": "actor", "server_groups": [_group(), _group(**{field: OTHER[field]})]}])
    with pytest.raises(ValueError, match=f"disagree on {field},.*= (None|'auto') \\(from"):
        parse_args(["--rollout-batch-size", "1", TSP, "--sglang-config", cfg])


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
        parse_args(["--rollout-batch-size", "1", TSP, *_base_argv(), *extra])
    assert parse_args(["--rollout-batch-size", "1", *_base_argv(), *extra]).rollout_processor_args is None


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
        parse_args(["--rollout-batch-size", "1", TSP, "--sglang-config", str(path)])
    assert f"--sglang-config {path}" in str(info.value)


def test_missing_sglang_config_file(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match=r"--sglang-config .*missing\.yaml: cannot read it"):
        parse_args(["--rollout-batch-size", "1", TSP, "--sglang-config", str(tmp_path / "missing.yaml")])


def test_rollout_paths_are_made_absolute_at_parse_time(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    args = parse_args(
        [
            "--rollout-batch-size",
            "1",
            "--save",
            "ckpt",
            "--load",
            "old",
            "--save-debug-rollout-data",
            "dumps/r_{rollout_id}",
        ]
    )
    assert args.save == str(tmp_path / "ckpt") and args.load == str(tmp_path / "old")
    assert args.save_debug_rollout_data == str(tmp_path / "dumps" / "r_{rollout_id}")


# ---------------------------------------------------------------- Miles' parser
#
# Miles is not installable here (it needs SGLang and a GPU stack), so these tests rebuild the
# order in which Miles' parse_args builds its parser (miles/utils/arguments.py at radixark/miles
# 31f1ca961): the training backend's options first (Megatron's --save/--load/--fp16/--bf16/
# --save-interval, or FSDP's --fp16 BooleanOptionalAction), then add_custom_arguments(parser),
# then Miles' own options (defined below as Miles defines them; --save/--load through its
# reset_arg, which only resets the default of an existing option), then the rollout function
# class's add_arguments(parser), then parse.

# Miles' definitions of the options trainer_hooks uses, written down from its source
# (type, default, choices, required, action); SGLang's for the --sglang-* ones (0.5.23).
MILES_DEFS: dict[str, dict] = {
    "--save-debug-rollout-data": dict(type=str, default=None),
    "--save-debug-trajectory-data": dict(type=str, default=None),
    "--load-debug-rollout-data": dict(type=str, default=None),
    "--load-debug-rollout-data-subsample": dict(type=float, default=None),
    "--num-rollout": dict(type=int, default=None),
    "--start-rollout-id": dict(type=int, default=None),
    "--rollout-batch-size": dict(type=int, required=True),
    "--update-weights-interval": dict(type=int, default=1),
    "--rollout-external-engine-addrs": dict(type=str, default=None, nargs="+"),
    "--recompute-logprobs-via-prefill": dict(action="store_true", default=False),
    "--reward-key": dict(type=str, default=None),
    "--sglang-config": dict(type=str, default=None),
    "--sglang-image-processor-backend": dict(
        type=str, choices=["auto", "torchvision", "pil"], default="auto"
    ),
    "--sglang-mm-process-config": dict(type=json.loads, default=None),
}
MEGATRON_DEFS: dict[str, dict] = {
    "--save": dict(type=str, default=None),
    "--load": dict(type=str, default=None),
    "--fp16": dict(action="store_true"),
    "--bf16": dict(action="store_true"),
    "--save-interval": dict(type=int, default=None),
}
FSDP_DEFS: dict[str, dict] = {"--fp16": dict(action=argparse.BooleanOptionalAction, default=False)}


def _reset_arg(parser: argparse.ArgumentParser, name: str, **kwargs: object) -> None:
    for action in parser._actions:
        if name in action.option_strings:
            if "default" in kwargs:
                action.default = kwargs["default"]
            return
    parser.add_argument(name, **kwargs)  # type: ignore[arg-type]


def _miles_parse(argv, *, backend="megatron", custom=None, rollout_fn_hook=None):
    parser = argparse.ArgumentParser(allow_abbrev=False)
    for flag, kw in (MEGATRON_DEFS if backend == "megatron" else FSDP_DEFS).items():
        parser.add_argument(flag, **kw)
    if custom is not None:
        parser = custom(parser)  # Miles: "Add custom arguments in front"
    for flag, kw in MILES_DEFS.items():
        parser.add_argument(flag, **kw)  # argparse.ArgumentError on a conflict, as in Miles
    _reset_arg(parser, "--load", type=str, default=None)
    _reset_arg(parser, "--save", type=str, default=None)
    if rollout_fn_hook is not None:
        rollout_fn_hook(parser)
    return parser, parser.parse_args(argv)


@pytest.mark.parametrize("backend", ["megatron", "fsdp"])
@pytest.mark.parametrize("where", ["before", "after", "both"])
def test_add_arguments_plugs_into_miles_parser_whichever_comes_first(backend: str, where: str) -> None:
    argv = ["--rollout-batch-size", "8", "--shared-media-dir", "/m", "--recompute-logprobs-via-prefill"]
    parser, args = _miles_parse(
        argv,
        backend=backend,
        custom=add_arguments if where in ("before", "both") else None,
        rollout_fn_hook=add_arguments if where in ("after", "both") else None,
    )
    # Every option string is defined exactly once.
    strings = [s for a in parser._actions for s in a.option_strings]
    assert len(strings) == len(set(strings))
    args = validate_args(args)
    assert (args.rollout_batch_size, args.shared_media_dir, args.recompute_logprobs_via_prefill) == (
        8,
        "/m",
        True,
    )
    assert args.num_rollout is None and args.start_rollout_id is None
    assert args.sglang_image_processor_backend == "auto"
    assert args.bundle_link_mode == "auto" and args.run_uuid
    # Miles' own definitions won: --rollout-batch-size stays required.
    with pytest.raises(SystemExit):
        parser.parse_args(["--shared-media-dir", "/m"])
    if backend == "fsdp":
        # FSDP has no --bf16; Miles derives args.bf16 from --fp16. Nothing of ours shadows --fp16.
        assert isinstance(parser._option_string_actions["--fp16"], argparse.BooleanOptionalAction)
        assert "--no-fp16" in parser._option_string_actions


def test_before_hook_adds_no_option_miles_defines() -> None:
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    strings = {s for a in parser._actions for s in a.option_strings}
    assert strings & set(MILES_OPTIONS) == set()
    assert set(OWN_OPTIONS) <= strings
    assert set(OWN_OPTIONS).isdisjoint(MILES_DEFS) and set(OWN_OPTIONS).isdisjoint(MEGATRON_DEFS)


def test_a_plain_parser_gets_the_miles_options_it_lacks_at_parse_time() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--save", default="mine")
    add_arguments(parser)
    add_arguments(parser)  # twice: harmless
    args = parser.parse_args(["--rollout-batch-size", "2", "--no-fp16"])
    assert args.save == "mine" and args.rollout_batch_size == 2 and args.fp16 is False
    args = parser.parse_args(["--rollout-batch-size", "2"])  # a second parse adds nothing again
    strings = [s for a in parser._actions for s in a.option_strings]
    assert len(strings) == len(set(strings))


def _definition(action: argparse.Action) -> dict:
    out: dict = {}
    if type(action).__name__ == "_StoreTrueAction":
        out["action"] = "store_true"
    elif isinstance(action, argparse.BooleanOptionalAction):
        out["action"] = argparse.BooleanOptionalAction
    else:
        out["type"] = action.type
    if action.required:
        out["required"] = True
    else:
        out["default"] = action.default
    if action.choices is not None:
        out["choices"] = list(action.choices)
    if action.nargs is not None and out.get("action") is None:
        out["nargs"] = action.nargs
    return out


@pytest.mark.parametrize("flag", [*MILES_DEFS, "--save", "--load", "--save-interval", "--fp16", "--bf16"])
def test_options_that_exist_in_miles_keep_miles_definitions(flag: str) -> None:
    from trainer_hooks.arguments._options import build_parser

    expected = {**MEGATRON_DEFS, **FSDP_DEFS, **MILES_DEFS}[flag]
    if flag == "--bf16":
        expected = {"action": "store_true", "default": False}
    assert _definition(build_parser()._option_string_actions[flag]) == expected


def test_sglang_mm_process_config_is_parsed_by_json_loads_as_sglang_does() -> None:
    args = parse_args(["--rollout-batch-size", "1", "--sglang-mm-process-config", '{"image": {"a": 1}}'])
    assert args.sglang_mm_process_config == {"image": {"a": 1}}
    with pytest.raises(SystemExit):
        parse_args(["--rollout-batch-size", "1", "--sglang-mm-process-config", "{not json"])
    with pytest.raises(SystemExit):
        parse_args(["--rollout-batch-size", "1", "--sglang-image-processor-backend", "fast"])


def test_rollout_batch_size_is_required_and_num_rollout_has_no_default(capsys) -> None:
    with pytest.raises(SystemExit):
        parse_args([])
    assert "the following arguments are required: --rollout-batch-size" in capsys.readouterr().err
    args = parse_args(["--rollout-batch-size", "1"])
    assert args.num_rollout is None and args.start_rollout_id is None


def test_every_option_is_listed_in_the_docs() -> None:
    doc = (Path(__file__).resolve().parents[1] / "docs" / "TRAINER_HOOKS.md").read_text()
    for flag in (*OWN_OPTIONS, *MILES_OPTIONS):
        assert f"`{flag}`" in doc, flag


# This project's settings table, and the check a stock Miles run gets (trainer_hooks.miles.check_args;
# against Miles' real parse_args in tests/test_miles_settings.py). Here Miles is not importable.


def test_the_options_and_their_defaults_come_from_the_settings_table():
    from trainer_hooks.arguments import SETTINGS, add_own_arguments

    assert tuple(st.flag for st in SETTINGS) == OWN_OPTIONS
    defaults = vars(add_own_arguments(argparse.ArgumentParser()).parse_args([]))
    assert defaults == {st.name: st.default for st in SETTINGS}


def test_check_args_names_a_misspelt_config_key_a_wrong_type_and_a_bad_value(tmp_path):
    from trainer_hooks.miles import check_args

    config = tmp_path / "rollout_bundles.yaml"

    def check(text: str) -> argparse.Namespace:
        config.write_text(text)
        args = argparse.Namespace(custom_config_path=str(config), save=None, **yaml.safe_load(text))
        return check_args(args)

    with pytest.raises(
        ValueError, match=r"unknown setting 'bundle_link' \(did you mean 'bundle_link_mode'\?\)"
    ):
        check("bundle_link: copy\n")
    with pytest.raises(ValueError) as e:
        check("keep_rollout_checkpoints: 2.5\n")
    assert str(e.value) == (
        f"--custom-config-path {config}: keep_rollout_checkpoints (--keep-rollout-checkpoints): "
        "expected an integer, found 2.5"
    )
    with pytest.raises(ValueError) as e:
        check("resume_accept_changes: [weights]\n")
    # A bad value of the YAML is named as the YAML's key, not as a flag the user never typed.
    assert str(e.value).startswith(
        f"--custom-config-path {config}: resume_accept_changes (--resume-accept-changes): "
        "unknown field(s) weights; expected some of"
    )
    args = check("shared_media_dir: media\nmy_own_function_setting: 1\n")  # a key far from ours is not ours
    assert args.shared_media_dir == os.path.abspath("media") and len(args.run_uuid) == 32
    assert check_args(args) is args  # once per args object


# ---------------------------------------------------------------- issue 30: bad input, clear errors


def _parse(*argv: str) -> argparse.Namespace:
    return parse_args(["--rollout-batch-size", "1", *argv])


@pytest.mark.parametrize(
    "url", ["s3://rt4/media", "gs://b/media", "az://c/media", "http://host/media", "s3:/rt4/media"]
)
def test_a_url_for_the_shared_media_dir_is_refused_not_taken_for_a_local_path(tmp_path, monkeypatch, url):
    """Issue 30 item 7: ``--shared-media-dir s3://rt4/media`` was used as ``./s3:/rt4/media``."""
    from bundles import UnsupportedLocationError
    from trainer_hooks import store_media, sweep_run_media

    monkeypatch.chdir(tmp_path)
    with pytest.raises(ValueError) as e:
        _parse("--shared-media-dir", url)
    assert str(e.value).startswith(
        f"--shared-media-dir: {url}: the shared media directory: expected a local path"
    )
    # Where the settings were not validated, the run media code refuses it as well.
    with pytest.raises(UnsupportedLocationError, match="--shared-media-dir: expected a local path"):
        store_media(argparse.Namespace(shared_media_dir=url, run_uuid="r"), b"x")
    with pytest.raises(UnsupportedLocationError, match="expected a local path"):
        sweep_run_media(url)
    assert os.listdir(tmp_path) == []  # no ./s3:/ directory


def test_a_tilde_in_the_shared_media_dir_is_expanded_or_refused(tmp_path, monkeypatch):
    """Issue 30 item 7: ``~/media`` (a YAML value, or ``--shared-media-dir=~/media``, which no
    shell expands) became ``./~/media``."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert _parse("--shared-media-dir=~/media").shared_media_dir == str(tmp_path / "home" / "media")
    with pytest.raises(ValueError, match=r"^--shared-media-dir '~no-such-user-h3/m': cannot expand '~'"):
        _parse("--shared-media-dir", "~no-such-user-h3/m")
    assert os.listdir(tmp_path) == []


@pytest.mark.parametrize("value", ["1e10", "1e308", "86400.5", "inf", "nan", "-1"])
def test_the_journal_interval_is_bounded_at_parse_time(value):
    """Issue 30 item 8: 1e10 and 1.0e+308 were accepted, then the journal writer died with
    OverflowError while training went on unjournaled."""
    with pytest.raises(ValueError) as e:
        _parse("--rollout-journal-interval", value)
    assert str(e.value) == (
        "--rollout-journal-interval: expected seconds from 0 (disables the journal) to 86400 (a day), "
        f"found {float(value)!r}"
    )


def test_the_journal_interval_accepts_0_to_a_day():
    assert [
        _parse("--rollout-journal-interval", v).rollout_journal_interval for v in ("0", "0.5", "86400")
    ] == [
        0.0,
        0.5,
        86400.0,
    ]


def _alias_bomb(levels: int) -> str:
    """A YAML document whose ``run_uuid`` nests ``levels`` lists of 9 aliases of the level below."""
    names = "abcdefghij"[: levels + 1]
    lines = [f"{names[0]}: &{names[0]} [x,x,x,x,x,x,x,x,x]"]
    for below, name in itertools.pairwise(names):
        lines.append(f"{name}: &{name} [{','.join([f'*{below}'] * 9)}]")
    return "\n".join([*lines, f"run_uuid: *{names[-1]}", ""])


def test_a_yaml_alias_bomb_is_refused_at_once_with_a_bounded_message(tmp_path):
    """Issue 30 item 9: a 371-byte alias bomb as ``run_uuid`` took 14.9 s and 1.36 GB, because the
    type error built the value's full repr."""
    import time

    from trainer_hooks.miles import check_args

    text = _alias_bomb(6)  # 9**7 references: its full repr is 24 MB (the 371 bytes had 9**9)
    assert len(text) == 249
    config = tmp_path / "rollout_bundles.yaml"
    config.write_text(text)
    args = argparse.Namespace(
        custom_config_path=str(config), save=None, run_uuid=yaml.safe_load(text)["run_uuid"]
    )
    start = time.perf_counter()
    with pytest.raises(ValueError) as e:
        check_args(args)
    elapsed = time.perf_counter() - start
    msg = str(e.value)
    assert msg.startswith(
        f"--custom-config-path {config}: run_uuid (--run-uuid): expected a string, found [[["
    )
    assert len(msg) < 300 and elapsed < 1.0, (len(msg), elapsed)


@pytest.mark.parametrize(
    ("key", "value", "shown"),
    [
        (
            "keep_rollout_checkpoints",
            -(10**5000),
            "<int of 16610 bits>",
        ),  # str() of it raises past 4300 digits
        ("bundle_link_mode", "x" * 10**7, "(10000000 characters)"),
        ("resume_accept_changes", [f"f{i}" for i in range(10**5)], "and 99995 more"),
        ("run_uuid", {"a": list(range(10**6))}, "... (1000000 items)"),
        ("shared_media_dir", 10**5000, "<int of 16610 bits>"),
    ],
    ids=["huge-int", "huge-string", "many-fields", "huge-dict", "int-path"],  # str() of such an int raises
)
def test_every_settings_error_shows_a_bounded_value(tmp_path, key, value, shown):
    """Issue 30 item 9: whatever the value, what a settings error shows is bounded."""
    from trainer_hooks.miles import check_args

    config = tmp_path / "rollout_bundles.yaml"
    config.write_text(f"{key}: 0\n")  # the key is the YAML's; the value is set as Miles sets it
    args = argparse.Namespace(custom_config_path=str(config), save=None, **{key: value})
    with pytest.raises(ValueError) as e:
        check_args(args)
    msg = str(e.value)
    assert msg.startswith(f"--custom-config-path {config}: {key} (--{key.replace('_', '-')}): ")
    assert shown in msg and len(msg) < 400, msg


@pytest.mark.parametrize(("run_id", "size"), [("r" * 300, 300), ("r" * 129, 129), ("é" * 65, 130)])
def test_a_run_id_too_long_for_a_file_name_is_refused_at_parse_time(tmp_path, run_id, size):
    """Issue 30 item 10: a 300-character run id gave a raw ``OSError: File name too long`` from
    ``store_media`` at the first screenshot."""
    with pytest.raises(ValueError) as e:
        _parse("--shared-media-dir", str(tmp_path), "--run-uuid", run_id)
    assert str(e.value).startswith("--run-uuid: run id '" + run_id[:40] + "'")
    assert f"because it is {size} bytes long, more than 128" in str(e.value)
    assert len(str(e.value)) < 400
    assert _parse("--run-uuid", "r" * 128).run_uuid == "r" * 128


def test_the_subsample_range_in_the_docs_is_the_one_the_code_checks():
    """Issue 30 item 22: TRAINER_HOOKS.md §1 said 0 < r <= 1, but 0 is accepted (as in Miles, it
    keeps every row: §5 and INTEGRATION.md say so)."""
    doc = (Path(__file__).parent.parent / "docs" / "TRAINER_HOOKS.md").read_text(encoding="utf-8")
    section = doc[doc.index("## 1. Arguments") : doc.index("\n## 2.")]
    [line] = [ln for ln in section.splitlines() if "`--load-debug-rollout-data-subsample` (" in ln]
    assert "(0 ≤ r ≤ 1, 0 keeping every row as in Miles," in line, line
    assert _parse("--load-debug-rollout-data", "d_{rollout_id}", "--load-debug-rollout-data-subsample", "0")
    for bad in ("-0.01", "1.01"):
        with pytest.raises(ValueError, match="expected 0 <= r <= 1"):
            _parse("--load-debug-rollout-data", "d_{rollout_id}", "--load-debug-rollout-data-subsample", bad)
    from trainer_hooks.arguments import build_parser

    help_text = {a.dest: a.help for a in build_parser()._actions}["load_debug_rollout_data_subsample"]
    assert "0 <= r <= 1; 0 keeps every row" in help_text
