"""presets.py's table: the lines `python -m tf_transformer.presets` prints."""

from tf_transformer import presets


def test_the_table_is_a_header_then_one_tab_separated_line_per_preset():
    rows = [{"name": "base", "N": 6, "paper_params_M": 65},
            {"name": "tiny", "N": 2, "paper_params_M": ""}]
    assert presets.format_table(rows) == "name\tN\tpaper_params_M\nbase\t6\t65\ntiny\t2\t\n"
