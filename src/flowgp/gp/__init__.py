"""The parts of a sparse variational GP: kernels, inducing-input initialisation, the whitened variational
distribution q(u), likelihoods (Gaussian, warped, classification), predictive quadrature and the one
minibatch objective. Built on `flowgp.numerics` and `flowgp.flows`."""
