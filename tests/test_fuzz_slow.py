"""Every file format a command reads, damaged 10,000 ways each: a result or a one-line user error, nothing else
(issue 28, "and keep it so"; the slow set: ``python3 -m pytest -m slow tests/test_fuzz_slow.py``).

The parsers' own test files keep their property tests small enough for the default run (tens
to 150 examples each); this module runs the same checks, through the helpers those files define,
at ``max_examples=10_000`` per format, over damaged real inputs (:func:`tests.fuzz.mutated_text`)
and random text. A refusal must be the project's error (a ``MomentError``: ``ParseError``,
``StoreError``, ``TrainingError`` ...); any other exception is a bug.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import tempfile
from collections.abc import Callable
from functools import cache
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from momentbase.errors import MomentError
from tests.fuzz import mutated_text

#: per format; MOMENT_FUZZ_EXAMPLES sets fewer for a quick look (the issue asks for 10,000 in the slow set)
EXAMPLES = int(os.environ.get("MOMENT_FUZZ_EXAMPLES", "10000"))
SLOW = settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=list(HealthCheck))


@cache
def _scratch() -> Path:
    return Path(tempfile.mkdtemp(prefix="moment-fuzz-"))


def _via_file(name: str, load: Callable[[Path], object], *, directory: bool = False) -> Callable[[str], object]:
    """A check that writes ``text`` to ``name`` in a scratch directory and calls ``load`` on the file (or on
    the directory holding it)."""
    def check(text: str) -> object:
        p = _scratch() / name
        p.write_text(text, encoding="utf-8", errors="surrogateescape")
        return load(p.parent if directory else p)
    return check


def _refused_or_parsed(check: Callable[[str], object], text: str) -> None:
    with contextlib.suppress(MomentError):
        check(text)


# -- the formats: (real texts, the check) ---------------------------------------------------------

def _lspci():
    from tests.test_lspci import FIXTURE_TEXTS, _each_parser
    return FIXTURE_TEXTS, _each_parser


def _nvidia_smi():
    from tests.test_nvidia_smi import _parse_or_error, _real_texts
    return _real_texts(), _parse_or_error


def _hwloc():
    from tests.test_hwloc import DGX2, MINSKY, SL390S, _parse_or_parse_error, _text
    return [_text(m) for m in (SL390S, MINSKY, DGX2)], _parse_or_parse_error


def _nccl():
    from tests.test_nccl import AWS, AZURE, DUMP, _parse_or_parse_error, _text
    return [_text(AWS), _text(AZURE), DUMP], _parse_or_parse_error


def _dmidecode():
    from tests.test_dmidecode import DELL, HPE, _check, fixture_text
    return [fixture_text(DELL), fixture_text(HPE)], _check


def _spec():
    from tests.test_spec import BUNDLED_TEXT, _parse_or_parse_error
    return list(BUNDLED_TEXT.values()), _parse_or_parse_error


def _capacities():
    from planner.capacities import dump_capacities, parse_capacities
    from tests.test_capacities import FULL
    return [dump_capacities(FULL), dump_capacities(FULL, "json")], lambda t: parse_capacities(t, "m.yaml")


def _metrics():
    from training.runreport import read_metrics
    epoch = {"kind": "epoch", "epoch": 0, "epoch_s": 2.0, "seeds_per_s": 500.0, "compute_s": 1.2, "allreduce_s": 0.1,
             "io_wait_s": 0.5, "sample_s": 0.6, "gather_s": 0.4, "io_wait_share": 0.25, "run": "r1",
             "tiers": {"gpu": {"rows": 50, "bytes": 500}, "ssd": {"rows": 20, "bytes": 200}}}
    recs = [{"kind": "start", "run": "r1", "config": {"model": "sage", "dataset": "g"}},
            {"kind": "step", "run": "r1", "epoch": 0, "step": 0, "loss": 2.3}, epoch,
            {"kind": "prediction", "run": "r1", "predicted": {"epoch_s": 1.6}}]
    return ["".join(json.dumps(r) + "\n" for r in recs)], _via_file("m.jsonl", read_metrics)


def _workload():
    from iostack.bench.workload import load_workload
    texts = ["data: {synthetic: {rows: 2048, row_bytes: 4KiB, dir: /nonexistent}}\n"
             "stream: {kind: uniform, rows_per_step: 256, steps: 4}\n",
             "data:\n  synthetic:\n    rows: 4096\n    row_bytes: 512\n    dir: /nonexistent\n"
             "stream:\n  kind: zipf\n  exponent: 1.1\n  rows_per_step: 64\n  steps: 3\ncompute_s: 0.001\n"]
    return texts, _via_file("wl.yaml", load_workload)


def _placement():
    from iostack.placement import load_placement, simple_placement
    d = _scratch() / "placed"
    d.mkdir(exist_ok=True)
    simple_placement(1000, [("gpu", 100), ("cpu", 200), ("ssd", 700)]).save(d)
    name = next(p.name for p in d.iterdir() if p.suffix == ".json")
    return [(d / name).read_text()], _via_file(f"placed/{name}", load_placement, directory=True)


def _plan_file():
    from moment.cli import main
    from planner.handoff import read_plan_file
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        assert main(["plan", "--machine", "moment-b", "--json", "--top", "1"]) == 0
    return [out.getvalue()], _via_file("plan.json", lambda p: read_plan_file(p))


def _sysfs():
    from tests.test_sysfs import PARSERS

    def every_parser(text: str) -> None:
        for parse in PARSERS:  # each refuses on its own; the property holds for each
            with contextlib.suppress(MomentError):
                parse(text, "/sys/x/attr")
    return ["0x060400\n", "16.0 GT/s PCIe\n", "16\n", "-1\n", "129\n", "0-3,8\n", "0x10de\n"], every_parser


def _edge_list():
    from tests.conftest import GRAPH_FIXTURES
    from training.importers._text import iter_rows
    real = next(iter(sorted((GRAPH_FIXTURES / "soc-Slashdot0902").glob("*.txt*"))), None)
    head = []
    if real is not None:
        import gzip
        with (gzip.open(real, "rt") if real.suffix == ".gz" else open(real)) as f:
            head = ["".join(next(f) for _ in range(60))]
    return head, _via_file("e.txt", lambda p: [r for r in iter_rows(p, ncols=2, chunk_bytes=97)])


FORMATS: dict[str, Callable[[], tuple[list[str], Callable[[str], object]]]] = {
    "lspci": _lspci, "nvidia-smi": _nvidia_smi, "hwloc": _hwloc, "nccl": _nccl, "dmidecode": _dmidecode,
    "machine spec": _spec, "capacities": _capacities, "metrics": _metrics, "emulate workload": _workload,
    "placement": _placement, "plan file": _plan_file, "sysfs attribute": _sysfs, "edge list": _edge_list,
}


@cache
def _format(name: str) -> tuple[list[str], Callable[[str], object]]:
    texts, check = FORMATS[name]()
    if not texts:
        pytest.skip(f"{name}: the real inputs are not here (../shared?)")
    return texts, check


@pytest.mark.slow  # 10,000 damaged inputs per format: minutes each
@pytest.mark.parametrize("name", list(FORMATS))
@SLOW
@given(data=st.data())
def test_every_format_damaged_10k_ways_gives_a_result_or_a_user_error(name, data):
    texts, check = _format(name)
    text = data.draw(st.one_of(mutated_text(texts, keepends=True, times=(1, 3)), st.text(max_size=300)))
    _refused_or_parsed(check, text)
