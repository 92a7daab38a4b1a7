import os

from hypothesis import HealthCheck, settings

# Kernels run in Triton's CPU interpreter in CI: few, slow examples. FLASHATTN_EXAMPLES raises the count.
settings.register_profile(
    "course",
    max_examples=int(os.environ.get("FLASHATTN_EXAMPLES", "6")),
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
    derandomize=False,
    print_blob=True,
)
settings.load_profile("course")
