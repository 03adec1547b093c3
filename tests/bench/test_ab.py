"""bench.ab reads one figure per setting line, keyed by the line's non-numeric fields."""

from bench.ab import figures


def test_figures_are_keyed_by_setting():
    output = ("matmul_peak float32_gflops=120.5\n"
              "train preset=small xla=False tokens_per_sec=3000.5 ms_per_step=20\n"
              "train preset=tiny xla=False tokens_per_sec=9e3 ms_per_step=5\n")
    assert figures(output, "tokens_per_sec", "train") == {
        "train preset=small xla=False": 3000.5, "train preset=tiny xla=False": 9000.0}
    assert figures(output, "tokens_per_sec", "preset=tiny") == {"train preset=tiny xla=False": 9000.0}
    assert figures(output, "speedup", "") == {}


def test_key_fields_name_numeric_settings():
    output = ("mixed beam=4 batch=32 ms_per_sentence=50.5\n"
              "mixed beam=1 batch=32 ms_per_sentence=20\n")
    assert figures(output, "ms_per_sentence", "mixed", "beam,batch") == {
        "beam=4 batch=32": 50.5, "beam=1 batch=32": 20.0}
