"""The command lines' list arguments: a value that is not a list of numbers is a usage error (exit 2) that
names it, before any work, in `hare optimize` and `hare bench` alike."""

from __future__ import annotations

from pathlib import Path

import pytest

from container.arguments import comma_floats, comma_ints
from hare.cli import main


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        (["optimize", "{dir}", "--tune-batches", "1,eight"], "expected comma-separated integers, got '1,eight'"),
        (["bench", "run", "{dir}", "--concurrency", "2;64"], "expected comma-separated integers, got '2;64'"),
        (["bench", "run", "{dir}", "--rate", "50,fast"], "expected comma-separated numbers, got '50,fast'"),
    ],
)
def test_a_list_that_is_not_numbers_is_a_usage_error_naming_it(
    args: list[str], expected: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exit_:
        main([a.format(dir=tmp_path) for a in args])
    assert exit_.value.code == 2
    assert expected in capsys.readouterr().err
    assert list(tmp_path.iterdir()) == []  # nothing was started


def test_a_list_of_numbers_is_read_in_order_with_empty_items_skipped() -> None:
    assert comma_ints("1,8,,32") == [1, 8, 32]
    assert comma_floats("50,100.5") == [50.0, 100.5]
