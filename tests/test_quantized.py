"""Low-precision state and params (API.md section 8): `Quantized` state against a NumPy
transcription of torchao's 8-bit, 4-bit and fp8 AdamW, `StochasticRounding`,
`Compensated`, and bad input.

The transcription is in `tests/torchao_transcription.py`. torchao is not installed
here: the transcription is checked against the maps torchao prints in its docs (the
4-bit signed map below) and, in a separate venv with torch, against torchao itself by
`tests/torchao_check.py`.
"""

import io

import equinox as eqx
import jax
import jax.numpy as jnp
import jax.random as jr
import ml_dtypes
import numpy as np
import pytest

import eqxopt

from .torchao_transcription import np_adamw_step, np_quantize_with_qmap, NpBuffer, QMAPS


def test_transcribed_maps():
    assert QMAPS["int8", True].shape == (256,) and QMAPS["int8", False].shape == (256,)
    np.testing.assert_allclose(
        QMAPS["int4", True],
        [-0.8875, -0.6625, -0.4375, -0.2125, -0.0775, -0.0325, -0.0055, 0.0]
        + [0.0055, 0.0325, 0.0775, 0.2125, 0.4375, 0.6625, 0.8875, 1.0],
        rtol=1e-6,
    )
    for fmt, signed in QMAPS:
        ours = eqxopt._quantized.qmap(fmt, signed)
        np.testing.assert_array_equal(ours, QMAPS[fmt, signed])


def test_nearest_code_is_torchaos_at_every_boundary():
    """The encoder's two table look-ups give the transcription's code on both sides
    of every code boundary and every map entry, at the extremes, at NaN and on
    random values."""
    from eqxopt._quantized import _lookup, _nearest_code

    rng = np.random.default_rng(0)
    for (fmt, signed), table in QMAPS.items():
        rises = _lookup(fmt, signed)[1]
        points = np.concatenate([rises[~np.isnan(rises)], table]).astype(np.float32)
        x = np.concatenate(
            [
                points,
                np.nextafter(points, np.float32(-np.inf)),
                np.nextafter(points, np.float32(np.inf)),
                rng.uniform(-1.0, 1.0, 10_000).astype(np.float32),
                np.array([0.0, -0.0, 1e-40, -1e-40, np.inf, -np.inf], np.float32),
                np.array([np.nan], np.float32),
            ]
        )
        ours = np.asarray(_nearest_code(jnp.asarray(x), fmt, signed))
        np.testing.assert_array_equal(ours, np_quantize_with_qmap(x, table))


def test_fp8_bits_are_the_cast_at_every_boundary():
    """fp8's integer encoding is `float8_e4m3fn`'s round-to-nearest-even cast (as
    `ml_dtypes` does it) at every value, every midpoint and their neighbours; its
    decoding (in integer arithmetic) is the cast back."""
    from eqxopt._quantized import _fp8_bits, _fp8_decode, _fp8_values

    fp8 = np.arange(256, dtype=np.uint8).view(ml_dtypes.float8_e4m3fn)
    values = np.sort(fp8.astype(np.float32)[np.isfinite(fp8.astype(np.float32))])
    mids = ((values[1:].astype(np.float64) + values[:-1]) / 2).astype(np.float32)
    points = np.concatenate([values, mids])
    x = np.concatenate(
        [
            points,
            np.nextafter(points, np.float32(-np.inf)),
            np.nextafter(points, np.float32(np.inf)),
            np.array([0.0, -0.0, 1e-40, -1e-40, np.nan], np.float32),
        ]
    )
    x = x[~(np.abs(x) > 448)]
    cast = x.astype(ml_dtypes.float8_e4m3fn).view(np.uint8)
    ours = np.asarray(_fp8_bits(jnp.asarray(x)))
    nan = np.isnan(x)
    np.testing.assert_array_equal(ours[~nan], cast[~nan])
    assert np.all(ours[nan] & 0x7F == 0x7F)
    bits = fp8.astype(np.float32).view(np.uint32)
    nan_code = np.isnan(fp8.astype(np.float32))
    np.testing.assert_array_equal(_fp8_values(), fp8.astype(np.float32))
    decoded = np.asarray(_fp8_decode(jnp.arange(256, dtype=jnp.uint8)))
    np.testing.assert_array_equal(decoded.view(np.uint32)[~nan_code], bits[~nan_code])
    assert np.all(np.isnan(decoded[nan_code]))


def test_block_absmax():
    """A block's scale is its largest absolute value, as `max(abs(x))` gives it:
    -0.0 counts as 0, an infinity as infinite, a NaN anywhere in the block makes it
    NaN; for block sizes that are and are not multiples of 32."""
    from eqxopt._quantized import _absmax

    rng = np.random.default_rng(1)
    for width in (4, 32, 96, 100, 256):
        x = rng.normal(size=(6, width)).astype(np.float32)
        x[1] = -0.0
        x[2, -1] = -np.inf
        x[3, width // 2] = np.nan
        x[4, 0] = -1e-40  # subnormal
        x[4, 1:] = 0.0
        ours = np.asarray(_absmax(jnp.asarray(x)))
        np.testing.assert_array_equal(ours, np.max(np.abs(x), axis=1))


# --- parity ---------------------------------------------------------------------

SHAPES = {
    "w": (64, 128),  # quantized, whole blocks
    "odd": (5003,),  # quantized, zero-padded last block
    "small": (100,),  # under min_size: the param's dtype
    "zeros": (4096,),  # its first blocks see only zero grads
}


def _grads(key, dtype=np.float32):
    out = {}
    for i, (name, shape) in enumerate(SHAPES.items()):
        g = np.asarray(jr.normal(jr.fold_in(key, i), shape), np.float32)
        g = g * np.float32(10.0 ** (i - 2))
        if name == "zeros":
            g[:512] = 0
        out[name] = g.astype(dtype)
    return out


def _mismatches_are_ties(ours, ref: NpBuffer, fmt):
    """Codes equal except where the reference's scaled value is within the float32
    rounding of the moments (relative 1e-4) of the midpoint between the two codes."""
    ours_codes = np.asarray(ours.codes).reshape(-1)
    if fmt == "int4":
        ours_codes = np.stack([ours_codes >> 4, ours_codes & 15], -1).reshape(-1)
    diff = np.nonzero(ours_codes != ref.codes)[0]
    assert diff.size <= max(2, ref.codes.size // 1000), (fmt, diff.size)
    for i in diff:
        if fmt == "fp8":
            a = ours_codes[i : i + 1].view(ml_dtypes.float8_e4m3fn).astype(np.float32)
            b = ref.codes[i : i + 1].view(ml_dtypes.float8_e4m3fn).astype(np.float32)
            x = np.float32(ref.value()[i] if i < ref.size else 0)
            x = x / ref.scale[i // ref.block]
        else:
            q = QMAPS[fmt, ref.signed]
            assert ref.scaled is not None
            a, b, x = q[ours_codes[i]], q[ref.codes[i]], ref.scaled[i]
        mid = (a + b) / 2
        # Optax's EMA (1-b) g + b m against torch's lerp: the moments differ by
        # float32 rounding of b (1 - 0.999 is 1.3e-5 off 0.001), hence 1e-4.
        assert abs(float(x) - float(mid[0] if np.ndim(mid) else mid)) <= 1e-4 * (
            abs(float(np.ravel(mid)[0])) + 1e-6
        ), (fmt, i)


def _pack_codes(fmt, codes):
    if fmt == "int4":
        return (codes[0::2] << 4) | codes[1::2]
    return codes


@pytest.mark.parametrize("param_dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("fmt", ["int8", "int4", "fp8"])
def test_adamw_matches_torchao(fmt, param_dtype):
    dtype = jnp.dtype(param_dtype)
    lr, b1, b2, wd, eps = 1e-3, 0.9, 0.999, 1e-2, 1e-8
    block = {"int8": 256, "int4": 128, "fp8": 256}[fmt]
    opt = eqxopt.AdamW(
        lr, b1, b2, eps, weight_decay=wd, state_dtype=eqxopt.Quantized(fmt)
    )
    params = {
        k: jr.normal(jr.key(i), s, jnp.float32).astype(dtype)
        for i, (k, s) in enumerate(SHAPES.items())
    }
    state = opt.init(params)
    step = eqx.filter_jit(opt.step)
    ref_m = {k: NpBuffer(s, dtype, fmt, True, block) for k, s in SHAPES.items()}
    ref_v = {k: NpBuffer(s, dtype, fmt, False, block) for k, s in SHAPES.items()}
    ref_p = {k: np.asarray(v) for k, v in params.items()}
    for t in range(1, 5):
        grads = _grads(jr.key(100 + t))
        params, state = step(
            params, {k: jnp.asarray(g) for k, g in grads.items()}, state
        )
        for k in SHAPES:
            new = np_adamw_step(
                ref_p[k], grads[k], t, ref_m[k], ref_v[k], lr, b1, b2, wd, eps
            )
            ref_p[k] = new.astype(dtype).reshape(SHAPES[k])
            for ours, ref in ((state.mu[k], ref_m[k]), (state.nu[k], ref_v[k])):
                if not ref.quantized:
                    assert ours.dtype == dtype and ours.shape == SHAPES[k]
                    np.testing.assert_allclose(
                        np.asarray(ours, np.float32),
                        ref.plain.astype(np.float32),
                        rtol=1e-2 if dtype == jnp.bfloat16 else 1e-4,
                        atol=1e-4 * float(np.abs(ref.plain.astype(np.float32)).max()),
                    )
                    continue
                assert isinstance(ours, eqxopt.QuantizedArray)
                np.testing.assert_allclose(
                    np.asarray(ours.scales), ref.scale, rtol=1e-4
                )
                _mismatches_are_ties(ours, ref, fmt)
            np.testing.assert_allclose(
                np.asarray(params[k], np.float32),
                ref_p[k].astype(np.float32),
                # bfloat16: one ulp of a param of size ~lr that the two round apart
                rtol=1e-2 if dtype == jnp.bfloat16 else 1e-5,
                atol=2e-5 if dtype == jnp.bfloat16 else 1e-6,
            )
    # The all-zero blocks of `zeros`' first moment decode to exactly 0, no NaN.
    mu = state.mu["zeros"].decode()
    assert jnp.all(mu[:512] == 0) and jnp.all(jnp.isfinite(mu))
    assert jnp.all(jnp.isfinite(state.nu["zeros"].scales))


def test_new_buffer_decodes_to_zero_and_round_trips():
    params = {"w": jnp.ones((300, 20))}
    for fmt in ("int8", "int4", "fp8"):
        opt = eqxopt.AdamW(1e-3, state_dtype=eqxopt.Quantized(fmt))
        state = opt.init(params)
        assert jnp.all(state.mu["w"].decode() == 0) and jnp.all(
            state.nu["w"].decode() == 0
        )
        assert state.mu["w"].scales.dtype == jnp.float32
        assert state.mu["w"].codes.dtype == jnp.uint8
        params2, state = opt.step(params, {"w": jnp.full((300, 20), 0.3)}, state)
        buffer = io.BytesIO()
        eqx.tree_serialise_leaves(buffer, state)
        buffer.seek(0)
        back = eqx.tree_deserialise_leaves(buffer, opt.init(params))
        assert eqx.tree_equal(back, state, typematch=True)


@pytest.mark.parametrize("fmt", ["int8", "int4", "fp8"])
def test_encoding_is_traced_once_per_leaf_shape(fmt, monkeypatch):
    """A model's many leaves of one shape cost one trace of the encoder, not one each:
    tracing a step on eight leaves encodes as many times as on one leaf. (Shapes no
    other test uses, so that nothing is cached before.)"""
    from eqxopt import _quantized

    calls = []
    encode_blocks = _quantized._encode_blocks
    monkeypatch.setattr(
        _quantized,
        "_encode_blocks",
        lambda *a: calls.append(1) or encode_blocks(*a),
    )
    spec = eqxopt.Quantized(fmt, block_size=8, min_size=1)
    opt = eqxopt.AdamW(1e-3, state_dtype=spec)

    def traced_encodes(params):
        calls.clear()
        state = eqx.filter_eval_shape(opt.init, params)
        eqx.filter_eval_shape(opt.step, params, params, state)
        return len(calls)

    offset = ("int8", "int4", "fp8").index(fmt)
    one = traced_encodes({"w": jnp.ones((37 + offset, 11))})
    eight = traced_encodes({f"w{i}": jnp.ones((41 + offset, 13)) for i in range(8)})
    assert one > 0 and eight == one, (one, eight)


def test_per_buffer_dict_and_verify_bytes():
    params = {"w": jnp.ones((1024, 1024), jnp.float32)}
    opt = eqxopt.AdamW(
        1e-3, state_dtype={"mu": jnp.bfloat16, "nu": eqxopt.Quantized("int8")}
    )
    state = opt.init(params)
    assert state.mu["w"].dtype == jnp.bfloat16
    assert isinstance(state.nu["w"], eqxopt.QuantizedArray)
    n = 1024 * 1024
    for fmt, bound in (("int8", 2.1), ("fp8", 2.1), ("int4", 1.1)):
        report = eqxopt.verify(
            eqxopt.AdamW(1e-3, state_dtype=eqxopt.Quantized(fmt)), params
        )
        assert "codes" in str(report) and "scales" in str(report)
        assert report.nbytes / n <= bound, (fmt, report.nbytes / n)
    f32 = eqxopt.verify(eqxopt.AdamW(1e-3), params)
    assert f32.nbytes / n == pytest.approx(8.0, rel=1e-5)


def test_other_optimizers_take_quantized_state():
    params = {"w": jnp.ones((64, 64)), "b": jnp.ones(3)}
    grads = {"w": jnp.full((64, 64), 0.1), "b": jnp.ones(3)}
    q = eqxopt.Quantized("int8", min_size=1)
    for opt in (
        eqxopt.SGD(0.1, momentum=0.9, state_dtype=q),
        eqxopt.Lion(1e-3, state_dtype=q),
        eqxopt.RMSProp(1e-3, centered=True, momentum=0.9, state_dtype=q),
        eqxopt.Adagrad(1e-2, state_dtype=q),
        eqxopt.Lamb(1e-3, state_dtype=q),
        eqxopt.MultiSteps(eqxopt.Adam(1e-3, state_dtype=q), 2, accumulator_dtype=q),
    ):
        state = opt.init(params)
        step = jax.jit(opt.step)
        p = params
        for _ in range(3):
            p, state = step(p, grads, state)
        assert all(jnp.all(jnp.isfinite(x)) for x in jax.tree.leaves(p))


# --- stochastic rounding and compensation --------------------------------------------


def test_stochastic_rounding_is_unbiased():
    """10^5 roundings of one float32 value that lies 0.3 of a bfloat16 ulp above a
    bfloat16 number: the mean of the rounded values is the value. Each rounding is a
    Bernoulli(0.3) choice between neighbours 1 ulp apart, so the mean's standard
    deviation is sqrt(0.3 * 0.7 / 1e5) = 1.45e-3 ulp; the bound is 5 of those (a
    fixed key, so the test is deterministic; the bound says it is not luck)."""
    from eqxopt._wrappers.precision import stochastic_round

    n = 100_000
    for dtype in (jnp.bfloat16, jnp.float16):
        base = jnp.asarray(1.5, dtype)
        ulp = float(jnp.nextafter(base, jnp.asarray(2.0, dtype))) - float(base)
        x = jnp.full((n,), float(base) + 0.3 * ulp, jnp.float32)
        out = stochastic_round(x, dtype, jr.key(0)).astype(jnp.float32)
        assert set(np.unique(np.asarray(out))) <= {float(base), float(base) + ulp}
        mean_frac = (float(jnp.mean(out)) - float(base)) / ulp
        assert abs(mean_frac - 0.3) <= 5 * np.sqrt(0.3 * 0.7 / n)
        # Negative values round symmetrically (towards / away from zero).
        neg = stochastic_round(-x, dtype, jr.key(1)).astype(jnp.float32)
        assert abs((-float(jnp.mean(neg)) - float(base)) / ulp - 0.3) <= 5 * np.sqrt(
            0.21 / n
        )


def test_wrappers_leave_float32_params_alone_and_keep_bf16_on_track():
    params = {"f": jnp.ones((1000,)), "h": jnp.ones((1000,), jnp.bfloat16)}
    grads = {k: jnp.full((1000,), 1e-3, jnp.float32) for k in params}
    plain = eqxopt.SGD(0.1)
    ref, s = params, plain.init(params)
    for _ in range(50):
        ref, s = plain.step(ref, grads, s)
    for wrapper in (
        eqxopt.StochasticRounding(plain, key=3),
        eqxopt.Compensated(plain),
    ):
        p, state = params, wrapper.init(params)
        step = jax.jit(wrapper.step)
        for _ in range(50):
            p, state = step(p, grads, state)
        assert jnp.array_equal(p["f"], ref["f"])  # float32: exactly as without
        target = 1.0 - 50 * 1e-4
        assert abs(float(jnp.mean(p["h"].astype(jnp.float32))) - target) < 2e-3
        # plain bfloat16 loses every one of these updates
        assert float(ref["h"][0]) == 1.0
    state = eqxopt.StochasticRounding(plain, key=3).init(params)
    assert jnp.issubdtype(state.key.dtype, jax.dtypes.prng_key)


# --- bad input ------------------------------------------------------------------


def test_bad_input():
    with pytest.raises(ValueError, match="format"):
        eqxopt.Quantized("int3")
    for bad in (0, -4):
        with pytest.raises(ValueError, match="block_size"):
            eqxopt.Quantized("int8", block_size=bad)
    with pytest.raises(ValueError, match="'mu', 'nu'"):
        eqxopt.AdamW(1e-3, state_dtype={"m": jnp.bfloat16})
    with pytest.raises(ValueError, match="state_dtype"):
        eqxopt.SGD(0.1, state_dtype=eqxopt.Quantized("int8"))  # no momentum buffer
    with pytest.raises(ValueError, match="accumulator_dtype"):
        eqxopt.MultiSteps(eqxopt.SGD(0.1), 2, accumulator_dtype={"acc": jnp.float32})
