"""``references update`` keeps a file's own comments and replaces only the line it wrote."""
from hopperlab.results.machines import reference_update as U


def test_only_the_tools_own_updated_line_is_replaced(tmp_path):
    path = tmp_path / "m.yaml"
    path.write_text(
        "# References of m.\n"
        "# Updated 2026-11-28 by hand from the noise call's windows: a paragraph of a\n"
        "# person's, over two lines.\n"
        "# Updated 2026-11-27 by `hopperlab references update /tmp/refs/multi-ref`.\n"
        "machine: m\nreferences: {}\n")
    assert U._header(path) == (
        "# References of m.\n"
        "# Updated 2026-11-28 by hand from the noise call's windows: a paragraph of a\n"
        "# person's, over two lines.\n")


def test_a_new_file_gets_the_tools_header(tmp_path):
    assert U._header(tmp_path / "new.yaml").startswith("# References written from repeated runs")
