"""The measurements' file (`dcjax.kernels.measurements`): its round trip and
merges, bad files, and the machine key it is kept under."""

import json

import jax
import jax.numpy as jnp

from dcjax.kernels import ConvGeometry, plan
from dcjax.kernels import measurements as km
from dcjax.kernels.tiles import layer_key


def _layer():
    return plan((1, 12, 12, 8), (3, 3, 8, 8), ConvGeometry(strides=(1, 1), padding="SAME"))


def test_cache_round_trip_merge_and_bad_files(tmp_path):
    path = tmp_path / "t.json"
    a, b = km.TuningCache(path), km.TuningCache(path)
    a.put("m", "layer1", "xla", [1, 2, 3, 4, 5])
    a.save()
    b.put("m", "layer2", "dense", [5, 5, 5, 5, 5])
    b.save()  # merges what `a` wrote meanwhile
    c = km.TuningCache(path)
    assert c.get("m", "layer1", "xla") == (1, 2, 3, 4, 5)
    assert c.get("m", "layer2", "dense") == (5, 5, 5, 5, 5)
    assert c.get("other machine", "layer1", "xla") is None
    path.write_text("{not json")
    assert km.TuningCache(path).get("m", "layer1", "xla") is None
    path.write_text(
        json.dumps({"fractions": [0, 1], "machines": {"m": {"layer1": {"xla": [1, 2]}}}})
    )
    assert km.TuningCache(path).get("m", "layer1", "xla") is None  # another grid: ignored
    memory = km.TuningCache(None)
    memory.put("m", "l", "x", [1.0])
    memory.save()  # nothing written
    assert memory.get("m", "l", "x") == (1.0,)


def test_measurements_are_kept_per_processor_model(monkeypatch, tmp_path):
    """XLA calls every CPU ``"cpu"``: the machine key names the processor, so a
    file shared by two machines (one home directory) keeps each one's timings."""
    info = tmp_path / "cpuinfo"
    info.write_text("processor\t: 0\nvendor_id\t: AuthenticAMD\nmodel name\t: AMD  EPYC 7B13\n")
    assert km.cpu_model(str(info)) == "AMD EPYC 7B13"
    assert km.cpu_model(str(tmp_path / "missing")) != ""  # platform's answer instead
    monkeypatch.setattr(km, "cpu_model", lambda: "AMD EPYC 7B13")
    amd = km.machine_key()
    monkeypatch.setattr(km, "cpu_model", lambda: "Intel(R) Xeon(R) Processor")
    intel = km.machine_key()
    assert amd != intel and "AMD EPYC 7B13" in amd
    cache = km.TuningCache(tmp_path / "t.json")
    key = layer_key(_layer(), jnp.float32)
    cache.put(amd, key, "dense", (1.0,) * len(km.FRACTIONS))
    assert cache.get(intel, key, "dense") is None  # the Xeon measures its own
    assert cache.get(amd, key, "dense") == (1.0,) * len(km.FRACTIONS)


def test_measurements_are_kept_per_allocator_setting(monkeypatch, tmp_path):
    """Without the allocator's settings XLA:CPU faults its buffers' pages in on
    every call, which changes large layers' timings several-fold: the ``dcjax``
    command (which makes them) and a program that does not keep their own."""
    from dcjax import allocator

    monkeypatch.setattr(jax, "default_backend", lambda: "cpu")  # the key of CPU timings
    monkeypatch.setitem(allocator._set, "pad", 0)
    monkeypatch.setitem(allocator._set, "heap_only", False)
    monkeypatch.setitem(allocator._set, "sync", False)
    bare = km.machine_key()
    monkeypatch.setitem(allocator._set, "pad", 256 << 20)
    padded = km.machine_key()
    monkeypatch.setitem(allocator._set, "heap_only", True)
    heap_only = km.machine_key()
    monkeypatch.setitem(allocator._set, "sync", True)
    synced = km.machine_key()
    assert len({bare, padded, heap_only, synced}) == 4
    assert "heap pad 256 MiB" in padded and "heap pad 0 MiB" in bare
    assert "no mapped blocks" in heap_only and "sync dispatch" in synced
    cache = km.TuningCache(tmp_path / "t.json")
    key = layer_key(_layer(), jnp.float32)
    cache.put(bare, key, "dense", (1.0,) * len(km.FRACTIONS))
    assert cache.get(padded, key, "dense") is None


def test_measurements_are_kept_per_kernels_revision(monkeypatch, tmp_path):
    """A kernel change that alters its cost raises the revision: measurements of
    the older code are not read."""
    old = km.machine_key()
    monkeypatch.setattr(km, "KERNELS_REVISION", km.KERNELS_REVISION + 1)
    new = km.machine_key()
    assert old != new
    cache = km.TuningCache(tmp_path / "t.json")
    key = layer_key(_layer(), jnp.float32)
    cache.put(old, key, "xla", (1.0,) * len(km.FRACTIONS))
    assert cache.get(new, key, "xla") is None
