"""Every attention variant of the course, by name. Each takes (q, k, v, *, causal, scale, **options)."""

from .naive import naive_attention
from .v1 import attention_v1
from .v2 import attention_v2, attention_v2_kt, attention_v2_kt_view, attention_v2_padded

VARIANTS = {
    "naive": naive_attention,
    "v1": attention_v1,
    "v2": attention_v2,
    "v2_kt": attention_v2_kt,
    "v2_kt_view": attention_v2_kt_view,
    "v2_padded": attention_v2_padded,
}
