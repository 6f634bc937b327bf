"""The layout-free description of a rank's state refuses pieces that do not fit their tensor."""

import pytest
import torch

from minidist.pieces import Piece


def test_a_piece_fits_its_box_and_range():
    whole = torch.zeros(4, 6)
    Piece("w", (4, 6), (0, 0), (4, 6), None, whole)
    Piece("w", (4, 6), (0, 3), (4, 3), (2, 7), torch.zeros(5))


@pytest.mark.parametrize(
    "args, words",
    [
        (((4, 6), (0, 4), (4, 3), None, torch.zeros(4, 3)), "leaves the tensor"),
        (((4, 6), (0, 0), (4, 6), None, torch.zeros(4, 5)), "for a box of"),
        (((4, 6), (0, 0), (4, 6), (3, 25), torch.zeros(22)), "flat range"),
        (((4, 6), (0, 0), (4, 6), (3, 5), torch.zeros(3)), "flat range"),
        (((4, 6), (0,), (4, 6), None, torch.zeros(4, 6)), "differ in rank"),
    ],
)
def test_a_piece_that_does_not_fit_is_refused(args, words):
    with pytest.raises(ValueError, match=words):
        Piece("w", *args)
