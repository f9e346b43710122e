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


def test_two_folders_of_one_day_are_both_named(tmp_path):
    """A node's references come from several folders (one per GPU lane): the same day's
    updates add their folder to the tool's line; an older day's line is replaced."""
    path = tmp_path / "m.yaml"
    path.write_text("# References of m.\n"
                    "# Updated 2026-11-27 by `hopperlab references update old-ref`.\n"
                    "machine: m\nreferences: {}\n")
    assert U._folders_of(path, "2026-11-28") == []
    first = U.tool_line("2026-11-28", ["gpu0-ref"])
    path.write_text("# References of m.\n" + first + "machine: m\nreferences: {}\n")
    assert U._folders_of(path, "2026-11-28") == ["gpu0-ref"]
    both = U.tool_line("2026-11-28", [*U._folders_of(path, "2026-11-28"), "gpu1-ref", "gpu0-ref"])
    assert both == ("# Updated 2026-11-28 by `hopperlab references update gpu0-ref` and "
                    "`hopperlab references update gpu1-ref`.\n")
    path.write_text("# References of m.\n" + both + "machine: m\nreferences: {}\n")
    assert U._header(path) == "# References of m.\n"  # the tool's own line, as one
