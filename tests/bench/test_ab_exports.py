"""bench.ab_exports alternates the two exports batch by batch and counts differences."""

from bench.ab_exports import alternate


def test_batches_alternate_and_times_go_to_their_side():
    calls = []
    now = [0.0]

    def runner(name, cost):
        def run(batch):
            calls.append((name, batch[0]))
            now[0] += cost
            return [f"{name}:{x}" if name == "b" and x == "odd" else x for x in batch]
        return run

    result = alternate(runner("a", 1.0), runner("b", 1.5), [["x"], ["odd"], ["y"]], rounds=2,
                       clock=lambda: now[0], report=lambda line: None)
    # Round 0: a b, b a, a b; round 1 starts the other way.
    assert calls[:6] == [("a", "x"), ("b", "x"), ("b", "odd"), ("a", "odd"), ("a", "y"), ("b", "y")]
    assert calls[6:8] == [("b", "x"), ("a", "x")]
    assert result["seconds_a"] == [3.0, 3.0] and result["seconds_b"] == [4.5, 4.5]
    assert result["median_ratio"] == 1.5
    assert result["differ"] == 1
