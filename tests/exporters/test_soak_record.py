"""bench/soak_check.py on a soak's record of the shared export: the Translator the export was
made from (its metadata: the two averaged checkpoints, shapes unpadded) translates every
recorded request again, and a translation the export did not give is counted.
(The soak itself: tests/bench/test_serving_soak.py.)"""

import json

import tensorflow as tf
from saved_model_fixtures import dev_sentences, serve_bytes

from bench import serving_soak, soak_check


def _record(path, exported, requests):
    with open(path, "w", encoding="utf-8") as f:
        f.write(json.dumps({"export": exported}) + "\n")
        for batch, out in requests:
            f.write(serving_soak.record_line(batch, out))


def test_the_soaks_translations_are_the_translators_and_a_changed_one_is_counted(
        exported, loaded, tmp_path, capsys):
    batches = [dev_sentences(5, start=200), ["", "\udcff\udcfe broken bytes", "?!... ;;; !!"]]
    requests = []
    for batch in batches:
        text = tf.constant([line.encode("utf-8", "surrogateescape") for line in batch])
        requests.append((batch, list(loaded.signatures["serving_default"](text=text)[
            "translation"].numpy())))
    assert requests[0][1] == list(serve_bytes(loaded, batches[0]))
    # The same requests, then the second once more with one translation changed: one run
    # (one Translator traced) counts every served translation equal and the changed one.
    changed = (batches[1], requests[1][1][:2] + [requests[1][1][2] + b" x"])
    path = tmp_path / "soak.jsonl"
    _record(path, exported, requests + [changed])
    soak_check.main([f"--record={path}"])
    out = capsys.readouterr().out.splitlines()
    assert out[-1] == "soak_check requests=3 sentences=11 differ=1"
    assert len(out) == 2 and out[0].startswith("differ: '?!... ;;; !!'")
