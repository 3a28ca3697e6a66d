"""WebGraph BV graphs: a minimal BV encoder (Boldi-Vigna, as Java's BVGraph writes) here, the decoder in training.

The encoder writes the same bit stream the Java ``BVGraph`` does for the
choices it makes (which reference, which intervals): the format fixes how a
choice is written, not which is made, so any valid choice must decode to the
same lists. Graphs are written without references or intervals first, then
with both, then with non-default codes.
"""

from __future__ import annotations

import numpy as np
import pytest
import scipy.sparse as sp
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from training.data import DatasetError, open_dataset
from training.importers import _bvdecode as bv
from training.importers import detect_format
from training.importers.webgraph import bv_edge_chunks, import_webgraph, read_properties


class BitWriter:
    """Big-endian bits, as ``it.unimi.dsi.io.OutputBitStream``."""

    def __init__(self) -> None:
        self.bits: list[int] = []

    def int(self, value: int, width: int) -> None:
        self.bits += [(value >> (width - 1 - i)) & 1 for i in range(width)]

    def unary(self, n: int) -> None:
        self.bits += [0] * n + [1]

    def gamma(self, n: int) -> None:
        n += 1
        width = n.bit_length() - 1
        self.unary(width)
        self.int(n, width)

    def delta(self, n: int) -> None:
        n += 1
        width = n.bit_length() - 1
        self.gamma(width)
        self.int(n, width)

    def zeta(self, n: int, k: int) -> None:
        n += 1
        h = (n.bit_length() - 1) // k
        self.unary(h)
        left = 1 << (h * k)
        if n - left < left:
            self.int(n - left, h * k + k - 1)
        else:
            self.int(n, h * k + k)

    def code(self, name: str, n: int, k: int) -> None:
        assert n >= 0
        {"UNARY": self.unary, "GAMMA": self.gamma, "DELTA": self.delta}[name](n) if name != "ZETA" else self.zeta(n, k)

    def bytes(self) -> bytes:
        return np.packbits(np.array(self.bits + [0] * (-len(self.bits) % 8), dtype=np.uint8)).tobytes()


def int2nat(x: int) -> int:
    return 2 * x if x >= 0 else -2 * x - 1


def copy_blocks(ref: list[int], succ: set[int]) -> list[int]:
    """Alternating copy/skip run lengths over ``ref`` (first a copy run, maybe empty), the last one dropped."""
    runs, copying, run = [], True, 0
    for y in ref:
        if (y in succ) == copying:
            run += 1
        else:
            runs.append(run)
            copying, run = not copying, 1
    runs.append(run)
    return runs[:-1]


def intervals_of(extra: list[int], min_len: int) -> tuple[list[tuple[int, int]], list[int]]:
    """Maximal runs of consecutive ids at least ``min_len`` long, and what is left over."""
    runs, residual, i = [], [], 0
    while i < len(extra):
        j = i
        while j + 1 < len(extra) and extra[j + 1] == extra[j] + 1:
            j += 1
        if min_len and j - i + 1 >= min_len:
            runs.append((extra[i], j - i + 1))
        else:
            residual += extra[i : j + 1]
        i = j + 1
    return runs, residual


def encode_node(out: BitWriter, x: int, succ: list[int], lists: list[list[int]], window: int, min_len: int,
                k: int, codes: dict[str, str]) -> None:
    c = lambda part, n: out.code(codes.get(part, DEFAULTS[part]), n, k)  # noqa: E731
    c("OUTDEGREES", len(succ))
    if not succ:
        return
    extra = succ
    if window:
        # the reference in the window sharing the most successors (any choice is valid)
        best = max(range(0, min(window, x) + 1), key=lambda r: -1 if r == 0 else len(set(lists[x - r]) & set(succ)))
        if best and not set(lists[x - best]) & set(succ):
            best = 0
        c("REFERENCES", best)
        if best:
            ref, have = lists[x - best], set(succ)
            blocks = copy_blocks(ref, have)
            c("BLOCKS", len(blocks))
            for i, b in enumerate(blocks):
                c("BLOCKS", b if i == 0 else b - 1)
            extra = sorted(have - set(ref))
    if not extra:
        return
    runs, residual = intervals_of(extra, min_len)
    if min_len:
        c("INTERVALS", len(runs))
        prev = None
        for left, length in runs:
            c("INTERVALS", int2nat(left - x) if prev is None else left - prev - 1)
            c("INTERVALS", length - min_len)
            prev = left + length
    for i, y in enumerate(residual):
        c("RESIDUALS", int2nat(y - x) if i == 0 else y - residual[i - 1] - 1)


DEFAULTS = {"OUTDEGREES": "GAMMA", "REFERENCES": "UNARY", "BLOCKS": "GAMMA", "INTERVALS": "GAMMA",
            "RESIDUALS": "ZETA"}


def write_bv(base, lists, *, window=7, min_len=4, k=3, codes=None, cls="it.unimi.dsi.webgraph.BVGraph"):
    codes = codes or {}
    out = BitWriter()
    for x, succ in enumerate(lists):
        encode_node(out, x, sorted(succ), lists, window, min_len, k, codes)
    base.with_name(base.name + ".graph").write_bytes(out.bytes())
    flags = "|".join(f"{p}_{c}" for p, c in codes.items())
    base.with_name(base.name + ".properties").write_text(
        f"#BVGraph properties\ngraphclass={cls}\nversion=0\nnodes={len(lists)}\n"
        f"arcs={sum(map(len, lists))}\nwindowsize={window}\nmaxrefcount=3\nminintervallength={min_len}\n"
        f"zetak={k}\ncompressionflags={flags}\n")
    return base


def web_like(n: int, seed: int, scale: int = 1) -> list[list[int]]:
    """Lists that share structure with their neighbours' (copies) and hold runs (intervals), as web pages do;
    ``scale`` multiplies the run lengths and the random successors (about ``7 * scale`` arcs a node)."""
    rng = np.random.default_rng(seed)
    lists: list[list[int]] = []
    for x in range(n):
        s = set()
        if lists and rng.random() < 0.6:
            src = lists[max(0, x - int(rng.integers(1, 9)))]
            s |= {y for y in src if rng.random() < 0.8}
        if rng.random() < 0.4:
            a = int(rng.integers(0, n))
            s |= set(range(a, min(n, a + int(rng.integers(1, 12 * scale)))))
        s |= set(rng.integers(0, n, int(rng.integers(0, 6 * scale))).tolist())
        if rng.random() < 0.15:
            s = set()
        lists.append(sorted(s))
    return lists


def decode_all(base, chunk_edges=1 << 10):
    props = read_properties(base.with_name(base.name + ".properties"))
    chunks = list(bv_edge_chunks(base.with_name(base.name + ".graph"), props, chunk_edges)())
    src = np.concatenate([s for s, _ in chunks]) if chunks else np.zeros(0, np.int64)
    dst = np.concatenate([d for _, d in chunks]) if chunks else np.zeros(0, np.int64)
    return [dst[src == x].tolist() for x in range(props.nodes)]


@settings(max_examples=60, deadline=None)
@given(values=st.lists(st.integers(0, 2**40), min_size=1, max_size=30),
       code=st.sampled_from(["UNARY", "GAMMA", "DELTA", "ZETA"]), k=st.integers(1, 7))
def test_codes_decode_what_the_writer_wrote(values, code, k):
    if code == "UNARY":
        values = [v % 200 for v in values]
    w = BitWriter()
    for v in values:
        w.code(code, v, k)
    data = np.frombuffer(w.bytes(), dtype=np.uint8)
    pos, got = 0, []
    for _ in values:
        v, pos = bv._read_code(
            data, pos, {"UNARY": bv.UNARY, "GAMMA": bv.GAMMA, "DELTA": bv.DELTA, "ZETA": bv.ZETA}[code], k
        )
        got.append(v)
    assert got == values and pos == len(w.bits)


@pytest.mark.parametrize("window, min_len, codes", [
    (0, 0, None),                      # residuals only
    (0, 4, None),                      # intervals, no references
    (7, 4, None),                      # the Java defaults: references, blocks and intervals
    (3, 2, {"OUTDEGREES": "DELTA", "RESIDUALS": "GAMMA", "BLOCKS": "DELTA", "REFERENCES": "GAMMA"}),
])
def test_lists_decode_as_written(tmp_path, window, min_len, codes):
    lists = web_like(300, seed=window + min_len)
    base = write_bv(tmp_path / "g", lists, window=window, min_len=min_len, k=2 if codes else 3, codes=codes)
    assert decode_all(base) == lists
    assert decode_all(base, chunk_edges=5) == lists  # lists longer than the buffer, the window carried over


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(seed=st.integers(0, 10**6), n=st.integers(1, 60), window=st.integers(0, 8), min_len=st.integers(0, 5),
       chunk=st.integers(1, 40))
def test_random_graphs_round_trip(tmp_path_factory, seed, n, window, min_len, chunk):
    lists = web_like(n, seed)
    base = write_bv(tmp_path_factory.mktemp("bv") / "g", lists, window=window, min_len=min_len)
    assert decode_all(base, chunk_edges=chunk) == lists


def test_import_equals_the_scipy_reference_and_the_cli_runs(tmp_path, capsys):
    from moment.cli import main

    lists = web_like(500, seed=9)
    base = write_bv(tmp_path / "web", lists)
    assert detect_format(base) == "webgraph"
    ds = open_dataset(import_webgraph(tmp_path / "web.graph", tmp_path / "out", chunk_edges=64))
    src = np.repeat(np.arange(500), [len(x) for x in lists])
    dst = np.concatenate([np.array(x, dtype=np.int64) for x in lists])
    m = src != dst
    ref = sp.csr_matrix((np.ones(int(m.sum())), (dst[m], src[m])), shape=(500, 500))
    ref.sort_indices()
    assert np.array_equal(ds.indptr, ref.indptr) and np.array_equal(ds.indices, ref.indices) and ds.directed
    assert main(["data", "import", "--format", "webgraph", "--undirected", str(base), str(tmp_path / "cli")]) == 0
    assert "(webgraph)" in capsys.readouterr().out
    und = open_dataset(tmp_path / "cli")
    sym = ((ref + ref.T) > 0).astype(np.int8).tocsr()
    sym.sort_indices()
    assert not und.directed and np.array_equal(und.indices, sym.indices)


def test_bad_inputs_are_named(tmp_path):
    lists = web_like(100, seed=1)
    base = write_bv(tmp_path / "g", lists)
    graph = tmp_path / "g.graph"
    whole = graph.read_bytes()
    graph.write_bytes(whole[: len(whole) // 2])
    with pytest.raises(
        DatasetError, match=r"g\.graph: node [\d,]+ \(bit [\d,]+\): the bit stream ends early .*download"
    ):
        import_webgraph(base, tmp_path / "out")
    graph.write_bytes(whole)
    props = tmp_path / "g.properties"
    text = props.read_text()
    props.write_text(text.replace(f"arcs={sum(map(len, lists))}", "arcs=5"))
    with pytest.raises(DatasetError, match=r"arcs decoded, the \.properties says 5; the two files do not belong"):
        import_webgraph(base, tmp_path / "out")
    props.write_text(text.replace("compressionflags=", "compressionflags=RESIDUALS_NIBBLE"))
    with pytest.raises(DatasetError, match=r"compression flag 'RESIDUALS_NIBBLE' is not read here"):
        import_webgraph(base, tmp_path / "out")
    props.write_text(text.replace("BVGraph", "EFGraph"))
    with pytest.raises(DatasetError, match=r"graphclass it\.unimi\.dsi\.webgraph\.EFGraph is not a BVGraph"):
        import_webgraph(base, tmp_path / "out")
    graph.unlink()
    props.write_text(text)
    with pytest.raises(DatasetError, match=r"g\.graph: no such file"):
        import_webgraph(base, tmp_path / "out")
    assert not (tmp_path / "out").exists()
