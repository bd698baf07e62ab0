"""The report's layered layout: edges go right, loops are broken, tall layers are split."""

from amp_rewrite.report.layout import layered_layout


def test_layout_goes_left_to_right_and_breaks_loops():
    edges = [(0, 1), (1, 2), (2, 3), (3, 1), (0, 4), (4, 3)]  # 3 -> 1 closes a loop
    column, row = layered_layout(5, edges)
    for src, dst in edges:
        if (src, dst) != (3, 1):
            assert column[src] < column[dst], (src, dst)
    assert layered_layout(5, edges) == (column, row)


def test_tall_layers_are_split_and_sources_sit_next_to_their_consumer():
    fan = [(k, 40) for k in range(40)] + [(40, 41), (41, 42), (42, 43), (44, 43)]
    column, row = layered_layout(45, fan, max_column=16)
    assert max(row) < 16
    assert len({column[k] for k in range(40)}) == 3  # 40 inputs over three columns
    assert column[44] == column[42]  # a source moves up to its consumer
