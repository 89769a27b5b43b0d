"""Stacked networks: K networks of one structure run as one, on a leading ``K`` dim.

``StackedModule(networks)`` copies the first network and replaces each of its
``nn.Linear`` layers by a :class:`StackedLinear` holding the K networks'
weights stacked (``[K, out, in]``), computed with one ``torch.baddbmm`` for
all K.  Its ``forward`` takes inputs ``[K, M, ...]`` (member ``k``'s rows at
index ``k``), runs the copied network's own ``forward`` on the ``[K * M,
...]`` rows (agent-major: every ``StackedLinear`` sees them as ``[K, M,
in]``) and gives back outputs ``[K, M, ...]`` -- tensors, or distributions
whose batch shape is ``[K, M]``.  So a network's own code (flattening, heads,
distributions) is reused as it is; only the parameters are stacked.

Member ``k`` computes what network ``k`` computes, up to float rounding: a
batched matrix product may sum in another order than ``F.linear`` (for
``K = 1`` on the CPU it gives the same bits; ``tests/many_agents`` checks it).

What can be stacked: networks whose every parameter lives in an
``nn.Linear`` (the MLP encoders, value and critic networks, categorical
heads, a normal head with ``state_dependent_std``) and whose other buffers
are equal across members.  A free parameter elsewhere (a normal head's
state-independent ``log_std``) is refused with a ``ValueError`` naming it.
Nothing mixes members: every operation is per row or per member, so a
non-finite value in member ``k`` stays in member ``k``.
"""

import copy
import functools
from typing import Any, Callable, Optional, Sequence, Tuple

import torch
import torch.distributions as td
import torch.nn as nn

from alf_entropy.networks.distributions import (
    Categorical,
    categorical_from_uniform,
    sample_categorical,
)
from alf_entropy.utils import nest

__all__ = [
    "StackedLinear",
    "StackedModule",
    "categorical_sampler",
    "draw",
    "reshape_distribution",
    "sample_categorical_members",
    "sample_members",
]


class StackedLinear(nn.Module):
    """K ``nn.Linear`` layers of one shape as one layer.

    Args:
        linears: the layers (all ``in_features``, ``out_features`` and
            ``bias`` alike); their current values are copied.

    Raises:
        ValueError: unless ``linears`` are one or more ``nn.Linear`` of one shape.
    """

    def __init__(self, linears: Sequence[nn.Linear]):
        super().__init__()
        linears = list(linears)
        if (
            not all(isinstance(m, nn.Linear) for m in linears)
            or len({(m.in_features, m.out_features, m.bias is None) for m in linears}) != 1
        ):
            raise ValueError(
                "linears must be one or more nn.Linear layers with the same "
                f"in/out features and bias, got {linears}"
            )
        first = linears[0]
        self.in_features, self.out_features = first.in_features, first.out_features
        self.num_members = len(linears)
        self.weight = nn.Parameter(torch.stack([m.weight.detach() for m in linears]).clone())
        self.bias = (
            None
            if first.bias is None
            else nn.Parameter(torch.stack([m.bias.detach() for m in linears]).clone())
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Apply member ``k``'s layer to the ``k``-th of K equal blocks of rows.

        Args:
            x: ``[K * M, ..., in_features]``, member-major.

        Returns:
            torch.Tensor: ``[K * M, ..., out_features]``.
        """
        lead = x.shape[:-1]
        x3 = x.reshape(self.num_members, -1, self.in_features)
        weight = self.weight.transpose(1, 2)
        if self.bias is None:
            y = torch.bmm(x3, weight)
        else:
            y = torch.baddbmm(self.bias.unsqueeze(1), x3, weight)
        return y.reshape(*lead, self.out_features)

    def extra_repr(self) -> str:
        return (
            f"num_members={self.num_members}, in_features={self.in_features}, "
            f"out_features={self.out_features}, bias={self.bias is not None}"
        )


def reshape_distribution(dist: td.Distribution, batch_shape: Sequence[int]) -> td.Distribution:
    """The same distribution with its batch dims reshaped (e.g. ``[K * M]`` -> ``[K, M]``).

    Args:
        dist: a ``Categorical``, ``Normal``, ``Independent`` or
            ``TransformedDistribution`` (of these).
        batch_shape: the new batch shape (as many elements as the old).

    Returns:
        td.Distribution: the reshaped distribution (``validate_args=False``).

    Raises:
        TypeError: for another kind of distribution.
    """
    shape = tuple(batch_shape)
    if isinstance(dist, (td.Independent, td.TransformedDistribution)):
        # The base's batch dims start with the outer distribution's.
        base_dist = dist.base_dist
        base = reshape_distribution(
            base_dist, shape + tuple(base_dist.batch_shape[len(dist.batch_shape) :])
        )
        if isinstance(dist, td.Independent):
            return td.Independent(base, dist.reinterpreted_batch_ndims, validate_args=False)
        return td.TransformedDistribution(base, dist.transforms, validate_args=False)
    if isinstance(dist, td.Categorical):
        logits = dist.logits.reshape(*shape, dist.logits.shape[-1])
        new = Categorical(logits)
        # The constructor normalises the (already normalised) logits again, which can move
        # them by an ulp; keep the original's (``probs``, ``log_prob`` and ``entropy`` read
        # ``logits``).
        new.logits = logits
        return new
    if isinstance(dist, td.Normal):
        return td.Normal(dist.loc.reshape(shape), dist.scale.reshape(shape), validate_args=False)
    raise TypeError(
        f"cannot reshape a {type(dist).__name__}; stackable are Categorical, Normal, "
        "Independent and TransformedDistribution"
    )


class StackedModule(nn.Module):
    """K networks of one structure as one module on inputs ``[K, M, ...]`` (module docstring).

    Args:
        networks: the K networks (same class and architecture); their current
            parameters are copied (each ``nn.Linear`` becomes a
            :class:`StackedLinear`).

    Raises:
        ValueError: if ``networks`` is empty, a parameter lies outside an
            ``nn.Linear``, or a buffer differs between networks.
        TypeError: if the networks are not ``nn.Module`` s of one class.
    """

    def __init__(self, networks: Sequence[nn.Module]):
        super().__init__()
        networks = list(networks)
        if not networks:
            raise ValueError("networks must hold at least one network")
        if (
            not all(isinstance(n, nn.Module) for n in networks)
            or len({type(n) for n in networks}) != 1
        ):
            raise TypeError("networks must be nn.Module instances of one class")
        self.num_members = len(networks)
        inner = copy.deepcopy(networks[0])
        linears = [name for name, m in inner.named_modules() if isinstance(m, nn.Linear)]
        for name in linears:
            parent_name, _, attr = name.rpartition(".")
            parent = inner.get_submodule(parent_name)  # "": inner itself
            setattr(parent, attr, StackedLinear([n.get_submodule(name) for n in networks]))
        stray = [
            name
            for name, _ in inner.named_parameters()
            if not isinstance(inner.get_submodule(name.rpartition(".")[0]), StackedLinear)
        ]
        if stray:
            raise ValueError(
                f"cannot stack {type(networks[0]).__name__}: parameters {stray} are "
                "not in an nn.Linear (e.g. a state-independent log_std); use a "
                "network whose parameters all live in nn.Linear layers"
            )
        buffers = [dict(n.named_buffers()) for n in networks]
        for name, buf in inner.named_buffers():
            if not all(torch.equal(b[name], buf) for b in buffers):
                raise ValueError(
                    f"cannot stack {type(networks[0]).__name__}: buffer {name!r} "
                    "differs between the networks"
                )
        self.inner = inner

    def _rows(self, inputs: Tuple[Any, ...]) -> Tuple[Any, int]:
        """``inputs`` ``[K, M, ...]`` as ``[K * M, ...]`` rows, and ``M``."""
        k = self.num_members
        fast = len(inputs) == 1 and isinstance(inputs[0], torch.Tensor)  # the common case
        leaves = inputs if fast else nest.flatten(inputs)
        if not leaves:
            raise ValueError("StackedModule needs at least one input tensor")
        for x in leaves:
            if x.dim() < 2 or x.shape[0] != k:
                raise ValueError(f"inputs must be [K={k}, M, ...], got shape {tuple(x.shape)}")
        m = leaves[0].shape[1]
        if fast:
            return (inputs[0].reshape(k * m, *inputs[0].shape[2:]),), m
        return nest.map_structure(lambda x: x.reshape(k * m, *x.shape[2:]), inputs), m

    def forward(self, *inputs: Any) -> Any:
        """Run the networks on their members' inputs.

        Args:
            *inputs: nests of tensors ``[K, M, ...]`` (member ``k`` at index ``k``).

        Returns:
            The network's output nest with leaves ``[K, M, ...]`` (tensors, or
            distributions of batch shape ``[K, M, ...]``).

        Raises:
            ValueError: if an input's first dimension is not K.
        """
        rows, m = self._rows(inputs)
        out = self.inner(*rows)
        if isinstance(out, torch.Tensor):
            return out.reshape(self.num_members, m, *out.shape[1:])
        return nest.map_structure(lambda y: _unflatten(y, self.num_members, m), out)

    def sample_with_log_prob(
        self, observation: Any, sample: Callable[[torch.Tensor], torch.Tensor]
    ) -> Any:
        """The stacked network's ``sample_with_log_prob`` (its fast acting path) on the
        members' rows: ``(action, log_prob)`` ``[K, M]``, or None where it has none."""
        fast = getattr(self.inner, "sample_with_log_prob", None)
        if fast is None or not isinstance(observation, torch.Tensor) or observation.dim() < 2:
            return None
        (rows,), m = self._rows((observation,))
        drawn = fast(rows, sample)
        if drawn is None:
            return None
        return tuple(x.reshape(self.num_members, m, *x.shape[1:]) for x in drawn)


def _unflatten(y, k, m):
    if isinstance(y, td.Distribution):
        return reshape_distribution(y, (k, m) + tuple(y.batch_shape[1:]))
    return y.reshape(k, m, *y.shape[1:])


def draw(
    dist: td.Distribution,
    generators: Optional[Sequence[torch.Generator]],
    reparameterize: bool = False,
) -> torch.Tensor:
    """``dist.sample()`` (``rsample``) for one agent (``generators`` None: torch's own
    draws); each member's from its own generator for K (:func:`sample_members`)."""
    if generators is None:
        return dist.rsample() if reparameterize else dist.sample()
    return sample_members(dist, generators, reparameterize)


def categorical_sampler(
    generators: Optional[Sequence[torch.Generator]],
) -> Callable[[torch.Tensor], torch.Tensor]:
    """Draws from probabilities ``[K * B, n]`` as ``Categorical.sample`` does, each
    member's rows from its generator (``generators`` None: one agent, torch's)."""
    if generators is None:
        return sample_categorical
    return functools.partial(sample_categorical_members, generators=generators)


def sample_members(
    dist: td.Distribution, generators: Sequence[torch.Generator], reparameterize: bool = False
) -> torch.Tensor:
    """A draw for each of K members from its own generator.

    Member ``k`` (the ``k``-th of K equal blocks of the first batch dim:
    ``[K * B, ...]`` rows or ``[K, B, ...]``) gets what ``dist.sample()`` (or
    ``dist.rsample()``) of its own distribution draws with ``generators[k]``
    as torch's generator.

    Args:
        dist: a ``Categorical``, ``Normal``, ``Independent`` or
            ``TransformedDistribution`` (of these).
        generators: one generator per member.
        reparameterize: draw as ``rsample`` (differentiable; not for a
            ``Categorical``).

    Returns:
        torch.Tensor: the draws, of ``dist``'s batch and event shape.

    Raises:
        TypeError: for another distribution, or a reparameterised categorical draw.
    """
    if isinstance(dist, td.Independent):
        return sample_members(dist.base_dist, generators, reparameterize)
    if isinstance(dist, td.TransformedDistribution):
        x = sample_members(dist.base_dist, generators, reparameterize)
        for transform in dist.transforms:
            x = transform(x)
        return x
    k = len(generators)
    if isinstance(dist, td.Categorical) and not reparameterize:
        probs = dist.probs
        rows = sample_categorical_members(probs.reshape(-1, probs.shape[-1]), generators)
        return rows.reshape(probs.shape[:-1])
    if isinstance(dist, td.Normal):
        shape = dist.batch_shape
        loc, scale = (x.expand(shape).reshape(k, -1, *shape[1:]) for x in (dist.loc, dist.scale))
        if not reparameterize:
            return torch.cat(
                [torch.normal(loc[i], scale[i], generator=g) for i, g in enumerate(generators)]
            )
        eps = torch.stack(
            [
                torch.randn(loc.shape[1:], dtype=loc.dtype, device=loc.device, generator=g)
                for g in generators
            ]
        )
        return (loc + eps * scale).reshape(shape)  # td.Normal.rsample's arithmetic
    raise TypeError(
        f"cannot {'rsample' if reparameterize else 'sample'} a {type(dist).__name__} per member"
    )


def sample_categorical_members(
    probs: torch.Tensor, generators: Sequence[torch.Generator]
) -> torch.Tensor:
    """``sample_categorical`` on ``[K * B, n]`` probabilities, member ``k``'s rows from
    ``generators[k]``.

    Args:
        probs: probabilities ``[K * B, n]`` (member-major rows).
        generators: one generator per member.

    Returns:
        torch.Tensor: int64 indices ``[K * B]``.
    """
    shape = (probs.shape[0] // len(generators), 1)
    u = [torch.rand(shape, dtype=probs.dtype, device=probs.device, generator=g) for g in generators]
    return categorical_from_uniform(probs, torch.cat(u))
