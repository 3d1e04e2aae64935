"""Studies: each script answers one question; its docstring states the question and the dated answer."""
