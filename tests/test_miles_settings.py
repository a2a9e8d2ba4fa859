"""This project's settings in a stock Miles run, through Miles' real ``parse_args``: the command
line and the ``--custom-config-path`` YAML exactly as docs/INTEGRATION.md A.6 shows them (read
from its fenced blocks, so doc and test cannot drift; ``...`` is filled with the Miles options a
parse needs), then Miles' own loading of the plugins from those options. The plugins see every
value; a misspelt key, a wrong type and a bad value are refused in one line naming the key; a
custom generate function's ``add_arguments`` brings the options back to the command line; and
every setting the plugins read is one Miles defines or one of ours (the table the YAML check and
the options are derived from)."""

from __future__ import annotations

import itertools
import json
import re
import shlex
import sys
from pathlib import Path

import pytest
import yaml
from helpers.miles_snapshot import REPO, require_miles

MILES = require_miles()

pytestmark = pytest.mark.torch

from helpers.miles_run import make_tokenizer_dir, write_prompts  # noqa: E402
from miles.rollout.fully_async_data_buffer import DataBufferConstructorInput  # noqa: E402
from miles.utils.arguments import parse_args as miles_parse_args  # noqa: E402
from miles.utils.misc import load_function  # noqa: E402

import trainer_hooks  # noqa: E402
from trainer_hooks.arguments import SETTINGS  # noqa: E402
from trainer_hooks.checkpoints import accepted_changes  # noqa: E402
from trainer_hooks.miles._settings import miles_option_names  # noqa: E402
from trainer_hooks.rollout import journal_interval  # noqa: E402
from trainer_hooks.run_media import run_media_dir  # noqa: E402

DOC = REPO / "docs" / "INTEGRATION.md"
# Settings that only a Miles fork reads (the processor check, the token-space build's switch).
FORK_ONLY = {"sglang_model_path", "enable_token_space_processor"}


def doc_blocks() -> tuple[str, str]:
    """The ``bash`` and ``yaml`` blocks of INTEGRATION.md A.6."""
    text = DOC.read_text(encoding="utf-8")
    section = text[text.index("### A.6 ") : text.index("\n# B. ")]
    blocks = re.findall(r"^```(\w+)\n(.*?)^```$", section, re.S | re.M)
    bash = [b for lang, b in blocks if lang == "bash"]
    yml = [b for lang, b in blocks if lang == "yaml"]
    assert len(bash) == 1 and len(yml) == 1, blocks
    return bash[0], yml[0]


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    """What ``...`` stands for: a model (a local tokenizer and its HF config) and prompts."""
    d = tmp_path_factory.mktemp("miles-model")
    tok = make_tokenizer_dir(d / "model")
    (tok / "config.json").write_text(json.dumps({"model_type": "gpt2", "n_layer": 2, "vocab_size": 1011}))
    prompts = write_prompts(d / "prompts.jsonl", 16)
    return [
        "--train-backend", "fsdp", "--hf-checkpoint", str(tok), "--prompt-data", str(prompts),
        "--input-key", "text", "--label-key", "label", "--rollout-batch-size", "4",
        "--n-samples-per-prompt", "2", "--num-rollout", "2",
    ]  # fmt: skip


def stock_argv(bash: str, model: list[str], tmp_path: Path) -> list[str]:
    argv = shlex.split(bash.replace("\\\n", " ").replace("/ckpt/run1", str(tmp_path / "ckpt" / "run1")))
    assert argv[:2] == ["python", "train_async.py"] and argv.count("...") == 1, argv
    i = argv.index("...")
    return [*argv[1:i], *model, *argv[i + 1 :]]


def write_yaml(text: str, tmp_path: Path) -> dict:
    """Write the YAML where the command line names it (relative: the working directory)."""
    text = text.replace("/shared/media", str(tmp_path / "shared" / "media"))
    (tmp_path / "rollout_bundles.yaml").write_text(text, encoding="utf-8")
    return yaml.safe_load(text)


def miles_parse(monkeypatch, tmp_path: Path, argv: list[str]):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "argv", argv)
    return miles_parse_args()


def build_plugins(args):
    """What Miles does with the two options: ``RolloutManager`` loads the data source from
    ``--data-source-path``; ``FullyAsyncRolloutFn`` its buffer from ``--custom-async-data-buffer-path``."""
    source = load_function(args.data_source_path)(args)
    buffer = load_function(args.custom_async_data_buffer_path)(
        DataBufferConstructorInput(args=args, unused_handler_fn=lambda *a, **kw: None)
    )
    return source, buffer


def test_the_stock_command_line_and_yaml_of_integration_md_reach_the_plugins(monkeypatch, tmp_path, model):
    bash, yml = doc_blocks()
    settings = write_yaml(yml, tmp_path)
    # The YAML gives every setting the stock plugins read, and nothing else.
    assert set(settings) == {st.name for st in SETTINGS} - FORK_ONLY
    args = miles_parse(monkeypatch, tmp_path, stock_argv(bash, model, tmp_path))
    assert args.save == str(tmp_path / "ckpt" / "run1") and args.custom_config_path == "rollout_bundles.yaml"

    source, buffer = build_plugins(args)
    assert type(source).__name__ == "BundledDataSource" and type(buffer).__name__ == "BundledDataBuffer"
    assert source.rollout_state is buffer.rollout_state
    # What each reader of a setting sees.
    assert {name: getattr(args, name) for name in settings} == settings
    assert run_media_dir(args) == tmp_path / "shared" / "media" / "run1"
    assert journal_interval(args) == 0.5 and source.rollout_state.ledger.interval == 0.5
    assert source.rollout_state.ledger.enabled  # --save is set, the interval is not 0
    assert accepted_changes(args) == {"model_path"}


def refusal(monkeypatch, tmp_path, model, yml: str) -> str:
    bash, _ = doc_blocks()
    write_yaml(yml, tmp_path)
    args = miles_parse(monkeypatch, tmp_path, stock_argv(bash, model, tmp_path))  # Miles takes any key
    with pytest.raises(ValueError) as e:
        build_plugins(args)
    return str(e.value)


@pytest.mark.parametrize(
    ("typo", "near"),
    [
        ("shared_media_dirr", "shared_media_dir"),
        ("shared-media-dir", "shared_media_dir"),
        ("keep_rollout_checkpoint", "keep_rollout_checkpoints"),
    ],
)
def test_a_misspelt_key_in_the_yaml_is_named_with_the_setting_it_is_close_to(
    monkeypatch, tmp_path, model, typo, near
):
    _, yml = doc_blocks()
    msg = refusal(monkeypatch, tmp_path, model, re.sub(rf"^{near}:", f"{typo}:", yml, flags=re.M))
    assert msg.startswith(
        f"--custom-config-path rollout_bundles.yaml: unknown setting {typo!r} (did you mean {near!r}?); "
        "this project's settings are shared_media_dir, run_uuid, "
    ), msg


def test_keys_of_miles_and_of_other_functions_in_the_yaml_are_left_alone(monkeypatch, tmp_path, model):
    """SGLang's ``sglang_model_impl`` is as close to our ``sglang_model_path`` as a typo, but Miles'
    parser defines it; a key far from ours belongs to some custom function."""
    _, yml = doc_blocks()
    assert "sglang_model_impl" in miles_option_names()
    bash, _ = doc_blocks()
    write_yaml(yml + "sglang_model_impl: transformers\nmy_reward_scale: 2\n", tmp_path)
    args = miles_parse(monkeypatch, tmp_path, stock_argv(bash, model, tmp_path))
    build_plugins(args)
    assert args.sglang_model_impl == "transformers" and args.my_reward_scale == 2


@pytest.mark.parametrize(
    ("line", "expected"),
    [
        ("keep_rollout_checkpoints: three", "keep_rollout_checkpoints (--keep-rollout-checkpoints): expected an integer, found 'three'"),
        ("rollout_journal_interval: soon", "rollout_journal_interval (--rollout-journal-interval): expected a number, found 'soon'"),
        ("resume_verify_media: 1", "resume_verify_media (--resume-verify-media): expected true or false, found 1"),
        ("bundle_link_mode: 3", "bundle_link_mode (--bundle-link-mode): expected one of auto, hardlink, reflink, copy, found 3"),
    ],
)  # fmt: skip
def test_a_value_of_the_wrong_type_is_refused_naming_the_key(monkeypatch, tmp_path, model, line, expected):
    _, yml = doc_blocks()
    key = line.split(":")[0]
    msg = refusal(monkeypatch, tmp_path, model, re.sub(rf"^{key}:.*$", line, yml, flags=re.M))
    assert msg == f"--custom-config-path rollout_bundles.yaml: {expected}"


@pytest.mark.parametrize(
    ("line", "flag"),
    [
        ("keep_rollout_checkpoints: 0", ["--keep-rollout-checkpoints", "0"]),
        ("rollout_journal_interval: -0.5", ["--rollout-journal-interval", "-0.5"]),
        ("bundle_link_mode: symlink", ["--bundle-link-mode", "symlink"]),
        ("resume_accept_changes: [model_path, weights]", ["--resume-accept-changes", "model_path,weights"]),
        ("run_uuid: ../other", ["--run-uuid", "../other"]),
    ],
)
def test_a_bad_value_in_the_yaml_gets_the_command_lines_error(monkeypatch, tmp_path, model, line, flag):
    """The command line's reason, and the YAML's file and key where the command line names its
    flag (issue 30 item 10: the user wrote the key, not the flag)."""
    _, yml = doc_blocks()
    key = line.split(":")[0]
    msg = refusal(monkeypatch, tmp_path, model, re.sub(rf"^{key}:.*$", line, yml, flags=re.M))
    try:  # the same value on a command line that has the option (our parser)
        trainer_hooks.parse_args(["--rollout-batch-size", "1", *flag])
    except (ValueError, SystemExit) as e:
        cli = str(e)
    else:
        raise AssertionError(f"{flag} was accepted on the command line")
    if flag[0] == "--bundle-link-mode":  # argparse refuses it before validation: the message is ours alike
        cli = "--bundle-link-mode: expected one of auto, hardlink, reflink, copy, found 'symlink'"
    assert cli.startswith(f"{flag[0]}: "), cli
    assert msg == f"--custom-config-path rollout_bundles.yaml: {key} ({flag[0]}): {cli[len(flag[0]) + 2 :]}"


def test_a_custom_generate_functions_add_arguments_brings_the_options_to_the_command_line(
    monkeypatch, tmp_path, model, capsys
):
    bash, _ = doc_blocks()
    argv = [
        a
        for a in stock_argv(bash, model, tmp_path)
        if a != "rollout_bundles.yaml" and a != "--custom-config-path"
    ]
    argv += ["--custom-generate-function-path", "helpers.miles_generate.generate"]
    media = tmp_path / "media"
    args = miles_parse(
        monkeypatch, tmp_path, [*argv, "--shared-media-dir", str(media), "--keep-rollout-checkpoints", "2"]
    )
    build_plugins(args)
    assert args.shared_media_dir == str(media) and args.keep_rollout_checkpoints == 2
    assert args.bundle_link_mode == "auto" and args.rollout_journal_interval == 1.0  # the table's defaults
    with pytest.raises(SystemExit):
        miles_parse(monkeypatch, tmp_path, [*argv, "--shared-media-dirr", str(media)])
    assert "unrecognized arguments: --shared-media-dirr" in capsys.readouterr().err


# A setting read as getattr(args, "name", ...) or getattr(self.args, "name", ...) by the code a
# stock run uses; attributes that Miles' parser as built here lacks are named with their reason.
_READS = re.compile(r"getattr\(\s*(?:self\.)?args\s*,\s*[\"'](\w+)[\"']")
SET_AFTER_PARSING = {
    "fp16": "the training backend's option (FSDP's and Megatron's --fp16), added around Miles' own",
    "bf16": "Miles' FSDP backend sets it after parsing (args.bf16 = not args.fp16); Megatron defines --bf16",
    "rollout_processor_args": "set by validate_args (a fork's parse); absent in a stock run, read with a default",
}


def test_every_setting_the_plugins_read_is_in_miles_parser_or_in_the_table():
    """Every ``args`` attribute that trainer_hooks.miles, the checkpoints, the rollout state, the
    journal, run media and dumps read is reachable in a stock run: Miles' parser defines it, or it
    is one of :data:`SETTINGS` (a YAML key, validated)."""
    files = [
        *sorted((REPO / "trainer_hooks" / "miles").glob("*.py")),
        *sorted((REPO / "trainer_hooks" / "checkpoints").glob("*.py")),
        *sorted((REPO / "trainer_hooks" / "rollout").glob("*.py")),
        *sorted((REPO / "trainer_hooks" / "journal").glob("*.py")),
        *sorted((REPO / "trainer_hooks" / "run_media").glob("*.py")),
        *sorted((REPO / "trainer_hooks" / "dumps").glob("*.py")),
        REPO / "trainer_hooks" / "_sample_bundle.py",
    ]
    read = {name for f in files for name in _READS.findall(f.read_text(encoding="utf-8"))}
    ours = {st.name for st in SETTINGS}
    assert {
        "shared_media_dir",
        "bundle_link_mode",
        "keep_rollout_checkpoints",
        "rollout_journal_interval",
    } <= read
    unreachable = read - ours - miles_option_names() - set(SET_AFTER_PARSING)
    assert not unreachable, (
        f"read by the plugins but neither Miles' option nor in SETTINGS: {sorted(unreachable)}"
    )


# ---------------------------------------------------------------- issue 30: bad values through Miles' YAML


@pytest.mark.parametrize(
    ("line", "expected"),
    [
        # item 7: a URL is not a local path (it was used as ./s3:/rt4/media)
        ("shared_media_dir: s3://rt4/media", "shared_media_dir (--shared-media-dir): s3://rt4/media: the shared media directory: expected a local path, found a URL (s3://)"),
        # item 8: bounded at parse time (the journal writer died with OverflowError)
        ("rollout_journal_interval: 1.0e+308", "rollout_journal_interval (--rollout-journal-interval): expected seconds from 0 (disables the journal) to 86400 (a day), found 1e+308"),
        # item 10: a run id too long for a file name (raw OSError at the first screenshot)
        (f"run_uuid: {'r' * 300}", f"run_uuid (--run-uuid): run id '{'r' * 40}'... (300 characters) is refused because it is 300 bytes long, more than 128"),
    ],
)  # fmt: skip
def test_a_bad_value_in_the_yaml_is_named_by_its_file_and_key(monkeypatch, tmp_path, model, line, expected):
    _, yml = doc_blocks()
    key = line.split(":")[0]
    msg = refusal(monkeypatch, tmp_path, model, re.sub(rf"^{key}:.*$", line, yml, flags=re.M))
    assert msg.startswith(f"--custom-config-path rollout_bundles.yaml: {expected}"), msg
    assert not (tmp_path / "s3:").exists()


def test_a_tilde_in_the_yamls_shared_media_dir_is_the_home_directory(monkeypatch, tmp_path, model):
    """Issue 30 item 7: ``shared_media_dir: ~/media`` became ``./~/media`` (Miles does not expand
    YAML values)."""
    bash, yml = doc_blocks()
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    write_yaml(re.sub(r"^shared_media_dir:.*$", "shared_media_dir: ~/media", yml, flags=re.M), tmp_path)
    args = miles_parse(monkeypatch, tmp_path, stock_argv(bash, model, tmp_path))
    assert args.shared_media_dir == "~/media"  # as Miles sets it
    build_plugins(args)
    assert args.shared_media_dir == str(tmp_path / "home" / "media")
    assert run_media_dir(args) == tmp_path / "home" / "media" / "run1" and not (tmp_path / "~").exists()


def test_a_yaml_alias_bomb_as_run_uuid_is_refused_at_once(monkeypatch, tmp_path, model):
    """Issue 30 item 9: a few hundred bytes of YAML aliases as ``run_uuid`` (9**7 references
    here) cost seconds and gigabytes, because the type error built the value's full repr."""
    import time

    _, yml = doc_blocks()
    bomb = "a: &a [x,x,x,x,x,x,x,x,x]\n" + "".join(
        f"{n}: &{n} [{','.join([f'*{b}'] * 9)}]\n" for b, n in itertools.pairwise("abcdefg")
    )
    text = bomb + re.sub(r"^run_uuid:.*$", "run_uuid: *g", yml, flags=re.M)
    start = time.perf_counter()
    msg = refusal(monkeypatch, tmp_path, model, text)
    elapsed = time.perf_counter() - start
    assert msg.startswith(
        "--custom-config-path rollout_bundles.yaml: run_uuid (--run-uuid): expected a string, found [[["
    )
    assert len(msg) < 300 and elapsed < 5.0, (len(msg), elapsed)  # Miles' parse included


@pytest.mark.parametrize("buffer", [None, "miles.rollout.fully_async_data_buffer.DefaultDataBuffer"])
def test_fully_async_without_our_buffer_is_refused_when_the_plugins_are_built(
    monkeypatch, tmp_path, model, buffer
):
    """Issue 30 item 10: without ``--custom-async-data-buffer-path trainer_hooks.miles.BundledDataBuffer``
    the run was refused at its first save, perhaps hours in; now when Miles builds the data source."""
    bash, yml = doc_blocks()
    write_yaml(yml, tmp_path)
    argv = stock_argv(bash, model, tmp_path)
    i = argv.index("--custom-async-data-buffer-path")
    argv = [*argv[:i], *argv[i + 2 :]] + (["--custom-async-data-buffer-path", buffer] if buffer else [])
    args = miles_parse(monkeypatch, tmp_path, argv)
    assert args.rollout_function_path == "miles.rollout.fully_async_rollout.FullyAsyncRolloutFn"
    with pytest.raises(ValueError) as e:
        load_function(args.data_source_path)(args)
    found = f"it names {buffer}" if buffer else "it is not set"
    assert str(e.value).startswith(
        "--fully-async with --data-source-path trainer_hooks.miles.BundledDataSource also needs "
        "--custom-async-data-buffer-path trainer_hooks.miles.BundledDataBuffer"
    ) and str(e.value).endswith(f"({found})")
