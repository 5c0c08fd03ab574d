"""A setting's colour is a function of its name alone: equal in every figure, process and order."""
import subprocess
import sys

from gvq.schema.palette import FAMILY, colour_of, marker_of


def test_a_colour_is_the_same_in_another_process():
    names = ["qsgd", "qsgd bits=2", "powersgd rank=6", "somefuture_option k=1"]
    code = ("from gvq.schema.palette import colour_of, marker_of;"
            f"print([(colour_of(n), colour_of(n, 'overlap'), marker_of(n)) for n in {names!r}])")
    other = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.strip()
    assert other == str([(colour_of(n), colour_of(n, "overlap"), marker_of(n)) for n in names])


def test_the_default_setting_draws_its_family_colour_and_a_setting_a_shade_of_it():
    assert colour_of("qsgd") == FAMILY["qsgd"]
    assert colour_of("qsgd bits=2") != colour_of("qsgd")
    assert colour_of("qsgd bits=2") == colour_of(" qsgd bits=2 ")


def test_a_mode_other_than_post_is_its_own_colour_and_post_is_the_setting_colour():
    assert colour_of("powersgd", "post") == colour_of("powersgd") == colour_of("powersgd", None)
    assert colour_of("powersgd", "overlap") != colour_of("powersgd", "post")
    assert colour_of("powersgd", "overlap") != colour_of("qsgd", "overlap")


def test_families_are_apart():
    fams = ["rar", "fp16", "qsgd", "powersgd", "gradiveq", "terngrad", "signsgd", "orq", "bingrad_b", "linear"]
    assert len({colour_of(f) for f in fams}) == len(fams)
    assert all(c.startswith("#") and len(c) == 7 for c in map(colour_of, fams))


def test_no_setting_draws_the_grey_a_heatmap_gives_its_ties():
    """A tie is light grey in the projection's heatmaps: no family's colour, in either mode, is a grey."""
    import colorsys
    for option in FAMILY:
        for variant in ("post", "overlap"):
            c = colour_of(option, variant)
            r, g, b = (int(c[i:i + 2], 16) / 255 for i in (1, 3, 5))
            lightness, saturation = colorsys.rgb_to_hls(r, g, b)[1:]
            assert saturation > 0.2 or lightness < 0.45, (option, variant, c)
