"""Run in ALF's venv (``python alf_names.py none|package|all``): how ALF resolves the names of
its example gin files and its ``alf.config`` names, as JSON on stdout.

It imports the ALF modules the gin files import, then ``package``: every module of alf_entropy
but ``alf_entropy.config.configurables`` (the one that registers gin configurables, which the
package's own gin files import); ``all``: that one too; ``none``: nothing of the package.
"""

import glob
import importlib
import json
import os
import pkgutil
import re
import sys

import alf
import alf.config_util
import gin
from gin import config_parser

EXAMPLES = os.path.join(os.path.dirname(alf.__file__), "examples")
CONFIGURABLES = "alf_entropy.config.configurables"


class _References(config_parser.ParserDelegate):
    """Collects the configurables that ``@name`` values refer to."""

    def __init__(self):
        self.names = set()

    def configurable_reference(self, scoped_name, evaluate):
        self.names.add(scoped_name.rsplit("/", 1)[-1])

    def macro(self, macro_name):
        return None


def _statements(path):
    """The imports and the configurable selectors (bound and referred to) of one gin file."""
    refs = _References()
    with open(path) as f:
        statements = list(config_parser.ConfigParser(f, refs))
    imports = [s.module for s in statements if isinstance(s, config_parser.ImportStatement)]
    selectors = {
        s.selector
        for s in statements
        if isinstance(s, config_parser.BindingStatement) and s.arg_name
    }
    return imports, selectors | refs.names


def _message(e):
    """The error's first line without object addresses (which differ between processes)."""
    return re.sub(r" at 0x[0-9a-f]+", "", f"{type(e).__name__}: {e}".splitlines()[0])


def _import(name, failed):
    try:
        importlib.import_module(name)
    except Exception as e:  # a module of ALF's examples whose simulator is absent
        failed[name] = _message(e)


def _resolve(selector):
    try:
        match = gin.config._REGISTRY.get_match(selector)
    except KeyError:
        return "ambiguous"
    return "unknown" if match is None else match.selector


def main(mode):
    files = sorted(glob.glob(os.path.join(EXAMPLES, "**", "*.gin"), recursive=True))
    parsed, failed = {}, {}
    for f in files:
        try:
            parsed[os.path.relpath(f, EXAMPLES)] = _statements(f)
        except SyntaxError as e:  # syntax of ALF's gin fork that PyPI's gin-config lacks
            failed[os.path.relpath(f, EXAMPLES)] = _message(e)
    for module in sorted({m for imports, _ in parsed.values() for m in imports}):
        _import(module, failed)
    imported = []
    if mode != "none":
        import alf_entropy

        for module in pkgutil.walk_packages(alf_entropy.__path__, "alf_entropy."):
            if module.name != CONFIGURABLES or mode == "all":
                _import(module.name, failed)
                imported += [module.name] if module.name in sys.modules else []
    selectors = {f: {s: _resolve(s) for s in sorted(names)} for f, (_, names) in parsed.items()}
    ambiguous = sorted(
        {s for names in selectors.values() for s, r in names.items() if r == "ambiguous"}
    )
    # each ambiguous name spelled out as ALF's (what an ALF user writes then)
    qualified = {
        s: [m for m in gin.config._REGISTRY.matching_selectors(s) if m.startswith("alf.")]
        for s in ambiguous
    }
    parse = {}
    for f in files:
        gin.clear_config()
        gin.add_config_file_search_path(os.path.dirname(f))  # its includes
        try:
            gin.parse_config_file(f)
            parse[os.path.relpath(f, EXAMPLES)] = "ok"
        except Exception as e:
            parse[os.path.relpath(f, EXAMPLES)] = _message(e)
    names = alf.config_util.get_all_config_names()
    alf_config = {}
    for name in names:
        short = ".".join(name.split(".")[-2:])
        try:
            alf.config_util._get_config_node(short)
            alf_config[short] = "ok"
        except ValueError:
            alf_config[short] = "ambiguous"
    qualified = {s: {m: _resolve(m) for m in ms} for s, ms in qualified.items()}
    print(
        json.dumps(
            dict(
                imported=imported,
                failed=failed,
                selectors=selectors,
                qualified=qualified,
                parse=parse,
                alf_config=alf_config,
                alf_config_names=names,
            )
        )
    )


if __name__ == "__main__":
    gin.add_config_file_search_path(EXAMPLES)
    main(sys.argv[1])
