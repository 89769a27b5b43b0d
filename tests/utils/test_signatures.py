"""Tests for alf_entropy/utils/signatures.py: the forwarded signature gin and help() see."""
import inspect

import gin
import pytest

from alf_entropy.utils.signatures import forwards_arguments


@gin.configurable(module="test_signatures")
class _Base:
    def __init__(self, spec, gamma=0.99, steps=1, name="base", lr=None):
        self.args = dict(spec=spec, gamma=gamma, steps=steps, name=name, lr=lr)


class _Sub(_Base):
    @forwards_arguments(_Base.__init__, supplied=("steps",))
    def __init__(self, spec, *, name="sub", clip=0.2, **kwargs):
        self.clip = clip
        super().__init__(spec, steps=3, name=name, **kwargs)


def test_signature_lists_base_arguments_with_the_subclass_defaults():
    params = inspect.signature(_Sub).parameters
    assert list(params) == ["spec", "gamma", "name", "lr", "clip"]  # "steps" is supplied
    assert params["spec"].kind is inspect.Parameter.POSITIONAL_OR_KEYWORD
    assert all(params[k].kind is inspect.Parameter.KEYWORD_ONLY for k in ("gamma", "name", "clip"))
    assert params["name"].default == "sub" and params["gamma"].default == 0.99


def test_gin_binds_forwarded_arguments_and_rejects_unknown_ones():
    configurable = gin.external_configurable(_Sub, "_SigSub", module="test_signatures")
    gin.parse_config("_SigSub.gamma = 0.5\n_SigSub.clip = 0.1")
    sub = configurable("obs")
    assert sub.args == dict(spec="obs", gamma=0.5, steps=3, name="sub", lr=None)
    assert sub.clip == 0.1
    for bad in ("_SigSub.gama = 0.5", "_SigSub.steps = 2"):  # misspelt; supplied
        with pytest.raises(ValueError, match="parameter named"):
            gin.parse_config(bad)


def test_base_class_bindings_do_not_leak_into_the_subclass():
    # gin applies a configurable class's bindings to every call of its
    # __init__, super() calls included, for the arguments not passed: each
    # forwarded argument is passed, so _Base.gamma stays _Base's.
    gin.parse_config("_Base.gamma = 0.5")
    assert _Base("obs").args["gamma"] == 0.5
    assert _Sub("obs").args["gamma"] == 0.99
    assert _Sub("obs", gamma=0.7).args["gamma"] == 0.7


def test_unknown_or_supplied_arguments_fail_clearly():
    with pytest.raises(TypeError, match="steps"):
        _Sub("obs", steps=2)
    with pytest.raises(TypeError, match="gama"):
        _Sub("obs", gama=0.5)


def test_needs_kwargs():
    with pytest.raises(TypeError, match=r"\*\*kwargs"):
        forwards_arguments(_Base.__init__)(lambda self, spec: None)
