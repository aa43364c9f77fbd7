import pytest

from samu.bench.shapes import LENGTH, PRIMARY, WIDTH, parse_shapes, shape_sets


def test_named_sets_are_the_spec_shapes():
    assert PRIMARY == ((4, 2048, 2048), (2, 4096, 2560), (1, 32768, 1024), (1, 32768, 2048), (1, 8192, 1024))
    assert [s[1] for s in LENGTH] == [8192, 16384, 32768, 65536, 131072]
    assert all(s[0] == 1 and s[2] == 1024 for s in LENGTH)
    assert WIDTH == tuple((1, 32768, d) for d in (1024, 1536, 2048, 2560))
    assert {(1, 65536, 1024), (1, 131072, 1024)} <= set(parse_shapes("gate"))


def test_parse_shapes_mixes_sets_and_literals_without_duplicates():
    shapes = parse_shapes("primary, 1x64x32, 1X8192X1024")
    assert shapes[:5] == list(PRIMARY)
    assert shapes[5:] == [(1, 64, 32)]
    assert set(shape_sets((1, 32768, 1024))) >= {"primary", "length", "width"}


def test_parse_shapes_removes_with_a_minus():
    assert parse_shapes("length,width,-primary") == [(1, 16384, 1024), (1, 65536, 1024), (1, 131072, 1024),
                                                     (1, 32768, 1536), (1, 32768, 2560)]
    assert parse_shapes("1x4x4,1x8x4,-1x4x4") == [(1, 8, 4)]


@pytest.mark.parametrize("bad", ["", "nope", "1x2", "0x4x4", "1x-4x4", "axbxc", "primary,-primary", "-nope"])
def test_parse_shapes_rejects_bad_specs(bad):
    with pytest.raises(ValueError):
        parse_shapes(bad)
