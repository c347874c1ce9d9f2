"""`eqxopt.least_squares` and `eqxopt.curve_fit` (API.md section 9), with SciPy run
in-process as the reference."""
