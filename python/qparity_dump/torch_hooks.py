"""A name map (maps/base.py) as PyTorch forward hooks on a model: each tap records what its
module gives into a Recorder. Needs torch (imported by the caller's model, not here)."""
import re
import sys

from .maps.base import TRANSFORMS

_INDEXED = re.compile(r"^(output|input)\[(\d+)\]$")
_CALL = re.compile(r"^call:([A-Za-z_][A-Za-z0-9_]*)\[(\d+)\]$")


def _first(x):
    return x[0] if isinstance(x, (tuple, list)) else x


def _take(take, args, kwargs, output):
    if take == "output":
        return _first(output)
    if take == "input":
        if args:
            return args[0]
        if kwargs:
            return next(iter(kwargs.values()))
        raise ValueError("the module was called without inputs")
    if take == "output:sum":
        if not isinstance(output, (tuple, list)) or len(output) < 2 or output[1] is None:
            return _first(output)  # first layer of a deferred-residual engine: no residual yet
        return output[0] + output[1]
    m = _INDEXED.match(take)
    if m:
        src = output if m.group(1) == "output" else args
        return src[int(m.group(2))]
    raise ValueError(f"unknown take '{take}'")


class Hooks:
    """Installed hooks; remove() takes them (and any patched function) off again."""

    def __init__(self):
        self.handles = []
        self.patches = []  # (module object, attribute, original)

    def remove(self):
        for h in self.handles:
            h.remove()
        for obj, attr, orig in reversed(self.patches):
            setattr(obj, attr, orig)
        self.handles, self.patches = [], []


def install(model, taps, recorder):
    """taps: [(layer or None, Tap)] from EngineMap.plan. Returns Hooks."""
    hooks = Hooks()
    current = {}  # module id -> point prefix for "call:" taps while that module runs
    calls = {}    # function name -> [(module, index, point, transform)]
    try:
        for layer, tap in taps:
            path = tap.module.format(i=layer)
            try:
                module = model.get_submodule(path)
            except AttributeError as e:
                raise ValueError(f"map tap {tap.point(layer)}: the model has no module {path} "
                                 f"({type(model).__name__}): {e}") from None
            point, part = tap.point(layer), tap.part
            transform = TRANSFORMS[tap.transform] if tap.transform else None
            m = _CALL.match(tap.take)
            if m:
                calls.setdefault(m.group(1), []).append((module, int(m.group(2)), point,
                                                         transform))
                continue

            def record(value, point=point, part=part, transform=transform):
                if transform is not None:
                    value = transform(value)
                recorder.put(point, value, part)

            if tap.take == "input" or tap.take.startswith("input["):
                def pre(mod, args, kwargs, take=tap.take, record=record):
                    record(_take(take, args, kwargs, None))
                hooks.handles.append(module.register_forward_pre_hook(pre, with_kwargs=True))
            else:
                def post(mod, args, output, take=tap.take, record=record):
                    record(_take(take, args, {}, output))
                hooks.handles.append(module.register_forward_hook(post))
        for fname, users in calls.items():
            _patch_call(fname, users, recorder, hooks, current)
    except BaseException:
        hooks.remove()
        raise
    return hooks


def _patch_call(fname, users, recorder, hooks, current):
    """Wraps the module-level function `fname` of each user module's Python module; a call made
    while a user module runs is recorded under that module's points."""
    owners = {}
    for module, index, point, transform in users:
        owners.setdefault(id(module), (module, []))[1].append((index, point, transform))
    pymods = {sys.modules[type(m).__module__] for m, _ in owners.values()}
    for pymod in pymods:
        if not hasattr(pymod, fname):
            raise ValueError(f"{pymod.__name__} has no function {fname}: the map's call tap "
                             "does not fit this model's code")
        original = getattr(pymod, fname)

        def wrapper(*args, _original=original, **kwargs):
            out = _original(*args, **kwargs)
            who = current.get("module")
            if who is not None and who in owners:
                for index, point, transform in owners[who][1]:
                    value = out[index]
                    recorder.put(point, transform(value) if transform else value)
            return out

        hooks.patches.append((pymod, fname, original))
        setattr(pymod, fname, wrapper)
    for key, (module, _) in owners.items():
        def enter(mod, args, key=key):
            current["module"] = key

        def leave(mod, args, output):
            current["module"] = None
        hooks.handles.append(module.register_forward_pre_hook(enter))
        hooks.handles.append(module.register_forward_hook(leave))
