"""`dcjax.bench.arguments`: argument types whose errors name what was wrong, and
parsers whose errors are one line with exit status 2."""

import argparse

import pytest

from dcjax.bench import arguments


@pytest.mark.parametrize(("text", "size"), [("576x768", (576, 768)), (" 144 X 176 ", (144, 176))])
def test_a_frame_size_is_height_by_width(text, size):
    assert arguments.frame_size(text) == size


@pytest.mark.parametrize(
    ("text", "says"),
    [("576", "must be HxW"), ("0x768", "must be positive"), ("-4x8", "must be positive")],
)
def test_a_bad_frame_size_says_what_is_wanted(text, says):
    with pytest.raises(argparse.ArgumentTypeError, match=says):
        arguments.frame_size(text)


def test_numbers_say_the_bound_and_what_was_given():
    assert arguments.at_least(3)("3") == 3
    with pytest.raises(argparse.ArgumentTypeError, match="must be at least 3, got 2"):
        arguments.at_least(3)("2")
    with pytest.raises(argparse.ArgumentTypeError, match="invalid int value: 'two'"):
        arguments.positive_int("two")
    with pytest.raises(argparse.ArgumentTypeError, match="must be a number in"):
        arguments.unit_interval("1.5")


def test_a_comma_list_parses_each_value_or_names_the_unknown_ones():
    assert arguments.comma_list(arguments.positive_int)("1, 2,3") == [1, 2, 3]
    with pytest.raises(argparse.ArgumentTypeError, match="unknown 'c'; choose from a, b"):
        arguments.comma_list(("a", "b"))("a,c")


def test_parser_errors_are_one_line_with_exit_status_2(capsys):
    parser = arguments.program_parser("demo_program", None)
    parser.add_argument("--frames", type=arguments.frames_int)
    with pytest.raises(SystemExit) as exit_:
        parser.parse_args(["--frames", "1"])
    assert exit_.value.code == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err
    assert err.startswith("dcjax: error: argument --frames: needs at least 2 frames, got 1")
    assert err.endswith("(see dcjax bench demo_program --help)")
