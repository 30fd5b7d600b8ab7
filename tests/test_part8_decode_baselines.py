"""The dense-cache library baselines of paged decode attention (snippets/part8/decode_baselines.py):
v3 (SDPA) and v4 (flex_attention) against the float64 reference, the dense copy reused while its
sources are unchanged and rebuilt after an in-place write, no mask when every sequence is full, and
the refusals."""

from __future__ import annotations

import warnings

import pytest
import torch

from snippets.op_index import get_op
from snippets.part8 import decode_baselines as db
from snippets.part8.decode_attention import paged_attention_ref

OP = get_op("paged_decode_attention")
FNS = (db.sdpa_dense_cache, db.flex_dense_cache)
pytestmark = [pytest.mark.op("paged_decode_attention"),
              pytest.mark.filterwarnings("ignore:.*flex_attention.*:UserWarning")]


def _device() -> str:
    return "cuda" if torch.cuda.is_available() else "cpu"


def _inputs(size, dtype=torch.float32, seed=0):
    return OP.make_inputs(size, dtype, _device(), torch.Generator().manual_seed(seed))


def _ref(args):
    return paged_attention_ref(*[a.double() if a.is_floating_point() else a for a in args])


def _close(o, ref, dtype):
    rtol, atol = OP.tolerances[dtype]
    torch.testing.assert_close(o.double(), ref, rtol=rtol, atol=atol)


@pytest.mark.parametrize("fn", FNS, ids=lambda f: f.__name__)
@pytest.mark.parametrize("size", OP.test_sizes, ids=lambda s: "-".join(f"{k}{v}" for k, v in s.items()))
@pytest.mark.parametrize("dtype", (torch.float32, torch.float16))
def test_matches_reference(fn, size, dtype):
    args = _inputs(size, dtype)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        o = fn(*args)
    assert o.shape == args[0].shape and o.dtype == dtype
    _close(o, _ref(args), dtype)


def test_full_cache_needs_no_mask_and_ragged_one_does():
    full = {"b": 2, "ctx": 32, "hq": 4, "hkv": 2, "d": 16, "page": 16}
    args = _inputs(full)
    dense = db.dense_cache(*args[1:])
    assert dense.mask is None and dense.k.is_contiguous() and dense.k.shape == (2, 2, 32, 16)
    _close(db.sdpa_dense_cache(*args), _ref(args), torch.float32)
    ragged = _inputs({**full, "ragged": True})
    mask = db.dense_cache(*ragged[1:]).mask
    assert mask is not None and mask[:, 0, 0].sum(1).tolist() == ragged[4].tolist()


def test_dense_copy_is_reused_then_rebuilt_after_in_place_writes():
    size = {"b": 3, "ctx": 37, "hq": 4, "hkv": 1, "d": 16, "page": 16, "ragged": True}
    q, k, v, tables, lens = _inputs(size)
    first = db.dense_cache(k, v, tables, lens)
    assert db.dense_cache(k, v, tables, lens) is first          # no rebuild: the timed path
    for write in (lambda: k.mul_(2.0), lambda: v[0].add_(1.0), lambda: lens.sub_(1),
                  lambda: tables.copy_(tables.roll(1, dims=1))):
        write()
        again = db.dense_cache(k, v, tables, lens)
        assert again is not first
        first = again
        # a stale copy would give the old answer; the rebuilt one gives the new reference's
        _close(db.sdpa_dense_cache(q, k, v, tables, lens), _ref((q, k, v, tables, lens)),
               torch.float32)
    other = tables.clone()                                        # another tensor, same values
    assert db.dense_cache(k, v, other, lens) is not db.dense_cache(k, v, tables, lens)


def test_dense_copy_lives_as_long_as_the_cache():
    import gc

    args = _inputs(OP.test_sizes[1])
    db.dense_cache(*args[1:])
    before = len(db._DENSE)
    del args
    gc.collect()
    assert len(db._DENSE) == before - 1


@pytest.mark.parametrize("fn", FNS, ids=lambda f: f.__name__)
def test_bad_input_is_refused(fn):
    q, k, v, tables, lens = _inputs(OP.test_sizes[1])   # 2 query heads on 2 kv heads
    with pytest.raises(ValueError, match="q must be 3-D"):
        fn(q[None], k, v, tables, lens)
    with pytest.raises(ValueError, match="multiple of kv_heads"):
        fn(q[:, :1].contiguous(), k, v, tables, lens)
    with pytest.raises(ValueError, match="block_tables"):
        fn(q, k, v, tables[:1], lens)
    with pytest.raises(RuntimeError, match="no_grad"):
        fn(q.requires_grad_(), k, v, tables, lens)


def test_dense_cache_refuses_grad():
    _, k, v, tables, lens = _inputs(OP.test_sizes[0])
    with pytest.raises(RuntimeError, match="no_grad"):
        db.dense_cache(k.requires_grad_(), v, tables, lens)


def test_versions_are_library_baselines():
    assert OP.impls["v3"].origin == OP.impls["v4"].origin == "library"
    assert OP.impls["v3"].fn is db.sdpa_dense_cache and OP.impls["v4"].fn is db.flex_dense_cache


@pytest.mark.gpu
@pytest.mark.parametrize("fn", FNS, ids=lambda f: f.__name__)
@pytest.mark.parametrize("size", [OP.headline, {"b": 64, "ctx": 4096, **{k: OP.headline[k] for k in
                                                                       ("hq", "hkv", "d", "page")}},
                                  {**OP.headline, "b": 5, "ctx": 1000, "ragged": True}],
                         ids=("headline", "b64", "ragged"))
@pytest.mark.parametrize("dtype", (torch.bfloat16, torch.float16))
def test_gpu_matches_reference(fn, size, dtype):
    args = _inputs(size, dtype)
    o = fn(*args)
    _close(o, _ref(args), dtype)
    # the second call reuses the dense copy; the library's kernel may split the keys differently
    # from call to call (it is not bit-reproducible on the H100), so: the same within rounding
    _close(fn(*args), o.double(), dtype)
