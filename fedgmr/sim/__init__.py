"""The virtual-clock simulator: the event loop, the network and compute time models, executors."""
