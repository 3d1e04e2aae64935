"""Performance scripts: step time, whole fits, compilation, CUDA, data parallelism, memory and scaling, each
timed against its peer (GPyTorch, the eager step, one process, ...) in the same run where one exists."""
