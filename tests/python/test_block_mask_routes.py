"""masklens._block_mask's constructors, one per starting point (a mask or report, an
exact structure's fields, a host tile summary, the eight tensors, a drop-in flex call),
give the same BlockMask tensors for the same mask, equal to torch's create_block_mask;
and the names benchmarks and other modules reach in masklens._block_mask are still there.
CPU only: the device writers' routes are checked against these in test_cuda_module.py
and test_gpu.py."""
from types import SimpleNamespace

import pytest
import torch

import masklens
import masklens.torch
from masklens import _block_mask, _core, _mask_mods, _scan
from test_tiles import as4, assert_same_block_mask, block_sparse, structured, torch_block_mask

pytest.importorskip("torch.nn.attention.flex_attention")

EXACT = ("causal", "sliding window 23", "packed documents", "left padding per batch", "bottom-right Q<K")
SIZES = [(16, 16), (32, 8)]


def host_arrays(tiles):
    """The eight tensors of a host tile summary, as torch tensors ({name: tensor})."""
    t = tiles.block_mask()
    return {name: torch.from_numpy(getattr(t, name)) for name in t.fields}


@pytest.mark.parametrize("name", EXACT)
@pytest.mark.parametrize("size", SIZES)
def test_every_route_of_an_exact_structure_gives_the_same_block_mask(name, size):
    mask = structured()[name]
    report = masklens.inspect(mask)
    structure = report.structure
    assert structure.kind != "arbitrary", name
    mod = _mask_mods.mask_mod_for(structure, "cpu")
    tiles = _core.tiles_from_structure(structure, *size)
    routes = {
        "block_mask(mask)": masklens.torch.block_mask(mask, size),
        "block_mask(report)": masklens.torch.block_mask(report, size),
        "from_structure": _block_mask.from_structure(structure, size, mod, "cpu"),
        "from_tiles": _block_mask.from_tiles(tiles, mod, "cpu"),
        "from_arrays": _block_mask.from_arrays(host_arrays(tiles), (tiles.q_len, tiles.k_len), size, mod),
        "flex_block_mask": _block_mask.flex_block_mask(
            structure, None, SimpleNamespace(block_q=size[0], block_k=size[1], mask_mod_reads_mask=False), "cpu"),
    }
    theirs = torch_block_mask(mask, *size)
    for route, ours in routes.items():
        assert ours is not None, route
        assert_same_block_mask(ours, theirs)


@pytest.mark.parametrize("shape", [(1, 1, 100, 100), (2, 3, 77, 130)])
def test_every_route_of_an_arbitrary_mask_gives_the_same_block_mask(shape):
    size = (16, 16)
    mask = block_sparse(*shape, *size, 0.4, 5)
    report = masklens.inspect(mask, tiles=size)
    assert report.structure.kind == "arbitrary"
    _, tiles = _scan.scan_with_tiles(mask, size)
    lookup = _mask_mods.mask_mod_for(None, "cpu", as4(mask))
    routes = {
        "block_mask(mask)": masklens.torch.block_mask(mask, size),
        "block_mask(report, mask=)": masklens.torch.block_mask(report, size, mask=mask),
        "from_tiles": _block_mask.from_tiles(tiles, lookup, "cpu"),
        "from_arrays": _block_mask.from_arrays(host_arrays(tiles), (tiles.q_len, tiles.k_len), size, lookup),
        "flex_block_mask": _block_mask.flex_block_mask(
            report.structure, as4(mask), SimpleNamespace(block_q=16, block_k=16, mask_mod_reads_mask=True), "cpu"),
    }
    theirs = torch_block_mask(mask, *size)
    for route, ours in routes.items():
        assert ours is not None, route
        assert_same_block_mask(ours, theirs)
        # Every route's mask_mod reads the mask: the same verdict on every position.
        b, h, q, kv = (torch.arange(n).view(*(1,) * i, n, *(1,) * (3 - i)) for i, n in enumerate(shape))
        assert torch.equal(ours.mask_mod(b, h, q, kv).expand(shape), as4(mask).expand(shape)), route


def test_the_errors_of_block_mask_are_unchanged():
    mask = block_sparse(1, 1, 64, 64, 16, 16, 0.4, 3)
    report = masklens.inspect(mask)
    with pytest.raises(masklens.MaskError, match="^invalid_argument: the BlockMask of an arbitrary mask reads"):
        masklens.torch.block_mask(report, 16)
    with pytest.raises(masklens.MaskError, match="^invalid_argument: block_mask\\(mask, ..., mask=\\) got two masks"):
        masklens.torch.block_mask(mask, 16, mask=mask.clone())
    with pytest.raises(masklens.MaskError, match="^invalid_shape: mask= of shape \\[32, 64\\]"):
        masklens.torch.block_mask(report, 16, mask=mask[0, 0, :32])
    with pytest.raises(masklens.MaskError, match="^invalid_argument: mask= is not the mask the report describes"):
        masklens.torch.block_mask(report, 16, mask=torch.ones(64, 64, dtype=torch.bool).tril())
    with pytest.raises(masklens.MaskError, match="^invalid_argument: block_mask's mask_or_report is a mask"):
        masklens.torch.block_mask([[True]], 16)


# What benchmarks (bench/tiles_torch.py, bench/dropin.py), masklens._inspect and the tests
# reach by name in masklens._block_mask.
KEPT_NAMES = ("BLOCK_MASK_FIELDS", "block_mask_shapes", "_block_mask_storage", "_block_mask_tensors",
              "device_block_mask_tensors", "device_block_mask_from_structure", "device_scan_tiles",
              "device_tile_summary", "structure_tiles_as_stored", "mask_mod_for", "rule_reads_tables",
              "span_mask_mod", "span_bounds", "bounds_mask_mod", "document_table", "attends",
              "block_mask_takes_q_side", "block_mask_from_arrays", "block_mask_from_tiles",
              "block_mask_from_structure", "device_block_mask", "flex_block_mask", "_device_block_mask",
              "_structure_slices", "block_mask")


def test_the_names_callers_reach_are_kept():
    for name in KEPT_NAMES:
        assert callable(getattr(_block_mask, name)) or name == "BLOCK_MASK_FIELDS", name
    assert masklens.torch.block_mask is _block_mask.block_mask
