"""The registered measurements, one module per topic; ``python -m flashattn.record`` imports them all."""

MODULES = ("core", "banks", "traffic", "compiled", "tuning", "fast", "backward", "training", "roofline", "profiling",
           "host", "decode", "ring", "masks", "model_step")
