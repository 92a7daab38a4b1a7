"""The models a learner reasons with: arithmetic on paper, no GPU needed (softmax, traffic, banks, layouts,
fma_loads, occupancy, roofline, tuning). They may read the kernels (their registry, their defaults), never the
measuring or teaching layers."""
