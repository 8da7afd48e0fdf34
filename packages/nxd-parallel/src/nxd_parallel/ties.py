"""Parameters registered under two names (an output layer sharing the embedding): sharding and
`to_empty` replace parameters module by module, so ties are recorded first and restored after."""

from __future__ import annotations

from torch import nn


def tied_parameters(model: nn.Module) -> list[tuple[str, str]]:
    """(first name, other name) of each parameter registered under two names."""
    seen: dict[int, str] = {}
    tied = []
    for name, parameter in model.named_parameters(remove_duplicate=False):
        if id(parameter) in seen:
            tied.append((seen[id(parameter)], name))
        else:
            seen[id(parameter)] = name
    return tied


def retie(model: nn.Module, tied: list[tuple[str, str]]) -> None:
    """Make each alias name refer to its owner's parameter again."""
    for owner, alias in tied:
        module_name, _, attribute = alias.rpartition(".")
        setattr(model.get_submodule(module_name), attribute, model.get_parameter(owner))
