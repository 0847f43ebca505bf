"""Edges of the package's contract: argument types torch refuses, writes the verdict
cache cannot see and their remedy, a mask written between forward and backward,
set_one_graph's switch, BlockMask and context-parallel arguments, and the messages for
what is no mask or no tensor."""
import os

import numpy as np
import pytest
import torch
import torch.nn.functional as F

import masklens
import masklens.torch as mt
from helpers import leaves, qkv, rows_cols
from masklens.torch import scaled_dot_product_attention as sdpa

L = 8
DOCS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "docs")


def causal_bool(Q=L, K=L):
    i, j = rows_cols(Q, K)
    return j <= i


def causal_additive(Q=L, K=L, dtype=torch.float32):
    return torch.zeros(Q, K, dtype=dtype).masked_fill(~causal_bool(Q, K), float("-inf"))


def raised(fn, *args, **kwargs):
    """(exception type, message) where fn raises, else (None, result)."""
    try:
        return None, fn(*args, **kwargs)
    except Exception as e:  # noqa: BLE001 - type and message are what is compared
        return type(e), str(e)


# --- is_causal and enable_gqa are bools -------------------------------------------

NOT_BOOLS = [("is_causal", None), ("is_causal", 0), ("is_causal", ""), ("is_causal", np.bool_(False)),
             ("is_causal", torch.tensor(False)), ("is_causal", 1), ("is_causal", np.bool_(True)),
             ("enable_gqa", None), ("enable_gqa", 1), ("enable_gqa", "yes"), ("enable_gqa", np.bool_(True)),
             ("enable_gqa", 0)]


@pytest.mark.parametrize("seen", [False, True], ids=["new mask", "mask seen before"])
@pytest.mark.parametrize("name,value", NOT_BOOLS, ids=[f"{n}={v!r}" for n, v in NOT_BOOLS])
def test_a_non_bool_flag_raises_torchs_type_error(name, value, seen):
    q, k, v = qkv(1, 2, L, L, grad=False)
    mask = causal_bool()
    if seen:  # the cache's fast path holds the call key of a bool flag (1 == True there)
        sdpa(q, k, v, attn_mask=mask, enable_gqa=True)
        sdpa(q, k, v, attn_mask=mask, is_causal=False)
    theirs = raised(F.scaled_dot_product_attention, q, k, v, attn_mask=mask, **{name: value})
    ours = raised(sdpa, q, k, v, attn_mask=mask, **{name: value})
    assert theirs[0] is TypeError
    assert ours == theirs


def test_torch_inspect_refuses_a_non_bool_enable_gqa():
    q, k, v = qkv(1, 2, L, L, grad=False)
    with pytest.raises(masklens.MaskError, match="enable_gqa of type int"):
        mt.inspect(q, k, v, causal_bool(), enable_gqa=1)


@pytest.mark.parametrize("value", ["false", "", 0, 1, None, np.bool_(False)])
def test_set_one_graph_takes_a_bool(value):
    from masklens import _one_graph
    before = _one_graph.enabled
    with pytest.raises(TypeError, match="set_one_graph takes True or False"):
        mt.set_one_graph(value)
    assert _one_graph.enabled is before
    mt.set_one_graph(before)


def test_set_one_graph_off_after_a_fullgraph_compile_names_masklens():
    pytest.importorskip("transformers")
    import masklens.transformers  # noqa: F401
    from transformers import AutoModelForCausalLM, LlamaConfig
    torch._dynamo.reset()
    mt.set_one_graph(True)
    try:
        model = AutoModelForCausalLM.from_config(
            LlamaConfig(num_hidden_layers=1, hidden_size=32, intermediate_size=64, num_attention_heads=2,
                        vocab_size=31), attn_implementation="masklens")
        compiled = torch.compile(model, backend="eager", fullgraph=True)
        ids, attention = torch.randint(3, 31, (2, 8)), torch.ones(2, 8, dtype=torch.long)
        attention[1, :3] = 0
        compiled(input_ids=ids, attention_mask=attention)
        mt.set_one_graph(False)
        with pytest.raises(Exception, match=r"masklens\.torch\.set_one_graph\(True\)"):
            compiled(input_ids=ids, attention_mask=attention)
    finally:
        mt.set_one_graph(False)
        torch._dynamo.reset()


# --- writes the verdict cache cannot see ------------------------------------------

def write_through_storage(mask):
    mask.untyped_storage()[mask.storage_offset() + 3] = 1  # row 0 now attends key 3


def fill_storage(mask):
    mask.untyped_storage().fill_(1)  # every key of every row


def write_through_set(mask):
    alias = torch.empty(0, dtype=mask.dtype).set_(mask.untyped_storage(), mask.storage_offset(), mask.shape,
                                                  mask.stride())
    alias[0, 3] = True  # alias's own version counter moves, the mask's does not


@pytest.mark.parametrize("write", [write_through_storage, fill_storage, write_through_set])
def test_writes_through_the_storage_are_named_and_forget_gives_torchs_result(write):
    q, k, v = qkv(1, 2, L, L, grad=False)
    mask = causal_bool().contiguous()
    sdpa(q, k, v, attn_mask=mask)
    version = mask._version
    write(mask)
    assert mask._version == version  # the premise: torch's version counter did not move
    masklens.forget(mask)
    torch.testing.assert_close(sdpa(q, k, v, attn_mask=mask), F.scaled_dot_product_attention(q, k, v, attn_mask=mask))
    # the docs name each of these writes beside the others the cache cannot see
    text = open(os.path.join(DOCS, "python.md")).read()
    for named in ("untyped_storage()", "set_()", "masklens.forget(mask)"):
        assert named in text


# --- an additive mask written between forward and backward --------------------------

MASKS = {
    "fp32 causal, dropped for is_causal": (torch.float32, lambda: causal_additive()),
    "bf16 causal, dropped": (torch.bfloat16, lambda: causal_additive(dtype=torch.bfloat16)),
    "fp32 mask, bf16 query (cast)": (torch.bfloat16, lambda: causal_additive()),
    "a bias, kept": (torch.float32, lambda: torch.randn(L, L)),
}


@pytest.mark.parametrize("case", list(MASKS))
def test_an_additive_mask_written_before_backward_raises_as_torch(case):
    dtype, make = MASKS[case]
    q, k, v = qkv(1, 2, L, L, dtype=dtype)

    def run(attention):
        mask = make()
        out = attention(*leaves(q, k, v), attn_mask=mask)
        mask.add_(0)  # in place: the version torch's kernel saved moves
        return raised(lambda: out.sum().backward())
    theirs, ours = run(F.scaled_dot_product_attention), run(sdpa)
    assert theirs[0] is RuntimeError and "modified by an inplace operation" in theirs[1]
    assert ours == theirs


def test_a_bool_mask_written_before_backward_runs_as_torch():
    q, k, v = qkv(1, 2, L, L)

    def grads(attention):
        mask = causal_bool()
        qq, kk, vv = leaves(q, k, v)
        out = attention(qq, kk, vv, attn_mask=mask)
        mask.logical_and_(mask)  # torch converts a bool mask before its kernel: nothing saved
        out.sum().backward()
        return qq.grad
    torch.testing.assert_close(grads(sdpa), grads(F.scaled_dot_product_attention))


# --- forget ---------------------------------------------------------------------------

@pytest.mark.parametrize("thing", [[True, False], 3, "causal", np.ones((4, 4), dtype=bool), np.ones(1, dtype=bool)],
                         ids=["list", "int", "str", "numpy 2-D", "numpy 1-element"])
def test_forget_names_what_is_no_cached_tensor(thing):
    with pytest.raises(TypeError, match=r"masklens\.forget takes the torch tensor .* got (list|int|str|numpy\.ndarray)"):
        masklens.forget(thing)


def test_forget_inside_torch_compile_names_masklens():
    @torch.compile(backend="eager", fullgraph=True)
    def step(mask):
        masklens.forget(mask)
        return mask.logical_not()
    with pytest.raises(Exception, match=r"masklens\.forget changes the verdict cache.*outside the compiled function"):
        step(causal_bool())
    torch._dynamo.reset()

    @torch.compile(backend="eager")
    def step_with_break(mask):  # without fullgraph: forget runs eagerly, between two graphs
        masklens.forget(mask)
        return mask.logical_not()
    q, k, v = qkv(1, 2, L, L, grad=False)
    mask = causal_bool()
    sdpa(q, k, v, attn_mask=mask)
    before = masklens.scan_count()
    step_with_break(mask)
    sdpa(q, k, v, attn_mask=mask)
    assert masklens.scan_count() == before + 1  # forgotten, so scanned again
    torch._dynamo.reset()


def test_swap_tensors_works_after_forget_and_the_docs_say_so():
    q, k, v = qkv(1, 2, L, L, grad=False)
    mask, other = causal_bool(), torch.ones(L, L, dtype=torch.bool)
    sdpa(q, k, v, attn_mask=mask)
    with pytest.raises(RuntimeError, match="weakref"):  # torch refuses a tensor with a weak reference
        torch.utils.swap_tensors(mask, other)
    masklens.forget(mask)
    torch.utils.swap_tensors(mask, other)
    torch.testing.assert_close(sdpa(q, k, v, attn_mask=mask), F.scaled_dot_product_attention(q, k, v, attn_mask=mask))
    text = open(os.path.join(DOCS, "python.md")).read()
    assert "swap_tensors" in text and "errors.md" in open(os.path.join(DOCS, "python.md")).read()
    assert "has weakref associated with it" in open(os.path.join(DOCS, "errors.md")).read()


# --- block_mask's and inspect's arguments ------------------------------------------

def nested_mask():
    return torch.nested.nested_tensor([torch.ones(4, 4, dtype=torch.bool), torch.ones(5, 5, dtype=torch.bool)])


NOT_MASKS = {
    "None": (lambda: None, r"invalid_argument: .*got NoneType"),
    "a kind's name": (lambda: "causal", r"invalid_argument: .*got str"),
    "a dict": (lambda: {"kind": "causal"}, r"invalid_argument: .*got dict"),
    "a list": (lambda: [[True]], r"invalid_argument: .*got list"),
    "a nested tensor": (nested_mask, r"invalid_argument: a nested tensor \(torch\.nested\) cannot be scanned"),
    "a 1-D mask": (lambda: torch.ones(40, dtype=torch.bool), r"invalid_shape: mask of shape \[40\] has 1 dim; "
                                                             r"a mask has 2 to 4"),
    "a 1-D numpy mask": (lambda: np.ones(40, dtype=bool), r"invalid_shape: mask of shape \[40\] has 1 dim"),
    "a 5-D mask": (lambda: torch.ones(1, 1, 1, 4, 4, dtype=torch.bool), r"invalid_shape: .* has 5 dims"),
}


@pytest.mark.filterwarnings("ignore::UserWarning")  # torch's nested tensors are a prototype
@pytest.mark.parametrize("name", list(NOT_MASKS))
def test_block_mask_and_inspect_name_what_is_no_mask(name):
    make, message = NOT_MASKS[name]
    with pytest.raises(masklens.MaskError, match=message):
        mt.block_mask(make(), 16)
    if name in ("a kind's name", "a dict", "a list", "None"):
        message = r"invalid_argument: a mask is a torch tensor or a numpy array .*got"
    with pytest.raises(masklens.MaskError, match=message):
        masklens.inspect(make())
    if not name.startswith("a 1-D"):
        return
    with pytest.raises(masklens.MaskError, match=message):
        masklens.scan(make())


@pytest.mark.parametrize("threshold", ["x", None, True, [-1000.0]])
def test_a_masked_threshold_that_is_no_number_is_named(threshold):
    mask = causal_additive(40, 40)
    message = r"invalid_argument: masked_threshold must be a negative number .* got"
    for call in (lambda: mt.block_mask(mask, 16, masked_threshold=threshold),
                 lambda: masklens.inspect(mask, masked_threshold=threshold),
                 lambda: masklens.scan(mask, masked_threshold=threshold)):
        with pytest.raises(masklens.MaskError, match=message):
            call()


def test_block_mask_of_a_report_checks_the_mask_given():
    mask = torch.ones(2, 3, 40, 40, dtype=torch.bool).tril()
    report = masklens.inspect(mask)
    with pytest.raises(masklens.MaskError, match=r"invalid_shape: mask= of shape \[41, 41\] is not the mask of the "
                                                 r"report's \[B, H, Q, K\] = \[2, 3, 40, 40\]"):
        mt.block_mask(report, 16, mask=torch.ones(41, 41, dtype=torch.bool))
    with pytest.raises(masklens.MaskError, match=r"mask= of shape \[3, 3, 40, 40\]"):
        mt.block_mask(report, 16, mask=torch.ones(3, 3, 40, 40, dtype=torch.bool))
    with pytest.raises(masklens.MaskError, match=r"block_mask's mask= is a mask .*got str"):
        mt.block_mask(report, 16, mask="causal")
    mt.block_mask(report, 16, mask=mask)  # its own mask, and one that broadcasts to it, are taken
    mt.block_mask(report, 16, mask=mask[:1, :1])
    # an arbitrary report's mask is read for its tiles: another mask of its shape is named
    g = torch.Generator().manual_seed(0)
    sparse = torch.rand(40, 40, generator=g) < 0.3
    arbitrary = masklens.inspect(sparse)
    assert arbitrary.structure.kind == "arbitrary"
    with pytest.raises(masklens.MaskError, match="mask= is not the mask the report describes: it reads as causal"):
        mt.block_mask(arbitrary, 16, mask=torch.ones(40, 40, dtype=torch.bool).tril())
    bm = mt.block_mask(arbitrary, 16, mask=sparse)
    assert bm.kv_num_blocks.shape[-1] == 3


def test_block_mask_of_a_mask_refuses_a_second_mask():
    mask = torch.ones(40, 40, dtype=torch.bool).tril()
    with pytest.raises(masklens.MaskError, match=r"block_mask\(mask, \.\.\., mask=\) got two masks"):
        mt.block_mask(mask, 16, mask=torch.ones(40, 40, dtype=torch.bool))
    mt.block_mask(mask, 16, mask=mask)  # the same mask twice says one thing


# --- masklens.distributed: a bad argument on one rank fails every rank -------------

def _bad_on_one_rank(rank, world, port, result_dir):
    import datetime
    import socket  # noqa: F401
    import torch.distributed as dist
    import masklens.distributed as mld
    from torch.distributed.device_mesh import DeviceMesh
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)
    # A short timeout: a rank left waiting in a collective fails the test in seconds.
    dist.init_process_group("gloo", rank=rank, world_size=world, timeout=datetime.timedelta(seconds=30))
    try:
        bad = rank == world - 1
        causal = torch.ones(12, 12, dtype=torch.bool).tril()
        local = mld.shard(causal, -2, rank=rank, world_size=world)
        q = mld.shard(torch.randn(1, 2, 12, 8), 2, rank=rank, world_size=world)
        named = f"rank {world - 1}: "
        cases = [
            (lambda: mld.scan(local, sharding="ring" if bad else "contiguous"), named + "invalid_argument: sharding"),
            (lambda: mld.scan(local, masked_threshold="x" if bad else -1000.0), named + "invalid_argument: masked_"),
            (lambda: mld.inspect(local, q, **({"colour": 1} if bad else {})), named + "TypeError: masklens.inspect: "
                                                                                      "unknown keyword"),
            (lambda: mld.inspect(local, q, **({"kv_heads": 3} if bad else {})), named + "invalid_argument: call.heads"),
            (lambda: mld.inspect(local, q, sm=1000 if bad else 90), named + "invalid_argument: environment.sm"),
            (lambda: mld.ContextParallel(DeviceMesh.from_group(dist.group.WORLD, "cpu"), block_size=0 if bad else 8),
             named + r"invalid_argument: block_size must be .* got 0"),
            (lambda: mld.ContextParallel(DeviceMesh.from_group(dist.group.WORLD, "cpu"),
                                         sharding="ring" if bad else "contiguous"), named + "invalid_argument: sharding"),
            (lambda: mld.ContextParallel(DeviceMesh.from_group(dist.group.WORLD, "cpu"), block_size=16 if bad else 8),
             "the ranks differ in sharding or block_size"),
        ]
        for i, (call, message) in enumerate(cases):
            with pytest.raises(masklens.MaskError, match=message):
                call()
        # every rank passing block_size=0 is refused too, and good arguments still agree
        with pytest.raises(masklens.MaskError, match="block_size must be"):
            mld.ContextParallel(DeviceMesh.from_group(dist.group.WORLD, "cpu"), block_size=0)
        cp = mld.ContextParallel(DeviceMesh.from_group(dist.group.WORLD, "cpu"), block_size=(8, 4))
        assert cp.block_size == (8, 4)
        assert cp.inspect(local, q).structure.kind == "causal"
        open(os.path.join(result_dir, f"rank{rank}.ok"), "w").close()
        # Every rank done before any tears the group down: gloo aborts a process whose
        # peer closes the connection while its last send is still in flight.
        dist.barrier()
    finally:
        dist.destroy_process_group()


def test_a_bad_argument_on_one_rank_fails_every_rank(tmp_path):
    import socket
    import torch.distributed as dist
    import torch.multiprocessing as mp
    if not dist.is_available() or not dist.is_gloo_available():
        pytest.skip("torch.distributed with gloo is not available")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    mp.spawn(_bad_on_one_rank, args=(2, port, str(tmp_path)), nprocs=2, join=True)
    assert sorted(os.listdir(tmp_path)) == ["rank0.ok", "rank1.ok"]


# --- explain on the CPU ----------------------------------------------------------------

def test_explain_on_the_cpu_lists_the_chosen_call_once():
    import io
    q = torch.randn(1, 4, 64, 32)
    out = io.StringIO()
    report = masklens.explain(causal_bool(64, 64), q, q, q, file=out)
    chosen = report.policy.call.backend
    assert chosen == "torch.sdpa.math"
    rejected = [line for line in out.getvalue().splitlines() if line.startswith("rejected")]
    assert rejected and not any(line.split()[1] == chosen for line in rejected), out.getvalue()


# --- the README's Python block runs as pasted ---------------------------------------

def test_the_readmes_python_block_runs_as_pasted(capsys):
    pytest.importorskip("transformers")
    readme = open(os.path.join(DOCS, "..", "README.md")).read()
    section = readme[readme.index("## Python"):]
    block = section[section.index("```python\n") + len("```python\n"):]
    block = block[:block.index("```")]
    names = {}
    exec(compile(block, "README.md", "exec"), names)  # noqa: S102 - the README's own text
    assert names["out"].shape == (2, 8, 256, 64)
    assert names["logits"].shape == (2, 16, 97)
    assert names["masklens"].transformers.masks()[-1][0] == "definition"  # as its comment says: never built
    assert "torch.sdpa" in capsys.readouterr().out  # explain printed the decision
