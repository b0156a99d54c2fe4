"""The content-addressed layer store: keys, shared files, loading once, the LRU
budget, and damaged files refused."""

from __future__ import annotations

import threading

import jax
import numpy as np
import pytest

from dcjax import layercache as lc


def _params(seed: int, *, shared: dict | None = None) -> dict:
    rng = np.random.default_rng(seed)
    p = {
        "params": {
            "conv0": {"kernel": rng.normal(size=(3, 3, 3, 8)).astype(np.float32),
                      "bias": rng.normal(size=(8,)).astype(np.float32)},
            "bn0": {"scale": rng.normal(size=(8,)).astype(np.float32),
                    "bias": rng.normal(size=(8,)).astype(np.float32)},
            "fc": {"kernel": rng.normal(size=(8, 4)).astype(np.float32)},
        },
        "batch_stats": {"bn0": {"mean": rng.normal(size=(8,)).astype(np.float32),
                                "var": rng.uniform(1, 2, size=(8,)).astype(np.float32)}},
    }  # fmt: skip
    if shared:
        p["params"].update(shared)
    return p


def test_layers_group_a_modules_tensors_across_collections():
    assert lc.layer_of((jax.tree_util.DictKey("params"), jax.tree_util.DictKey("block3"),
                        jax.tree_util.DictKey("conv"), jax.tree_util.DictKey("kernel"))) == (
        "block3/conv", "kernel")  # fmt: skip
    assert lc.layer_of((jax.tree_util.DictKey("batch_stats"), jax.tree_util.DictKey("bn"),
                        jax.tree_util.DictKey("mean"))) == ("bn", "batch_stats:mean")  # fmt: skip
    assert lc.layer_of((jax.tree_util.DictKey("conv1.weight"),)) == ("conv1", "weight")
    assert lc.layer_of((jax.tree_util.DictKey("a/conv2d/kernel:0"),)) == ("a/conv2d", "kernel:0")
    assert lc.layer_of((jax.tree_util.DictKey("542"),)) == ("542", "value")


def test_key_depends_on_bytes_shape_dtype_and_names():
    a = {"w": np.arange(6, dtype=np.float32).reshape(2, 3)}
    assert lc.layer_key(a) == lc.layer_key({"w": a["w"].copy()})
    assert lc.layer_key(a) != lc.layer_key({"w": a["w"].reshape(3, 2)})
    assert lc.layer_key(a) != lc.layer_key({"w": a["w"].astype(np.float64)})
    assert lc.layer_key(a) != lc.layer_key({"v": a["w"]})
    b = a["w"].copy()
    b[1, 2] += 1e-6
    assert lc.layer_key(a) != lc.layer_key({"w": b})


def test_models_that_share_layers_share_files(tmp_path):
    first = _params(0)
    second = _params(1, shared={"conv0": first["params"]["conv0"]})
    m1 = lc.save(first, tmp_path, "one")
    m2 = lc.save(second, tmp_path, "two")
    assert [lay.name for lay in m1.layers] == ["bn0", "conv0", "fc"]
    keys1 = {lay.name: lay.key for lay in m1.layers}
    keys2 = {lay.name: lay.key for lay in m2.layers}
    assert keys1["conv0"] == keys2["conv0"] and keys1["fc"] != keys2["fc"]
    files = sorted(p.stem for p in (tmp_path / "layers").iterdir())
    assert files == sorted(set(keys1.values()) | set(keys2.values()))  # 5 files, not 6
    # the manifest reads back as written
    assert lc.Manifest.read(tmp_path, "two") == m2
    bn = {lay.name: lay for lay in m1.layers}["bn0"]
    assert set(bn.tensors) == {"scale", "bias", "batch_stats:mean", "batch_stats:var"}
    assert bn.nbytes == 4 * 8 * 4


def test_a_layer_is_read_once_however_many_ask(tmp_path):
    m1 = lc.save(_params(0), tmp_path, "one")
    m2 = lc.save(_params(1, shared={"conv0": _params(0)["params"]["conv0"]}), tmp_path, "two")
    store = lc.LayerStore()
    conv1 = {lay.name: lay for lay in m1.layers}["conv0"]
    conv2 = {lay.name: lay for lay in m2.layers}["conv0"]
    got = []
    threads = [threading.Thread(target=lambda e=e, m=m: got.append(store.get(e, m.path(e.key))))
               for e, m in [(conv1, m1), (conv2, m2)] * 4]  # fmt: skip
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert store.stats.loads == 1 and store.stats.hits == 7
    assert all(g is got[0] for g in got)
    np.testing.assert_array_equal(
        np.asarray(got[0]["kernel"]), _params(0)["params"]["conv0"]["kernel"]
    )


def test_budget_evicts_least_recently_used_and_spares_pinned(tmp_path):
    m = lc.save(_params(0), tmp_path, "one")
    bn, conv, fc = m.layers  # 128, 896 and 128 bytes
    store = lc.LayerStore(budget_bytes=1100)
    store.get(conv, m.path(conv.key), pin=True)
    store.get(bn, m.path(bn.key))
    store.get(fc, m.path(fc.key))  # over budget: bn (least recent, unpinned) goes
    assert bn.key not in store and conv.key in store and fc.key in store
    assert store.resident_bytes == conv.nbytes + fc.nbytes <= 1100
    store.unpin(conv.key)
    store.get(bn, m.path(bn.key))  # conv is now the least recent: evicted
    assert conv.key not in store and store.stats.evictions == 2
    with pytest.raises(KeyError, match="not pinned"):
        store.unpin(conv.key)


def test_a_budget_below_the_largest_layer_is_refused(tmp_path):
    m = lc.save(_params(0), tmp_path, "one")
    store = lc.LayerStore(budget_bytes=500)
    conv = {lay.name: lay for lay in m.layers}["conv0"]
    with pytest.raises(ValueError, match="layer conv0 takes 896 bytes, more than the store's"):
        store.get(conv, m.path(conv.key))
    with pytest.raises(ValueError, match="budget_bytes must be positive"):
        lc.LayerStore(budget_bytes=0)


@pytest.mark.parametrize("damage", ["flip", "truncate"])
def test_a_damaged_file_is_refused_naming_the_layer(tmp_path, damage):
    m = lc.save(_params(0), tmp_path, "one")
    conv = {lay.name: lay for lay in m.layers}["conv0"]
    path = m.path(conv.key)
    data = bytearray(path.read_bytes())
    if damage == "flip":
        data[-5] ^= 0x40  # a weight's byte
    else:
        data = data[: len(data) // 2]
    path.write_bytes(bytes(data))
    store = lc.LayerStore()
    with pytest.raises(lc.CorruptLayerError, match="layer conv0"):
        store.get(conv, path)
    assert conv.key not in store and store.resident_bytes == 0


def test_missing_manifest_and_layer_files_name_them(tmp_path):
    with pytest.raises(FileNotFoundError, match="no saved model 'nope'"):
        lc.Manifest.read(tmp_path, "nope")
    m = lc.save(_params(0), tmp_path, "one")
    m.path(m.layers[0].key).unlink()
    with pytest.raises(FileNotFoundError, match="layer bn0"):
        lc.LayerStore().get(m.layers[0], m.path(m.layers[0].key))
