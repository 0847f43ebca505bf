"""masklens.jax, the JAX host: inspect, the drop-in jax.nn.dot_product_attention, and
prepare/attention under jit, each held to jax's own call with the dense mask (values and
gradients) over a corpus of structures; jit with changing padding traced once; bad input
raising where jax raises. On the CPU (XLA); the tests marked gpu run cuDNN and the device
scanner where jax has a GPU."""
import numpy as np
import pytest

jax = pytest.importorskip("jax")
import jax.numpy as jnp  # noqa: E402

import masklens  # noqa: E402
import masklens.jax as mj  # noqa: E402

jax.config.update("jax_enable_x64", False)


def _jax_gpu():
    try:
        return [d for d in jax.devices() if d.platform in ("gpu", "cuda")]
    except RuntimeError:
        return []


needs_jax_gpu = pytest.mark.skipif(not _jax_gpu(), reason="jax has no GPU")

B, N, K, H = 3, 4, 2, 16  # GQA: 4 query heads over 2 key heads


def tril(t, s, offset=0):
    return np.tril(np.ones((t, s), bool), offset)


def causal_padded(lengths, t):
    m = np.stack([tril(t, t) & (np.arange(t) < n)[None, :] for n in lengths])
    return m[:, None]


def left_padded(starts, t):
    m = np.stack([tril(t, t) & (np.arange(t) >= s)[None, :] & (np.arange(t) >= s)[:, None] | np.eye(t, dtype=bool)
                  for s in starts])
    return m[:, None]


def window(t, s, w, bottom_right=False):
    d = s - t if bottom_right else 0
    q, k = np.arange(t)[:, None] + d, np.arange(s)[None, :]
    return (k <= q) & (k > q - w)


def documents(starts, t):
    doc = np.searchsorted(np.asarray(starts[1:]), np.arange(t), side="right")
    return (doc[:, None] == doc[None, :]) & tril(t, t)


def corpus(sc=1):
    """(name, mask [B or 1, 1, T, S], T, S, whether the drop-in drops it on the CPU); every
    length times `sc`."""
    rng = np.random.default_rng(3)
    L, T = 24 * sc, 8 * sc
    arbitrary = rng.random((1, 1, L, L)) < 0.6
    arbitrary[..., 0] = True
    empty_batch = np.ones((B, 1, T, L), bool)
    empty_batch[1] = False  # a batch whose rows attend nothing: jax averages V there
    return [
        ("causal", tril(L, L)[None, None], L, L, True),
        ("causal 2-D", tril(L, L), L, L, True),
        ("causal bottom-right", tril(T, L, L - T)[None, None], T, L, True),
        ("causal top-left Q<K", tril(T, L)[None, None], T, L, True),
        ("full", np.ones((1, 1, T, L), bool), T, L, True),
        ("window", window(L, L, 5 * sc)[None, None], L, L, True),
        ("window bottom-right", window(T, L, 20 * sc, True)[None, None], T, L, True),
        ("window bottom-right, narrow", window(T, L, 6 * sc, True)[None, None], T, L, False),
        ("padding right", causal_padded([L, 17 * sc, 9 * sc], L), L, L, True),
        ("padding right, cross", np.stack([np.arange(L) < n for n in (L, 10 * sc, 3 * sc)])[:, None, None, :]
         .repeat(T, axis=2), T, L, True),
        ("padding left", left_padded([0, 5 * sc, 11 * sc], L), L, L, False),
        ("packed documents", documents([0, 7 * sc, 15 * sc], L)[None, None], L, L, False),
        ("arbitrary", arbitrary, L, L, False),
        ("a batch without keys", empty_batch, T, L, True),
    ]


def qkv(t, s, dtype=jnp.float32, seed=0):
    kq, kk, kv = jax.random.split(jax.random.PRNGKey(seed), 3)
    return (jax.random.normal(kq, (B, t, N, H), dtype), jax.random.normal(kk, (B, s, K, H), dtype),
            jax.random.normal(kv, (B, s, K, H), dtype))


def dense(q, k, v, mask, implementation="xla"):
    return jax.nn.dot_product_attention(q, k, v, mask=mask, implementation=implementation)


def loss_and_grads(fn, q, k, v):
    # The weights drawn in float32 and cast: jax.random.normal draws other numbers in bfloat16,
    # and a reference in float32 must weigh the same outputs as the call under test.
    w = jax.random.normal(jax.random.PRNGKey(9), (q.shape[0], q.shape[1], q.shape[2], v.shape[-1]),
                          jnp.float32).astype(q.dtype)
    return jax.value_and_grad(lambda q, k, v: jnp.sum(fn(q, k, v) * w), argnums=(0, 1, 2))(q, k, v)


def assert_same(got, want, atol=1e-5):
    (lg, gg), (lw, gw) = got, want
    np.testing.assert_allclose(lg, lw, atol=atol, rtol=1e-5)
    for a, b in zip(gg, gw):
        np.testing.assert_allclose(a, b, atol=atol, rtol=1e-5)


CORPUS = corpus()


@pytest.mark.parametrize("name,mask,t,s,drops", CORPUS, ids=[c[0] for c in CORPUS])
def test_inspect_equals_masklens_inspect(name, mask, t, s, drops):
    q, k, v = qkv(t, s)
    for m in (mask, jnp.asarray(mask)):
        report = mj.inspect(m, q, k, v)
        m4 = np.broadcast_to(mask.reshape((1,) * (4 - mask.ndim) + mask.shape),
                             (mask.shape[0] if mask.ndim == 4 else 1, 1, t, s))
        assert report.structure.describe() == masklens.scan(np.ascontiguousarray(m4)).structure.describe()
        assert report.environment.available == {"jax"}
        assert report.policy.call.backend == "jax.xla"  # the CPU: no cuDNN
        assert (report.policy.call.mask == "drop") == drops, report.policy.call.mask


@pytest.mark.parametrize("name,mask,t,s,drops", CORPUS, ids=[c[0] for c in CORPUS])
def test_dropin_equals_dense_values_and_gradients(name, mask, t, s, drops):
    q, k, v = qkv(t, s)
    m = jnp.asarray(mask)
    want = loss_and_grads(lambda q, k, v: dense(q, k, v, m), q, k, v)
    got = loss_and_grads(lambda q, k, v: mj.dot_product_attention(q, k, v, mask=m), q, k, v)
    assert_same(got, want)
    np.testing.assert_allclose(mj.dot_product_attention(q, k, v, mask=m), dense(q, k, v, m), atol=1e-6)
    # A NumPy mask and implementation given: the same.
    np.testing.assert_allclose(mj.dot_product_attention(q, k, v, mask=mask, implementation="xla"),
                               dense(q, k, v, mask), atol=1e-6)


@pytest.mark.parametrize("name,mask,t,s,drops", CORPUS, ids=[c[0] for c in CORPUS])
def test_prepare_attention_under_jit(name, mask, t, s, drops):
    q, k, v = qkv(t, s)
    prepared = mj.prepare(jnp.asarray(mask), q, k, v)
    assert prepared.keeps_mask == (not drops)
    step = jax.jit(lambda q, k, v, p: mj.attention(q, k, v, p))
    want = loss_and_grads(lambda q, k, v: dense(q, k, v, mask), q, k, v)
    got = loss_and_grads(lambda q, k, v: step(q, k, v, prepared), q, k, v)
    assert_same(got, want)
    leaves = jax.tree_util.tree_leaves(prepared)
    assert all(isinstance(x, jax.Array) for x in leaves)


def test_jit_with_changing_padding_does_not_retrace():
    q, k, v = qkv(24, 24)
    traces = []

    @jax.jit
    def step(q, k, v, prepared):
        traces.append(1)
        return jnp.sum(mj.attention(q, k, v, prepared) ** 2)

    grad_step = jax.jit(jax.grad(lambda q, k, v, p: jnp.sum(mj.attention(q, k, v, p) ** 2)))
    rng = np.random.default_rng(0)
    for i in range(8):
        lengths = [24, 24, 24] if i == 3 else list(rng.integers(1, 25, size=B))  # one batch pads nothing
        mask = jnp.asarray(causal_padded(lengths, 24))
        prepared = mj.prepare(mask, q, k, v)
        assert not prepared.keeps_mask and prepared.key_value_seq_lengths is not None
        np.testing.assert_allclose(step(q, k, v, prepared), jnp.sum(dense(q, k, v, mask) ** 2), rtol=1e-5)
        np.testing.assert_allclose(grad_step(q, k, v, prepared),
                                   jax.grad(lambda q: jnp.sum(dense(q, k, v, mask) ** 2))(q), atol=1e-5)
    assert len(traces) == 1
    assert grad_step._cache_size() == 1


def test_dropin_scans_once_per_array_and_not_inside_jit():
    q, k, v = qkv(24, 24)
    mask = jnp.asarray(causal_padded([24, 20, 3], 24))
    before = masklens.scan_count()
    mj.dot_product_attention(q, k, v, mask=mask)
    mj.dot_product_attention(q, k, v, mask=mask)
    assert masklens.scan_count() == before + 1
    # Inside jit the mask is a tracer: jax's own call, no scan.
    out = jax.jit(lambda q, k, v, m: mj.dot_product_attention(q, k, v, mask=m))(q, k, v, mask)
    np.testing.assert_allclose(out, dense(q, k, v, mask), atol=1e-6)
    assert masklens.scan_count() == before + 1
    # A concrete mask closed over inside jit is proven at trace time.
    out = jax.jit(lambda q, k, v: mj.dot_product_attention(q, k, v, mask=mask))(q, k, v)
    np.testing.assert_allclose(out, dense(q, k, v, mask), atol=1e-6)


def test_other_arguments_keep_jax_call():
    q, k, v = qkv(24, 24)
    mask = jnp.asarray(tril(24, 24)[None, None])
    bias = jax.random.normal(jax.random.PRNGKey(2), (1, N, 24, 24))
    for kwargs in ({"bias": bias}, {"is_causal": True}, {"local_window_size": (3, 0)},
                   {"key_value_seq_lengths": jnp.array([24, 10, 5], jnp.int32)}):
        got = mj.dot_product_attention(q, k, v, mask=mask, **kwargs)
        want = jax.nn.dot_product_attention(q, k, v, mask=mask, **kwargs)
        np.testing.assert_allclose(got, want, atol=1e-6)
    np.testing.assert_allclose(mj.dot_product_attention(q, k, v), jax.nn.dot_product_attention(q, k, v), atol=1e-6)


def _raises_like_jax(call_masklens, call_jax):
    with pytest.raises(Exception) as theirs:
        call_jax()
    with pytest.raises(type(theirs.value)) as ours:
        call_masklens()
    assert str(ours.value) == str(theirs.value)


def test_bad_input_raises_where_jax_raises():
    q, k, v = qkv(24, 24)
    causal = tril(24, 24)[None, None]
    cases = [
        ("float mask", q, k, v, jnp.asarray(causal, jnp.float32), None),
        ("mask of another length", q, k, v, jnp.asarray(tril(24, 23)[None, None]), None),
        ("5-D mask", q, k, v, jnp.asarray(causal[None]), None),
        ("head dims differ", q, k[..., :8], v[..., :8], jnp.asarray(causal), None),
        ("heads not a multiple", jnp.zeros((B, 24, 3, H)), k, v, jnp.asarray(causal), None),
        ("dtypes differ", q.astype(jnp.bfloat16), k, v, jnp.asarray(causal), None),
        ("unknown implementation", q, k, v, jnp.asarray(causal), "flash"),
    ]
    if not _jax_gpu():
        cases.append(("cuDNN on the CPU", q, k, v, jnp.asarray(causal), "cudnn"))
    for name, q_, k_, v_, m_, impl in cases:
        _raises_like_jax(lambda: mj.dot_product_attention(q_, k_, v_, mask=m_, implementation=impl),
                         lambda: jax.nn.dot_product_attention(q_, k_, v_, mask=m_, implementation=impl))


def test_bad_masks_for_inspect_and_prepare():
    q, k, v = qkv(24, 24)
    with pytest.raises(masklens.MaskError, match="invalid_argument: a mask is a NumPy or jax array"):
        mj.inspect([[True]], q, k, v)
    with pytest.raises(masklens.MaskError, match="invalid_shape"):
        mj.inspect(np.ones((2, 1, 24, 24), bool), q, k, v)  # batch 2 against 3
    with pytest.raises(masklens.MaskError, match="invalid_value"):
        mj.inspect(np.full((24, 24), np.nan, np.float32), q, k, v)
    with pytest.raises(masklens.MaskError, match="outside jit"):
        jax.jit(lambda m: mj.prepare(m, q, k, v).key_value_seq_lengths)(jnp.asarray(tril(24, 24)))
    with pytest.raises(masklens.MaskError, match="implementation"):
        mj.prepare(tril(24, 24), q, k, v, implementation="flash")
    # A float mask is carried to jax's own call, which raises there as without masklens.
    prepared = mj.prepare(np.zeros((24, 24), np.float32), q, k, v)
    assert prepared.keeps_mask
    with pytest.raises(ValueError, match="mask dtype"):
        mj.attention(q, k, v, prepared)


def test_environment_and_the_torch_host():
    env = mj.environment()
    assert env.available == {"jax"} and env.jax is not None
    if not _jax_gpu():
        assert env.sm == 10 and env.cudnn is None
    # The jax family is this host's: torch's environment never counts it installed.
    assert "jax" not in masklens.environment("cpu").available
    assert "jax" not in masklens._env.installed_families()
    # The JSON contract is the CLI's, with the JAX backends' own argument names.
    q, k, v = qkv(24, 24)
    doc = mj.inspect(jnp.asarray(causal_padded([24, 20, 3], 24)), q, k, v).to_dict()
    assert doc["policy"]["backend"] == "jax.xla"
    assert doc["policy"]["args"] == {"is_causal": True, "key_value_seq_lengths": [24, 20, 3], "implementation": "xla"}
    assert doc["policy"]["call"]["alignment"] == "top_left"
    # Decided as an H100 would be: cuDNN.
    doc = mj.inspect(jnp.asarray(causal_padded([24, 20, 3], 24)), q.astype(jnp.bfloat16), k.astype(jnp.bfloat16),
                     v.astype(jnp.bfloat16), sm=90, cudnn="9.19").to_dict()
    assert doc["policy"]["backend"] == "jax.cudnn"
    assert doc["policy"]["args"]["implementation"] == "cudnn"


def test_docs_example_runs():
    import pathlib
    import re
    text = (pathlib.Path(__file__).resolve().parents[2] / "docs" / "jax.md").read_text()
    example = re.search(r"```python\n(.*?)```", text, re.S).group(1)
    exec(compile(example, "docs/jax.md", "exec"), {})


# --- on a GPU: cuDNN and the device scanner ---------------------------------------

@pytest.mark.gpu
@needs_jax_gpu
@pytest.mark.parametrize("name,mask,t,s,drops", CORPUS, ids=[c[0] for c in CORPUS])
def test_gpu_device_scan_equals_host_scan(name, mask, t, s, drops):
    if not masklens.has_cuda_scan():
        pytest.skip(masklens.cuda_scan_unavailable())
    q, k, v = qkv(t, s)
    device_mask = jax.device_put(jnp.asarray(mask), _jax_gpu()[0])
    before = masklens.last_timing()
    on_device = mj.inspect(device_mask, q, k, v)
    assert masklens.last_timing()["device"] == "cuda", before
    on_host = mj.inspect(mask, q, k, v)
    assert on_device.structure.describe() == on_host.structure.describe()
    assert on_device.to_dict()["structure"] == on_host.to_dict()["structure"]


GPU_CORPUS = corpus(8)  # lengths of 64 to 192: what cuDNN takes


@pytest.mark.gpu
@needs_jax_gpu
@pytest.mark.parametrize("dtype", [jnp.bfloat16, jnp.float16])
@pytest.mark.parametrize("name,mask,t,s,drops", GPU_CORPUS, ids=[c[0] for c in GPU_CORPUS])
def test_gpu_cudnn_equals_dense(name, mask, t, s, drops, dtype):
    kq, kk, kv = jax.random.split(jax.random.PRNGKey(1), 3)
    q = jax.random.normal(kq, (B, t, N, 64), dtype)
    k = jax.random.normal(kk, (B, s, K, 64), dtype)
    v = jax.random.normal(kv, (B, s, K, 64), dtype)
    m = jnp.asarray(mask)
    report = mj.inspect(m, q, k, v, training=True)
    f32 = [x.astype(jnp.float32) for x in (q, k, v)]
    want_out = dense(*f32, m)
    want = loss_and_grads(lambda q, k, v: dense(q, k, v, m), *f32)
    for implementation in (None, "cudnn"):
        if implementation == "cudnn" and report.policy.call.backend != "jax.cudnn":
            continue  # jax's own cuDNN call with the mask: not masklens' to check
        out = mj.dot_product_attention(q, k, v, mask=m, implementation=implementation)
        got = loss_and_grads(lambda q, k, v: mj.dot_product_attention(q, k, v, mask=m,
                                                                       implementation=implementation), q, k, v)
        pairs = [("out", out, want_out)] + list(zip(("dq", "dk", "dv"), got[1], want[1]))
        for what, a, b in pairs:
            a, b = np.asarray(a, np.float32), np.asarray(b, np.float32)
            assert np.abs(a - b).max() <= 3e-2 * max(1.0, np.abs(b).max()), (name, implementation, what)
    if report.policy.call.mask == "drop" and report.structure.empty_rows == 0 and t == s:
        assert report.policy.call.backend == "jax.cudnn", report.policy.call.backend


@pytest.mark.gpu
@needs_jax_gpu
def test_gpu_prepare_attention_on_cudnn_under_jit():
    q, k, v = (x.astype(jnp.bfloat16) for x in qkv(192, 192))
    q, k, v = (jnp.concatenate([x] * 4, axis=-1) for x in (q, k, v))  # head dim 64
    traces = []

    @jax.jit
    def step(q, k, v, prepared):
        traces.append(1)
        return mj.attention(q, k, v, prepared)

    for lengths in ([192, 100, 7], [192, 192, 192], [50, 60, 70]):
        mask = jnp.asarray(causal_padded(lengths, 192))
        prepared = mj.prepare(mask, q, k, v)
        assert prepared.backend == "jax.cudnn", prepared
        got = np.asarray(step(q, k, v, prepared), np.float32)
        want = np.asarray(dense(*(x.astype(jnp.float32) for x in (q, k, v)), mask), np.float32)
        assert np.abs(got - want).max() <= 3e-2 * max(1.0, np.abs(want).max())
    assert len(traces) == 1
