"""Run by test_no_x64.py in a subprocess with x64 OFF: every registry entry's state is
stable for float16, bfloat16 and float32 params as a `lax.scan` carry and `lax.cond`
output, and counters are int32; traced abstractly (a state that comes back with its
own avals is one a jitted step does not retrace on; the compiled steps run in the main
suite). One grad dtype per param dtype: what x64 changes (the default dtypes of
`jnp.zeros`, `jnp.arange`, Python scalars made arrays) shows whatever the grads' dtype,
and every param/grad pairing is checked with x64 on (test_properties.py); bfloat16
params get float32 grads, Optax 0.2.8's failing setting. Prints one line per failure,
then a summary."""

import gc
import os
import sys


sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import jax


assert not jax.config.read("jax_enable_x64")
jax.config.update("jax_numpy_dtype_promotion", "strict")

from tests.helpers import CASES  # noqa: E402
from tests.test_properties import check_state_properties  # noqa: E402


PAIRS = [("float16", "same"), ("bfloat16", "float32"), ("float32", "same")]
failures = 0
for case in CASES:
    for dtype_name, grad_dtype in PAIRS:
        try:
            check_state_properties(case.make(), case, dtype_name, grad_dtype)
        except Exception as e:  # noqa: BLE001
            failures += 1
            print(f"FAIL {case.id} {dtype_name} {grad_dtype}: {type(e).__name__}: {e}")
    gc.collect(1)  # as tests/conftest.py after each test: see there
    gc.freeze()
print(f"{failures} failures over {len(CASES)} cases")
sys.exit(1 if failures else 0)
