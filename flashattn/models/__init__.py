"""The models a learner reasons with: arithmetic on paper, no GPU needed (softmax, traffic, banks,
occupancy, roofline, tuning). They import the kernels' constants, never the measuring or teaching layers."""
