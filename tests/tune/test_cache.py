"""The tuning cache's files: one per device, TensorFlow and amp-rewrite; what they hold and what they forget."""

import json
import logging

from amp_rewrite.tune.cache import Timing, TuneCache, read_file

KEY = "step " + "c" * 32


def test_each_amp_rewrite_version_has_a_file_of_its_own(tmp_path):
    """An upgrade measures again: the rewrite that made the half body, and so its times, may have changed."""
    old = TuneCache(tmp_path, device="CPU test", tensorflow="2.21.0", version="0.1.0")
    old.put(KEY, Timing(float32=1.0, half=0.5, what="tf.function step, bfloat16"))
    old.save()
    new = TuneCache(tmp_path, device="CPU test", tensorflow="2.21.0", version="0.2.0")
    assert new.path != old.path and new.get(KEY) is None
    assert TuneCache(tmp_path, device="CPU test", tensorflow="2.21.0", version="0.1.0").get(KEY) == Timing(
        1.0, 0.5, "tf.function step, bfloat16")
    found = read_file(old.path)
    assert (found.device, found.tensorflow, found.version) == ("CPU test", "2.21.0", "0.1.0")
    assert json.loads(old.path.read_text())["entries"] == {
        KEY: {"float32": 1.0, "half": 0.5, "what": "tf.function step, bfloat16"}}


def test_a_file_made_for_another_version_under_this_name_is_ignored_with_one_line(tmp_path, caplog):
    made = TuneCache(tmp_path, device="CPU test", tensorflow="2.21.0", version="0.1.0")
    made.put(KEY, Timing(float32=1.0, half=0.5))
    made.save()
    data = json.loads(made.path.read_text())
    data["amp_rewrite"] = "0.0.9"
    made.path.write_text(json.dumps(data))
    with caplog.at_level(logging.WARNING):
        again = TuneCache(tmp_path, device="CPU test", tensorflow="2.21.0", version="0.1.0")
    assert again.get(KEY) is None
    assert [r.getMessage() for r in caplog.records] == [
        f"amp-rewrite: ignoring tuning cache {made.path}: made for 'CPU test' with TensorFlow '2.21.0' and "
        "amp-rewrite '0.0.9', not 'CPU test' with TensorFlow '2.21.0' and amp-rewrite '0.1.0'"]


def test_a_discarded_entry_leaves_the_file_at_the_next_save(tmp_path):
    cache = TuneCache(tmp_path, device="CPU test", tensorflow="t", version="v")
    cache.put(KEY, Timing(float32=1.0, half=0.5))
    cache.put(KEY + " mixed", Timing(float32=0.5, half=0.4))
    cache.save()
    other = TuneCache(tmp_path, device="CPU test", tensorflow="t", version="v")
    other.discard(KEY)
    assert other.get(KEY) is None
    other.save()
    assert set(read_file(cache.path).entries) == {KEY + " mixed"}
