"""Constants the kernels share (Triton reads module-level globals only when they are ``tl.constexpr``)."""

import math

import triton.language as tl

LOG2_E: tl.constexpr = tl.constexpr(1.4426950408889634)  # exp(x) = exp2(x · log2 e)
LN_2: tl.constexpr = tl.constexpr(0.6931471805599453)  # ln(x) = log2(x) · ln 2

assert abs(LOG2_E.value - 1 / math.log(2)) < 1e-15 and abs(LN_2.value - math.log(2)) < 1e-15
