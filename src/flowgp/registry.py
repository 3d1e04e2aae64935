"""Names second: the one place where strings become objects.

Models take objects (Flow, Kernel, Likelihood); the CLI, the bench and the estimators accept names too and
resolve them here, so a user's own class registered under a name works everywhere a built-in one does:

    from flowgp.registry import FLOWS
    FLOWS.register("mine", MyFlow)          # now "mine", "sal+mine", TGPRegressor(flow="mine") all work

The module imports nothing from flowgp, so every layer can use it; each layer registers its own entries
when it is imported (flows, kernels and likelihoods at the bottom, model families in `flowgp.build`, the
bench's named models in `flowgp.bench.models`).
"""
from __future__ import annotations

from typing import Any, Callable, Iterator

__all__ = ["Registry", "FLOWS", "KERNELS", "LIKELIHOODS", "MODELS"]


def _key(name: str) -> str:
    return "".join(name.split()).lower()


class Registry:
    """A case-insensitive map from names (and aliases) to classes or factories of one kind of object.

    Args:
        kind: what the registry holds ("flow", "kernel", ...), used in its error messages.

    See Also:
        :data:`flowgp.registry.FLOWS`, :data:`flowgp.registry.KERNELS` (the registries flowgp resolves names in).
    """

    def __init__(self, kind: str):
        self.kind = kind
        self._entries: dict[str, Any] = {}
        self._aliases: dict[str, str] = {}

    def register(self, name: str, obj: Any = None, *, aliases=(), overwrite: bool = False):
        """Add `obj` under `name` (usable as a decorator when `obj` is omitted); returns `obj`.

        Raises ValueError when the name is taken (pass overwrite=True to replace an entry on purpose: a
        user's class must never silently become, or hide, a built-in one).
        """
        if not isinstance(name, str) or not _key(name):
            raise TypeError(f"{self.kind} name must be a non-empty string, got {name!r}")

        def add(target):
            key = _key(name)
            taken = key in self._entries or key in self._aliases
            if taken and not overwrite and self._entries.get(key) is not target:
                raise ValueError(
                    f"{self.kind} name {name!r} is already registered ({self._describe(key)}); "
                    f"pick another name or pass overwrite=True")
            for alias in aliases:  # all checks before any change: a refused call registers nothing
                akey = _key(alias)
                if (akey in self._entries or akey in self._aliases) and not overwrite \
                        and self._aliases.get(akey) != key:
                    raise ValueError(f"{self.kind} alias {alias!r} is already registered")
            self._aliases.pop(key, None)
            self._entries[key] = target
            for alias in aliases:
                self._aliases[_key(alias)] = key
            return target

        return add if obj is None else add(obj)

    def unregister(self, name: str) -> None:
        key = self.canonical(name)
        del self._entries[key]
        for alias in [a for a, k in self._aliases.items() if k == key]:
            del self._aliases[alias]

    def _describe(self, key: str) -> str:
        target = self._entries.get(key)
        if target is None:
            return f"alias of {self._aliases[key]!r}"
        return getattr(target, "__qualname__", type(target).__name__)

    def canonical(self, name: str) -> str:
        """The canonical name of `name` or of its alias; ValueError listing the valid names otherwise."""
        if not isinstance(name, str):
            raise TypeError(f"{self.kind} name must be a string, got {type(name).__name__}")
        key = _key(name)
        key = self._aliases.get(key, key)
        if key not in self._entries:
            raise ValueError(f"unknown {self.kind} {name!r}; {self.valid_names()}")
        return key

    def get(self, name: str) -> Any:
        """The class or factory registered under `name` (or one of its aliases)."""
        return self._entries[self.canonical(name)]

    def create(self, name: str, *args, **kwargs) -> Any:
        """Call the entry registered under `name` with the given arguments."""
        factory: Callable = self.get(name)
        return factory(*args, **kwargs)

    def names(self) -> list[str]:
        """Canonical names in registration order."""
        return list(self._entries)

    def aliases(self) -> dict[str, str]:
        return dict(self._aliases)

    def valid_names(self) -> str:
        text = f"valid {self.kind} names: {', '.join(self._entries)}"
        if self._aliases:
            text += "; aliases: " + ", ".join(f"{a} (= {k})" for a, k in self._aliases.items())
        return text

    def __contains__(self, name) -> bool:
        if not isinstance(name, str):
            return False
        key = _key(name)
        return self._aliases.get(key, key) in self._entries

    def __iter__(self) -> Iterator[str]:
        return iter(self._entries)

    def __len__(self) -> int:
        return len(self._entries)

    def __repr__(self) -> str:
        return f"Registry({self.kind!r}, {self.names()})"


#: flow stages usable in spec strings ("sal+softplus"); filled by flowgp.flows
FLOWS = Registry("flow")
#: kernels usable in kernel specs ("rbf+linear"); filled by flowgp.gp.kernels
KERNELS = Registry("kernel")
#: likelihoods by name ("gaussian", "bernoulli", "softmax", "robustmax"); filled by flowgp.gp.likelihoods
LIKELIHOODS = Registry("likelihood")
#: named model configurations of the CLI and the bench ("svgp", "tgp", "dgp3", "cnf-dgp3", "ldgp2-dreg", ...)
MODELS = Registry("model")
