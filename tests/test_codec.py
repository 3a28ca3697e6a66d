"""Low-precision feature bins: the codecs, their place in the placement manifest, the store's gather.

Round trips: float16 and bfloat16 exact to their precision (what torch's own
conversion gives), int8 within ``scale / 2`` per column; the int8 quantiser
under hypothesis (constant columns, extremes, NaN refused); the store's CPU
path and its GPU path on the fake device (rows cross as stored, decoded after
the copy); refusals (int8 on integer features, unknown types, a placement
opened expecting another type, a damaged codec in the manifest).
"""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from iostack.bins import open_bin, write_bins
from iostack.codec import FeatureCodec, fit_codec, stored_row_bytes
from iostack.errors import StoreError
from iostack.placement import Placement, load_placement, simple_placement
from iostack.store import FeatureStore
from iostack.vocab import STORAGE_DTYPES
from tests.fake_cuda import FakeDeviceMemory

_TINY = float(np.finfo(np.float32).tiny)


def _feats(n: int = 200, dim: int = 12, seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    x = rng.normal(0, 3, (n, dim)).astype(np.float32)
    x[:, 3] = 1.25  # a constant column
    x[:, 5] *= 1e3  # a wide one
    return x


def _int8_bound(codec: FeatureCodec, x: np.ndarray) -> np.ndarray:
    """scale/2 per column, plus float32 rounding of the decode (a few ulps of the values)."""
    return codec.scale / 2 + 4 * np.finfo(np.float32).eps * np.abs(x).max(axis=0) + _TINY


def _roundtrip(codec: FeatureCodec, x: np.ndarray) -> np.ndarray:
    return codec.decode(codec.encode_torch(x)).numpy()


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_half_types_round_trip_exactly_to_their_precision(dtype):
    x = _feats()
    c = fit_codec(x, dtype)
    back = _roundtrip(c, x)
    assert back.dtype == np.float32
    expect = torch.from_numpy(x).to(getattr(torch, dtype)).to(torch.float32).numpy()
    np.testing.assert_array_equal(back, expect)  # nothing beyond the type's own rounding
    rel = {"float16": 2.0 ** -11, "bfloat16": 2.0 ** -8}[dtype]
    assert np.all(np.abs(back - x) <= rel * np.abs(x) + 1e-7)
    assert c.row_bytes == stored_row_bytes(dtype, x.shape[1]) == 2 * x.shape[1]


def test_int8_error_is_bounded_by_half_a_step_per_column():
    x = _feats()
    c = fit_codec(x, "int8")
    q = c.encode(x)
    assert q.dtype == np.int8 and q.min() == -128 and q.max() == 127  # the range is used end to end
    err = np.abs(_roundtrip(c, x) - x).max(axis=0)
    assert np.all(err <= _int8_bound(c, x))
    assert err[3] == 0.0 and c.scale[3] == 0.0  # the constant column is exact
    assert err[5] > 10 * err[0]  # the wide column's steps are wider: the scale is per column


def test_float32_of_float32_is_the_identity():
    x = _feats()
    np.testing.assert_array_equal(_roundtrip(fit_codec(x, "float32"), x), x)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(hnp.arrays(np.float32, hnp.array_shapes(min_dims=2, max_dims=2, min_side=1, max_side=9),
                  elements=st.floats(allow_nan=False, allow_infinity=False, width=32)),
       st.booleans())
@example(np.array([[-3.4028235e38, 3.4028235e38], [3.4028235e38, -3.4028235e38]], np.float32), False)
@example(np.array([[1e-45, -1e-45], [0.0, 1e-45]], np.float32), True)  # subnormal ranges
def test_int8_quantiser_property(x, constant_first):
    if constant_first:
        x[:, 0] = x[0, 0]
    c = fit_codec(x, "int8")
    back = _roundtrip(c, x)
    assert np.all(np.isfinite(back))
    assert np.all(np.abs(back - x).max(axis=0) <= _int8_bound(c, x))
    if constant_first:
        assert np.all(back[:, 0] == x[0, 0])


@settings(max_examples=50, deadline=None)
@given(st.integers(0, 7), st.integers(0, 4), st.sampled_from([np.nan, np.inf, -np.inf]))
def test_int8_refuses_non_finite_values_naming_row_and_column(r, col, bad):
    x = np.zeros((8, 5), np.float32)
    x[r, col] = bad
    with pytest.raises(StoreError, match=f"row {r}, column {col}"):
        fit_codec(x, "int8", chunk_bytes=8 * 5 * 3)  # several chunks: the row number is global


def test_refusals_are_one_clear_line():
    with pytest.raises(StoreError, match="not floats"):
        fit_codec(np.ones((4, 3), np.int64), "int8")
    with pytest.raises(StoreError, match="expected one of float32, float16, bfloat16, int8"):
        fit_codec(np.ones((4, 3), np.float32), "float8")
    with pytest.raises(StoreError, match="float16 holds at most"):
        fit_codec(np.full((2, 2), 7e4, np.float32), "float16")
    assert fit_codec(np.full((2, 2), 7e4, np.float32), "bfloat16").dtype == "bfloat16"
    assert set(STORAGE_DTYPES) == {"float32", "float16", "bfloat16", "int8"}


# -- the placement manifest --------------------------------------------------------------------


def test_codec_is_kept_in_the_placement_manifest_with_a_checksum(tmp_path):
    x = _feats()
    c = fit_codec(x, "int8")
    p = simple_placement(len(x), [("cpu", 50), ("ssd", 150)])
    Placement(p.bins, p.bin_of, p.row_of, codec=c).save(tmp_path)
    back = load_placement(tmp_path).codec
    assert back.dtype == "int8" and back.source_dtype == np.dtype(np.float32).str
    np.testing.assert_array_equal(back.scale, c.scale)
    np.testing.assert_array_equal(back.zero_point, c.zero_point)
    man = tmp_path / "placement.json"
    data = json.loads(man.read_text())
    data["features"]["scale"][2] *= 1.5  # a damaged table would decode wrong rows silently
    man.write_text(json.dumps(data))
    with pytest.raises(StoreError, match="checksum"):
        load_placement(tmp_path)
    data["features"] = {"dtype": "float8", "dim": 12, "source_dtype": "<f4", "crc32": 0}
    man.write_text(json.dumps(data))
    with pytest.raises(StoreError, match="float8"):
        load_placement(tmp_path)


# -- the store ---------------------------------------------------------------------------------


def _placed(tmp_path, dtype: str, x: np.ndarray) -> Placement:
    p = simple_placement(len(x), [("gpu", 40), ("cpu", 60), ("ssd", 100)])
    p = Placement(p.bins, p.bin_of, p.row_of, codec=fit_codec(x, dtype))
    write_bins(x, p, tmp_path, fsync=False)
    p.save(tmp_path)
    return load_placement(tmp_path)


def _expected(codec: FeatureCodec, x: np.ndarray) -> np.ndarray:
    return _roundtrip(codec, x)


@pytest.mark.parametrize("dtype", STORAGE_DTYPES)
def test_store_gathers_float32_from_every_tier_on_the_host(tmp_path, dtype):
    x = _feats()
    p = _placed(tmp_path, dtype, x)
    info = open_bin(tmp_path, p.bins[2])
    assert info.row_bytes == stored_row_bytes(dtype, x.shape[1])  # the SSD bin holds the smaller rows
    ids = torch.tensor([199, 0, 45, 120, 0, 77, 39, 100])
    with FeatureStore(p, tmp_path, features=x, backend_options={"processes": 0}) as s:
        got = s.gather(ids)
        assert got.dtype == torch.float32 and s.dtype == torch.float32
        np.testing.assert_array_equal(got.numpy(), _expected(p.codec, x[ids.numpy()]))
        assert s.row_bytes == stored_row_bytes(dtype, x.shape[1]) and s.feature_dtype == dtype
        assert s.memory_bytes()["cpu"] == 60 * s.row_bytes  # cache bytes scale with the stored row
        assert s.tier_stats()["ssd"]["bytes"] == 3 * s.row_bytes
        assert s.gather(ids, dtype=torch.float64).dtype == torch.float64
        assert any(f"stored as {dtype}" in n for n in s.notes)


@pytest.mark.parametrize("dtype", ["float16", "bfloat16", "int8"])
def test_store_decodes_on_the_device_after_the_copy(tmp_path, dtype):
    x = _feats()
    p = _placed(tmp_path, dtype, x)
    mem = FakeDeviceMemory()
    ids = torch.arange(199, -1, -1)
    with FeatureStore(p, tmp_path, features=x, memory=mem, backend_options={"processes": 0}) as s:
        s.transfer.reset_counts()
        landing = s.gather_landing(ids)
        got = landing.wait()
        assert mem.kind_of(got) == "device" and got.dtype == torch.float32
        np.testing.assert_array_equal(got.numpy(), _expected(p.codec, x[ids.numpy()]))
        rows_up = s.transfer.counts().by_route[("pinned", "device")][1] - 8 * (2 * 40 + 160)  # less the indices
    with FeatureStore(_placed(tmp_path / "f32", "float32", x), tmp_path / "f32", features=x, memory=FakeDeviceMemory(),
                      backend_options={"processes": 0}) as s32:
        s32.transfer.reset_counts()
        s32.gather(ids)
        rows_up32 = s32.transfer.counts().by_route[("pinned", "device")][1] - 8 * (2 * 40 + 160)
    assert rows_up == 160 * stored_row_bytes(dtype, x.shape[1])  # CPU and SSD rows crossed as stored
    assert rows_up32 == rows_up * (4 // np.dtype(p.codec.storage_np).itemsize)


def test_store_refuses_a_placement_of_another_type(tmp_path):
    x = _feats()
    p = _placed(tmp_path, "int8", x)
    with pytest.raises(StoreError, match="stores its feature rows as int8, this code expects float16"):
        FeatureStore(p, tmp_path, features=x, feature_dtype="float16")
    with pytest.raises(StoreError, match="expected one of"):
        FeatureStore(p, tmp_path, features=x, feature_dtype="fp8")
    with pytest.raises(StoreError, match="made from float32 features, these are float64"):
        FeatureStore(p, tmp_path, features=x.astype(np.float64))
    # bins of another type under this manifest: the bin's own manifest says so
    q = _placed(tmp_path / "f16", "float16", x)
    with pytest.raises(StoreError, match="holds float16"):
        FeatureStore(Placement(q.bins, q.bin_of, q.row_of, codec=p.codec), tmp_path / "f16", features=x)
    # a placement without a codec holds the features' own type
    plain = simple_placement(len(x), [("cpu", 200)])
    with FeatureStore(plain, features=x, feature_dtype="float32") as s:
        assert s.feature_dtype == "float32" and s.codec is None
    with pytest.raises(StoreError, match="as float32, this code expects int8"):
        FeatureStore(plain, features=x, feature_dtype="int8")
    # no features given: the SSD bins say what they hold
    ssd_only = simple_placement(len(x), [("ssd", 200)])
    write_bins(x, ssd_only, tmp_path / "plain", fsync=False)
    with pytest.raises(StoreError, match="as float32, this code expects bfloat16"):
        FeatureStore(ssd_only, tmp_path / "plain", feature_dtype="bfloat16")
